/*
 * Smoke test of the ucx provider (transport/ucx/ucx.c): two transports in one
 * process, each with an endpoint to the other, both progressed by the test
 * thread. What the provider-independent conformance suite cannot see is
 * checked here: the rendezvous receive path, the immediate emulation, the
 * refusal notices, the address and key headers, the close notices.
 * Every wait is bounded (tern_clock_ns); nothing asserts a speed.
 * Run once per UCX_TLS (tcp, sm): see ucx.cmake.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <tern/clock.h>
#include <tern/transport.h>

#include "core/config.h"

/* The provider's counter of sends received by rendezvous (tests only). */
uint64_t tern__ucx_rndv_count(const tern_transport_t *tp);
/* Whether closing tp will leave its UCX worker parked (tests only). */
int tern__ucx_parks_at_close(tern_transport_t *tp);
/* UCX maps tp keeps past their registrations, and how many are held (tests only). */
int tern__ucx_kept_maps(tern_transport_t *tp, unsigned *in_use);
/* Make tp's next notice channel fail its HELLO with err (tests only). */
void tern__ucx_fail_next_hello(tern_transport_t *tp, int err);

#define SEC 1000000000ull
#define MAX_EV 4096
#define RW (TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ | TERN_ACCESS_REMOTE_WRITE)

typedef struct side {
    tern_transport_t *tp;
    tern_ep_t *ep;
    tern_transport_attr_t attr;
    unsigned nev;
    tern_event_t ev[MAX_EV]; /* data copied out below */
    uint8_t *data[MAX_EV];
    /* A put-with-immediate's target: checked when its event fires. */
    const uint8_t *watch;
    size_t watch_len;
    uint8_t watch_seed;
    int watch_ok;
} side_t;

typedef struct pair {
    side_t a, b; /* self ids 0 and 1 */
} pair_t;

static uint8_t pat(uint8_t seed, size_t i)
{
    return (uint8_t)(seed ^ (i * 131) ^ (i >> 9));
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pat(seed, i);
}

static int same(const uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != pat(seed, i))
            return 0;
    return 1;
}

static void on_event(const tern_event_t *ev, void *arg)
{
    side_t *s = arg;
    if (s->nev >= MAX_EV)
        fail_msg("more than %d events", MAX_EV);
    s->ev[s->nev] = *ev;
    s->data[s->nev] = NULL;
    if (ev->type == TERN_EVENT_RECV && ev->len > 0) {
        s->data[s->nev] = malloc(ev->len);
        assert_non_null(s->data[s->nev]);
        memcpy(s->data[s->nev], ev->data, ev->len);
    }
    if (ev->type == TERN_EVENT_PUT_IMM && s->watch != NULL)
        s->watch_ok = same(s->watch, s->watch_len, s->watch_seed);
    s->nev++;
}

static void forget_events(side_t *s)
{
    for (unsigned i = 0; i < s->nev; i++)
        free(s->data[i]);
    s->nev = 0;
}

static unsigned count(const side_t *s, tern_event_type_t type)
{
    unsigned n = 0;
    for (unsigned i = 0; i < s->nev; i++)
        n += s->ev[i].type == type;
    return n;
}

/* The k-th event of a type, or fail. */
static const tern_event_t *nth(const side_t *s, tern_event_type_t type, unsigned k)
{
    for (unsigned i = 0; i < s->nev; i++)
        if (s->ev[i].type == type && k-- == 0)
            return &s->ev[i];
    fail_msg("no event %u of type %d", k, type);
    return NULL;
}

static void progress(pair_t *p)
{
    if (p->a.tp != NULL)
        tern_transport_progress(p->a.tp);
    if (p->b.tp != NULL)
        tern_transport_progress(p->b.tp);
}

#define PUMP(p, cond, what)                                                                        \
    do {                                                                                           \
        uint64_t until_ = tern_clock_ns() + 60 * SEC;                                              \
        while (!(cond)) {                                                                          \
            if (tern_clock_ns() > until_)                                                          \
                fail_msg("timed out waiting for %s", what);                                        \
            progress(p);                                                                           \
        }                                                                                          \
    } while (0)

static tern_transport_t *open_ucx_ev(uint32_t id, tern_event_fn fn, void *arg, int busy)
{
    tern_transport_params_t params = {
        .field_mask = TERN_TRANSPORT_PARAM_PROVIDER | TERN_TRANSPORT_PARAM_SELF_ID |
                      TERN_TRANSPORT_PARAM_EVENT | TERN_TRANSPORT_PARAM_BUSY_POLL,
        .provider = "ucx",
        .self_id = id,
        .on_event = fn,
        .event_arg = arg,
        .busy_poll = busy,
    };
    tern_transport_t *tp = NULL;
    if (tern_transport_open(&params, &tp) != TERN_OK)
        fail_msg("open ucx: %s", tern_last_error());
    return tp;
}

static tern_transport_t *open_ucx(uint32_t id, side_t *s, int busy)
{
    return open_ucx_ev(id, on_event, s, busy);
}

/* An endpoint on from to the transport of peer id. */
static tern_ep_t *connect_one(tern_transport_t *from, tern_transport_t *to, uint32_t id)
{
    uint8_t addr[TERN_ADDR_MAX];
    size_t len = sizeof(addr);
    tern_ep_t *ep = NULL;
    assert_int_equal(tern_transport_address(to, addr, &len), TERN_OK);
    if (tern_ep_create(from, id, addr, len, &ep) != TERN_OK)
        fail_msg("ep to %u: %s", id, tern_last_error());
    return ep;
}

static void connect_pair(pair_t *p)
{
    p->a.ep = connect_one(p->a.tp, p->b.tp, 1);
    p->b.ep = connect_one(p->b.tp, p->a.tp, 0);
}

/* p's two transports (self ids 0 and 1), not yet connected. */
static void open_pair(pair_t *p)
{
    p->a.tp = open_ucx(0, &p->a, 0);
    p->b.tp = open_ucx(1, &p->b, 0);
}

/* Close what is still open of p and drop the events it kept. */
static void close_pair(pair_t *p)
{
    tern_transport_close(p->a.tp);
    tern_transport_close(p->b.tp);
    forget_events(&p->a);
    forget_events(&p->b);
}

static int setup(void **state)
{
    pair_t *p = calloc(1, sizeof(*p));
    open_pair(p);
    tern_transport_query(p->a.tp, &p->a.attr);
    tern_transport_query(p->b.tp, &p->b.attr);
    connect_pair(p);
    *state = p;
    return 0;
}

static int teardown(void **state)
{
    pair_t *p = *state;
    close_pair(p);
    free(p);
    return 0;
}

typedef struct comp {
    unsigned done, failed;
    tern_status_t last, last_fail;
} comp_t;

static void comp_cb(void *arg, tern_status_t st)
{
    comp_t *c = arg;
    c->done++;
    c->last = st;
    if (st != TERN_OK) {
        c->failed++;
        c->last_fail = st;
    }
}

static tern_op_params_t with_cb(comp_t *c, tern_mr_t *mr)
{
    tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB, .cb = comp_cb, .cb_arg = c};
    if (mr != NULL) {
        op.field_mask |= TERN_OP_PARAM_MR;
        op.mr = mr;
    }
    return op;
}

/* Account for a post: TERN_OK completes it now, TERN_INPROGRESS later. */
static void post(tern_status_t st, comp_t *c)
{
    if (st == TERN_OK)
        c->done++;
    else if (st != TERN_INPROGRESS)
        fail_msg("post: %s: %s", tern_status_name(st), tern_last_error());
}

/* ---- the transport ---- */

