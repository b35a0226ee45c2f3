/*
 * The transport conformance suite: one set of checks, run against every
 * provider that is built (the provider's name is argv[1]). Two transports in
 * one process, connected to each other, both progressed by the test thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tern/build_config.h>
#include <tern/clock.h>
#include <tern/imm.h>
#include <tern/transport.h>

#include "core/bytes.h"

#define SEC 1000000000ull
#define MAX_EVENTS 4096

static const char *provider = "tcp";

typedef struct side {
    tern_transport_t *tp;
    tern_ep_t *ep; /* to the other side */
    tern_transport_attr_t attr;
    /* what arrived */
    unsigned nrecv, nput_imm, nerror;
    uint32_t recv_imm[MAX_EVENTS];
    size_t recv_len[MAX_EVENTS];
    uint32_t recv_src[MAX_EVENTS];
    int recv_ok[MAX_EVENTS];      /* payload matched the pattern for its imm */
    uint32_t put_imm[MAX_EVENTS];
    size_t put_len[MAX_EVENTS];
    int put_seen_data[MAX_EVENTS]; /* the data was in place when the event fired */
    tern_status_t err_status[MAX_EVENTS];
    uint32_t err_src[MAX_EVENTS];
    uint32_t err_imm[MAX_EVENTS];
    /* for checking put-with-imm data at event time */
    const uint8_t *watch;
    size_t watch_len;
    uint8_t watch_seed;
    /* called after each event is recorded, for tests that act inside a callback */
    void (*hook)(struct side *s, const tern_event_t *ev);
} side_t;

typedef struct pair {
    side_t a, b;
} pair_t;

static uint8_t pattern(uint8_t seed, size_t i)
{
    return (uint8_t)(seed + i * 31 + (i >> 8) * 7);
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pattern(seed, i);
}

static int check(const uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != pattern(seed, i))
            return 0;
    return 1;
}

static void on_event(const tern_event_t *ev, void *arg)
{
    side_t *s = arg;
    switch (ev->type) {
    case TERN_EVENT_RECV:
        if (s->nrecv < MAX_EVENTS) {
            s->recv_imm[s->nrecv] = ev->imm;
            s->recv_len[s->nrecv] = ev->len;
            s->recv_src[s->nrecv] = ev->src;
            /* The payload of a message with slot k is pattern(k) over len bytes. */
            s->recv_ok[s->nrecv] = ev->len == 0 || (ev->data != NULL &&
                                   check(ev->data, ev->len, (uint8_t)tern_imm_slot(ev->imm)));
        }
        s->nrecv++;
        break;
    case TERN_EVENT_PUT_IMM:
        if (s->nput_imm < MAX_EVENTS) {
            s->put_imm[s->nput_imm] = ev->imm;
            s->put_len[s->nput_imm] = ev->len;
            s->put_seen_data[s->nput_imm] =
                s->watch == NULL || check(s->watch, s->watch_len, s->watch_seed);
        }
        s->nput_imm++;
        break;
    case TERN_EVENT_ERROR:
        if (s->nerror < MAX_EVENTS) {
            s->err_status[s->nerror] = ev->status;
            s->err_src[s->nerror] = ev->src;
            s->err_imm[s->nerror] = ev->imm;
        }
        s->nerror++;
        break;
    }
    if (s->hook != NULL)
        s->hook(s, ev);
}

static void progress_both(pair_t *p)
{
    if (p->a.tp)
        tern_transport_progress(p->a.tp);
    if (p->b.tp)
        tern_transport_progress(p->b.tp);
}

/* Progress until *flag becomes nonzero or timeout; fail on timeout. */
#define PUMP_UNTIL(p, cond, what)                                              \
    do {                                                                       \
        uint64_t deadline_ = tern_clock_ns() + 60 * SEC;                       \
        while (!(cond)) {                                                      \
            if (tern_clock_ns() > deadline_)                                   \
                fail_msg("timed out waiting for %s", what);                    \
            progress_both(p);                                                  \
        }                                                                      \
    } while (0)

static void open_side(side_t *s, uint32_t id)
{
    tern_transport_params_t params = {
        .field_mask = TERN_TRANSPORT_PARAM_PROVIDER | TERN_TRANSPORT_PARAM_SELF_ID |
                      TERN_TRANSPORT_PARAM_EVENT,
        .provider = provider,
        .self_id = id,
        .on_event = on_event,
        .event_arg = s,
    };
    memset(s, 0, sizeof(*s));
    if (tern_transport_open(&params, &s->tp) != TERN_OK)
        fail_msg("open %s: %s", provider, tern_last_error());
    tern_transport_query(s->tp, &s->attr);
    assert_string_equal(s->attr.provider, provider);
    assert_true(s->attr.max_send >= 4096);
}

static void connect_pair(pair_t *p)
{
    uint8_t addr[TERN_ADDR_MAX];
    size_t len = sizeof(addr);
    assert_int_equal(tern_transport_address(p->b.tp, addr, &len), TERN_OK);
    assert_int_equal(tern_ep_create(p->a.tp, 1, addr, len, &p->a.ep), TERN_OK);
    len = sizeof(addr);
    assert_int_equal(tern_transport_address(p->a.tp, addr, &len), TERN_OK);
    assert_int_equal(tern_ep_create(p->b.tp, 0, addr, len, &p->b.ep), TERN_OK);
    assert_int_equal(tern_ep_peer(p->a.ep), 1);
}

static int setup(void **state)
{
    pair_t *p = calloc(1, sizeof(*p));
    open_side(&p->a, 0);
    open_side(&p->b, 1);
    connect_pair(p);
    *state = p;
    return 0;
}

static int teardown(void **state)
{
    pair_t *p = *state;
    tern_transport_close(p->a.tp);
    tern_transport_close(p->b.tp);
    free(p);
    return 0;
}

/* Completion counting for INPROGRESS operations. */
typedef struct counter {
    unsigned done;
    unsigned failed;
    tern_status_t last;
    int in_post;         /* set by a test around its post calls */
    unsigned in_a_post;  /* callbacks that ran inside one: the header forbids it */
    tern_ep_t **destroy; /* destroy *destroy from the callback */
} counter_t;

static void count_cb(void *arg, tern_status_t st)
{
    counter_t *c = arg;
    c->done++;
    c->last = st;
    if (st != TERN_OK)
        c->failed++;
    if (c->in_post)
        c->in_a_post++;
    if (c->destroy != NULL && *c->destroy != NULL) {
        tern_ep_destroy(*c->destroy);
        *c->destroy = NULL;
    }
}

/* Post and account: returns 1 if the op is still in flight. */
static int posted(tern_status_t st, counter_t *c)
{
    if (st == TERN_OK) {
        c->done++;
        return 0;
    }
    if (st != TERN_INPROGRESS)
        fail_msg("post failed: %s: %s", tern_strerror(st), tern_last_error());
    return 1;
}

static tern_op_params_t cb_params(counter_t *c)
{
    tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB, .cb = count_cb, .cb_arg = c};
    return op;
}

/* ---- send ---- */

static void send_one(pair_t *p, side_t *from, uint32_t slot, size_t len)
{
    uint8_t *buf = malloc(len ? len : 1);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    fill(buf, len, (uint8_t)slot);
    posted(tern_ep_send(from->ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, slot), buf, len, &op), &c);
    PUMP_UNTIL(p, c.done == 1, "a send to complete");
    assert_int_equal(c.failed, 0);
    free(buf);
}

static void test_send_sizes_and_immediates(void **state)
{
    pair_t *p = *state;
    size_t max = p->a.attr.max_send;
    /* Around the providers' small-message paths too (ucx: its fast lane
     * takes up to 192 bytes, a payload up to 224 travels inside the AM with
     * the header, an entry holds up to 256 inline). */
    const size_t sizes[] = {0,   1,   7,   55,  56,   57,   191,   192,   193,     223,  224,
                            225, 255, 256, 257, 4095, 4096, 65535, 65536, 65537, max - 1, max};
    size_t n = sizeof(sizes) / sizeof(sizes[0]);
    for (size_t i = 0; i < n; i++)
        send_one(p, &p->a, (uint32_t)i + 1, sizes[i]);
    PUMP_UNTIL(p, p->b.nrecv == n, "every send to arrive");
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(p->b.recv_len[i], sizes[i]);
        assert_int_equal(p->b.recv_src[i], 0);
        assert_int_equal(tern_imm_class(p->b.recv_imm[i]), TERN_IMM_P2P_EAGER);
        assert_int_equal(tern_imm_slot(p->b.recv_imm[i]), i + 1);
        if (!p->b.recv_ok[i])
            fail_msg("payload %zu (%zu bytes) corrupted", i, sizes[i]);
    }
    /* Every bit of the immediate survives. */
    const uint32_t imms[] = {0xffffffffu, 0x80000001u, tern_imm_make(TERN_IMM_RPC_REQUEST, 1, 5, 0x123456)};
    for (size_t i = 0; i < 3; i++) {
        counter_t c = {0};
        tern_op_params_t op = cb_params(&c);
        posted(tern_ep_send(p->b.ep, imms[i], NULL, 0, &op), &c);
        PUMP_UNTIL(p, c.done == 1 && p->a.nrecv == i + 1, "an immediate");
        assert_int_equal(p->a.recv_imm[i], imms[i]);
        assert_int_equal(p->a.recv_src[i], 1);
    }
    /* Over the eager limit is refused before anything is sent. */
    assert_int_equal(tern_ep_send(p->a.ep, 1, "x", max + 1, NULL), TERN_ERR_INVALID_PARAM);
}

static void test_send_ordering_many_outstanding(void **state)
{
    pair_t *p = *state;
    enum { N = 2000 };
    static uint8_t bufs[N][200];
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    unsigned in_flight = 0;
    for (unsigned i = 0; i < N; i++) {
        size_t len = (i * 37) % 200;
        fill(bufs[i], len, (uint8_t)(i % 4096));
        in_flight += posted(tern_ep_send(p->a.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, i % 4096),
                                         bufs[i], len, &op),
                            &c);
    }
    (void)in_flight;
    PUMP_UNTIL(p, c.done == N && p->b.nrecv == N, "2000 sends");
    assert_int_equal(c.failed, 0);
    for (unsigned i = 0; i < N && i < MAX_EVENTS; i++) {
        if (tern_imm_slot(p->b.recv_imm[i]) != i % 4096 || p->b.recv_len[i] != (i * 37) % 200)
            fail_msg("message %u arrived out of order", i);
        assert_true(p->b.recv_ok[i]);
    }
}

/* A send of up to attr.max_inline bytes is copied as it is posted: one buffer,
 * rewritten for the next message right after each post, with nothing
 * progressed in between, so that many sends are still queued when their
 * buffer changes. */
