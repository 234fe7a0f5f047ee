/* threads.c: --threads auto, the engine's CPU threads chosen from what each
 * decode got (spec/llama-engine.md, "Threads").
 *
 * llama.cpp's CPU threads meet at a spinning barrier after every graph node,
 * so a decode runs at the pace of its slowest thread: one thread descheduled
 * because something else wants the core (the gateway, another process) holds
 * all the others, and the decode slows down more than the core it lost. A
 * decode with n threads on cores nobody else wants is given n cores of CPU
 * time over its wall time (spinning included). So after each decode the
 * engine compares the CPU time it got (getrusage: every thread of the
 * process) with n x wall: while that share stays under THREADS_SHARE_LOW it
 * drops a thread; while it stays above THREADS_SHARE_HIGH and the last change
 * is old enough it tries one more, up to the cores it may run on. A try that
 * is dropped again doubles the wait before the next (THREADS_PROBE_S up to
 * THREADS_PROBE_MAX_S), one that holds resets it: on cores that stay shared
 * the tries cost little.
 * The thread count moves no digit: every kernel of invariant numerics
 * computes each output on one thread (tests/engines/test_llama_digits.py). */
#include <sched.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>

#include "engine.h"

#define THREADS_MIN_WALL_S 0.002 /* shorter decodes tell nothing */
#define THREADS_SHARE_LOW  0.75
#define THREADS_SHARE_HIGH 0.90
#define THREADS_PROBE_S    1.0   /* seconds between tries of one more thread, at first */
#define THREADS_PROBE_MAX_S 16.0
#define THREADS_EWMA       0.3   /* weight of the newest decode */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec * 1e-6;
}

int threads_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    return 1;
}

void threads_before(engine *e)
{
    if (!e->threads_auto)
        return;
    e->thr_wall0 = mono_s();
    e->thr_cpu0 = cpu_s();
}

void threads_after(engine *e)
{
    if (!e->threads_auto)
        return;
    double t = mono_s(), wall = t - e->thr_wall0, cpu = cpu_s() - e->thr_cpu0;
    if (wall < THREADS_MIN_WALL_S)
        return;
    double share = cpu / (wall * e->n_threads);
    e->thr_share = e->thr_samples ? (1.0 - THREADS_EWMA) * e->thr_share + THREADS_EWMA * share : share;
    e->thr_samples++;
    if (e->thr_probe_s <= 0)
        e->thr_probe_s = THREADS_PROBE_S;
    int n = e->n_threads, high = e->thr_samples >= 4 && e->thr_share > THREADS_SHARE_HIGH;
    if (e->thr_trying && high) { /* the last try held */
        e->thr_trying = 0;
        e->thr_probe_s = THREADS_PROBE_S;
    }
    if (n > 1 && e->thr_samples >= 2 && e->thr_share < THREADS_SHARE_LOW) {
        n--;
        if (e->thr_trying) {
            e->thr_trying = 0;
            e->thr_probe_s = e->thr_probe_s * 2 < THREADS_PROBE_MAX_S ? e->thr_probe_s * 2 : THREADS_PROBE_MAX_S;
        }
    } else if (n < e->threads_max && high && t - e->thr_changed >= e->thr_probe_s) {
        n++;
        e->thr_trying = 1;
    }
    if (n == e->n_threads)
        return;
    fprintf(stderr, "serveproto-llama: decode threads %d -> %d (CPU share %.2f of %d cores over the last decodes)\n",
            e->n_threads, n, e->thr_share, e->n_threads);
    llama_set_n_threads(e->ctx, n, n);
    e->n_threads = n;
    e->thr_samples = 0;
    e->thr_changed = t;
}
