/*
 * The generic transport layer: choosing a provider, checking what callers
 * pass, the registration cache, and one-line dispatch to the provider's ops.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/build_config.h>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "transport/provider.h"

/* In the order "auto" tries them. A provider not built in is listed with a
 * NULL table so auto can say why it was passed over. */
static const struct {
    const char *name;
    const tern__tp_ops_t *ops;
} providers[] = {
    {"verbs", NULL}, /* the raw-verbs provider is a later milestone */
#ifdef TERN_PROVIDER_UCX
    {"ucx", &tern__ucx_ops},
#else
    {"ucx", NULL},
#endif
    {"tcp", &tern__tcp_ops},
};
#define NPROVIDERS (sizeof(providers) / sizeof(providers[0]))

/* A table with a missing op is a programming error caught at open, not a crash
 * on first use. */
static bool ops_complete(const tern__tp_ops_t *o)
{
    return o->name && o->open && o->close && o->address && o->progress && o->fd && o->arm &&
           o->ep_create && o->ep_destroy && o->send && o->put && o->get && o->mr_reg &&
           o->mr_dereg && o->mr_pack && o->rkey_unpack && o->rkey_release;
}

static tern_status_t open_one(size_t i, tern__tp_config_t *cfg, tern_transport_t **tp_out)
{
    const tern__tp_ops_t *ops = providers[i].ops;
    tern_transport_t *tp = NULL;
    tern_status_t st;

    if (ops == NULL)
        return tern__error(TERN_ERR_UNSUPPORTED, "%s: not built into this tern%s", providers[i].name,
                           strcmp(providers[i].name, "ucx") == 0
                               ? " (configure with TERN_WITH_UCX=ON and libucx-dev installed)"
                               : "");
    if (!ops_complete(ops))
        return tern__error(TERN_ERR_INTERNAL, "%s: provider ops table is incomplete", ops->name);
    cfg->provider = ops->name;
    st = ops->open(cfg, &tp);
    if (st != TERN_OK)
        return st;
    tp->ops = ops;
    tp->self_id = cfg->self_id;
    tp->on_event = cfg->on_event;
    tp->event_arg = cfg->event_arg;
    tp->mrs = NULL;
    snprintf(tp->attr.provider, sizeof(tp->attr.provider), "%s", ops->name);
    tp->attr.busy_poll = cfg->busy_poll;
    *tp_out = tp;
    return TERN_OK;
}