static void test_send_inline(void **state)
{
    pair_t *p = *state;
    enum { N = 3000 };
    const size_t len = p->a.attr.max_inline;
    assert_true(len >= 64 && len <= p->a.attr.max_send);
    uint8_t *buf = malloc(len);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    unsigned in_flight = 0;
    for (unsigned i = 0; i < N; i++) {
        fill(buf, len, (uint8_t)(i % 251));
        in_flight += posted(tern_ep_send(p->a.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, i % 251),
                                         buf, len, &op),
                            &c);
        memset(buf, 0xee, len);
    }
    PUMP_UNTIL(p, c.done == N && p->b.nrecv == N, "3000 inline sends");
    assert_int_equal(c.failed, 0);
    for (unsigned i = 0; i < N && i < MAX_EVENTS; i++) {
        assert_int_equal(p->b.recv_len[i], len);
        if (tern_imm_slot(p->b.recv_imm[i]) != i % 251 || !p->b.recv_ok[i])
            fail_msg("inline send %u arrived changed (%u of %u were still queued when posted)", i,
                     in_flight, N);
    }
    free(buf);
}

/* tern_ep_send_inline: the payload after attr.inline_prefix bytes of room
 * arrives alone (the prefix's garbage never does), in order with the
 * endpoint's ordinary sends, from a buffer rewritten right after each post
 * with nothing progressed in between: many are refused by UCX's full queue
 * and go the ordinary way, behind which the later ones must queue too. */
static void test_send_inline_prefix(void **state)
{
    pair_t *p = *state;
    enum { N = 3000 };
    const size_t pre = p->a.attr.inline_prefix, max = p->a.attr.max_inline;
    assert_true(pre <= TERN_INLINE_PREFIX_MAX);
    uint8_t *buf = malloc(pre + max);
    const size_t sizes[] = {0, 1, 8, 57, max - 1, max};
    const size_t nsizes = sizeof(sizes) / sizeof(sizes[0]);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    unsigned ordinary = 0;
    for (unsigned i = 0; i < N; i++) {
        size_t len = sizes[i % nsizes];
        uint32_t imm = tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, i % 251);
        if (i % 7 == 3) { /* an ordinary send between the inline ones */
            static uint8_t obuf[N][64];
            len = i % 64;
            fill(obuf[i], len, (uint8_t)(i % 251));
            posted(tern_ep_send(p->a.ep, imm, obuf[i], len, &op), &c);
            ordinary++;
            continue;
        }
        memset(buf, 0xa5, pre);
        fill(buf + pre, len, (uint8_t)(i % 251));
        assert_int_equal(tern_ep_send_inline(p->a.ep, imm, buf, len), TERN_OK);
        memset(buf, 0xee, pre + max);
    }
    PUMP_UNTIL(p, c.done == ordinary && p->b.nrecv == N, "3000 inline and ordinary sends");
    assert_int_equal(c.failed, 0);
    for (unsigned i = 0; i < N && i < MAX_EVENTS; i++) {
        size_t want = i % 7 == 3 ? i % 64 : sizes[i % nsizes];
        if (tern_imm_slot(p->b.recv_imm[i]) != i % 251 || p->b.recv_len[i] != want ||
            !p->b.recv_ok[i])
            fail_msg("send %u (%zu bytes, %s) arrived out of order or changed", i, want,
                     i % 7 == 3 ? "ordinary" : "inline");
    }
    /* Refused before anything is sent: over the limit, no buffer, no endpoint. */
    assert_int_equal(tern_ep_send_inline(p->a.ep, 1, buf, max + 1), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_ep_send_inline(p->a.ep, 1, NULL, 0), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_ep_send_inline(NULL, 1, buf, 0), TERN_ERR_INVALID_PARAM);
    /* The endpoint is still in order afterwards. */
    memset(buf, 0, pre);
    fill(buf + pre, 5, 9);
    assert_int_equal(tern_ep_send_inline(p->a.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, 9), buf, 5),
                     TERN_OK);
    PUMP_UNTIL(p, p->b.nrecv == N + 1, "one more inline send");
    assert_int_equal(p->b.recv_len[N], 5);
    assert_true(p->b.recv_ok[N]);
    free(buf);
}

/* Both directions at once, so neither side's progress starves the other. */
static void test_send_both_directions(void **state)
{
    pair_t *p = *state;
    enum { N = 500, LEN = 100000 };
    uint8_t *ba = malloc(LEN), *bb = malloc(LEN);
    counter_t ca = {0}, cb = {0};
    tern_op_params_t opa = cb_params(&ca), opb = cb_params(&cb);
    fill(ba, LEN, 9);
    fill(bb, LEN, 9);
    for (unsigned i = 0; i < N; i++) {
        posted(tern_ep_send(p->a.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, 9), ba, LEN, &opa), &ca);
        posted(tern_ep_send(p->b.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, 9), bb, LEN, &opb), &cb);
        progress_both(p);
    }
    PUMP_UNTIL(p, ca.done == N && cb.done == N && p->a.nrecv == N && p->b.nrecv == N,
               "sends both ways");
    for (unsigned i = 0; i < N; i++)
        assert_true(p->a.recv_ok[i] && p->b.recv_ok[i]);
    free(ba);
    free(bb);
}

/* ---- put / get ---- */

typedef struct region {
    uint8_t *mem;
    size_t len;
    tern_mr_t *mr;
    tern_rkey_t *rkey; /* unpacked on the other side's ep */
} region_t;

/* Register mem[0..len) at its owner and hand its key to the other side. */
static void region_at(pair_t *p, region_t *r, uint8_t *mem, size_t len, unsigned access,
                      int owner_is_b)
{
    side_t *owner = owner_is_b ? &p->b : &p->a, *user = owner_is_b ? &p->a : &p->b;
    uint8_t key[TERN_RKEY_MAX];
    size_t klen = sizeof(key);
    tern_mr_params_t mp = {.field_mask = TERN_MR_PARAM_ACCESS | TERN_MR_PARAM_NO_CACHE,
                           .access = access};
    r->len = len;
    r->mem = mem;
    assert_int_equal(tern_mr_reg(owner->tp, r->mem, len, &mp, &r->mr), TERN_OK);
    assert_int_equal(tern_mr_pack(r->mr, key, &klen), TERN_OK);
    assert_true(klen <= TERN_RKEY_MAX);
    assert_int_equal(tern_rkey_unpack(user->ep, key, klen, &r->rkey), TERN_OK);
    assert_int_equal(tern_rkey_addr(r->rkey), (uintptr_t)r->mem);
    assert_int_equal(tern_rkey_len(r->rkey), len);
}

static void region_make(pair_t *p, region_t *r, size_t len, unsigned access, int owner_is_b)
{
    uint8_t *mem = malloc(len ? len : 1);
    assert_non_null(mem);
    region_at(p, r, mem, len, access, owner_is_b);
}

static void region_free(region_t *r)
{
    tern_rkey_release(r->rkey);
    tern_mr_dereg(r->mr);
    free(r->mem);
}

/* The outcome of a posted operation counted by c: at once, or after pumping
 * until its callback ran. */
static tern_status_t finish(pair_t *p, tern_status_t st, counter_t *c, const char *what)
{
    if (st != TERN_INPROGRESS)
        return st;
    PUMP_UNTIL(p, c->done == 1, what);
    return c->last;
}

static tern_status_t put_wait(pair_t *p, side_t *from, region_t *local, size_t loff, region_t *remote,
                              size_t roff, size_t len, int with_imm, uint32_t imm)
{
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR;
    op.mr = local->mr;
    if (with_imm) {
        op.field_mask |= TERN_OP_PARAM_IMM;
        op.imm = imm;
    }
    return finish(p, tern_ep_put(from->ep, local->mem + loff, len,
                                 tern_rkey_addr(remote->rkey) + roff, remote->rkey, &op),
                  &c, "a put");
}

static tern_status_t get_wait(pair_t *p, side_t *from, region_t *local, size_t loff, region_t *remote,
                              size_t roff, size_t len)
{
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR;
    op.mr = local->mr;
    return finish(p, tern_ep_get(from->ep, local->mem + loff, len,
                                 tern_rkey_addr(remote->rkey) + roff, remote->rkey, &op),
                  &c, "a get");
}

#define RW (TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ | TERN_ACCESS_REMOTE_WRITE)

/* Both sides send before either has progressed (their endpoints were made at
 * once, so a provider may have to settle which connection to keep), and go on
 * sending while it does: every message arrives, in order, both ways. */
static size_t order_len(unsigned i, unsigned salt)
{
    return 1 + (i * 7919u + salt) % 60000u;
}

static void test_ordering_while_connecting(void **state)
{
    pair_t *p = *state;
    /* The first third (about 15 MB each way) is more than the sockets of a
     * stream provider hold, so some of it is still queued when the rest goes. */
    enum { N = 1500, SLOTS = 16, LEN = 60001 };
    static uint8_t bufs[SLOTS][LEN];
    counter_t ca = {0}, cb = {0};
    tern_op_params_t opa = cb_params(&ca), opb = cb_params(&cb);
    for (unsigned k = 0; k < SLOTS; k++)
        fill(bufs[k], LEN, (uint8_t)k);
    for (unsigned i = 0; i < N; i++) {
        uint32_t imm = tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, i % SLOTS);
        posted(tern_ep_send(p->a.ep, imm, bufs[i % SLOTS], order_len(i, 1), &opa), &ca);
        posted(tern_ep_send(p->b.ep, imm, bufs[i % SLOTS], order_len(i, 2), &opb), &cb);
        if (i >= N / 3)
            progress_both(p);
    }
    PUMP_UNTIL(p, ca.done == N && cb.done == N && p->a.nrecv == N && p->b.nrecv == N,
               "sends both ways");
    assert_int_equal(ca.failed + cb.failed, 0);
    for (unsigned i = 0; i < N; i++) {
        if (tern_imm_slot(p->b.recv_imm[i]) != i % SLOTS || p->b.recv_len[i] != order_len(i, 1) ||
            !p->b.recv_ok[i])
            fail_msg("a->b message %u out of order or corrupted", i);
        if (tern_imm_slot(p->a.recv_imm[i]) != i % SLOTS || p->a.recv_len[i] != order_len(i, 2) ||
            !p->a.recv_ok[i])
            fail_msg("b->a message %u out of order or corrupted", i);
    }
    assert_int_equal(p->a.nerror + p->b.nerror, 0);
}

/* Only one side has an endpoint at first; the other makes its own after
 * traffic has flowed (a provider may reuse the first side's connection). Both
 * directions then work, in order, sends and RMA alike. */
static int setup_one_way(void **state)
{
    pair_t *p = calloc(1, sizeof(*p));
    uint8_t addr[TERN_ADDR_MAX];
    size_t len = sizeof(addr);
    open_side(&p->a, 0);
    open_side(&p->b, 1);
    assert_int_equal(tern_transport_address(p->b.tp, addr, &len), TERN_OK);
    assert_int_equal(tern_ep_create(p->a.tp, 1, addr, len, &p->a.ep), TERN_OK);
    *state = p;
    return 0;
}

