/* The tensor wire form: exact bytes, round trips, and rejection of every malformed input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <tern/tensor.h>

#include "tensor_test_util.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Encode t into a fresh exact-size buffer; *len gets the size. */
static unsigned char *encode_alloc(const tern_tensor_t *t, size_t *len)
{
    size_t need = 0, got = 0;
    assert_int_equal(tern_tensor_wire_size(t, &need), TERN_OK);
    /* Size query: no buffer. */
    assert_int_equal(tern_tensor_encode(t, NULL, 0, &got), TERN_ERR_TRUNCATED);
    assert_int_equal(got, need);
    unsigned char *buf = malloc(need ? need : 1);
    assert_non_null(buf);
    assert_int_equal(tern_tensor_encode(t, buf, need, &got), TERN_OK);
    assert_int_equal(got, need);
    *len = need;
    return buf;
}

/* A copy of buf[0..len) in a block of exactly len bytes, so that ASan sees any over-read. */
static unsigned char *exact_copy(const unsigned char *buf, size_t len)
{
    unsigned char *p = malloc(len ? len : 1);
    assert_non_null(p);
    if (len > 0)
        memcpy(p, buf, len);
    return p;
}

static void assert_same_desc(const tern_tensor_t *a, const tern_tensor_t *b)
{
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->ndim, b->ndim);
    assert_int_equal(a->device.type, b->device.type);
    assert_int_equal(a->device.index, b->device.index);
    for (int i = 0; i < a->ndim; i++)
        assert_int_equal(a->shape[i], b->shape[i]);
}

static void test_exact_bytes(void **state)
{
    int64_t shape[] = {2, 3};
    tern_tensor_t t;
    unsigned char buf[64];
    size_t len = 0;
    (void)state;
    assert_int_equal(tern_tensor_wire_desc_size(0), 16);
    assert_int_equal(tern_tensor_wire_desc_size(2), 32);
    assert_int_equal(tern_tensor_wire_desc_size(16), 144);
    assert_int_equal(TERN_TENSOR_WIRE_DESC_MAX, 144);
    assert_int_equal(tern_tensor_wire_desc_size(17), 0);
    assert_int_equal(tern_tensor_wire_desc_size(-1), 0);

    assert_int_equal(tern_tensor_init(&t, NULL, TERN_DTYPE_F32, 2, shape, tern_device_cuda(258)),
                     TERN_OK);
    assert_int_equal(tern_tensor_encode_desc(&t, buf, sizeof(buf), &len), TERN_OK);
    static const unsigned char want[32] = {
        'T', 'N', 'S', 'R', 1, 2, 2, 1, /* magic, version, dtype f32, ndim 2, cuda */
        2,   1,   0,   0,   0, 0, 0, 0, /* index 258 LE, reserved */
        2,   0,   0,   0,   0, 0, 0, 0, /* shape[0] = 2 */
        3,   0,   0,   0,   0, 0, 0, 0, /* shape[1] = 3 */
    };
    assert_int_equal(len, sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));

    /* Full form: payload after the descriptor, little-endian as stored (LE host). */
    uint16_t v[] = {0x0102, 0x0304};
    int64_t s2[] = {1, 2};
    assert_int_equal(tern_tensor_init(&t, v, TERN_DTYPE_I16, 2, s2, tern_device_cpu()), TERN_OK);
    assert_int_equal(tern_tensor_encode(&t, buf, sizeof(buf), &len), TERN_OK);
    assert_int_equal(len, 32 + 4);
    assert_int_equal(buf[5], TERN_DTYPE_I16);
    assert_int_equal(buf[7], 0);
    assert_memory_equal(buf + 32, v, 4);

    /* A large dimension, byte by byte. */
    int64_t s3[] = {INT64_C(0x0102030405060708)};
    assert_int_equal(tern_tensor_init(&t, NULL, TERN_DTYPE_U8, 1, s3, tern_device_cpu()), TERN_OK);
    assert_int_equal(tern_tensor_encode_desc(&t, buf, sizeof(buf), &len), TERN_OK);
    static const unsigned char dim[8] = {8, 7, 6, 5, 4, 3, 2, 1};
    assert_memory_equal(buf + 16, dim, 8);
}

