/*
 * The job supervisor: fork/exec of the ranks, and one poll() loop over every
 * rank's stdout and stderr pipes plus a self-pipe that signal handlers write
 * to. One thread, whatever the number of ranks.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hwloc.h>
#include <hwloc/glibc-sched.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tern/clock.h>
#include <tern/defs.h>

#include "core/error.h"
#include "core/topology.h"
#include "launch.h"
#include "lines.h"
#include "procs.h"

extern char **environ;

/* After the last rank exits, how long its pipes may stay open (held by
 * processes it left behind) before those are killed. */
#define DRAIN_NS (1000000000ll)

/* How long the processes left in the ranks' groups may take to die of the
 * SIGKILL that ends the job: only one stuck in the kernel takes long. */
#define END_NS (3000000000ll)

/* What a signal sent to tern-run does to the job. */
typedef enum fwd_kind {
    FWD_PASS,    /* forwarded; the job goes on */
    FWD_END,     /* forwarded; the job is ending: SIGKILL what is left after the grace */
    FWD_SUSPEND, /* job control (Ctrl-Z): stop the ranks, then tern-run */
    FWD_RESUME,  /* SIGCONT: continue the ranks */
} fwd_kind_t;

/* The signals tern-run passes on to every rank's process group. */
static const struct {
    int signo;
    const char *name;
    fwd_kind_t kind;
} forwarded[] = {
    {SIGINT, "SIGINT", FWD_END},       {SIGTERM, "SIGTERM", FWD_END},
    {SIGHUP, "SIGHUP", FWD_END},       {SIGQUIT, "SIGQUIT", FWD_END},
    {SIGUSR1, "SIGUSR1", FWD_PASS},    {SIGUSR2, "SIGUSR2", FWD_PASS},
    {SIGTSTP, "SIGTSTP", FWD_SUSPEND}, {SIGTTIN, "SIGTTIN", FWD_SUSPEND},
    {SIGTTOU, "SIGTTOU", FWD_SUSPEND}, {SIGCONT, "SIGCONT", FWD_RESUME},
};
#define NFORWARDED (sizeof(forwarded) / sizeof(forwarded[0]))

/* Handlers only set a flag and write a byte to wake poll(); the loop does the
 * work. Flags rather than the bytes carry the signal so none is lost when the
 * pipe is full. */
static volatile sig_atomic_t sig_pending[NSIG];
static int sig_wake_fd = -1;

static void on_signal(int signo)
{
    int saved = errno;
    unsigned char b = (unsigned char)signo;

    sig_pending[signo] = 1;
    if (write(sig_wake_fd, &b, 1) < 0) {
        /* Full pipe: poll() will wake anyway. */
    }
    errno = saved;
}

typedef enum stop_reason {
    RUNNING,
    STOP_FAILURE, /* a rank failed */
    STOP_TIMEOUT,
    STOP_SIGNAL, /* tern-run was told to stop */
    STOP_LAUNCH, /* a rank could not be started */
} stop_reason_t;

typedef struct rank {
    pid_t pid;  /* also its process group id; 0: never started */
    bool live;  /* started and not yet reaped */
    tr_stream_t out, err;
} rank_t;

typedef struct job {
    const tr_job_opts_t *opts;
    rank_t *ranks;
    unsigned started;
    unsigned live;
    tr_output_t *out, *err;
    int wake[2];
    int devnull;
    char **envp;
    char (*vars)[64]; /* the strings of the variables tern-run sets, inside envp */
    size_t rank_var, local_rank_var; /* which of vars carry the rank */
    sigset_t orig_mask;
    struct sigaction old_actions[NFORWARDED + 2];
    bool ignored[NFORWARDED];
    bool handlers_set;
    stop_reason_t stop;
    int stop_signo;
    int exit_code;
    uint64_t kill_at;    /* stopping: SIGKILL the ranks still alive then */
    bool killed;
    uint64_t timeout_at; /* 0: none */
    uint64_t drain_at;   /* 0: not yet draining */
    bool out_reported;   /* said that stdout broke */
    cpu_set_t *cores;    /* --bind-to core: the PUs of each core tern-run may use */
    unsigned ncores;
} job_t;

/* ---- messages ---- */

/* Print "tern-run: <msg>" on stderr without cutting into a rank's line. */
static void report(job_t *job, const char *fmt, ...) TERN_PRINTF(2, 3);

