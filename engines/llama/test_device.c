/* test_device.c: the tests' pretend device (e->test_device, SERVEPROTO_TEST_DEVICE_US_ROW; never in
 * production). On the CPU, whose llama_decode has computed before it returns, a read of the GPU pipeline
 * (readout.c) then waits as on a GPU, so the late fill's learning and waits run
 * (tests/engines/test_llama_sched.py). Off (us_row 0), both calls do nothing. */
#include <time.h>

#include "engine.h"

/* After llama_decode returns, the decode of `rows` rows holds the pretend device from when it is free for
 * us_row a row, its rows rounded up to whole ubatches (queued in order, as a GPU's stream runs them; a GPU
 * computes 400 rows in about the time of 512, bench/results/NOTEBOOK.md). now: when llama_decode returned
 * (profile_now_us). */
void test_device_queued(engine *e, uint64_t now, int rows)
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
void test_device_wait(engine *e, int prev)
{
    if (e->test_device.us_row <= 0)
        return;
    const uint64_t end = prev ? e->test_device.end_prev : e->test_device.end_last, now = profile_now_us();
    if (end > now) {
        const struct timespec ts = { (time_t)((end - now) / 1000000u), (long)((end - now) % 1000000u) * 1000L };
        nanosleep(&ts, NULL);
    }
}
