/*
 * Line-prefixed output for tern-run: the bytes one rank writes to one pipe are
 * cut into lines, each written to tern-run's own stdout or stderr as
 * "[rank] line", so that lines of different ranks never interleave mid-line.
 *
 * Single-threaded: everything here runs on tern-run's one event-loop thread.
 */
#ifndef TERN_TOOLS_LINES_H
#define TERN_TOOLS_LINES_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes buffered per stream; a line longer than this goes out in pieces. */
#define TR_LINE_MAX (64 * 1024)
/* Bytes staged per output before a write(2). */
#define TR_STAGE_MAX (64 * 1024)

struct tr_stream;

/* One of tern-run's own output fds. Not owned: the fd is never closed here. */
typedef struct tr_output {
    int fd;
    /* The stream whose unfinished line the output currently ends in; anyone
     * else writing first ends that line with a newline. NULL: at a line start. */
    struct tr_stream *owner;
    bool broken; /* a write failed (EPIPE): output is discarded from now on */
    int error;   /* the errno of that write */
    size_t len;
    char stage[TR_STAGE_MAX];
} tr_output_t;

/* The read end of one rank's stdout or stderr pipe. */
typedef struct tr_stream {
    int fd; /* -1 once closed */
    tr_output_t *out;
    char prefix[24]; /* "[3] ", or "" with --no-prefix */
    size_t prefix_len;
    size_t len; /* bytes buffered in buf: always a partial line */
    char *buf;  /* TR_LINE_MAX bytes */
} tr_stream_t;

void tr_output_init(tr_output_t *out, int fd);

/* Write everything staged. When a write fails the output is marked broken
 * (with the errno in error) and from then on drops what it is given; the
 * caller reports that once. */
void tr_output_flush(tr_output_t *out);

/*
 * Print one of tern-run's own messages on out: staged lines go first, an
 * unfinished rank line is ended, and the message is written at once (msg
 * should end in a newline).
 */
void tr_output_message(tr_output_t *out, const char *msg, size_t len);

/* Set up s to read fd (made non-blocking) with the given prefix. On success s
 * owns fd (tr_stream_close closes it); on failure (no memory for the buffer)
 * s is unchanged and the caller still owns fd. */
bool tr_stream_init(tr_stream_t *s, int fd, tr_output_t *out, const char *prefix);

/*
 * Read once from the stream's fd and stage every complete line. Returns 1 when
 * bytes were read, 0 at end of file (the fd is then closed and a trailing
 * partial line staged), -1 when nothing was available (EAGAIN/EINTR). A read
 * error other than those is treated as end of file.
 */
int tr_stream_read(tr_stream_t *s);

/* Read until the pipe is empty or at end of file. */
void tr_stream_drain(tr_stream_t *s);

/* Close the fd (if open), stage any buffered partial line and free the buffer.
 * Safe twice, and on a stream never initialised if its fd is -1 and buf NULL. */
void tr_stream_close(tr_stream_t *s);

#endif
