/*
 * The profiler across real ranks (tern-run -n N). Rank 0 drives and profiles;
 * the others serve. Every rank registers the same functions before tern_init.
 *
 * The suite (2+ ranks; the nested parts with 3+):
 *   names   the key_averages rows of every kind of call, as PyTorch names
 *           them: rpc_sync, rpc_async, remote (a class and a function),
 *           RRef methods (sync and async, "Class.method" on the owner),
 *           to_here (of an object and of a value), a handler with ranges of
 *           its own, and a nested call (worker1's handler calls worker2):
 *           names, node ids, kinds and call counts, and no other row; the
 *           shapes and bytes of a call; the table printed to stdout;
 *   timing  every remote event lies inside the RPC event it belongs to, on
 *           rank 0's clock, within the two events' clock error bounds;
 *           event ids are unique; the clock estimates (tern_prof_clock_estimate
 *           and tern_prof_clocks) find rank 1's skew within their bound;
 *   probe   a handler sees the prof bit only when the caller profiles; calls
 *           issued before tern_prof_start (or in an earlier session) have no
 *           events in the session they complete in;
 *   chrome  the trace export is strict JSON (checked by the parser below)
 *           and says what the events say: X events with name, ph, ts, dur,
 *           pid, tid in the order of tern_prof_events, a process_name per
 *           node, remote events on their node's pid, the clocks in
 *           otherData, flow events in s/f pairs; names with quotes,
 *           backslashes and control characters survive the round trip.
 *
 * Modes (argv[1]):
 *   (none)              the suite;
 *   --skew-rank1 N      the suite, rank 1's profiler clock N ns off (rank 1
 *                       sets TERN_CLOCK_SKEW_NS itself before tern_init, as
 *                       tern-run gives every rank the same environment);
 *   --die               3 ranks: a profiled call to a worker that dies in it:
 *                       the call fails, tern_prof_stop returns TERN_OK in
 *                       under 5 s, the failed call is an event, the table and
 *                       the trace are still made; a session after it works;
 *   --memory            2 ranks: TERN_PROF_MEMORY counts what tern allocates
 *                       inside a handler's range;
 *   --job [N]           every rank profiles a ring of eager and rendezvous
 *                       messages, messages to rank 0 from any source, an
 *                       all_reduce and (rank 0) an RPC, then they export one
 *                       trace: a gather while a rank still profiles fails
 *                       everywhere; root holds every node's events, every send
 *                       has one receive that ends after it starts (within the
 *                       bounds, rank 1's clock N ns off), a collective's
 *                       messages are its children, one clock per rank, rows
 *                       on every node, the trace has one arrow per message;
 *                       the others keep their own results.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tern/tern.h>

#include "rank_check.h"

#define MAX_WORLD 8
#define MS ((int64_t)1000000)
#define SEC ((int64_t)1000000000)

static int rank, world;
static tern_ctx_t *ctx;
static atomic_ulong checks;
static atomic_int failures;
static char names[MAX_WORLD][TERN_RPC_NAME_MAX + 1];
static int64_t skew1; /* rank 1's clock skew (--skew-rank1) */

/* A failure that leaves nothing worth running: the rank exits at once
 * (tern-run then stops the others). */

/* A failure recorded; the rank goes on and exits 1 at its end. Returns cond. */
#define EXPECT(cond, ...) expect_((cond), __func__, __LINE__, __VA_ARGS__)
static bool expect_(bool ok, const char *func, int line, const char *fmt, ...) TERN_PRINTF(4, 5);
static bool expect_(bool ok, const char *func, int line, const char *fmt, ...)
{
    atomic_fetch_add(&checks, 1);
    if (ok)
        return true;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, func, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    atomic_fetch_add(&failures, 1);
    return false;
}

static double secs_since(int64_t t0)
{
    return (double)((int64_t)tern_clock_ns() - t0) / 1e9;
}

static void nap_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int64_t skew_of(int r)
{
    return r == 1 ? skew1 : 0;
}

/* ================================================================== */
/* A strict JSON parser (RFC 8259): objects, arrays, strings with every
 * escape (surrogate pairs to UTF-8), numbers, true, false, null; nothing
 * else, and nothing after the value but whitespace. */

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv {
    int type;
    bool b;
    double num;
    char *str; /* J_STR, decoded, NUL-terminated (len bytes) */
    size_t len;
    size_t n; /* J_ARR, J_OBJ: items */
    struct jv *items;
    char **keys; /* J_OBJ */
} jv_t;

typedef struct jp {
    const char *s, *p, *end;
    int depth;
    char err[160];
} jp_t;

static bool jfail(jp_t *j, const char *what)
{
    if (j->err[0] == '\0')
        snprintf(j->err, sizeof(j->err), "%s at byte %td", what, j->p - j->s);
    return false;
}

static void jws(jp_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static void jv_free(jv_t *v)
{
    if (v->type == J_STR)
        free(v->str);
    for (size_t i = 0; i < v->n; i++) {
        jv_free(&v->items[i]);
        if (v->type == J_OBJ)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof(*v));
}

static bool jput(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 32;
        while (c < *len + n + 1)
            c *= 2;
        char *p = realloc(*buf, c);
        if (p == NULL)
            return false;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

static int jhex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    return v;
}

static bool jstring(jp_t *j, char **out, size_t *out_len)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (j->p >= j->end || *j->p != '"')
        return jfail(j, "expected a string");
    j->p++;
    jput(&buf, &len, &cap, "", 0);
    for (;;) {
        if (j->p >= j->end) {
            free(buf);
            return jfail(j, "unterminated string");
        }
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            break;
        }
        if (c < 0x20) {
            free(buf);
            return jfail(j, "raw control character in a string");
        }
        if (c != '\\') {
            jput(&buf, &len, &cap, j->p, 1);
            j->p++;
            continue;
        }
        if (j->end - j->p < 2) {
            free(buf);
            return jfail(j, "unterminated escape");
        }
        char e = j->p[1];
        const char *simple = NULL;
        switch (e) {
        case '"':
            simple = "\"";
            break;
        case '\\':
            simple = "\\";
            break;
        case '/':
            simple = "/";
            break;
        case 'b':
            simple = "\b";
            break;
        case 'f':
            simple = "\f";
            break;
        case 'n':
            simple = "\n";
            break;
        case 'r':
            simple = "\r";
            break;
        case 't':
            simple = "\t";
            break;
        default:
            break;
        }
        if (simple != NULL) {
            jput(&buf, &len, &cap, simple, 1);
            j->p += 2;
            continue;
        }
        if (e != 'u' || j->end - j->p < 6 || jhex4(j->p + 2) < 0) {
            free(buf);
            return jfail(j, "bad escape");
        }
        long cp = jhex4(j->p + 2);
        j->p += 6;
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            free(buf);
            return jfail(j, "lone low surrogate");
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            int lo = j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u' ? jhex4(j->p + 2) : -1;
            if (lo < 0xDC00 || lo > 0xDFFF) {
                free(buf);
                return jfail(j, "high surrogate without its low half");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            j->p += 6;
        }
        char u[4];
        size_t un;
        if (cp < 0x80) {
            u[0] = (char)cp;
            un = 1;
        } else if (cp < 0x800) {
            u[0] = (char)(0xC0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3F));
            un = 2;
        } else if (cp < 0x10000) {
            u[0] = (char)(0xE0 | (cp >> 12));
            u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            u[2] = (char)(0x80 | (cp & 0x3F));
            un = 3;
        } else {
            u[0] = (char)(0xF0 | (cp >> 18));
            u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
            u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
            u[3] = (char)(0x80 | (cp & 0x3F));
            un = 4;
        }
        jput(&buf, &len, &cap, u, un);
    }
    *out = buf;
    *out_len = len;
    return true;
}

static bool jdigits(jp_t *j)
{
    const char *p0 = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > p0;
}

static bool jnumber(jp_t *j, double *out)
{
    const char *p0 = j->p;
    if (j->p < j->end && *j->p == '-')
        j->p++;
    if (j->p < j->end && *j->p == '0')
        j->p++; /* no leading zeros: "01" leaves "1" behind, which fails later */
    else if (!jdigits(j))
        return jfail(j, "bad number");
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (!jdigits(j))
            return jfail(j, "bad fraction");
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (!jdigits(j))
            return jfail(j, "bad exponent");
    }
    char tmp[64];
    size_t n = (size_t)(j->p - p0);
    if (n >= sizeof(tmp))
        return jfail(j, "number too long");
    memcpy(tmp, p0, n);
    tmp[n] = '\0';
    *out = strtod(tmp, NULL);
    if (!isfinite(*out))
        return jfail(j, "number out of range");
    return true;
}

static bool jvalue(jp_t *j, jv_t *v);

static bool jappend(jv_t *v, jv_t *item, char *key)
{
    jv_t *it = realloc(v->items, (v->n + 1) * sizeof(*it));
    if (it == NULL)
        return false;
    v->items = it;
    if (v->type == J_OBJ) {
        char **k = realloc(v->keys, (v->n + 1) * sizeof(*k));
        if (k == NULL)
            return false;
        v->keys = k;
        v->keys[v->n] = key;
    }
    v->items[v->n++] = *item;
    return true;
}

static bool jcontainer(jp_t *j, jv_t *v, bool obj)
{
    char close = obj ? '}' : ']';
    v->type = obj ? J_OBJ : J_ARR;
    j->p++;
    if (++j->depth > 64)
        return jfail(j, "nested too deep");
    jws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        j->depth--;
        return true;
    }
    for (;;) {
        char *key = NULL;
        size_t klen;
        jws(j);
        if (obj) {
            if (!jstring(j, &key, &klen))
                return false;
            jws(j);
            if (j->p >= j->end || *j->p != ':') {
                free(key);
                return jfail(j, "expected ':'");
            }
            j->p++;
        }
        jv_t item;
        memset(&item, 0, sizeof(item));
        jws(j);
        if (!jvalue(j, &item)) {
            free(key);
            jv_free(&item);
            return false;
        }
        if (!jappend(v, &item, key)) {
            free(key);
            jv_free(&item);
            return jfail(j, "out of memory");
        }
        jws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            j->depth--;
            return true;
        }
        return jfail(j, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static bool jliteral(jp_t *j, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
        return jfail(j, "unexpected character");
    j->p += n;
    return true;
}

static bool jvalue(jp_t *j, jv_t *v)
{
    memset(v, 0, sizeof(*v));
    if (j->p >= j->end)
        return jfail(j, "unexpected end");
    switch (*j->p) {
    case '{':
        return jcontainer(j, v, true);
    case '[':
        return jcontainer(j, v, false);
    case '"':
        v->type = J_STR;
        return jstring(j, &v->str, &v->len);
    case 't':
        v->type = J_BOOL;
        v->b = true;
        return jliteral(j, "true");
    case 'f':
        v->type = J_BOOL;
        return jliteral(j, "false");
    case 'n':
        v->type = J_NULL;
        return jliteral(j, "null");
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) {
            v->type = J_NUM;
            return jnumber(j, &v->num);
        }
        return jfail(j, "unexpected character");
    }
}