static void test_endpoint_made_later(void **state)
{
    pair_t *p = *state;
    enum { N = 200 };
    uint8_t addr[TERN_ADDR_MAX], buf[64];
    size_t len = sizeof(addr);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    fill(buf, sizeof(buf), 3);
    for (unsigned i = 0; i < N; i++)
        posted(tern_ep_send(p->a.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, 3), buf, i % 64, &op), &c);
    PUMP_UNTIL(p, c.done == N && p->b.nrecv == N, "the first side's sends");
    assert_int_equal(tern_transport_address(p->a.tp, addr, &len), TERN_OK);
    assert_int_equal(tern_ep_create(p->b.tp, 0, addr, len, &p->b.ep), TERN_OK);
    /* Replies, interleaved with more from the first side. */
    c = (counter_t){0};
    for (unsigned i = 0; i < N; i++) {
        posted(tern_ep_send(p->b.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, 3), buf, i % 64, &op), &c);
        posted(tern_ep_send(p->a.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, 3), buf, 63 - i % 64, &op), &c);
        progress_both(p);
    }
    PUMP_UNTIL(p, c.done == 2 * N && p->a.nrecv == N && p->b.nrecv == 2 * N, "sends both ways");
    for (unsigned i = 0; i < N; i++) {
        assert_int_equal(p->a.recv_len[i], i % 64);
        assert_int_equal(p->b.recv_len[N + i], 63 - i % 64);
        assert_true(p->a.recv_ok[i] && p->b.recv_ok[N + i]);
    }
    /* RMA from the late side into the first, and back. */
    region_t local, remote;
    region_make(p, &remote, 4096, RW, 0);                      /* a's memory, b's key */
    uint8_t key[TERN_RKEY_MAX];
    size_t klen = sizeof(key);
    tern_mr_params_t mp = {.field_mask = TERN_MR_PARAM_ACCESS, .access = RW};
    local.len = 4096;
    local.mem = malloc(4096);
    local.rkey = NULL;
    assert_int_equal(tern_mr_reg(p->b.tp, local.mem, 4096, &mp, &local.mr), TERN_OK);
    assert_int_equal(tern_mr_pack(local.mr, key, &klen), TERN_OK);
    fill(local.mem, 4096, 11);
    assert_int_equal(put_wait(p, &p->b, &local, 0, &remote, 0, 4096, 0, 0), TERN_OK);
    assert_true(check(remote.mem, 4096, 11));
    fill(remote.mem, 4096, 12);
    assert_int_equal(get_wait(p, &p->b, &local, 0, &remote, 0, 4096), TERN_OK);
    assert_true(check(local.mem, 4096, 12));
    assert_int_equal(p->a.nerror + p->b.nerror, 0);
    region_free(&remote);
    region_free(&local);
}

static void test_put_get_every_size(void **state)
{
    pair_t *p = *state;
    const size_t big = (64u << 20) + 16;
    const size_t sizes[] = {0, 1, 2, 3, 7, 8, 9, 63, 64, 65, 4095, 4096, 4097, 65536, 65537,
                            (1u << 20) + 3, 16u << 20, 64u << 20};
    region_t local, remote;
    region_make(p, &local, big, RW, 0);
    region_make(p, &remote, big, RW, 1);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t len = sizes[i];
        /* Unaligned on both sides for all but the largest. */
        size_t loff = len < (64u << 20) ? 3 : 0, roff = len < (64u << 20) ? 5 : 0;
        uint8_t seed = (uint8_t)(i * 13 + 1);
        fill(local.mem + loff, len, seed);
        memset(remote.mem, 0xee, roff + len + 8);
        assert_int_equal(put_wait(p, &p->a, &local, loff, &remote, roff, len, 0, 0), TERN_OK);
        if (!check(remote.mem + roff, len, seed))
            fail_msg("put of %zu bytes landed wrong", len);
        /* Nothing outside the range was touched. */
        assert_int_equal(remote.mem[roff - (roff ? 1 : 0)], roff ? 0xee : remote.mem[0]);
        assert_int_equal(remote.mem[roff + len], 0xee);
        /* Read it back into a clean buffer. */
        memset(local.mem, 0, loff + len + 8);
        assert_int_equal(get_wait(p, &p->a, &local, loff, &remote, roff, len), TERN_OK);
        if (!check(local.mem + loff, len, seed))
            fail_msg("get of %zu bytes read wrong", len);
        assert_int_equal(local.mem[loff + len], 0);
    }
    region_free(&local);
    region_free(&remote);
}

static void test_put_with_immediate(void **state)
{
    pair_t *p = *state;
    region_t local, remote;
    const size_t len = 3u << 20;
    region_make(p, &local, len, RW, 0);
    region_make(p, &remote, len, RW, 1);
    fill(local.mem, len, 77);
    memset(remote.mem, 0, len);
    p->b.watch = remote.mem;
    p->b.watch_len = len;
    p->b.watch_seed = 77;
    uint32_t imm = tern_imm_make(TERN_IMM_P2P_RNDV, 0, 0, 4242);
    assert_int_equal(put_wait(p, &p->a, &local, 0, &remote, 0, len, 1, imm), TERN_OK);
    PUMP_UNTIL(p, p->b.nput_imm == 1, "the put's immediate");
    assert_int_equal(p->b.put_imm[0], imm);
    assert_int_equal(p->b.put_len[0], len);
    assert_true(p->b.put_seen_data[0]); /* the data was there when the event fired */
    p->b.watch = NULL;
    /* A put without immediate raises nothing at the target. */
    assert_int_equal(put_wait(p, &p->a, &local, 0, &remote, 0, 100, 0, 0), TERN_OK);
    send_one(p, &p->a, 1, 0); /* a later send proves the target has handled the put */
    PUMP_UNTIL(p, p->b.nrecv == 1, "a marker send");
    assert_int_equal(p->b.nput_imm, 1);
    region_free(&local);
    region_free(&remote);
}

static void test_many_outstanding_rma(void **state)
{
    pair_t *p = *state;
    enum { N = 1000, LEN = 1000 };
    region_t local, remote, back;
    region_make(p, &local, N * LEN, RW, 0);
    region_make(p, &remote, N * LEN, RW, 1);
    region_make(p, &back, N * LEN, RW, 0);
    fill(local.mem, N * LEN, 3);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR;
    op.mr = local.mr;
    for (unsigned i = 0; i < N; i++)
        posted(tern_ep_put(p->a.ep, local.mem + i * LEN, LEN, tern_rkey_addr(remote.rkey) + i * LEN,
                           remote.rkey, &op),
               &c);
    PUMP_UNTIL(p, c.done == N, "1000 puts");
    assert_int_equal(c.failed, 0);
    assert_true(check(remote.mem, N * LEN, 3));
    counter_t g = {0};
    tern_op_params_t gop = cb_params(&g);
    gop.field_mask |= TERN_OP_PARAM_MR;
    gop.mr = back.mr;
    for (unsigned i = 0; i < N; i++)
        posted(tern_ep_get(p->a.ep, back.mem + i * LEN, LEN, tern_rkey_addr(remote.rkey) + i * LEN,
                           remote.rkey, &gop),
               &g);
    PUMP_UNTIL(p, g.done == N, "1000 gets");
    assert_int_equal(g.failed, 0);
    assert_true(check(back.mem, N * LEN, 3));
    region_free(&local);
    region_free(&remote);
    region_free(&back);
}

/* Puts, gets and sends of mixed sizes posted back to back both ways, with
 * nothing progressed in between, so that each side's queue holds frames of
 * every kind and size at once: small and large, copied and (over tcp, above
 * its splice threshold) spliced, requests and get replies. Wherever a
 * provider cuts its writes (over tcp a segment at a time, a frame's short
 * tail taken along with its last), each frame must arrive whole and in
 * order. */
static void test_mixed_queued_stream(void **state)
{
    pair_t *p = *state;
    enum { N = 120, NSEND = 2 * N };
    static const size_t lens[] = {1, 999, 70001, 13, 300000, 4096, 65543, 257, 131072, 77};
    size_t off[N + 1];
    off[0] = 0;
    for (unsigned i = 0; i < N; i++)
        off[i + 1] = off[i] + lens[i % (sizeof(lens) / sizeof(lens[0]))];
    region_t local, remote, back, src;
    region_make(p, &local, off[N], RW, 0);
    region_make(p, &remote, off[N], RW, 1);
    region_make(p, &back, off[N], RW, 0);
    region_make(p, &src, off[N], RW | TERN_ACCESS_REMOTE_READ_HELD, 1);
    fill(local.mem, off[N], 7);
    fill(src.mem, off[N], 8);
    static uint8_t sbuf[2][NSEND][3000];
    counter_t c = {0};
    tern_op_params_t put_op = cb_params(&c), get_op = cb_params(&c), send_op = cb_params(&c);
    put_op.field_mask |= TERN_OP_PARAM_MR;
    put_op.mr = local.mr;
    get_op.field_mask |= TERN_OP_PARAM_MR;
    get_op.mr = back.mr;
    unsigned posts = 0, sends = 0;
    for (unsigned i = 0; i < N; i++) {
        const size_t len = off[i + 1] - off[i];
        posted(tern_ep_put(p->a.ep, local.mem + off[i], len, tern_rkey_addr(remote.rkey) + off[i],
                           remote.rkey, &put_op),
               &c);
        posted(tern_ep_get(p->a.ep, back.mem + off[i], len, tern_rkey_addr(src.rkey) + off[i],
                           src.rkey, &get_op),
               &c);
        posts += 2;
        /* sends both ways in between: a queued one waits behind the rest */
        for (unsigned k = 0; k < 2 && sends < NSEND; k++, sends++) {
            const size_t slen = (sends * 373) % 3000;
            side_t *from = sends % 2 ? &p->b : &p->a;
            uint8_t *buf = sbuf[sends % 2][sends];
            fill(buf, slen, (uint8_t)sends);
            posted(tern_ep_send(from->ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, sends), buf,
                                slen, &send_op),
                   &c);
            posts++;
        }
    }
    PUMP_UNTIL(p, c.done == posts && p->a.nrecv + p->b.nrecv == sends, "a mixed stream");
    assert_int_equal(c.failed, 0);
    assert_true(check(remote.mem, off[N], 7));
    assert_true(check(back.mem, off[N], 8));
    /* each side's sends arrive in the order posted, whole */
    side_t *to[2] = {&p->b, &p->a}; /* b receives a's (even) sends, a b's (odd) */
    for (int s = 0; s < 2; s++) {
        for (unsigned j = 0; j < to[s]->nrecv; j++) {
            const unsigned want = s == 0 ? 2 * j : 2 * j + 1;
            if (tern_imm_slot(to[s]->recv_imm[j]) != want ||
                to[s]->recv_len[j] != (want * 373) % 3000 || !to[s]->recv_ok[j])
                fail_msg("send %u arrived as slot %u, %zu bytes", want,
                         tern_imm_slot(to[s]->recv_imm[j]), to[s]->recv_len[j]);
        }
    }
    assert_int_equal(sends, NSEND);
    region_free(&local);
    region_free(&remote);
    region_free(&back);
    region_free(&src);
}

/* After a refusal the endpoint still carries traffic both ways. */
static void expect_usable(pair_t *p)
{
    unsigned before = p->b.nrecv;
    send_one(p, &p->a, 2, 10);
    PUMP_UNTIL(p, p->b.nrecv == before + 1, "a send after a refusal");
}

