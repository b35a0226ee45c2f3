/*
 * tern-run: launch N local ranks of a program, as torchrun --nproc-per-node or
 * mpirun -np do on one machine. This file is the command line; launch.c runs
 * the job. docs/tern-run.md describes the behaviour.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tern/build_config.h>
#include <tern/defs.h>
#include <tern/env.h>
#include <tern/pool.h>
#include <tern/status.h>

#include "core/config.h"
#include "launch.h"

#define DEFAULT_KILL_GRACE_NS (5ll * 1000000000ll)

static const char usage_text[] =
    "usage: tern-run -n N [options] [--] program [args...]\n"
    "       tern-run --topology [-n N]\n"
    "       tern-run --help-env [--markdown]\n"
    "\n"
    "Launch N ranks of program on this machine, as torchrun --nproc-per-node or\n"
    "mpirun -np do. Each rank gets TERN_RANK, TERN_WORLD_SIZE, TERN_LOCAL_RANK,\n"
    "TERN_LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT in its environment,\n"
    "and each line it prints is prefixed with \"[rank] \". When a rank fails, the\n"
    "others are stopped (SIGTERM, then SIGKILL after the grace).\n"
    "\n"
    "options:\n"
    "  -n, --nproc N        number of ranks, 1..4096 (--nproc-per-node is an alias)\n"
    "      --master-port P  port of rank 0's store (default: a free port)\n"
    "      --no-prefix      do not prefix output lines with \"[rank] \"\n"
    "      --timeout D      stop the job and exit 124 after D (e.g. 90s, 5m; default: none)\n"
    "      --kill-grace D   time from SIGTERM to SIGKILL when stopping the job (default: 5s)\n"
    "      --bind-to W      none (default) or core: rank r runs on core r mod the\n"
    "                       cores tern-run may use, round-robin past the last one\n"
    "      --topology       print this machine's topology and the pool binding each of\n"
    "                       N ranks would get (N defaults to 1), then exit\n"
    "      --help-env       print the environment variables tern reads, then exit\n"
    "      --markdown       with --help-env: print a markdown table\n"
    "  -h, --help           print this help, then exit\n"
    "      --version        print the version, then exit\n"
    "\n"
    "SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to every\n"
    "rank's process group.\n"
    "\n"
    "exit status: 0 when every rank exits 0; else the first failing rank's status\n"
    "(128+N when signal N killed it), 124 on --timeout, 128+N when tern-run was\n"
    "stopped by signal N, 127 (126) when the program is not found (cannot be run),\n"
    "2 for a usage error, 1 when tern-run itself failed.\n";

typedef enum opt_id {
    OPT_NPROC,
    OPT_MASTER_PORT,
    OPT_NO_PREFIX,
    OPT_TIMEOUT,
    OPT_KILL_GRACE,
    OPT_BIND_TO,
    OPT_TOPOLOGY,
    OPT_HELP_ENV,
    OPT_MARKDOWN,
    OPT_HELP,
    OPT_VERSION,
} opt_id_t;

static const struct option_def {
    const char *long_name;
    char short_name; /* 0: none */
    bool has_arg;
    opt_id_t id;
} option_defs[] = {
    {"nproc", 'n', true, OPT_NPROC},
    {"nproc-per-node", 0, true, OPT_NPROC},
    {"master-port", 0, true, OPT_MASTER_PORT},
    {"no-prefix", 0, false, OPT_NO_PREFIX},
    {"timeout", 0, true, OPT_TIMEOUT},
    {"kill-grace", 0, true, OPT_KILL_GRACE},
    {"bind-to", 0, true, OPT_BIND_TO},
    {"topology", 0, false, OPT_TOPOLOGY},
    {"help-env", 0, false, OPT_HELP_ENV},
    {"markdown", 0, false, OPT_MARKDOWN},
    {"help", 'h', false, OPT_HELP},
    {"version", 0, false, OPT_VERSION},
};
#define NOPTIONS (sizeof(option_defs) / sizeof(option_defs[0]))

typedef struct cli {
    tr_job_opts_t job;
    bool nproc_set;
    bool topology, help_env, markdown, help, version;
} cli_t;

/* Report a command-line mistake; returns the usage exit status. */
static int usage_error(const char *fmt, ...) TERN_PRINTF(1, 2);

