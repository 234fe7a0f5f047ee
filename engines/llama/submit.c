/* submit.c: one SUBMIT (spec sections 4-6): tokenize, reuse the slot's prefix
 * or a snapshot, prefill (with ECHO read-out when logprobs > 0), snapshot on
 * pin=1, then generate (greedy, or temperature + top-p) until max_tokens, an
 * end-of-generation token, the context end, STOP or CANCEL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Parses an ids=1 payload: token ids in ASCII decimal, separated by single
 * spaces. Returns 0, -1 for a malformed list, -2 for an id outside the
 * vocabulary, -3 when out of memory. */
static int parse_ids(engine *e, const unsigned char *p, size_t len, llama_token **out, int *n_out)
{
    llama_token *toks = malloc((len / 2 + 1) * sizeof *toks);
    if (!toks)
        return -3;
    int n = 0;
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && p[j] >= '0' && p[j] <= '9')
            j++;
        uint64_t v;
        if (sp_parse_uint((const char *)p + i, j - i, &v) != 0 || (j < len && (p[j] != ' ' || j + 1 == len))) {
            free(toks);
            return -1;
        }
        if (v >= (uint64_t)e->n_vocab) {
            free(toks);
            return -2;
        }
        toks[n++] = (llama_token)v;
        i = j + 1;
    }
    *out = toks;
    *n_out = n;
    return 0;
}

/* The prompt's tokens, or an ERROR written (returns -1). */
static int prompt_tokens(engine *e, const sp_request *rq, llama_token **toks, int *n)
{
    if (rq->payload_len == 0) {
        sp_write_error(&e->w, rq->id, "EMPTY_PROMPT", "the prompt is empty");
        return -1;
    }
    if (rq->ids) {
        int rc = parse_ids(e, rq->payload, rq->payload_len, toks, n);
        if (rc == -1)
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "ids: the payload is not token ids separated by single spaces");
        else if (rc == -2)
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "ids: a token id is outside the vocabulary of %d", e->n_vocab);
        else if (rc == -3)
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory reading the token ids");
        if (rc)
            return -1;
    } else if (model_tokenize(e, (const char *)rq->payload, rq->payload_len, toks, n) != 0) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "the prompt could not be tokenized");
        return -1;
    }
    if (*n == 0) {
        free(*toks);
        sp_write_error(&e->w, rq->id, "EMPTY_PROMPT", "the prompt has no tokens");
        return -1;
    }
    if (*n > e->n_ctx) {
        free(*toks);
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "the prompt has %d tokens, the context %d", *n, e->n_ctx);
        return -1;
    }
    return 0;
}

/* ECHO of prompt position pos (token tok) predicted by `logits` (NULL: the
 * cold position 0, written "nan 0"). */
static void write_echo(engine *e, uint64_t id, int pos, llama_token tok, const float *logits, int k)
{
    char piece[256];
    int len = model_piece(e, tok, piece, sizeof piece);
    if (!logits) {
        sp_write_echo(&e->w, id, (uint64_t)pos, NAN, 0, NULL, piece, (size_t)len);
        return;
    }
    sp_alt top[ENGINE_MAX_LOGPROBS];
    double lse = model_logsumexp(logits, e->n_vocab);
    int m = model_top_k(e, logits, lse, k, top);
    sp_write_echo(&e->w, id, (uint64_t)pos, (double)logits[tok] - lse, m, top, piece, (size_t)len);
}

/* ECHO of positions a+1 .. a+rows, predicted by the batch's logits rows
 * 0 .. rows-1. The full-vocabulary log-softmax of each row (about 0.3 ms on a
 * 49k vocabulary) is spread over the engine's threads; frames go out in order. */