/* Parse text[0..len) into *v (free with jv_free). On failure, err says why. */
static bool json_parse(const char *text, size_t len, jv_t *v, char *err, size_t errcap)
{
    jp_t j = {.s = text, .p = text, .end = text + len};
    jws(&j);
    bool ok = jvalue(&j, v);
    if (ok) {
        jws(&j);
        if (j.p != j.end)
            ok = jfail(&j, "trailing characters");
    }
    if (!ok) {
        jv_free(v);
        snprintf(err, errcap, "%s", j.err);
    }
    return ok;
}

static const jv_t *jget(const jv_t *o, const char *key)
{
    if (o == NULL || o->type != J_OBJ)
        return NULL;
    const jv_t *found = NULL;
    for (size_t i = 0; i < o->n; i++)
        if (strcmp(o->keys[i], key) == 0) {
            EXPECT(found == NULL, "a JSON object has key '%s' twice", key);
            found = &o->items[i];
        }
    return found;
}

static const jv_t *jget_t(const jv_t *o, const char *key, int type)
{
    const jv_t *v = jget(o, key);
    return v != NULL && v->type == type ? v : NULL;
}

/* The parser itself, on texts whose answer is known. */
static void test_json_parser(void)
{
    static const char *good[] = {
        "{}",
        "[]",
        " [ 1 , -2.5e3 , 0 , 0.5 , 1E+2 , true , false , null ] ",
        "{\"a\": {\"b\": [\"x\", {}]}, \"c\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\"}",
        "\"\"",
        "-0",
    };
    static const char *bad[] = {
        "",        "{",           "[1,]",        "{\"a\":1,}", "[01]",  "[1 2]",
        "{'a':1}", "nul",         "[.5]",        "[1.]",       "[1e]",  "\"\x01\"",
        "\"\\x\"", "\"\\ud800\"", "\"\\udc00\"", "{\"a\" 1}",  "[1]]",  "{\"a\":1} x",
        "[+1]",    "[NaN]",       "\"abc",       "[-]",        "{1:2}",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        jv_t v;
        char err[160];
        bool ok = json_parse(good[i], strlen(good[i]), &v, err, sizeof(err));
        CHECK(ok, "the JSON parser rejects good text %zu '%s': %s", i, good[i], err);
        if (i == 3) {
            const jv_t *c = jget_t(&v, "c", J_STR);
            const char want[] = "\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80";
            CHECK(c != NULL && c->len == strlen(want) && strcmp(c->str, want) == 0,
                  "the JSON parser decodes escapes");
        }
        if (i == 2)
            CHECK(v.type == J_ARR && v.n == 8 && v.items[1].num == -2500 && v.items[4].num == 100,
                  "the JSON parser reads numbers");
        jv_free(&v);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        jv_t v;
        char err[160];
        CHECK(!json_parse(bad[i], strlen(bad[i]), &v, err, sizeof(err)),
              "the JSON parser accepts bad text %zu '%s'", i, bad[i]);
    }
}

/* ================================================================== */
/* Handlers, registered on every rank before tern_init. */

static atomic_int g_finish;

static tern_status_t h_noop(tern_rpc_call_t *call)
{
    (void)call;
    return TERN_OK;
}

static tern_status_t h_finish(tern_rpc_call_t *call)
{
    (void)call;
    atomic_store(&g_finish, 1);
    return TERN_OK;
}

/* Returns one i32: whether this handler records (the request carried the
 * prof bit). */
static tern_status_t h_probe(tern_rpc_call_t *call)
{
    tern_prof_range_t r = tern_prof_range_begin("probe_range");
    tern_tensor_t *t;
    tern_status_t st = tern_rpc_call_alloc_tensor(call, TERN_DTYPE_I32, 1, (int64_t[]){1}, &t);
    if (st == TERN_OK)
        *(int32_t *)t->data = r != 0;
    if (r != 0)
        tern_prof_range_end(r);
    return st;
}

/* Ranges of its own: outer { inner }. */
static tern_status_t h_ranged(tern_rpc_call_t *call)
{
    (void)call;
    tern_prof_range_t o = tern_prof_range_begin("outer");
    tern_prof_range_t i = tern_prof_range_begin("inner");
    nap_ms(1);
    tern_prof_range_end(i);
    nap_ms(1);
    tern_prof_range_end(o);
    return TERN_OK;
}

/* worker1's nest: add its arguments on worker2 and return the sum. */
static tern_status_t h_nest(tern_rpc_call_t *call)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    char leaf[TERN_RPC_NAME_MAX + 1];
    tern_status_t st = tern_rpc_worker_name(ctx, 2, leaf, sizeof(leaf));
    if (st != TERN_OK)
        return st;
    tern_rpc_args_t a = {.tensors = v->tensors, .ntensors = v->ntensors};
    tern_future_t *f;
    st = tern_rpc_sync(ctx, leaf, "add", &a, 10 * SEC, &f);
    if (st != TERN_OK)
        return st;
    const tern_rpc_value_t *r = tern_future_value(f);
    for (size_t i = 0; i < r->ntensors && st == TERN_OK; i++)
        st = tern_rpc_call_return_tensor(call, &r->tensors[i]);
    tern_future_free(f);
    return st;
}

/* The tag of the go-ahead that --die's rank 0 sends once it has posted
 * every call it wants outstanding on the victim. */
#define DIE_GO_TAG 77

static tern_status_t h_die(tern_rpc_call_t *call)
{
    /* Exit only after the caller says so: otherwise the caller can learn of
     * the loss before it posts the call meant to queue behind this one, and
     * that post is then (rightly) refused. */
    char go;
    (void)tern_recv(tern_rpc_call_ctx(call), &go, 1, tern_rpc_call_caller(call), DIE_GO_TAG, NULL);
    fflush(stdout);
    fflush(stderr);
    _exit(0); /* no reply, no finalize: the connections just close */
}

/* A range inside which tern allocates a 1 MiB result. */
static tern_status_t h_alloc(tern_rpc_call_t *call)
{
    tern_prof_range_t r = tern_prof_range_begin("alloc_range");
    tern_tensor_t *t;
    tern_status_t st = tern_rpc_call_alloc_tensor(call, TERN_DTYPE_U8, 1, (int64_t[]){1 << 20}, &t);
    if (st == TERN_OK)
        memset(t->data, 7, 1 << 20);
    tern_prof_range_end(r);
    return st;
}

/* class Counter: an i64 made from the blob (decimal); incr adds the blob's
 * value; get and to_here return it. */
static tern_status_t counter_ctor(tern_rpc_call_t *call, void **obj)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    char b[32] = "";
    memcpy(b, v->blob, v->blob_len < sizeof(b) - 1 ? v->blob_len : sizeof(b) - 1);
    int64_t *c = malloc(sizeof(*c));
    if (c == NULL)
        return tern_rpc_call_fail(call, TERN_ERR_NO_MEMORY, "Counter: no memory");
    *c = atoll(b);
    *obj = c;
    return TERN_OK;
}

static void counter_dtor(void *obj)
{
    free(obj);
}

static tern_status_t counter_value(tern_rpc_call_t *call, int64_t v)
{
    tern_tensor_t *t;
    tern_status_t st = tern_rpc_call_alloc_tensor(call, TERN_DTYPE_I64, 0, NULL, &t);
    if (st == TERN_OK)
        *(int64_t *)t->data = v;
    return st;
}

static tern_status_t counter_incr(tern_rpc_call_t *call)
{
    int64_t *c = tern_rpc_call_self(call);
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    char b[32] = "";
    memcpy(b, v->blob, v->blob_len < sizeof(b) - 1 ? v->blob_len : sizeof(b) - 1);
    *c += atoll(b);
    return counter_value(call, *c);
}

static tern_status_t counter_get(tern_rpc_call_t *call)
{
    return counter_value(call, *(int64_t *)tern_rpc_call_self(call));
}

static void register_all(void)
{
    OK(tern_rpc_register("noop", h_noop));
    OK(tern_rpc_register("finish", h_finish));
    OK(tern_rpc_register("probe", h_probe));
    OK(tern_rpc_register("ranged", h_ranged));
    OK(tern_rpc_register("nest", h_nest));
    OK(tern_rpc_register("die", h_die));
    OK(tern_rpc_register("alloc", h_alloc));
    OK(tern_rpc_register_class("Counter", counter_ctor, counter_dtor));
    OK(tern_rpc_register("Counter.incr", counter_incr));
    OK(tern_rpc_register("Counter.get", counter_get));
    OK(tern_rpc_register("Counter.to_here", counter_get));
}

/* ================================================================== */
/* Calls and results. */

static void serve_until_finished(void)
{
    int64_t t0 = (int64_t)tern_clock_ns();
    while (!atomic_load(&g_finish)) {
        CHECK(secs_since(t0) < 150, "rank 0 never said finish");
        nap_ms(2);
    }
}

static int32_t X[3] = {1, 2, 3}, Y[3] = {10, 20, 30};
static tern_tensor_t XY[2];

static tern_rpc_args_t xy(void)
{
    int64_t n = 3;
    OK(tern_tensor_init(&XY[0], X, TERN_DTYPE_I32, 1, &n, tern_device_cpu()));
    OK(tern_tensor_init(&XY[1], Y, TERN_DTYPE_I32, 1, &n, tern_device_cpu()));
    return (tern_rpc_args_t){.tensors = XY, .ntensors = 2};
}

static tern_rpc_args_t blob(const char *s)
{
    return (tern_rpc_args_t){.blob = s, .blob_len = strlen(s)};
}

/* The i32 tensor of n elements f returned. */
static const int32_t *i32s(tern_future_t *f, int64_t n)
{
    const tern_rpc_value_t *v = tern_future_value(f);
    CHECK(v != NULL && v->ntensors == 1 && v->tensors[0].dtype == TERN_DTYPE_I32 &&
              v->tensors[0].ndim == 1 && v->tensors[0].shape[0] == n,
          "an i32 tensor of %" PRId64, n);
    return v->tensors[0].data;
}

