/*
 * The fuzzer's seed corpus (tests/tensor/corpus/): small valid encodings.
 *   test_corpus [DIR]        check every seed still decodes and re-encodes to
 *                            the same bytes (run by CTest; DIR defaults to the
 *                            source tree's corpus)
 *   test_corpus --write DIR  (re)write the seeds, after a wire format change
 * Files named desc_* hold a descriptor alone; the others a full encoding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <tern/tensor.h>

#include "corpus_check.h"
#include "tensor_test_util.h"


struct seed {
    const char *name;
    tern_dtype_t dtype;
    int32_t ndim;
    int64_t shape[TERN_TENSOR_MAX_DIMS];
    int32_t cuda; /* -1: cpu */
};

static const struct seed seeds[] = {
    {"f32_2x3", TERN_DTYPE_F32, 2, {2, 3}, -1},
    {"f64_scalar", TERN_DTYPE_F64, 0, {0}, -1},
    {"i8_empty", TERN_DTYPE_I8, 1, {0}, -1},
    {"bool_4", TERN_DTYPE_BOOL, 1, {4}, -1},
    {"bf16_1x1x1x2", TERN_DTYPE_BF16, 4, {1, 1, 1, 2}, -1},
    {"u8_16dims", TERN_DTYPE_U8, 16, {1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3}, -1},
    {"i64_3x0x2", TERN_DTYPE_I64, 3, {3, 0, 2}, -1},
    {"f16_5", TERN_DTYPE_F16, 1, {5}, -1},
    {"desc_i32_cuda1_5x7", TERN_DTYPE_I32, 2, {5, 7}, 1},
    {"desc_f32_big", TERN_DTYPE_F32, 3, {1024, 1024, 1024}, 0},
};

static void write_seeds(const char *dir)
{
    static unsigned char data[4096], buf[8192];
    tt_fill(data, sizeof(data), 9);
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
        const struct seed *s = &seeds[i];
        tern_tensor_t t;
        tern_device_t dev = s->cuda >= 0 ? tern_device_cuda(s->cuda) : tern_device_cpu();
        size_t len;
        char path[4096];
        if (tern_tensor_init(&t, data, s->dtype, s->ndim, s->shape, dev) != TERN_OK) {
            fprintf(stderr, "%s: %s\n", s->name, tern_last_error());
            exit(1);
        }
        tern_status_t st = strncmp(s->name, "desc_", 5) == 0
                               ? tern_tensor_encode_desc(&t, buf, sizeof(buf), &len)
                               : tern_tensor_encode(&t, buf, sizeof(buf), &len);
        if (st != TERN_OK) {
            fprintf(stderr, "%s: %s\n", s->name, tern_last_error());
            exit(1);
        }
        snprintf(path, sizeof(path), "%s/%s", dir, s->name);
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
            perror(path);
            exit(1);
        }
    }
}

static void test_every_seed_decodes(void **state)
{
    (void)state;
    size_t found = 0;
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
        size_t len, out_len, consumed;
        unsigned char *buf = corpus_read(seeds[i].name, &len), out[8192];
        tern_tensor_t t;
        bool desc = strncmp(seeds[i].name, "desc_", 5) == 0;
        if (desc) {
            assert_int_equal(tern_tensor_decode_desc(buf, len, &t, NULL), TERN_OK);
            assert_int_equal(tern_tensor_encode_desc(&t, out, sizeof(out), &out_len), TERN_OK);
        } else {
            assert_int_equal(tern_tensor_decode(buf, len, &t, &consumed), TERN_OK);
            assert_int_equal(consumed, len);
            assert_int_equal(tern_tensor_encode(&t, out, sizeof(out), &out_len), TERN_OK);
        }
        assert_int_equal(t.dtype, seeds[i].dtype);
        assert_int_equal(t.ndim, seeds[i].ndim);
        for (int d = 0; d < t.ndim; d++)
            assert_int_equal(t.shape[d], seeds[i].shape[d]);
        assert_int_equal(out_len, len);
        assert_memory_equal(out, buf, len);
        free(buf);
        found++;
    }
    /* Nothing else in the folder but seeds we know. */
    assert_int_equal(corpus_files(), found);
}

int main(int argc, char **argv)
{
    return corpus_main(argc, argv, write_seeds, test_every_seed_decodes);
}