static void report(job_t *job, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    int n = snprintf(msg, sizeof(msg), "tern-run: ");

    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof(msg) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    strcat(msg, "\n");
    if (job->err != NULL)
        tr_output_message(job->err, msg, strlen(msg));
    else
        fputs(msg, stderr);
}

/* "5s", "250ms": durations as the user wrote them, roughly. */
static const char *fmt_duration(int64_t ns, char *buf, size_t size)
{
    if (ns % 1000000000 == 0)
        snprintf(buf, size, "%" PRId64 "s", ns / 1000000000);
    else if (ns % 1000000 == 0)
        snprintf(buf, size, "%" PRId64 "ms", ns / 1000000);
    else
        snprintf(buf, size, "%.3fs", (double)ns / 1e9);
    return buf;
}

static const char *signal_name(int signo)
{
    for (size_t i = 0; i < NFORWARDED; i++)
        if (forwarded[i].signo == signo)
            return forwarded[i].name;
    return "signal";
}

/* ---- setup ---- */

/* A port nobody listens on now, found as torchrun does: bind port 0 and read
 * back what the kernel chose. Another process could take it before rank 0
 * binds it; --master-port avoids the race where that matters. */
static int pick_free_port(job_t *job)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t len = sizeof(sa);
    int port = -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        report(job, "cannot pick a master port: socket: %s", strerror(errno));
        return -1;
    }
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        report(job, "cannot pick a master port: bind 127.0.0.1:0: %s", strerror(errno));
        goto out;
    }
    port = ntohs(sa.sin_port);
out:
    close(fd);
    return port;
}

/* The ranks' environment: ours, minus any variable we set, plus ours. */
static bool build_env(job_t *job, int port)
{
    /* The ranks' store is ours: TERN_MASTER_* (which take precedence over
     * MASTER_*) and torchrun's agent-store flag (which moves the store to the
     * next port) left over from the caller's environment would send the ranks
     * elsewhere, silently, and two jobs onto one port. */
    static const char *const names[] = {
        "TERN_RANK",   "TERN_WORLD_SIZE", "TERN_LOCAL_RANK",  "TERN_LOCAL_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT",     "TERN_MASTER_ADDR", "TERN_MASTER_PORT",
        "TERN_JOB_ID"};
    static const char *const dropped[] = {"TORCHELASTIC_USE_AGENT_STORE"};
    const size_t nvars = sizeof(names) / sizeof(names[0]);
    unsigned n = job->opts->nranks;
    size_t count = 0, k = 0;

    for (char **e = environ; *e != NULL; e++)
        count++;
    job->envp = calloc(count + nvars + 1, sizeof(char *));
    job->vars = calloc(nvars, sizeof(*job->vars));
    if (job->envp == NULL || job->vars == NULL) {
        report(job, "out of memory");
        return false;
    }
    for (char **e = environ; *e != NULL; e++) {
        bool ours = false;
        for (size_t i = 0; i < nvars; i++) {
            size_t len = strlen(names[i]);
            if (strncmp(*e, names[i], len) == 0 && (*e)[len] == '=')
                ours = true;
        }
        for (size_t i = 0; i < sizeof(dropped) / sizeof(dropped[0]); i++) {
            size_t len = strlen(dropped[i]);
            if (strncmp(*e, dropped[i], len) == 0 && (*e)[len] == '=')
                ours = true;
        }
        if (!ours)
            job->envp[k++] = *e;
    }
    snprintf(job->vars[0], sizeof(job->vars[0]), "TERN_RANK=0");
    snprintf(job->vars[1], sizeof(job->vars[1]), "TERN_WORLD_SIZE=%u", n);
    snprintf(job->vars[2], sizeof(job->vars[2]), "TERN_LOCAL_RANK=0");
    snprintf(job->vars[3], sizeof(job->vars[3]), "TERN_LOCAL_WORLD_SIZE=%u", n);
    snprintf(job->vars[4], sizeof(job->vars[4]), "MASTER_ADDR=127.0.0.1");
    snprintf(job->vars[5], sizeof(job->vars[5]), "MASTER_PORT=%d", port);
    snprintf(job->vars[6], sizeof(job->vars[6]), "TERN_MASTER_ADDR=127.0.0.1");
    snprintf(job->vars[7], sizeof(job->vars[7]), "TERN_MASTER_PORT=%d", port);
    /* One token per job: a rank of another job that reaches this one's store
     * (both given one port) is refused, not taken in. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(job->vars[8], sizeof(job->vars[8]), "TERN_JOB_ID=tern-run-%ld-%lx-%lx", (long)getpid(),
             (unsigned long)now.tv_sec, (unsigned long)now.tv_nsec);
    job->rank_var = 0;
    job->local_rank_var = 2;
    for (size_t i = 0; i < nvars; i++)
        job->envp[k++] = job->vars[i];
    job->envp[k] = NULL;
    return true;
}

static bool install_handlers(job_t *job)
{
    struct sigaction sa;

    /* Save every action first, so that a failure halfway restores exactly
     * what we found. */
    for (size_t i = 0; i < NFORWARDED; i++)
        sigaction(forwarded[i].signo, NULL, &job->old_actions[i]);
    sigaction(SIGCHLD, NULL, &job->old_actions[NFORWARDED]);
    sigaction(SIGPIPE, NULL, &job->old_actions[NFORWARDED + 1]);
    job->handlers_set = true;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigfillset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < NFORWARDED; i++) {
        /* A signal ignored when we start (nohup, a background job of a
         * non-interactive shell) stays ignored, for us and for the ranks.
         * SIGCONT continues a stopped process whatever its action, so the
         * ranks must hear it even then. */
        job->ignored[i] =
            job->old_actions[i].sa_handler == SIG_IGN && forwarded[i].kind != FWD_RESUME;
        if (!job->ignored[i] && sigaction(forwarded[i].signo, &sa, NULL) < 0)
            goto fail;
    }
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &sa, NULL) < 0)
        goto fail;
    /* A closed stdout must not kill tern-run while it still has ranks to stop;
     * write() reports EPIPE instead. */
    sa.sa_handler = SIG_IGN;
    sa.sa_flags = 0;
    if (sigaction(SIGPIPE, &sa, NULL) < 0)
        goto fail;
    return true;
