/*
 * rpc_malformed: RPC messages made malformed on purpose, carried by the real
 * transport (tern-run -n 2). Rank 0 ("caller") calls rank 1 ("victim"). A send
 * hook (tern__rpc_set_send_hook) changes one message on its way out, after
 * the RPC layer encoded it:
 *
 *   - requests, in rank 0: each field that sizes the message set out of range
 *     or past the message's end; the message cut at every length and grown;
 *     tensor headers, descriptors and remote keys corrupted; then random
 *     single-byte changes to every byte that is not an id;
 *   - replies, in rank 1, where rank 0's call ("mangle", its blob names the
 *     case) arms the change: the same kinds, and remote keys of results that
 *     the caller pulls.
 *
 * Every call must end with the error the receiver names (or, for a message
 * too short to carry a call id, run out its short timeout: it is dropped),
 * never with a crash or a hang; the victim must serve a checked call after
 * each case; results held for a caller that could not read its reply must
 * be released; and the job ends in a graceful shutdown, which waits for
 * exactly that and for every message sent to be counted as received.
 * A call whose first RRef argument names a rank that does not exist is
 * refused, and the RRefs after it are still settled with their owners.
 * Ids (call id, RRef ids, type) are left alone by the random changes: a
 * message that names another call is a different message, not a malformed
 * one.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tern/tern.h>

#include "core/bytes.h"
#include "rpc/rpc_int.h"

#include "rank_check.h"

#define MS ((int64_t)1000000)
#define SEC ((int64_t)1000000000)

/* The wire layout of docs/rpc.md ("Calls on the wire"), as rpc.c writes it. */
#define HDR 64
#define RREF_WIRE 32
#define TENSOR_HDR 16
#define RNDV_WIRE 16
#define MAX_BLOB ((uint32_t)512 << 10)
#define M_CALL 1
#define M_REPLY 4
#define T_RNDV 1u
#define OFF_TEXT_LEN 2
#define OFF_NTENSORS 4
#define OFF_NRREFS 48
#define OFF_BLOB_LEN 52
#define OFF_STATUS 56
#define OFF_EVENTS_LEN 60

#define SMALL 4         /* f32 elements of an inline tensor */
#define BIG (32 * 1024) /* f32 elements of a pulled one (128 KiB) */

static int rank;
static tern_ctx_t *ctx;
static atomic_ulong checks;

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* ---- where the fields of one message are ---- */

typedef struct tensor_at {
    size_t hdr, desc, body; /* offsets: header, descriptor, payload or key part */
    uint32_t mode, desc_len, rkey_len;
    uint64_t nbytes;
} tensor_at_t;

typedef struct layout {
    uint32_t ntensors;
    tensor_at_t t[4];
    size_t blob; /* offset of the blob */
    size_t len;
} layout_t;

/* Walk a message as the encoder wrote it (it is well formed here). */
static void walk(const uint8_t *m, size_t len, layout_t *l)
{
    memset(l, 0, sizeof(*l));
    l->len = len;
    l->ntensors = tern__get_le32(m + OFF_NTENSORS);
    CHECK(l->ntensors <= 4, "%u tensors in a test message", l->ntensors);
    size_t p = HDR + pad8(tern__get_le16(m + OFF_TEXT_LEN)) +
               (size_t)tern__get_le32(m + OFF_NRREFS) * RREF_WIRE;
    for (uint32_t i = 0; i < l->ntensors; i++) {
        tensor_at_t *t = &l->t[i];
        t->hdr = p;
        t->mode = tern__get_le32(m + p);
        t->desc_len = tern__get_le32(m + p + 4);
        t->nbytes = tern__get_le64(m + p + 8);
        t->desc = p + TENSOR_HDR;
        t->body = t->desc + pad8(t->desc_len);
        if (t->mode == T_RNDV) {
            t->rkey_len = tern__get_le32(m + t->body + 8);
            p = t->body + RNDV_WIRE + pad8(t->rkey_len);
        } else {
            p = t->body + pad8(t->nbytes);
        }
    }
    l->blob = p;
    CHECK(p + tern__get_le32(m + OFF_BLOB_LEN) + tern__get_le32(m + OFF_EVENTS_LEN) == len,
          "the walk ends at %zu of %zu", p, len);
}

/* ---- the cases ---- */