static int usage_error(const char *fmt, ...)
{
    va_list ap;

    fputs("tern-run: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nTry 'tern-run --help' for more information.\n", stderr);
    return TR_EXIT_USAGE;
}

static const struct option_def *find_long(const char *name, size_t len)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strlen(option_defs[i].long_name) == len &&
            strncmp(option_defs[i].long_name, name, len) == 0)
            return &option_defs[i];
    return NULL;
}

static const struct option_def *find_short(char c)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (option_defs[i].short_name != 0 && option_defs[i].short_name == c)
            return &option_defs[i];
    return NULL;
}

/* Apply one option; name is as the user wrote it, for messages. Returns 0 or
 * the usage exit status. */
static int apply_option(cli_t *cli, const struct option_def *def, const char *name,
                        const char *value)
{
    int64_t v;

    switch (def->id) {
    case OPT_NPROC:
        if (tern__parse_int(value, 1, TR_MAX_RANKS, &v) != TERN_OK)
            return usage_error("%s: %s", name, tern_last_error());
        cli->job.nranks = (unsigned)v;
        cli->nproc_set = true;
        return 0;
    case OPT_MASTER_PORT:
        if (tern__parse_int(value, 1, 65535, &v) != TERN_OK)
            return usage_error("%s: %s", name, tern_last_error());
        cli->job.master_port = (int)v;
        return 0;
    case OPT_TIMEOUT:
        if (tern__parse_duration(value, &cli->job.timeout_ns) != TERN_OK)
            return usage_error("%s: %s", name, tern_last_error());
        return 0;
    case OPT_KILL_GRACE:
        if (tern__parse_duration(value, &cli->job.kill_grace_ns) != TERN_OK)
            return usage_error("%s: %s", name, tern_last_error());
        return 0;
    case OPT_BIND_TO:
        if (strcmp(value, "core") != 0 && strcmp(value, "none") != 0)
            return usage_error("%s: '%s' is not one of none, core", name, value);
        cli->job.bind_core = strcmp(value, "core") == 0;
        return 0;
    case OPT_NO_PREFIX:
        cli->job.prefix = false;
        return 0;
    case OPT_TOPOLOGY:
        cli->topology = true;
        return 0;
    case OPT_HELP_ENV:
        cli->help_env = true;
        return 0;
    case OPT_MARKDOWN:
        cli->markdown = true;
        return 0;
    case OPT_HELP:
        cli->help = true;
        return 0;
    case OPT_VERSION:
        cli->version = true;
        return 0;
    }
    return usage_error("internal error: option %s not handled", name);
}

/*
 * Parse tern-run's own options, which end at the first word that is not an
 * option (the program) or at "--"; everything after belongs to the program.
 * Returns 0 or the usage exit status.
 */
static int parse_args(cli_t *cli, int argc, char **argv)
{
    int i;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const struct option_def *def;
        const char *value = NULL;
        char name[64];
        int st;

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break;
        if (a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            def = find_long(a + 2, len);
            value = eq ? eq + 1 : NULL;
            snprintf(name, sizeof(name), "--%.*s", (int)len, a + 2);
        } else {
            def = find_short(a[1]);
            snprintf(name, sizeof(name), "-%c", a[1]);
            if (def != NULL && a[2] != '\0') {
                if (!def->has_arg)
                    def = NULL; /* no bundling of flags: "-hx" is a mistake */
                else
                    value = a + 2;
            }
        }
        if (def == NULL)
            return usage_error("unknown option '%s'", a);
        if (!def->has_arg && value != NULL)
            return usage_error("option '%s' takes no value", name);
        if (def->has_arg && value == NULL) {
            if (i + 1 >= argc)
                return usage_error("option '%s' needs a value", name);
            value = argv[++i];
        }
        st = apply_option(cli, def, name, value);
        if (st != 0)
            return st;
    }
    cli->job.argv = i < argc ? argv + i : NULL;
    return 0;
}

/* Flush stdout and say so if what we printed did not get out. */
static int finish_stdout(void)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "tern-run: cannot write to stdout: %s\n", strerror(errno));
        return TR_EXIT_INTERNAL;
    }
    return 0;
}

static int print_help_env(bool markdown)
{
    tern_status_t st =
        tern_env_print(stdout, markdown ? TERN_ENV_FORMAT_MARKDOWN : TERN_ENV_FORMAT_TEXT);

    if (st != TERN_OK) {
        fprintf(stderr, "tern-run: %s\n", tern_last_error());
        return TR_EXIT_INTERNAL;
    }
    return finish_stdout();
}