fail:
    report(job, "cannot install signal handlers: %s", strerror(errno));
    return false;
}

static void restore_handlers(job_t *job)
{
    if (!job->handlers_set)
        return;
    for (size_t i = 0; i < NFORWARDED; i++)
        if (!job->ignored[i])
            sigaction(forwarded[i].signo, &job->old_actions[i], NULL);
    sigaction(SIGCHLD, &job->old_actions[NFORWARDED], NULL);
    sigaction(SIGPIPE, &job->old_actions[NFORWARDED + 1], NULL);
    job->handlers_set = false;
}

/*
 * --bind-to core: the cores the worker pool would choose for a lone rank
 * (tern__placement_init: tern-run's own affinity, what taskset, srun or a
 * cgroup left it, each core as its PUs within that, a PU per core on a VM
 * that reports no cores), in hwloc's order. Rank r takes core r mod their
 * number, as mpirun's --map-by core --bind-to core does (with
 * :overload-allowed past the last core). Said once on stderr, as mpirun's
 * --report-bindings would.
 */
static bool bind_setup(job_t *job)
{
    const tern__pool_config_t cfg = {.bind = true, .local_world_size = 1};
    hwloc_topology_t topo = NULL;
    tern__placement_t pl;
    bool ok = false;

    memset(&pl, 0, sizeof(pl));
    if (tern__topology_load(&topo) != TERN_OK || tern__placement_init(&pl, topo, &cfg) != TERN_OK) {
        report(job, "--bind-to core: %s", tern_last_error());
        goto out;
    }
    job->cores = calloc(pl.ncores, sizeof(*job->cores));
    if (job->cores == NULL) {
        report(job, "--bind-to core: out of memory");
        goto out;
    }
    job->ncores = pl.ncores;
    for (unsigned i = 0; i < pl.ncores; i++)
        if (hwloc_cpuset_to_glibc_sched_affinity(topo, pl.core_sets[i], &job->cores[i],
                                                 sizeof(cpu_set_t)) != 0) {
            report(job, "--bind-to core: core %u's PUs do not fit a cpu_set_t", i);
            goto out;
        }
    /* The cores' PUs, as "0 | 1 | 2-3", as many as the line holds, then "...". */
    char list[200] = "", pus[64];
    size_t used = 0;
    for (unsigned i = 0; i < pl.ncores; i++) {
        hwloc_bitmap_list_snprintf(pus, sizeof(pus), pl.core_sets[i]);
        bool fits = used + strlen(pus) + 10 < sizeof(list);
        used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%s", i ? " | " : "",
                                 fits ? pus : "...");
        if (!fits)
            break;
    }
    unsigned nr = job->opts->nranks;
    fprintf(stderr, "tern-run: %u rank%s bound round-robin to %u core%s, PUs %s%s\n", nr,
            nr == 1 ? "" : "s", pl.ncores, pl.ncores == 1 ? "" : "s", list,
            nr > pl.ncores ? " (more ranks than cores: they share)" : "");
    ok = true;