/* Round trip one tensor: full form (zero-copy view) and descriptor alone. */
static void round_trip(const tern_tensor_t *src)
{
    size_t len, consumed = 0, nbytes;
    unsigned char *buf = encode_alloc(src, &len);
    assert_int_equal(tern_tensor_nbytes(src, &nbytes), TERN_OK);
    size_t dsize = tern_tensor_wire_desc_size(src->ndim);
    assert_int_equal(len, dsize + nbytes);

    tern_tensor_t out;
    assert_int_equal(tern_tensor_decode(buf, len, &out, &consumed), TERN_OK);
    assert_int_equal(consumed, len);
    assert_same_desc(&out, src);
    assert_ptr_equal(out.data, buf + dsize); /* a view, not a copy */
    assert_true(tern_tensor_is_contiguous(&out));
    assert_int_equal(tern_tensor_validate(&out), TERN_OK);
    unsigned char *want = malloc(nbytes ? nbytes : 1);
    assert_non_null(want);
    tt_ref_gather(src, want);
    if (nbytes > 0)
        assert_memory_equal(out.data, want, nbytes);
    free(want);

    /* Strict (consumed NULL) accepts the exact length. */
    assert_int_equal(tern_tensor_decode(buf, len, &out, NULL), TERN_OK);

    /* Descriptor alone, both from the full encoding and from encode_desc. */
    tern_tensor_t d;
    assert_int_equal(tern_tensor_decode_desc(buf, len, &d, &consumed), TERN_OK);
    assert_int_equal(consumed, dsize);
    assert_same_desc(&d, src);
    assert_null(d.data);
    unsigned char desc[TERN_TENSOR_WIRE_DESC_MAX];
    size_t dlen = 0;
    assert_int_equal(tern_tensor_encode_desc(src, desc, sizeof(desc), &dlen), TERN_OK);
    assert_int_equal(dlen, dsize);
    assert_memory_equal(desc, buf, dsize);
    assert_int_equal(tern_tensor_decode_desc(desc, dlen, &d, NULL), TERN_OK);
    assert_same_desc(&d, src);

    /* Re-encoding what was decoded gives the same bytes. */
    size_t len2;
    unsigned char *buf2 = encode_alloc(&out, &len2);
    assert_int_equal(len2, len);
    assert_memory_equal(buf2, buf, len);
    free(buf2);
    free(buf);
}

static void test_round_trip_every_dtype_and_ndim(void **state)
{
    (void)state;
    size_t cap = 8 * 7776;
    unsigned char *data = malloc(cap);
    assert_non_null(data);
    tt_fill(data, cap, 3);
    for (int dt = 0; dt < TERN_DTYPE_COUNT; dt++) {
        for (int ndim = 0; ndim <= TERN_TENSOR_MAX_DIMS; ndim++) {
            int64_t shape[TERN_TENSOR_MAX_DIMS];
            for (int i = 0; i < ndim; i++)
                shape[i] = 1 + i % 3; /* at most 7776 elements */
            tern_tensor_t t;
            assert_int_equal(
                tern_tensor_init(&t, data, (tern_dtype_t)dt, ndim, shape, tern_device_cpu()),
                TERN_OK);
            round_trip(&t);
        }
    }
    free(data);
}

static void test_round_trip_zero_size(void **state)
{
    (void)state;
    static const int64_t shapes[][4] = {{0}, {3, 0}, {0, 5, 7}, {2, 3, 0, 4}};
    static const int32_t ndims[] = {1, 2, 3, 4};
    for (size_t i = 0; i < ARRAY_LEN(ndims); i++) {
        tern_tensor_t t;
        assert_int_equal(
            tern_tensor_init(&t, NULL, TERN_DTYPE_F64, ndims[i], shapes[i], tern_device_cpu()),
            TERN_OK);
        round_trip(&t);
        size_t len;
        unsigned char *buf = encode_alloc(&t, &len);
        assert_int_equal(len, tern_tensor_wire_desc_size(ndims[i]));
        free(buf);
    }
    /* Huge dimensions beside a zero: no payload, still decodes. */
    int64_t big[] = {INT64_C(1) << 30, 0, INT64_C(1) << 30};
    tern_tensor_t t;
    assert_int_equal(tern_tensor_init(&t, NULL, TERN_DTYPE_F64, 3, big, tern_device_cpu()),
                     TERN_OK);
    round_trip(&t);
}

