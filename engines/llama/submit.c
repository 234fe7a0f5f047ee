/* submit.c: one SUBMIT (spec sections 4-6) as a task of the scheduler
 * (sched.c): tokenize, reuse the slot's prefix or a snapshot (submit_start),
 * prefill in chunks (with ECHO read-out when logprobs > 0), snapshot on pin=1,
 * then generate one token per decode (greedy, or temperature + top-p) until
 * max_tokens, an end-of-generation token, the context end, STOP or CANCEL. */
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
    if (*n > e->n_ctx_max) {
        free(*toks);
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "the prompt has %d tokens, the context %d", *n, e->n_ctx_max);
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
 * row0 .. row0+rows-1. The full-vocabulary log-softmax of each row (about 0.3 ms on a
 * 49k vocabulary) is spread over the engine's threads; frames go out in order. */
static void echo_rows(engine *e, uint64_t id, const llama_token *toks, int a, int row0, int rows, int k)
{
    /* engine_logits (llama_get_logits_ith) may reorder outputs on first use: not from threads */
    for (int r = 0; r < rows; r++)
        e->echo_rows[r] = engine_logits(e, row0 + r);
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

typedef struct submit_state {
    llama_token *toks;   /* the prompt, owned, n entries */
    int n;
    int base;            /* positions reused */
    int a;               /* the next prompt position to compute; n: prefilled */
    int b;               /* the end of the chunk in the running decode */
    int readout;
    struct llama_sampler *smpl; /* generation has begun (NULL: prefill) */
    llama_token next;    /* generation: the token the next decode reads */
    sp_done d;
    double t0;           /* generation's start (tok_s) */
} submit_state;

static void submit_free(engine *e, task *t)
{
    (void)e;
    submit_state *st = t->st;
    if (!st)
        return;
    if (st->smpl)
        llama_sampler_free(st->smpl);
    free(st->toks);
    free(st);
    t->st = NULL;
}

/* Answers DONE and ends the task. */
static void finish(engine *e, task *t)
{
    submit_state *st = t->st;
    if (st->smpl) {
        double dt = now_s() - st->t0;
        st->d.tok_s = dt > 0 && st->d.emitted > 0 ? (double)st->d.emitted / dt : 0.0;
    }
    st->d.rss_gb = rss_gb();
    sp_write_done(&e->w, t->rq.id, &st->d);
    task_end(e, t);
}

/* One generation step from `logits` (the prediction of the slot's next
 * position): sample, write DATA, and either end the task or keep the token
 * for the next decode. */
static void gen_step(engine *e, task *t, const float *logits)
{
    submit_state *st = t->st;
    sp_request *rq = &t->rq;
    if (t->stop) {
        finish(e, t);
        return;
    }
    llama_token tok = sample(e, st->smpl, logits);
    if (llama_vocab_is_eog(e->vocab, tok)) {
        finish(e, t);
        return;
    }
    char piece[256];
    int len = model_piece(e, tok, piece, sizeof piece);
    if (st->readout) {
        sp_alt top[ENGINE_MAX_LOGPROBS];
        double lse = model_logsumexp(logits, e->n_vocab);
        int m = model_top_k(e, logits, lse, rq->logprobs, top);
        sp_write_data(&e->w, rq->id, piece, (size_t)len, 1, (double)logits[tok] - lse, m, top);
    } else {
        sp_write_data(&e->w, rq->id, piece, (size_t)len, 0, 0.0, 0, NULL);
    }
    st->d.emitted++;
    /* a prompt that fits a slot generates to the slot's end, a longer one (the lease's) to n_ctx_max */
    int end = st->n > e->n_ctx ? e->n_ctx_max : e->n_ctx;
    if (st->d.emitted >= rq->max_tokens || e->slots[rq->slot].n >= end) {
        st->d.length_limited = 1;
        finish(e, t);
        return;
    }
    st->next = tok;
}

/* A prompt with pictures (picture.h): its prelude evaluated into the slot now, the text after the last
 * picture read on it as a prompt resumed there. No snapshot restored or taken (pin=1 is refused), nothing
 * of the slot reused; read-out starts at the second position after the pictures (the first one's
 * prediction would be a picture position's logits, which llama.cpp's multimodal path does not keep).
 * Returns 0 (ACCEPT written), or -1 after its ERROR. */
static int start_pictures(engine *e, task *t, submit_state *st)
{
    sp_request *rq = &t->rq;
    const int slot = (int)rq->slot;
    char msg[SP_REASON_MAX];
    picture_prelude pp;
    llama_token *tail = NULL;
    int nt = 0, rc = -1;
    memset(&pp, 0, sizeof pp);
    if (rq->payload_len == 0) {
        sp_write_error(&e->w, rq->id, "EMPTY_PROMPT", "the prompt is empty");
        return -1;
    }
    if (rq->ids || rq->pin) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", rq->ids ? "ids: a prompt with pictures is text (picture markers)"
                                                             : "pin: a prompt with pictures takes no snapshot");
        return -1;
    }
    const char *text = (const char *)rq->payload;
    if (picture_prepare(e, t->pics, "prompt", text, rq->payload_len, &pp, msg, sizeof msg) != 0) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "%s", msg);
        return -1;
    }
    if (model_tokenize_ex(e, text + pp.tail_off, rq->payload_len - pp.tail_off, 0, &tail, &nt) != 0) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "the prompt could not be tokenized");
        goto out;
    }
    const int n = pp.n_pos + nt;
    if (nt == 0 || n > e->n_ctx) {
        if (nt == 0)
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "prompt: no text after its last picture marker (a picture's "
                                                         "positions have no logits to read the next token from)");
        else
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "prompt: %d positions with its pictures, a slot holds %d", n,
                           e->n_ctx);
        goto out;
    }
    if (!(st->toks = malloc((size_t)n * sizeof *st->toks))) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory");
        goto out;
    }
    for (int i = 0; i < pp.n_pos; i++)
        st->toks[i] = PICTURE_TOKEN;
    memcpy(st->toks + pp.n_pos, tail, (size_t)nt * sizeof *tail);
    st->n = n;
    st->readout = rq->logprobs > 0;
    if (picture_eval(e, &pp, slot, msg, sizeof msg) != 0) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "%s", msg);
        goto out;
    }
    st->base = st->a = pp.n_pos;
    st->d.prompt_tokens = (uint64_t)n;
    st->d.has_counters = rq->counters;
    st->d.computed = (uint64_t)n;
    st->d.reused = 0;
    st->d.snapshot = "none";
    sp_write_accept(&e->w, rq->id, (uint64_t)n);
    rc = 0;
