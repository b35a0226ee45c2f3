# thread pool and topology tests