enum base { B_SMALL, B_BIG }; /* two inline tensors and a blob; one pulled tensor */
enum what { W_REQUEST, W_REPLY };
enum expect { E_DROP, E_ERROR };

typedef struct mcase {
    const char *name;
    enum what what;
    enum base base;
    void (*fn)(uint8_t **m, size_t *len, const layout_t *l, long arg);
    long arg;
    enum expect expect;
    tern_status_t status; /* for E_ERROR: 0 for any error */
    const char *text;     /* for E_ERROR: in the future's error, or NULL */
} mcase_t;


static void cut(uint8_t **m, size_t *len, const layout_t *l, long to)
{
    (void)m, (void)l;
    *len = (size_t)to;
}

static void grow(uint8_t **m, size_t *len, const layout_t *l, long by)
{
    (void)l;
    uint8_t *n = malloc(*len + (size_t)by); /* the hook's caller frees the old one */
    CHECK(n != NULL, "malloc");
    memcpy(n, *m, *len);
    memset(n + *len, 0x5a, (size_t)by);
    *m = n;
    *len += (size_t)by;
}

/* arg: offset << 32 | value, for the header's 16- and 32-bit fields. */
#define AT(off, v) (((long)(off) << 32) | (long)(uint32_t)(v))
static void hdr16(uint8_t **m, size_t *len, const layout_t *l, long arg)
{
    (void)len, (void)l;
    tern__put_le16(*m + (arg >> 32), (uint16_t)arg);
}

static void hdr32(uint8_t **m, size_t *len, const layout_t *l, long arg)
{
    (void)len, (void)l;
    tern__put_le32(*m + (arg >> 32), (uint32_t)arg);
}

static void ntensors_plus(uint8_t **m, size_t *len, const layout_t *l, long d)
{
    (void)len;
    tern__put_le32(*m + OFF_NTENSORS, (uint32_t)((long)l->ntensors + d));
}

static void blob_plus(uint8_t **m, size_t *len, const layout_t *l, long d)
{
    (void)len, (void)l;
    uint32_t b = tern__get_le32(*m + OFF_BLOB_LEN);
    tern__put_le32(*m + OFF_BLOB_LEN, (uint32_t)((long)b + d));
}

/* Tensor 0's header: arg = field offset (0 mode, 4 desc_len, 8 nbytes)
 * << 32 | value; nbytes is given as a change, the others as a value. */
static void t0_hdr(uint8_t **m, size_t *len, const layout_t *l, long arg)
{
    (void)len;
    size_t off = l->t[0].hdr + (size_t)(arg >> 32);
    if ((arg >> 32) == 8)
        tern__put_le64(*m + off, l->t[0].nbytes + (uint64_t)(int32_t)arg);
    else
        tern__put_le32(*m + off, (uint32_t)arg);
}

/* A byte of tensor 0's descriptor: arg = offset << 8 | value. */
static void t0_desc(uint8_t **m, size_t *len, const layout_t *l, long arg)
{
    (void)len;
    (*m)[l->t[0].desc + (size_t)(arg >> 8)] = (uint8_t)arg;
}

/* Tensor 0's key part (pulled tensors): 0 rkey_len past the limit, 1 every
 * key byte garbage, 2 an address far outside the registration. */
static void t0_key(uint8_t **m, size_t *len, const layout_t *l, long how)
{
    (void)len;
    const tensor_at_t *t = &l->t[0];
    CHECK(t->mode == T_RNDV, "tensor 0 is not pulled");
    if (how == 0)
        tern__put_le32(*m + t->body + 8, TERN_RKEY_MAX + 8);
    else if (how == 1)
        memset(*m + t->body + RNDV_WIRE, 0xab, t->rkey_len);
    else
        tern__put_le64(*m + t->body, tern__get_le64(*m + t->body) + ((uint64_t)1 << 40));
}

static void type_call(uint8_t **m, size_t *len, const layout_t *l, long unused)
{
    (void)len, (void)l, (void)unused;
    (*m)[0] = M_CALL;
}

#define MALFORMED(n, w, b, f, a, t) {n, w, b, f, a, E_ERROR, TERN_ERR_PROTOCOL, t}
#define DROPPED(n, w, b, f, a) {n, w, b, f, a, E_DROP, TERN_OK, NULL}

