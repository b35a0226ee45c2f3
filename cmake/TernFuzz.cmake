# The libFuzzer targets (tests/tensor, tests/prof). libFuzzer needs clang, while
# the rest of the tree may be built with gcc, so each fuzzer is one clang
# command over the few sources it needs, outside CMake's compiler. They are
# built and run when a clang that links -fsanitize=fuzzer is found (Debian:
# clang-14 + libclang-rt-14-dev); TERN_FUZZ=ON makes it required.
# Sets TERN_FUZZ_OK and defines tern_add_fuzzer().
set(TERN_FUZZ AUTO CACHE STRING "build and run the libFuzzer targets: AUTO, ON or OFF")
set_property(CACHE TERN_FUZZ PROPERTY STRINGS AUTO ON OFF)
set(TERN_FUZZ_SECONDS 20 CACHE STRING "how long each fuzz_* test fuzzes, in seconds")
if(NOT TERN_FUZZ MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TERN_FUZZ='${TERN_FUZZ}': must be AUTO, ON or OFF")
endif()

set(TERN_FUZZ_OK OFF)
if(NOT TERN_FUZZ STREQUAL "OFF")
  find_program(TERN_FUZZ_CLANG NAMES clang clang-19 clang-16 clang-15 clang-14
    DOC "clang used to build the libFuzzer targets")
  if(TERN_FUZZ_CLANG)
    # Probe once per clang: does it link a fuzzer with both sanitizers?
    if(NOT TERN_FUZZ_CLANG_PROBED STREQUAL TERN_FUZZ_CLANG)
      set(probe ${PROJECT_BINARY_DIR}/CMakeFiles/fuzz_probe.c)
      file(WRITE ${probe} "#include <stddef.h>\n#include <stdint.h>\n"
        "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\n"
        "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
      execute_process(COMMAND ${TERN_FUZZ_CLANG} -fsanitize=fuzzer,address,undefined ${probe}
          -o ${PROJECT_BINARY_DIR}/CMakeFiles/fuzz_probe
        RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_VARIABLE probe_err)
      if(probe_rc EQUAL 0)
        set(works ON)
      else()
        set(works OFF)
        message(STATUS "tern: ${TERN_FUZZ_CLANG} cannot link -fsanitize=fuzzer: ${probe_err}")
      endif()
      set(TERN_FUZZ_CLANG_WORKS ${works} CACHE INTERNAL "")
      set(TERN_FUZZ_CLANG_PROBED ${TERN_FUZZ_CLANG} CACHE INTERNAL "")
    endif()
    set(TERN_FUZZ_OK ${TERN_FUZZ_CLANG_WORKS})
  endif()
  if(NOT TERN_FUZZ_OK AND TERN_FUZZ STREQUAL "ON")
    message(FATAL_ERROR "TERN_FUZZ=ON but no clang with libFuzzer was found. Install clang-14 "
      "and libclang-rt-14-dev (ci/install-deps.sh does), set TERN_FUZZ_CLANG, or configure "
      "with -DTERN_FUZZ=OFF.")
  endif()
endif()
message(STATUS "tern: fuzzers ${TERN_FUZZ_OK} (TERN_FUZZ=${TERN_FUZZ})")

# tern_add_fuzzer(NAME test OUTPUT binary SOURCES files... HEADERS files...
#                 CORPUS dir [DICT file] LABELS labels...)
# Builds binary (in the current build folder, target tern_<binary>) from the
# sources with TERN_FUZZ_CLANG, rebuilt when a source or a header listed
# changes, and registers the CTest test that runs it for TERN_FUZZ_SECONDS
# through tests/tensor/run_fuzz.sh, from the seeds in CORPUS (new inputs and
# any crash go to <binary>.work in the build folder). Call it only when
# TERN_FUZZ_OK.
function(tern_add_fuzzer)
  cmake_parse_arguments(F "" "NAME;OUTPUT;CORPUS;DICT" "SOURCES;HEADERS;LABELS" ${ARGN})
  set(src ${PROJECT_SOURCE_DIR})
  set(bin ${CMAKE_CURRENT_BINARY_DIR}/${F_OUTPUT})
  add_custom_command(OUTPUT ${bin}
    COMMAND ${TERN_FUZZ_CLANG} -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror
      -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
      -I${src} -I${src}/include -I${PROJECT_BINARY_DIR}/include
      ${F_SOURCES} -o ${bin}
    DEPENDS ${F_SOURCES} ${F_HEADERS}
    COMMENT "Building the fuzzer ${F_OUTPUT} with ${TERN_FUZZ_CLANG} (libFuzzer)"
    VERBATIM)
  add_custom_target(tern_${F_OUTPUT} ALL DEPENDS ${bin})

  add_test(NAME ${F_NAME}
    COMMAND sh ${src}/tests/tensor/run_fuzz.sh ${bin} ${F_CORPUS}
      ${CMAKE_CURRENT_BINARY_DIR}/${F_OUTPUT}.work ${TERN_FUZZ_SECONDS} ${F_DICT})
  math(EXPR timeout "${TERN_FUZZ_SECONDS} + 60")
  set_tests_properties(${F_NAME} PROPERTIES TIMEOUT ${timeout} LABELS "${F_LABELS}"
    ENVIRONMENT "TERN_LOG=error")
endfunction()
