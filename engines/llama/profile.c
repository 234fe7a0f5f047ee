/* profile.c: where a decode step's time goes (SERVEPROTO_PROFILE=PATH;
 * bench/results/NOTEBOOK.md, "Where a decode's time goes").
 *
 * With SERVEPROTO_PROFILE set, every decode step is cut into seven parts on
 * the engine's one thread, CLOCK_MONOTONIC:
 *   gap    from the end of the last decode step to the start of this one
 *          (stdin read, frames parsed, requests started outside a step),
 *          counted only when both steps decoded: the time with work waiting;
 *   start  the tasks that arrived started (tokenized, their slots set up);
 *   fill   the rest of the step before llama_decode: the batch built;
 *   decode llama_decode itself (on the CPU the whole forward pass; on a GPU
 *          the graph built and queued, the kernels mostly still running);
 *   early  with overlap (tasks.c: a GPU): stdin read and the tasks that
 *          arrived started while the device computes (0 without it);
 *   sync   llama_synchronize after it: the wait for the device to finish
 *          (about 0 on the CPU);
 *   read   the rows read out: logsumexp, option logprobs, frames written.
 * Inside llama_decode, llama/patches/profile/0007 times llama.cpp's own host work
 * (the same switch): the batch checked, memory (ubatches split, KV cells
 * found), the output buffer, cells applied, graph built, graph allocated,
 * inputs set (the KQ mask among them), graph computed (CPU) or queued (GPU),
 * and the outputs; and counts the ubatches, the graphs reused, the KV cells
 * attended (n_kv) and the tokens, summed over ubatches; then the decodes
 * whose rows were read after the next one was queued and the waits for the
 * next requests meanwhile (gpu_pipe.c, the pipeline); last, each decode once as
 * whole (a ubatch of rows), cut (fewer, although the runnable tasks wanted a
 * ubatch: their units and n_chunk left rows unused) or starved (fewer,
 * because the tasks wanted fewer). Then the requests answered and their
 * milliseconds from being read off stdin to the answer (a frame's wait in
 * the pipe while the engine is inside llama_decode is not in it); the
 * milliseconds of the rows' read (the logits waited for, the logsumexps,
 * each task's read, its frames written) and of the logsumexps within it;
 * and the llama_decode calls made with no decode in flight and their
 * milliseconds (on a GPU: llama_decode's own host work, the graph built and
 * its kernels queued, with nothing to wait for); last, the rows of padding
 * decoded (SERVEPROTO_PAD_ROWS, pad.c; the rows above leave them out),
 * and the late fill's waits and their milliseconds (SERVEPROTO_PIPELINE_LATE).
 * Every ENGINE_PROFILE_US the running sums go to PATH.<pid> as one line
 * under a header of column names (milliseconds, the rows and outputs per
 * decode, the tasks started early, the most rows one decode held, then
 * llama_decode's inner parts and counts), so a load benchmark
 * reads the split of its interval from the difference of two lines (and
 * the last line is written at exit). Off by
 * default: then the step makes no clock call and no llama_synchronize, and
 * nothing changes (the synchronize is the one the read-out's first
 * llama_get_logits_ith makes anyway, so the digits never move with it). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

#define ENGINE_PROFILE_US 1000000u

uint64_t profile_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void profile_init(engine_profile *p)
{
    const char *path = llamax_profile_path();
    if (!path || !*path)
        return;
    char name[4096];
    snprintf(name, sizeof name, "%s.%ld", path, (long)getpid());
    p->f = fopen(name, "w");
    if (!p->f) {
        fprintf(stderr, "serveproto-llama: SERVEPROTO_PROFILE: cannot write %s; not profiling\n", name);
        return;
    }
    p->on = 1;
    p->t0 = p->reported = profile_now_us();
    fprintf(p->f, "# t_s decodes rows outputs gap_ms start_ms fill_ms decode_ms early_ms sync_ms read_ms early_tasks max_rows"
                  " batch_ms memory_ms outbuf_ms apply_ms build_ms alloc_ms inputs_ms compute_ms"
                  " outputs_ms ubatches reused n_kv tokens pipelined waited whole cut starved answered answer_ms"
                  " readout_ms lse_ms alone alone_ms padded late late_ms\n");
    fflush(p->f);
}

static void report(engine_profile *p, uint64_t now)
{
    p->reported = now;
    fprintf(p->f, "%.3f %llu %llu %llu", (double)(now - p->t0) * 1e-6, (unsigned long long)p->decodes,
            (unsigned long long)p->rows, (unsigned long long)p->outputs);
    for (int i = 0; i < ENGINE_PROFILE_PARTS; i++)
        fprintf(p->f, " %.1f", (double)p->us[i] * 1e-3);
    fprintf(p->f, " %llu %d", (unsigned long long)p->early, p->max_rows);
    /* llama_decode's own parts (llama/patches/profile/0007), summed since the start */
    uint64_t in[SERVEPROTO_DECODE_PARTS + 4] = {0};
    llamax_decode_profile(in, SERVEPROTO_DECODE_PARTS + 4);
    for (int i = 0; i < SERVEPROTO_DECODE_PARTS; i++)
        fprintf(p->f, " %.1f", (double)in[i] * 1e-3);
    for (int i = SERVEPROTO_DECODE_PARTS; i < SERVEPROTO_DECODE_PARTS + 4; i++)
        fprintf(p->f, " %llu", (unsigned long long)in[i]);
    fprintf(p->f, " %llu %llu %llu %llu %llu", (unsigned long long)p->pipelined, (unsigned long long)p->waited,
            (unsigned long long)p->whole, (unsigned long long)p->cut, (unsigned long long)p->starved);
    fprintf(p->f, " %llu %.1f %.1f %.1f %llu %.1f", (unsigned long long)p->answered, (double)p->answer_us * 1e-3,
            (double)p->readout_us * 1e-3, (double)p->lse_us * 1e-3, (unsigned long long)p->alone,
            (double)p->alone_us * 1e-3);
    fprintf(p->f, " %llu %llu %.1f", (unsigned long long)p->padded, (unsigned long long)p->late,
            (double)p->late_us * 1e-3);
    fputc('\n', p->f);
    fflush(p->f);
}

/* One decode step's marks: start, tasks started, before and after
 * llama_decode, after the early start (overlap), after the synchronize, end;
 * rows in the batch and rows with logits. */
void profile_step(engine_profile *p, const uint64_t mark[ENGINE_PROFILE_PARTS], int rows, int outputs)
{
    if (p->last_end && mark[0] - p->last_end < 1000000u)
        p->us[0] += mark[0] - p->last_end;
    for (int i = 0; i + 1 < ENGINE_PROFILE_PARTS; i++)
        p->us[i + 1] += mark[i + 1] - mark[i];
    p->decodes++;
    p->rows += (uint64_t)rows;
    p->max_rows = rows > p->max_rows ? rows : p->max_rows;
    p->outputs += (uint64_t)outputs;
    p->last_end = mark[ENGINE_PROFILE_PARTS - 1];
    if (p->last_end - p->reported >= ENGINE_PROFILE_US)
        report(p, p->last_end);
}

/* A step that did not decode: the next one's gap is not waiting work. */
void profile_idle(engine_profile *p)
{
    p->last_end = 0;
}

/* The last sums, then the file closed (the engine's exit). */
void profile_free(engine_profile *p)
{
    if (p->f) {
        report(p, profile_now_us());
        fclose(p->f);
    }
    p->f = NULL;
    p->on = 0;
}
