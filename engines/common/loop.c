/* loop.c: the frame -> task -> control loop (loop.h). */
#include "loop.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

int sp_loop_init(sp_loop *l, unsigned ext, sp_writer *w, const sp_loop_ops *ops, void *eng)
{
    memset(l, 0, sizeof *l);
    l->w = w;
    l->ops = ops;
    l->eng = eng;
    return sp_reader_init(&l->rd, ext);
}

void sp_loop_free(sp_loop *l)
{
    sp_reader_free(&l->rd);
}

/* STOP, CANCEL and PING: answered here through the engine's hooks. */
static void control(sp_loop *l, const sp_request *rq)
{
    const sp_loop_ops *o = l->ops;
    void *t = o->find(l->eng, rq->id);
    if (rq->kind == SP_PING) {
        if (t) {
            sp_write_error(l->w, rq->id, "DUPLICATE_ID", "id %llu is in flight", (unsigned long long)rq->id);
        } else {
            char fields[32];
            snprintf(fields, sizeof fields, "active=%d", o->active(l->eng));
            sp_write_pong(l->w, rq->id, fields);
        }
    } else if (!t) {
        sp_write_error(l->w, rq->id, "NOT_FOUND", "%s%llu%s", o->not_found[0], (unsigned long long)rq->id,
                       o->not_found[1]);
    } else if (rq->kind == SP_STOP) {
        o->stop(l->eng, t);
    } else {
        o->cancel(l->eng, t, rq->id);
    }
}

void sp_loop_drain(sp_loop *l)
{
    while (!l->w->failed) {
        sp_request rq;
        sp_error err;
        memset(&rq, 0, sizeof rq);
        sp_status st = sp_reader_next(&l->rd, &rq, &err);
        if (st == SP_BAD) {
            sp_write_error(l->w, err.id, err.code, "%s", err.reason);
            continue;
        }
        if (st != SP_FRAME) {
            if (st == SP_EOF)
                l->eof = 1;
            return;
        }
        if (rq.kind == SP_STOP || rq.kind == SP_CANCEL || rq.kind == SP_PING)
            control(l, &rq);
        else
            l->ops->request(l->eng, &rq);
        sp_request_free(&rq);
    }
}

void sp_loop_read(sp_loop *l)
{
    ssize_t r = sp_reader_fill(&l->rd, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (r < 0) {
        fprintf(stderr, "%s: reading stdin: %s\n", l->ops->name, strerror(errno));
        sp_reader_feed(&l->rd, NULL, 0);
    }
}

void sp_loop_wait(sp_loop *l, int timeout_ms)
{
    struct pollfd p = { .fd = 0, .events = POLLIN };
    if (!l->eof && poll(&p, 1, timeout_ms) > 0)
        sp_loop_read(l);
    sp_loop_drain(l);
}

void sp_loop_poll(sp_loop *l)
{
    if (!l->eof) {
        struct pollfd p = { .fd = 0, .events = POLLIN };
        while (poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            sp_loop_read(l);
            sp_loop_drain(l);
            if (l->eof)
                break;
        }
    }
    sp_loop_drain(l);
}
