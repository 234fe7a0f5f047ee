/* readout.c: the rows of a decode read (spec/llama-engine.md, "Many requests at once"): each task's own
 * through its kind's decoded, the SCOREs' logsumexps computed first over the engine's threads. The decode read
 * is the last llama_decode, or, with the GPU pipeline (gpu_pipe.c), the one before it, whose rows come from
 * llama.cpp's output ring (llama/patches/api/0010) while the device computes the next. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine.h"

/* The logsumexp of every row with logits that the decode's SCOREs hold, into
 * e->row_lse (NAN for the others), spread over the engine's threads. A row's
 * log-softmax needs its whole vocabulary's exponentials, the read-out's
 * largest part; on a GPU the CPU threads are idle then. Each row's number is
 * model_logsumexp of its logits whichever thread computes it, so the digits
 * are those of the one thread. The logits pointers are taken first, on this
 * thread (llama_get_logits_ith may reorder outputs on first use). */
static void rows_lse(engine *e, task *const *in, int n_in)
{
    int n = 0;
    for (int i = 0; i < e->batch.n_tokens; i++)
        e->row_lse[i] = NAN;
    for (int k = 0; k < n_in; k++) {
        const task *t = in[k];
        if (!t->ops->row_lse)
            continue;
        for (int r = t->row0; r < t->row0 + t->rows; r++)
            if (e->batch.logits[r]) {
                e->row_logits[n] = engine_logits(e, r);
                e->row_index[n++] = r;
            }
    }
    #pragma omp parallel for num_threads(e->n_threads) schedule(static) if (n > 1)
    for (int j = 0; j < n; j++)
        e->row_lse[e->row_index[j]] = model_logsumexp(e->row_logits[j], e->n_vocab);
}

/* Row `row`'s logits in the decode being read: llama_get_logits_ith, or, when that decode is the one before
 * the last llama_decode (the pipeline), llama_get_logits_prev_ith (llama.cpp's output ring: it waits for that
 * decode's copy to the host only). n_vocab floats. A row without them is a bug: the engine stops (the gateway
 * restarts it and answers the requests that were in it). */
const float *engine_logits(const engine *e, int row)
{
    const float *l = e->read_prev ? llamax_logits_prev_ith(e->ctx, row) : llama_get_logits_ith(e->ctx, row);
    if (!l) { /* a row the fill marked for logits always has them: llama.cpp's log above says why not */
        fprintf(stderr, "serveproto-llama: no logits for batch row %d (%s decode); stopping\n", row,
                e->read_prev ? "the previous" : "the last");
        abort();
    }
    return l;
}

/* Row `row`'s logsumexp in the decode being read: the one rows_lse computed, or
 * model_logsumexp of `logits` (its logits) for a row it did not. */
double readout_row_lse(const engine *e, int row, const float *logits)
{
    double v = e->row_lse[row];
    return isnan(v) ? model_logsumexp(logits, e->n_vocab) : v;
}

/* Reads the rows of the decode left in flight (its tasks, e->pend): each task's decoded, with e->batch
 * that decode's batch for the while. prev: a llama_decode was called since (the rows come from llama.cpp's
 * output ring), else it was the last one. With the late fill, the wait for the device is timed apart
 * (late_learn). */
void readout_pending(engine *e, int prev)
{
    const uint64_t t0 = e->prof.on ? profile_now_us() : 0;
    struct llama_batch filling = e->batch;
    e->batch = e->batch_pend;
    e->read_prev = prev;
    if (e->late.margin_us > 0) {
        int r = 0;
        while (prev && r < e->batch.n_tokens && !e->batch.logits[r])
            r++;
        if (prev && r < e->batch.n_tokens) { /* the wait for the device, apart: the first row with logits */
            const uint64_t w0 = profile_now_us();
            test_device_wait(e, 1);
            (void)engine_logits(e, r);
            late_learn(e, w0, profile_now_us());
        } else {
            /* read at once (nothing queued behind it, the host idle next), or a decode without logits (no
             * event to time it by): nothing learned, nothing carried to the next read */
            e->late.end_us = 0;
            e->late.left_us = 0;
            e->late.after_late = 0;
        }
    }
    test_device_wait(e, prev); /* (done already when timed above) */
    rows_lse(e, e->pend, e->n_pend);
    if (e->prof.on)
        e->prof.lse_us += profile_now_us() - t0;
    for (int i = 0; i < e->n_pend; i++) {
        task *t = e->pend[i];
        t->pending = 0;
        t->served = e->decodes;
        t->ops->decoded(e, t);
        if (t->state != TASK_FREE)
            t->rows = 0;
    }
    e->read_prev = 0;
    e->n_pend = 0;
    e->batch_pend = e->batch;
    e->batch = filling;
    if (e->prof.on)
        e->prof.readout_us += profile_now_us() - t0;
}