static void test_open_and_attr(void **state)
{
    pair_t *p = *state;
    const tern_transport_attr_t *at = &p->a.attr;
    uint8_t small[4];
    size_t len = sizeof(small);

    print_message("device: %s\n", at->device);
    assert_string_equal(at->provider, "ucx");
    assert_non_null(strstr(at->device, "UCX 1."));
    assert_non_null(strstr(at->device, "UCX_TLS="));
    assert_int_equal(at->max_send, 1u << 20);
    assert_true(at->max_put >= (64u << 20));
    assert_true(at->addr_len > 40 && at->addr_len <= TERN_ADDR_MAX);
    assert_int_equal(tern_transport_address(p->a.tp, small, &len), TERN_ERR_TRUNCATED);
    assert_int_equal(len, at->addr_len);

    /* Sleeping: an fd, and arm says when there is work first. A message
     * arriving after arm makes the fd readable. */
    int fd = tern_transport_fd(p->a.tp);
    assert_true(fd >= 0);
    uint64_t until = tern_clock_ns() + 10 * SEC;
    tern_status_t st;
    while ((st = tern_transport_arm(p->a.tp)) == TERN_ERR_NO_RESOURCE && tern_clock_ns() < until)
        progress(p);
    assert_int_equal(st, TERN_OK);
    assert_int_equal(tern_ep_send(p->b.ep, 5, "wake", 4, NULL) >= 0, 1);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    until = tern_clock_ns() + 10 * SEC;
    while (poll(&pfd, 1, 0) == 0 && tern_clock_ns() < until)
        tern_transport_progress(p->b.tp); /* only b: a sleeps */
    assert_true(pfd.revents & POLLIN);
    PUMP(p, p->a.nev == 1, "the waking message");

    /* Busy-polling: no fd to sleep on. */
    side_t s = {0};
    tern_transport_t *busy = open_ucx(7, &s, 1);
    assert_int_equal(tern_transport_fd(busy), -1);
    assert_int_equal(tern_transport_arm(busy), TERN_ERR_UNSUPPORTED);
    assert_true(tern_transport_progress(busy) >= 0);
    tern_transport_close(busy);

    /* A named provider that cannot start says why (UCX's reason), and does not
     * fall back. UCX reads UCX_TLS at open: the test sets it for one open. */
    tern_transport_params_t bad = {.field_mask = TERN_TRANSPORT_PARAM_PROVIDER, .provider = "ucx"};
    tern_transport_t *none = NULL;
    const char *tls = getenv("UCX_TLS");
    char *saved = tls ? strdup(tls) : NULL;
    setenv("UCX_TLS", "no_such_transport", 1);
    st = tern_transport_open(&bad, &none);
    if (saved != NULL)
        setenv("UCX_TLS", saved, 1);
    else
        unsetenv("UCX_TLS");
    free(saved);
    assert_int_equal(st, TERN_ERR_NO_DEVICE);
    assert_null(none);
    print_message("cannot start: %s\n", tern_last_error());
    assert_non_null(strstr(tern_last_error(), "ucp_init"));
}

/* Warnings logged while a test listens (count_zcopy_warnings). */
static unsigned zcopy_warnings;

static void count_zcopy_warnings(tern_log_level_t level, int rank, const char *msg, void *arg)
{
    (void)rank;
    (void)arg;
    if (level == TERN_LOG_WARN && strstr(msg, "UCX_ZCOPY_THRESH") != NULL)
        zcopy_warnings++;
}

/* tern turns UCX's zero-copy AMs off (UCX 1.13's tcp can abort the process
 * on a peer that dies mid-send: docs/transport-ucx.md); a user who sets
 * UCX_ZCOPY_THRESH keeps it, and hears the risk where tcp is in. */
static void test_user_zcopy_thresh_warned(void **state)
{
    (void)state;
    const char *tls = getenv("UCX_TLS");
    const unsigned want = tls != NULL && strstr(tls, "tcp") != NULL ? 1 : 0;
    const tern_log_level_t level = tern_log_get_level();
    if (level < TERN_LOG_WARN)
        tern_log_set_level(TERN_LOG_WARN);
    tern_log_set_sink(count_zcopy_warnings, NULL);
    side_t s = {0};
    zcopy_warnings = 0;
    tern_transport_t *tp = open_ucx(9, &s, 1); /* tern's default: no warning */
    tern_transport_attr_t at;
    tern_transport_query(tp, &at);
    tern_transport_close(tp);
    unsigned major = 0, minor = 0;
    if (sscanf(at.device, "UCX %u.%u", &major, &minor) != 2)
        fail_msg("no UCX version in '%s'", at.device);
    if (major > 1 || minor > 13) {
        tern_log_set_sink(NULL, NULL);
        tern_log_set_level(level);
        skip(); /* the fault was read in 1.13's source: later ones are not warned of */
    }
    const unsigned quiet = zcopy_warnings;
    setenv("UCX_ZCOPY_THRESH", "16k", 1);
    zcopy_warnings = 0;
    tp = open_ucx(9, &s, 1);
    tern_transport_close(tp);
    unsetenv("UCX_ZCOPY_THRESH");
    tern_log_set_sink(NULL, NULL);
    tern_log_set_level(level);
    print_message("UCX_TLS=%s: %u warning(s) with UCX_ZCOPY_THRESH=16k\n", tls ? tls : "(unset)",
                  zcopy_warnings);
    assert_int_equal(quiet, 0);
    assert_int_equal(zcopy_warnings, want);
}

/* ---- sends ---- */

static void test_send_imm_and_src(void **state)
{
    pair_t *p = *state;
    uint8_t msg[100];
    comp_t c = {0};
    tern_op_params_t op = with_cb(&c, NULL);

    fill(msg, sizeof(msg), 1);
    post(tern_ep_send(p->a.ep, 0xdeadbeef, msg, sizeof(msg), &op), &c);
    post(tern_ep_send(p->a.ep, 0, NULL, 0, &op), &c);
    post(tern_ep_send(p->b.ep, 0x12345678, msg, 10, &op), &c);
    PUMP(p, c.done == 3 && p->b.nev == 2 && p->a.nev == 1, "three sends");
    assert_int_equal(c.failed, 0);
    assert_int_equal(p->b.ev[0].type, TERN_EVENT_RECV);
    assert_int_equal(p->b.ev[0].src, 0);
    assert_int_equal(p->b.ev[0].imm, 0xdeadbeef);
    assert_int_equal(p->b.ev[0].len, sizeof(msg));
    assert_true(same(p->b.data[0], sizeof(msg), 1));
    assert_int_equal(p->b.ev[1].len, 0);
    assert_int_equal(p->b.ev[1].imm, 0);
    assert_int_equal(p->a.ev[0].src, 1);
    assert_int_equal(p->a.ev[0].imm, 0x12345678);
    assert_true(same(p->a.data[0], 10, 1));
    /* Over the limit is refused before anything goes out. */
    assert_int_equal(tern_ep_send(p->a.ep, 1, msg, p->a.attr.max_send + 1, NULL),
                     TERN_ERR_INVALID_PARAM);
}

/* 1000 sends, every 50th one large enough to go by rendezvous: they arrive in
 * the order sent, the small ones waiting behind the large. */
static void test_ordering_with_rendezvous(void **state)
{
    pair_t *p = *state;
    enum { N = 1000, BIG = 256 * 1024 };
    uint8_t *big = malloc(BIG), small[64];
    comp_t c = {0};
    tern_op_params_t op = with_cb(&c, NULL);
    const uint64_t rndv0 = tern__ucx_rndv_count(p->b.tp);

    fill(big, BIG, 9);
    fill(small, sizeof(small), 9);
    for (unsigned i = 0; i < N; i++) {
        if (i % 50 == 0)
            post(tern_ep_send(p->a.ep, i, big, BIG, &op), &c);
        else
            post(tern_ep_send(p->a.ep, i, small, i % 64, &op), &c);
    }
    PUMP(p, c.done == N && p->b.nev == N, "1000 sends");
    assert_int_equal(c.failed, 0);
    for (unsigned i = 0; i < N; i++) {
        const size_t len = i % 50 == 0 ? BIG : i % 64;
        if (p->b.ev[i].imm != i || p->b.ev[i].len != len)
            fail_msg("event %u: imm %u len %zu (out of order)", i, p->b.ev[i].imm, p->b.ev[i].len);
        assert_int_equal(p->b.ev[i].src, 0);
        if (len > 0)
            assert_true(same(p->b.data[i], len, 9));
    }
    print_message("rendezvous receives: %llu\n",
                  (unsigned long long)(tern__ucx_rndv_count(p->b.tp) - rndv0));
    assert_true(tern__ucx_rndv_count(p->b.tp) - rndv0 >= N / 50);
    free(big);
}

/* The largest send, by rendezvous, lands whole. */
static void test_large_send(void **state)
{
    pair_t *p = *state;
    const size_t len = p->a.attr.max_send;
    uint8_t *buf = malloc(len);
    comp_t c = {0};
    tern_op_params_t op = with_cb(&c, NULL);
    const uint64_t rndv0 = tern__ucx_rndv_count(p->b.tp);

    fill(buf, len, 42);
    post(tern_ep_send(p->a.ep, 4242, buf, len, &op), &c);
    PUMP(p, c.done == 1 && p->b.nev == 1, "a 1 MiB send");
    assert_int_equal(c.failed, 0);
    assert_int_equal(p->b.ev[0].len, len);
    assert_int_equal(p->b.ev[0].imm, 4242);
    assert_true(same(p->b.data[0], len, 42));
    assert_int_equal(tern__ucx_rndv_count(p->b.tp) - rndv0, 1);
    free(buf);
}

/* ---- put / get ---- */

typedef struct region {
    uint8_t *mem;
    size_t len;
    tern_mr_t *mr;
    tern_rkey_t *rkey; /* on the other side's endpoint */
} region_t;