static const mcase_t cases[] = {
    /* requests: the counts and lengths of the header */
    MALFORMED("name length 0xffff", W_REQUEST, B_SMALL, hdr16, AT(OFF_TEXT_LEN, 0xffff),
              "counts or lengths"),
    MALFORMED("name length 64", W_REQUEST, B_SMALL, hdr16, AT(OFF_TEXT_LEN, 64),
              "counts or lengths"),
    MALFORMED("65 tensors", W_REQUEST, B_SMALL, hdr32, AT(OFF_NTENSORS, 65), "counts or lengths"),
    MALFORMED("2^32-1 tensors", W_REQUEST, B_SMALL, hdr32, AT(OFF_NTENSORS, -1),
              "counts or lengths"),
    MALFORMED("one tensor more", W_REQUEST, B_SMALL, ntensors_plus, 1, "tensor 2: message cut short"),
    MALFORMED("one tensor fewer", W_REQUEST, B_SMALL, ntensors_plus, -1, "past the end"),
    MALFORMED("65 RRefs", W_REQUEST, B_SMALL, hdr32, AT(OFF_NRREFS, 65), "counts or lengths"),
    MALFORMED("2^31 RRefs", W_REQUEST, B_SMALL, hdr32, AT(OFF_NRREFS, 0x80000000u),
              "counts or lengths"),
    MALFORMED("a blob over the limit", W_REQUEST, B_SMALL, hdr32, AT(OFF_BLOB_LEN, MAX_BLOB + 1),
              "counts or lengths"),
    MALFORMED("a blob one byte longer", W_REQUEST, B_SMALL, blob_plus, 1, "message cut short"),
    MALFORMED("a blob one byte shorter", W_REQUEST, B_SMALL, blob_plus, -1,
              "1 bytes past the end"),
    MALFORMED("8 bytes more than the parts", W_REQUEST, B_SMALL, grow, 8, "8 bytes past the end"),
    /* requests: a tensor's header and descriptor */
    MALFORMED("tensor mode 2", W_REQUEST, B_SMALL, t0_hdr, AT(0, 2), "tensor 0: bad header"),
    MALFORMED("descriptor length 2^32-1", W_REQUEST, B_SMALL, t0_hdr, AT(4, -1),
              "tensor 0: bad header"),
    MALFORMED("descriptor length 0", W_REQUEST, B_SMALL, t0_hdr, AT(4, 0), "tensor 0:"),
    MALFORMED("payload 8 bytes longer", W_REQUEST, B_SMALL, t0_hdr, AT(8, 8),
              "tensor 0: payload size or device"),
    MALFORMED("payload 4 bytes shorter", W_REQUEST, B_SMALL, t0_hdr, AT(8, -4),
              "tensor 0: payload size or device"),
    MALFORMED("descriptor magic", W_REQUEST, B_SMALL, t0_desc, 0 << 8 | 0x00, "magic"),
    MALFORMED("descriptor version", W_REQUEST, B_SMALL, t0_desc, 4 << 8 | 99, "version"),
    MALFORMED("descriptor dtype", W_REQUEST, B_SMALL, t0_desc, 5 << 8 | 200, "tensor 0:"),
    MALFORMED("descriptor ndim", W_REQUEST, B_SMALL, t0_desc, 6 << 8 | 200, "tensor 0:"),
    MALFORMED("descriptor on a GPU", W_REQUEST, B_SMALL, t0_desc, 7 << 8 | TERN_DEVICE_CUDA,
              "tensor 0:"),
    MALFORMED("an inline tensor said pulled", W_REQUEST, B_SMALL, t0_hdr, AT(0, T_RNDV),
              "tensor 0"),
    /* requests: a pulled tensor's key */
    MALFORMED("key length over the limit", W_REQUEST, B_BIG, t0_key, 0, "tensor 0: bad key"),
    {"key bytes garbage", W_REQUEST, B_BIG, t0_key, 1, E_ERROR, 0, "pulling"},
    {"address outside the key", W_REQUEST, B_BIG, t0_key, 2, E_ERROR, 0, "pulling"},
    MALFORMED("a pulled tensor said inline", W_REQUEST, B_BIG, t0_hdr, AT(0, 0),
              "tensor 0: payload cut short"),
    /* requests too short to be read: dropped, logged */
    DROPPED("empty request", W_REQUEST, B_SMALL, cut, 0),
    DROPPED("request of 63 bytes", W_REQUEST, B_SMALL, cut, HDR - 1),

    /* replies */
    MALFORMED("reply: error text of 0xffff bytes", W_REPLY, B_SMALL, hdr16,
              AT(OFF_TEXT_LEN, 0xffff), "malformed reply"),
    MALFORMED("reply: 65 tensors", W_REPLY, B_SMALL, hdr32, AT(OFF_NTENSORS, 65), "malformed reply"),
    MALFORMED("reply: one tensor more", W_REPLY, B_SMALL, ntensors_plus, 1, "message cut short"),
    MALFORMED("reply: a blob over the limit", W_REPLY, B_SMALL, hdr32,
              AT(OFF_BLOB_LEN, MAX_BLOB + 1), "malformed reply"),
    MALFORMED("reply: a blob one byte longer", W_REPLY, B_SMALL, blob_plus, 1, "cut short"),
    MALFORMED("reply: 8 bytes more than the parts", W_REPLY, B_SMALL, grow, 8, "past the end"),
    MALFORMED("reply: 65 RRefs", W_REPLY, B_SMALL, hdr32, AT(OFF_NRREFS, 65), "RRefs"),
    MALFORMED("reply: events longer than it", W_REPLY, B_SMALL, hdr32, AT(OFF_EVENTS_LEN, -1),
              "malformed reply (events)"),
    MALFORMED("reply: events eat the blob", W_REPLY, B_SMALL, hdr32, AT(OFF_EVENTS_LEN, 8),
              "cut short"),
    MALFORMED("reply: status 5", W_REPLY, B_SMALL, hdr32, AT(OFF_STATUS, 5), "status 5"),
    MALFORMED("reply: status INPROGRESS", W_REPLY, B_SMALL, hdr32, AT(OFF_STATUS, TERN_INPROGRESS),
              "status 1"),
    MALFORMED("reply: status -1000", W_REPLY, B_SMALL, hdr32, AT(OFF_STATUS, -1000),
              "status -1000"),
    {"reply: status ACCESS", W_REPLY, B_SMALL, hdr32, AT(OFF_STATUS, TERN_ERR_ACCESS), E_ERROR,
     TERN_ERR_ACCESS, NULL},
    MALFORMED("reply: descriptor magic", W_REPLY, B_SMALL, t0_desc, 0 << 8 | 0x00, "magic"),
    MALFORMED("reply: payload 8 bytes longer", W_REPLY, B_SMALL, t0_hdr, AT(8, 8), "tensor 0"),
    /* replies with a result to pull: the victim must get its RELEASE */
    MALFORMED("reply: key length over the limit", W_REPLY, B_BIG, t0_key, 0, "bad key"),
    {"reply: key bytes garbage", W_REPLY, B_BIG, t0_key, 1, E_ERROR, 0, "pulling the result"},
    {"reply: address outside the key", W_REPLY, B_BIG, t0_key, 2, E_ERROR, 0,
     "pulling the result"},
    MALFORMED("reply: 2^32-1 tensors, one pulled", W_REPLY, B_BIG, hdr32, AT(OFF_NTENSORS, -1),
              "malformed reply"),
    MALFORMED("reply: one pulled tensor cut", W_REPLY, B_BIG, blob_plus, 1, "cut short"),
    /* replies that cannot be read as one: dropped, logged */
    DROPPED("reply said a request", W_REPLY, B_SMALL, type_call, 0),
    DROPPED("reply of 63 bytes", W_REPLY, B_SMALL, cut, HDR - 1),
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

/* ---- the hook ---- */

/* What the next message of a kind gets: a case (index + 1), a cut or a
 * byte to change (random sweep), or nothing. */
typedef struct armed {
    _Atomic int kase;    /* cases[kase - 1] */
    _Atomic long cut_to; /* > 0: cut the message to this length */
    _Atomic long flip;   /* > 0: byte (flip - 1) gets flip_val */
    _Atomic int flip_val;
    _Atomic int rref0_owner; /* > 0: RRef argument 0 names this rank */
} armed_t;

static armed_t for_request, for_reply;

static uint8_t *hook(void *arg, int dst, uint8_t *buf, size_t *len)
{
    (void)arg, (void)dst;
    armed_t *a = buf[0] == M_CALL ? &for_request : buf[0] == M_REPLY ? &for_reply : NULL;
    if (a == NULL)
        return buf;
    int k = atomic_exchange(&a->kase, 0);
    long to = atomic_exchange(&a->cut_to, 0), flip = atomic_exchange(&a->flip, 0);
    int owner = atomic_exchange(&a->rref0_owner, 0);
    if (owner > 0) {
        CHECK(tern__get_le32(buf + OFF_NRREFS) > 0, "no RRef argument to change");
        tern__put_le32(buf + HDR + pad8(tern__get_le16(buf + OFF_TEXT_LEN)), (uint32_t)owner);
    } else if (k > 0) {
        layout_t l;
        walk(buf, *len, &l);
        cases[k - 1].fn(&buf, len, &l, cases[k - 1].arg);
    } else if (to > 0) {
        CHECK((size_t)to < *len, "cut to %ld of %zu", to, *len);
        *len = (size_t)to;
    } else if (flip > 0) {
        CHECK((size_t)flip <= *len, "byte %ld of %zu", flip - 1, *len);
        buf[flip - 1] = (uint8_t)atomic_load(&a->flip_val);
    }
    return buf;
}

/* ---- the functions rank 1 serves ---- */

static const char BLOB[8] = {'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H'};

/* small(a, b, blob): both f32[4] as sent and the blob intact; returns a + b
 * and the blob. */
static tern_status_t fn_small(tern_rpc_call_t *call)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    if (v->ntensors != 2 || v->blob_len != sizeof(BLOB) || memcmp(v->blob, BLOB, sizeof(BLOB)))
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "small: the arguments changed");
    tern_tensor_t *out;
    int64_t n = SMALL;
    const float *a = v->tensors[0].data, *b = v->tensors[1].data;
    for (int i = 0; i < 2; i++)
        if (v->tensors[i].dtype != TERN_DTYPE_F32 || v->tensors[i].ndim != 1 ||
            v->tensors[i].shape[0] != SMALL)
            return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "small: tensor %d changed", i);
    tern_status_t st = tern_rpc_call_alloc_tensor(call, TERN_DTYPE_F32, 1, &n, &out);
    if (st != TERN_OK)
        return st;
    for (int i = 0; i < SMALL; i++)
        ((float *)out->data)[i] = a[i] + b[i];
    return tern_rpc_call_return_blob(call, BLOB, sizeof(BLOB));
}

