/*
 * Running one local job: N ranks of a program, their output prefixed, signals
 * forwarded, the job stopped as a whole when one rank fails. The command line
 * is parsed in tern-run.c; this is the part that owns processes.
 */
#ifndef TERN_TOOLS_LAUNCH_H
#define TERN_TOOLS_LAUNCH_H

#include <stdbool.h>
#include <stdint.h>

/* The largest -n: each rank costs tern-run two pipe fds and 128 KiB of buffers. */
#define TR_MAX_RANKS 4096

/* Exit statuses of tern-run itself (the others are a rank's, or 128+signal). */
enum {
    TR_EXIT_INTERNAL = 1, /* a system call tern-run needs failed */
    TR_EXIT_USAGE = 2,    /* bad command line or environment */
    TR_EXIT_TIMEOUT = 124,
    TR_EXIT_NOEXEC = 126,   /* the program exists but cannot be run */
    TR_EXIT_NOTFOUND = 127, /* no such program */
};

typedef struct tr_job_opts {
    unsigned nranks;       /* 1..TR_MAX_RANKS */
    int master_port;       /* 0: bind 127.0.0.1:0 and use the port the kernel picks */
    bool prefix;           /* prefix each output line with "[rank] " */
    int64_t kill_grace_ns; /* SIGTERM to SIGKILL when stopping the job */
    int64_t timeout_ns;    /* 0: none */
    bool bind_core;        /* bind rank r to core r mod cores (--bind-to core) */
    char *const *argv;     /* program and arguments, NULL-terminated; not owned */
} tr_job_opts_t;

/*
 * Launch and supervise the job until every rank has exited and its output is
 * drained. Reports every problem itself on stderr as "tern-run: ...".
 * Returns tern-run's exit status: 0 when every rank exited 0; the first
 * failing rank's status (128+signal if it was killed); TR_EXIT_TIMEOUT;
 * 128+signal when tern-run was told to stop by SIGINT/SIGTERM/SIGHUP/SIGQUIT;
 * TR_EXIT_NOTFOUND/TR_EXIT_NOEXEC when the program cannot be run;
 * TR_EXIT_INTERNAL when a system call tern-run needs failed. Every rank has
 * been reaped when it returns.
 */
int tr_job_run(const tr_job_opts_t *opts);

#endif
