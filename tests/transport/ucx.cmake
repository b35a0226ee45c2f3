# The ucx provider's smoke test, once per UCX transport set: tcp (UCX's TCP
# transport, peer failure detected by UCX) and sm (shared memory: posix/sysv
# AMs; puts and gets from 256 KiB by process_vm_readv/writev; peer failure by
# tern's notice channel), and sm once more with every put and get served through the
# FIFO (TERN_UCX_CMA=0).
tern_add_test(NAME test_ucx_smoke_tcp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/ucx_smoke.c
  LINK tern_transport tern_core LABELS transport ucx threads TIMEOUT 300 ENV UCX_TLS=tcp)
# The peer-close cases leave workers parked on sm (${parked}: CMakeLists.txt).
tern_add_test(NAME test_ucx_smoke_sm SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/ucx_smoke.c
  LINK tern_transport tern_core LABELS transport ucx TIMEOUT 300 ENV UCX_TLS=sm ${parked})
add_test(NAME test_ucx_smoke_sm_nocma COMMAND test_ucx_smoke_sm)
set_tests_properties(test_ucx_smoke_sm_nocma PROPERTIES TIMEOUT 300 LABELS "transport;ucx" SKIP_RETURN_CODE 77
  ENVIRONMENT "UCX_TLS=sm;TERN_UCX_CMA=0;UCX_NET_DEVICES=lo;TERN_LOG=warn;${parked}")
# The short header's 24-bit seqs, widened across every wrap (header-only).
tern_add_test(NAME test_ucx_seq SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ucx_seq.c LINK tern_core
  LABELS transport ucx)