/* big(t): returns t, pulled and sent back by the caller pulling it. */
static tern_status_t fn_big(tern_rpc_call_t *call)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    if (v->ntensors != 1 || v->tensors[0].shape[0] != BIG)
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "big: the argument changed");
    return tern_rpc_call_return_arg(call, 0);
}

/* mangle: arm the case the blob names for this call's own reply, then do
 * what small or big does. */
static tern_status_t fn_mangle(tern_rpc_call_t *call)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    int k = 0;
    if (v->blob_len == sizeof(k))
        memcpy(&k, v->blob, sizeof(k));
    if (k < 1 || k > (int)NCASES || cases[k - 1].what != W_REPLY)
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "mangle: no case %d", k);
    atomic_store(&for_reply.kase, k);
    if (cases[k - 1].base == B_BIG)
        return tern_rpc_call_return_arg(call, 0);
    tern_tensor_t *out;
    int64_t n = SMALL;
    tern_status_t st = tern_rpc_call_alloc_tensor(call, TERN_DTYPE_F32, 1, &n, &out);
    if (st != TERN_OK)
        return st;
    for (int i = 0; i < SMALL; i++)
        ((float *)out->data)[i] = (float)i;
    return tern_rpc_call_return_blob(call, BLOB, sizeof(BLOB));
}

