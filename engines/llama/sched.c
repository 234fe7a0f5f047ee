/* sched.c: many requests in one llama_decode, fairly (spec/llama-engine.md,
 * "Many requests at once").
 *
 * Every request in flight is a task (engine.h). Each step starts the tasks
 * that arrived, answers the cancelled ones, then fills one llama_decode from
 * every runnable task (a prefill chunk, a generation step, a SCORE trunk
 * chunk or trie chunk): at most one ubatch of rows in all, each task at most
 * its share of it (n_ubatch / runnable tasks, and at most --chunk rows while
 * others run too), least recently served first. So a runnable task waits at
 * most one decode of one ubatch for its next chunk (with few tasks, one of
 * a few chunks), and a CANCEL aborts the decode its task is
 * in within one ubatch: the other tasks of that decode put their rows back
 * (undo) and take the same chunk again in the next one.
 *
 * The pipeline (e->pipeline, SERVEPROTO_PIPELINE=N; on by default on a
 * local GPU, whose llama_decode returns with the decode queued, off on the
 * CPU; it reads from llama.cpp's output ring, llama/patches/0010): a decode's rows may be
 * left unread (its tasks pending) while the next decode is filled from the
 * other tasks and queued; the rows are read once it is, from the ring, while
 * the device computes. So the device goes from one decode to the next without
 * waiting for the host's read-out, fill and graph build. A pending task gives
 * no rows to the next decode (it needs its own read first), so the step
 * leaves a decode pending only when the others want at least e->pipeline
 * rows and at least half the rows of the decode in flight; else it reads the
 * rows at once, as without the pipeline.
 *
 * The late fill (e->late, SERVEPROTO_PIPELINE_LATE=US, with the pipeline):
 * after the read of decode N, the next decode (N+2) is filled as late as
 * the device allows, not at once. N+1 started on the device when N ended
 * (it was queued before), so it ends about its rows times the device's time
 * a row later; the host needs its lead (the starts, the fill and
 * llama_decode's own host work, measured) and US more to have N+2 queued
 * by then. Until that moment the step waits for requests, starting each as
 * it comes: the clients answered from N send their next ones meanwhile, and
 * those go into N+2 instead of N+3. The device's time a row is learned from
 * the reads that waited for their decode (late_learn); it only helps where
 * llama_decode's host work leaves the host time to wait (CUDA graphs,
 * patch 0012), and gives nothing on a CPU, which computes inside the call.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

/* Frees the task's state and its entry (its DONE or ERROR is written). */
void task_end(engine *e, task *t)
{
    if (e->prof.on && t->in_us) {
        e->prof.answered++;
        e->prof.answer_us += profile_now_us() - t->in_us;
    }
    if (task_started(t))
        t->ops->free(e, t);
    sp_request_free(&t->rq);
    memset(t, 0, sizeof *t);
    e->n_tasks--;
}

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

static int by_arrival(const void *pa, const void *pb)
{
    const task *a = *(task *const *)pa, *b = *(task *const *)pb;
    return a->arrival < b->arrival ? -1 : a->arrival > b->arrival;
}

/* Starts the tasks that arrived since the last step, in arrival order.
 * Returns how many. */
static int start_new(engine *e)
{
    task *list[ENGINE_QUEUE_MAX];
    int n = 0;
    for (int i = 0; i < ENGINE_QUEUE_MAX; i++)
        if (e->tasks[i].state == TASK_QUEUED)
            list[n++] = &e->tasks[i];
    qsort(list, (size_t)n, sizeof *list, by_arrival);
    for (int i = 0; i < n; i++) {
        task *t = list[i];
        t->state = TASK_RUNNING;
        int rc = t->ops->start(e, t);
        if (rc != 0 && t->state != TASK_FREE)
            task_end(e, t);
    }
    return n;
}