static void test_round_trip_non_contiguous(void **state)
{
    static unsigned char src[1 << 16];
    uint32_t rng = 777;
    (void)state;
    tt_fill(src, sizeof(src), 4);
    /* A few views PyTorch makes: t(), [:, ::2], expand(), permute(). */
    struct {
        int32_t ndim;
        int64_t shape[4], strides[4];
    } views[] = {
        {2, {4, 6}, {1, 4}},
        {2, {4, 3}, {6, 2}},
        {3, {5, 4, 3}, {0, 3, 1}},
        {4, {2, 3, 4, 5}, {60, 1, 15, 3}},
        {1, {9}, {0}},
    };
    for (int dt = 0; dt < TERN_DTYPE_COUNT; dt++) {
        for (size_t i = 0; i < ARRAY_LEN(views); i++) {
            tern_tensor_t t;
            memset(&t, 0, sizeof(t));
            t.data = src;
            t.dtype = (tern_dtype_t)dt;
            t.ndim = views[i].ndim;
            t.device = tern_device_cpu();
            memcpy(t.shape, views[i].shape, sizeof(views[i].shape));
            memcpy(t.strides, views[i].strides, sizeof(views[i].strides));
            assert_false(tern_tensor_is_contiguous(&t));
            round_trip(&t);
        }
    }
    for (int iter = 0; iter < 500; iter++) {
        tern_tensor_t t;
        memset(&t, 0, sizeof(t));
        t.data = src;
        t.dtype = (tern_dtype_t)(tt_rand(&rng) % TERN_DTYPE_COUNT);
        t.ndim = (int32_t)(tt_rand(&rng) % 6);
        for (int i = 0; i < t.ndim; i++) {
            t.shape[i] = tt_rand(&rng) % 5;
            t.strides[i] = tt_rand(&rng) % 8;
        }
        size_t e;
        assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
        assert_true(e <= sizeof(src));
        round_trip(&t);
    }
}

static void test_encode_errors(void **state)
{
    float v[6] = {0};
    int64_t shape[] = {2, 3};
    tern_tensor_t t;
    unsigned char buf[256];
    size_t len = 0;
    (void)state;
    assert_int_equal(tern_tensor_init(&t, v, TERN_DTYPE_F32, 2, shape, tern_device_cpu()), TERN_OK);

    /* Too small: TRUNCATED with the size needed, nothing written. */
    memset(buf, 0x5a, sizeof(buf));
    assert_int_equal(tern_tensor_encode(&t, buf, 32 + 23, &len), TERN_ERR_TRUNCATED);
    assert_int_equal(len, 32 + 24);
    assert_string_equal(tern_last_error(), "tensor encoding needs 56 bytes, buffer has 55");
    for (size_t i = 0; i < sizeof(buf); i++)
        assert_int_equal(buf[i], 0x5a);
    len = 0;
    assert_int_equal(tern_tensor_encode_desc(&t, buf, 31, &len), TERN_ERR_TRUNCATED);
    assert_int_equal(len, 32);
    assert_int_equal(buf[0], 0x5a);
    assert_int_equal(tern_tensor_encode_desc(&t, NULL, 0, &len), TERN_ERR_TRUNCATED);
    assert_int_equal(len, 32);

    /* Bad arguments. */
    assert_int_equal(tern_tensor_encode(&t, buf, sizeof(buf), NULL), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_encode(&t, NULL, 10, &len), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_encode(NULL, buf, sizeof(buf), &len), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_encode_desc(NULL, buf, sizeof(buf), &len), TERN_ERR_INVALID_PARAM);

    /* Buffer overlapping the tensor. */
    unsigned char big[512];
    tern_tensor_t o = t;
    o.data = big + 40; /* the encoding is big[0..56) */
    assert_int_equal(tern_tensor_encode(&o, big, sizeof(big), &len), TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(), "tensor encode: buffer overlaps the tensor");
    o.data = big + 56; /* adjacent, either side */
    assert_int_equal(tern_tensor_encode(&o, big, sizeof(big), &len), TERN_OK);
    assert_int_equal(tern_tensor_encode(&o, big + 56 + 24, 100, &len), TERN_OK);

    /* CUDA tensors: descriptor yes, payload no. */
    tern_tensor_t c = t;
    c.device = tern_device_cuda(3);
    c.data = (void *)(uintptr_t)0x7f0000000000ull; /* never read */
    assert_int_equal(tern_tensor_encode(&c, buf, sizeof(buf), &len), TERN_ERR_UNSUPPORTED);
    assert_int_equal(tern_tensor_encode_desc(&c, buf, sizeof(buf), &len), TERN_OK);
    tern_tensor_t d;
    assert_int_equal(tern_tensor_decode_desc(buf, len, &d, NULL), TERN_OK);
    assert_int_equal(d.device.type, TERN_DEVICE_CUDA);
    assert_int_equal(d.device.index, 3);
    /* ... and a descriptor saying cuda cannot be a full encoding. */
    unsigned char full[32 + 24];
    memcpy(full, buf, 32);
    memset(full + 32, 0, 24);
    assert_int_equal(tern_tensor_decode(full, sizeof(full), &d, NULL), TERN_ERR_PROTOCOL);

    /* Invalid tensors. */
    tern_tensor_t bad = t;
    bad.strides[1] = -1;
    assert_int_equal(tern_tensor_encode(&bad, buf, sizeof(buf), &len), TERN_ERR_UNSUPPORTED);
    assert_int_equal(tern_tensor_encode_desc(&bad, buf, sizeof(buf), &len), TERN_ERR_UNSUPPORTED);
    bad = t;
    bad.data = NULL;
    assert_int_equal(tern_tensor_encode(&bad, buf, sizeof(buf), &len), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_encode_desc(&bad, buf, sizeof(buf), &len), TERN_OK);
    bad = t;
    bad.ndim = 17;
    assert_int_equal(tern_tensor_encode_desc(&bad, buf, sizeof(buf), &len), TERN_ERR_INVALID_PARAM);
    bad = t;
    bad.dtype = (tern_dtype_t)10;
    assert_int_equal(tern_tensor_encode_desc(&bad, buf, sizeof(buf), &len), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_wire_size(&bad, &len), TERN_ERR_INVALID_PARAM);
    bad = t;
    bad.shape[0] = INT64_MAX;
    assert_int_equal(tern_tensor_wire_size(&bad, &len), TERN_ERR_OUT_OF_RANGE);
    bad.dtype = TERN_DTYPE_U8;
    bad.ndim = 1;
    assert_int_equal(tern_tensor_wire_size(&bad, &len), TERN_ERR_OUT_OF_RANGE); /* + 24 overflows */
}