static void region(pair_t *p, region_t *r, size_t len, unsigned access, int on_b)
{
    side_t *own = on_b ? &p->b : &p->a, *peer = on_b ? &p->a : &p->b;
    tern_mr_params_t mp = {.field_mask = TERN_MR_PARAM_ACCESS | TERN_MR_PARAM_NO_CACHE,
                           .access = access};
    uint8_t key[TERN_RKEY_MAX];
    size_t klen = sizeof(key);

    r->len = len;
    r->mem = malloc(len + 1);
    assert_non_null(r->mem);
    if (tern_mr_reg(own->tp, r->mem, len, &mp, &r->mr) != TERN_OK)
        fail_msg("mr_reg %zu: %s", len, tern_last_error());
    assert_int_equal(tern_mr_pack(r->mr, key, &klen), TERN_OK);
    if (tern_rkey_unpack(peer->ep, key, klen, &r->rkey) != TERN_OK)
        fail_msg("rkey_unpack: %s", tern_last_error());
    assert_int_equal(tern_rkey_addr(r->rkey), (uintptr_t)r->mem);
    assert_int_equal(tern_rkey_len(r->rkey), len);
}

static void region_free(region_t *r)
{
    tern_rkey_release(r->rkey);
    tern_mr_dereg(r->mr);
    free(r->mem);
}

static tern_status_t rma(pair_t *p, int get, region_t *local, size_t loff, region_t *remote,
                         size_t roff, size_t len, const uint32_t *imm)
{
    comp_t c = {0};
    tern_op_params_t op = with_cb(&c, local->mr);
    uint64_t raddr = tern_rkey_addr(remote->rkey) + roff;
    tern_status_t st;

    if (imm != NULL) {
        op.field_mask |= TERN_OP_PARAM_IMM;
        op.imm = *imm;
    }
    st = get ? tern_ep_get(p->a.ep, local->mem + loff, len, raddr, remote->rkey, &op)
             : tern_ep_put(p->a.ep, local->mem + loff, len, raddr, remote->rkey, &op);
    if (st != TERN_INPROGRESS)
        return st;
    PUMP(p, c.done == 1, get ? "a get" : "a put");
    return c.last;
}

static void test_put_get_sizes(void **state)
{
    pair_t *p = *state;
    const size_t max = 64u << 20;
    /* {length, local offset, remote offset}: unaligned on both sides but the last. */
    const size_t cases[][3] = {{0, 0, 0},    {1, 0, 0},     {1, 7, 13},
                               {4093, 3, 5}, {65537, 1, 2}, {max, 0, 0}};
    region_t l, r;

    region(p, &l, max, RW, 0);
    region(p, &r, max, RW, 1);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const size_t len = cases[i][0], lo = cases[i][1], ro = cases[i][2];
        const uint8_t seed = (uint8_t)(0x30 + i);
        fill(l.mem + lo, len, seed);
        memset(r.mem, 0xee, ro + len + 1 < max ? ro + len + 1 : max);
        assert_int_equal(rma(p, 0, &l, lo, &r, ro, len, NULL), TERN_OK);
        if (!same(r.mem + ro, len, seed))
            fail_msg("put of %zu bytes (+%zu -> +%zu) landed wrong", len, lo, ro);
        if (ro + len < max)
            assert_int_equal(r.mem[ro + len], 0xee);
        if (ro > 0)
            assert_int_equal(r.mem[ro - 1], 0xee);
        memset(l.mem, 0, lo + len + 1 < max ? lo + len + 1 : max);
        assert_int_equal(rma(p, 1, &l, lo, &r, ro, len, NULL), TERN_OK);
        if (!same(l.mem + lo, len, seed))
            fail_msg("get of %zu bytes read wrong", len);
        if (lo + len < max)
            assert_int_equal(l.mem[lo + len], 0);
    }
    region_free(&l);
    region_free(&r);

    /* An empty region: zero-byte operations at its address, nothing else. */
    region_t e;
    region(p, &l, 16, RW, 0);
    region(p, &e, 0, RW, 1);
    assert_int_equal(rma(p, 0, &l, 0, &e, 0, 0, NULL), TERN_OK);
    assert_int_equal(rma(p, 1, &l, 0, &e, 0, 0, NULL), TERN_OK);
    unsigned errors = count(&p->b, TERN_EVENT_ERROR);
    assert_int_equal(rma(p, 0, &l, 0, &e, 0, 1, NULL), TERN_ERR_ACCESS);
    PUMP(p, count(&p->b, TERN_EVENT_ERROR) == errors + 1, "the refusal's notice");
    region_free(&l);
    region_free(&e);
}

/* A registration's UCX map outlives it (the provider keeps it for the next
 * registration of the same range), but the registration does not: its key
 * is refused once it is gone, a new one of the same range reads what the
 * memory holds now, and no more maps are kept than the provider's slots. */
static void test_kept_maps(void **state)
{
    pair_t *p = *state;
    tern_transport_t *tp = p->b.tp;
    unsigned held;
    int base = tern__ucx_kept_maps(tp, &held);
    if (base < 0) {
        print_message("this UCX pins what it maps: no maps kept\n");
        return;
    }
    region_t l, r, again, ro;
    region(p, &l, 4096, RW, 0);
    region(p, &r, 4096, RW, 1);
    assert_int_equal(tern__ucx_kept_maps(tp, &held), base + 1);
    assert_int_equal(held, 1);
    fill(r.mem, 4096, 0x11);
    assert_int_equal(rma(p, 1, &l, 0, &r, 0, 4096, NULL), TERN_OK);
    assert_true(same(l.mem, 4096, 0x11));

    /* The registration goes; its key stays unpacked on a's side. */
    tern_mr_dereg(r.mr);
    assert_int_equal(tern__ucx_kept_maps(tp, &held), base + 1);
    assert_int_equal(held, 0);
    /* The same range again: the kept map, a new registration. */
    tern_mr_params_t mp = {.field_mask = TERN_MR_PARAM_ACCESS | TERN_MR_PARAM_NO_CACHE,
                           .access = RW};
    uint8_t key[TERN_RKEY_MAX];
    size_t klen = sizeof(key);
    again = r;
    assert_int_equal(tern_mr_reg(tp, r.mem, 4096, &mp, &again.mr), TERN_OK);
    assert_int_equal(tern_mr_pack(again.mr, key, &klen), TERN_OK);
    assert_int_equal(tern_rkey_unpack(p->a.ep, key, klen, &again.rkey), TERN_OK);
    assert_int_equal(tern__ucx_kept_maps(tp, &held), base + 1);
    assert_int_equal(held, 1);
    fill(r.mem, 4096, 0x22);
    memset(l.mem, 0, 4096);
    assert_int_equal(rma(p, 1, &l, 0, &again, 0, 4096, NULL), TERN_OK);
    assert_true(same(l.mem, 4096, 0x22));
    /* The old key names a registration that is gone: refused (a small get
     * is served by b's tern, which checks it), memory untouched. */
    unsigned errors = count(&p->b, TERN_EVENT_ERROR);
    memset(l.mem, 0, 4096);
    assert_int_equal(rma(p, 1, &l, 0, &r, 0, 8, NULL), TERN_ERR_ACCESS);
    PUMP(p, count(&p->b, TERN_EVENT_ERROR) == errors + 1, "the refusal's notice");
    assert_int_equal(l.mem[0], 0);
    tern_rkey_release(r.rkey);

    /* Other access, same range: a map of its own, which works. */
    region(p, &ro, 4096, TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ, 1);
    assert_int_equal(tern__ucx_kept_maps(tp, &held), base + 2);
    fill(ro.mem, 4096, 0x33);
    assert_int_equal(rma(p, 1, &l, 0, &ro, 0, 4096, NULL), TERN_OK);
    assert_true(same(l.mem, 4096, 0x33));
    region_free(&ro);
    region_free(&again);

    /* More live registrations than slots: the extra ones map and unmap as
     * before, and work; once they are gone, every kept map is idle. */
    enum { N = 40 };
    region_t many[N];
    for (int i = 0; i < N; i++) {
        region(p, &many[i], 256 + (size_t)i, RW, 1);
        fill(many[i].mem, many[i].len, (uint8_t)i);
    }
    int kept = tern__ucx_kept_maps(tp, &held);
    assert_true(kept >= 1 && kept < N);
    assert_int_equal(held, (unsigned)kept);
    for (int i = 0; i < N; i++) {
        memset(l.mem, 0, many[i].len);
        assert_int_equal(rma(p, 1, &l, 0, &many[i], 0, many[i].len, NULL), TERN_OK);
        assert_true(same(l.mem, many[i].len, (uint8_t)i));
    }
    for (int i = 0; i < N; i++)
        region_free(&many[i]);
    assert_int_equal(tern__ucx_kept_maps(tp, &held), kept);
    assert_int_equal(held, 0);
    region_free(&l);
}

/* The target's event comes once the data is in place; zero-byte puts with
 * immediate work too, and order after the earlier puts. */