static int64_t i64_of(tern_future_t *f)
{
    const tern_rpc_value_t *v = tern_future_value(f);
    CHECK(v != NULL && v->ntensors == 1 && v->tensors[0].dtype == TERN_DTYPE_I64, "an i64 result");
    return *(const int64_t *)v->tensors[0].data;
}

static void sync_add(const char *to)
{
    tern_rpc_args_t a = xy();
    tern_future_t *f;
    OK(tern_rpc_sync(ctx, to, "add", &a, 0, &f));
    const int32_t *r = i32s(f, 3);
    CHECK(r[0] == 11 && r[1] == 22 && r[2] == 33, "add on %s: %d %d %d", to, r[0], r[1], r[2]);
    tern_future_free(f);
}

static int probe(const char *to)
{
    tern_future_t *f;
    OK(tern_rpc_sync(ctx, to, "probe", NULL, 0, &f));
    int v = i32s(f, 1)[0];
    tern_future_free(f);
    return v;
}

static void call_noop(const char *to, const char *fn)
{
    tern_future_t *f;
    OK(tern_rpc_sync(ctx, to, fn, NULL, 0, &f));
    tern_future_free(f);
}

/* "label#fn(from -> to)", and with "#remote_op: what" after it. */
static const char *call_name(const char *label, const char *fn, int from, int to)
{
    static char buf[8][512];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof(buf[0]), "%s#%s(%s -> %s)", label, fn, names[from], names[to]);
    return b;
}

static const char *remote_op(const char *call, const char *what)
{
    static char buf[8][512];
    static int k;
    char *b = buf[k++ % 8], tmp[sizeof(buf[0])];
    snprintf(tmp, sizeof(tmp), "%s#remote_op: %s", call, what); /* call may be a buf */
    memcpy(b, tmp, sizeof(tmp));
    return b;
}

static void print_table(const char *title)
{
    tern_prof_table_t *t;
    OK(tern_prof_key_averages(0, &t));
    printf("rank 0: %s\n", title);
    OK(tern_prof_table_print(t, stdout, NULL));
    fflush(stdout);
    tern_prof_table_free(t);
}

/* The table printed with options, as a malloc'ed string (through a tmpfile). */
static char *table_text(const tern_prof_table_t *t, const tern_prof_print_t *o)
{
    FILE *f = tmpfile();
    CHECK(f != NULL, "tmpfile: %s", strerror(errno));
    OK(tern_prof_table_print(t, f, o));
    long len = ftell(f);
    CHECK(len > 0, "the printed table is empty");
    char *buf = malloc((size_t)len + 1);
    CHECK(buf != NULL, "no memory");
    rewind(f);
    CHECK(fread(buf, 1, (size_t)len, f) == (size_t)len, "reading the printed table back");
    buf[len] = '\0';
    fclose(f);
    return buf;
}

/* The printed row of name shows calls under Number of Calls and node
 * under Node ID (the 6th and 7th columns after the name). */
static void check_printed_row(const char *what, const char *text, const char *name, uint64_t calls,
                              int node)
{
    char needle[600];
    snprintf(needle, sizeof(needle), "\n%s ", name);
    const char *line = strstr(text, needle);
    if (!EXPECT(line != NULL, "%s: the printed table has no row '%s'", what, name))
        return;
    line += strlen(needle);
    char tok[8][32];
    int k = sscanf(line, "%31s %31s %31s %31s %31s %31s %31s", tok[0], tok[1], tok[2], tok[3],
                   tok[4], tok[5], tok[6]);
    EXPECT(k == 7 && strtoull(tok[5], NULL, 10) == calls && atoi(tok[6]) == node,
           "%s: the printed row '%s' shows %s calls on node %s, want %" PRIu64 " on %d", what, name,
           k == 7 ? tok[5] : "?", k == 7 ? tok[6] : "?", calls, node);
}

static void results(const tern_prof_event_t **ev, size_t *n)
{
    OK(tern_prof_events(ev, n));
}

static size_t count_events(const char *name)
{
    const tern_prof_event_t *ev;
    size_t n, k = 0;
    results(&ev, &n);
    for (size_t i = 0; i < n; i++)
        k += strcmp(ev[i].name, name) == 0;
    return k;
}

/* The first event named name, or NULL. */
static const tern_prof_event_t *event_named(const char *name)
{
    const tern_prof_event_t *ev;
    size_t n;
    results(&ev, &n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(ev[i].name, name) == 0)
            return &ev[i];
    return NULL;
}

static const char *kind_s(unsigned k)
{
    static const char *s[] = {"range", "rpc", "handler", "p2p", "coll", "clock"};
    return k < 6 ? s[k] : "?";
}

/* ================================================================== */
/* Checks on a session's events. */

/* The RPC event remote event e belongs to: the event with e's parent id
 * whose name e's extends with "#remote_op: " (ids should be unique, but if
 * several events share one, this still finds the call); NULL if none.
 * *nsame gets how many events have that id. */
static const tern_prof_event_t *parent_of(const tern_prof_event_t *e, size_t *nsame)
{
    const tern_prof_event_t *ev, *best = NULL;
    size_t n;
    results(&ev, &n);
    *nsame = 0;
    for (size_t i = 0; i < n; i++) {
        const tern_prof_event_t *p = &ev[i];
        if (p->id != e->parent)
            continue;
        (*nsame)++;
        size_t pl = strlen(p->name);
        if (best == NULL && p->kind == TERN_PROF_KIND_RPC && strncmp(e->name, p->name, pl) == 0 &&
            strncmp(e->name + pl, "#remote_op: ", 12) == 0)
            best = p;
    }
    return best;
}

/* Whatever the session: events ordered by start, unique ids, sane times,
 * RPC events with no self time, local events on our clock, remote ones
 * aligned (clock_error_ns >= 0) and inside the RPC event they belong to,
 * within the two events' clock error bounds. Returns the number of remote
 * events. */
static size_t check_events(const char *what)
{
    const tern_prof_event_t *ev;
    size_t n, remote = 0;
    results(&ev, &n);
    /* Failures that repeat over many events: counted, the first one shown. */
    int dup_ids = 0, unordered = 0, rpc_self = 0, shared_parent = 0;
    char dup_ex[512] = "", self_ex[512] = "", shared_ex[512] = "";
    for (size_t i = 0; i < n; i++) {
        const tern_prof_event_t *e = &ev[i];
        if (i > 0 && ev[i - 1].start_ns > e->start_ns)
            unordered++;
        for (size_t j = 0; j < i; j++)
            if (ev[j].id == e->id && dup_ids++ == 0)
                snprintf(dup_ex, sizeof(dup_ex),
                         "'%s' (node %d) and '%s' (node %d) share id %" PRIu64, ev[j].name,
                         ev[j].node, e->name, e->node, e->id);
        EXPECT(e->end_ns >= e->start_ns && e->self_ns >= 0 &&
                   e->self_ns <= e->end_ns - e->start_ns && e->depth >= 0,
               "%s: '%s': start %" PRId64 " end %" PRId64 " self %" PRId64 " depth %d", what,
               e->name, e->start_ns, e->end_ns, e->self_ns, e->depth);
        EXPECT(e->node >= 0 && e->node < world, "%s: '%s' on node %d", what, e->name, e->node);
        if (e->kind == TERN_PROF_KIND_RPC && e->self_ns != 0 && rpc_self++ == 0)
            snprintf(self_ex, sizeof(self_ex), "'%s' (node %d) has self %" PRId64 " ns at depth %d",
                     e->name, e->node, e->self_ns, e->depth);
        if (e->node == 0 && e->parent == 0) {
            EXPECT(e->clock_error_ns == 0, "%s: local '%s' has clock error %" PRId64, what, e->name,
                   e->clock_error_ns);
            EXPECT(strstr(e->name, "#remote_op: ") == NULL, "%s: '%s' has no parent", what,
                   e->name);
            continue;
        }
        /* A remote event. */
        remote++;
        EXPECT(e->parent != 0, "%s: remote '%s' (node %d) has no parent", what, e->name, e->node);
        EXPECT(e->clock_error_ns >= 0,
               "%s: remote '%s' (node %d) is not aligned (clock error %" PRId64 ")", what, e->name,
               e->node, e->clock_error_ns);
        size_t nsame;
        const tern_prof_event_t *p = parent_of(e, &nsame);
        if (nsame > 1 && shared_parent++ == 0)
            snprintf(shared_ex, sizeof(shared_ex),
                     "the parent id %" PRIu64 " of '%s' (node %d) is "
                     "the id of %zu events",
                     e->parent, e->name, e->node, nsame);
        if (!EXPECT(p != NULL,
                    "%s: remote '%s' (node %d): no RPC event it extends has its parent "
                    "id %" PRIu64 " (%zu events have it)",
                    what, e->name, e->node, e->parent, nsame))
            continue;
        int64_t slack = (e->clock_error_ns > 0 ? e->clock_error_ns : 0) +
                        (p->clock_error_ns > 0 ? p->clock_error_ns : 0);
        EXPECT(e->start_ns >= p->start_ns - slack && e->end_ns <= p->end_ns + slack,
               "%s: '%s' (node %d, clock error %" PRId64 ") [%" PRId64 ", %" PRId64
               "] is not inside its call '%s' (node %d, clock error %" PRId64 ") [%" PRId64
               ", %" PRId64 "]: %+" PRId64 " ns at the start, %+" PRId64 " ns at the end",
               what, e->name, e->node, e->clock_error_ns, e->start_ns, e->end_ns, p->name, p->node,
               p->clock_error_ns, p->start_ns, p->end_ns, e->start_ns - p->start_ns,
               p->end_ns - e->end_ns);
    }
    EXPECT(unordered == 0, "%s: %d events out of start order", what, unordered);
    EXPECT(dup_ids == 0,
           "%s: %d pairs of events share an id (tern/prof.h: unique in the results), "
           "e.g. %s",
           what, dup_ids, dup_ex);
    EXPECT(shared_parent == 0, "%s: %d remote events' parents are ambiguous, e.g. %s", what,
           shared_parent, shared_ex);
    EXPECT(rpc_self == 0,
           "%s: %d RPC events have a self time (docs/profiler.md: an RPC call's "
           "row shows a self time of 0; calls nest nothing), e.g. %s",
           what, rpc_self, self_ex);
    return remote;
}