out:
    if (!ok) {
        free(job->cores);
        job->cores = NULL;
    }
    tern__placement_fini(&pl);
    if (topo != NULL)
        hwloc_topology_destroy(topo);
    return ok;
}

/* ---- starting ranks ---- */

/* In the child, between fork and exec: only async-signal-safe calls. Never returns. */
static void exec_rank(job_t *job, unsigned r, int in_fd, int out_fd, int err_fd, int status_fd,
                      pid_t parent)
{
    struct sigaction dfl;
    int e;

    /* Its own process group, so a signal reaches everything the rank starts. */
    setpgid(0, 0);
    /* If tern-run dies without stopping the job (SIGKILL), take the rank with it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(TR_EXIT_INTERNAL);
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (size_t i = 0; i < NFORWARDED; i++)
        if (!job->ignored[i])
            sigaction(forwarded[i].signo, &dfl, NULL);
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL); /* an ignored signal stays ignored across exec */
    /* fds 0-2 are always open in tern-run (main makes sure), so the pipes are
     * above 2 and these dup2s cannot overwrite one another. */
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) {
        e = errno;
        goto fail;
    }
    /* The set is within tern-run's own affinity, so this fails only if that
     * changed since; the rank then runs where tern-run may, and says so. */
    if (job->cores != NULL &&
        sched_setaffinity(0, sizeof(cpu_set_t), &job->cores[r % job->ncores]) != 0) {
        static const char msg[] = "tern-run: cannot bind a rank to its core; it runs unbound\n";
        if (write(2, msg, sizeof(msg) - 1) < 0) {
            /* Nothing left to tell anyone with. */
        }
    }
    sigprocmask(SIG_SETMASK, &job->orig_mask, NULL);
    execvpe(job->opts->argv[0], job->opts->argv, job->envp);
    e = errno;
fail:
    /* The status pipe is close-on-exec: the parent reads EOF on success and
     * the errno here on failure. */
    if (write(status_fd, &e, sizeof(e)) < 0) {
        /* Nothing left to tell anyone with. */
    }
    _exit(TR_EXIT_NOTFOUND);
}

static void close_pair(int p[2])
{
    for (int i = 0; i < 2; i++)
        if (p[i] >= 0) {
            close(p[i]);
            p[i] = -1;
        }
}

/*
 * Start rank r and wait until it has exec'd. Returns 0, or an exit status for
 * tern-run when it could not (reported here).
 */