static void test_put_with_imm(void **state)
{
    pair_t *p = *state;
    const size_t len = 8u << 20;
    region_t l, r;
    uint32_t imm = 0xfeedf00d;

    region(p, &l, len, RW, 0);
    region(p, &r, len, RW, 1);
    fill(l.mem, len, 5);
    memset(r.mem, 0, len);
    p->b.watch = r.mem;
    p->b.watch_len = len;
    p->b.watch_seed = 5;
    assert_int_equal(rma(p, 0, &l, 0, &r, 0, len, &imm), TERN_OK);
    PUMP(p, count(&p->b, TERN_EVENT_PUT_IMM) == 1, "the put's immediate");
    assert_true(p->b.watch_ok);
    assert_int_equal(nth(&p->b, TERN_EVENT_PUT_IMM, 0)->imm, imm);
    assert_int_equal(nth(&p->b, TERN_EVENT_PUT_IMM, 0)->len, len);
    assert_int_equal(nth(&p->b, TERN_EVENT_PUT_IMM, 0)->src, 0);

    /* A plain put not waited for, then a zero-byte put with immediate: the
     * event means the plain put has landed as well. */
    comp_t c = {0};
    tern_op_params_t op = with_cb(&c, l.mr);
    fill(l.mem, 4096, 6);
    p->b.watch_len = 4096;
    p->b.watch_seed = 6;
    p->b.watch_ok = 0;
    post(tern_ep_put(p->a.ep, l.mem, 4096, tern_rkey_addr(r.rkey), r.rkey, &op), &c);
    imm = 7;
    op.field_mask |= TERN_OP_PARAM_IMM;
    op.imm = imm;
    post(tern_ep_put(p->a.ep, l.mem, 0, tern_rkey_addr(r.rkey), r.rkey, &op), &c);
    PUMP(p, c.done == 2 && count(&p->b, TERN_EVENT_PUT_IMM) == 2, "the zero-byte immediate");
    assert_int_equal(c.failed, 0);
    assert_true(p->b.watch_ok);
    assert_int_equal(nth(&p->b, TERN_EVENT_PUT_IMM, 1)->len, 0);
    assert_int_equal(nth(&p->b, TERN_EVENT_PUT_IMM, 1)->imm, 7);
    p->b.watch = NULL;
    region_free(&l);
    region_free(&r);
}

/* On shared memory (a notice channel to the peer) puts and gets of
 * TERN_UCX_CMA bytes or more (0: never) copy by
 * process_vm_readv/writev: one-sided, as an RC NIC's,
 * so they complete as they are posted while the target does not progress at
 * all. Through UCX (tcp, or TERN_UCX_CMA 0 or above len) they need the
 * target's progress, so they cannot. */
static void test_one_sided_without_target_progress(void **state)
{
    pair_t *p = *state;
    const size_t len = (4u << 20) + 3;
    const char *tls = getenv("UCX_TLS");
    tern__config_t cfg;
    int direct;
    region_t l, r;
    comp_t c = {0};
    tern_op_params_t op;
    tern_status_t st;

    /* The threshold the provider reads: TERN_UCX_CMA, or its default. */
    if (tern__config_load(&cfg) != TERN_OK)
        fail_msg("config: %s", tern_last_error());
    direct = tls != NULL && strcmp(tls, "sm") == 0 && cfg.ucx_cma != 0 && cfg.ucx_cma <= len - 1;

    region(p, &l, len, RW, 0);
    region(p, &r, len, RW, 1);
    fill(l.mem, len, 21);
    memset(r.mem, 0, len);
    op = with_cb(&c, l.mr);
    st = tern_ep_put(p->a.ep, l.mem, len, tern_rkey_addr(r.rkey), r.rkey, &op);
    if (direct) {
        if (st != TERN_OK)
            fail_msg("put on sm: %s (%s), expected done at once", tern_status_name(st),
                     tern_last_error());
        assert_true(same(r.mem, len, 21));
        fill(r.mem + 1, len - 1, 22);
        st = tern_ep_get(p->a.ep, l.mem + 1, len - 1, tern_rkey_addr(r.rkey) + 1, r.rkey, &op);
        assert_int_equal(st, TERN_OK);
        assert_true(same(l.mem + 1, len - 1, 22));
        assert_int_equal(c.done, 0); /* done at once: no callback */
    } else {
        assert_int_equal(st, TERN_INPROGRESS);
        PUMP(p, c.done == 1, "the put through UCX");
        assert_int_equal(c.last, TERN_OK);
        assert_true(same(r.mem, len, 21));
    }
    region_free(&l);
    region_free(&r);
}

/* Out of bounds or without the access: refused at the initiator
 * (TERN_ERR_ACCESS), an error event at the target, the endpoint still works. */
static void test_refusals(void **state)
{
    pair_t *p = *state;
    region_t l, r, ro, wo;
    const uint32_t imm = 0xabcd;
    struct {
        int get;
        region_t *reg;
        size_t off, len;
        const uint32_t *imm;
    } bad[] = {
        {0, &r, 4000, 200, &imm}, /* put straddling the end, with immediate */
        {1, &r, 4096, 1, NULL},   /* get just past the end */
        {0, &ro, 0, 8, NULL},     /* put into a region without remote write */
        {1, &wo, 0, 8, NULL},     /* get from a region without remote read */
    };

    region(p, &l, 4096, RW, 0);
    region(p, &r, 4096, RW, 1);
    region(p, &ro, 4096, TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ, 1);
    region(p, &wo, 4096, TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_WRITE, 1);
    memset(r.mem, 0x5a, 4096);
    memset(ro.mem, 0x5a, 4096);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const unsigned errors = count(&p->b, TERN_EVENT_ERROR),
                       recvs = count(&p->b, TERN_EVENT_RECV);
        assert_int_equal(rma(p, bad[i].get, &l, 0, bad[i].reg, bad[i].off, bad[i].len, bad[i].imm),
                         TERN_ERR_ACCESS);
        assert_non_null(strstr(tern_last_error(), bad[i].get ? "tern_ep_get" : "tern_ep_put"));
        PUMP(p, count(&p->b, TERN_EVENT_ERROR) == errors + 1, "the target's error event");
        const tern_event_t *ev = nth(&p->b, TERN_EVENT_ERROR, errors);
        assert_int_equal(ev->status, TERN_ERR_ACCESS);
        assert_int_equal(ev->src, 0);
        assert_int_equal(ev->imm, bad[i].imm ? *bad[i].imm : 0);
        /* Still usable, both ways. */
        comp_t c = {0};
        tern_op_params_t op = with_cb(&c, NULL);
        post(tern_ep_send(p->a.ep, 99, "ok", 2, &op), &c);
        PUMP(p, c.done == 1 && count(&p->b, TERN_EVENT_RECV) == recvs + 1, "a send afterwards");
        assert_int_equal(c.failed, 0);
    }
    for (size_t i = 0; i < 4096; i++)
        assert_true(r.mem[i] == 0x5a && ro.mem[i] == 0x5a);
    /* The allowed directions work. */
    assert_int_equal(rma(p, 1, &l, 0, &ro, 0, 8, NULL), TERN_OK);
    assert_int_equal(rma(p, 0, &l, 0, &wo, 0, 8, NULL), TERN_OK);
    region_free(&l);
    region_free(&r);
    region_free(&ro);
    region_free(&wo);
}

/* ---- malformed blobs ---- */

static void test_malformed_address_and_key(void **state)
{
    pair_t *p = *state;
    uint8_t addr[TERN_ADDR_MAX], bad[TERN_ADDR_MAX + 8];
    size_t len = sizeof(addr);
    tern_ep_t *ep = NULL;

    assert_int_equal(tern_transport_address(p->b.tp, addr, &len), TERN_OK);
    /* Truncated anywhere. */
    for (size_t cut = 1; cut < len; cut += (cut < 64 ? 1 : 97))
        assert_int_equal(tern_ep_create(p->a.tp, 1, addr, cut, &ep), TERN_ERR_INVALID_PARAM);
    /* One byte damaged anywhere (header or UCX's part). */
    for (size_t i = 0; i < len; i += (i < 64 ? 1 : 13)) {
        memcpy(bad, addr, len);
        bad[i] ^= 0x40;
        assert_int_equal(tern_ep_create(p->a.tp, 1, bad, len, &ep), TERN_ERR_INVALID_PARAM);
    }
    /* Trailing junk, another provider's blob, the wrong peer id. */
    memcpy(bad, addr, len);
    bad[len] = 0;
    assert_int_equal(tern_ep_create(p->a.tp, 1, bad, len + 1, &ep), TERN_ERR_INVALID_PARAM);
    memset(bad, 0x11, 64);
    assert_int_equal(tern_ep_create(p->a.tp, 1, bad, 64, &ep), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_ep_create(p->a.tp, 5, addr, len, &ep), TERN_ERR_INVALID_PARAM);
    assert_non_null(strstr(tern_last_error(), "peer 1, not peer 5"));
    assert_null(ep);

    /* Keys. */
    region_t r;
    uint8_t key[TERN_RKEY_MAX], kbad[TERN_RKEY_MAX];
    size_t klen = sizeof(key), small = 8;
    tern_rkey_t *rk = NULL;
    region(p, &r, 4096, RW, 1);
    assert_int_equal(tern_mr_pack(r.mr, key, &small), TERN_ERR_TRUNCATED);
    assert_int_equal(tern_mr_pack(r.mr, key, &klen), TERN_OK);
    assert_int_equal(small, klen);
    for (size_t cut = 1; cut < klen; cut++)
        assert_int_equal(tern_rkey_unpack(p->a.ep, key, cut, &rk), TERN_ERR_INVALID_PARAM);
    for (size_t i = 0; i < klen; i++) {
        memcpy(kbad, key, klen);
        kbad[i] ^= 0x01;
        assert_int_equal(tern_rkey_unpack(p->a.ep, kbad, klen, &rk), TERN_ERR_INVALID_PARAM);
    }
    memset(kbad, 0xab, sizeof(kbad));
    assert_int_equal(tern_rkey_unpack(p->a.ep, kbad, 64, &rk), TERN_ERR_INVALID_PARAM);
    assert_null(rk);
    /* An address is not a key. */
    assert_int_equal(
        tern_rkey_unpack(p->a.ep, addr, len < TERN_RKEY_MAX ? len : TERN_RKEY_MAX, &rk),
        TERN_ERR_INVALID_PARAM);
    /* And the good ones still work. */
    assert_int_equal(tern_rkey_unpack(p->a.ep, key, klen, &rk), TERN_OK);
    tern_rkey_release(rk);
    region_free(&r);
}

