/* sched.c: many requests in one llama_decode, fairly (spec/llama-engine.md,
 * "Many requests at once").
 *
 * Every request in flight is a task (engine.h). Each step starts the tasks
 * that arrived (tasks.c), answers the cancelled ones, then fills one llama_decode from
 * every runnable task (a prefill chunk, a generation step, a SCORE trunk
 * chunk or trie chunk): at most one ubatch of rows in all, each task at most
 * its share of it (n_ubatch / runnable tasks, and at most --chunk rows while
 * others run too), least recently served first. So a runnable task waits at
 * most one decode of one ubatch for its next chunk (with few tasks, one of
 * a few chunks), and a CANCEL aborts the decode its task is
 * in within one ubatch: the other tasks of that decode put their rows back
 * (undo) and take the same chunk again in the next one.
 *
 * A step: the tasks started (tasks.c), the cancelled answered, the batch filled in turns (allot) and
 * padded (pad.c), llama_decode, then the rows of a decode read (readout.c): this one's at once, or with the
 * GPU pipeline (gpu_pipe.c; its late fill, late_fill.c) the one left in flight before it, while the device
 * computes this one. On the CPU the tests' pretend device (test_device.c) stands in for a GPU's timing.
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine.h"

typedef struct turn {
    task *t;
    int unit, want, give;
} turn;

/* Least recently served first, then first arrived. */
static int by_turn(const void *pa, const void *pb)
{
    const task *a = ((const turn *)pa)->t, *b = ((const turn *)pb)->t;
    if (a->served != b->served)
        return a->served < b->served ? -1 : 1;
    return a->arrival < b->arrival ? -1 : a->arrival > b->arrival;
}

/* The lease (spec/llama-engine.md, "Prompts longer than a slot"): a slot's
 * sequence holds at most n_ctx positions, except one slot's at a time, the
 * lease's, which may grow to n_ctx_max into the n_ctx_max - n_ctx cells the
 * cache holds for it. So every slot always has its n_ctx cells, SCORE its
 * scratch share, and the long prompt its own: nothing another request does
 * can leave one without room. Returns 1 when `slot` holds the lease now (or
 * takes it: no lease, or a lease slot back within n_ctx, or one whose slot
 * serves no request, which is truncated to n_ctx: its cached positions past
 * n_ctx go), 0 when a request in flight on another slot holds it (the caller
 * waits: its rows wait for a later decode). */
int sched_lease(engine *e, int slot)
{
    int ls = e->lease_slot;
    if (ls == slot)
        return 1;
    if (ls >= 0 && e->slots[ls].n > e->n_ctx) {
        for (int i = 0; i < ENGINE_QUEUE_MAX; i++)
            if (task_started(&e->tasks[i]) && (int)e->tasks[i].rq.slot == ls)
                return 0;
        slot_truncate(e, ls, e->n_ctx);
    }
    e->lease_slot = slot;
    return 1;
}

/* The rows of t's fill (batch rows row0 .. row0+rows-1) that extend its
 * slot's own sequence: a prefill or trunk chunk, a generation step (a SCORE's
 * trie rows are in scratch sequences). */
static int slot_rows(const engine *e, const task *t)
{
    int slot = (int)t->rq.slot, n = 0;
    for (int i = t->row0; i < t->row0 + t->rows; i++)
        n += e->batch.n_seq_id[i] >= 1 && e->batch.seq_id[i][0] == slot;
    return n;
}

/* Rows the batch gives each runnable task. Alone, a task takes up to the
 * whole budget (one ubatch). Shared, each takes its share (budget / tasks,
 * at most n_chunk) and then what the others left, still at most n_chunk,
 * in turn order: a decode shared with others is short, so the next chunk of
 * every task comes soon. A task always gets at least its unit if it gets
 * anything, and the first one always does, even past the budget (one SCORE
 * option longer than a ubatch then runs in a decode of its own). */
static void allot(turn *tu, int n, int budget, int chunk)
{
    int cap = n == 1 ? budget : chunk;
    int left = budget, share = budget / n > 0 ? budget / n : 1;
    if (share > cap)
        share = cap;
    for (int i = 0; i < n; i++) {
        int g = tu[i].want < share ? tu[i].want : share;
        if (g < tu[i].unit)
            g = tu[i].unit;
        if (g > left)
            g = left >= tu[i].unit ? left : i == 0 ? tu[i].unit : 0;
        tu[i].give = g;
        left = left > g ? left - g : 0;
    }
    for (int i = 0; i < n && left > 0; i++) {
        if (tu[i].give == 0 || tu[i].give >= cap)
            continue;
        int more = (tu[i].want < cap ? tu[i].want : cap) - tu[i].give;
        if (more > left)
            more = left;
        if (more > 0) {
            tu[i].give += more;
            left -= more;
        }
    }
}