tern_status_t tern_transport_open(const tern_transport_params_t *params,
                                  tern_transport_t **tp_out)
{
    const uint64_t m = params ? params->field_mask : 0;
    tern__config_t env;
    tern__tp_config_t cfg = {0};
    const char *want;
    tern_status_t st;

    if (tp_out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_transport_open: tp_out is NULL");
    *tp_out = NULL;
    if ((st = tern__config_load(&env)) != TERN_OK)
        return st;
    char from_env[16];
    size_t n;
    const char *v = tern__config_enum_value("TERN_TRANSPORT", env.transport, &n);
    snprintf(from_env, sizeof(from_env), "%.*s", (int)n, v);
    want = (m & TERN_TRANSPORT_PARAM_PROVIDER) && params->provider ? params->provider : from_env;
    cfg.self_id = (m & TERN_TRANSPORT_PARAM_SELF_ID) ? params->self_id : 0;
    if (m & TERN_TRANSPORT_PARAM_EVENT) {
        cfg.on_event = params->on_event;
        cfg.event_arg = params->event_arg;
    }
    cfg.busy_poll = (m & TERN_TRANSPORT_PARAM_BUSY_POLL) ? params->busy_poll != 0 : env.poll == 1;
    cfg.device = (m & TERN_TRANSPORT_PARAM_DEVICE) ? params->device : NULL;
    if (cfg.device != NULL && cfg.device[0] == '\0')
        cfg.device = NULL;
    cfg.peer_hint = (m & TERN_TRANSPORT_PARAM_PEER_HINT) ? params->peer_hint : NULL;
    cfg.tcp_sockbuf = env.tcp_sockbuf;
    cfg.tcp_zcopy = env.tcp_zcopy;
    cfg.tcp_zcopy_auto = env.tcp_zcopy_mode == 0;
    cfg.tcp_write_max = env.tcp_write_max;
    cfg.ucx_cma = env.ucx_cma;

    if (strcmp(want, "auto") != 0) {
        for (size_t i = 0; i < NPROVIDERS; i++) {
            if (strcmp(want, providers[i].name) != 0)
                continue;
            st = open_one(i, &cfg, tp_out);
            if (st != TERN_OK) {
                /* Never a quiet fall back: the user asked for this one. */
                char why[TERN__ERROR_MAX];
                snprintf(why, sizeof(why), "%s", tern_last_error());
                return tern__error(st, "transport %s requested but cannot start: %s", want, why);
            }
            tern_info("transport: %s on %s (requested)", want, (*tp_out)->attr.device);
            return TERN_OK;
        }
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "unknown transport '%s' (expected auto, verbs, ucx or tcp)", want);
    }

    char passed[3 * TERN__ERROR_MAX] = "";
    for (size_t i = 0; i < NPROVIDERS; i++) {
        st = open_one(i, &cfg, tp_out);
        if (st == TERN_OK) {
            tern_info("transport: auto chose %s on %s%s%s", providers[i].name,
                      (*tp_out)->attr.device, passed[0] ? "; passed over: " : "", passed);
            return TERN_OK;
        }
        size_t n = strlen(passed);
        snprintf(passed + n, sizeof(passed) - n, "%s%s", n ? "; " : "", tern_last_error());
    }
    return tern__error(TERN_ERR_NO_DEVICE, "no transport could start: %s", passed);
}

void tern_transport_close(tern_transport_t *tp)
{
    if (tp == NULL)
        return;
    /* The provider releases the registrations left behind by the user, once it
     * has quiesced: operations in flight may still name them. */
    tp->ops->close(tp);
}

void tern_transport_query(const tern_transport_t *tp, tern_transport_attr_t *attr)
{
    *attr = tp->attr;
}

tern_status_t tern_transport_address(const tern_transport_t *tp, void *buf, size_t *len)
{
    if (tp == NULL || len == NULL || (buf == NULL && *len > 0))
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_transport_address: NULL argument");
    return tp->ops->address(tp, buf, len);
}

int tern_transport_progress(tern_transport_t *tp)
{
    return tp->ops->progress(tp);
}

int tern_transport_fd(const tern_transport_t *tp)
{
    return tp->ops->fd(tp);
}

tern_status_t tern_transport_arm(tern_transport_t *tp)
{
    return tp->ops->arm(tp);
}

/* ---- endpoints ---- */

tern_status_t tern_ep_create(tern_transport_t *tp, uint32_t peer_id, const void *addr, size_t len,
                             tern_ep_t **ep_out)
{
    if (tp == NULL || addr == NULL || ep_out == NULL || len == 0 || len > TERN_ADDR_MAX)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_ep_create: bad arguments (address of %zu bytes)",
                           len);
    *ep_out = NULL;
    return tp->ops->ep_create(tp, peer_id, addr, len, ep_out);
}

void tern_ep_destroy(tern_ep_t *ep)
{
    if (ep != NULL)
        ep->tp->ops->ep_destroy(ep);
}

uint32_t tern_ep_peer(const tern_ep_t *ep)
{
    return ep->peer;
}

/* ---- registration and its cache ---- */