/* ---- teardown ---- */

/* Destroying an endpoint cancels what is in flight on it (callbacks with
 * TERN_ERR_CANCELED, none after), the peer drops the canceled messages and
 * hears TERN_ERR_CLOSED; later posts on its endpoint fail at once. */
static void test_ep_destroy_cancels(void **state)
{
    pair_t *p = *state;
    const size_t len = p->a.attr.max_send;
    uint8_t *buf = malloc(len);
    comp_t c = {0};
    tern_op_params_t op = with_cb(&c, NULL);
    unsigned inflight = 0;

    /* Connected and idle first. */
    post(tern_ep_send(p->a.ep, 1, "x", 1, &op), &c);
    PUMP(p, c.done == 1 && p->b.nev == 1, "a first send");
    c.done = 0;
    fill(buf, len, 3);
    for (int i = 0; i < 4; i++) {
        tern_status_t st = tern_ep_send(p->a.ep, 100 + i, buf, len, &op);
        post(st, &c);
        inflight += st == TERN_INPROGRESS;
    }
    tern_ep_destroy(p->a.ep); /* without b progressing: rendezvous sends cannot finish */
    p->a.ep = NULL;
    assert_int_equal(c.done, 4);
    assert_int_equal(c.failed, inflight);
    if (inflight > 0)
        assert_int_equal(c.last_fail, TERN_ERR_CANCELED);
    PUMP(p, count(&p->b, TERN_EVENT_ERROR) == 1, "b to hear that a left");
    const tern_event_t *ev = nth(&p->b, TERN_EVENT_ERROR, 0);
    assert_int_equal(ev->status, TERN_ERR_CLOSED); /* on purpose: not a loss to warn of */
    assert_int_equal(ev->src, 0);
    /* A little more progress: nothing canceled shows up at b. */
    for (int i = 0; i < 1000; i++)
        progress(p);
    assert_int_equal(count(&p->b, TERN_EVENT_RECV), 1 + (4 - inflight));
    assert_int_equal(c.done, 4);
    assert_int_equal(tern_ep_send(p->b.ep, 1, "y", 1, NULL), TERN_ERR_PEER_LOST);
    tern_ep_destroy(p->b.ep);
    p->b.ep = NULL;
    /* A new pair of endpoints between the same transports works. */
    connect_pair(p);
    comp_t c2 = {0};
    tern_op_params_t op2 = with_cb(&c2, NULL);
    post(tern_ep_send(p->b.ep, 77, "z", 1, &op2), &c2);
    PUMP(p, c2.done == 1 && count(&p->a, TERN_EVENT_RECV) == 1, "a send on new endpoints");
    assert_int_equal(nth(&p->a, TERN_EVENT_RECV, 0)->imm, 77);
    free(buf);
}

/* The peer's whole transport goes (closed while ops are in flight): every op
 * completes with an error (TERN_ERR_PEER_LOST), the user hears that the peer
 * closed (TERN_ERR_CLOSED), later posts fail. */
static void test_peer_transport_closes(void **state)
{
    pair_t *p = *state;
    const size_t len = p->a.attr.max_send;
    region_t l, r;
    comp_t c = {0};
    tern_op_params_t op;
    unsigned n = 0;

    region(p, &l, len, RW, 0);
    region(p, &r, len, RW, 1);
    op = with_cb(&c, l.mr);
    post(tern_ep_send(p->a.ep, 1, "x", 1, &op), &c);
    PUMP(p, c.done == 1, "a first send");
    c.done = 0;
    for (int i = 0; i < 8; i++) {
        tern_status_t st = tern_ep_send(p->a.ep, 2, l.mem, len, &op);
        post(st, &c);
        n++;
        st = tern_ep_get(p->a.ep, l.mem, len, tern_rkey_addr(r.rkey), r.rkey, &op);
        post(st, &c);
        n++;
    }
    tern_rkey_release(r.rkey);
    r.rkey = NULL;
    tern_transport_close(p->b.tp);
    p->b.tp = NULL;
    p->b.ep = NULL;
    PUMP(p, c.done == n && count(&p->a, TERN_EVENT_ERROR) >= 1, "every op and the loss event");
    const tern_event_t *ev = nth(&p->a, TERN_EVENT_ERROR, 0);
    assert_int_equal(ev->status, TERN_ERR_CLOSED);
    assert_int_equal(ev->src, 1);
    if (c.failed > 0)
        assert_int_equal(c.last_fail, TERN_ERR_PEER_LOST);
    print_message("%u of %u ops failed with TERN_ERR_PEER_LOST\n", c.failed, n);
    assert_int_equal(tern_ep_send(p->a.ep, 1, "x", 1, NULL), TERN_ERR_PEER_LOST);
    region_free(&l); /* its key was unpacked on b's endpoint: released without it */
    free(r.mem);     /* its registration went with b's transport */
}

/* A transport that closes before it ever looked at a peer's new endpoint
 * (the peer's notice channel still in its listener's backlog, as in a short
 * run under load) still says it closed on purpose, unparked: the peer neither
 * takes it for a death nor parks its own worker at close (which leaked what
 * UCX allocated for that worker under the sanitizer). */
static void test_peer_closes_before_accepting(void **state)
{
    (void)state;
    const char *tls = getenv("UCX_TLS");
    if (tls == NULL || strcmp(tls, "sm") != 0)
        skip(); /* peer failure by UCX itself: no notice channel */
    pair_t p = {0};
    open_pair(&p);
    p.a.ep = connect_one(p.a.tp, p.b.tp, 1); /* b never progresses before it closes */
    tern_transport_close(p.b.tp);
    p.b.tp = NULL;
    PUMP(&p, count(&p.a, TERN_EVENT_ERROR) >= 1, "the loss event");
    const tern_event_t *ev = nth(&p.a, TERN_EVENT_ERROR, 0);
    assert_int_equal(ev->src, 1);
    assert_int_equal(ev->status, TERN_ERR_CLOSED); /* on purpose, not PEER_LOST */
    assert_int_equal(tern__ucx_parks_at_close(p.a.tp), 0);
    tern_transport_close(p.a.tp);
    forget_events(&p.a);
}

/* A peer that goes between our connect to its notice listener and our HELLO
 * (the connect only queued the channel; the kernel resets it when the
 * listener goes) is lost, as one whose listener was already gone is: with no
 * channel a peer on shared memory that is gone is never heard of. A HELLO
 * that fails for want of room is no loss: the endpoint works, unwatched. */
static void test_peer_gone_before_hello(void **state)
{
    (void)state;
    const char *tls = getenv("UCX_TLS");
    if (tls == NULL || strcmp(tls, "sm") != 0)
        skip(); /* peer failure by UCX itself: no notice channel */
    static const int gone[] = {EPIPE, ECONNRESET};
    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++) {
        pair_t p = {0};
        open_pair(&p);
        tern__ucx_fail_next_hello(p.a.tp, gone[i]);
        p.a.ep = connect_one(p.a.tp, p.b.tp, 1);
        PUMP(&p, count(&p.a, TERN_EVENT_ERROR) >= 1, "the loss event");
        const tern_event_t *ev = nth(&p.a, TERN_EVENT_ERROR, 0);
        assert_int_equal(ev->src, 1);
        assert_int_equal(ev->status, TERN_ERR_PEER_LOST);
        assert_int_equal(tern_ep_send(p.a.ep, 1, "x", 1, NULL), TERN_ERR_PEER_LOST);
        close_pair(&p);
    }

    pair_t p = {0};
    open_pair(&p);
    tern__ucx_fail_next_hello(p.a.tp, EAGAIN);
    connect_pair(&p);
    assert_int_equal(tern_ep_send(p.a.ep, 5, "hello", 6, NULL), TERN_OK);
    PUMP(&p, count(&p.b, TERN_EVENT_RECV) >= 1, "the send on an unwatched endpoint");
    assert_int_equal(nth(&p.b, TERN_EVENT_RECV, 0)->imm, 5);
    assert_int_equal(count(&p.a, TERN_EVENT_ERROR), 0);
    close_pair(&p);
}

