# thread pool and topology tests
tern_add_test(NAME test_pool SOURCES test_pool.c LINK tern_core LABELS core threads TIMEOUT 120)
