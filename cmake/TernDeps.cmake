find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

# hwloc is not optional: the thread pool is sized and bound from it.
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc>=2.0)

# tern_optional_pkg(DEP MODULES...): resolves TERN_WITH_<DEP> against pkg-config
# and sets TERN_HAVE_<DEP> in the parent scope.
function(tern_optional_pkg dep)
  set(have OFF)
  if(NOT TERN_WITH_${dep} STREQUAL "OFF")
    pkg_check_modules(TERN_${dep} IMPORTED_TARGET ${ARGN})
    if(TERN_${dep}_FOUND)
      set(have ON)
    elseif(TERN_WITH_${dep} STREQUAL "ON")
      message(FATAL_ERROR "TERN_WITH_${dep}=ON but pkg-config could not find: ${ARGN}. "
        "Install it (ci/install-deps.sh does) or configure with -DTERN_WITH_${dep}=OFF.")
    endif()
  endif()
  set(TERN_HAVE_${dep} ${have} PARENT_SCOPE)
  message(STATUS "tern: ${dep} ${have} (TERN_WITH_${dep}=${TERN_WITH_${dep}})")
endfunction()

tern_optional_pkg(UCX ucx)
tern_optional_pkg(VERBS libibverbs librdmacm)

set(TERN_HAVE_CUDA OFF)
if(NOT TERN_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(TERN_HAVE_CUDA ON)
  elseif(TERN_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TERN_WITH_CUDA=ON but find_package(CUDAToolkit) found no CUDA toolkit. "
      "Set CUDAToolkit_ROOT or configure with -DTERN_WITH_CUDA=OFF.")
  endif()
endif()
message(STATUS "tern: CUDA ${TERN_HAVE_CUDA} (TERN_WITH_CUDA=${TERN_WITH_CUDA})")

# One interface target carries what the core objects need to link.
add_library(tern_core_deps INTERFACE)
target_link_libraries(tern_core_deps INTERFACE PkgConfig::HWLOC Threads::Threads)
if(TERN_HAVE_CUDA)
  # The static runtime keeps consumers from needing libcudart at run time and
  # lets tern load on machines without a driver (the calls then fail cleanly).
  target_link_libraries(tern_core_deps INTERFACE CUDA::cudart_static)
endif()