/* The clock estimates find rank r's skew within their bound. */
static void check_clock(const char *what, const tern_prof_clock_t *c, int r, unsigned samples)
{
    int64_t want = skew_of(r);
    int64_t err = c->offset_ns - want;
    printf("rank 0: %s: rank %d offset %" PRId64 " ns (skew %" PRId64 "), bound %" PRId64
           " ns, min rtt %" PRId64 " ns, %u samples\n",
           what, r, c->offset_ns, want, c->error_bound_ns, c->min_rtt_ns, c->samples);
    EXPECT(c->peer == r, "%s: the estimate is for rank %d, want %d", what, c->peer, r);
    EXPECT(llabs(err) <= c->error_bound_ns,
           "%s: rank %d's offset %" PRId64 " is %" PRId64 " ns from its skew %" PRId64
           ", more than the bound %" PRId64,
           what, r, c->offset_ns, err, want, c->error_bound_ns);
    EXPECT(c->error_bound_ns > 0 && c->min_rtt_ns > 0 &&
               c->error_bound_ns == (c->min_rtt_ns + 1) / 2,
           "%s: bound %" PRId64 " for min rtt %" PRId64, what, c->error_bound_ns, c->min_rtt_ns);
    EXPECT(samples == 0 || c->samples == samples, "%s: %u samples, want %u", what, c->samples,
           samples);
}

typedef struct want_row {
    char name[512];
    int node;
    unsigned kind;
    uint64_t calls;
} want_row_t;

/* The table has exactly these rows (any order). */
static void check_rows(const char *what, const tern_prof_table_t *t, const want_row_t *w, size_t nw)
{
    size_t rows = tern_prof_table_rows(t);
    for (size_t i = 0; i < nw; i++) {
        const tern_prof_stat_t *found = NULL;
        for (size_t k = 0; k < rows; k++) {
            const tern_prof_stat_t *r = tern_prof_table_row(t, k);
            if (strcmp(r->name, w[i].name) == 0 && r->node == w[i].node)
                found = r;
        }
        if (!EXPECT(found != NULL, "%s: no row '%s' on node %d", what, w[i].name, w[i].node))
            continue;
        EXPECT(found->calls == w[i].calls, "%s: '%s' on node %d: %" PRIu64 " calls, want %" PRIu64,
               what, w[i].name, w[i].node, found->calls, w[i].calls);
        EXPECT(found->kind == w[i].kind, "%s: '%s' on node %d is a %s row, want %s", what,
               w[i].name, w[i].node, kind_s(found->kind), kind_s(w[i].kind));
    }
    for (size_t k = 0; k < rows; k++) {
        const tern_prof_stat_t *r = tern_prof_table_row(t, k);
        bool known = false;
        for (size_t i = 0; i < nw && !known; i++)
            known = strcmp(r->name, w[i].name) == 0 && r->node == w[i].node;
        EXPECT(known, "%s: an unexpected row '%s' on node %d (%" PRIu64 " calls, %s)", what,
               r->name, r->node, r->calls, kind_s(r->kind));
    }
}

/* ================================================================== */
/* The chrome trace. */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len + 4096 > cap) {
            cap = cap ? cap * 2 : 65536;
            buf = realloc(buf, cap);
            CHECK(buf != NULL, "no memory for %s", path);
        }
        size_t k = fread(buf + *len, 1, cap - *len, f);
        *len += k;
        if (k == 0)
            break;
    }
    fclose(f);
    return buf;
}

typedef struct flow {
    double id;
    int s, f;
    char name[32];
} flow_t;

/*
 * Export the last session and check the file against its events: strict
 * JSON; a "traceEvents" array; one X event per event, in order, with name,
 * ph, ts >= 0, dur >= 0 (the event's), pid (its node), tid (its thread);
 * a process_name for each node with events; otherData.clocks lists each
 * peer in want_peers (a bit mask); flow events come in s/f pairs of one id,
 * two pairs per handler that ran for an RPC event.
 */
static void check_trace(const char *what, const char *path, unsigned want_peers, size_t want_msgs,
                        bool job);

static void check_chrome(const char *what, unsigned want_peers)
{
    char path[] = "/tmp/tern-prof-trace-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
    close(fd);
    OK(tern_prof_export_chrome_trace(path));
    check_trace(what, path, want_peers, 0, false);
}

/* check_chrome's checks of the file at path (removed after), which also
 * holds want_msgs message arrows and says whether it is a job's. */
static void check_trace(const char *what, const char *path, unsigned want_peers, size_t want_msgs,
                        bool job)
{
    size_t len;
    char *text = slurp(path, &len);
    unlink(path);
    jv_t root;
    char err[160];
    if (!EXPECT(json_parse(text, len, &root, err, sizeof(err)), "%s: the trace is not JSON: %s",
                what, err)) {
        fprintf(stderr, "%.*s\n", (int)(len < 4000 ? len : 4000), text);
        free(text);
        return;
    }
    free(text);
    const tern_prof_event_t *ev;
    size_t n;
    results(&ev, &n);

    EXPECT(root.type == J_OBJ, "%s: the trace is not an object", what);
    const jv_t *te = jget_t(&root, "traceEvents", J_ARR);
    const jv_t *other = jget_t(&root, "otherData", J_OBJ);
    EXPECT(te != NULL, "%s: no traceEvents array", what);
    EXPECT(other != NULL, "%s: no otherData object", what);
    const jv_t *clocks = jget_t(other, "clocks", J_ARR);
    EXPECT(clocks != NULL, "%s: no otherData.clocks array", what);
    const jv_t *node = jget_t(other, "tern_node", J_NUM), *isjob = jget_t(other, "job", J_BOOL);
    EXPECT(node != NULL && node->num == 0, "%s: otherData.tern_node is not 0", what);
    EXPECT(isjob != NULL && isjob->b == job, "%s: otherData.job is not %d", what, job);
    unsigned peers = 0;
    for (size_t i = 0; clocks != NULL && i < clocks->n; i++) {
        const jv_t *c = &clocks->items[i];
        const jv_t *peer = jget_t(c, "peer", J_NUM), *off = jget_t(c, "offset_ns", J_NUM),
                   *bound = jget_t(c, "error_bound_ns", J_NUM);
        if (!EXPECT(peer != NULL && off != NULL && bound != NULL,
                    "%s: clock %zu lacks peer, offset_ns or error_bound_ns", what, i))
            continue;
        int p = (int)peer->num;
        peers |= 1u << p;
        EXPECT(fabs(off->num - (double)skew_of(p)) <= bound->num,
               "%s: the trace's clock for rank %d: offset %.0f, bound %.0f, skew %" PRId64, what, p,
               off->num, bound->num, skew_of(p));
    }
    EXPECT((peers & want_peers) == want_peers, "%s: otherData.clocks lists peers 0x%x, want 0x%x",
           what, peers, want_peers);
    if (te == NULL) {
        jv_free(&root);
        return;
    }

    size_t nx = 0, nflows = 0;
    unsigned named = 0, have_nodes = 0;
    flow_t *flows = calloc(te->n + 1, sizeof(*flows));
    CHECK(flows != NULL, "no memory");
    for (size_t i = 0; i < n; i++)
        have_nodes |= 1u << ev[i].node;
    for (size_t i = 0; i < te->n; i++) {
        const jv_t *e = &te->items[i];
        const jv_t *name = jget_t(e, "name", J_STR), *ph = jget_t(e, "ph", J_STR),
                   *pid = jget_t(e, "pid", J_NUM), *tid = jget_t(e, "tid", J_NUM);
        if (!EXPECT(e->type == J_OBJ && name != NULL && ph != NULL && pid != NULL && tid != NULL,
                    "%s: trace event %zu lacks name, ph, pid or tid", what, i))
            continue;
        const jv_t *ts = jget_t(e, "ts", J_NUM);
        if (strcmp(ph->str, "X") == 0) {
            const jv_t *d = jget_t(e, "dur", J_NUM), *args = jget_t(e, "args", J_OBJ);
            EXPECT(ts != NULL && d != NULL && ts->num >= 0 && d->num >= 0,
                   "%s: X event '%s' has no ts >= 0 or dur >= 0", what, name->str);
            EXPECT(jget_t(e, "cat", J_STR) != NULL, "%s: X event '%s' has no cat", what, name->str);
            const jv_t *an = jget_t(args, "node", J_NUM);
            EXPECT(an != NULL && an->num == pid->num, "%s: X event '%s': args.node is not its pid",
                   what, name->str);
            if (nx < n) {
                const tern_prof_event_t *x = &ev[nx];
                EXPECT(strcmp(name->str, x->name) == 0,
                       "%s: X event %zu is '%s', tern_prof_events has '%s'", what, nx, name->str,
                       x->name);
                EXPECT(pid->num == x->node, "%s: X event '%s' on pid %.0f, the event's node is %d",
                       what, name->str, pid->num, x->node);
                EXPECT(tid->num == (double)x->thread, "%s: X event '%s' on tid %.0f, want %" PRIu64,
                       what, name->str, tid->num, x->thread);
                if (d != NULL)
                    EXPECT(fabs(d->num - (double)(x->end_ns - x->start_ns) / 1e3) < 0.002,
                           "%s: X event '%s' dur %.3f us, the event's %.3f", what, name->str,
                           d->num, (double)(x->end_ns - x->start_ns) / 1e3);
                if (strstr(x->name, "#remote_op: ") != NULL && x->node != 0)
                    EXPECT(pid->num != 0, "%s: remote '%s' is on pid 0", what, name->str);
            }
            nx++;
        } else if (strcmp(ph->str, "M") == 0) {
            const jv_t *args = jget_t(e, "args", J_OBJ);
            if (strcmp(name->str, "process_name") == 0) {
                EXPECT(jget_t(args, "name", J_STR) != NULL, "%s: process_name without a name",
                       what);
                named |= 1u << (int)pid->num;
            }
        } else if (strcmp(ph->str, "s") == 0 || strcmp(ph->str, "f") == 0) {
            const jv_t *id = jget_t(e, "id", J_NUM);
            if (!EXPECT(id != NULL && ts != NULL, "%s: flow event %zu has no id or ts", what, i))
                continue;
            if (ph->str[0] == 'f') {
                const jv_t *bp = jget_t(e, "bp", J_STR);
                EXPECT(bp != NULL && strcmp(bp->str, "e") == 0, "%s: flow end without bp 'e'",
                       what);
            }
            size_t k;
            for (k = 0; k < nflows && flows[k].id != id->num; k++)
                ;
            if (k == nflows) {
                flows[nflows].id = id->num;
                snprintf(flows[nflows].name, sizeof(flows[0].name), "%s", name->str);
                nflows++;
            }
            EXPECT(strcmp(flows[k].name, name->str) == 0, "%s: flow %.0f is '%s' and '%s'", what,
                   id->num, flows[k].name, name->str);
            if (ph->str[0] == 's')
                flows[k].s++;
            else
                flows[k].f++;
        } else {
            EXPECT(false, "%s: trace event %zu has ph '%s'", what, i, ph->str);
        }
    }
    EXPECT(nx == n, "%s: %zu X events for %zu events", what, nx, n);
    EXPECT((named & have_nodes) == have_nodes,
           "%s: process_name for nodes 0x%x, events on nodes 0x%x", what, named, have_nodes);
    EXPECT(named & 1, "%s: no process_name for node 0", what);
    int bad_pairs = 0;
    for (size_t k = 0; k < nflows; k++)
        if (flows[k].s != 1 || flows[k].f != 1)
            if (bad_pairs++ == 0)
                EXPECT(false, "%s: flow id %.0f ('%s') has %d starts and %d ends, want one each",
                       what, flows[k].id, flows[k].name, flows[k].s, flows[k].f);
    EXPECT(bad_pairs == 0, "%s: %d flow ids are not one s/f pair", what, bad_pairs);
    /* A request and a reply arrow for each handler that ran for an RPC, and
     * one per message whose two ends are in the results. */
    size_t handlers = 0, nmsgs = 0;
    for (size_t k = 0; k < nflows; k++)
        nmsgs += strcmp(flows[k].name, "message") == 0;
    EXPECT(nmsgs == want_msgs, "%s: %zu message arrows, want %zu", what, nmsgs, want_msgs);
    for (size_t i = 0; i < n; i++) {
        size_t nsame;
        const tern_prof_event_t *p = ev[i].parent ? parent_of(&ev[i], &nsame) : NULL;
        handlers +=
            ev[i].kind == TERN_PROF_KIND_HANDLER && p != NULL && p->kind == TERN_PROF_KIND_RPC;
    }
    EXPECT(nflows - nmsgs == 2 * handlers, "%s: %zu RPC flow ids for %zu handlers (want two each)",
           what, nflows - nmsgs, handlers);
    printf("rank 0: %s: the trace holds %zu events, %zu flows, clocks of peers 0x%x\n", what, nx,
           nflows, peers);
    free(flows);
    jv_free(&root);
}