out:
    free(tail);
    picture_prelude_free(&pp);
    return rc;
}

static int submit_start(engine *e, task *t)
{
    sp_request *rq = &t->rq;
    const int slot = (int)rq->slot;
    llama_token *toks = NULL;
    int n = 0;
    if (rq->grammar_len > 0) {
        sp_write_error(&e->w, rq->id, "NOT_SUPPORTED", "constraint grammars are not supported");
        return -1;
    }
    if (t->pics) {
        submit_state *st = calloc(1, sizeof *st);
        if (!st) {
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory");
            return -1;
        }
        t->st = st;
        return start_pictures(e, t, st);
    }
    char msg[SP_REASON_MAX];
    if (e->mtmd && !rq->ids &&
        picture_count_check("prompt", (const char *)rq->payload, rq->payload_len, 0, msg, sizeof msg) != 0) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "%s", msg);
        return -1;
    }
    if (prompt_tokens(e, rq, &toks, &n) != 0)
        return -1;
    submit_state *st = calloc(1, sizeof *st);
    if (!st) {
        free(toks);
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory");
        return -1;
    }
    t->st = st;
    st->toks = toks;
    st->n = n;

    /* Prefix reuse (section 6): read-out resumes only from a snapshot, whose
     * saved logits predict its first fresh position; plain generation also
     * keeps the slot's live common prefix. At least the last position is
     * computed, its logits drive generation. */
    st->readout = rq->logprobs > 0;
    int stale = 0;
    snapshot *snap = snapshot_find(e, toks, n, n - 1, &stale);
    const float *pred = NULL;
    if (st->readout) {
        if (snap) {
            slot_restore(e, slot, snap);
            st->base = snap->n;
            pred = snap->logits;
        } else {
            slot_truncate(e, slot, 0);
            st->base = 0;
        }
    } else {
        st->base = slot_resume(e, slot, toks, n, snap);
    }
    st->a = st->base;
    st->d.prompt_tokens = (uint64_t)n;
    st->d.has_counters = rq->counters;
    st->d.computed = (uint64_t)(n - st->base);
    st->d.reused = (uint64_t)st->base;
    st->d.snapshot = snap ? "hit" : stale ? "stale" : "none";

    sp_write_accept(&e->w, rq->id, (uint64_t)n);
    if (st->readout)
        write_echo(e, rq->id, st->base, toks[st->base], st->base == 0 ? NULL : pred, rq->logprobs);
    return 0;
}

