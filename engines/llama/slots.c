/* slots.c: KV slots (one llama.cpp sequence each) with truncate-and-extend
 * prefix reuse, and pin=1 snapshots (spec section 6).
 *
 * A llama-architecture model keeps nothing but attention rows indexed by
 * position, so a snapshot holds only token ids and the logits of its last
 * position; its rows stay in its slot's sequence. A snapshot is valid while
 * a slot still holds its tokens as a prefix (its own, or another that a
 * restore copied them to); once prompts truncated every such slot below them,
 * the rows were rewritten and the snapshot is stale. */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* Length of the longest common prefix of two token arrays. */
int lcp(const llama_token *a, int na, const llama_token *b, int nb)
{
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

static int slot_holds(const engine *e, int slot, const snapshot *s)
{
    const slot_state *sl = &e->slots[slot];
    return sl->n >= s->n && lcp(sl->tokens, sl->n, s->tokens, s->n) == s->n;
}

/* A snapshot is valid while some slot holds its tokens as a prefix: its own
 * slot, else another one (a restore copied its cells there, or a request
 * computed the same tokens there), which becomes its slot. */
int snapshot_valid(engine *e, snapshot *s)
{
    if (slot_holds(e, s->slot, s))
        return 1;
    for (int u = 0; u < e->n_slots; u++)
        if (u != s->slot && slot_holds(e, u, s)) {
            s->slot = u;
            return 1;
        }
    return 0;
}

static void snapshot_release(snapshot *s)
{
    free(s->tokens);
    free(s->logits);
    memset(s, 0, sizeof *s);
}

/* The deepest valid snapshot whose tokens are a prefix of toks[0..n) no
 * longer than max_len (max_len = n - 1 asks for a strict prefix). Matching
 * snapshots found stale on the way are released and counted in *stale.
 * Returns NULL when none is valid. */
snapshot *snapshot_find(engine *e, const llama_token *toks, int n, int max_len, int *stale)
{
    snapshot *best = NULL;
    for (int i = 0; i < e->n_pins; i++) {
        snapshot *s = &e->snaps[i];
        if (!s->used || s->n > max_len || s->n > n || lcp(s->tokens, s->n, toks, n) != s->n)
            continue;
        if (!snapshot_valid(e, s)) {
            snapshot_release(s);
            (*stale)++;
            continue;
        }
        if (!best || s->n > best->n)
            best = s;
    }
    if (best)
        best->last_use = ++e->clock;
    return best;
}

/* Records a snapshot of slot's first n tokens (its KV rows must hold them)
 * and the logits of position n-1. Replaces a snapshot of the same tokens,
 * else the least recently used one. Returns it (its lse not computed yet),
 * or NULL: none taken (past the slot's n_ctx, or out of memory, logged). */
snapshot *snapshot_take(engine *e, int slot, const llama_token *toks, int n, const float *logits)
{
    /* Positions past a slot's n_ctx are the lease's (sched.c), which moves to the next long prompt
     * and truncates this slot: a snapshot of them would not outlive that, and restored on another
     * slot its shared cells would outlive the lease. The slot's live prefix still serves the next
     * request on the same tokens there. */
    if (n > e->n_ctx)
        return NULL;
    snapshot *dst = NULL;
    for (int i = 0; i < e->n_pins && !dst; i++) {
        snapshot *s = &e->snaps[i];
        if (s->used && s->n == n && lcp(s->tokens, s->n, toks, n) == n)
            dst = s;
    }
    for (int i = 0; i < e->n_pins && !dst; i++)
        if (!e->snaps[i].used)
            dst = &e->snaps[i];
    if (!dst) {
        dst = &e->snaps[0];
        for (int i = 1; i < e->n_pins; i++)
            if (e->snaps[i].last_use < dst->last_use)
                dst = &e->snaps[i];
    }
    snapshot_release(dst);
    dst->tokens = malloc((size_t)n * sizeof *dst->tokens);
    dst->logits = malloc((size_t)e->n_vocab * sizeof *dst->logits);
    if (!dst->tokens || !dst->logits) {
        fprintf(stderr, "serveproto-llama: out of memory taking a snapshot of %d tokens\n", n);
        snapshot_release(dst);
        return NULL;
    }
    memcpy(dst->tokens, toks, (size_t)n * sizeof *toks);
    memcpy(dst->logits, logits, (size_t)e->n_vocab * sizeof *logits);
    dst->lse = NAN;
    dst->n = n;
    dst->slot = slot;
    dst->used = 1;
    dst->last_use = ++e->clock;
    return dst;
}

/* The logsumexp of s's logits, computed once (model_logsumexp, so the same
 * double as for any copy of them): every SCORE restored from s reads it, and
 * each computation is a pass over the whole vocabulary (128K floats on a
 * Llama-3 model). */
double snapshot_lse(engine *e, snapshot *s)
{
    if (isnan(s->lse))
        s->lse = model_logsumexp(s->logits, e->n_vocab);
    return s->lse;
}

/* Keeps the slot's first `keep` positions and drops the rest of its rows. */
void slot_truncate(engine *e, int slot, int keep)
{
    slot_state *sl = &e->slots[slot];
    if (keep < sl->n || keep == 0)
        llama_memory_seq_rm(llama_get_memory(e->ctx), slot, keep, -1);
    if (keep < sl->n)
        sl->n = keep;
}

/* Truncate-and-extend for a prompt toks[0..n) whose last position must be
 * computed (its logits are needed): keeps the slot's live common prefix with
 * it, at most n - 1 positions, or restores `snap` (may be NULL) when that is
 * deeper. Returns the positions kept, the first one to compute. */
int slot_resume(engine *e, int slot, const llama_token *toks, int n, snapshot *snap)
{
    slot_state *sl = &e->slots[slot];
    int live = lcp(sl->tokens, sl->n, toks, n);
    if (live > n - 1)
        live = n - 1;
    if (snap && snap->n > live) {
        slot_restore(e, slot, snap);
        return snap->n;
    }
    slot_truncate(e, slot, live);
    return live;
}

/* Makes the slot hold exactly the snapshot's tokens: truncation when the
 * snapshot is the slot's own, else a sequence copy (cells are shared in the
 * unified KV cache, nothing is recomputed). */
void slot_restore(engine *e, int slot, snapshot *s)
{
    if (s->slot == slot) {
        slot_truncate(e, slot, s->n);
        return;
    }
    llama_memory_t mem = llama_get_memory(e->ctx);
    llama_memory_seq_rm(mem, slot, -1, -1);
    llama_memory_seq_cp(mem, s->slot, slot, 0, s->n);
    memcpy(e->slots[slot].tokens, s->tokens, (size_t)s->n * sizeof *s->tokens);
    e->slots[slot].n = s->n;
}

/* Records that the slot's sequence now also holds toks at positions n.. */
void slot_append(engine *e, int slot, const llama_token *toks, int n)
{
    slot_state *sl = &e->slots[slot];
    memcpy(sl->tokens + sl->n, toks, (size_t)n * sizeof *toks);
    sl->n += n;
}