static void expect_refused(pair_t *p, tern_status_t st, unsigned errors_before, const char *what)
{
    if (st != TERN_ERR_ACCESS)
        fail_msg("%s: got %s, expected TERN_ERR_ACCESS", what, tern_status_name(st));
    PUMP_UNTIL(p, p->b.nerror > errors_before, "the target's error event");
    assert_int_equal(p->b.err_status[errors_before], TERN_ERR_ACCESS);
    assert_int_equal(p->b.err_src[errors_before], 0);
    expect_usable(p);
}

static void test_bad_keys_rejected(void **state)
{
    pair_t *p = *state;
    region_t local, remote, ro, wo;
    region_make(p, &local, 4096, RW, 0);
    region_make(p, &remote, 4096, RW, 1);
    region_make(p, &ro, 4096, TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ, 1);
    region_make(p, &wo, 4096, TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_WRITE, 1);
    memset(remote.mem, 0x5a, 4096);
    memset(ro.mem, 0x5a, 4096);

    /* Out of bounds: past the end, straddling the end, before the start. */
    expect_refused(p, put_wait(p, &p->a, &local, 0, &remote, 4000, 200, 1, 77), p->b.nerror,
                   "put past the end");
    assert_int_equal(p->b.err_status[p->b.nerror - 1], TERN_ERR_ACCESS);
    expect_refused(p, get_wait(p, &p->a, &local, 0, &remote, 4096, 1), p->b.nerror, "get past the end");
    {
        counter_t c = {0};
        tern_op_params_t op = cb_params(&c);
        op.field_mask |= TERN_OP_PARAM_MR;
        op.mr = local.mr;
        unsigned e = p->b.nerror;
        tern_status_t st = finish(p, tern_ep_put(p->a.ep, local.mem, 16,
                                                 tern_rkey_addr(remote.rkey) - 16, remote.rkey, &op),
                                  &c, "a put before the start");
        expect_refused(p, st, e, "put before the start");
    }
    /* Nothing landed anywhere. */
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(remote.mem[i], 0x5a);

    /* Wrong access: put into read-only, get from write-only. */
    expect_refused(p, put_wait(p, &p->a, &local, 0, &ro, 0, 100, 0, 0), p->b.nerror,
                   "put into a read-only region");
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(ro.mem[i], 0x5a);
    expect_refused(p, get_wait(p, &p->a, &local, 0, &wo, 0, 100), p->b.nerror,
                   "get from a write-only region");
    /* The allowed directions still work. */
    assert_int_equal(get_wait(p, &p->a, &local, 0, &ro, 0, 100), TERN_OK);
    assert_int_equal(put_wait(p, &p->a, &local, 0, &wo, 0, 100, 0, 0), TERN_OK);

    /* A region registered for local use only: its key unpacks (ucx maps
     * nothing for it, so the key carries no UCX part) but grants nothing,
     * and it serves as the local side of a get and of a put. */
    region_t lo, lo_local;
    region_make(p, &lo, 4096, TERN_ACCESS_LOCAL, 1);
    region_make(p, &lo_local, 4096, TERN_ACCESS_LOCAL, 0);
    memset(lo.mem, 0x5a, 4096);
    expect_refused(p, put_wait(p, &p->a, &local, 0, &lo, 0, 100, 0, 0), p->b.nerror,
                   "put into a local-only region");
    expect_refused(p, get_wait(p, &p->a, &local, 0, &lo, 0, 100), p->b.nerror,
                   "get from a local-only region");
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(lo.mem[i], 0x5a);
    memset(lo_local.mem, 0, 4096);
    assert_int_equal(get_wait(p, &p->a, &lo_local, 0, &ro, 0, 4096), TERN_OK);
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(lo_local.mem[i], 0x5a);
    memset(lo_local.mem, 0x3c, 4096);
    assert_int_equal(put_wait(p, &p->a, &lo_local, 0, &wo, 0, 4096, 0, 0), TERN_OK);
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(wo.mem[i], 0x3c);
    region_free(&lo);
    region_free(&lo_local);

    /* Malformed keys are refused at unpack. */
    tern_rkey_t *rk = NULL;
    uint8_t junk[64];
    memset(junk, 0xab, sizeof(junk));
    assert_int_equal(tern_rkey_unpack(p->a.ep, junk, sizeof(junk), &rk), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_rkey_unpack(p->a.ep, junk, 3, &rk), TERN_ERR_INVALID_PARAM);
    assert_null(rk);

    region_free(&local);
    region_free(&remote);
    region_free(&ro);
    region_free(&wo);
}

#ifdef TERN_HAVE_UCX
/* Tests only: whether host-memory gets and puts of len bytes on a ucx
 * endpoint are served by the target's tern (transport/ucx/ucx.c). */
int tern__ucx_serves_rma(tern_ep_t *ep, size_t len);
#endif

/* Whether the provider is ucx and serves a's gets and puts of len bytes
 * itself, which lets their target check them. */
static int ucx_served(pair_t *p, size_t len)
{
#ifdef TERN_HAVE_UCX
    return strcmp(provider, "ucx") == 0 && tern__ucx_serves_rma(p->a.ep, len);
#else
    (void)p;
    (void)len;
    return 0;
#endif
}

/* A key whose region was unregistered is refused (TERN_ERR_ACCESS at both ends). */
static void test_revoked_key(void **state)
{
    pair_t *p = *state;
    region_t local, remote;
    /* One-sided UCX RMA cannot be checked by its target; the puts and gets
     * that the ucx provider serves itself (where UCX would emulate them) are
     * (docs/transport-ucx.md). */
    if (strcmp(provider, "ucx") == 0 && !ucx_served(p, 64))
        skip();
    region_make(p, &local, 4096, RW, 0);
    region_make(p, &remote, 4096, RW, 1);
    /* A key that was good: the get works, the put too where checked. */
    assert_int_equal(get_wait(p, &p->a, &local, 0, &remote, 0, 64), TERN_OK);
    tern_mr_dereg(remote.mr);
    remote.mr = NULL;
    expect_refused(p, put_wait(p, &p->a, &local, 0, &remote, 0, 64, 0, 0), p->b.nerror,
                   "put with a revoked key");
    expect_refused(p, get_wait(p, &p->a, &local, 0, &remote, 0, 64), p->b.nerror,
                   "get with a revoked key");
    region_free(&local);
    region_free(&remote);
}

/* A key whose region was unregistered and its pages unmapped: a get or put
 * with it is refused (TERN_ERR_ACCESS at both ends) where the target takes
 * part, and the target lives. Where UCX answered gets on shared memory itself
 * it read the raw address: SIGSEGV in the target. */
static void test_unmapped_region(void **state)
{
    pair_t *p = *state;
    const size_t len = 64 * 1024;
    region_t local, remote;
    if (strcmp(provider, "ucx") == 0 && !ucx_served(p, len))
        skip();
    region_make(p, &local, len, RW, 0);
    uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(mem != MAP_FAILED);
    memset(mem, 0x3c, len);
    region_at(p, &remote, mem, len, RW, 1);
    assert_int_equal(get_wait(p, &p->a, &local, 0, &remote, 0, len), TERN_OK);
    assert_int_equal(local.mem[len - 1], 0x3c);
    tern_mr_dereg(remote.mr);
    remote.mr = NULL;
    assert_int_equal(munmap(mem, len), 0);
    expect_refused(p, get_wait(p, &p->a, &local, 0, &remote, 0, len), p->b.nerror,
                   "get from an unmapped region");
    expect_refused(p, put_wait(p, &p->a, &local, 0, &remote, 0, len, 0, 0), p->b.nerror,
                   "put into an unmapped region");
    tern_rkey_release(remote.rkey);
    region_free(&local);
}

static void test_local_checks(void **state)
{
    pair_t *p = *state;
    region_t local, remote;
    region_make(p, &local, 4096, RW, 0);
    region_make(p, &remote, 4096, RW, 1);
    tern_op_params_t op = {.field_mask = TERN_OP_PARAM_MR, .mr = local.mr};
    uint8_t other[16];
    /* A local buffer outside its registration, or no registration at all. */
    assert_int_equal(tern_ep_put(p->a.ep, other, 16, tern_rkey_addr(remote.rkey), remote.rkey, &op),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_ep_get(p->a.ep, local.mem, 16, tern_rkey_addr(remote.rkey), remote.rkey, NULL),
                     TERN_ERR_INVALID_PARAM);
    /* A key unpacked for another endpoint. */
    assert_int_equal(tern_ep_put(p->b.ep, local.mem, 16, tern_rkey_addr(remote.rkey), remote.rkey, &op),
                     TERN_ERR_INVALID_PARAM);
    /* Registration arguments. */
    tern_mr_t *mr = NULL;
    tern_mr_params_t bad = {.field_mask = TERN_MR_PARAM_ACCESS, .access = 0x80};
    assert_int_equal(tern_mr_reg(p->a.tp, other, 16, &bad, &mr), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_mr_reg(p->a.tp, NULL, 16, NULL, &mr), TERN_ERR_INVALID_PARAM);
    /* The cache: a range inside a live registration gets that registration. */
    tern_mr_t *again = NULL;
    tern_mr_params_t cached = {.field_mask = TERN_MR_PARAM_ACCESS, .access = TERN_ACCESS_LOCAL};
    tern_mr_t *outer = NULL;
    uint8_t *buf = malloc(8192);
    assert_int_equal(tern_mr_reg(p->a.tp, buf, 8192, NULL, &outer), TERN_OK);
    assert_int_equal(tern_mr_reg(p->a.tp, buf + 100, 1000, &cached, &again), TERN_OK);
    assert_ptr_equal(again, outer);
    tern_mr_dereg(again);
    /* The promise to hold memory for its readers goes with remote reads only,
     * and a registration made with it and one made without never stand in
     * for each other. */
    tern_mr_params_t held = {.field_mask = TERN_MR_PARAM_ACCESS,
                             .access = TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ_HELD};
    assert_int_equal(tern_mr_reg(p->a.tp, buf, 8192, &held, &mr), TERN_ERR_INVALID_PARAM);
    held.access |= TERN_ACCESS_REMOTE_READ;
    tern_mr_t *held_mr = NULL, *plain_mr = NULL;
    assert_int_equal(tern_mr_reg(p->a.tp, buf + 100, 1000, &held, &held_mr), TERN_OK);
    assert_ptr_not_equal(held_mr, outer);
    assert_int_equal(tern_mr_reg(p->a.tp, buf + 200, 100, &held, &again), TERN_OK);
    assert_ptr_equal(again, held_mr);
    tern_mr_dereg(again);
    tern_mr_params_t plain = {.field_mask = TERN_MR_PARAM_ACCESS, .access = TERN_ACCESS_REMOTE_READ};
    assert_int_equal(tern_mr_reg(p->a.tp, buf + 200, 100, &plain, &plain_mr), TERN_OK);
    assert_ptr_equal(plain_mr, outer);
    tern_mr_dereg(plain_mr);
    tern_mr_dereg(held_mr);
    tern_mr_dereg(outer);
    free(buf);
    region_free(&local);
    region_free(&remote);
}