/* ================================================================== */
/* The suite (rank 0). */

static void add_row(want_row_t *w, size_t *n, const char *name, int node, unsigned kind,
                    uint64_t calls)
{
    CHECK(*n < 64, "too many rows");
    snprintf(w[*n].name, sizeof(w[0].name), "%s", name);
    w[*n].node = node;
    w[*n].kind = kind;
    w[*n].calls = calls;
    (*n)++;
}

/* a: every kind of call in one session; b: its timing; e: its trace. */
static void test_calls(void)
{
    enum {
        RPC = TERN_PROF_KIND_RPC,
        HANDLER = TERN_PROF_KIND_HANDLER,
        RANGE = TERN_PROF_KIND_RANGE
    };
    const bool nested = world >= 3;
    tern_prof_config_t cfg = {.field_mask = TERN_PROF_CFG_FLAGS, .flags = TERN_PROF_SHAPES};
    OK(tern_prof_start(ctx, &cfg));
    CHECK(tern_prof_enabled(), "the session runs");
    tern_prof_range_t drv = tern_prof_range_begin("driver");
    CHECK(drv != 0, "a range in a session");

    const char *w1 = names[1];
    for (int i = 0; i < 3; i++)
        sync_add(w1);
    tern_future_t *fs[2];
    tern_rpc_args_t a = xy();
    for (int i = 0; i < 2; i++)
        OK(tern_rpc_async(ctx, w1, "mul", &a, 0, &fs[i]));
    for (int i = 0; i < 2; i++) {
        OK(tern_future_wait(fs[i], -1));
        const int32_t *r = i32s(fs[i], 3);
        CHECK(r[0] == 10 && r[1] == 40 && r[2] == 90, "mul");
        tern_future_free(fs[i]);
    }
    /* A remote object, its methods (sync and async), its to_here. */
    tern_rref_t *obj, *val;
    tern_rpc_args_t five = blob("5"), two = blob("2");
    OK(tern_remote(ctx, w1, "Counter", &five, 0, &obj));
    tern_future_t *f;
    for (int i = 0; i < 2; i++) {
        OK(tern_rref_rpc_sync(obj, "incr", &two, 0, &f));
        CHECK(i64_of(f) == 7 + 2 * i, "Counter.incr: %" PRId64, i64_of(f));
        tern_future_free(f);
    }
    OK(tern_rref_rpc_async(obj, "get", NULL, 0, &f));
    OK(tern_future_wait(f, -1));
    CHECK(i64_of(f) == 9, "Counter.get: %" PRId64, i64_of(f));
    tern_future_free(f);
    OK(tern_rref_to_here(obj, 0, &f));
    CHECK(i64_of(f) == 9, "Counter.to_here: %" PRId64, i64_of(f));
    tern_future_free(f);
    /* A value made by a function, fetched: to_here runs no handler. */
    OK(tern_remote(ctx, w1, "add", &a, 0, &val));
    OK(tern_rref_to_here(val, 0, &f));
    CHECK(i32s(f, 3)[2] == 33, "to_here of add's value");
    tern_future_free(f);
    /* A handler with ranges of its own. */
    call_noop(w1, "ranged");
    /* Nested: worker1's handler calls worker2. */
    if (nested) {
        for (int i = 0; i < 2; i++) {
            OK(tern_rpc_sync(ctx, w1, "nest", &a, 0, &f));
            const int32_t *r = i32s(f, 3);
            CHECK(r[0] == 11 && r[1] == 22 && r[2] == 33, "nest: %d %d %d", r[0], r[1], r[2]);
            tern_future_free(f);
        }
    }
    tern_prof_range_end(drv);
    OK(tern_prof_stop());
    CHECK(!tern_prof_enabled(), "stopped");
    tern_rref_release(obj);
    tern_rref_release(val);
    print_table("every kind of call");

    /* a: the rows. */
    want_row_t w[64];
    size_t nw = 0;
    const char *c;
    add_row(w, &nw, "driver", 0, RANGE, 1);
    c = call_name("rpc_sync", "add", 0, 1);
    add_row(w, &nw, c, 0, RPC, 3);
    add_row(w, &nw, remote_op(c, "add"), 1, HANDLER, 3);
    c = call_name("rpc_async", "mul", 0, 1);
    add_row(w, &nw, c, 0, RPC, 2);
    add_row(w, &nw, remote_op(c, "mul"), 1, HANDLER, 2);
    c = call_name("remote", "Counter", 0, 1);
    add_row(w, &nw, c, 0, RPC, 1);
    add_row(w, &nw, remote_op(c, "Counter"), 1, HANDLER, 1);
    c = call_name("rpc_sync", "incr", 0, 1);
    add_row(w, &nw, c, 0, RPC, 2);
    add_row(w, &nw, remote_op(c, "Counter.incr"), 1, HANDLER, 2);
    c = call_name("rpc_async", "get", 0, 1);
    add_row(w, &nw, c, 0, RPC, 1);
    add_row(w, &nw, remote_op(c, "Counter.get"), 1, HANDLER, 1);
    c = call_name("rpc_sync", "to_here", 0, 1);
    add_row(w, &nw, c, 0, RPC, 2);
    add_row(w, &nw, remote_op(c, "Counter.to_here"), 1, HANDLER, 1);
    c = call_name("remote", "add", 0, 1);
    add_row(w, &nw, c, 0, RPC, 1);
    add_row(w, &nw, remote_op(c, "add"), 1, HANDLER, 1);
    c = call_name("rpc_sync", "ranged", 0, 1);
    add_row(w, &nw, c, 0, RPC, 1);
    add_row(w, &nw, remote_op(c, "ranged"), 1, HANDLER, 1);
    add_row(w, &nw, remote_op(c, "outer"), 1, RANGE, 1);
    add_row(w, &nw, remote_op(c, "inner"), 1, RANGE, 1);
    if (nested) {
        c = call_name("rpc_sync", "nest", 0, 1);
        add_row(w, &nw, c, 0, RPC, 2);
        add_row(w, &nw, remote_op(c, "nest"), 1, HANDLER, 2);
        const char *inner = remote_op(c, call_name("rpc_sync", "add", 1, 2));
        add_row(w, &nw, inner, 1, RPC, 2);
        add_row(w, &nw, remote_op(inner, "add"), 2, HANDLER, 2);
    }
    tern_prof_table_t *t;
    OK(tern_prof_key_averages(0, &t));
    check_rows("every kind of call", t, w, nw);
    char *text = table_text(t, NULL);
    for (size_t k = 0; k < nw; k++)
        check_printed_row("every kind of call", text, w[k].name, w[k].calls, w[k].node);
    EXPECT(strstr(text, "\nSelf CPU time total: ") != NULL, "the printed table's footer");
    free(text);
    /* Node 1's rows only, with its own footer. */
    tern_prof_print_t only1 = {.field_mask = TERN_PROF_PRINT_NODE, .node = 1};
    text = table_text(t, &only1);
    int64_t self1 = 0;
    for (size_t k = 0; k < nw; k++) {
        char needle[600];
        snprintf(needle, sizeof(needle), "\n%.510s ", w[k].name);
        EXPECT((strstr(text, needle) != NULL) == (w[k].node == 1),
               "the table of node 1 %s '%s' (node %d)", w[k].node == 1 ? "lacks" : "shows",
               w[k].name, w[k].node);
    }
    for (size_t k = 0; k < tern_prof_table_rows(t); k++)
        if (tern_prof_table_row(t, k)->node == 1)
            self1 += tern_prof_table_row(t, k)->self_ns;
    EXPECT(strstr(text, "\nSelf CPU time total (node 1): ") != NULL && self1 > 0,
           "the table of node 1 has its own footer");
    free(text);
    int64_t self = 0;
    for (size_t k = 0; k < tern_prof_table_rows(t); k++)
        self += tern_prof_table_row(t, k)->self_ns;
    EXPECT(self == tern_prof_table_self_total(t), "the self total is the sum of the rows' self");
    tern_prof_table_free(t);

    /* What a call says of itself: bytes (24 in, 12 out), the handler's shapes. */
    const tern_prof_event_t *e = event_named(call_name("rpc_sync", "add", 0, 1));
    CHECK(e != NULL, "an add event");
    EXPECT(e->bytes == 36, "rpc_sync add moved %" PRIu64 " bytes, want 36", e->bytes);
    EXPECT(e->node == 0 && e->kind == TERN_PROF_KIND_RPC && e->clock_error_ns == 0 &&
               e->parent == 0 && e->depth == 0,
           "the add call: node %d kind %s", e->node, kind_s(e->kind));
    e = event_named(remote_op(call_name("rpc_sync", "add", 0, 1), "add"));
    CHECK(e != NULL, "a remote add event");
    EXPECT(strcmp(e->shapes, "[[3], [3]]") == 0, "the remote add's shapes '%s'", e->shapes);
    OK(tern_prof_key_averages(TERN_PROF_BY_SHAPES, &t));
    bool by_shape = false;
    for (size_t k = 0; k < tern_prof_table_rows(t); k++) {
        const tern_prof_stat_t *r = tern_prof_table_row(t, k);
        by_shape |=
            strcmp(r->name, e->name) == 0 && strcmp(r->shapes, "[[3], [3]]") == 0 && r->calls == 3;
    }
    EXPECT(by_shape, "key_averages by shapes has the remote add with its shapes");
    tern_prof_table_free(t);

    /* The handler's own ranges nest under it, on worker1's thread. */
    c = call_name("rpc_sync", "ranged", 0, 1);
    const tern_prof_event_t *hr = event_named(remote_op(c, "ranged")),
                            *ho = event_named(remote_op(c, "outer")),
                            *hi = event_named(remote_op(c, "inner"));
    CHECK(hr != NULL && ho != NULL && hi != NULL, "the ranged handler's events");
    EXPECT(hr->thread == ho->thread && ho->thread == hi->thread,
           "the handler and its ranges are on one thread");
    EXPECT(hr->depth == 0 && ho->depth == 1 && hi->depth == 2, "remote depths %d %d %d, want 0 1 2",
           hr->depth, ho->depth, hi->depth);
    EXPECT(hr->self_ns == (hr->end_ns - hr->start_ns) - (ho->end_ns - ho->start_ns) &&
               ho->self_ns == (ho->end_ns - ho->start_ns) - (hi->end_ns - hi->start_ns),
           "remote self times: handler %" PRId64 " outer %" PRId64, hr->self_ns, ho->self_ns);
    EXPECT(ho->parent == hr->parent && hi->parent == hr->parent,
           "the handler's ranges belong to its call");
    if (nested) {
        const char *nc = call_name("rpc_sync", "nest", 0, 1);
        const tern_prof_event_t *mid =
            event_named(remote_op(nc, call_name("rpc_sync", "add", 1, 2)));
        const tern_prof_event_t *leaf =
            event_named(remote_op(remote_op(nc, call_name("rpc_sync", "add", 1, 2)), "add"));
        CHECK(mid != NULL && leaf != NULL, "the nested events");
        size_t nsame;
        EXPECT(leaf->parent == mid->id && parent_of(leaf, &nsame) != NULL && leaf->node == 2 &&
                   mid->node == 1,
               "worker2's add belongs to worker1's call");
        const tern_prof_event_t *top = parent_of(mid, &nsame);
        EXPECT(top != NULL && strcmp(top->name, nc) == 0 && top->node == 0,
               "worker1's call belongs to rank 0's nest call");
    }

    /* b: timing, on whatever skew rank 1 has. */
    size_t remote = check_events("every kind of call");
    EXPECT(remote == (nested ? 20u : 14u), "%zu remote events", remote);
    const tern_prof_clock_t *cl;
    size_t ncl;
    OK(tern_prof_clocks(&cl, &ncl));
    unsigned seen = 0;
    for (size_t k = 0; k < ncl; k++) {
        check_clock("tern_prof_clocks", &cl[k], cl[k].peer, 100);
        seen |= 1u << cl[k].peer;
    }
    unsigned want = nested ? 6u : 2u;
    EXPECT(seen == want, "tern_prof_clocks lists peers 0x%x, want 0x%x", seen, want);

    /* e: the trace of this session. */
    check_chrome("every kind of call", want);
}

