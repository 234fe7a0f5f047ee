/* late_fill.c: the late fill's measurements (e->late, SERVEPROTO_PIPELINE_LATE=US, with the GPU pipeline):
 * after the read of decode N, the next decode (N+2) is filled as late as
 * the device allows, not at once. N+1 started on the device when N ended
 * (it was queued before), so it ends about its rows times the device's time
 * a row later; the host needs its lead (the starts, the fill and
 * llama_decode's own host work, measured) and US more to have N+2 queued
 * by then. Until that moment the step waits for requests, starting each as
 * it comes (gpu_pipe.c: late_wait): the clients answered from N send their next ones meanwhile, and
 * those go into N+2 instead of N+3. The device's time a row is learned from
 * the reads that waited for their decode (late_learn); it only helps where
 * llama_decode's host work leaves the host time to wait (CUDA graphs,
 * patch 0012), and gives nothing on a CPU, which computes inside the call.
 * Here: what the reads and the queueing say of the device and the host, and when the next fill is due. */
#include "engine.h"

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
void late_learn(engine *e, uint64_t t0, uint64_t t1)
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

/* A llama_decode returned at queued_us with status rc: the host's lead, from the last step's wait to here,
 * is learned, and when this decode was queued kept. */
void late_queued(late_fill *l, uint64_t queued_us, int rc)
{
    if (l->left_us && rc == 0 && queued_us - l->left_us <= LATE_MAX_US) { /* (longer: the host idled) */
        const double d = (double)(queued_us - l->left_us);
        l->lead_us = l->lead_us > 0 ? 0.75 * l->lead_us + 0.25 * d : d;
    }
    if (rc != 0)
        l->end_us = 0; /* the next decode runs alone */
    l->left_us = 0;
    l->queued_prev_us = l->queued_last_us;
    l->queued_last_us = queued_us;
}

/* When the next decode's fill is due, the decode of `rows` rows just queued in flight: its predicted end on
 * the device (at most LATE_MAX_US of it) less the host's lead and the margin, into *due (profile_now_us's
 * clock). Returns 0 (nothing in *due) before the device and the host are measured. */
int late_due(const late_fill *l, int rows, uint64_t *due)
{
    if (!l->end_us || l->us_row <= 0 || l->lead_us <= 0)
        return 0;
    uint64_t busy = (uint64_t)(l->us_row * rows);
    if (busy > LATE_MAX_US)
        busy = LATE_MAX_US;
    const uint64_t lead = (uint64_t)l->lead_us + (uint64_t)l->margin_us;
    *due = l->end_us + busy > lead ? l->end_us + busy - lead : 0;
    return 1;
}