/* A step with nothing to decode: the rows of the decode left in flight now, since nothing can be queued
 * behind it (returns 1), else the step was idle (returns `worked`). */
static int no_decode(engine *e, int worked)
{
    if (e->n_pend > 0) {
        readout_pending(e, 0);
        return 1;
    }
    if (e->prof.on)
        profile_idle(&e->prof);
    return worked;
}

/* Answers the cancelled tasks with no rows in flight (a pending one: after its rows are read). Returns 1
 * when it answered any. */
static int answer_cancelled(engine *e)
{
    int any = 0;
    for (int i = 0; i < ENGINE_QUEUE_MAX; i++) {
        task *t = &e->tasks[i];
        if (t->state == TASK_CANCELLED && !t->pending) { /* a pending one: after its rows are read */
            sp_write_error(&e->w, t->rq.id, "CANCELLED", "cancelled");
            task_end(e, t);
            any = 1;
        }
    }
    return any;
}

/* Fills e->batch from the runnable tasks, least recently served first, each at most its allotment: the
 * tasks that gave rows go to in[] (returns how many; 0: none can run). *wanted: the rows they all wanted
 * (the profile's); *worked set when a task ended or filled. */
static int fill_batch(engine *e, task **in, int *wanted, int *worked)
{
    turn tu[ENGINE_QUEUE_MAX];
    int n = 0, n_scratch = 0;
    for (int i = 0; i < ENGINE_QUEUE_MAX; i++) {
        task *t = &e->tasks[i];
        if (t->state == TASK_FREE || t->pending)
            continue;
        int w = t->ops->want(e, t);
        if (t->state == TASK_FREE) { /* want ended it (STOP, or nothing left to compute) */
            *worked = 1;
            continue;
        }
        if (w <= 0)
            continue;
        tu[n].t = t;
        tu[n].want = w;
        tu[n].unit = t->ops->unit(e, t);
        *wanted += w;
        n_scratch += t->ops->scratch;
        n++;
    }
    if (n == 0)
        return 0;
    qsort(tu, (size_t)n, sizeof *tu, by_turn);
    if (e->solo)
        n = 1;
    allot(tu, n, e->n_ubatch, e->n_chunk);

    /* scratch sequences: a share each, like the rows */
    int seq_share = n_scratch > 0 ? e->n_score_seqs / n_scratch : e->n_score_seqs;
    if (seq_share < 1)
        seq_share = 1;
    batch_clear(&e->batch);
    e->scratch_used = 0;
    int n_in = 0;
    for (int i = 0; i < n; i++) {
        task *t = tu[i].t;
        if (tu[i].give <= 0)
            continue;
        *worked = 1; /* a fill may finish a task without rows (a SCORE chunk of one-token options) */
        int seqs = e->n_score_seqs - e->scratch_used;
        if (seqs > seq_share)
            seqs = seq_share;
        t->row0 = e->batch.n_tokens;
        t->rows = t->ops->fill(e, t, tu[i].give, seqs);
        if (t->rows > 0 && e->slots[t->rq.slot].n + slot_rows(e, t) > e->n_ctx && !sched_lease(e, (int)t->rq.slot)) {
            /* past its slot while another request holds the lease: these rows wait (a trunk or
             * prefill chunk, or a generation step: fills that change nothing but the batch) and
             * the task goes to the end of the turn order, so a solo step picks another next */
            e->batch.n_tokens = t->row0;
            t->rows = 0;
            t->served = e->decodes + 1;
            continue;
        }
        if (t->rows > 0)
            in[n_in++] = t;
    }
    return n_in;
}

/* llama_decode of e->batch on the engine's threads, a CANCEL of a task in it aborting it (main.c's abort
 * callback reads e->abort_decode): on a GPU it returns with the decode queued, on the CPU computed. mark[2]
 * and mark[3]: before and after (when profiled, with the late fill, or the pretend device). late: the late
 * fill is on. Returns llama_decode's status. */
static int decode(engine *e, int late, uint64_t mark[ENGINE_PROFILE_PARTS])
{
    e->in_decode = 1;
    e->abort_decode = 0;
    threads_before(e);
    if (e->prof.on || late)
        mark[2] = profile_now_us();
    const int alone = e->n_pend == 0; /* no decode in flight: nothing for llama_decode to wait for */
    int rc = llama_decode(e->ctx, e->batch);
    if (e->prof.on || late || e->test_device.us_row > 0)
        mark[3] = profile_now_us();
    test_device_queued(e, mark[3], rc == 0 ? e->batch.n_tokens : 0); /* a failed decode holds it for no time */
    if (late) /* the host's lead: from the last step's wait to here; when this decode was queued */
        late_queued(&e->late, mark[3], rc);
    if (e->prof.on) {
        if (alone) {
            e->prof.alone++;
            e->prof.alone_us += mark[3] - mark[2];
        }
    }
    threads_after(e);
    e->in_decode = 0;
    e->decodes++;
    return rc;
}