/* b: the estimate, with and without a session. */
static void test_estimates(void)
{
    tern_prof_clock_t c;
    for (int r = 1; r < world; r++) {
        OK(tern_prof_clock_estimate(ctx, r, 0, &c));
        check_clock("tern_prof_clock_estimate", &c, r, 100);
    }
    OK(tern_prof_clock_estimate(ctx, 1, 7, &c));
    check_clock("tern_prof_clock_estimate, 7 samples", &c, 1, 7);
    OK(tern_prof_clock_estimate(ctx, 0, 0, &c));
    EXPECT(c.offset_ns == 0 && c.error_bound_ns == 0, "rank 0 to itself: offset %" PRId64,
           c.offset_ns);
    CHECK(tern_prof_clock_estimate(ctx, world, 0, &c) == TERN_ERR_INVALID_PARAM,
          "a rank out of the world");
    /* During a session too, with refreshes every 1 ms: alignment
     * interpolates between estimates. */
    tern_prof_config_t cfg = {.field_mask =
                                  TERN_PROF_CFG_CLOCK_REFRESH | TERN_PROF_CFG_CLOCK_SAMPLES,
                              .clock_refresh_ns = MS,
                              .clock_samples = 20};
    OK(tern_prof_start(ctx, &cfg));
    OK(tern_prof_clock_estimate(ctx, 1, 0, &c));
    check_clock("tern_prof_clock_estimate in a session", &c, 1, 100);
    for (int i = 0; i < 10; i++) {
        sync_add(names[1]);
        nap_ms(2);
    }
    OK(tern_prof_stop());
    check_events("refreshed clocks");
    const tern_prof_clock_t *cl;
    size_t n;
    OK(tern_prof_clocks(&cl, &n));
    EXPECT(n == 1 && cl[0].peer == 1, "refreshed clocks: %zu peers", n);
    if (n == 1)
        check_clock("tern_prof_clocks (20 samples)", &cl[0], 1, 20);
    EXPECT(count_events(call_name("rpc_sync", "add", 0, 1)) == 10, "10 calls");
}

/* c: the prof bit, and calls from outside the session. */
static void test_probe(void)
{
    const char *w1 = names[1];
    EXPECT(probe(w1) == 0, "a call from an unprofiled caller is not profiled on the target");
    EXPECT(probe(names[0]) == 0, "nor on this worker");
    OK(tern_prof_start(ctx, NULL));
    EXPECT(probe(w1) == 1, "a call from a profiling caller is profiled on the target");
    EXPECT(probe(names[0]) == 1, "and on this worker (a call to itself)");
    OK(tern_prof_stop());
    EXPECT(probe(w1) == 0, "after stop, calls are not profiled");
    const char *c = call_name("rpc_sync", "probe", 0, 1),
               *c0 = call_name("rpc_sync", "probe", 0, 0);
    EXPECT(count_events(c) == 1 && count_events(remote_op(c, "probe")) == 1 &&
               count_events(remote_op(c, "probe_range")) == 1,
           "the profiled probe on worker1: its call, handler and range");
    const tern_prof_event_t *h0 = event_named(remote_op(c0, "probe"));
    EXPECT(count_events(c0) == 1 && h0 != NULL && h0->node == 0 && h0->parent != 0,
           "the profiled probe on this worker: its call and handler (node 0)");
    check_events("probe");
    /* Nothing after stop went into the results. */
    const tern_prof_event_t *ev;
    size_t n;
    results(&ev, &n);
    EXPECT(n == 6, "the probe session has %zu events, want 6", n);

    /* Calls issued before the session: one done, one still out when it
     * starts. Neither has an event. */
    tern_rpc_args_t ms = blob("300");
    tern_future_t *f;
    sync_add(w1);
    OK(tern_rpc_async(ctx, w1, "sleep_ms", &ms, 0, &f));
    OK(tern_prof_start(ctx, NULL));
    if (tern_future_status(f) != TERN_ERR_NO_RESOURCE)
        printf("rank 0: note: the 300 ms sleep issued before the session ended before it began\n");
    OK(tern_future_wait(f, -1));
    tern_future_free(f);
    tern_prof_range_t r = tern_prof_range_begin("in session");
    tern_prof_range_end(r);
    OK(tern_prof_stop());
    results(&ev, &n);
    for (size_t i = 0; i < n; i++)
        EXPECT(strcmp(ev[i].name, "in session") == 0,
               "a call issued before tern_prof_start has an event: '%s'", ev[i].name);
    EXPECT(count_events("in session") == 1, "the session's own range");

    /* A call issued in one session that completes in the next: it belongs
     * to neither (its start is before the second began). */
    OK(tern_prof_start(ctx, NULL));
    OK(tern_rpc_async(ctx, w1, "sleep_ms", &ms, 0, &f));
    OK(tern_prof_stop());
    int64_t t_start2 = tern_prof_clock_ns();
    OK(tern_prof_start(ctx, NULL));
    OK(tern_future_wait(f, -1));
    tern_future_free(f);
    r = tern_prof_range_begin("second session");
    tern_prof_range_end(r);
    OK(tern_prof_stop());
    results(&ev, &n);
    for (size_t i = 0; i < n; i++) {
        int64_t slack = ev[i].clock_error_ns > 0 ? ev[i].clock_error_ns : 0;
        EXPECT(ev[i].start_ns >= t_start2 - slack,
               "an event of the second session starts %.3f ms before it: '%s' (a call issued "
               "in the first session, completed in the second)",
               (double)(t_start2 - ev[i].start_ns) / 1e6, ev[i].name);
    }
    EXPECT(count_events("second session") == 1, "the second session's range");
}

/* e: names with characters JSON must escape survive the trace. */
static void test_escapes(void)
{
    static const char name[] = "esc \"quoted\" back\\slash tab\t ctl\x01\x1f nl\n utf8 \xc3\xa9";
    OK(tern_prof_start(ctx, NULL));
    tern_prof_range_t r = tern_prof_range_begin(name);
    sync_add(names[1]);
    tern_prof_range_end(r);
    OK(tern_prof_stop());
    check_events("escapes");
    EXPECT(count_events(name) == 1, "the escaped range");
    check_chrome("escapes", 2u);
}

static void finish_others(void)
{
    for (int r = 1; r < world; r++)
        call_noop(names[r], "finish");
}

/* ================================================================== */
/* --die: a profiled call to a worker that dies in it. */