/* many_ranges: 4096 ranges of 300-byte names, more events than a reply
 * can carry (the transport sends at most 1 MiB). */
#define RANGES 4096
static tern_status_t fn_many_ranges(tern_rpc_call_t *call)
{
    (void)call;
    char name[301];
    for (int i = 0; i < RANGES; i++) {
        snprintf(name, sizeof(name), "%04d%0296d", i, 0);
        tern_prof_range_end(tern_prof_range_begin(name));
    }
    return TERN_OK;
}

/* owned: how many RRefs the victim owns, as a decimal blob. */
static tern_status_t fn_owned(tern_rpc_call_t *call)
{
    char n[24];
    int len = snprintf(n, sizeof(n), "%zu", tern_rpc_owned_count(tern_rpc_call_ctx(call)));
    return tern_rpc_call_return_blob(call, n, (size_t)len);
}

/* ---- rank 0 ---- */

static float sa[SMALL] = {1, 2, 3, 4}, sb[SMALL] = {10, 20, 30, 40};
static float *big_buf;
static tern_tensor_t small_ts[2], big_t;

static tern_rpc_args_t args_of(enum base b, const void *blob, size_t blob_len)
{
    tern_rpc_args_t a = {.blob = blob, .blob_len = blob_len};
    if (b == B_SMALL) {
        a.tensors = small_ts;
        a.ntensors = 2;
    } else {
        a.tensors = &big_t;
        a.ntensors = 1;
    }
    return a;
}

