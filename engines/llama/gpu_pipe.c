/* gpu_pipe.c: the GPU pipeline (spec/llama-engine.md, "Many requests at once"). e->pipeline,
 * SERVEPROTO_PIPELINE=N; on by default on a
 * local GPU, whose llama_decode returns with the decode queued, off on the
 * CPU; it reads from llama.cpp's output ring, llama/patches/api/0010: a decode's rows may be
 * left unread (its tasks pending) while the next decode is filled from the
 * other tasks and queued; the rows are read once it is, from the ring, while
 * the device computes (readout.c). So the device goes from one decode to the next without
 * waiting for the host's read-out, fill and graph build. A pending task gives
 * no rows to the next decode (it needs its own read first), so the step
 * leaves a decode pending only when the others want at least e->pipeline
 * rows and at least half the rows of the decode in flight; else it reads the
 * rows at once, as without the pipeline.
 *
 * While it decides, the step waits for the next requests on stdin through the engine's input hook
 * (e->input, main.c's), starting each as it comes (tasks.c): for a while after a read that ended requests
 * (wait_for_more), or with the late fill until the next decode is due (late_wait; late_fill.c). */
#include "engine.h"

/* The rows the runnable tasks outside the decode in flight want. */
static int others_want(engine *e)
{
    int rows = 0;
    for (int i = 0; i < ENGINE_QUEUE_MAX; i++) {
        task *t = &e->tasks[i];
        if (t->state != TASK_RUNNING || t->pending)
            continue;
        int w = t->ops->want(e, t);
        if (t->state == TASK_RUNNING && w > 0)
            rows += w;
    }
    return rows;
}

/* Leave the decode just queued in flight, its rows unread, and fill the next one first (the pipeline, the
 * header comment)? Only when the tasks that are not in it want at least e->pipeline rows and half of its. */
static int keep_pending(engine *e, int rows)
{
    return e->pipeline && rows >= e->pipeline && 2 * rows >= e->batch_pend.n_tokens;
}

/* After a read from the ring that ended requests, their clients' next requests are on their way (the
 * gateway sends a slot's next request on its DONE) while the device still computes the decode just
 * queued: wait for them up to e->pipe_wait_ms, starting each as it comes, until the other tasks want rows
 * enough to keep that decode pending and at least e->pipe_fill. Returns keep_pending's answer. */
static int wait_for_more(engine *e, int ended)
{
    if (!e->pipeline)
        return 0;
    int rows = others_want(e), keep = keep_pending(e, rows);
    if (!ended || e->pipe_wait_ms <= 0)
        return keep;
    uint64_t end = profile_now_us() + (uint64_t)e->pipe_wait_ms * 1000u;
    for (uint64_t now = profile_now_us(); !(keep && rows >= e->pipe_fill) && now < end && !e->in.eof;
         now = profile_now_us()) {
        e->input.wait(e->input.ctx, (int)((end - now + 999) / 1000));
        tasks_start_early(e);
        if (e->prof.on)
            e->prof.waited++;
        rows = others_want(e);
        keep = keep_pending(e, rows);
    }
    return keep;
}

/* The late fill's wait (late_fill.c), the decode just queued in flight and the one before read:
 * starts the requests that arrive until that decode's predicted end on the device less the host's lead
 * and the margin, or until the others want a ubatch of rows (a full decode gains nothing by waiting), at
 * most LATE_MAX_US. Returns keep_pending's answer for the rows the others want then. Before the device
 * and the host are measured, the pipeline's own wait (wait_for_more). */
static int late_wait(engine *e, int ended)
{
    late_fill *l = &e->late;
    uint64_t due;
    if (!late_due(l, e->batch_pend.n_tokens, &due))
        return wait_for_more(e, ended);
    const uint64_t t0 = profile_now_us();
    uint64_t now = t0;
    int rows = others_want(e), waited = 0;
    for (; rows < e->n_ubatch && now + 1000 <= due && !e->in.eof; now = profile_now_us()) {
        e->input.wait(e->input.ctx, (int)((due - now) / 1000));
        tasks_start_early(e);
        rows = others_want(e);
        waited = 1;
    }
    l->after_late = waited;
    if (waited && e->prof.on) {
        e->prof.late++;
        e->prof.late_us += now - t0;
    }
    return keep_pending(e, rows);
}

/* The decode just queued (its tasks in[0..n_in)) goes in flight: its batch becomes e->batch_pend, its
 * tasks pending, e->batch free for the next fill. Its rows are read by pipe_keep_or_read, at once or in
 * a later step. */
void pipe_queued(engine *e, task *const *in, int n_in)
{
    struct llama_batch b = e->batch;
    e->batch = e->batch_pend;
    e->batch_pend = b;
    for (int i = 0; i < n_in; i++) {
        in[i]->pending = 1;
        e->pend[i] = in[i];
    }
    e->n_pend = n_in;
}

/* Keeps the decode in flight pending (its rows read after the next llama_decode, from the ring) when the
 * pipeline's wait, or the late fill's (late: SERVEPROTO_PIPELINE_LATE with the pipeline), finds the other
 * tasks want rows enough; else reads its rows now. ended: requests the read before this step's decode ended.
 * Returns the microseconds waited for the device before a read now, when profiled (else 0). */
uint64_t pipe_keep_or_read(engine *e, int ended, int late)
{
    uint64_t t_sync = 0;
    if (late ? late_wait(e, ended) : wait_for_more(e, ended)) {
        if (late)
            e->late.left_us = profile_now_us();
        if (e->prof.on)
            e->prof.pipelined++;
    } else {
        if (e->prof.on) {
            const uint64_t t0 = profile_now_us();
            llama_synchronize(e->ctx);
            t_sync = profile_now_us() - t0;
        }
        readout_pending(e, 0);
    }
    return t_sync;
}