static void test_addresses(void **state)
{
    pair_t *p = *state;
    uint8_t addr[TERN_ADDR_MAX], small[2];
    size_t len = sizeof(small);
    tern_ep_t *ep = NULL;
    assert_int_equal(tern_transport_address(p->a.tp, small, &len), TERN_ERR_TRUNCATED);
    assert_true(len > sizeof(small));
    len = sizeof(addr);
    assert_int_equal(tern_transport_address(p->a.tp, addr, &len), TERN_OK);
    assert_int_equal(len, p->a.attr.addr_len);
    /* Truncated or corrupted addresses are refused, not crashed on. */
    assert_int_equal(tern_ep_create(p->b.tp, 0, addr, len / 2, &ep), TERN_ERR_INVALID_PARAM);
    uint8_t junk[64];
    memset(junk, 0x11, sizeof(junk));
    assert_int_equal(tern_ep_create(p->b.tp, 0, junk, sizeof(junk), &ep), TERN_ERR_INVALID_PARAM);
    assert_null(ep);
}

/* A region unregistered while a put into it is arriving takes no more of it
 * (providers with attr.revokes_keys, and ucx where it serves puts): its owner
 * may free the memory as soon as tern_mr_dereg returns. The put fails at both
 * ends, and the endpoint stays usable. p2p relies on this when a receive
 * withdraws the buffer it offered for a collective's message. */
static void test_revoke_mid_put(void **state)
{
    pair_t *p = *state;
    region_t local, remote;
    const size_t len = 64u << 20;
    if (!p->b.attr.revokes_keys && !ucx_served(p, len))
        skip();
    region_make(p, &local, len, RW, 0);
    region_make(p, &remote, len, RW, 1);
    memset(local.mem, 0xa5, len);
    memset(remote.mem, 0, len);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR | TERN_OP_PARAM_IMM;
    op.mr = local.mr;
    op.imm = tern_imm_make(TERN_IMM_P2P_RNDV, 0, 0, 9);
    tern_status_t st = tern_ep_put(p->a.ep, local.mem, len, tern_rkey_addr(remote.rkey),
                                   remote.rkey, &op);
    assert_true(st == TERN_INPROGRESS);
    /* Progress the target alone (the socket then fills and holds the rest)
     * until the first bytes are in. */
    uint64_t deadline = tern_clock_ns() + 60 * SEC;
    while (remote.mem[0] == 0) {
        if (tern_clock_ns() > deadline)
            fail_msg("timed out waiting for the put's first bytes");
        tern_transport_progress(p->a.tp);
        tern_transport_progress(p->b.tp);
    }
    unsigned errors = p->b.nerror;
    tern_mr_dereg(remote.mr);
    remote.mr = NULL;
    size_t in = 0; /* what had landed when the region went */
    while (in < len && remote.mem[in] != 0)
        in++;
    PUMP_UNTIL(p, c.done, "the put's completion");
    assert_int_equal(c.last, TERN_ERR_ACCESS);
    PUMP_UNTIL(p, p->b.nerror > errors, "the target's error event");
    assert_int_equal(p->b.err_status[errors], TERN_ERR_ACCESS);
    assert_int_equal(p->b.err_imm[errors], op.imm);
    assert_int_equal(p->b.nput_imm, 0);
    /* One put, one event, however many pieces of it were refused. */
    for (int i = 0; i < 20; i++)
        progress_both(p);
    assert_int_equal(p->b.nerror, errors + 1);
    print_message("%zu of %zu bytes had landed when the region was unregistered\n", in, len);
    assert_true(in < len);
    for (size_t i = in; i < len; i++)
        if (remote.mem[i] != 0)
            fail_msg("byte %zu was written after the region was unregistered", i);
    expect_usable(p);
    region_free(&local);
    region_free(&remote);
}

/* UCX_TLS names of UCX's shared-memory transports. */
static const char *const ucx_shm_tls[] = {"sm", "posix", "sysv", "cma", "knem", "xpmem"};
#define N_UCX_SHM_TLS (sizeof(ucx_shm_tls) / sizeof(ucx_shm_tls[0]))

/* host_shm says whether peers on this host are reached through shared
 * memory: never for tcp; for ucx, exactly when UCX_TLS lets in one of UCX's
 * shared-memory transports (self, a process to itself, does not count). */
static void test_host_shm(void **state)
{
    pair_t *p = *state;
    const char *tls = getenv("UCX_TLS");
    int want = 0;
    if (strcmp(provider, "ucx") == 0)
        want = tls == NULL || strstr(tls, "all") != NULL;
    for (size_t i = 0; strcmp(provider, "ucx") == 0 && i < N_UCX_SHM_TLS; i++)
        want |= tls == NULL || strstr(tls, ucx_shm_tls[i]) != NULL;
    print_message("%s (%s): host_shm %d\n", provider, p->a.attr.device, p->a.attr.host_shm);
    assert_int_equal(p->a.attr.host_shm, want);
    assert_int_equal(p->b.attr.host_shm, want);
}

/* tcp bounds what is on its way to a process by its socket buffer
 * (TERN_TCP_SOCKBUF, 4 MiB by default; p2p holds puts and read replies in
 * flight to it), and is the provider that refuses revoked keys; ucx needs no
 * bound and cannot refuse. */
static void test_rx_window_and_keys(void **state)
{
    pair_t *p = *state;
    const char *sb = getenv("TERN_TCP_SOCKBUF");
    int tcp = strcmp(provider, "tcp") == 0;
    size_t want = !tcp ? 0 : sb == NULL || strcmp(sb, "0") == 0 ? (size_t)4 << 20
                                                                  : (size_t)strtoull(sb, NULL, 0);
    if (tcp && sb != NULL && strcmp(sb, "0") != 0 && strspn(sb, "0123456789") != strlen(sb))
        skip(); /* a size with a unit: not worth parsing here */
    print_message("%s: rx_window %zu, revokes_keys %d\n", provider, p->a.attr.rx_window,
                  p->a.attr.revokes_keys);
    assert_int_equal(p->a.attr.rx_window, want);
    assert_int_equal(p->a.attr.revokes_keys, tcp);
}

/*
 * tcp, TERN_TCP_ZCOPY_MODE: a stream of 1 MiB puts, then gets back from a
 * region held for its readers (TERN_ACCESS_REMOTE_READ_HELD), arrive intact
 * whichever way each payload went. In auto mode (the default) each writer
 * has timed both ways and picked the cheaper at its last pick (or one
 * within the sixteenth a choice must lose by before it changes), and each
 * reader has timed reads of
 * both kinds, which needs the writer's header to say which kind each payload
 * was; with splicing off or always, nothing is timed. Replies from a region
 * not held are copied in auto mode: the same gets from one time nothing.
 */
void tern__tcp_zcopy_stats(tern_transport_t *tp, double written[2], double read[2],
                           double cost[2], bool *splicing);

/* n puts (get 0) from local into remote, or gets (get 1) from remote into
 * local, of len bytes each, all posted at once by a; all must succeed. The
 * puts go the way given (TERN_WAY_AUTO: no TERN_OP_PARAM_WAY). */
static void rma_stream_way(pair_t *p, int get, region_t *local, region_t *remote, unsigned n,
                           size_t len, tern_op_way_t way)
{
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR;
    op.mr = local->mr;
    if (way != TERN_WAY_AUTO) {
        op.field_mask |= TERN_OP_PARAM_WAY;
        op.way = way;
    }
    for (unsigned i = 0; i < n; i++) {
        uint8_t *mem = local->mem + (size_t)i * len;
        uint64_t raddr = tern_rkey_addr(remote->rkey) + (size_t)i * len;
        posted(get ? tern_ep_get(p->a.ep, mem, len, raddr, remote->rkey, &op)
                   : tern_ep_put(p->a.ep, mem, len, raddr, remote->rkey, &op),
               &c);
    }
    PUMP_UNTIL(p, c.done == n, get ? "a stream of gets" : "a stream of puts");
    assert_int_equal(c.failed, 0);
}

static void rma_stream(pair_t *p, int get, region_t *local, region_t *remote, unsigned n,
                       size_t len)
{
    rma_stream_way(p, get, local, remote, n, len, TERN_WAY_AUTO);
}

/* Whether tcp splices payloads in TERN_TCP_ZCOPY_MODE `mode` (unset: auto)
 * by this run's environment: TERN_TCP_ZCOPY=0 copies them all. */
static bool zcopy_mode_is(const char *mode)
{
    const char *zc = getenv("TERN_TCP_ZCOPY"), *m = getenv("TERN_TCP_ZCOPY_MODE");
    return (zc == NULL || strcmp(zc, "0") != 0) && strcmp(m != NULL ? m : "auto", mode) == 0;
}

static void test_zcopy_choice(void **state)
{
    pair_t *p = *state;
    enum { N = 64, LEN = 1 << 20 };
    if (strcmp(provider, "tcp") != 0)
        skip();
    const bool timed = zcopy_mode_is("auto");
    region_t local, remote, back;
    region_make(p, &local, (size_t)N * LEN, RW, 0);
    region_make(p, &remote, (size_t)N * LEN, RW | TERN_ACCESS_REMOTE_READ_HELD, 1);
    region_make(p, &back, (size_t)N * LEN, RW, 0);
    fill(local.mem, (size_t)N * LEN, 5);
    rma_stream(p, 0, &local, &remote, N, LEN);
    assert_true(check(remote.mem, (size_t)N * LEN, 5));
    rma_stream(p, 1, &back, &remote, N, LEN);
    assert_true(check(back.mem, (size_t)N * LEN, 5));

    /* a wrote the puts and read the replies; b the other way round. */
    side_t *sides[2] = {&p->a, &p->b};
    for (int s = 0; s < 2; s++) {
        double written[2], read[2], cost[2];
        bool splicing;
        tern__tcp_zcopy_stats(sides[s]->tp, written, read, cost, &splicing);
        print_message("%c: written %.0f/%.0f, read %.0f/%.0f bytes (copied/spliced), "
                      "%.3f/%.3f ns a byte, %s\n",
                      'a' + s, written[0], written[1], read[0], read[1], cost[0], cost[1],
                      splicing ? "splicing" : "copying");
        for (int w = 0; w < 2; w++) {
            if (!timed) {
                assert_true(written[w] == 0 && read[w] == 0);
                continue;
            }
            assert_true(written[w] >= 4 << 20); /* ZC_SEED */
            assert_true(read[w] >= 4 << 20);
            assert_true(cost[w] > 0);
        }
        if (timed)
            assert_true(splicing ? cost[1] * 16 <= cost[0] * 17 : cost[0] * 16 <= cost[1] * 17);
    }
    if (timed) {
        /* b's replies from local's twin, which a registered without the promise */
        region_t plain;
        double before[2], written[2], read[2], cost[2];
        bool splicing;
        region_make(p, &plain, (size_t)8 * LEN, RW, 1);
        fill(plain.mem, (size_t)8 * LEN, 6);
        tern__tcp_zcopy_stats(p->b.tp, before, read, cost, &splicing);
        rma_stream(p, 1, &back, &plain, 8, LEN);
        assert_true(check(back.mem, (size_t)8 * LEN, 6));
        tern__tcp_zcopy_stats(p->b.tp, written, read, cost, &splicing);
        assert_true(written[0] == before[0] && written[1] == before[1]);
        region_free(&plain);
    }
    region_free(&local);
    region_free(&remote);
    region_free(&back);
}