/* Every prefix of a valid encoding is rejected cleanly, as TERN_ERR_TRUNCATED. */
static void test_every_truncation(void **state)
{
    int16_t v[2 * 3 * 5];
    int64_t shape[] = {2, 3, 5};
    tern_tensor_t t, out;
    size_t len, consumed;
    (void)state;
    tt_fill(v, sizeof(v), 5);
    assert_int_equal(tern_tensor_init(&t, v, TERN_DTYPE_I16, 3, shape, tern_device_cpu()), TERN_OK);
    unsigned char *buf = encode_alloc(&t, &len);
    size_t dsize = tern_tensor_wire_desc_size(3);
    for (size_t k = 0; k < len; k++) {
        unsigned char *p = exact_copy(buf, k);
        memset(&out, 0x77, sizeof(out));
        tern_tensor_t before = out;
        consumed = 12345;
        assert_int_equal(tern_tensor_decode(p, k, &out, &consumed), TERN_ERR_TRUNCATED);
        assert_int_equal(tern_tensor_decode(p, k, &out, NULL), TERN_ERR_TRUNCATED);
        assert_memory_equal(&out, &before, sizeof(out)); /* untouched on error */
        assert_int_equal(consumed, 12345);
        if (k < dsize) {
            assert_int_equal(tern_tensor_decode_desc(p, k, &out, &consumed), TERN_ERR_TRUNCATED);
            assert_int_equal(tern_tensor_decode_desc(p, k, &out, NULL), TERN_ERR_TRUNCATED);
        } else {
            assert_int_equal(tern_tensor_decode_desc(p, k, &out, &consumed), TERN_OK);
            assert_int_equal(consumed, dsize);
        }
        free(p);
    }
    assert_int_equal(tern_tensor_decode(NULL, 0, &out, &consumed), TERN_ERR_TRUNCATED);
    assert_int_equal(tern_tensor_decode(NULL, 5, &out, &consumed), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_decode(buf, len, NULL, &consumed), TERN_ERR_INVALID_PARAM);
    /* The last byte missing names the payload. */
    assert_int_equal(tern_tensor_decode(buf, len - 1, &out, &consumed), TERN_ERR_TRUNCATED);
    assert_string_equal(tern_last_error(), "tensor payload truncated: 59 of 60 bytes");
    assert_int_equal(tern_tensor_decode(buf, 20, &out, &consumed), TERN_ERR_TRUNCATED);
    assert_string_equal(tern_last_error(), "tensor descriptor truncated: 20 of 40 bytes (ndim 3)");
    free(buf);
}