static void echo_rows(engine *e, uint64_t id, const llama_token *toks, int a, int rows, int k)
{
    /* llama_get_logits_ith may reorder outputs on first use: not from threads */
    for (int r = 0; r < rows; r++)
        e->echo_rows[r] = llama_get_logits_ith(e->ctx, r);
    #pragma omp parallel for num_threads(e->n_threads) schedule(static)
    for (int r = 0; r < rows; r++) {
        e->echo_lse[r] = model_logsumexp(e->echo_rows[r], e->n_vocab);
        e->echo_k[r] = model_top_k(e, e->echo_rows[r], e->echo_lse[r], k, e->echo_top + (size_t)r * ENGINE_MAX_LOGPROBS);
    }
    for (int r = 0; r < rows; r++) {
        char piece[256];
        llama_token tok = toks[a + r + 1];
        int len = model_piece(e, tok, piece, sizeof piece);
        sp_write_echo(&e->w, id, (uint64_t)(a + r + 1), (double)e->echo_rows[r][tok] - e->echo_lse[r],
                      e->echo_k[r], e->echo_top + (size_t)r * ENGINE_MAX_LOGPROBS, piece, (size_t)len);
    }
}

static struct llama_sampler *make_sampler(engine *e, const sp_request *rq)
{
    struct llama_sampler *ch = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (rq->temperature <= 0.0) {
        llama_sampler_chain_add(ch, llama_sampler_init_greedy());
    } else {
        llama_sampler_chain_add(ch, llama_sampler_init_top_p((float)rq->top_p, 1));
        llama_sampler_chain_add(ch, llama_sampler_init_temp((float)rq->temperature));
        llama_sampler_chain_add(ch, llama_sampler_init_dist(e->seed ^ (uint32_t)(rq->id * 2654435761u)));
    }
    return ch;
}

static llama_token sample(engine *e, struct llama_sampler *smpl, const float *logits)
{
    for (int t = 0; t < e->n_vocab; t++) {
        e->cand[t].id = t;
        e->cand[t].logit = logits[t];
        e->cand[t].p = 0.0f;
    }
    llama_token_data_array arr = { e->cand, (size_t)e->n_vocab, -1, false };
    llama_sampler_apply(smpl, &arr);
    return arr.data[arr.selected].id;
}

/* A llama_decode that did not finish. Cancelled (the abort callback): llama.cpp
 * dropped the aborted ubatch's rows, and the batch is never more than one
 * ubatch here (n_chunk positions, or one generation step), so the slot keeps
 * exactly the rows slot_append recorded; the call below only makes sure of it.
 * Any other failure leaves the slot's rows in doubt: drop them. */
static void decode_failed(engine *e, uint64_t id, int slot, int rc)
{
    if (rc == MODEL_DECODE_CANCELLED && e->cancel_running) {
        llama_memory_seq_rm(llama_get_memory(e->ctx), slot, e->slots[slot].n, -1);
        sp_write_error(&e->w, id, "CANCELLED", "cancelled");
        return;
    }
    slot_truncate(e, slot, 0);
    e->slots[slot].n = 0;
    sp_write_error(&e->w, id, "BAD_REQUEST", rc == 1 ? "the KV cache has no room for the batch" : "llama_decode failed (%d)", rc);
}

/* Polls stdin; answers CANCELLED and returns 1 when the request was cancelled. */
static int cancelled(engine *e, uint64_t id)
{
    engine_poll(e);
    if (!e->cancel_running)
        return 0;
    sp_write_error(&e->w, id, "CANCELLED", "cancelled");
    return 1;
}

