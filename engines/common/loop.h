/* loop.h: the frame -> task -> control loop every engine runs
 * (spec/serve-protocol.md; both engines/llama and engines/fixture).
 *
 * An sp_loop reads stdin (fd 0) into its sp_reader and takes every complete
 * frame in turn (sp_loop_drain):
 *   - a malformed frame: ERROR <id> <code> <reason>, as the reader gives it;
 *   - STOP <id>, CANCEL <id>: the engine's stop / cancel of the request in
 *     flight with that id (ops->find); none: ERROR <id> NOT_FOUND with the
 *     engine's reason, not_found[0] <id> not_found[1];
 *   - PING <id>: ERROR <id> DUPLICATE_ID "id <id> is in flight" when a
 *     request in flight has that id, else PONG <id> active=<ops->active>;
 *   - any other request (SUBMIT, SCORE, DECIDE, IMAGE): ops->request, the
 *     engine's own (its checks, its task).
 * A write that fails (stdout is gone: w->failed) ends the drain; the frames
 * left stay buffered and the engine, which sees w->failed, exits.
 * Nothing here is thread-safe; the hooks run on the caller's thread (the
 * llama engine calls sp_loop_poll from inside llama_decode too).
 */
#ifndef SERVEPROTO_LOOP_H
#define SERVEPROTO_LOOP_H

#include "frame.h"

/* The engine's part of the loop. eng is the engine's pointer, given back to
 * every hook; task is what find returned (the engine's own type). */
typedef struct sp_loop_ops {
    /* A work request. It may keep rq's buffers (zeroing *rq); the loop frees
     * what is left. */
    void (*request)(void *eng, sp_request *rq);
    /* The request in flight with this id, or NULL. */
    void *(*find)(void *eng, uint64_t id);
    /* STOP <id> / CANCEL <id> of the request find returned. */
    void (*stop)(void *eng, void *task);
    void (*cancel)(void *eng, void *task, uint64_t id);
    /* Requests in flight: PONG's active=. */
    int (*active)(void *eng);
    /* NOT_FOUND's reason around the id, e.g. { "no request ", " in flight" }. */
    const char *not_found[2];
    /* The engine's name, the prefix of its stderr lines. */
    const char *name;
} sp_loop_ops;

typedef struct sp_loop {
    sp_reader rd;
    sp_writer *w;
    const sp_loop_ops *ops;
    void *eng;
    int eof; /* stdin ended and every frame of it was taken */
} sp_loop;

/* Reads requests with the extensions in ext (SP_EXT_*) and answers through w.
 * Returns 0, or -1 when out of memory. */
int sp_loop_init(sp_loop *l, unsigned ext, sp_writer *w, const sp_loop_ops *ops, void *eng);
void sp_loop_free(sp_loop *l);

/* Takes every complete frame buffered (see above); sets eof at the end of
 * the input. */
void sp_loop_drain(sp_loop *l);

/* One read() of stdin into the buffer (it blocks while stdin has nothing).
 * EINTR / EAGAIN: nothing read; any other error ends the input (stderr says
 * why), as an end of file does. */
void sp_loop_read(sp_loop *l);

/* Waits at most timeout_ms milliseconds (-1: no limit) for stdin to be
 * readable, reads once when it is, then drains. */
void sp_loop_wait(sp_loop *l, int timeout_ms);

/* Without blocking: reads and drains while stdin has bytes (or its end),
 * then drains what is buffered. */
void sp_loop_poll(sp_loop *l);

#endif