/* The decode of in[0..n_in) returned rc != 0: each task puts its rows back (undo); then they retry
 * (aborted by a CANCEL: that task is answered next step; no KV room for them together: one at a time), or
 * each answers the failure. */
static void decode_failed(engine *e, task *const *in, int n_in, int rc)
{
    for (int i = 0; i < n_in; i++) {
        in[i]->ops->undo(e, in[i]);
        in[i]->rows = 0;
    }
    if (rc == MODEL_DECODE_CANCELLED && e->abort_decode) {
        /* the cancelled task is answered next step; the others retry */
    } else if (rc == 1 && (n_in > 1 || e->padded > 0)) {
        /* no KV room for them together (or for the padding): one at a time, unpadded, until one fits */
        e->solo = 1;
    } else {
        fprintf(stderr, "serveproto-llama: llama_decode of %d tokens failed (%d)\n", e->batch.n_tokens, rc);
        for (int i = 0; i < n_in; i++) {
            in[i]->ops->fail(e, in[i], rc);
            if (in[i]->state != TASK_FREE)
                task_end(e, in[i]);
        }
        e->solo = 0;
    }
}

/* SERVEPROTO_PROFILE: the step's parts in the profile's order whatever the order they ran in (mark[0..3]
 * set; early and sync measured apart: t_early, t_sync) and its decode's rows, read or not (rc: its status;
 * wanted: the rows the runnable tasks wanted). */
static void step_profile(engine *e, uint64_t mark[ENGINE_PROFILE_PARTS], int rc, int wanted, uint64_t t_early,
                         uint64_t t_sync)
{
    /* early, sync, and the rest of the step as read (the reads, and the pipeline's waits for the next
     * requests) */
    mark[4] = mark[3] + t_early;
    mark[5] = mark[4] + t_sync;
    mark[6] = profile_now_us();
    const struct llama_batch *b = rc == 0 ? &e->batch_pend : &e->batch; /* this decode's rows, read or not */
    const int rows = b->n_tokens - e->padded; /* the requests' rows: the padding counts apart */
    int outputs = 0;
    for (int i = 0; i < b->n_tokens; i++)
        outputs += b->logits[i] != 0;
    if (rows >= e->n_ubatch)
        e->prof.whole++;
    else if (wanted >= e->n_ubatch)
        e->prof.cut++;
    else
        e->prof.starved++;
    e->prof.padded += (uint64_t)e->padded;
    profile_step(&e->prof, mark, rows, outputs);
}

/* One step: new tasks started, cancelled ones answered, one llama_decode
 * filled from the runnable tasks and queued, and the rows of a decode read:
 * this one's, or (the pipeline) the one before, left in flight. Returns 1
 * when anything happened (0: no task, or none can run). */
int sched_step(engine *e)
{
    uint64_t mark[ENGINE_PROFILE_PARTS] = { 0 };
    if (e->prof.on)
        mark[0] = profile_now_us();
    int worked = tasks_start_new(e) > 0;
    if (e->prof.on)
        mark[1] = profile_now_us();
    if (answer_cancelled(e))
        worked = 1;
    task *in[ENGINE_QUEUE_MAX];
    int wanted = 0;
    const int n_in = fill_batch(e, in, &wanted, &worked);
    if (n_in == 0)
        return no_decode(e, worked);
    if (e->pad_rows)
        pad_batch(e);
    const int late = e->late.margin_us > 0 && e->pipeline;
    const int rc = decode(e, late, mark);
    /* the decode in flight before this one: its rows from the ring (llama_decode has queued this one, or
     * failed; either way the ring moved on) */
    uint64_t t_early = 0, t_sync = 0; /* the rest of the step is its read (the profile) */
    int ended = 0; /* requests the read from the ring ended */
    if (e->n_pend > 0) {
        ended = e->n_tasks;
        readout_pending(e, 1);
        ended -= e->n_tasks;
    }
    if (rc == 0) {
        e->solo = 0;
        pipe_queued(e, in, n_in); /* this decode's rows: in flight, read below or in the next step */
        uint64_t t0 = e->prof.on ? profile_now_us() : 0;
        if (e->overlap)
            tasks_start_early(e);
        uint64_t t1 = e->prof.on ? profile_now_us() : 0;
        t_early = t1 - t0;
        t_sync = pipe_keep_or_read(e, ended, late);
    } else {
        decode_failed(e, in, n_in, rc);
    }
    e->abort_decode = 0;
    if (e->prof.on)
        step_profile(e, mark, rc, wanted, t_early, t_sync);
    return 1;
}