static const char *yes_no(int v)
{
    return v ? "yes" : "no";
}

/*
 * The transport a rank would use, reported by tern-info (installed next to
 * tern-run). It runs in a process of its own because opening the transport
 * loads UCX, whose load-time constructor installs a SIGHUP handler
 * (UCX_DEBUG_SIGNO): in tern-run that would break the rule that a signal
 * ignored at start (nohup) stays ignored.
 */
static int print_transport(void)
{
    char self[4096], path[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        printf("transport: cannot find tern-info (readlink /proc/self/exe: %s)\n", strerror(errno));
        return TR_EXIT_INTERNAL;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL)
        *slash = '\0';
    snprintf(path, sizeof(path), "%s/tern-info", self);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        printf("transport: cannot start tern-info: %s\n", strerror(errno));
        return TR_EXIT_INTERNAL;
    }
    if (pid == 0) {
        execl(path, path, (char *)NULL);
        printf("transport: cannot run %s: %s\n", path, strerror(errno));
        fflush(stdout);
        _exit(TR_EXIT_INTERNAL);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : TR_EXIT_INTERNAL;
}

static int print_topology(unsigned nranks)
{
    tern__config_t cfg;
    tern_pool_params_t params;
    tern_status_t st;

    /* The pool reads its settings from the environment; so does this view of it. */
    if (tern__config_load(&cfg) != TERN_OK) {
        fprintf(stderr, "tern-run: %s\n", tern_last_error());
        return TR_EXIT_USAGE;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask = TERN_POOL_PARAM_THREADS | TERN_POOL_PARAM_DEVICE | TERN_POOL_PARAM_BIND;
    params.threads = (unsigned)cfg.threads;
    params.device = cfg.affinity_device[0] != '\0' ? cfg.affinity_device : NULL;
    params.bind = cfg.bind;
    printf("tern %s, optional dependencies: UCX %s, verbs %s, CUDA %s\n", TERN_VERSION_STRING,
           yes_no(TERN_HAVE_UCX), yes_no(TERN_HAVE_VERBS), yes_no(TERN_HAVE_CUDA));
    st = tern_topology_print(stdout, &params, nranks);
    if (st != TERN_OK) {
        fflush(stdout);
        fprintf(stderr, "tern-run: cannot print the topology: %s\n",
                tern_last_error()[0] != '\0' ? tern_last_error() : tern_strerror(st));
        return TR_EXIT_INTERNAL;
    }
    int rc = print_transport();
    int out = finish_stdout();
    return rc != 0 ? rc : out;
}

/* Open /dev/null on any of fds 0-2 that is closed, so that no pipe tern-run
 * creates lands there and gets mistaken for a standard stream. */
static bool ensure_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        if (open("/dev/null", O_RDWR) != fd)
            return false;
    }
    return true;
}

int main(int argc, char **argv)
{
    cli_t cli = {
        .job = {.nranks = 1, .prefix = true, .kill_grace_ns = DEFAULT_KILL_GRACE_NS},
    };
    int st;

    if (!ensure_std_fds())
        return TR_EXIT_INTERNAL;
    st = parse_args(&cli, argc, argv);
    if (st != 0)
        return st;
    if (cli.help) {
        fputs(usage_text, stdout);
        return finish_stdout();
    }
    if (cli.version) {
        printf("tern-run (tern) %s\n", TERN_VERSION_STRING);
        return finish_stdout();
    }
    if (cli.markdown && !cli.help_env)
        return usage_error("--markdown only goes with --help-env");
    if (cli.help_env && cli.topology)
        return usage_error("--help-env and --topology cannot be combined");
    if ((cli.help_env || cli.topology) && cli.job.argv != NULL)
        return usage_error("%s takes no program, but '%s' was given",
                           cli.help_env ? "--help-env" : "--topology", cli.job.argv[0]);
    if (cli.help_env)
        return print_help_env(cli.markdown);
    if (cli.topology)
        return print_topology(cli.job.nranks);
    if (cli.job.argv == NULL)
        return usage_error("missing program to run");
    if (!cli.nproc_set)
        return usage_error("missing -n N, the number of ranks to launch");
    return tr_job_run(&cli.job);
}