static void test_trailing_bytes(void **state)
{
    uint8_t v[4] = {1, 2, 3, 4};
    int64_t shape[] = {4};
    tern_tensor_t t, out;
    unsigned char buf[64];
    size_t len, consumed = 0;
    (void)state;
    assert_int_equal(tern_tensor_init(&t, v, TERN_DTYPE_U8, 1, shape, tern_device_cpu()), TERN_OK);
    assert_int_equal(tern_tensor_encode(&t, buf, sizeof(buf), &len), TERN_OK);
    assert_int_equal(len, 28);
    /* Two tensors back to back: consumed walks them. */
    memcpy(buf + len, buf, len);
    assert_int_equal(tern_tensor_decode(buf, 2 * len, &out, &consumed), TERN_OK);
    assert_int_equal(consumed, len);
    assert_int_equal(tern_tensor_decode(buf + consumed, 2 * len - consumed, &out, &consumed),
                     TERN_OK);
    assert_int_equal(consumed, len);
    assert_memory_equal(out.data, v, 4);
    /* Strict: trailing bytes are an error. */
    assert_int_equal(tern_tensor_decode(buf, len + 1, &out, NULL), TERN_ERR_PROTOCOL);
    assert_string_equal(tern_last_error(), "1 trailing bytes after a 28-byte tensor encoding");
    assert_int_equal(tern_tensor_decode_desc(buf, len, &out, NULL), TERN_ERR_PROTOCOL);
    assert_int_equal(tern_tensor_decode_desc(buf, 24, &out, NULL), TERN_OK);
}