static int start_rank(job_t *job, unsigned r)
{
    int out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, status_p[2] = {-1, -1};
    rank_t *rank = &job->ranks[r];
    char prefix[24] = "";
    sigset_t all, saved;
    pid_t self = getpid();
    int in_fd, e = 0, ret = 0;
    ssize_t n;
    pid_t pid;

    if (pipe2(out_p, O_CLOEXEC) < 0 || pipe2(err_p, O_CLOEXEC) < 0 ||
        pipe2(status_p, O_CLOEXEC) < 0) {
        int err = errno;
        report(job, "cannot start rank %u: pipe: %s%s", r, strerror(err),
               err == EMFILE ? " (tern-run holds 2 per rank; see ulimit -n)" : "");
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    if (job->opts->prefix)
        snprintf(prefix, sizeof(prefix), "[%u] ", r);
    /* Each read end belongs to its stream once that is set up. */
    if (!tr_stream_init(&rank->out, out_p[0], job->out, prefix)) {
        report(job, "out of memory");
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    out_p[0] = -1;
    if (!tr_stream_init(&rank->err, err_p[0], job->err, prefix)) {
        report(job, "out of memory");
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    err_p[0] = -1;
    snprintf(job->vars[job->rank_var], sizeof(job->vars[0]), "TERN_RANK=%u", r);
    snprintf(job->vars[job->local_rank_var], sizeof(job->vars[0]), "TERN_LOCAL_RANK=%u", r);
    /* Rank 0 reads tern-run's stdin (as with mpirun) unless it is a terminal:
     * a rank outside the foreground process group that read a terminal would
     * be stopped by SIGTTIN. */
    in_fd = (r == 0 && !isatty(0)) ? 0 : job->devnull;

    /* Signals stay blocked until the child has reset its handlers: a handler
     * running in the child would write to our wake pipe. */
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &saved);
    pid = fork();
    if (pid == 0)
        exec_rank(job, r, in_fd, out_p[1], err_p[1], status_p[1], self);
    e = errno;
    sigprocmask(SIG_SETMASK, &saved, NULL);
    if (pid < 0) {
        report(job, "cannot start rank %u: fork: %s", r, strerror(e));
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    /* Both sides set the group, so it is set before either goes on. */
    setpgid(pid, pid);
    rank->pid = pid;
    rank->live = true;
    job->started++;
    job->live++;
    close(status_p[1]);
    status_p[1] = -1;
    do
        n = read(status_p[0], &e, sizeof(e));
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof(e)) {
        int st;
        report(job, "cannot run '%s': %s", job->opts->argv[0], strerror(e));
        ret = (e == ENOENT) ? TR_EXIT_NOTFOUND : TR_EXIT_NOEXEC;
        /* It has already exited; reap it here so the failure is not also
         * reported as an exit status. */
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        rank->live = false;
        job->live--;
    }
out:
    close_pair(out_p);
    close_pair(err_p);
    close_pair(status_p);
    return ret;
}

/* ---- stopping ---- */

static void signal_live(job_t *job, int signo)
{
    for (unsigned r = 0; r < job->started; r++)
        if (job->ranks[r].live)
            kill(-job->ranks[r].pid, signo);
}

/* Begin stopping the job: ask every rank to terminate (unless signo, a signal
 * already forwarded to them, did that), and SIGKILL after the grace. */
static void stop_job(job_t *job, stop_reason_t reason, int exit_code, int signo)
{
    if (job->stop != RUNNING)
        return;
    job->stop = reason;
    job->stop_signo = signo ? signo : SIGTERM;
    job->exit_code = exit_code;
    job->kill_at = tern_clock_ns() + (uint64_t)job->opts->kill_grace_ns;
    if (signo == 0)
        signal_live(job, SIGTERM);
}

static void rank_exited(job_t *job, unsigned r, int status)
{
    rank_t *rank = &job->ranks[r];
    char sigdesc[128];

    rank->live = false;
    job->live--;
    /* Its last lines first, then why it ended. */
    tr_stream_drain(&rank->out);
    tr_stream_drain(&rank->err);
    tr_output_flush(job->out);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return;
    if (job->stop != RUNNING)
        return; /* we are stopping the job: ranks ending now are expected */
    if (WIFEXITED(status)) {
        report(job, "rank %u (pid %ld) exited with status %d", r, (long)rank->pid,
               WEXITSTATUS(status));
        stop_job(job, STOP_FAILURE, WEXITSTATUS(status), 0);
    } else if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        snprintf(sigdesc, sizeof(sigdesc), "%s", strsignal(sig));
        report(job, "rank %u (pid %ld) was killed by signal %d (%s)%s", r, (long)rank->pid, sig,
               sigdesc, WCOREDUMP(status) ? ", core dumped" : "");
        stop_job(job, STOP_FAILURE, 128 + sig, 0);
    }
    if (job->live > 0) {
        char grace[32];
        report(job, "stopping the other %u rank%s (SIGTERM, SIGKILL after %s)", job->live,
               job->live == 1 ? "" : "s", fmt_duration(job->opts->kill_grace_ns, grace, sizeof(grace)));
    }
}

static void reap(job_t *job)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);

        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        for (unsigned r = 0; r < job->started; r++) {
            if (job->ranks[r].live && job->ranks[r].pid == pid) {
                rank_exited(job, r, status);
                break;
            }
        }
    }
}

