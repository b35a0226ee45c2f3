/*
 * tern-info: which transport a rank of this machine would use, as tern_init
 * would open it (TERN_TRANSPORT, routed towards MASTER_ADDR): the provider and
 * device, and with auto why the others were passed over. tern-run --topology
 * runs it. Exit 0 when a transport starts, 1 when none can (with the reason),
 * 2 on a bad environment variable.
 */
#include <stdio.h>

#include <tern/log.h>
#include <tern/transport.h>

#include "core/config.h"

static void show(tern_log_level_t level, int rank, const char *msg, void *arg)
{
    (void)level;
    (void)rank;
    (void)arg;
    printf("  %s\n", msg);
}

int main(void)
{
    tern__config_t cfg;
    tern_transport_t *t = NULL;
    tern_transport_attr_t attr;

    if (tern__config_load(&cfg) != TERN_OK) {
        fprintf(stderr, "tern-info: %s\n", tern_last_error());
        return 2;
    }
    tern_transport_params_t tp = {
        .field_mask = TERN_TRANSPORT_PARAM_PEER_HINT,
        .peer_hint = cfg.tern_master_addr[0] ? cfg.tern_master_addr : cfg.master_addr,
    };
    size_t n;
    const char *name = tern__config_enum_value("TERN_TRANSPORT", cfg.transport, &n);
    printf("transport (TERN_TRANSPORT=%.*s):\n", (int)n, name);
    fflush(stdout);
    tern_log_set_sink(show, NULL);
    tern_log_set_level(TERN_LOG_INFO);
    tern_status_t st = tern_transport_open(&tp, &t);
    tern_log_set_level((tern_log_level_t)cfg.log_level);
    tern_log_set_sink(NULL, NULL);
    if (st != TERN_OK) {
        printf("  none can start: %s\n", tern_last_error());
        return 1;
    }
    tern_transport_query(t, &attr);
    printf("  in use: %s on %s (eager limit of the transport %zu bytes)\n", attr.provider,
           attr.device, attr.max_send);
    tern_transport_close(t);
    return 0;
}