/* A put's way (TERN_OP_PARAM_WAY): every provider delivers the bytes
 * whichever is asked; tcp in auto mode writes each payload the way asked,
 * over what it measured, and times it as any other. A way out of range, or
 * one given to a get, is refused. */
static void test_put_way(void **state)
{
    pair_t *p = *state;
    enum { N = 8, LEN = 1 << 20 };
    const bool tcp = strcmp(provider, "tcp") == 0;
    const bool timed = tcp && zcopy_mode_is("auto");
    region_t local, remote;
    double written[2], read[2], cost[2];
    bool splicing;
    region_make(p, &local, (size_t)N * LEN, RW, 0);
    region_make(p, &remote, (size_t)N * LEN, RW, 1);

    const tern_op_way_t ways[2] = {TERN_WAY_COPY, TERN_WAY_REF};
    for (int w = 0; w < 2; w++) {
        double before[2] = {0, 0};
        if (tcp)
            tern__tcp_zcopy_stats(p->a.tp, before, read, cost, &splicing);
        fill(local.mem, (size_t)N * LEN, (uint8_t)(7 + w));
        rma_stream_way(p, 0, &local, &remote, N, LEN, ways[w]);
        assert_true(check(remote.mem, (size_t)N * LEN, (uint8_t)(7 + w)));
        if (!tcp)
            continue;
        tern__tcp_zcopy_stats(p->a.tp, written, read, cost, &splicing);
        print_message("way %d: written %.0f/%.0f bytes (copied/spliced), before %.0f/%.0f\n",
                      (int)ways[w], written[0], written[1], before[0], before[1]);
        if (!timed) {
            assert_true(written[0] == 0 && written[1] == 0);
            continue;
        }
        /* all of it the way asked (a header rides with a copied payload) */
        const int other = !w;
        assert_true(written[w] - before[w] >= (double)N * LEN);
        assert_true(written[other] == before[other]);
    }

    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR | TERN_OP_PARAM_WAY;
    op.mr = local.mr;
    op.way = (tern_op_way_t)3;
    assert_int_equal(tern_ep_put(p->a.ep, local.mem, LEN, tern_rkey_addr(remote.rkey), remote.rkey,
                                 &op),
                     TERN_ERR_INVALID_PARAM);
    op.way = TERN_WAY_COPY;
    assert_int_equal(tern_ep_get(p->a.ep, local.mem, LEN, tern_rkey_addr(remote.rkey), remote.rkey,
                                 &op),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(c.done, 0);
    region_free(&local);
    region_free(&remote);
}

/* ---- the peer goes away ---- */

static void test_peer_closes_mid_transfer(void **state)
{
    pair_t *p = *state;
    region_t local;
    const size_t len = 64u << 20;
    uint8_t key[TERN_RKEY_MAX];
    size_t klen = sizeof(key);
    tern_mr_t *rmr;
    tern_rkey_t *rk;
    uint8_t *rmem = malloc(len);
    region_make(p, &local, len, RW, 0);
    assert_int_equal(tern_mr_reg(p->b.tp, rmem, len, NULL, &rmr), TERN_OK);
    assert_int_equal(tern_mr_pack(rmr, key, &klen), TERN_OK);
    assert_int_equal(tern_rkey_unpack(p->a.ep, key, klen, &rk), TERN_OK);
    /* Make sure the connection is up before the transfer starts. */
    send_one(p, &p->a, 3, 8);

    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR;
    op.mr = local.mr;
    unsigned n = 0;
    for (int i = 0; i < 4; i++)
        n += posted(tern_ep_put(p->a.ep, local.mem, len, tern_rkey_addr(rk), rk, &op), &c);
    for (unsigned i = 0; i < 16; i++)
        n += posted(tern_ep_send(p->a.ep, 5, local.mem, p->a.attr.max_send, &op), &c);
    /* Let a little of it flow, then the peer vanishes. */
    for (int i = 0; i < 3; i++)
        progress_both(p);
    /* Keys unpacked on b's endpoint go before b does (the header's rule). */
    tern_rkey_release(local.rkey);
    local.rkey = NULL;
    tern_transport_close(p->b.tp);
    p->b.tp = NULL;
    /* rmem stays allocated until a's operations end: with shared memory in one
     * process, a's puts are copied straight into it (a dead peer process takes
     * its memory with it, which an in-process test cannot imitate). */
    uint64_t deadline = tern_clock_ns() + 60 * SEC;
    while (c.done < 20 && tern_clock_ns() < deadline)
        tern_transport_progress(p->a.tp);
    assert_int_equal(c.done, 20); /* everything completed: an error, not a hang */
    assert_true(c.failed > 0 || n == 0);
    /* Later posts fail at once, and the user was told. */
    deadline = tern_clock_ns() + 10 * SEC;
    tern_status_t st;
    while ((st = tern_ep_send(p->a.ep, 1, "x", 1, NULL)) == TERN_OK && tern_clock_ns() < deadline)
        tern_transport_progress(p->a.tp);
    assert_true(st == TERN_ERR_PEER_LOST || st == TERN_ERR_CANCELED);
    tern_rkey_release(rk);
    region_free(&local);
    free(rmem);
}

/* ---- a peer that closes on purpose ---- */

/*
 * b closes its transport (its tern_finalize) while a stays. a hears it as an
 * error event from b with TERN_ERR_CLOSED, an orderly end that p2p logs at
 * info level, never TERN_ERR_PEER_LOST, which it warns of; and a's later
 * sends fail. Once with an endpoint on b's side (its BYE says so), once
 * without (b only ever received from a: its transport says goodbye as it
 * closes).
 */
static void expect_closed(pair_t *p, const char *what)
{
    uint8_t tmp[8] = {0};
    send_one(p, &p->a, 3, 8); /* up, and b has a's first message */
    PUMP_UNTIL(p, p->b.nrecv == 1, "the first message");
    tern_transport_close(p->b.tp);
    p->b.tp = NULL;
    p->b.ep = NULL;
    PUMP_UNTIL(p, p->a.nerror > 0, what);
    for (int i = 0; i < 100; i++)
        tern_transport_progress(p->a.tp); /* any second word on it */
    for (unsigned i = 0; i < p->a.nerror; i++) {
        assert_int_equal(p->a.err_src[i], 1);
        if (p->a.err_status[i] != TERN_ERR_CLOSED)
            fail_msg("%s: event %u says %s, want TERN_ERR_CLOSED", what, i,
                     tern_strerror(p->a.err_status[i]));
    }
    uint64_t deadline = tern_clock_ns() + 10 * SEC;
    tern_status_t st;
    while ((st = tern_ep_send(p->a.ep, 1, tmp, sizeof(tmp), NULL)) == TERN_OK &&
           tern_clock_ns() < deadline)
        tern_transport_progress(p->a.tp);
    if (st == TERN_OK || st == TERN_INPROGRESS)
        fail_msg("%s: a send after the close was taken (%s)", what, tern_strerror(st));
}

static void test_peer_closes_on_purpose(void **state)
{
    pair_t *p = *state;
    send_one(p, &p->b, 4, 8); /* b's endpoint is up too */
    expect_closed(p, "the event of b's close");
}

/* Whether UCX_TLS names shared-memory transports only ("sm,self" too). */
static int ucx_shm_only(void)
{
    const char *tls = getenv("UCX_TLS");
    char buf[256];
    if (tls == NULL || strlen(tls) >= sizeof(buf))
        return 0;
    strcpy(buf, tls);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        int found = strcmp(t, "self") == 0;
        for (size_t i = 0; i < N_UCX_SHM_TLS; i++)
            found |= strcmp(t, ucx_shm_tls[i]) == 0;
        if (!found)
            return 0;
    }
    return 1;
}

static void test_peer_closes_without_endpoint(void **state)
{
    /* Over UCX's network transports b has nothing to say goodbye on: no
     * endpoint of its own, and no notice channel (those are for peers on
     * one host without UCX's peer error handling). a hears a loss there
     * (docs/transport-ucx.md). */
    if (strcmp(provider, "ucx") == 0 && !ucx_shm_only())
        skip();
    expect_closed(*state, "the event of b's close (b had no endpoint)");
}

/* ---- strangers at the tcp listener ---- */

/*
 * Anyone can connect to a tcp transport's listener. These strangers speak the
 * tcp provider's framing (mirrored from transport/tcp/tcp.c: a 56-byte
 * little-endian header, type at 0, imm at 8, payload length at 48; HELLO's
 * payload magic u32, version u8, 3 zero, id u32, instance u64) or none.
 * Each is closed by the transport; none is heard as a rank or reported as
 * one's error, and the pair's own traffic goes on untouched.
 */
enum { T_HELLO = 1, T_SEND = 3, T_HDR = 56, T_HELLO_LEN = 20 };

static void frame(uint8_t *h, uint8_t type, uint32_t imm, uint64_t payload)
{
    memset(h, 0, T_HDR);
    h[0] = type;
    tern__put_le32(h + 8, imm);
    tern__put_le64(h + 48, payload);
}

