/* Cutting the ranks' output into prefixed lines. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lines.h"

/* Write all of p, waiting when out's fd is non-blocking and full. Returns false
 * on any other error. */
static bool write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                /* We may have inherited a non-blocking fd; a pipe reader that
                 * is slow must slow us down, not lose lines. */
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                (void)poll(&pfd, 1, -1);
                continue;
            }
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

void tr_output_init(tr_output_t *out, int fd)
{
    out->fd = fd;
    out->owner = NULL;
    out->broken = false;
    out->error = 0;
    out->len = 0;
}

/* Write p to out, or mark it broken. The ranks' pipes keep being drained
 * after that, so that no rank blocks on a full pipe; what they print has
 * nowhere to go. */
static void put(tr_output_t *out, const char *p, size_t n)
{
    if (!out->broken && !write_all(out->fd, p, n)) {
        out->broken = true;
        out->error = errno;
    }
}

void tr_output_flush(tr_output_t *out)
{
    size_t n = out->len;

    out->len = 0;
    if (n > 0)
        put(out, out->stage, n);
}

static void stage(tr_output_t *out, const char *p, size_t n)
{
    if (out->broken)
        return;
    if (out->len + n > sizeof(out->stage))
        tr_output_flush(out);
    if (n > sizeof(out->stage)) {
        put(out, p, n);
        return;
    }
    memcpy(out->stage + out->len, p, n);
    out->len += n;
}

void tr_output_message(tr_output_t *out, const char *msg, size_t len)
{
    tr_output_flush(out);
    if (out->owner != NULL) {
        /* A rank's unfinished line must not swallow the start of our message. */
        stage(out, "\n", 1);
        out->owner = NULL;
    }
    stage(out, msg, len);
    tr_output_flush(out);
}

/* Stage n bytes of s's current line; complete: they end it (with its '\n'). */
static void emit(tr_stream_t *s, const char *p, size_t n, bool complete)
{
    tr_output_t *out = s->out;

    if (out->owner != s) {
        /* Another stream left the output mid-line: end its line there; it
         * resumes under a fresh prefix. */
        if (out->owner != NULL)
            stage(out, "\n", 1);
        stage(out, s->prefix, s->prefix_len);
    }
    stage(out, p, n);
    out->owner = complete ? NULL : s;
}

/* Stage the complete lines in s->buf; keep the partial tail. */
static void cut_lines(tr_stream_t *s)
{
    size_t start = 0;
    char *nl;

    while (start < s->len && (nl = memchr(s->buf + start, '\n', s->len - start)) != NULL) {
        size_t end = (size_t)(nl - s->buf) + 1;
        emit(s, s->buf + start, end - start, true);
        start = end;
    }
    if (start > 0) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
    if (s->len == TR_LINE_MAX) {
        /* A line longer than the buffer: send this piece now; the rest follows
         * on the same output line unless another rank's line cuts in. */
        emit(s, s->buf, s->len, false);
        s->len = 0;
    }
}

bool tr_stream_init(tr_stream_t *s, int fd, tr_output_t *out, const char *prefix)
{
    s->buf = malloc(TR_LINE_MAX);
    if (s->buf == NULL)
        return false;
    s->fd = fd;
    s->out = out;
    s->len = 0;
    snprintf(s->prefix, sizeof(s->prefix), "%s", prefix);
    s->prefix_len = strlen(s->prefix);
    /* Reads must never block the loop: a drain reads until EAGAIN. */
    (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return true;
}

int tr_stream_read(tr_stream_t *s)
{
    ssize_t r;

    if (s->fd < 0)
        return 0;
    r = read(s->fd, s->buf + s->len, TR_LINE_MAX - s->len);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return -1;
    if (r <= 0) {
        tr_stream_close(s);
        return 0;
    }
    s->len += (size_t)r;
    cut_lines(s);
    return 1;
}

void tr_stream_drain(tr_stream_t *s)
{
    while (tr_stream_read(s) > 0) {
    }
}

void tr_stream_close(tr_stream_t *s)
{
    if (s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
    if (s->buf != NULL && s->len > 0) {
        /* The last line had no newline; it goes out as it was, and the next
         * writer to this output ends it. */
        emit(s, s->buf, s->len, false);
        s->len = 0;
    }
    free(s->buf);
    s->buf = NULL;
}