static int mode_die(void)
{
    CHECK(world == 3, "--die wants 3 ranks");
    const int victim = 2;
    if (rank == victim) {
        serve_until_finished(); /* "die" ends the process */
        return 1;
    }
    if (rank == 1) {
        serve_until_finished();
        /* Outlive rank 0: serve until it is gone. */
        int64_t t0 = (int64_t)tern_clock_ns();
        for (;;) {
            tern_future_t *f;
            if (tern_rpc_sync(ctx, names[0], "noop", NULL, 2 * SEC, &f) != TERN_OK)
                break;
            tern_future_free(f);
            CHECK(secs_since(t0) < 60, "rank 0 never left");
            nap_ms(20);
        }
        fflush(stdout);
        _exit(0);
    }
    const char *vn = names[victim];
    OK(tern_prof_start(ctx, NULL));
    sync_add(vn); /* the victim's events, and its clock, are in the session */
    sync_add(names[1]);
    tern_future_t *die, *sleep;
    tern_rpc_args_t ms = blob("5000");
    int64_t t0 = (int64_t)tern_clock_ns();
    OK(tern_rpc_async(ctx, vn, "die", NULL, 0, &die));
    OK(tern_rpc_async(ctx, vn, "sleep_ms", &ms, 0, &sleep));
    /* Its delivery is what ends the victim, so the send may see the loss. */
    tern_status_t go = tern_send(ctx, "g", 1, victim, DIE_GO_TAG);
    CHECK(go == TERN_OK || go == TERN_ERR_PEER_LOST, "the go-ahead to %s: %s", vn,
          tern_status_name(go));
    tern_status_t st = tern_future_wait(die, -1);
    printf("rank 0: die on %s: %s after %.3f s: %s\n", vn, tern_status_name(st), secs_since(t0),
           tern_future_error(die));
    CHECK(st == TERN_ERR_PEER_LOST || st == TERN_ERR_TIMEOUT, "the call to the dying worker: %s",
          tern_status_name(st));
    st = tern_future_wait(sleep, 15 * SEC);
    CHECK(st == TERN_ERR_PEER_LOST || st == TERN_ERR_TIMEOUT, "the call queued on it: %s",
          tern_status_name(st));
    tern_future_free(die);
    tern_future_free(sleep);
    sync_add(names[1]);
    t0 = (int64_t)tern_clock_ns();
    st = tern_prof_stop();
    double dt = secs_since(t0);
    printf("rank 0: tern_prof_stop with a dead worker: %s in %.3f s\n", tern_status_name(st), dt);
    CHECK(st == TERN_OK, "tern_prof_stop: %s", tern_status_name(st));
    EXPECT(dt < 5, "tern_prof_stop took %.2f s", dt);
    print_table("a worker that died");

    const char *dc = call_name("rpc_async", "die", 0, victim);
    const tern_prof_event_t *e = event_named(dc);
    EXPECT(e != NULL && e->node == 0 && e->kind == TERN_PROF_KIND_RPC && e->clock_error_ns == 0,
           "the failed call '%s' is an event of this node", dc);
    EXPECT(count_events(call_name("rpc_async", "sleep_ms", 0, victim)) == 1,
           "the call queued behind it is an event");
    EXPECT(count_events(remote_op(dc, "die")) == 0, "no handler event came back from the dead");
    EXPECT(count_events(call_name("rpc_sync", "add", 0, 1)) == 2, "rank 1's calls");
    const tern_prof_event_t *va =
        event_named(remote_op(call_name("rpc_sync", "add", 0, victim), "add"));
    EXPECT(va != NULL && va->node == victim, "the victim's add, from before it died");
    check_events("a worker that died");
    tern_prof_table_t *t;
    OK(tern_prof_key_averages(0, &t));
    EXPECT(count_events("send") == 1, "the go-ahead's send is an event");
    EXPECT(tern_prof_table_rows(t) == 7, "%zu rows, want 7", tern_prof_table_rows(t));
    char *buf = table_text(t, NULL);
    check_printed_row("a worker that died", buf, dc, 1, 0);
    EXPECT(strstr(buf, "Self CPU time total: ") != NULL, "the printed table's footer");
    free(buf);
    tern_prof_table_free(t);
    check_chrome("a worker that died", 2u | (1u << victim));

    /* Estimates of the dead worker fail, and fast. */
    tern_prof_clock_t c;
    t0 = (int64_t)tern_clock_ns();
    st = tern_prof_clock_estimate(ctx, victim, 0, &c);
    EXPECT(st != TERN_OK && secs_since(t0) < 5, "an estimate of the dead worker: %s after %.2f s",
           tern_status_name(st), secs_since(t0));

    /* A session after the death works. */
    t0 = (int64_t)tern_clock_ns();
    OK(tern_prof_start(ctx, NULL));
    sync_add(names[1]);
    OK(tern_prof_stop());
    EXPECT(secs_since(t0) < 5, "a session after the death took %.2f s", secs_since(t0));
    EXPECT(count_events(remote_op(call_name("rpc_sync", "add", 0, 1), "add")) == 1,
           "a session after the death has rank 1's add");
    check_events("after the death");

    call_noop(names[1], "finish");
    int bad = atomic_load(&failures);
    printf("rank 0 %s (%lu checks, %d failed)\n", bad ? "FAILED" : "ok", atomic_load(&checks), bad);
    fflush(stdout);
    fflush(stderr);
    _exit(bad ? 1 : 0); /* finalize would wait for the dead rank */
}

/* ================================================================== */
/* --job: one trace for the whole job (every rank profiles). */

#define JOB_SMALL 64
#define JOB_LARGE (1 << 20) /* past the eager limit: rendezvous */
#define JOB_FLOATS 4096

static size_t count_on(const tern_prof_event_t *ev, size_t n, const char *name, int node)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ev[i].node == node && strcmp(ev[i].name, name) == 0;
    return k;
}

/* What every rank does in its session: a ring of an eager message (blocking
 * send and receive) and a rendezvous one (isend, irecv); a message to rank 0
 * received from any source; an all_reduce; rank 0 calls add on rank 1. */
static void job_work(void)
{
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    static char small_out[JOB_SMALL], small_in[JOB_SMALL];
    static char *large_out, *large_in;
    if (large_out == NULL) {
        large_out = calloc(1, JOB_LARGE);
        large_in = calloc(1, JOB_LARGE);
        CHECK(large_out != NULL && large_in != NULL, "no memory");
    }
    tern_prof_range_t step = tern_prof_range_begin("step");
    tern_request_t *rq[2];
    OK(tern_irecv(ctx, large_in, JOB_LARGE, prev, 2, &rq[0]));
    OK(tern_isend(ctx, large_out, JOB_LARGE, next, 2, &rq[1]));
    OK(tern_send(ctx, small_out, JOB_SMALL, next, 1));
    tern_msg_info_t info;
    OK(tern_recv(ctx, small_in, JOB_SMALL, prev, 1, &info));
    OK(tern_request_wait(rq[0], -1, NULL));
    OK(tern_request_wait(rq[1], -1, NULL));
    if (rank == 0) {
        for (int i = 1; i < world; i++) {
            OK(tern_recv(ctx, small_in, JOB_SMALL, TERN_ANY_SOURCE, 3, &info));
            CHECK(info.source >= 1 && info.source < world, "any source gave %d", info.source);
        }
    } else {
        OK(tern_send(ctx, small_out, JOB_SMALL, 0, 3));
    }
    static float v[JOB_FLOATS];
    for (int i = 0; i < JOB_FLOATS; i++)
        v[i] = (float)rank;
    OK(tern_all_reduce(tern_group_world(ctx), v, v, JOB_FLOATS, TERN_DTYPE_F32, TERN_SUM,
                       NULL));
    CHECK(v[7] == (float)(world * (world - 1) / 2), "all_reduce gave %g", (double)v[7]);
    if (rank == 0)
        sync_add(names[1]);
    tern_prof_range_end(step);
}

/* Does send s have exactly one receive in ev, and does it come after s on
 * the job's clock, within the two events' bounds? */
static const tern_prof_event_t *receive_of(const tern_prof_event_t *ev, size_t n,
                                           const tern_prof_event_t *s)
{
    const tern_prof_event_t *r = NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].dir == TERN_PROF_DIR_RECV && ev[i].node == s->peer && ev[i].peer == s->node &&
            ev[i].seq == s->seq) {
            r = &ev[i];
            k++;
        }
    EXPECT(k <= 1, "send '%s' %d->%d #%" PRIu64 " has %zu receives", s->name, s->node, s->peer,
           s->seq, k);
    return r;
}