/* A call that must work, result checked: the victim is still whole. */
static void control(const char *after)
{
    tern_future_t *f = NULL;
    tern_rpc_args_t a = args_of(B_SMALL, BLOB, sizeof(BLOB));
    tern_status_t st = tern_rpc_sync(ctx, "victim", "small", &a, 10 * SEC, &f);
    CHECK(st == TERN_OK, "after '%s' the victim does not serve: %s", after, tern_last_error());
    const tern_rpc_value_t *v = tern_future_value(f);
    CHECK(v->ntensors == 1 && v->blob_len == sizeof(BLOB), "after '%s': result shape", after);
    for (int i = 0; i < SMALL; i++)
        CHECK(((const float *)v->tensors[0].data)[i] == sa[i] + sb[i], "after '%s': element %d",
              after, i);
    tern_future_free(f);
}

/* Start a call whose message the hook changes; returns its end. */
static tern_status_t call_changed(enum base b, const char *fn, const void *blob, size_t blob_len,
                                  int64_t timeout, char *err, size_t cap)
{
    tern_future_t *f = NULL;
    tern_rpc_args_t a = args_of(b, blob, blob_len);
    tern_status_t st = tern_rpc_async(ctx, "victim", fn, &a, timeout, &f);
    CHECK(st == TERN_OK, "rpc_async %s", fn);
    st = tern_future_wait(f, -1);
    snprintf(err, cap, "%s", tern_future_error(f));
    tern_future_free(f);
    return st;
}

static void run_case(int k)
{
    const mcase_t *c = &cases[k - 1];
    char err[1024];
    int64_t timeout = c->expect == E_DROP ? 300 * MS : 10 * SEC;
    tern_status_t st;
    if (c->what == W_REQUEST) {
        atomic_store(&for_request.kase, k);
        st = call_changed(c->base, c->base == B_SMALL ? "small" : "big", BLOB, sizeof(BLOB),
                          timeout, err, sizeof(err));
    } else {
        st = call_changed(c->base, "mangle", &k, sizeof(k), timeout, err, sizeof(err));
    }
    if (c->expect == E_DROP) {
        CHECK(st == TERN_ERR_TIMEOUT, "%s: %s (%s), want it dropped (TIMEOUT)", c->name,
              tern_status_name(st), err);
    } else {
        CHECK(st != TERN_OK && st != TERN_ERR_TIMEOUT && (c->status == 0 || st == c->status),
              "%s: %s, want %s", c->name, tern_status_name(st),
              c->status ? tern_status_name(c->status) : "an error other than TIMEOUT");
        CHECK(c->text == NULL || strstr(err, c->text) != NULL, "%s: error '%s', want '%s' in it",
              c->name, err, c->text);
    }
    control(c->name);
}

/* cut_reply(a, b, length): small's result, its reply cut to length. */
static tern_status_t fn_cut_reply(tern_rpc_call_t *call)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    int64_t to = 0;
    if (v->ntensors != 2 || v->blob_len != sizeof(to))
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "cut_reply: bad arguments");
    memcpy(&to, v->blob, sizeof(to));
    tern_tensor_t *out;
    int64_t n = SMALL;
    tern_status_t st = tern_rpc_call_alloc_tensor(call, TERN_DTYPE_F32, 1, &n, &out);
    if (st != TERN_OK)
        return st;
    memset(out->data, 0, SMALL * sizeof(float));
    atomic_store(&for_reply.cut_to, (long)to);
    return tern_rpc_call_return_blob(call, BLOB, sizeof(BLOB));
}

/* Cut small's request, or its reply, at every length from the header to one
 * short of the whole: each is an error the other end names. */
