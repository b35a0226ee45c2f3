/*
 * A snapshot of the machine's processes from /proc, to tell whether a process
 * group still belongs to this process's descendants. tern-run needs it because
 * a rank's process group id is the rank's pid: once the rank is reaped and its
 * group has emptied, the kernel may hand that number to an unrelated process,
 * which may make itself a group leader (setsid, a shell's job). Signalling
 * -pid then would reach someone else's processes.
 */
#ifndef TERN_TOOLS_PROCS_H
#define TERN_TOOLS_PROCS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct tr_proc {
    pid_t pid, ppid, pgrp;
} tr_proc_t;

typedef struct tr_procs {
    tr_proc_t *v; /* sorted by pid */
    size_t n;
} tr_procs_t;

/* Read every process's parent and group. False (with errno) when /proc cannot
 * be read: the caller decides what to do without the answer. */
bool tr_procs_load(tr_procs_t *procs);

/* Whether some process in group pgid is a descendant of the caller. */
bool tr_procs_group_ours(const tr_procs_t *procs, pid_t pgid);

void tr_procs_free(tr_procs_t *procs);

#endif