/* Overlap (e->overlap: a GPU, whose llama_decode returns with the graph
 * queued and its kernels still running; spec/llama-engine.md, "Many requests
 * at once"): while the device computes, the host reads stdin and starts the
 * tasks that arrived, the part of a step that needs no output of the decode
 * in flight. Starting touches only what the decode no longer reads: the KV
 * cache's bookkeeping of the new task's own slot and of pinned snapshots
 * (llama.cpp's unified cache: cells, not device memory; the decode's inputs
 * were set before llama_decode returned), the score cache, frames out. A
 * state read from disk writes device memory; llama_state_seq_set_data waits
 * for the device first. So the new tasks' rows go in the next decode, as
 * they would have, with the start off the device's critical path: a new
 * task may miss a score or snapshot the decode in flight was about to
 * leave, and computes it again (never another number). A CANCEL read here
 * of a task in the decode is answered after it, at the next step. */
static void start_early(engine *e)
{
    engine_poll(e);
    int n = start_new(e);
    if (e->prof.on)
        e->prof.early += (uint64_t)n;
}

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
double sched_row_lse(const engine *e, int row, const float *logits)
{
    double v = e->row_lse[row];
    return isnan(v) ? model_logsumexp(logits, e->n_vocab) : v;
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

/* Pads the batch being built (SERVEPROTO_PAD_ROWS=M, e->pad_rows) up to a multiple of M rows, at most a
 * ubatch, with rows of the padding's own sequence (e->pad_seq: positions from 0, no logits), whose cells
 * from the decode before are dropped first. A GPU computes some row counts slower than larger ones
 * (bench/results/NOTEBOOK.md: 448 rows take longer than 512) and queues the same graph again only for the same
 * shape; the padding's rows attend only each other, so no other row's number moves (under invariant
 * numerics, bit for bit: tests/engines/test_llama_sched.py). Not after a decode that found no KV room
 * (e->solo). Sets e->padded. */
static void pad(engine *e)
{
    struct llama_batch *b = &e->batch;
    const int m = e->pad_rows;
    int target = (b->n_tokens + m - 1) / m * m;
    if (target > e->n_ubatch)
        target = e->n_ubatch;
    e->padded = 0;
    llama_memory_seq_rm(llama_get_memory(e->ctx), e->pad_seq, -1, -1);
    if (e->solo || b->n_tokens >= target)
        return;
    const llama_token tok = llama_vocab_bos(e->vocab) >= 0 ? llama_vocab_bos(e->vocab) : 0;
    const int rows = b->n_tokens;
    for (int p = 0; b->n_tokens < target; p++)
        batch_add(b, tok, p, &e->pad_seq, 1, 0);
    e->padded = b->n_tokens - rows;
}

/* A read of the ring that took at least this long waited for its decode (microseconds). */
#define LATE_WAITED_US 200u
/* A late wait lasts at most this long, whatever the prediction (microseconds). */
#define LATE_MAX_US 100000u

/* What a read from the ring says of the device (the late fill), e->batch being the decode read: the first
 * row with logits, fetched from t0 to t1. When the fetch waited, the decode ended at t1; when the decode
 * before it ended after this one was queued (the device went from one to the other), t1 less that end is
 * this decode's time on the device, which updates the time a row (a step held up on the host counts at
 * most 1.5x the last). A read that did not wait after a late wait says the fill came late, the device
 * idle meanwhile: the time a row is taken down 3%. */
static void late_learn(engine *e, uint64_t t0, uint64_t t1)
{
    late_fill *l = &e->late;
    const int after_late = l->after_late;
    l->after_late = 0;
    if (t1 - t0 < LATE_WAITED_US) {
        if (after_late)
            l->us_row *= 0.97;
        l->end_us = 0;
        return;
    }
    if (l->end_us && l->queued_prev_us < l->end_us && e->batch.n_tokens > 0) {
        double us_row = (double)(t1 - l->end_us) / e->batch.n_tokens;
        if (l->us_row > 0 && us_row > 1.5 * l->us_row)
            us_row = 1.5 * l->us_row;
        l->us_row = l->us_row > 0 ? 0.75 * l->us_row + 0.25 * us_row : us_row;
    }
    l->end_us = t1;
}

/* The tests' pretend device (e->test_device, SERVEPROTO_TEST_DEVICE_US_ROW; never in production): after
 * llama_decode returns, the decode of `rows` rows holds it from when it is free for us_row a row, its rows
 * rounded up to whole ubatches (queued in order, as a GPU's stream runs them; a GPU computes 400 rows in
 * about the time of 512, bench/results/NOTEBOOK.md). So on the CPU, whose llama_decode has computed before it returns, a
 * read waits as on a GPU and the late fill's learning and waits run (tests/engines/test_llama_sched.py). */
static void test_device_queued(engine *e, uint64_t now, int rows)
{
    if (e->test_device.us_row <= 0)
        return;
    const uint64_t start = e->test_device.busy_until > now ? e->test_device.busy_until : now;
    const uint64_t whole = (uint64_t)((rows + e->n_ubatch - 1) / e->n_ubatch) * (uint64_t)e->n_ubatch;
    e->test_device.busy_until = start + (uint64_t)e->test_device.us_row * whole;
    e->test_device.end_prev = e->test_device.end_last;
    e->test_device.end_last = e->test_device.busy_until;
}

/* Sleeps until the pretend device has computed the decode being read: the one before the last llama_decode
 * (prev) or the last. */
static void test_device_wait(engine *e, int prev)
{
    if (e->test_device.us_row <= 0)
        return;
    const uint64_t end = prev ? e->test_device.end_prev : e->test_device.end_last, now = profile_now_us();
    if (end > now) {
        const struct timespec ts = { (time_t)((end - now) / 1000000u), (long)((end - now) % 1000000u) * 1000L };
        nanosleep(&ts, NULL);
    }
}

/* Reads the rows of the decode left in flight (its tasks, e->pend): each task's decoded, with e->batch
 * that decode's batch for the while. prev: a llama_decode was called since (the rows come from llama.cpp's
 * output ring), else it was the last one. */
static void read_pending(engine *e, int prev)
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
        sp_loop_wait(&e->in, (int)((end - now + 999) / 1000));
        start_early(e);
        if (e->prof.on)
            e->prof.waited++;
        rows = others_want(e);
        keep = keep_pending(e, rows);
    }
    return keep;
}