void serve_submit(engine *e, pending *p)
{
    sp_request *rq = &p->rq;
    const int slot = (int)rq->slot;
    llama_token *toks = NULL;
    int n = 0;
    if (rq->grammar_len > 0) {
        sp_write_error(&e->w, rq->id, "NOT_SUPPORTED", "constraint grammars are not supported");
        return;
    }
    if (prompt_tokens(e, rq, &toks, &n) != 0)
        return;

    /* Prefix reuse (section 6): read-out resumes only from a snapshot, whose
     * saved logits predict its first fresh position; plain generation also
     * keeps the slot's live common prefix. At least the last position is
     * computed, its logits drive generation. */
    const int readout = rq->logprobs > 0;
    int stale = 0, base;
    snapshot *snap = snapshot_find(e, toks, n, n - 1, &stale);
    const float *pred = NULL;
    if (readout) {
        if (snap) {
            slot_restore(e, slot, snap);
            base = snap->n;
            memcpy(e->pred_buf, snap->logits, (size_t)e->n_vocab * sizeof(float));
            pred = e->pred_buf;
        } else {
            slot_truncate(e, slot, 0);
            base = 0;
        }
    } else {
        base = slot_resume(e, slot, toks, n, snap);
    }
    const char *snap_state = snap ? "hit" : stale ? "stale" : "none";

    sp_write_accept(&e->w, rq->id, (uint64_t)n);
    if (readout)
        write_echo(e, rq->id, base, toks[base], base == 0 ? NULL : pred, rq->logprobs);

    /* Prefill in chunks of one ubatch; with read-out every row is kept, its
     * logits predict the next prompt position. */
    const float *last = NULL;
    for (int a = base; a < n;) {
        int b = a + e->n_chunk < n ? a + e->n_chunk : n;
        batch_clear(&e->batch);
        for (int i = a; i < b; i++)
            batch_add(&e->batch, toks[i], i, &slot, 1, readout || i == n - 1);
        int rc;
        if (model_decode(e, &rc) != 0) {
            decode_failed(e, rq->id, slot, rc);
            free(toks);
            return;
        }
        slot_append(e, slot, toks + a, b - a);
        if (readout)
            echo_rows(e, rq->id, toks, a, (b < n ? b : n - 1) - a, rq->logprobs);
        if (b == n)
            last = llama_get_logits_ith(e->ctx, n - 1 - a);
        a = b;
        if (a < n && cancelled(e, rq->id)) {
            free(toks);
            return;
        }
    }
    memcpy(e->pred_buf, last, (size_t)e->n_vocab * sizeof(float));
    if (rq->pin)
        snapshot_take(e, slot, toks, n, e->pred_buf);

    /* Generation. */
    sp_done d = { 0 };
    d.prompt_tokens = (uint64_t)n;
    d.has_counters = rq->counters;
    d.computed = (uint64_t)(n - base);
    d.reused = (uint64_t)base;
    d.snapshot = snap_state;
    if (rq->max_tokens > 0) {
        struct llama_sampler *smpl = make_sampler(e, rq);
        const float *logits = e->pred_buf;
        double t0 = now_s();
        slot_state *sl = &e->slots[slot];
        for (;;) {
            if (p->stop)
                break;
            llama_token tok = sample(e, smpl, logits);
            if (llama_vocab_is_eog(e->vocab, tok))
                break;
            char piece[256];
            int len = model_piece(e, tok, piece, sizeof piece);
            if (readout) {
                sp_alt top[ENGINE_MAX_LOGPROBS];
                double lse = model_logsumexp(logits, e->n_vocab);
                int m = model_top_k(e, logits, lse, rq->logprobs, top);
                sp_write_data(&e->w, rq->id, piece, (size_t)len, 1, (double)logits[tok] - lse, m, top);
            } else {
                sp_write_data(&e->w, rq->id, piece, (size_t)len, 0, 0.0, 0, NULL);
            }
            d.emitted++;
            if (d.emitted >= rq->max_tokens || sl->n >= e->n_ctx) {
                d.length_limited = 1;
                break;
            }
            batch_clear(&e->batch);
            batch_add(&e->batch, tok, sl->n, &slot, 1, 1);
            int rc;
            if (model_decode(e, &rc) != 0) {
                llama_sampler_free(smpl);
                decode_failed(e, rq->id, slot, rc);
                free(toks);
                return;
            }
            slot_append(e, slot, &tok, 1);
            logits = llama_get_logits_ith(e->ctx, 0);
            if (cancelled(e, rq->id)) {
                llama_sampler_free(smpl);
                free(toks);
                return;
            }
        }
        double dt = now_s() - t0;
        d.tok_s = dt > 0 && d.emitted > 0 ? (double)d.emitted / dt : 0.0;
        llama_sampler_free(smpl);
    }
    d.rss_gb = rss_gb();
    sp_write_done(&e->w, rq->id, &d);
    free(toks);
}
