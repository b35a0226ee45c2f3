/* See procs.h. Linux only, like the rest of tern-run (prctl, /proc). */
#include "procs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Fields 4 and 5 of /proc/<pid>/stat; the command name before them is in
 * parentheses and may itself hold spaces and ')', so parse from the last ')'. */
static bool read_stat(int dirfd, const char *name, tr_proc_t *p)
{
    char path[64], buf[512];
    char *end;
    int fd, ppid, pgrp;
    ssize_t len;

    snprintf(path, sizeof(path), "%s/stat", name);
    fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false; /* it exited since readdir */
    len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return false;
    buf[len] = '\0';
    end = strrchr(buf, ')');
    if (end == NULL || sscanf(end + 1, " %*c %d %d", &ppid, &pgrp) != 2)
        return false;
    p->pid = (pid_t)strtol(name, NULL, 10);
    p->ppid = ppid;
    p->pgrp = pgrp;
    return true;
}

static int by_pid(const void *a, const void *b)
{
    pid_t x = ((const tr_proc_t *)a)->pid, y = ((const tr_proc_t *)b)->pid;
    return (x > y) - (x < y);
}

bool tr_procs_load(tr_procs_t *procs)
{
    DIR *dir = opendir("/proc");
    struct dirent *de;
    size_t cap = 256;

    procs->n = 0;
    procs->v = NULL;
    if (dir == NULL)
        return false;
    procs->v = malloc(cap * sizeof(*procs->v));
    if (procs->v == NULL) {
        closedir(dir);
        errno = ENOMEM;
        return false;
    }
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        if (procs->n == cap) {
            tr_proc_t *v = realloc(procs->v, 2 * cap * sizeof(*v));
            if (v == NULL) {
                tr_procs_free(procs);
                closedir(dir);
                errno = ENOMEM;
                return false;
            }
            procs->v = v;
            cap *= 2;
        }
        if (read_stat(dirfd(dir), de->d_name, &procs->v[procs->n]))
            procs->n++;
    }
    closedir(dir);
    qsort(procs->v, procs->n, sizeof(*procs->v), by_pid);
    return true;
}

static const tr_proc_t *find(const tr_procs_t *procs, pid_t pid)
{
    tr_proc_t key = {.pid = pid};
    return bsearch(&key, procs->v, procs->n, sizeof(key), by_pid);
}

static bool descends_from(const tr_procs_t *procs, const tr_proc_t *p, pid_t self)
{
    /* Each step goes to a parent, so more steps than processes means a loop,
     * which a snapshot taken while processes come and go can show. */
    for (size_t steps = 0; p != NULL && steps <= procs->n; steps++) {
        if (p->ppid == self)
            return true;
        if (p->ppid <= 1)
            return false;
        p = find(procs, p->ppid);
    }
    return false;
}

bool tr_procs_group_ours(const tr_procs_t *procs, pid_t pgid)
{
    pid_t self = getpid();

    for (size_t i = 0; i < procs->n; i++)
        if (procs->v[i].pgrp == pgid && descends_from(procs, &procs->v[i], self))
            return true;
    return false;
}

void tr_procs_free(tr_procs_t *procs)
{
    free(procs->v);
    procs->v = NULL;
    procs->n = 0;
}