static int submit_unit(engine *e, task *t)
{
    (void)e;
    (void)t;
    return 1;
}

static int submit_want(engine *e, task *t)
{
    submit_state *st = t->st;
    if (!st->smpl)
        return st->n - st->a;
    if (t->stop) {
        finish(e, t);
        return 0;
    }
    return 1;
}

/* Prefill: positions a .. b-1 (every row's logits kept with read-out, else
 * the last prompt position's only); generation: the sampled token. */
static int submit_fill(engine *e, task *t, int budget, int seq_budget)
{
    (void)seq_budget; /* no scratch sequences */
    submit_state *st = t->st;
    int slot = (int)t->rq.slot;
    if (st->smpl) {
        batch_add(&e->batch, st->next, e->slots[slot].n, &slot, 1, 1);
        return 1;
    }
    st->b = st->a + budget < st->n ? st->a + budget : st->n;
    for (int i = st->a; i < st->b; i++)
        batch_add(&e->batch, st->toks[i], i, &slot, 1, st->readout || i == st->n - 1);
    return st->b - st->a;
}

static void submit_decoded(engine *e, task *t)
{
    submit_state *st = t->st;
    sp_request *rq = &t->rq;
    const int slot = (int)rq->slot;
    if (st->smpl) {
        slot_append(e, slot, &st->next, 1);
        gen_step(e, t, engine_logits(e, t->row0));
        return;
    }
    int a = st->a, b = st->b, n = st->n;
    slot_append(e, slot, st->toks + a, b - a);
    if (st->readout)
        echo_rows(e, rq->id, st->toks, a, t->row0, (b < n ? b : n - 1) - a, rq->logprobs);
    st->a = b;
    if (b < n)
        return;
    const float *last = engine_logits(e, t->row0 + n - 1 - a);
    if (rq->pin)
        snapshot_take(e, slot, st->toks, n, last);
    if (rq->max_tokens == 0) {
        finish(e, t);
        return;
    }
    st->smpl = make_sampler(e, rq);
    st->t0 = now_s();
    gen_step(e, t, last);
}

/* The decode did not finish: llama.cpp dropped the aborted ubatch's rows of
 * the slot's sequence, the only one this task's rows are in, and a failed
 * one never placed them; the slot's token list was not extended, so removing
 * whatever the sequence holds past it makes the two equal again. */
static void submit_undo(engine *e, task *t)
{
    int slot = (int)t->rq.slot;
    llama_memory_seq_rm(llama_get_memory(e->ctx), slot, e->slots[slot].n, -1);
}

/* Any failure other than a cancellation leaves the slot's rows in doubt: drop them. */
static void submit_fail(engine *e, task *t, int rc)
{
    int slot = (int)t->rq.slot;
    slot_truncate(e, slot, 0);
    e->slots[slot].n = 0;
    sp_write_error(&e->w, t->rq.id, "BAD_REQUEST", rc == 1 ? "the KV cache has no room for the batch" : "llama_decode failed (%d)", rc);
}

const task_ops submit_ops = TASK_OPS(submit, 0, 0);
