# The ucx provider's smoke test, once per UCX transport set: tcp (UCX's TCP
# transport, peer failure detected by UCX) and sm (shared memory: posix/sysv
# AMs, cma RMA; peer failure by tern's notice channel).
foreach(tls tcp sm)
  tern_add_test(NAME test_ucx_smoke_${tls} SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/ucx_smoke.c
    LINK tern_transport tern_core LABELS transport ucx TIMEOUT 300 ENV UCX_TLS=${tls})
endforeach()