tern_status_t tern_mr_reg(tern_transport_t *tp, void *addr, size_t len,
                          const tern_mr_params_t *params, tern_mr_t **mr_out)
{
    const uint64_t m = params ? params->field_mask : 0;
    tern_mr_params_t p = {
        .field_mask = TERN_MR_PARAM_MEM_TYPE | TERN_MR_PARAM_ACCESS,
        .mem_type = (m & TERN_MR_PARAM_MEM_TYPE) ? params->mem_type : TERN_MEM_HOST,
        .access = (m & TERN_MR_PARAM_ACCESS)
                      ? params->access
                      : TERN_ACCESS_LOCAL | TERN_ACCESS_REMOTE_READ | TERN_ACCESS_REMOTE_WRITE,
        .cuda_device = params ? params->cuda_device : 0,
    };
    tern_mr_t *mr;
    tern_status_t st;

    if (tp == NULL || mr_out == NULL || (addr == NULL && len > 0))
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_mr_reg: NULL argument");
    if (p.access == 0 ||
        (p.access & ~(unsigned)TERN__ACCESS_ALL) ||
        ((p.access & TERN_ACCESS_REMOTE_READ_HELD) && !(p.access & TERN_ACCESS_REMOTE_READ)))
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_mr_reg: bad access flags %#x", p.access);
    if (p.mem_type != TERN_MEM_HOST && p.mem_type != TERN_MEM_CUDA)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_mr_reg: bad memory type %d", p.mem_type);
    if ((uintptr_t)addr > UINTPTR_MAX - len)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_mr_reg: region wraps the address space");

    if (!(m & TERN_MR_PARAM_NO_CACHE)) {
        /* A live registration that covers the range with at least this access
         * (and the same promise: one made with REMOTE_READ_HELD would let a
         * user who never made it be read by reference). */
        for (mr = tp->mrs; mr != NULL; mr = mr->next) {
            if (mr->mem_type == p.mem_type && (mr->access & p.access) == p.access &&
                !((mr->access ^ p.access) & TERN_ACCESS_REMOTE_READ_HELD) &&
                (uintptr_t)addr >= (uintptr_t)mr->addr &&
                (uintptr_t)addr + len <= (uintptr_t)mr->addr + mr->len) {
                mr->refs++;
                *mr_out = mr;
                return TERN_OK;
            }
        }
    }
    if ((st = tp->ops->mr_reg(tp, addr, len, &p, &mr)) != TERN_OK)
        return st;
    mr->tp = tp;
    mr->addr = addr;
    mr->len = len;
    mr->access = p.access;
    mr->mem_type = p.mem_type;
    mr->refs = 1;
    mr->next = tp->mrs;
    tp->mrs = mr;
    *mr_out = mr;
    return TERN_OK;
}

void tern_mr_dereg(tern_mr_t *mr)
{
    tern_mr_t **pp;
    if (mr == NULL || --mr->refs > 0)
        return;
    for (pp = &mr->tp->mrs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == mr) {
            *pp = mr->next;
            break;
        }
    }
    mr->tp->ops->mr_dereg(mr);
}

void *tern_mr_addr(const tern_mr_t *mr)
{
    return mr->addr;
}

size_t tern_mr_len(const tern_mr_t *mr)
{
    return mr->len;
}

tern_status_t tern_mr_pack(const tern_mr_t *mr, void *buf, size_t *len)
{
    if (mr == NULL || buf == NULL || len == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_mr_pack: NULL argument");
    return mr->tp->ops->mr_pack(mr, buf, len);
}

tern_status_t tern_rkey_unpack(tern_ep_t *ep, const void *buf, size_t len, tern_rkey_t **rkey_out)
{
    if (ep == NULL || buf == NULL || rkey_out == NULL || len == 0 || len > TERN_RKEY_MAX)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rkey_unpack: bad arguments (%zu bytes)",
                           len);
    *rkey_out = NULL;
    tern_status_t st = ep->tp->ops->rkey_unpack(ep, buf, len, rkey_out);
    if (st == TERN_OK)
        (*rkey_out)->ops = ep->tp->ops;
    return st;
}

void tern_rkey_release(tern_rkey_t *rkey)
{
    if (rkey != NULL)
        rkey->ops->rkey_release(rkey);
}