/* Closing a transport with ops in flight completes them with TERN_ERR_CANCELED
 * (and leaks nothing: the sanitizer run checks). */
static void test_close_cancels(void **state)
{
    pair_t *p = *state;
    const size_t len = 4u << 20;
    region_t l, r;
    comp_t c = {0};
    tern_op_params_t op;

    region(p, &l, len, RW, 0);
    region(p, &r, len, RW, 1);
    op = with_cb(&c, l.mr);
    post(tern_ep_send(p->a.ep, 1, "x", 1, &op), &c);
    PUMP(p, c.done == 1, "a first send");
    c.done = 0;
    unsigned n = 0;
    for (int i = 0; i < 4; i++) {
        post(tern_ep_put(p->a.ep, l.mem, len, tern_rkey_addr(r.rkey), r.rkey, &op), &c);
        post(tern_ep_send(p->a.ep, 3, l.mem, p->a.attr.max_send, &op), &c);
        n += 2;
    }
    unsigned early = c.done;
    tern_rkey_release(r.rkey);
    r.rkey = NULL;
    tern_transport_close(p->a.tp);
    p->a.tp = NULL;
    assert_int_equal(c.done, n);
    assert_int_equal(c.failed, n - early);
    if (n > early)
        assert_int_equal(c.last_fail, TERN_ERR_CANCELED);
    tern_rkey_release(l.rkey); /* on b's endpoint */
    free(l.mem);               /* its registration went with a's transport */
    tern_mr_dereg(r.mr);
    /* Put chunks already in b's receive queue are checked against r's
     * registration as b progresses, and refused now that it is gone; r's
     * memory stays until b is closed all the same, since ucx does not promise
     * to revoke keys (attr.revokes_keys). */
    tern_transport_close(p->b.tp);
    p->b.tp = NULL;
    p->b.ep = NULL;
    free(r.mem);
}

/* A CANCELED callback may destroy its endpoint while the endpoint's own
 * destroy, or the transport's close, is under way: a no-op (the endpoint is
 * freed once the callbacks have run), not a use of freed memory. */
typedef struct redestroy {
    tern_ep_t *ep;
    unsigned done, canceled;
} redestroy_t;

static void redestroy_cb(void *arg, tern_status_t st)
{
    redestroy_t *r = arg;
    r->done++;
    r->canceled += st == TERN_ERR_CANCELED;
    if (st != TERN_OK)
        tern_ep_destroy(r->ep); /* "on error, drop the connection" */
}

/* Sends of max_send on ep to b, which does not progress: rendezvous, in flight. */
static unsigned post_stuck_sends(tern_ep_t *ep, size_t len, uint8_t *buf, redestroy_t *r)
{
    tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB, .cb = redestroy_cb, .cb_arg = r};
    unsigned inflight = 0;

    for (int i = 0; i < 4; i++) {
        tern_status_t st = tern_ep_send(ep, 10 + i, buf, len, &op);
        if (st == TERN_INPROGRESS)
            inflight++;
        else if (st != TERN_OK)
            fail_msg("send: %s: %s", tern_status_name(st), tern_last_error());
    }
    return inflight;
}

static void test_destroy_from_cancel_callback(void **state)
{
    pair_t *p = *state;
    const size_t len = p->a.attr.max_send;
    uint8_t *buf = malloc(len);
    side_t *sc = calloc(1, sizeof(*sc));
    redestroy_t r = {0};
    comp_t c = {0};
    tern_op_params_t w = with_cb(&c, NULL);
    unsigned inflight;

    assert_non_null(buf);
    assert_non_null(sc);
    fill(buf, len, 4);

    /* tern_ep_destroy: every CANCELED callback destroys the endpoint again.
     * From a third transport, so that a's endpoint is fresh for the close. */
    tern_transport_t *tc = open_ucx(2, sc, 0);
    r.ep = connect_one(tc, p->b.tp, 1);
    post(tern_ep_send(r.ep, 1, "x", 1, &w), &c);
    uint64_t until = tern_clock_ns() + 60 * SEC;
    while (!(c.done == 1 && p->b.nev == 1)) {
        if (tern_clock_ns() > until)
            fail_msg("timed out waiting for a first send");
        tern_transport_progress(tc);
        tern_transport_progress(p->b.tp);
    }
    inflight = post_stuck_sends(r.ep, len, buf, &r);
    assert_true(inflight > 0);
    tern_ep_destroy(r.ep);
    assert_int_equal(r.done, inflight);
    assert_int_equal(r.canceled, inflight);
    tern_transport_close(tc);
    free(sc);

    /* tern_transport_close: the same for the endpoint it is closing. */
    post(tern_ep_send(p->a.ep, 2, "y", 1, &w), &c);
    PUMP(p, c.done == 2 && count(&p->b, TERN_EVENT_RECV) == 2, "a send from a");
    memset(&r, 0, sizeof(r));
    r.ep = p->a.ep;
    inflight = post_stuck_sends(p->a.ep, len, buf, &r);
    assert_true(inflight > 0);
    tern_transport_close(p->a.tp);
    p->a.tp = NULL;
    p->a.ep = NULL;
    assert_int_equal(r.done, inflight);
    assert_int_equal(r.canceled, inflight);
    assert_int_equal(c.failed, 0);
    free(buf);
}

/* Teardown with thousands of small sends waiting in UCX. */
enum { BACKLOG = 6000, BACKLOG_MAX_POSTS = 400000, BACKLOG_MSG = 200 };

/* What the receiving transport of the backlog tests gets: RECVs by imm.
 * Written by the thread progressing it, read once that thread has stopped
 * (recv also while it runs). */
typedef struct tally {
    uint8_t *got; /* RECVs of imm i, for i < n */
    uint32_t n;
    atomic_uint recv;
    unsigned dup, stray, lost;
} tally_t;

static void tally_event(const tern_event_t *ev, void *arg)
{
    tally_t *t = arg;
    if (ev->type == TERN_EVENT_RECV) {
        if (ev->imm < t->n) {
            t->dup += t->got[ev->imm] != 0;
            t->got[ev->imm] = 1;
        } else {
            t->stray++;
        }
        atomic_fetch_add(&t->recv, 1);
    } else if (ev->type == TERN_EVENT_ERROR && ev->status == TERN_ERR_PEER_LOST) {
        t->lost++;
    }
}

static void status_cb(void *arg, tern_status_t st)
{
    *(tern_status_t *)arg = st;
}

typedef struct pumper {
    tern_transport_t *tp;
    atomic_int stop;
} pumper_t;

static void *pump_thread(void *arg)
{
    pumper_t *pm = arg;
    while (!atomic_load(&pm->stop))
        tern_transport_progress(pm->tp);
    return NULL;
}

/*
 * a posts small sends to b, which does not progress, until BACKLOG of them
 * wait in UCX (a full FIFO on sm, full socket buffers on tcp), then destroys
 * its endpoint; b progresses meanwhile (busy_peer: in a thread of its own, as
 * another process would) or only afterwards. Every send completes, and b
 * gets exactly those that completed TERN_OK, none that completed
 * TERN_ERR_CANCELED, however many were canceled (the cancel list once
 * stopped at 4096). UCX packs a queued small send from the op's copy when it
 * goes out: the op must outlive that (the sanitizer run sees it; b would also
 * see malformed headers or stray imms).
 */