static int mode_job(void)
{
    const tern_prof_event_t *ev;
    size_t n;
    char path[] = "/tmp/tern-prof-job-XXXXXX";

    /* A rank whose session still runs: every rank gets the error, root's
     * names the rank, and nothing is lost. */
    if (rank == 1)
        OK(tern_prof_start(ctx, NULL));
    tern_status_t st = tern_prof_gather(ctx, 0);
    EXPECT(st == TERN_ERR_NO_RESOURCE, "a gather while rank 1 profiles: %s", tern_status_name(st));
    if (rank == 0)
        EXPECT(strstr(tern_last_error(), "rank 1") != NULL, "the error names rank 1: %s",
               tern_last_error());
    if (rank == 1)
        OK(tern_prof_stop());
    EXPECT(tern_prof_gather(ctx, world) == TERN_ERR_INVALID_PARAM, "a root out of the world");

    OK(tern_prof_start(ctx, NULL));
    job_work();
    OK(tern_prof_stop());
    OK(tern_prof_events(&ev, &n));
    size_t mine = n;
    EXPECT(count_on(ev, n, "step", rank) == 1, "rank %d's own step range", rank);

    if (rank == 0) {
        int fd = mkstemp(path);
        CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
        close(fd);
    }
    int64_t t0 = (int64_t)tern_clock_ns();
    OK(tern_prof_export_job_trace(ctx, 0, rank == 0 ? path : NULL));
    printf("rank %d: job trace in %.3f s\n", rank, secs_since(t0));
    OK(tern_prof_events(&ev, &n));
    if (rank != 0) {
        EXPECT(n == mine, "rank %d keeps its own %zu events (has %zu)", rank, mine, n);
        return 0;
    }
    EXPECT(n > mine, "root holds the job's %zu events (its own: %zu)", n, mine);

    /* Every rank's work, on its own node. */
    for (int r = 0; r < world; r++) {
        EXPECT(count_on(ev, n, "step", r) == 1, "node %d's step range", r);
        EXPECT(count_on(ev, n, "send", r) == (r == 0 ? 1u : 2u), "node %d's send ranges", r);
        EXPECT(count_on(ev, n, "recv", r) == (r == 0 ? (size_t)world : 1u),
               "node %d's recv ranges: %zu", r, count_on(ev, n, "recv", r));
        EXPECT(count_on(ev, n, "isend", r) == 1 && count_on(ev, n, "irecv", r) == 1,
               "node %d's isend and irecv", r);
        EXPECT(count_on(ev, n, "all_reduce", r) == 1, "node %d's all_reduce", r);
        EXPECT(count_on(ev, n, "all_reduce send", r) >= 1 &&
                   count_on(ev, n, "all_reduce recv", r) >= 1,
               "node %d's all_reduce messages", r);
    }
    EXPECT(count_on(ev, n, remote_op(call_name("rpc_sync", "add", 0, 1), "add"), 1) == 1,
           "rank 0's call's remote add, once");

    /* Every message: one receive, on the receiver's node, after its send. */
    size_t sends = 0, linked = 0, recvs = 0, coll = 0;
    int64_t worst = INT64_MIN;
    for (size_t i = 0; i < n; i++) {
        const tern_prof_event_t *s = &ev[i];
        if (s->dir == TERN_PROF_DIR_RECV && s->seq != 0)
            recvs++;
        if (s->dir != TERN_PROF_DIR_SEND)
            continue;
        sends++;
        EXPECT(s->seq != 0 && s->peer >= 0 && s->peer < world && s->peer != s->node,
               "send '%s' on node %d: peer %d, seq %" PRIu64, s->name, s->node, s->peer, s->seq);
        EXPECT(s->clock_error_ns >= 0, "send '%s' on node %d is aligned", s->name, s->node);
        const tern_prof_event_t *r = receive_of(ev, n, s);
        if (!EXPECT(r != NULL, "send '%s' %d->%d #%" PRIu64 " has no receive", s->name, s->node,
                    s->peer, s->seq))
            continue;
        linked++;
        bool is_coll = strcmp(s->name, "all_reduce send") == 0;
        coll += is_coll;
        EXPECT(is_coll == (strcmp(r->name, "all_reduce recv") == 0),
               "'%s' was received by '%s'", s->name, r->name);
        int64_t slack = s->start_ns - r->end_ns - s->clock_error_ns - r->clock_error_ns;
        if (slack > worst)
            worst = slack;
        EXPECT(slack <= 0, "'%s' %d->%d #%" PRIu64 " starts %" PRId64 " ns after its receive "
               "ends (bounds %" PRId64 " + %" PRId64 ")", s->name, s->node, s->peer, s->seq,
               s->start_ns - r->end_ns, s->clock_error_ns, r->clock_error_ns);
        const tern_prof_event_t *p = NULL;
        for (size_t j = 0; s->parent != 0 && j < n; j++)
            if (ev[j].id == s->parent)
                p = &ev[j];
        EXPECT(is_coll ? p != NULL && strcmp(p->name, "all_reduce") == 0 && p->node == s->node &&
                             p->start_ns <= s->start_ns && s->end_ns <= p->end_ns
                       : s->parent == 0,
               "'%s' on node %d: its parent is %s", s->name, s->node, p ? p->name : "none");
    }
    /* Ring: 2 per rank; any source: world - 1; all_reduce: some. */
    EXPECT(linked == sends && recvs == sends, "%zu sends, %zu linked, %zu receives", sends, linked,
           recvs);
    EXPECT(sends - coll == (size_t)(3 * world - 1), "%zu point-to-point messages, want %d",
           sends - coll, 3 * world - 1);
    printf("rank 0: the job has %zu events, %zu messages (%zu of the all_reduce); the latest "
           "send starts %.3f us before its receive ends, beyond the bounds\n",
           n, sends, coll, (double)-worst / 1e3);

    /* Clocks: one per other rank, each within its bound of the truth. */
    const tern_prof_clock_t *c;
    size_t nc;
    OK(tern_prof_clocks(&c, &nc));
    EXPECT(nc == (size_t)world - 1, "%zu clocks for %d ranks", nc, world);
    for (size_t i = 0; i < nc; i++)
        EXPECT(llabs(c[i].offset_ns - skew_of(c[i].peer)) <= c[i].error_bound_ns,
               "rank %d's clock: offset %" PRId64 ", bound %" PRId64 ", skew %" PRId64, c[i].peer,
               c[i].offset_ns, c[i].error_bound_ns, skew_of(c[i].peer));

    /* The table splits by node. */
    tern_prof_table_t *t;
    OK(tern_prof_key_averages(0, &t));
    unsigned nodes = 0;
    for (size_t i = 0; i < tern_prof_table_rows(t); i++)
        nodes |= 1u << tern_prof_table_row(t, i)->node;
    EXPECT(nodes == (1u << world) - 1, "the table's rows are on nodes 0x%x", nodes);
    tern_prof_print_t one = {.field_mask = TERN_PROF_PRINT_NODE, .node = world - 1};
    char *text = table_text(t, &one);
    EXPECT(strstr(text, "Self CPU time total (node ") != NULL, "node %d's own table", world - 1);
    printf("%s", text);
    free(text);
    tern_prof_table_free(t);

    unsigned peers = ((1u << world) - 1) & ~1u;
    check_trace("job", path, peers, sends, true);
    return 0;
}

/* --memory: what tern allocates inside a handler's range is counted. */
static void test_memory(void)
{
    tern_prof_config_t cfg = {.field_mask = TERN_PROF_CFG_FLAGS, .flags = TERN_PROF_MEMORY};
    OK(tern_prof_start(ctx, &cfg));
    call_noop(names[1], "alloc");
    OK(tern_prof_stop());
    print_table("TERN_PROF_MEMORY");
    const char *c = call_name("rpc_sync", "alloc", 0, 1);
    const tern_prof_event_t *r = event_named(remote_op(c, "alloc_range"));
    CHECK(r != NULL, "the handler's range");
    EXPECT(r->mem >= (1 << 20),
           "the range inside which tern_rpc_call_alloc_tensor made 1 MiB shows mem %" PRId64
           " (TERN_PROF_MEMORY: bytes tern allocates inside each range)",
           r->mem);
    tern_prof_table_t *t;
    OK(tern_prof_key_averages(0, &t));
    char *buf = table_text(t, NULL);
    EXPECT(strstr(buf, "Self CPU Mem") != NULL && strstr(buf, "  CPU Mem") != NULL,
           "the memory columns");
    EXPECT(strstr(buf, "1.00 Mb") != NULL, "the table shows the range's 1.00 Mb");
    free(buf);
    tern_prof_table_free(t);
}

/* ================================================================== */

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    const char *env_rank = getenv("TERN_RANK");
    int my_rank = env_rank ? atoi(env_rank) : 0;
    if (strcmp(mode, "--skew-rank1") == 0 || (strcmp(mode, "--job") == 0 && argc > 2)) {
        if (argc < 3) {
            fprintf(stderr, "--skew-rank1 wants a number of ns\n");
            return 2;
        }
        skew1 = strtoll(argv[2], NULL, 10);
        /* tern-run gives every rank one environment: rank 1 sets its own,
         * before anything reads the profiler's clock. */
        if (my_rank == 1 && setenv("TERN_CLOCK_SKEW_NS", argv[2], 1) != 0) {
            perror("setenv");
            return 1;
        }
    }
    rank = my_rank;
    register_all();
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return 1;
    }
    rank = (int)tern_ctx_rank(ctx);
    world = (int)tern_ctx_world_size(ctx);
    CHECK(rank == my_rank, "TERN_RANK %d, the context says %d", my_rank, rank);
    CHECK(world >= 2 && world <= MAX_WORLD, "2 to %d ranks", MAX_WORLD);
    /* The skew took effect here, and only here. */
    int64_t d = tern_prof_clock_ns() - (int64_t)tern_clock_ns();
    CHECK(llabs(d - skew_of(rank)) < 10 * MS,
          "the profiler clock is %" PRId64 " ns off, want %" PRId64, d, skew_of(rank));
    if (rank == 1 && skew1 != 0) {
        /* Read once per process: a later change of the environment is not seen. */
        CHECK(setenv("TERN_CLOCK_SKEW_NS", "0", 1) == 0, "setenv");
        d = tern_prof_clock_ns() - (int64_t)tern_clock_ns();
        CHECK(llabs(d - skew1) < 10 * MS, "after setenv 0 the clock is %" PRId64 " ns off", d);
    }
    OK(tern_rpc_init(ctx, NULL, NULL));
    for (int r = 0; r < world; r++) {
        OK(tern_rpc_worker_name(ctx, r, names[r], sizeof(names[r])));
        char want[32];
        snprintf(want, sizeof(want), "worker%d", r);
        CHECK(strcmp(names[r], want) == 0, "rank %d is '%s'", r, names[r]);
    }
    char prov[16], dev[128];
    OK(tern_ctx_transport(ctx, prov, sizeof(prov), dev, sizeof(dev)));
    if (rank == 0)
        printf("prof over %s (%s), %d ranks, mode '%s', rank 1's skew %" PRId64 " ns\n", prov, dev,
               world, mode, skew1);

    if (strcmp(mode, "--die") == 0)
        return mode_die();
    if (strcmp(mode, "--job") == 0) {
        mode_job();
        /* Nobody leaves while another still gathers. */
        OK(tern_barrier(tern_group_world(ctx), NULL));
    } else if (rank == 0) {
        int64_t t0 = (int64_t)tern_clock_ns();
        if (strcmp(mode, "--memory") == 0) {
            test_memory();
        } else {
            CHECK(mode[0] == '\0' || strcmp(mode, "--skew-rank1") == 0, "unknown mode '%s'", mode);
            test_json_parser();
            test_calls();
            test_estimates();
            test_probe();
            test_escapes();
        }
        printf("rank 0: %.2f s\n", secs_since(t0));
        finish_others();
    } else {
        serve_until_finished();
    }
    OK(tern_rpc_shutdown(ctx, 1));
    if (tern_finalize(ctx) != TERN_OK) {
        fprintf(stderr, "rank %d: finalize: %s\n", rank, tern_last_error());
        return 1;
    }
    int bad = atomic_load(&failures);
    printf("rank %d %s (%lu checks, %d failed)\n", rank, bad ? "FAILED" : "ok",
           atomic_load(&checks), bad);
    return bad ? 1 : 0;
}
