/* tasks.c: the tasks that arrived started, in arrival order, and a task's end (spec/llama-engine.md, "Many
 * requests at once"; a task's life: engine.h). The scheduler (sched.c) starts them at every step; the GPU
 * pipeline (gpu_pipe.c) also while the device computes, reading stdin through the engine's input hook
 * (e->input, set by main.c). */
#include <stdlib.h>
#include <string.h>

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
    picture_set_free(t->pics);
    sp_request_free(&t->rq);
    memset(t, 0, sizeof *t);
    e->n_tasks--;
}

static int by_arrival(const void *pa, const void *pb)
{
    const task *a = *(task *const *)pa, *b = *(task *const *)pb;
    return a->arrival < b->arrival ? -1 : a->arrival > b->arrival;
}

/* Starts the tasks that arrived since the last step, in arrival order.
 * A task with pictures evaluates them in its start (picture.c: llama_decode
 * calls of its own), so it waits while a decode is in flight (the pipeline's
 * rows not read yet), whose outputs those calls would replace. Returns how
 * many started. */
int tasks_start_new(engine *e)
{
    task *list[ENGINE_QUEUE_MAX];
    int n = 0;
    for (int i = 0; i < ENGINE_QUEUE_MAX; i++)
        if (e->tasks[i].state == TASK_QUEUED && !(e->tasks[i].pics && e->n_pend > 0))
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
void tasks_start_early(engine *e)
{
    e->input.poll(e->input.ctx);
    int n = tasks_start_new(e);
    if (e->prof.on)
        e->prof.early += (uint64_t)n;
}
