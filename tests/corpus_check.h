/*
 * What the fuzzers' seed tests share (tests/tensor/test_corpus.c,
 * tests/prof/test_prof_corpus.c): reading a seed, counting the folder, and a
 * main that either rewrites the seeds (--write DIR) or checks them with one
 * cmocka test (in DIR, else TERN_CORPUS_DIR). Include after <cmocka.h>.
 */
#ifndef TERN_TESTS_CORPUS_CHECK_H
#define TERN_TESTS_CORPUS_CHECK_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *corpus_dir;

/* Seed name of corpus_dir, whole (seeds are under 1 MiB). */
static unsigned char *corpus_read(const char *name, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", corpus_dir, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0 && n < (1 << 20));
    rewind(f);
    unsigned char *p = malloc((size_t)n + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* The files in corpus_dir but hidden ones: a test compares it with the
 * seeds it knows, so that nothing else lies there. */
static size_t corpus_files(void)
{
    DIR *dir = opendir(corpus_dir);
    assert_non_null(dir);
    size_t files = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        if (e->d_name[0] != '.')
            files++;
    closedir(dir);
    return files;
}

static int corpus_main(int argc, char **argv, void (*write_seeds)(const char *dir),
                       CMUnitTestFunction check)
{
    if (argc == 3 && strcmp(argv[1], "--write") == 0) {
        write_seeds(argv[2]);
        return 0;
    }
    if (argc > 2) {
        fprintf(stderr, "usage: %s [CORPUS_DIR] | --write CORPUS_DIR\n", argv[0]);
        return 2;
    }
    corpus_dir = argc == 2 ? argv[1] : TERN_CORPUS_DIR;
    const struct CMUnitTest tests[] = {
        {"every_seed_decodes", check, NULL, NULL, NULL},
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
