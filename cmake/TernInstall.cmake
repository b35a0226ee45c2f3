include(CMakePackageConfigHelpers)

install(TARGETS tern EXPORT ternTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/tern DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/tern/build_config.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tern)

set(TERN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tern)
install(EXPORT ternTargets NAMESPACE tern:: DESTINATION ${TERN_CMAKE_DIR})
configure_package_config_file(cmake/ternConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ternConfig.cmake INSTALL_DESTINATION ${TERN_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ternConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ternConfig.cmake ${PROJECT_BINARY_DIR}/ternConfigVersion.cmake
  DESTINATION ${TERN_CMAKE_DIR})

# Relative to the .pc file, so `cmake --install --prefix` anywhere still works.
file(RELATIVE_PATH TERN_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
configure_file(cmake/tern.pc.in ${PROJECT_BINARY_DIR}/tern.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tern.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