static void flush_outputs(job_t *job)
{
    tr_output_flush(job->out);
    tr_output_flush(job->err);
    if (job->out->broken && !job->out_reported) {
        report(job, "cannot write to stdout: %s; discarding the ranks' output",
               strerror(job->out->error));
        job->out_reported = true;
    }
}

/*
 * Ctrl-Z: the ranks stop with tern-run, and continue with it, as a program run
 * directly would (they are not in the terminal's process group, so the
 * terminal's SIGTSTP reaches tern-run alone). Both stop by SIGSTOP, as
 * mpirun's forwarded job control does: a rank may catch SIGTSTP and go on,
 * and the kernel discards the terminal stop signals sent to a process group
 * it counts as orphaned; either would leave half the job stopped. Time spent
 * stopped does not count against --timeout (Slurm does not count a suspended
 * job's time against its limit either).
 */
static void suspend(job_t *job)
{
    uint64_t t0 = tern_clock_ns(), stopped;

    flush_outputs(job);
    signal_live(job, SIGSTOP);
    raise(SIGSTOP);
    /* Continued. The SIGCONT handler's flag forwards it too; twice does no harm. */
    stopped = tern_clock_ns() - t0;
    if (job->timeout_at != 0)
        job->timeout_at += stopped;
    if (job->stop != RUNNING && !job->killed)
        job->kill_at += stopped;
    if (job->drain_at != 0)
        job->drain_at += stopped;
    signal_live(job, SIGCONT);
}

static void handle_signals(job_t *job)
{
    unsigned char buf[64];

    while (read(job->wake[0], buf, sizeof(buf)) > 0) {
    }
    if (sig_pending[SIGCHLD]) {
        sig_pending[SIGCHLD] = 0;
        reap(job);
    }
    for (size_t i = 0; i < NFORWARDED; i++) {
        int signo = forwarded[i].signo;
        if (!sig_pending[signo])
            continue;
        sig_pending[signo] = 0;
        if (forwarded[i].kind == FWD_SUSPEND) {
            suspend(job);
            continue;
        }
        signal_live(job, signo);
        if (forwarded[i].kind == FWD_END && job->stop == RUNNING) {
            report(job, "received %s; forwarded it to %u rank%s", forwarded[i].name, job->live,
                   job->live == 1 ? "" : "s");
            stop_job(job, STOP_SIGNAL, 128 + signo, signo);
        }
    }
}

/* ---- the loop ---- */

static uint64_t earliest(uint64_t a, uint64_t b)
{
    if (a == 0)
        return b;
    if (b == 0)
        return a;
    return a < b ? a : b;
}

/* Whether rank r's process group may still hold processes to signal. A rank
 * not yet reaped pins its pid, and so its group id. Once it is reaped and its
 * group empties, the kernel may give that number to any new process, and a
 * new group leader (setsid, a shell's job) on a busy node whose pids wrapped
 * would take the signal meant for the rank's leftovers. So a reaped rank's
 * group is signalled only while one of its processes descends from tern-run,
 * which as the child subreaper adopts all that the ranks leave behind. procs:
 * a snapshot of /proc, or NULL when there is none, and then kill(0) decides. */
static bool group_left(const job_t *job, unsigned r, const tr_procs_t *procs)
{
    pid_t pgid = job->ranks[r].pid;

    if (pgid <= 0)
        return false;
    if (job->ranks[r].live)
        return true;
    if (procs != NULL)
        return tr_procs_group_ours(procs, pgid);
    return kill(-pgid, 0) == 0;
}

/* Deadlines that have passed: the timeout, the kill after the grace, the end
 * of draining. Returns false when the loop should end. */