/* The late fill's wait (the header comment), the decode just queued in flight and the one before read:
 * starts the requests that arrive until that decode's predicted end on the device less the host's lead
 * and the margin, or until the others want a ubatch of rows (a full decode gains nothing by waiting), at
 * most LATE_MAX_US. Returns keep_pending's answer for the rows the others want then. Before the device
 * and the host are measured, the pipeline's own wait (wait_for_more). */
static int late_wait(engine *e, int ended)
{
    late_fill *l = &e->late;
    if (!l->end_us || l->us_row <= 0 || l->lead_us <= 0)
        return wait_for_more(e, ended);
    uint64_t busy = (uint64_t)(l->us_row * e->batch_pend.n_tokens);
    if (busy > LATE_MAX_US)
        busy = LATE_MAX_US;
    const uint64_t lead = (uint64_t)l->lead_us + (uint64_t)l->margin_us;
    const uint64_t due = l->end_us + busy > lead ? l->end_us + busy - lead : 0;
    const uint64_t t0 = profile_now_us();
    uint64_t now = t0;
    int rows = others_want(e), waited = 0;
    for (; rows < e->n_ubatch && now + 1000 <= due && !e->in.eof; now = profile_now_us()) {
        sp_loop_wait(&e->in, (int)((due - now) / 1000));
        start_early(e);
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

/* A step with nothing to decode: the rows of the decode left in flight now, since nothing can be queued
 * behind it (returns 1), else the step was idle (returns `worked`). */
static int no_decode(engine *e, int worked)
{
    if (e->n_pend > 0) {
        read_pending(e, 0);
        return 1;
    }
    if (e->prof.on)
        profile_idle(&e->prof);
    return worked;
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
    int worked = start_new(e) > 0;
    if (e->prof.on)
        mark[1] = profile_now_us();
    for (int i = 0; i < ENGINE_QUEUE_MAX; i++) {
        task *t = &e->tasks[i];
        if (t->state == TASK_CANCELLED && !t->pending) { /* a pending one: after its rows are read */
            sp_write_error(&e->w, t->rq.id, "CANCELLED", "cancelled");
            task_end(e, t);
            worked = 1;
        }
    }

    turn tu[ENGINE_QUEUE_MAX];
    int n = 0, n_scratch = 0, wanted = 0;
    for (int i = 0; i < ENGINE_QUEUE_MAX; i++) {
        task *t = &e->tasks[i];
        if (t->state == TASK_FREE || t->pending)
            continue;
        int w = t->ops->want(e, t);
        if (t->state == TASK_FREE) { /* want ended it (STOP, or nothing left to compute) */
            worked = 1;
            continue;
        }
        if (w <= 0)
            continue;
        tu[n].t = t;
        tu[n].want = w;
        tu[n].unit = t->ops->unit(e, t);
        wanted += w;
        n_scratch += t->ops->scratch;
        n++;
    }
    if (n == 0)
        return no_decode(e, worked);
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
    task *in[ENGINE_QUEUE_MAX];
    int n_in = 0;
    for (int i = 0; i < n; i++) {
        task *t = tu[i].t;
        if (tu[i].give <= 0)
            continue;
        worked = 1; /* a fill may finish a task without rows (a SCORE chunk of one-token options) */
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
    if (n_in == 0)
        return no_decode(e, worked);
    if (e->pad_rows)
        pad(e);

    e->in_decode = 1;
    e->abort_decode = 0;
    threads_before(e);
    const int late = e->late.margin_us > 0 && e->pipeline;
    if (e->prof.on || late)
        mark[2] = profile_now_us();
    const int alone = e->n_pend == 0; /* no decode in flight: nothing for llama_decode to wait for */
    int rc = llama_decode(e->ctx, e->batch);
    if (e->prof.on || late || e->test_device.us_row > 0)
        mark[3] = profile_now_us();
    test_device_queued(e, mark[3], rc == 0 ? e->batch.n_tokens : 0); /* a failed decode holds it for no time */
    if (late) { /* the host's lead: from the last step's wait to here; when this decode was queued */
        late_fill *l = &e->late;
        if (l->left_us && rc == 0 && mark[3] - l->left_us <= LATE_MAX_US) { /* (longer: the host idled) */
            const double d = (double)(mark[3] - l->left_us);
            l->lead_us = l->lead_us > 0 ? 0.75 * l->lead_us + 0.25 * d : d;
        }
        if (rc != 0)
            l->end_us = 0; /* the next decode runs alone */
        l->left_us = 0;
        l->queued_prev_us = l->queued_last_us;
        l->queued_last_us = mark[3];
    }
    if (e->prof.on) {
        if (alone) {
            e->prof.alone++;
            e->prof.alone_us += mark[3] - mark[2];
        }
    }
    threads_after(e);
    e->in_decode = 0;
    e->decodes++;
    /* the decode in flight before this one: its rows from the ring (llama_decode has queued this one, or
     * failed; either way the ring moved on) */
    uint64_t t_early = 0, t_sync = 0; /* the rest of the step is its read (the profile, below) */
    int ended = 0; /* requests the read from the ring ended */
    if (e->n_pend > 0) {
        ended = e->n_tasks;
        read_pending(e, 1);
        ended -= e->n_tasks;
    }
    if (rc == 0) {
        e->solo = 0;
        /* this decode's rows: in flight, read below or in the next step */
        struct llama_batch b = e->batch;
        e->batch = e->batch_pend;
        e->batch_pend = b;
        for (int i = 0; i < n_in; i++) {
            in[i]->pending = 1;
            e->pend[i] = in[i];
        }
        e->n_pend = n_in;
        uint64_t t0 = e->prof.on ? profile_now_us() : 0;
        if (e->overlap)
            start_early(e);
        uint64_t t1 = e->prof.on ? profile_now_us() : 0;
        t_early = t1 - t0;
        if (late ? late_wait(e, ended) : wait_for_more(e, ended)) {
            if (late)
                e->late.left_us = profile_now_us();
            if (e->prof.on)
                e->prof.pipelined++;
        } else {
            if (e->prof.on) {
                t0 = profile_now_us();
                llama_synchronize(e->ctx);
                t_sync = profile_now_us() - t0;
            }
            read_pending(e, 0);
        }
    } else {
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
    e->abort_decode = 0;
    engine_log_aborting(0);
    if (e->prof.on) {
        /* the parts in the profile's order whatever the order they ran in: early, sync, and the rest of
         * the step as read (the reads, and the pipeline's waits for the next requests) */
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
    return 1;
}