static void backlog_destroy(int busy_peer)
{
    tally_t ta = {0}, tb = {0};
    tern_transport_t *a = open_ucx_ev(0, tally_event, &ta, 0);
    tern_transport_t *b = open_ucx_ev(1, tally_event, &tb, 0);
    tern_ep_t *ab = connect_one(a, b, 1), *ba = connect_one(b, a, 0);
    tern_status_t *st = malloc(BACKLOG_MAX_POSTS * sizeof(*st));
    uint8_t msg[BACKLOG_MSG];
    unsigned n = 0, waiting = 0, ok = 0, canceled = 0, other = 0, mismatch = 0, first_bad = 0;
    pumper_t pm = {.tp = b};
    pthread_t th;
    uint64_t until;
    int timed_out = 0;

    tb.n = BACKLOG_MAX_POSTS;
    tb.got = calloc(tb.n, 1);
    assert_non_null(st);
    assert_non_null(tb.got);
    memset(msg, 0x6d, sizeof(msg));
    /* Connected first; the warm-up's imm is past the tally (a stray). */
    assert_true(tern_ep_send(ab, BACKLOG_MAX_POSTS, "x", 1, NULL) >= 0);
    until = tern_clock_ns() + 60 * SEC;
    while (tb.stray == 0) {
        if (tern_clock_ns() > until)
            fail_msg("timed out waiting for the warm-up send");
        tern_transport_progress(a);
        tern_transport_progress(b);
    }
    while (waiting < BACKLOG && n < BACKLOG_MAX_POSTS) {
        tern_op_params_t op = {.field_mask = TERN_OP_PARAM_CB, .cb = status_cb, .cb_arg = &st[n]};
        tern_status_t r;
        st[n] = TERN_INPROGRESS;
        r = tern_ep_send(ab, n, msg, sizeof(msg), &op);
        if (r == TERN_OK)
            st[n] = TERN_OK;
        else if (r == TERN_INPROGRESS)
            waiting++;
        else
            fail_msg("send %u: %s: %s", n, tern_status_name(r), tern_last_error());
        n++;
    }
    print_message("%u sends, %u of them waiting in UCX\n", n, waiting);
    assert_true(waiting >= BACKLOG);

    if (busy_peer)
        assert_int_equal(pthread_create(&th, NULL, pump_thread, &pm), 0);
    tern_ep_destroy(ab);
    for (unsigned i = 0; i < n; i++) {
        if (st[i] == TERN_OK)
            ok++;
        else if (st[i] == TERN_ERR_CANCELED)
            canceled++;
        else
            other++; /* not completed, or another status */
    }
    print_message("after the destroy: %u sent, %u canceled, %u other\n", ok, canceled, other);
    /* b gets every send completed as sent (and the warm-up)... */
    until = tern_clock_ns() + 60 * SEC;
    while (atomic_load(&tb.recv) < ok + 1 && !(timed_out = tern_clock_ns() > until)) {
        tern_transport_progress(a);
        if (!busy_peer)
            tern_transport_progress(b);
    }
    /* ... and, however long it goes on, none canceled. */
    for (int i = 0; i < 5000; i++) {
        tern_transport_progress(a);
        if (!busy_peer)
            tern_transport_progress(b);
    }
    if (busy_peer) {
        atomic_store(&pm.stop, 1);
        pthread_join(th, NULL);
    }
    for (int i = 0; i < 100; i++)
        tern_transport_progress(b);
    for (unsigned i = 0; i < n; i++)
        if ((st[i] == TERN_OK) != (tb.got[i] != 0) && mismatch++ == 0)
            first_bad = i;
    print_message("b received %u\n", atomic_load(&tb.recv));
    if (mismatch > 0)
        fail_msg("%u sends delivered against their status (first: send %u, %s, %s)", mismatch,
                 first_bad, tern_status_name(st[first_bad]),
                 tb.got[first_bad] ? "delivered" : "not delivered");
    assert_false(timed_out);
    assert_int_equal(tb.dup, 0);
    assert_int_equal(tb.stray, 1);
    assert_int_equal(other, 0);
    tern_ep_destroy(ba);
    tern_transport_close(a);
    tern_transport_close(b);
    free(tb.got);
    free(st);
}

static void test_ep_destroy_backlog(void **state)
{
    (void)state;
    backlog_destroy(0);
}

static void test_ep_destroy_backlog_busy_peer(void **state)
{
    (void)state;
    backlog_destroy(1);
}

/* A get to a peer that is gone completes with TERN_ERR_PEER_LOST while the
 * caller sleeps on the transport's fd: on shared memory UCX never finishes
 * it, and the provider gives up on it after a second. The fd must wake for
 * that, not sleep on. 64 KiB: under TERN_UCX_CMA's default, through UCX. */
static void test_lost_peer_get_wakes_fd(void **state)
{
    pair_t *p = *state;
    const size_t len = 64 * 1024;
    const int fd = tern_transport_fd(p->a.tp);
    region_t l, r;
    comp_t c = {0};
    tern_op_params_t op;
    tern_status_t st;
    unsigned sleeps = 0;

    region(p, &l, len, RW, 0);
    region(p, &r, len, RW, 1);
    op = with_cb(&c, l.mr);
    post(tern_ep_send(p->a.ep, 1, "x", 1, &op), &c);
    PUMP(p, c.done == 1 && p->b.nev == 1, "a first send");
    c.done = 0;
    tern_transport_close(p->b.tp);
    p->b.tp = NULL;
    p->b.ep = NULL;
    st = tern_ep_get(p->a.ep, l.mem, len, tern_rkey_addr(r.rkey), r.rkey, &op);
    if (st == TERN_INPROGRESS) {
        const uint64_t until = tern_clock_ns() + 60 * SEC;
        while (c.done == 0) {
            if (tern_clock_ns() > until)
                fail_msg("the get to a lost peer did not complete");
            while (tern_transport_progress(p->a.tp) > 0)
                ;
            if (c.done > 0 || tern_transport_arm(p->a.tp) != TERN_OK)
                continue;
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            sleeps++;
            if (poll(&pfd, 1, 10000) == 0)
                fail_msg("armed with a get to a lost peer in flight, the fd did not wake in 10 s");
        }
        assert_int_equal(c.done, 1);
        assert_int_equal(c.last, TERN_ERR_PEER_LOST);
    } else {
        assert_int_equal(st, TERN_ERR_PEER_LOST); /* known lost already: refused */
    }
    print_message("get: %s after %u sleeps on the fd\n", tern_status_name(c.done ? c.last : st),
                  sleeps);
    PUMP(p, count(&p->a, TERN_EVENT_ERROR) >= 1, "the loss event");
    assert_int_equal(nth(&p->a, TERN_EVENT_ERROR, 0)->status, TERN_ERR_CLOSED); /* b closed */
    tern_rkey_release(r.rkey);
    free(r.mem); /* its registration went with b's transport */
    region_free(&l);
}

/* A put with immediate reaches the target in posting order with the sends
 * and refusals around it, as an RC write with immediate does: its
 * TERN_EVENT_PUT_IMM before the RECV of a send posted after it, two puts'
 * events in their order. 32 KiB puts go through UCX everywhere (under
 * TERN_UCX_CMA's default): their flush needs the target's progress, so what
 * follows is posted while the notify still waits for it. */
static void test_put_imm_order(void **state)
{
    pair_t *p = *state;
    const size_t half = 32 * 1024;
    const size_t pre = p->a.attr.inline_prefix;
    region_t l, r;
    comp_t c = {0};
    uint8_t ibuf[TERN_INLINE_PREFIX_MAX + 8];

    region(p, &l, 2 * half, RW, 0);
    region(p, &r, 2 * half, RW, 1);
    for (uint32_t round = 0; round < 10; round++) {
        const uint32_t imm = 1000 + 10 * round;
        const uint64_t raddr = tern_rkey_addr(r.rkey);
        const tern_event_type_t want[] = {TERN_EVENT_PUT_IMM, TERN_EVENT_RECV, TERN_EVENT_PUT_IMM,
                                          TERN_EVENT_ERROR, TERN_EVENT_RECV};
        tern_op_params_t op = with_cb(&c, l.mr), sop = with_cb(&c, NULL);
        unsigned posted = 0;

        forget_events(&p->b);
        c.done = 0;
        fill(l.mem, 2 * half, (uint8_t)round);
        memset(r.mem, 0, 2 * half);
        op.field_mask |= TERN_OP_PARAM_IMM;
        op.imm = imm;
        post(tern_ep_put(p->a.ep, l.mem, half, raddr, r.rkey, &op), &c);
        post(tern_ep_send(p->a.ep, imm + 1, "after", 5, &sop), &c);
        op.imm = imm + 2;
        post(tern_ep_put(p->a.ep, l.mem + half, half, raddr + half, r.rkey, &op), &c);
        posted = 3;
        /* Refused (out of bounds): the target hears it in turn. */
        op.imm = imm + 3;
        assert_int_equal(tern_ep_put(p->a.ep, l.mem, 8, raddr + 2 * half, r.rkey, &op),
                         TERN_ERR_ACCESS);
        memset(ibuf, 0, sizeof(ibuf));
        memcpy(ibuf + pre, "inline!", 8);
        assert_int_equal(tern_ep_send_inline(p->a.ep, imm + 4, ibuf, 8), TERN_OK);
        PUMP(p, c.done == posted && p->b.nev == 5, "two puts with immediate and what follows");
        assert_int_equal(c.failed, 0);
        for (unsigned k = 0; k < 5; k++)
            if (p->b.ev[k].type != want[k] || p->b.ev[k].imm != imm + k)
                fail_msg("round %u, event %u: type %d imm %u, expected type %d imm %u (out of "
                         "posting order)",
                         round, k, p->b.ev[k].type, p->b.ev[k].imm, want[k], imm + k);
        assert_true(same(r.mem, 2 * half, (uint8_t)round));
        assert_int_equal(p->b.ev[3].status, TERN_ERR_ACCESS);
        assert_memory_equal(p->b.data[4], "inline!", 8);
    }
    region_free(&l);
    region_free(&r);
}