static bool check_deadlines(job_t *job, uint64_t now)
{
    char d[32];

    if (job->timeout_at != 0 && now >= job->timeout_at && job->stop == RUNNING) {
        report(job, "timed out after %s; stopping %u rank%s",
               fmt_duration(job->opts->timeout_ns, d, sizeof(d)), job->live,
               job->live == 1 ? "" : "s");
        stop_job(job, STOP_TIMEOUT, TR_EXIT_TIMEOUT, 0);
    }
    if (job->stop != RUNNING && !job->killed && job->live > 0 && now >= job->kill_at) {
        report(job, "%u rank%s still running %s after %s; sending SIGKILL", job->live,
               job->live == 1 ? "" : "s", fmt_duration(job->opts->kill_grace_ns, d, sizeof(d)),
               signal_name(job->stop_signo));
        signal_live(job, SIGKILL);
        job->killed = true;
    }
    if (job->live == 0) {
        if (job->drain_at == 0)
            job->drain_at = now + DRAIN_NS;
        if (now >= job->drain_at) {
            /* Every rank has exited but something still holds its pipes:
             * processes it left in its group. Do not wait for them. */
            tr_procs_t procs;
            bool have = tr_procs_load(&procs);
            for (unsigned r = 0; r < job->started; r++)
                if ((job->ranks[r].out.fd >= 0 || job->ranks[r].err.fd >= 0) &&
                    group_left(job, r, have ? &procs : NULL))
                    kill(-job->ranks[r].pid, SIGKILL);
            tr_procs_free(&procs);
            return false;
        }
    }
    return true;
}