/* A valid f32 [2, 3] cpu descriptor plus payload, to corrupt. */
static size_t make_valid(unsigned char *buf, size_t cap)
{
    static float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[] = {2, 3};
    tern_tensor_t t;
    size_t len;
    assert_int_equal(tern_tensor_init(&t, v, TERN_DTYPE_F32, 2, shape, tern_device_cpu()), TERN_OK);
    assert_int_equal(tern_tensor_encode(&t, buf, cap, &len), TERN_OK);
    return len;
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Decode both ways and expect status from each (full and descriptor-only). */
static void expect(const unsigned char *buf, size_t len, tern_status_t full, tern_status_t desc)
{
    unsigned char *p = exact_copy(buf, len);
    tern_tensor_t out;
    size_t consumed;
    assert_int_equal(tern_tensor_decode(p, len, &out, &consumed), full);
    assert_int_equal(tern_tensor_decode_desc(p, len, &out, &consumed), desc);
    free(p);
}

static void test_corrupt_each_field(void **state)
{
    unsigned char good[256], b[256];
    (void)state;
    size_t len = make_valid(good, sizeof(good));
    expect(good, len, TERN_OK, TERN_OK);

    /* magic, every byte */
    for (int i = 0; i < 4; i++) {
        memcpy(b, good, len);
        b[i] ^= 0x20;
        expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    }
    /* version */
    static const unsigned char versions[] = {0, 2, 0x81, 0xff};
    for (size_t i = 0; i < ARRAY_LEN(versions); i++) {
        memcpy(b, good, len);
        b[4] = versions[i];
        expect(b, len, TERN_ERR_UNSUPPORTED, TERN_ERR_UNSUPPORTED);
    }
    assert_string_equal(tern_last_error(), "tensor wire version 255 (this tern reads version 1)");
    /* dtype */
    for (unsigned code = TERN_DTYPE_COUNT; code < 256; code++) {
        memcpy(b, good, len);
        b[5] = (unsigned char)code;
        expect(b, len, TERN_ERR_UNSUPPORTED, TERN_ERR_UNSUPPORTED);
    }
    /* ndim over the maximum */
    for (unsigned n = TERN_TENSOR_MAX_DIMS + 1; n < 256; n++) {
        memcpy(b, good, len);
        b[6] = (unsigned char)n;
        expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    }
    /* ndim smaller than the dimensions that follow: [2], then 32 bytes read as
     * payload, of which 8 are wanted; the rest are trailing bytes. */
    tern_tensor_t out;
    size_t consumed;
    memcpy(b, good, len);
    b[6] = 1;
    expect(b, len, TERN_OK, TERN_OK);
    assert_int_equal(tern_tensor_decode(b, len, &out, &consumed), TERN_OK);
    assert_int_equal(out.ndim, 1);
    assert_int_equal(consumed, 24 + 8);
    assert_int_equal(tern_tensor_decode(b, len, &out, NULL), TERN_ERR_PROTOCOL);
    /* ... and larger: the payload's first 8 bytes read as a third dimension (1.0f, 2.0f
     * is 0x400000003f800000), whose product with 2 * 3 overflows. */
    b[6] = 3;
    expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    b[6] = 4; /* 48-byte descriptor, all there; fourth dimension overflows too */
    expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    b[6] = 6; /* 64-byte descriptor: longer than the buffer */
    expect(b, len, TERN_ERR_TRUNCATED, TERN_ERR_TRUNCATED);
    /* device type */
    for (unsigned d = 2; d < 256; d++) {
        memcpy(b, good, len);
        b[7] = (unsigned char)d;
        expect(b, len, TERN_ERR_UNSUPPORTED, TERN_ERR_UNSUPPORTED);
    }
    /* device index: cpu must be 0; cuda at most INT32_MAX */
    memcpy(b, good, len);
    b[8] = 1;
    expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    memcpy(b, good, len);
    b[7] = TERN_DEVICE_CUDA;
    put32(b + 8, 0x80000000u);
    expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    put32(b + 8, 0x7fffffffu);
    expect(b, len, TERN_ERR_PROTOCOL /* cuda in a full encoding */, TERN_OK);
    /* reserved, every byte */
    for (int i = 12; i < 16; i++) {
        memcpy(b, good, len);
        b[i] = 1;
        expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    }
    /* negative dimensions */
    for (int dim = 0; dim < 2; dim++) {
        memcpy(b, good, len);
        put64(b + 16 + 8 * dim, UINT64_C(1) << 63);
        expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
        put64(b + 16 + 8 * dim, UINT64_MAX);
        expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    }
    assert_string_equal(tern_last_error(),
                        "tensor descriptor dimension 1 is negative (0xffffffffffffffff)");
    /* element count overflow */
    memcpy(b, good, len);
    put64(b + 16, UINT64_C(1) << 32);
    put64(b + 24, UINT64_C(1) << 32);
    expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    /* byte count overflow: 2^62 f32 elements */
    memcpy(b, good, len);
    put64(b + 16, UINT64_C(1) << 31);
    put64(b + 24, UINT64_C(1) << 31);
    expect(b, len, TERN_ERR_PROTOCOL, TERN_ERR_PROTOCOL);
    assert_non_null(strstr(tern_last_error(), "byte count overflows"));
    /* huge but representable: the payload is simply not there */
    memcpy(b, good, len);
    put64(b + 16, INT64_MAX / 4);
    put64(b + 24, 1);
    expect(b, len, TERN_ERR_TRUNCATED, TERN_OK);
    /* one element more or fewer than carried */
    memcpy(b, good, len);
    b[24] = 4;
    expect(b, len, TERN_ERR_TRUNCATED, TERN_OK);
    memcpy(b, good, len);
    b[24] = 2;
    expect(b, len, TERN_OK /* consumed < len: allowed */, TERN_OK);
    assert_int_equal(tern_tensor_decode(b, len, &out, NULL), TERN_ERR_PROTOCOL);
}

/* Flip every bit of a valid encoding: decode fails, or succeeds with a
 * self-consistent result that re-encodes to the same bytes. Never a crash. */
static void test_bit_flips(void **state)
{
    unsigned char good[256];
    (void)state;
    size_t len = make_valid(good, sizeof(good));
    for (size_t bit = 0; bit < len * 8; bit++) {
        unsigned char *p = exact_copy(good, len);
        p[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        tern_tensor_t out;
        size_t consumed;
        if (tern_tensor_decode(p, len, &out, &consumed) == TERN_OK) {
            assert_true(consumed <= len);
            size_t rlen;
            unsigned char *r = encode_alloc(&out, &rlen);
            assert_int_equal(rlen, consumed);
            assert_memory_equal(r, p, rlen);
            free(r);
        }
        if (tern_tensor_decode_desc(p, len, &out, &consumed) == TERN_OK)
            assert_int_equal(consumed, tern_tensor_wire_desc_size(out.ndim));
        free(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_bytes),
        cmocka_unit_test(test_round_trip_every_dtype_and_ndim),
        cmocka_unit_test(test_round_trip_zero_size),
        cmocka_unit_test(test_round_trip_non_contiguous),
        cmocka_unit_test(test_encode_errors),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_corrupt_each_field),
        cmocka_unit_test(test_bit_flips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
