/*
 * libFuzzer target for the tensor wire decoder. Whatever the bytes, decode and
 * decode_desc must return cleanly (ASan and UBSan watch every read); whatever
 * decodes must be a valid descriptor whose re-encoding is the same bytes (the
 * encoding is canonical) and decodes to the same tensor.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined by tests/tensor/CMakeLists.txt
 * and run for a bounded time as the CTest test fuzz_tensor_decode.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tensor.h>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

static void check_same(const tern_tensor_t *a, const tern_tensor_t *b)
{
    CHECK(a->dtype == b->dtype);
    CHECK(a->ndim == b->ndim);
    CHECK(a->device.type == b->device.type && a->device.index == b->device.index);
    for (int i = 0; i < a->ndim; i++)
        CHECK(a->shape[i] == b->shape[i] && a->strides[i] == b->strides[i]);
}

static void fuzz_desc(const uint8_t *data, size_t size)
{
    tern_tensor_t t, again;
    size_t consumed = 0, len = 0, extent;
    if (tern_tensor_decode_desc(data, size, &t, &consumed) != TERN_OK)
        return;
    CHECK(consumed <= size);
    CHECK(consumed == tern_tensor_wire_desc_size(t.ndim));
    CHECK(t.data == NULL);
    CHECK(tern_tensor_is_contiguous(&t));
    CHECK(tern_tensor_extent(&t, &extent) == TERN_OK);
    unsigned char buf[TERN_TENSOR_WIRE_DESC_MAX];
    CHECK(tern_tensor_encode_desc(&t, buf, sizeof(buf), &len) == TERN_OK);
    CHECK(len == consumed && memcmp(buf, data, len) == 0);
    CHECK(tern_tensor_decode_desc(buf, len, &again, NULL) == TERN_OK);
    check_same(&t, &again);
    /* Strict mode agrees with the prefix parse. */
    CHECK((tern_tensor_decode_desc(data, size, &again, NULL) == TERN_OK) == (size == consumed));
}

static void fuzz_full(const uint8_t *data, size_t size)
{
    tern_tensor_t t, again;
    size_t consumed = 0, len = 0, nbytes = 0, need = 0;
    if (tern_tensor_decode(data, size, &t, &consumed) != TERN_OK)
        return;
    CHECK(consumed <= size);
    CHECK(tern_tensor_validate(&t) == TERN_OK);
    CHECK(tern_tensor_nbytes(&t, &nbytes) == TERN_OK);
    size_t dsize = tern_tensor_wire_desc_size(t.ndim);
    CHECK(consumed == dsize + nbytes);
    CHECK((const uint8_t *)t.data == data + dsize);
    CHECK(tern_tensor_wire_size(&t, &need) == TERN_OK && need == consumed);
    unsigned char *buf = malloc(need ? need : 1);
    if (buf == NULL)
        return;
    CHECK(tern_tensor_encode(&t, buf, need, &len) == TERN_OK);
    CHECK(len == consumed && memcmp(buf, data, len) == 0);
    CHECK(tern_tensor_decode(buf, len, &again, NULL) == TERN_OK);
    check_same(&t, &again);
    CHECK(memcmp(again.data, t.data, nbytes) == 0);
    free(buf);
    CHECK((tern_tensor_decode(data, size, &again, NULL) == TERN_OK) == (size == consumed));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_desc(data, size);
    fuzz_full(data, size);
    return 0;
}