/* The child of test_peer_dies_with_gets_queued: gets of n * len bytes from
 * the parent's region, then it stops reading (and is killed). It reports by
 * exit status only: cmocka's asserts belong to the parent. */
static void getter_child(const uint8_t *addr, size_t alen, const uint8_t *key, size_t klen,
                         size_t len, unsigned n, int up, int back)
{
    tern_transport_params_t params = {
        .field_mask = TERN_TRANSPORT_PARAM_PROVIDER | TERN_TRANSPORT_PARAM_SELF_ID,
        .provider = "ucx",
        .self_id = 0,
    };
    tern_transport_t *tp = NULL;
    tern_ep_t *ep = NULL;
    tern_rkey_t *rk = NULL;
    tern_mr_t *mr = NULL;
    uint8_t *mem = malloc(n * len);

    setenv("TERN_UCX_CMA", "0", 1); /* every get answered through the FIFO, none by cma */
    if (mem == NULL || tern_transport_open(&params, &tp) != TERN_OK ||
        tern_ep_create(tp, 1, addr, alen, &ep) != TERN_OK ||
        tern_rkey_unpack(ep, key, klen, &rk) != TERN_OK ||
        tern_mr_reg(tp, mem, n * len, NULL, &mr) != TERN_OK)
        _exit(2);
    if (back >= 0) {
        /* The parent connects back, as every rank of a job does. */
        uint8_t mine[TERN_ADDR_MAX];
        size_t mlen = sizeof(mine);
        uint32_t l32;
        char go;
        if (tern_transport_address(tp, mine, &mlen) != TERN_OK)
            _exit(5);
        l32 = (uint32_t)mlen;
        if (write(up, &l32, sizeof(l32)) != sizeof(l32) || write(up, mine, mlen) != (ssize_t)mlen ||
            read(back, &go, 1) != 1)
            _exit(6);
    }
    tern_op_params_t op = {.field_mask = TERN_OP_PARAM_MR, .mr = mr};
    for (unsigned i = 0; i < n; i++) {
        tern_status_t st = tern_ep_get(ep, mem + i * len, len, tern_rkey_addr(rk), rk, &op);
        if (st != TERN_OK && st != TERN_INPROGRESS)
            _exit(3);
    }
    for (int i = 0; i < 100; i++)
        tern_transport_progress(tp);
    if (write(up, "g", 1) != 1)
        _exit(4);
    for (;;)
        pause(); /* reads nothing more: the answers queue up at the parent */
}

enum gets_queued_peer {
    PEER_DIES,            /* killed once answers queue up for it */
    PEER_STOPS,           /* stays alive, reading nothing, while we close */
    PEER_STOPS_CONNECTED, /* the same, with our endpoint to it as well */
};

/* A peer on this host that stops reading with gets in flight (TERN_UCX_CMA=0
 * in it: all answered through the FIFO) leaves answers queued for it. When
 * UCX answered them itself, UCX 1.13 could not purge them without crashing
 * (docs/transport-ucx.md, "Known UCX 1.13 faults"); tern's own answers are
 * purged safely. A peer that dies: told by its notice channel hanging up
 * unannounced, the target parks its worker at close, and closes. A peer that
 * stops, alive: the target closes under it, neither crashing nor hanging. */
static void gets_queued(enum gets_queued_peer how)
{
    static side_t b;
    const size_t len = 4u << 20;
    const unsigned n = 8;
    uint8_t addr[TERN_ADDR_MAX], key[TERN_RKEY_MAX];
    size_t alen = sizeof(addr), klen = sizeof(key);
    tern_transport_attr_t at;
    tern_mr_t *mr = NULL;
    tern_ep_t *back_ep = NULL;
    int up[2], back[2] = {-1, -1};
    char c;

    memset(&b, 0, sizeof(b));
    b.tp = open_ucx(1, &b, 0);
    tern_transport_query(b.tp, &at);
    if (!at.host_shm) { /* UCX detects a lost tcp peer, and tern serves gets there */
        tern_transport_close(b.tp);
        skip();
    }
    uint8_t *mem = malloc(len);
    assert_non_null(mem);
    fill(mem, len, 9);
    assert_int_equal(tern_mr_reg(b.tp, mem, len, NULL, &mr), TERN_OK);
    assert_int_equal(tern_mr_pack(mr, key, &klen), TERN_OK);
    assert_int_equal(tern_transport_address(b.tp, addr, &alen), TERN_OK);
    assert_int_equal(pipe(up), 0);
    if (how == PEER_STOPS_CONNECTED)
        assert_int_equal(pipe(back), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(up[0]);
        if (back[1] >= 0)
            close(back[1]);
        getter_child(addr, alen, key, klen, len, n, up[1], back[0]);
    }
    close(up[1]);
    if (how == PEER_STOPS_CONNECTED) {
        uint8_t theirs[TERN_ADDR_MAX];
        uint32_t l32 = 0;
        close(back[0]);
        if (read(up[0], &l32, sizeof(l32)) != sizeof(l32) || l32 > sizeof(theirs) ||
            read(up[0], theirs, l32) != (ssize_t)l32) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fail_msg("the child did not send its address");
        }
        assert_int_equal(tern_ep_create(b.tp, 0, theirs, l32, &back_ep), TERN_OK);
        assert_int_equal(write(back[1], "!", 1), 1);
        close(back[1]);
    }
    /* Answer the gets until the child has posted them all and stopped. */
    struct pollfd pfd = {.fd = up[0], .events = POLLIN};
    uint64_t until = tern_clock_ns() + 60 * SEC;
    while (poll(&pfd, 1, 0) == 0) {
        if (tern_clock_ns() > until) {
            kill(pid, SIGKILL);
            fail_msg("the child did not post its gets");
        }
        tern_transport_progress(b.tp);
    }
    ssize_t got = read(up[0], &c, 1);
    close(up[0]);
    if (got != 1) {
        int status = 0;
        waitpid(pid, &status, 0);
        fail_msg("the child failed (exit status %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    assert_int_equal(tern__ucx_parks_at_close(b.tp), 0);
    until = tern_clock_ns() + SEC / 5; /* more answers, into a FIFO no one reads */
    while (tern_clock_ns() < until)
        tern_transport_progress(b.tp);
    int status = 0;
    if (how == PEER_DIES) {
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status));
        until = tern_clock_ns() + 10 * SEC;
        while (!tern__ucx_parks_at_close(b.tp)) {
            if (tern_clock_ns() > until)
                fail_msg("the dead peer went unnoticed");
            tern_transport_progress(b.tp);
        }
    }
    tern_mr_dereg(mr);
    const uint64_t t0 = tern_clock_ns();
    tern_transport_close(b.tp); /* parked: no purge of the queued answers */
    print_message("closed in %.1f ms\n", (double)(tern_clock_ns() - t0) / 1e6);
    if (how != PEER_DIES) {
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(waitpid(pid, &status, 0), pid);
    }
    forget_events(&b);
    free(mem);
}

static void test_peer_dies_with_gets_queued(void **state)
{
    (void)state;
    gets_queued(PEER_DIES);
}

static void test_peer_stops_with_gets_queued(void **state)
{
    (void)state;
    gets_queued(PEER_STOPS);
}

static void test_peer_stops_with_gets_queued_connected(void **state)
{
    (void)state;
    gets_queued(PEER_STOPS_CONNECTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_and_attr, setup, teardown),
        cmocka_unit_test(test_user_zcopy_thresh_warned),
        cmocka_unit_test_setup_teardown(test_send_imm_and_src, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordering_with_rendezvous, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_send, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_get_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_with_imm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kept_maps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_sided_without_target_progress, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_address_and_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ep_destroy_cancels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_transport_closes, setup, teardown),
        cmocka_unit_test(test_peer_closes_before_accepting),
        cmocka_unit_test(test_peer_gone_before_hello),
        cmocka_unit_test_setup_teardown(test_close_cancels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_from_cancel_callback, setup, teardown),
        cmocka_unit_test(test_ep_destroy_backlog),
        cmocka_unit_test(test_ep_destroy_backlog_busy_peer),
        cmocka_unit_test_setup_teardown(test_lost_peer_get_wakes_fd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_imm_order, setup, teardown),
        cmocka_unit_test(test_peer_dies_with_gets_queued),
        cmocka_unit_test(test_peer_stops_with_gets_queued),
        cmocka_unit_test(test_peer_stops_with_gets_queued_connected),
    };
    return cmocka_run_group_tests_name("ucx_smoke", tests, NULL, NULL);
}
