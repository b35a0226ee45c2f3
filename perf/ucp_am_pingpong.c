/*
 * The floor under tern's ucx provider for compare.sh: a ping-pong of UCP
 * active messages carrying the same bytes tern's ucx provider sends for a
 * small p2p message: its 16-byte short header, the 3-byte p2p eager header
 * and the payload, as one run of AM data with no AM header, and nothing
 * else. The gap between this and ucx_perftest tag_lat is UCX's; the gap
 * between tern-perf and this is tern's (provider and p2p layer).
 *   ucp-am-pingpong SIZE ITERS     one-way latency (RTT/2): avg and p50 in us
 * Two processes (fork), worker addresses exchanged through pipes; honours
 * UCX_TLS and UCX_NET_DEVICES like any UCX program.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "peer.h"

#define AM_ID 7
#define HDR_LEN 16  /* transport/ucx/ucx.c SHORT_HDR_LEN */
#define P2P_HDR 3   /* p2p/p2p.c EAGER_SHORT_HDR */

static volatile unsigned arrived;

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length, (void)data, (void)length, (void)param;
    arrived++;
    return UCS_OK;
}

static void die(const char *what, ucs_status_t st)
{
    fprintf(stderr, "ucp-am-pingpong: %s: %s\n", what, ucs_status_string(st));
    exit(1);
}

/* Send one AM and wait until UCX is done with the buffers. */
static void send_one(ucp_worker_h w, ucp_ep_h ep, const void *buf, size_t len)
{
    ucp_request_param_t p = {0};
    ucs_status_ptr_t sp = ucp_am_send_nbx(ep, AM_ID, NULL, 0, buf, len, &p);
    if (UCS_PTR_IS_ERR(sp))
        die("ucp_am_send_nbx", UCS_PTR_STATUS(sp));
    if (sp != NULL) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS)
            ucp_worker_progress(w);
        ucp_request_free(sp);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s SIZE ITERS\n", argv[0]);
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10) + HDR_LEN + P2P_HDR;
    unsigned iters = (unsigned)strtoul(argv[2], NULL, 10), warm = iters / 10 + 1;
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) {
        perror("ucp-am-pingpong: pipe");
        return 1;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("ucp-am-pingpong: fork");
        return 1;
    }
    int server = child == 0;
    peer_bind(server);
    int wfd = server ? up[1] : down[1], rfd = server ? down[0] : up[0];

    ucp_params_t cp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_context_h ctx;
    ucs_status_t st = ucp_init(&cp, NULL, &ctx);
    if (st != UCS_OK)
        die("ucp_init", st);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_worker_h w;
    if ((st = ucp_worker_create(ctx, &wp, &w)) != UCS_OK)
        die("ucp_worker_create", st);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB,
                                 .id = AM_ID, .cb = on_am};
    if ((st = ucp_worker_set_am_recv_handler(w, &hp)) != UCS_OK)
        die("ucp_worker_set_am_recv_handler", st);
    ucp_address_t *addr;
    size_t alen, plen;
    void *peer = NULL;
    uint8_t *buf = NULL;
    uint64_t *s = NULL;
    ucp_ep_h ep = NULL;
    int rc = 1;
    if ((st = ucp_worker_get_address(w, &addr, &alen)) != UCS_OK)
        die("ucp_worker_get_address", st);
    if (peer_xfer(wfd, &alen, sizeof(alen), 1) || peer_xfer(wfd, addr, alen, 1) ||
        peer_xfer(rfd, &plen, sizeof(plen), 0) || plen > 1u << 20 ||
        (peer = malloc(plen)) == NULL || peer_xfer(rfd, peer, plen, 0)) {
        fprintf(stderr, "ucp-am-pingpong: address exchange failed\n");
        goto out;
    }
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = peer};
    if ((st = ucp_ep_create(w, &ep_params, &ep)) != UCS_OK)
        die("ucp_ep_create", st);

    buf = calloc(1, size);
    s = calloc(iters ? iters : 1, sizeof(*s));
    if (buf == NULL || s == NULL) {
        fprintf(stderr, "ucp-am-pingpong: no memory\n");
        goto out;
    }
    /* One clock read per iteration, where tern-perf takes it: right after
     * the client's send, so it overlaps the reply's flight (a sample runs
     * from one send to the next). */
    uint64_t t = peer_now_ns();
    for (unsigned i = 0; i < warm + iters; i++) {
        if (!server) {
            send_one(w, ep, buf, size);
            uint64_t t1 = peer_now_ns();
            if (i >= warm)
                s[i - warm] = t1 - t;
            t = t1;
        }
        while (arrived < i + 1)
            ucp_worker_progress(w);
        if (server)
            send_one(w, ep, buf, size);
    }
    /* Both sides done before either endpoint goes. */
    char done = 1;
    if (peer_xfer(wfd, &done, 1, 1) || peer_xfer(rfd, &done, 1, 0))
        goto out;
    if (!server)
        peer_print_lat(size - HDR_LEN - P2P_HDR, s, iters);
    rc = 0;
out:
    if (ep == NULL)
        goto release;
    ucp_request_param_t cpar = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t cr = ucp_ep_close_nbx(ep, &cpar);
    if (UCS_PTR_IS_PTR(cr)) {
        while (ucp_request_check_status(cr) == UCS_INPROGRESS)
            ucp_worker_progress(w);
        ucp_request_free(cr);
    }
release:
    ucp_worker_release_address(w, addr);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
    free(peer);
    free(buf);
    free(s);
    if (!server)
        waitpid(child, NULL, 0);
    return rc;
}