/* A connected socket to the transport whose tcp address is addr (127.0.0.1). */
static int stranger(const uint8_t *addr, size_t len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    assert_int_equal(len, 24);
    assert_int_equal(addr[5], 4); /* IPv4 */
    memcpy(&sa.sin_port, addr + 6, 2);
    memcpy(&sa.sin_addr, addr + 20, 4);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void say(int fd, const void *buf, size_t len)
{
    assert_int_equal(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* A HELLO (magic and version as given) claiming id with instance. */
static void say_hello(int fd, uint32_t magic, uint8_t version, uint32_t id, uint64_t instance)
{
    uint8_t m[T_HDR + T_HELLO_LEN] = {0};
    frame(m, T_HELLO, 0, T_HELLO_LEN);
    tern__put_le32(m + T_HDR, magic);
    m[T_HDR + 4] = version;
    tern__put_le32(m + T_HDR + 8, id);
    tern__put_le64(m + T_HDR + 12, instance);
    say(fd, m, sizeof(m));
}

/* A SEND of 8 bytes with the pattern of slot 77, as a's peer would send one. */
static void say_send(int fd)
{
    uint8_t m[T_HDR + 8];
    frame(m, T_SEND, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, 77), 8);
    fill(m + T_HDR, 8, 77);
    say(fd, m, sizeof(m));
}

/* True once the transport has closed fd's other end (EOF or reset). */
static int closed_by_peer(int fd)
{
    uint8_t b[256];
    ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void test_strangers(void **state)
{
    pair_t *p = *state;
    enum { N = 100 };
    uint8_t addr[TERN_ADDR_MAX], junk[200], hdr[T_HDR], buf[64];
    size_t len = sizeof(addr);
    int fds[8], nf = 0, idle;
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);

    if (strcmp(provider, "tcp") != 0)
        skip(); /* the ucx provider has no listener of its own */
    assert_int_equal(tern_transport_address(p->a.tp, addr, &len), TERN_OK);
    const uint32_t magic = (uint32_t)addr[0] | (uint32_t)addr[1] << 8 | (uint32_t)addr[2] << 16 |
                           (uint32_t)addr[3] << 24;
    uint64_t b_instance;
    {
        uint8_t baddr[TERN_ADDR_MAX];
        size_t blen = sizeof(baddr);
        assert_int_equal(tern_transport_address(p->b.tp, baddr, &blen), TERN_OK);
        b_instance = 0;
        for (int i = 7; i >= 0; i--)
            b_instance = b_instance << 8 | baddr[8 + i];
    }
    /* Traffic both ways first, so the strangers come to a connected pair. */
    send_one(p, &p->a, 1, 8);
    send_one(p, &p->b, 1, 8);
    PUMP_UNTIL(p, p->a.nrecv == 1 && p->b.nrecv == 1, "the first messages");
    const unsigned a_before = 1, b_before = 1;

    close(stranger(addr, len)); /* connects and leaves */
    memset(junk, 0xa5, sizeof(junk));
    say(fds[nf] = stranger(addr, len), junk, sizeof(junk)); /* not our framing */
    nf++;
    frame(hdr, 200, 0, 0);
    say(fds[nf] = stranger(addr, len), hdr, sizeof(hdr)); /* an unknown frame type */
    nf++;
    fds[nf] = stranger(addr, len);
    say_send(fds[nf++]); /* a SEND before any HELLO */
    fds[nf] = stranger(addr, len);
    say_hello(fds[nf], magic ^ 1, addr[4], 1, b_instance); /* another protocol */
    say_send(fds[nf++]);
    fds[nf] = stranger(addr, len);
    say_hello(fds[nf], magic, (uint8_t)(addr[4] + 1), 1, b_instance); /* another version */
    say_send(fds[nf++]);
    fds[nf] = stranger(addr, len);
    say_hello(fds[nf], magic, addr[4], 1, b_instance ^ 0x5a5a); /* b's id, another process */
    say_send(fds[nf++]);
    fds[nf] = stranger(addr, len);
    say_hello(fds[nf], magic, addr[4], 7, 1234); /* an id with no endpoint, then too big a SEND */
    frame(hdr, T_SEND, 0, (uint64_t)1 << 40);
    say(fds[nf++], hdr, sizeof(hdr));
    idle = stranger(addr, len);
    say(idle, junk, T_HDR / 2); /* half a header, then silence */

    /* Every stranger but the idle one is closed by a, and the pair carries on. */
    for (int i = 0; i < nf; i++) {
        PUMP_UNTIL(p, closed_by_peer(fds[i]), "a stranger to be closed");
        close(fds[i]);
    }
    fill(buf, sizeof(buf), 3);
    for (unsigned i = 0; i < N; i++) {
        posted(tern_ep_send(p->a.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, 3), buf, i % 64, &op), &c);
        posted(tern_ep_send(p->b.ep, tern_imm_make(TERN_IMM_P2P_EAGER, 0, 0, 3), buf, 63 - i % 64, &op), &c);
        progress_both(p);
    }
    PUMP_UNTIL(p, c.done == 2 * N && p->a.nrecv == a_before + N && p->b.nrecv == b_before + N,
               "the pair's sends both ways");
    close(idle);
    for (int i = 0; i < 1000; i++)
        progress_both(p);
    assert_int_equal(c.failed, 0);
    /* Nothing a stranger sent was delivered, and no error was raised for it. */
    assert_int_equal(p->a.nrecv, a_before + N);
    for (unsigned i = a_before; i < p->a.nrecv; i++) {
        assert_int_equal(p->a.recv_src[i], 1);
        assert_int_equal(p->a.recv_len[i], 63 - (i - a_before) % 64);
        assert_true(p->a.recv_ok[i]);
    }
    assert_int_equal(p->a.nerror, 0);
    assert_int_equal(p->b.nerror, 0);
}

/* A stranger that claims an id before this side has an endpoint for it cannot
 * be told from the peer yet (an endpoint may be made after the peer's first
 * messages: test_endpoint_made_later). Once the endpoint names another
 * process for that id, the stranger is closed, and the real peer's
 * connection is the one adopted. */
static void test_stranger_before_endpoint(void **state)
{
    pair_t *p = *state;
    uint8_t addr[TERN_ADDR_MAX];
    size_t len = sizeof(addr);

    if (strcmp(provider, "tcp") != 0)
        skip();
    assert_int_equal(tern_transport_address(p->b.tp, addr, &len), TERN_OK);
    const uint32_t magic = (uint32_t)addr[0] | (uint32_t)addr[1] << 8 | (uint32_t)addr[2] << 16 |
                           (uint32_t)addr[3] << 24;
    int fd = stranger(addr, len);
    say_hello(fd, magic, addr[4], 0, 42); /* a's id, not a's instance */
    send_one(p, &p->a, 1, 8);             /* a's real connection to b */
    PUMP_UNTIL(p, p->b.nrecv == 1, "a's first message");
    for (int i = 0; i < 100; i++)
        progress_both(p);
    assert_false(closed_by_peer(fd)); /* b cannot tell yet */
    len = sizeof(addr);
    assert_int_equal(tern_transport_address(p->a.tp, addr, &len), TERN_OK);
    assert_int_equal(tern_ep_create(p->b.tp, 0, addr, len, &p->b.ep), TERN_OK);
    PUMP_UNTIL(p, closed_by_peer(fd), "the stranger to be closed");
    close(fd);
    send_one(p, &p->b, 2, 16);
    PUMP_UNTIL(p, p->a.nrecv == 1, "b's reply");
    assert_int_equal(p->a.recv_src[0], 1);
    assert_true(p->a.recv_ok[0]);
    assert_int_equal(p->a.nerror + p->b.nerror, 0);
}

/* ---- callbacks and teardown ---- */

/* An event callback may destroy the endpoint of the message it is handling
 * (an application's goodbye), with more arriving behind it; a completion
 * callback may destroy its operation's endpoint with a reply still to read
 * behind the ack. tcp freed the connection under the frame it was handling. */
static void destroy_on_99(side_t *s, const tern_event_t *ev)
{
    if (ev->type == TERN_EVENT_RECV && ev->imm == 99 && s->ep != NULL) {
        tern_ep_destroy(s->ep);
        s->ep = NULL;
    }
}

static void test_destroy_in_callbacks(void **state)
{
    pair_t *p = *state;
    uint8_t buf[64] = {0};
    p->b.hook = destroy_on_99;
    for (uint32_t i = 0; i < 3; i++)
        posted(tern_ep_send(p->a.ep, 1, buf, 5, NULL), &(counter_t){0});
    posted(tern_ep_send(p->a.ep, 99, buf, 3, NULL), &(counter_t){0});
    for (uint32_t i = 0; i < 3; i++)
        posted(tern_ep_send(p->a.ep, 2, buf, 5, NULL), &(counter_t){0});
    PUMP_UNTIL(p, p->b.ep == NULL, "b's callback to destroy its endpoint");
    for (int i = 0; i < 200; i++)
        progress_both(p);
    assert_true(p->b.nrecv >= 4);
    p->b.hook = NULL;
    tern_ep_destroy(p->a.ep);
    p->a.ep = NULL;
    /* Afresh, and the put's completion destroys a's endpoint. */
    connect_pair(p);
    region_t local, remote;
    region_make(p, &local, 4096, RW, 0);
    region_make(p, &remote, 4096, RW, 1);
    counter_t c = {.destroy = &p->a.ep};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR;
    op.mr = local.mr;
    tern_rkey_t *rk = remote.rkey;
    remote.rkey = NULL; /* unpacked on a's endpoint: released before it goes */
    tern_status_t st = tern_ep_put(p->a.ep, local.mem, 64, tern_rkey_addr(rk), rk, &op);
    tern_rkey_release(rk);
    if (st == TERN_OK) { /* done at once: no callback to act in */
        tern_ep_destroy(p->a.ep);
        p->a.ep = NULL;
    }
    posted(tern_ep_send(p->b.ep, 3, buf, 4, NULL), &(counter_t){0});
    PUMP_UNTIL(p, p->a.ep == NULL, "the put's callback to destroy a's endpoint");
    for (int i = 0; i < 200; i++)
        progress_both(p);
    assert_true(c.done == 1 || st == TERN_OK);
    region_free(&local);
    region_free(&remote);
}

/* The end of a test whose gets from a into remote (b's) were canceled: b's
 * worker may still serve their requests (ucx's one-sided RMA, revokes_keys
 * 0), and a's may still land a reply, so the memory outlives both
 * transports, whose close releases the registrations. */
static void close_then_free(pair_t *p, region_t *local, region_t *remote)
{
    tern_rkey_release(local->rkey);
    local->rkey = NULL;
    tern_transport_close(p->a.tp);
    p->a.tp = NULL;
    p->a.ep = NULL;
    tern_transport_close(p->b.tp);
    p->b.tp = NULL;
    p->b.ep = NULL;
    free(local->mem);
    free(remote->mem);
}

/* A CANCELED completion may destroy its endpoint while that endpoint, or the
 * whole transport, is being torn down: a no-op, and the operations each
 * complete once. Both providers freed the endpoint under the callback. */
static void cancel_destroys(pair_t *p, int close)
{
    const size_t len = 4u << 20;
    region_t local, remote;
    region_make(p, &local, len, RW, 0);
    region_make(p, &remote, len, RW, 1);
    send_one(p, &p->a, 1, 1);
    counter_t c[8];
    unsigned inflight = 0;
    for (int i = 0; i < 8; i++) {
        c[i] = (counter_t){.destroy = &p->a.ep};
        tern_op_params_t op = cb_params(&c[i]);
        op.field_mask |= TERN_OP_PARAM_MR;
        op.mr = local.mr;
        inflight += posted(tern_ep_get(p->a.ep, local.mem, len, tern_rkey_addr(remote.rkey),
                                       remote.rkey, &op),
                           &c[i]);
    }
    tern_rkey_release(remote.rkey);
    remote.rkey = NULL;
    if (close) {
        tern_rkey_release(local.rkey); /* unpacked on b's endpoint */
        local.rkey = NULL;
        tern_mr_dereg(local.mr);
        local.mr = NULL;
        tern_transport_close(p->a.tp);
        p->a.tp = NULL;
    } else {
        tern_ep_destroy(p->a.ep);
    }
    p->a.ep = NULL;
    unsigned done = 0;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(c[i].done, 1);
        done += c[i].done;
    }
    print_message("%u of 8 gets in flight at the %s\n", inflight, close ? "close" : "destroy");
    assert_int_equal(done, 8);
    close_then_free(p, &local, &remote);
}

static void test_destroy_in_cancel_callback(void **state)
{
    cancel_destroys(*state, 0);
}

/* With gets answered through the FIFO (shared memory with TERN_UCX_CMA=0)
 * the closing side parks its worker (b is not progressing), and b, told so
 * by the GONE on its notice channel, parks its own rather than purge the
 * replies queued for a. When UCX answered those gets itself, UCX 1.13
 * crashed in that purge (docs/transport-ucx.md, "Known UCX 1.13 faults"),
 * and both variants did now and then. */
static void test_destroy_in_cancel_callback_at_close(void **state)
{
    cancel_destroys(*state, 1);
}