static int loop(job_t *job)
{
    size_t cap = 1 + 2 * (size_t)job->started;
    struct pollfd *pfd = calloc(cap, sizeof(*pfd));
    tr_stream_t **which = calloc(cap, sizeof(*which));
    int ret = 0;

    if (pfd == NULL || which == NULL) {
        report(job, "out of memory");
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    for (;;) {
        uint64_t now = tern_clock_ns(), wake_at;
        size_t n = 0;
        int timeout_ms = -1;

        if (!check_deadlines(job, now))
            break;
        pfd[n].fd = job->wake[0];
        pfd[n++].events = POLLIN;
        for (unsigned r = 0; r < job->started; r++) {
            tr_stream_t *s[2] = {&job->ranks[r].out, &job->ranks[r].err};
            for (int i = 0; i < 2; i++) {
                if (s[i]->fd < 0)
                    continue;
                pfd[n].fd = s[i]->fd;
                pfd[n].events = POLLIN;
                which[n++] = s[i];
            }
        }
        if (job->live == 0 && n == 1)
            break; /* every rank reaped, every pipe at EOF */
        wake_at = job->stop == RUNNING ? job->timeout_at : 0;
        if (job->stop != RUNNING && !job->killed && job->live > 0)
            wake_at = earliest(wake_at, job->kill_at);
        if (job->live == 0)
            wake_at = earliest(wake_at, job->drain_at);
        if (wake_at != 0) {
            uint64_t ms = wake_at > now ? (wake_at - now + 999999) / 1000000 : 0;
            timeout_ms = ms > INT_MAX ? INT_MAX : (int)ms;
        }
        if (poll(pfd, n, timeout_ms) < 0) {
            if (errno == EINTR)
                continue;
            report(job, "poll: %s", strerror(errno));
            ret = TR_EXIT_INTERNAL;
            goto out;
        }
        for (size_t i = 1; i < n; i++)
            if (pfd[i].revents != 0)
                tr_stream_read(which[i]);
        if (pfd[0].revents != 0)
            handle_signals(job);
        flush_outputs(job);
    }
out:
    free(pfd);
    free(which);
    return ret;
}

/* ---- the job ---- */

/* Whatever is left in the ranks' process groups ends with the job, as a Slurm
 * step's processes do: SIGKILL, then wait until the groups are empty. Waiting
 * matters: a process whose pipes are closed may still be exiting when the loop
 * sees their EOF. As the child subreaper, tern-run inherits what the ranks
 * orphaned and reaps it here, so zombies do not keep a group alive. */
static void end_groups(job_t *job)
{
    uint64_t deadline = tern_clock_ns() + END_NS;
    const struct timespec pause = {0, 2000000};
    char d[32];

    for (;;) {
        unsigned left = 0;
        tr_procs_t procs;
        bool have;

        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        have = tr_procs_load(&procs);
        for (unsigned r = 0; r < job->started; r++) {
            if (group_left(job, r, have ? &procs : NULL)) {
                kill(-job->ranks[r].pid, SIGKILL);
                left++;
            }
        }
        tr_procs_free(&procs);
        if (left == 0)
            return;
        if (tern_clock_ns() >= deadline) {
            report(job, "processes in %u rank%s process group%s did not end %s after SIGKILL",
                   left, left == 1 ? "'s" : "s'", left == 1 ? "" : "s",
                   fmt_duration(END_NS, d, sizeof(d)));
            return;
        }
        nanosleep(&pause, NULL);
    }
}

int tr_job_run(const tr_job_opts_t *opts)
{
    job_t job = {.opts = opts, .wake = {-1, -1}, .devnull = -1};
    int ret = 0, port = opts->master_port;

    sigprocmask(SIG_SETMASK, NULL, &job.orig_mask);
    job.out = malloc(sizeof(*job.out));
    job.err = malloc(sizeof(*job.err));
    job.ranks = calloc(opts->nranks, sizeof(*job.ranks));
    if (job.out == NULL || job.err == NULL || job.ranks == NULL) {
        free(job.out);
        free(job.err);
        job.out = job.err = NULL;
        report(&job, "out of memory");
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    tr_output_init(job.out, 1);
    tr_output_init(job.err, 2);
    for (unsigned r = 0; r < opts->nranks; r++)
        job.ranks[r].out.fd = job.ranks[r].err.fd = -1;
    if (pipe2(job.wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        report(&job, "cannot create the signal pipe: %s", strerror(errno));
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    job.devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (job.devnull < 0) {
        report(&job, "cannot open /dev/null: %s", strerror(errno));
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    if (port == 0 && (port = pick_free_port(&job)) < 0) {
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    if (!build_env(&job, port)) {
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    if (opts->bind_core && !bind_setup(&job)) {
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    sig_wake_fd = job.wake[1];
    /* Orphans of the ranks come to us rather than to init, so end_groups can
     * reap them. Without it (kernels before 3.4) they go to init as before. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (!install_handlers(&job)) {
        ret = TR_EXIT_INTERNAL;
        goto out;
    }
    if (opts->timeout_ns > 0)
        job.timeout_at = tern_clock_ns() + (uint64_t)opts->timeout_ns;
    for (unsigned r = 0; r < opts->nranks && job.stop == RUNNING; r++) {
        int st = start_rank(&job, r);
        if (st != 0)
            stop_job(&job, STOP_LAUNCH, st, 0);
    }
    ret = loop(&job);
    if (ret == 0 && job.stop != RUNNING)
        ret = job.exit_code;
out:
    /* Whatever went wrong above, no rank outlives tern-run or stays a zombie. */
    for (unsigned r = 0; job.ranks != NULL && r < job.started; r++) {
        rank_t *rank = &job.ranks[r];
        if (rank->live) {
            kill(-rank->pid, SIGKILL);
            while (waitpid(rank->pid, NULL, 0) < 0 && errno == EINTR) {
            }
            rank->live = false;
        }
    }
    if (job.ranks != NULL)
        end_groups(&job);
    for (unsigned r = 0; job.ranks != NULL && r < opts->nranks; r++) {
        tr_stream_drain(&job.ranks[r].out);
        tr_stream_drain(&job.ranks[r].err);
        tr_stream_close(&job.ranks[r].out);
        tr_stream_close(&job.ranks[r].err);
    }
    if (job.out != NULL)
        flush_outputs(&job);
    restore_handlers(&job);
    sig_wake_fd = -1;
    close_pair(job.wake);
    if (job.devnull >= 0)
        close(job.devnull);
    int die_by = job.stop == STOP_SIGNAL && ret == 128 + job.stop_signo ? job.stop_signo : 0;
    free(job.cores);
    free(job.envp);
    free(job.vars);
    free(job.ranks);
    free(job.out);
    free(job.err);
    /* Told to stop by SIGINT, SIGTERM or SIGHUP, end by that signal (with the
     * action found at start, restored above: ignored stays ignored), as the
     * program run directly would: a shell loop running tern-run then stops on
     * Ctrl-C rather than going on to the next turn (bash waits for its child
     * to die of SIGINT before it does). The shell still reports 128+signal.
     * Not SIGQUIT, whose default action dumps core. */
    if (die_by == SIGINT || die_by == SIGTERM || die_by == SIGHUP) {
        struct sigaction now;
        fflush(stdout);
        fflush(stderr);
        if (sigaction(die_by, NULL, &now) == 0 && now.sa_handler == SIG_DFL) {
            sigset_t one;
            sigemptyset(&one);
            sigaddset(&one, die_by);
            sigprocmask(SIG_UNBLOCK, &one, NULL);
            raise(die_by);
        }
    }
    return ret;
}
