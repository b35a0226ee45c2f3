/*
 * rank_probe: a program for tern-run's tests to launch. Its arguments are a
 * list of commands run in order; "@R cmd" runs cmd on rank R only (the rank
 * comes from TERN_RANK). Output goes through write(2) so nothing sits in a
 * stdio buffer when a test looks.
 *
 *   env              print "rank=.. world=.. local=.. local_world=.. addr=.. port=.."
 *   getenv NAME      print "NAME=value" or "NAME unset"
 *   echo TEXT        print TEXT and a newline
 *   tail TEXT        print TEXT without a newline
 *   partial          print one line in two writes, 100 ms apart
 *   lines N          print "out R i" on stdout and "err R i" on stderr, i < N
 *   long N           print one line of N bytes (the alphabet, repeated)
 *   cat              copy stdin to stdout
 *   fds              print "fds" and our open file descriptors ("fds 0 1 2")
 *   pidfile DIR      write our pid to DIR/rank.R.pid
 *   fork DIR         start a child that sleeps 60 s (holding our stdout and
 *                    stderr); write its pid to DIR/child.R.pid
 *   detach DIR       the same, but the child's stdout and stderr are /dev/null
 *   sleep SECONDS    sleep (fractions allowed)
 *   ignoreterm       ignore SIGTERM from now on
 *   waitsig          print "rank R ready", wait for SIGTERM, SIGINT, SIGHUP or
 *                    SIGUSR1, then print "rank R got SIGxxx"
 *   exit CODE        exit with CODE
 *   crash            die of SIGSEGV
 *
 * Built without sanitizers: their SIGSEGV handler would turn "crash" into a
 * report and an exit status.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank = -1;

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            exit(101);
        }
        p += w;
        n -= (size_t)w;
    }
}

static void say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(int fd, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0)
        exit(102);
    write_all(fd, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v ? v : dflt;
}

static void sleep_seconds(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static void write_pidfile(const char *dir, const char *what, pid_t pid)
{
    char path[4096], tmp[4096 + 8];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s.%d.pid", dir, what, rank);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (f == NULL || fprintf(f, "%ld\n", (long)pid) < 0 || fclose(f) != 0 ||
        rename(tmp, path) != 0) {
        say(2, "rank_probe: cannot write %s: %s\n", path, strerror(errno));
        exit(103);
    }
}

static volatile sig_atomic_t got_signal;

static void on_signal(int signo)
{
    got_signal = signo;
}

static void wait_signal(void)
{
    static const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};
    struct sigaction sa;
    sigset_t block, old;
    const char *name = "?";

    sigemptyset(&block);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaddset(&block, sigs[i]);
    sigprocmask(SIG_BLOCK, &block, &old);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaction(sigs[i], &sa, NULL);
    got_signal = 0;
    say(1, "rank %d ready\n", rank);
    while (got_signal == 0)
        sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
    switch (got_signal) {
    case SIGTERM: name = "SIGTERM"; break;
    case SIGINT: name = "SIGINT"; break;
    case SIGHUP: name = "SIGHUP"; break;
    case SIGUSR1: name = "SIGUSR1"; break;
    }
    say(1, "rank %d got %s\n", rank, name);
}

static const char *need(int argc, char **argv, int i)
{
    if (i >= argc) {
        say(2, "rank_probe: '%s' needs an argument\n", argv[i - 1]);
        exit(104);
    }
    return argv[i];
}

int main(int argc, char **argv)
{
    const char *r = getenv("TERN_RANK");

    rank = r ? atoi(r) : -1;
    for (int i = 1; i < argc; i++) {
        const char *cmd = argv[i];

        if (cmd[0] == '@') {
            int only = atoi(cmd + 1);
            i++;
            if (i >= argc)
                break;
            if (only != rank) {
                /* Skip the command and its argument, if it takes one. */
                static const char *const with_arg[] = {"getenv", "echo", "tail", "lines", "long",
                                                       "pidfile", "fork", "detach", "sleep",
                                                       "exit"};
                for (size_t k = 0; k < sizeof(with_arg) / sizeof(with_arg[0]); k++)
                    if (strcmp(argv[i], with_arg[k]) == 0)
                        i++;
                continue;
            }
            cmd = argv[i];
        }
        if (strcmp(cmd, "env") == 0) {
            say(1, "rank=%s world=%s local=%s local_world=%s addr=%s port=%s\n",
                env_or("TERN_RANK", "unset"), env_or("TERN_WORLD_SIZE", "unset"),
                env_or("TERN_LOCAL_RANK", "unset"), env_or("TERN_LOCAL_WORLD_SIZE", "unset"),
                env_or("MASTER_ADDR", "unset"), env_or("MASTER_PORT", "unset"));
        } else if (strcmp(cmd, "getenv") == 0) {
            const char *name = need(argc, argv, ++i);
            const char *v = getenv(name);
            if (v)
                say(1, "%s=%s\n", name, v);
            else
                say(1, "%s unset\n", name);
        } else if (strcmp(cmd, "echo") == 0) {
            say(1, "%s\n", need(argc, argv, ++i));
        } else if (strcmp(cmd, "tail") == 0) {
            say(1, "%s", need(argc, argv, ++i));
        } else if (strcmp(cmd, "partial") == 0) {
            say(1, "first half ");
            sleep_seconds(0.1);
            say(1, "second half\n");
        } else if (strcmp(cmd, "lines") == 0) {
            int n = atoi(need(argc, argv, ++i));
            for (int k = 0; k < n; k++) {
                say(1, "out %d %d\n", rank, k);
                say(2, "err %d %d\n", rank, k);
            }
        } else if (strcmp(cmd, "long") == 0) {
            size_t n = (size_t)atol(need(argc, argv, ++i));
            char *line = malloc(n + 1);
            if (line == NULL)
                return 105;
            for (size_t k = 0; k < n; k++)
                line[k] = (char)('a' + k % 26);
            line[n] = '\n';
            write_all(1, line, n + 1);
            free(line);
        } else if (strcmp(cmd, "cat") == 0) {
            char buf[4096];
            ssize_t n;
            while ((n = read(0, buf, sizeof(buf))) > 0)
                write_all(1, buf, (size_t)n);
        } else if (strcmp(cmd, "fds") == 0) {
            char list[4096] = "fds";
            DIR *d = opendir("/proc/self/fd");
            struct dirent *e;
            if (d == NULL)
                return 108;
            while ((e = readdir(d)) != NULL) {
                if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
                    continue;
                snprintf(list + strlen(list), sizeof(list) - strlen(list), " %s", e->d_name);
            }
            closedir(d);
            say(1, "%s\n", list);
        } else if (strcmp(cmd, "pidfile") == 0) {
            write_pidfile(need(argc, argv, ++i), "rank", getpid());
        } else if (strcmp(cmd, "fork") == 0 || strcmp(cmd, "detach") == 0) {
            const char *dir = need(argc, argv, ++i);
            pid_t pid = fork();
            if (pid < 0)
                return 106;
            if (pid == 0) {
                if (cmd[0] == 'd') {
                    int null = open("/dev/null", O_WRONLY);
                    if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
                        _exit(108);
                }
                sleep_seconds(60);
                _exit(0);
            }
            write_pidfile(dir, "child", pid);
        } else if (strcmp(cmd, "sleep") == 0) {
            sleep_seconds(atof(need(argc, argv, ++i)));
        } else if (strcmp(cmd, "ignoreterm") == 0) {
            signal(SIGTERM, SIG_IGN);
        } else if (strcmp(cmd, "waitsig") == 0) {
            wait_signal();
        } else if (strcmp(cmd, "exit") == 0) {
            return atoi(need(argc, argv, ++i));
        } else if (strcmp(cmd, "crash") == 0) {
            signal(SIGSEGV, SIG_DFL);
            raise(SIGSEGV);
            return 107;
        } else {
            say(2, "rank_probe: unknown command '%s'\n", cmd);
            return 100;
        }
    }
    return 0;
}