uint64_t tern_rkey_addr(const tern_rkey_t *rkey)
{
    return rkey->addr;
}

size_t tern_rkey_len(const tern_rkey_t *rkey)
{
    return rkey->len;
}

/* ---- operations ---- */

/* Checks shared by put and get. */
static tern_status_t check_rma(const char *what, tern_ep_t *ep, const void *buf, size_t len,
                               tern_rkey_t *rkey, const tern_op_params_t *params)
{
    if (ep == NULL || rkey == NULL || (buf == NULL && len > 0))
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: NULL argument", what);
    if (rkey->ep != ep)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: rkey was unpacked for another endpoint",
                           what);
    if (len > ep->tp->attr.max_put)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: %zu bytes exceeds the provider's %zu", what,
                           len, ep->tp->attr.max_put);
    if (params == NULL || !(params->field_mask & TERN_OP_PARAM_MR) || params->mr == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: the local buffer's registration is required",
                           what);
    const tern_mr_t *mr = params->mr;
    if ((uintptr_t)buf < (uintptr_t)mr->addr || (uintptr_t)buf + len > (uintptr_t)mr->addr + mr->len)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: local buffer lies outside its registration",
                           what);
    return TERN_OK;
}

tern_status_t tern_ep_send(tern_ep_t *ep, uint32_t imm, const void *buf, size_t len,
                           const tern_op_params_t *params)
{
    if (ep == NULL || (buf == NULL && len > 0))
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_ep_send: NULL argument");
    if (len > ep->tp->attr.max_send)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_ep_send: %zu bytes exceeds the eager limit %zu",
                           len, ep->tp->attr.max_send);
    return ep->tp->ops->send(ep, imm, buf, len, params);
}

tern_status_t tern_ep_send_inline(tern_ep_t *ep, uint32_t imm, void *buf, size_t len)
{
    if (ep == NULL || buf == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_ep_send_inline: NULL argument");
    if (len > ep->tp->attr.max_inline)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "tern_ep_send_inline: %zu bytes exceeds the inline limit %zu", len,
                           ep->tp->attr.max_inline);
    const tern__tp_ops_t *ops = ep->tp->ops;
    tern_status_t st =
        ops->send_inline != NULL
            ? ops->send_inline(ep, imm, buf, len)
            : ops->send(ep, imm, (uint8_t *)buf + ep->tp->attr.inline_prefix, len, NULL);
    /* An inline payload is copied as it is posted: nothing is left to wait for. */
    return st == TERN_INPROGRESS ? TERN_OK : st;
}

tern_status_t tern_ep_put(tern_ep_t *ep, const void *buf, size_t len, uint64_t raddr,
                          tern_rkey_t *rkey, const tern_op_params_t *params)
{
    tern_status_t st = check_rma("tern_ep_put", ep, buf, len, rkey, params);
    if (st != TERN_OK)
        return st;
    if ((params->field_mask & TERN_OP_PARAM_WAY) &&
        ((int)params->way < (int)TERN_WAY_AUTO || (int)params->way > (int)TERN_WAY_REF))
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "tern_ep_put: way %d is not TERN_WAY_AUTO, _COPY or _REF",
                           (int)params->way);
    return ep->tp->ops->put(ep, buf, len, raddr, rkey, params);
}

tern_status_t tern_ep_get(tern_ep_t *ep, void *buf, size_t len, uint64_t raddr, tern_rkey_t *rkey,
                          const tern_op_params_t *params)
{
    tern_status_t st = check_rma("tern_ep_get", ep, buf, len, rkey, params);
    if (st != TERN_OK)
        return st;
    if (params->field_mask & TERN_OP_PARAM_WAY)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "tern_ep_get: TERN_OP_PARAM_WAY is for puts (a reply goes the way its "
                           "target chooses)");
    return ep->tp->ops->get(ep, buf, len, raddr, rkey, params);
}
