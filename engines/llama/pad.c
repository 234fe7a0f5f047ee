/* pad.c: a decode's batch padded to a row count the GPU computes well (SERVEPROTO_PAD_ROWS=M, e->pad_rows;
 * spec/llama-engine.md, "Many requests at once"). */
#include "engine.h"

/* Pads the batch being built (SERVEPROTO_PAD_ROWS=M, e->pad_rows) up to a multiple of M rows, at most a
 * ubatch, with rows of the padding's own sequence (e->pad_seq: positions from 0, no logits), whose cells
 * from the decode before are dropped first. A GPU computes some row counts slower than larger ones
 * (bench/results/NOTEBOOK.md: 448 rows take longer than 512) and queues the same graph again only for the same
 * shape; the padding's rows attend only each other, so no other row's number moves (under invariant
 * numerics, bit for bit: tests/engines/test_llama_sched.py). Not after a decode that found no KV room
 * (e->solo). Sets e->padded. */
void pad_batch(engine *e)
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