static unsigned sweep_cuts(enum what w, size_t full)
{
    char err[1024];
    unsigned n = 0;
    for (size_t to = HDR; to < full; to++, n++) {
        tern_status_t st;
        if (w == W_REQUEST) {
            atomic_store(&for_request.cut_to, (long)to);
            st = call_changed(B_SMALL, "small", BLOB, sizeof(BLOB), 10 * SEC, err, sizeof(err));
        } else {
            int64_t len = (int64_t)to;
            st = call_changed(B_SMALL, "cut_reply", &len, sizeof(len), 10 * SEC, err,
                              sizeof(err));
        }
        CHECK(st == TERN_ERR_PROTOCOL && strstr(err, "malformed") != NULL,
              "%s cut to %zu of %zu bytes: %s (%s), want PROTOCOL, malformed",
              w == W_REQUEST ? "request" : "reply", to, full, tern_status_name(st), err);
    }
    control("the cuts");
    return n;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* n random single-byte changes of small's request, anywhere but the ids
 * (type, flags, call id, target and aux ids: bytes 0-1 and 8-47): each call
 * ends, with its result or an error, before its timeout. */
static void sweep_random(unsigned n, size_t full)
{
    char err[1024];
    unsigned ok = 0, failed = 0;
    for (unsigned i = 0; i < n; i++) {
        size_t at;
        do
            at = (size_t)(next_rand() % full);
        while (at < 2 || (at >= 8 && at < 48));
        int val = (int)(next_rand() & 0xff);
        atomic_store(&for_request.flip_val, val);
        atomic_store(&for_request.flip, (long)at + 1);
        tern_status_t st =
            call_changed(B_SMALL, "small", BLOB, sizeof(BLOB), 10 * SEC, err, sizeof(err));
        CHECK(st != TERN_ERR_TIMEOUT, "byte %zu set to %#x: no answer", at, val);
        if (st == TERN_OK)
            ok++;
        else
            failed++;
    }
    printf("random changes: %u calls, %u answered with a result, %u with an error\n", n, ok,
           failed);
    control("the random changes");
}

/* The length of the request small sends, and of its reply. */
static void measure(size_t *req, size_t *rep)
{
    size_t t = TENSOR_HDR + pad8(TERN_TENSOR_WIRE_DESC_SIZE(1)) + pad8(SMALL * sizeof(float));
    *req = HDR + pad8(strlen("small")) + 2 * t + sizeof(BLOB);
    *rep = HDR + t + sizeof(BLOB);
}

/* A profiled call whose handler records more events than its reply has
 * room for: the reply carries as many as fit, at its end, where they are
 * read from, and the call succeeds. */
static void events_overflow(void)
{
    OK(tern_prof_start(ctx, NULL));
    tern_future_t *f = NULL;
    tern_status_t st = tern_rpc_sync(ctx, "victim", "many_ranges", NULL, 30 * SEC, &f);
    CHECK(st == TERN_OK, "many_ranges: %s", tern_status_name(st));
    tern_future_free(f);
    OK(tern_prof_stop());
    const tern_prof_event_t *ev;
    size_t n, remote = 0;
    OK(tern_prof_events(&ev, &n));
    for (size_t i = 0; i < n; i++)
        if (ev[i].node == 1 && strstr(ev[i].name, "#remote_op: ") != NULL) {
            const char *r = strstr(ev[i].name, "#remote_op: ") + strlen("#remote_op: ");
            CHECK(strlen(r) == 300 && strspn(r, "0123456789") == 300, "remote event %zu: '%.40s'",
                  i, r);
            remote++;
        }
    printf("a reply with %zu of %d events\n", remote, RANGES);
    CHECK(remote > RANGES / 2 && remote < RANGES, "%zu remote events of %d", remote, RANGES);
}

static size_t victim_owns(void)
{
    tern_future_t *f = NULL;
    OK(tern_rpc_sync(ctx, "victim", "owned", NULL, 10 * SEC, &f));
    const tern_rpc_value_t *v = tern_future_value(f);
    char n[24] = {0};
    memcpy(n, v->blob, v->blob_len < sizeof(n) - 1 ? v->blob_len : sizeof(n) - 1);
    tern_future_free(f);
    return (size_t)strtoull(n, NULL, 10);
}

/* Poll until *count() of what this or the victim owns is want. */
static void poll_count(size_t (*count)(void), size_t want, const char *what)
{
    size_t n = 0;
    for (int i = 0; i < 1000 && (n = count()) != want; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(n == want, "%s: %zu owned, want %zu", what, n, want);
}

static size_t here_owns(void)
{
    return tern_rpc_owned_count(ctx);
}

/*
 * A call whose first RRef argument names rank 7 (of 2): the victim refuses
 * it, and settles the RRefs it could read. Argument 0 (a fork this rank
 * registered for the victim) cannot be settled: its value stays here until
 * shutdown. Argument 1, the victim's own value passed back to it, is a child
 * this rank waits on: the victim accepts it, this rank's DELETE follows and
 * the value goes (else graceful shutdown would wait for ever). Argument 2 is
 * settled with a DELETE back here.
 */
static void bad_rref_record(void)
{
    tern_rpc_args_t av = args_of(B_SMALL, BLOB, sizeof(BLOB));
    tern_rref_t *rr, *la, *lb;
    tern_future_t *f = NULL;
    size_t mine0 = here_owns(), theirs0 = victim_owns();
    OK(tern_remote(ctx, "victim", "small", &av, 10 * SEC, &rr));
    OK(tern_rref_to_here(rr, 10 * SEC, &f));
    tern_future_free(f);
    CHECK(victim_owns() == theirs0 + 1, "the victim owns the value");
    OK(tern_rref_local(ctx, &av, &la));
    OK(tern_rref_local(ctx, &av, &lb));
    tern_rref_t *const rs[3] = {la, rr, lb};
    tern_rpc_args_t a = av;
    a.rrefs = rs;
    a.nrrefs = 3;
    atomic_store(&for_request.rref0_owner, 7);
    tern_status_t st = tern_rpc_sync(ctx, "victim", "small", &a, 10 * SEC, &f);
    CHECK(st == TERN_ERR_PROTOCOL && strstr(tern_last_error(), "RRef argument names rank 7"),
          "RRef 0 names rank 7: %s (%s)", tern_status_name(st), tern_last_error());
    tern_rref_release(rr);
    tern_rref_release(la);
    tern_rref_release(lb);
    poll_count(victim_owns, theirs0, "RRef 1 settled: the victim's value is freed");
    poll_count(here_owns, mine0 + 1, "RRef 2 settled, RRef 0 kept");
    control("an RRef naming rank 7");
}

static int rank0(void)
{
    big_buf = calloc(BIG, sizeof(float));
    CHECK(big_buf != NULL, "calloc");
    for (int i = 0; i < BIG; i++)
        big_buf[i] = (float)i;
    int64_t ns = SMALL, nb = BIG;
    OK(tern_tensor_init(&small_ts[0], sa, TERN_DTYPE_F32, 1, &ns, tern_device_cpu()));
    OK(tern_tensor_init(&small_ts[1], sb, TERN_DTYPE_F32, 1, &ns, tern_device_cpu()));
    OK(tern_tensor_init(&big_t, big_buf, TERN_DTYPE_F32, 1, &nb, tern_device_cpu()));
    control("nothing");
    for (int k = 1; k <= (int)NCASES; k++)
        run_case(k);
    printf("%zu cases\n", NCASES);
    size_t req, rep;
    measure(&req, &rep);
    unsigned cuts = sweep_cuts(W_REQUEST, req);
    cuts += sweep_cuts(W_REPLY, rep);
    printf("%u cuts\n", cuts);
    sweep_random(2000, req);
    events_overflow();
    bad_rref_record();
    free(big_buf);
    return 0;
}

int main(void)
{
    OK(tern_rpc_register("small", fn_small));
    OK(tern_rpc_register("big", fn_big));
    OK(tern_rpc_register("mangle", fn_mangle));
    OK(tern_rpc_register("cut_reply", fn_cut_reply));
    OK(tern_rpc_register("many_ranges", fn_many_ranges));
    OK(tern_rpc_register("owned", fn_owned));
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return 1;
    }
    rank = (int)tern_ctx_rank(ctx);
    CHECK(tern_ctx_world_size(ctx) == 2, "run on 2 ranks");
    OK(tern_rpc_init(ctx, rank == 0 ? "caller" : "victim", NULL));
    tern__rpc_set_send_hook(hook, NULL);
    int rc = rank == 0 ? rank0() : 0;
    /* Waits for every result held for rank 0 to be released, and for every
     * message, changed or not, to be counted at both ends. */
    OK(tern_rpc_shutdown(ctx, 1));
    tern__rpc_set_send_hook(NULL, NULL);
    tern_finalize(ctx);
    printf("rank %d: %lu checks passed\n", rank, atomic_load(&checks));
    return rc;
}