/* A get of 64 MiB whose reply is partly in when its endpoint is destroyed
 * completes once, CANCELED, within the destroy; when the target's transport
 * closes instead, it completes once with an error. tcp completed neither:
 * the reply being read was nobody's to fail. */
static void get_interrupted(pair_t *p, int close_target)
{
    const size_t len = 64u << 20;
    region_t local, remote;
    region_make(p, &local, len, RW, 0);
    region_make(p, &remote, len, RW, 1);
    memset(remote.mem, 7, len);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR;
    op.mr = local.mr;
    send_one(p, &p->a, 1, 1); /* connected */
    c.in_post = 1;
    posted(tern_ep_get(p->a.ep, local.mem, len, tern_rkey_addr(remote.rkey), remote.rkey, &op), &c);
    c.in_post = 0;
    for (int i = 0; i < 6; i++)
        progress_both(p);
    print_message("%s after 6 rounds of progress: %u completions\n",
                  close_target ? "target closes" : "endpoint destroyed", c.done);
    tern_rkey_release(remote.rkey);
    remote.rkey = NULL;
    if (!close_target) {
        unsigned before = c.done;
        tern_ep_destroy(p->a.ep);
        p->a.ep = NULL;
        assert_int_equal(c.done, 1);
        if (before == 0)
            assert_int_equal(c.last, TERN_ERR_CANCELED);
    } else {
        tern_mr_dereg(remote.mr);
        remote.mr = NULL;
        tern_rkey_release(local.rkey); /* unpacked on b's endpoint: before b goes */
        local.rkey = NULL;
        tern_transport_close(p->b.tp);
        p->b.tp = NULL;
        p->b.ep = NULL;
        PUMP_UNTIL(p, c.done == 1, "the get's completion after its target closed");
    }
    for (int i = 0; i < 200; i++)
        progress_both(p);
    assert_int_equal(c.done, 1);
    assert_int_equal(c.in_a_post, 0);
    close_then_free(p, &local, &remote);
}

static void test_get_interrupted_by_destroy(void **state)
{
    get_interrupted(*state, 0);
}

static void test_get_interrupted_by_close(void **state)
{
    get_interrupted(*state, 1);
}

/* Callbacks run from progress, never inside the post that returned
 * TERN_INPROGRESS (nor a later post): a caller may record the operation after
 * the post returns, or hold a lock the callback takes. Queued sends, then a
 * get and a send posted to a peer already gone. */
static void test_no_callback_inside_post(void **state)
{
    pair_t *p = *state;
    const size_t len = p->a.attr.max_send;
    uint8_t *buf = malloc(len);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    unsigned n = 0;
    assert_non_null(buf);
    fill(buf, len, 5);
    send_one(p, &p->a, 1, 1);
    c.in_post = 1;
    for (int i = 0; i < 16; i++, n++)
        posted(tern_ep_send(p->a.ep, 2, buf, len, &op), &c);
    c.in_post = 0;
    for (int i = 0; i < 4; i++) {
        tern_transport_progress(p->b.tp); /* room in a's socket: its next post may flush */
        c.in_post = 1;
        posted(tern_ep_send(p->a.ep, 3, buf, 1, &op), &c);
        n++;
        c.in_post = 0;
    }
    PUMP_UNTIL(p, c.done == n, "the sends");
    assert_int_equal(c.in_a_post, 0);
    /* The peer goes; before a has progressed, a posts to it. */
    region_t local;
    region_make(p, &local, 4096, RW, 0);
    uint8_t key[TERN_RKEY_MAX];
    size_t klen = sizeof(key);
    tern_mr_t *rmr;
    tern_rkey_t *rk;
    uint8_t *rmem = malloc(4096);
    assert_int_equal(tern_mr_reg(p->b.tp, rmem, 4096, NULL, &rmr), TERN_OK);
    assert_int_equal(tern_mr_pack(rmr, key, &klen), TERN_OK);
    assert_int_equal(tern_rkey_unpack(p->a.ep, key, klen, &rk), TERN_OK);
    tern_rkey_release(local.rkey); /* unpacked on b's endpoint: before b goes */
    local.rkey = NULL;
    tern_transport_close(p->b.tp);
    p->b.tp = NULL;
    p->b.ep = NULL;
    counter_t g = {0};
    tern_op_params_t gop = cb_params(&g);
    gop.field_mask |= TERN_OP_PARAM_MR;
    gop.mr = local.mr;
    usleep(100000); /* the close reaches a's socket */
    g.in_post = 1;
    tern_status_t s1 = tern_ep_send(p->a.ep, 4, buf, 1, &gop);
    usleep(100000);
    tern_status_t s2 = tern_ep_get(p->a.ep, local.mem, 64, tern_rkey_addr(rk), rk, &gop);
    g.in_post = 0;
    unsigned expect = (s1 == TERN_INPROGRESS) + (s2 == TERN_INPROGRESS);
    print_message("posts to a closed peer: send %s, get %s\n", tern_strerror(s1), tern_strerror(s2));
    assert_int_equal(g.in_a_post, 0);
    PUMP_UNTIL(p, g.done == expect, "the posts' completions");
    for (int i = 0; i < 100; i++)
        progress_both(p);
    assert_int_equal(g.done, expect);
    tern_rkey_release(rk);
    region_free(&local);
    free(rmem);
    free(buf);
}

/* A region unregistered (then overwritten) while a peer's get of it is
 * being answered is read no more (providers with attr.revokes_keys, and ucx
 * where it serves gets): the get completes once, refused (TERN_ERR_ACCESS)
 * or with what the region held at the dereg, never a byte written after it,
 * and without taking the peer for lost. With TERN_TCP_ZCOPY_MODE=always the
 * reply's pages already spliced are the kernel's by reference
 * (docs/transport.md): there only the single completion holds; auto splices
 * only replies from regions held for their readers, and this one is not.
 * landed: the dereg comes once the reply's first bytes are in, so that it
 * cuts a reply under way (tcp then sends the rest as copied at the dereg; ucx
 * stops reading, and the get fails). */
static void dereg_during_get(pair_t *p, int landed)
{
    const size_t len = 64u << 20;
    region_t local, remote;
    const int served = ucx_served(p, len);
    if (!p->b.attr.revokes_keys && !served)
        skip();
    region_make(p, &local, len, RW, 0);
    region_make(p, &remote, len, RW, 1);
    memset(remote.mem, 7, len);
    memset(local.mem, 0, len);
    send_one(p, &p->a, 1, 1);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR;
    op.mr = local.mr;
    posted(tern_ep_get(p->a.ep, local.mem, len, tern_rkey_addr(remote.rkey), remote.rkey, &op), &c);
    uint64_t deadline = tern_clock_ns() + 60 * SEC;
    for (int i = 0; i < 3 || (landed && local.mem[0] == 0); i++) {
        if (tern_clock_ns() > deadline)
            fail_msg("timed out waiting for the reply's first bytes");
        progress_both(p);
    }
    assert_int_equal(c.done, 0);
    unsigned errors = p->a.nerror;
    tern_mr_dereg(remote.mr);
    remote.mr = NULL;
    memset(remote.mem, 0xee, len); /* reused at once */
    PUMP_UNTIL(p, c.done == 1, "the get's completion");
    print_message("get after dereg: %s\n", tern_strerror(c.last));
    assert_true(c.last == TERN_OK || c.last == TERN_ERR_ACCESS);
    if (landed && served) /* it reads no more, and says so */
        assert_int_equal(c.last, TERN_ERR_ACCESS);
    const bool forced = zcopy_mode_is("always");
    if (c.last == TERN_OK && !forced)
        for (size_t i = 0; i < len; i++)
            if (local.mem[i] == 0xee)
                fail_msg("byte %zu of the get was read after the dereg", i);
    assert_int_equal(p->a.nerror, errors);
    expect_usable(p);
    region_free(&local);
    tern_rkey_release(remote.rkey);
    free(remote.mem);
}

static void test_dereg_during_get(void **state)
{
    dereg_during_get(*state, 0);
}

static void test_dereg_mid_get_reply(void **state)
{
    dereg_during_get(*state, 1);
}

/* tcp: endpoints made at once on both sides (every all-to-all start) cross
 * two connections; operations posted before the switch ride the losing one.
 * Destroying the endpoint cancels them too: one completion, CANCELED or
 * done, within the destroy, and nothing written into the buffer after. */
static void test_destroy_after_switch(void **state)
{
    pair_t *p = *state;
    const size_t len = 64u << 20;
    region_t local, remote;
    if (strcmp(provider, "tcp") != 0)
        skip();
    region_make(p, &local, len, RW, 1); /* b reads a's memory into its own */
    region_make(p, &remote, len, RW, 0);
    memset(remote.mem, 7, len);
    memset(local.mem, 0, len);
    counter_t c = {0};
    tern_op_params_t op = cb_params(&c);
    op.field_mask |= TERN_OP_PARAM_MR;
    op.mr = local.mr;
    posted(tern_ep_get(p->b.ep, local.mem, len, tern_rkey_addr(remote.rkey), remote.rkey, &op), &c);
    tern_transport_progress(p->b.tp); /* b's HELLO and GET out */
    tern_transport_progress(p->a.tp); /* a's HELLO out, the reply begins */
    for (int i = 0; i < 3; i++)
        tern_transport_progress(p->b.tp); /* a's HELLO: b switches */
    tern_rkey_release(remote.rkey);
    remote.rkey = NULL;
    tern_ep_destroy(p->b.ep);
    p->b.ep = NULL;
    assert_int_equal(c.done, 1);
    local.mem[len - 1] = 0;
    for (int i = 0; i < 2000; i++)
        progress_both(p);
    assert_int_equal(c.done, 1);
    if (c.last != TERN_OK)
        assert_int_equal(local.mem[len - 1], 0);
    region_free(&local);
    tern_mr_dereg(remote.mr);
    free(remote.mem);
}

/* conformance PROVIDER [TEST-PATTERN]: the pattern (cmocka's, '*' wildcards)
 * runs some of the tests, e.g. to see one fail without its fix. */
int main(int argc, char **argv)
{
    if (argc > 1)
        provider = argv[1];
    if (argc > 2)
        cmocka_set_test_filter(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_send_sizes_and_immediates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_ordering_many_outstanding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_both_directions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_inline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_inline_prefix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordering_while_connecting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoint_made_later, setup_one_way, teardown),
        cmocka_unit_test_setup_teardown(test_put_get_every_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_with_immediate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_outstanding_rma, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixed_queued_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_keys_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_revoked_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unmapped_region, setup, teardown),
        cmocka_unit_test_setup_teardown(test_local_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_addresses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_revoke_mid_put, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_shm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rx_window_and_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zcopy_choice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_way, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_closes_mid_transfer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_closes_on_purpose, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_closes_without_endpoint, setup_one_way, teardown),
        cmocka_unit_test_setup_teardown(test_strangers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stranger_before_endpoint, setup_one_way, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_in_callbacks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_in_cancel_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_in_cancel_callback_at_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_interrupted_by_destroy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_interrupted_by_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_callback_inside_post, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dereg_during_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dereg_mid_get_reply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_after_switch, setup, teardown),
    };
    return cmocka_run_group_tests_name(provider, tests, NULL, NULL);
}
