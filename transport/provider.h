/*
 * What a provider implements. Each provider is one static const ops table with
 * designated initializers (tcp/tcp.c: tern__tcp_ops), listed in transport.c;
 * open() checks every op is present. A provider's objects embed the generic
 * ones below as their first member and down-cast with one helper per type
 * (to_tcp_ep()); the generic layer owns the fields of the base structs.
 *
 * The generic layer (transport.c) has already checked arguments that do not
 * depend on the provider: NULLs, lengths against attr, params fields, the
 * registration cache. Providers check everything that comes from the network.
 */
#ifndef TERN_TRANSPORT_PROVIDER_H
#define TERN_TRANSPORT_PROVIDER_H

#include <stdbool.h>

#include <tern/transport.h>

/* Every access flag tern_mr_reg takes, as a provider's key may carry them. */
#define TERN__ACCESS_ALL                                                                 \
    (TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ | TERN_ACCESS_REMOTE_WRITE |             \
     TERN_ACCESS_REMOTE_READ_HELD)
/* The flags that let a peer reach a region (held reads need REMOTE_READ). */
#define TERN__ACCESS_REMOTE (TERN_ACCESS_REMOTE_READ | TERN_ACCESS_REMOTE_WRITE)

/* The transport's resolved configuration: params over environment over defaults. */
typedef struct tern__tp_config {
    const char *provider;  /* the provider being opened */
    uint32_t self_id;
    tern_event_fn on_event;
    void *event_arg;
    int busy_poll;
    const char *device;    /* NULL: provider's choice */
    const char *peer_hint; /* NULL or a host the peers are reached through (MASTER_ADDR) */
    size_t tcp_sockbuf;    /* TERN_TCP_SOCKBUF; 0: kernel default */
    size_t tcp_zcopy;      /* TERN_TCP_ZCOPY; 0: off */
    bool tcp_zcopy_auto;   /* TERN_TCP_ZCOPY_MODE=auto: splice or copy, as measured */
    size_t tcp_write_max;  /* TERN_TCP_WRITE_MAX; 0: no limit */
    size_t ucx_cma;        /* TERN_UCX_CMA; 0: off */
} tern__tp_config_t;

struct tern_transport {
    const struct tern__tp_ops *ops;
    tern_transport_attr_t attr; /* the provider fills it in open() */
    uint32_t self_id;
    tern_event_fn on_event;
    void *event_arg;
    struct tern_mr *mrs; /* live registrations: the cache */
};

struct tern_ep {
    tern_transport_t *tp;
    uint32_t peer;
};

struct tern_mr {
    tern_transport_t *tp;
    struct tern_mr *next; /* in tp->mrs */
    void *addr;
    size_t len;
    unsigned access;
    tern_mem_type_t mem_type;
    unsigned refs;
};

struct tern_rkey {
    const struct tern__tp_ops *ops; /* release needs no live endpoint */
    tern_ep_t *ep;
    uint64_t addr;
    size_t len;
};

typedef struct tern__tp_ops {
    const char *name;
    /* Allocate the provider's transport (base first), fill attr. On error no
     * object survives. Must say why in the error detail. */
    tern_status_t (*open)(const tern__tp_config_t *cfg, tern_transport_t **tp_out);
    /* Free everything: destroy the endpoints still open (their operations
     * complete with TERN_ERR_CANCELED), and once nothing in flight can name a
     * registration any more, release those the user left with
     * tern__tp_release_mrs(). */
    void (*close)(tern_transport_t *tp);
    tern_status_t (*address)(const tern_transport_t *tp, void *buf, size_t *len);
    int (*progress)(tern_transport_t *tp);
    int (*fd)(const tern_transport_t *tp);
    tern_status_t (*arm)(tern_transport_t *tp);
    /* Set (*ep_out)->tp and ->peer are filled by the provider too. */
    tern_status_t (*ep_create)(tern_transport_t *tp, uint32_t peer, const void *addr, size_t len,
                               tern_ep_t **ep_out);
    void (*ep_destroy)(tern_ep_t *ep);
    tern_status_t (*send)(tern_ep_t *ep, uint32_t imm, const void *buf, size_t len,
                          const tern_op_params_t *params);
    /* Optional (NULL: transport.c calls send with the payload, which needs
     * an inline_prefix of 0). Checked already: len <= attr.max_inline.
     * TERN_INPROGRESS (a send the provider copied and queued) counts as
     * TERN_OK to the caller. */
    tern_status_t (*send_inline)(tern_ep_t *ep, uint32_t imm, void *buf, size_t len);
    tern_status_t (*put)(tern_ep_t *ep, const void *buf, size_t len, uint64_t raddr,
                         tern_rkey_t *rkey, const tern_op_params_t *params);
    tern_status_t (*get)(tern_ep_t *ep, void *buf, size_t len, uint64_t raddr, tern_rkey_t *rkey,
                         const tern_op_params_t *params);
    /* Allocate the provider's mr (base first) and register; the generic layer
     * fills the base fields afterwards. */
    tern_status_t (*mr_reg)(tern_transport_t *tp, void *addr, size_t len,
                            const tern_mr_params_t *params, tern_mr_t **mr_out);
    void (*mr_dereg)(tern_mr_t *mr);
    tern_status_t (*mr_pack)(const tern_mr_t *mr, void *buf, size_t *len);
    /* Allocate the provider's rkey (base first) and fill the base fields. */
    tern_status_t (*rkey_unpack)(tern_ep_t *ep, const void *buf, size_t len,
                                 tern_rkey_t **rkey_out);
    void (*rkey_release)(tern_rkey_t *rkey);
} tern__tp_ops_t;

/* Release the registrations still live at close (the user's leftovers).
 * Providers call it from close once no operation can name them. */
static inline void tern__tp_release_mrs(tern_transport_t *tp)
{
    while (tp->mrs != NULL) {
        struct tern_mr *mr = tp->mrs;
        tp->mrs = mr->next;
        tp->ops->mr_dereg(mr);
    }
}

/* Whether [addr, addr + size) lies within the region [base, base + len),
 * without overflow: the one bounds check of a peer's put or get. */
static inline bool tern__range_within(uint64_t base, uint64_t len, uint64_t addr, uint64_t size)
{
    return addr >= base && size <= len && addr - base <= len - size;
}

/* Deliver an event to the transport's user. */
static inline void tern__tp_event(tern_transport_t *tp, const tern_event_t *ev)
{
    if (tp->on_event != NULL)
        tp->on_event(ev, tp->event_arg);
}

/* An operation's completion callback, copied out of its params at post time
 * (params may live on the caller's stack). */
typedef struct tern__comp {
    tern_comp_fn cb;
    void *arg;
} tern__comp_t;

static inline tern__comp_t tern__comp_of(const tern_op_params_t *params)
{
    tern__comp_t c = {NULL, NULL};
    if (params != NULL && (params->field_mask & TERN_OP_PARAM_CB)) {
        c.cb = params->cb;
        c.arg = params->cb_arg;
    }
    return c;
}

/* Complete an operation that returned TERN_INPROGRESS. */
static inline void tern__comp_call(const tern__comp_t *c, tern_status_t status)
{
    if (c->cb != NULL)
        c->cb(c->arg, status);
}

extern const tern__tp_ops_t tern__tcp_ops;
#ifdef TERN_PROVIDER_UCX
extern const tern__tp_ops_t tern__ucx_ops;
#endif

#endif
