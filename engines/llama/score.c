/* score.c: SCORE, the batched scoring extension (spec section 9.1).
 *
 * Every option text prefix + stem + option is tokenized as a whole text
 * would be, the prefix's tokens kept and only the text after a cut near its
 * end tokenized again (splice.c). The trunk,
 * the tokens all of them share, goes into the slot's own sequence (reused
 * from the slot or a snapshot where it can be). Everything after the trunk
 * is a token trie: each node is one distinct (context, token) position, put
 * in the batch once and tagged with the sequence ids of every option whose
 * path runs through it. Option q uses scratch sequence n_slots + q, a copy of
 * the slot's trunk (a copy in the unified KV cache shares the cells). So one
 * llama_decode computes each stem once and each option's own tokens once,
 * and the logits row of a node predicts the next token of every option below
 * it. An option's last token predicts nothing and is left out, so options of
 * one token cost no position beyond their stem (the stem's last logits hold
 * them). More options than scratch sequences, or more nodes than one batch,
 * spill into further chunks, each one llama_decode.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "json.h"

typedef struct option_tokens {
    llama_token *toks; /* prefix + stem + option, owned */
    int n;
    int ctx;           /* context_tokens: lcp with prefix + stem */
    int group, index;
    int *path;         /* node of positions trunk .. n-1 (chunk-local), owned */
    score_key key;     /* hash of toks (score_cache.c) */
    double *lps;       /* n_lps logprobs once scored or found in the cache, owned */
    int n_lps;         /* -1: not in the score cache, until scored */
} option_tokens;

typedef struct trie_node {
    int first_child, next_sibling;
    double lse;        /* logsumexp of its logits row once computed, else NAN */
} trie_node;

typedef struct score_job {
    option_tokens *opts;
    int n_opts;
    int trunk;         /* tokens shared by every option, in the slot's sequence */
    int longest;       /* max ctx + scored tokens: ACCEPT's prompt_tokens */
} score_job;

static void job_free(score_job *j)
{
    for (int i = 0; i < j->n_opts; i++) {
        free(j->opts[i].toks);
        free(j->opts[i].path);
        free(j->opts[i].lps);
    }
    free(j->opts);
    memset(j, 0, sizeof *j);
}

/* Reads the payload into a job. Returns 0, or -1 with the reason in msg
 * (answered as BAD_REQUEST, the field path first). */
static int job_parse(engine *e, const sp_request *rq, score_job *job, int *pin, char *msg, size_t cap)
{
    spj_value root;
    char jerr[SPJ_ERR_MAX];
    memset(job, 0, sizeof *job);
    if (spj_parse((const char *)rq->payload, rq->payload_len, &root, jerr) != 0) {
        snprintf(msg, cap, "payload: not JSON (%s)", jerr);
        return -1;
    }
    int rc = -1;
    const llama_token *ptoks = NULL;
    int np = 0;
    const spj_value *prefix = spj_get(&root, "prefix"), *groups = spj_get(&root, "groups"), *pv = spj_get(&root, "pin");
    if (root.type != SPJ_OBJECT) {
        snprintf(msg, cap, "payload: expected an object, got %s", spj_type_name(root.type));
        goto out;
    }
    if (!prefix || prefix->type != SPJ_STRING) {
        snprintf(msg, cap, "prefix: expected a string");
        goto out;
    }
    if (!groups || groups->type != SPJ_ARRAY || groups->n == 0) {
        snprintf(msg, cap, "groups: expected a non-empty array");
        goto out;
    }
    if (pv && pv->type != SPJ_BOOL) {
        snprintf(msg, cap, "pin: expected a boolean");
        goto out;
    }
    *pin = pv ? pv->boolean : 0;
    size_t total = 0;
    for (size_t g = 0; g < groups->n; g++) {
        const spj_value *gr = &groups->items[g], *stem = spj_get(gr, "stem"), *os = spj_get(gr, "options");
        if (gr->type != SPJ_OBJECT || !stem || stem->type != SPJ_STRING) {
            snprintf(msg, cap, "groups[%zu].stem: expected a string", g);
            goto out;
        }
        if (!os || os->type != SPJ_ARRAY || os->n == 0) {
            snprintf(msg, cap, "groups[%zu].options: expected a non-empty array", g);
            goto out;
        }
        total += os->n;
    }
    job->opts = calloc(total, sizeof *job->opts);
    if (!job->opts) {
        snprintf(msg, cap, "payload: out of memory");
        goto out;
    }
    const prefix_tokens *pt = prefix_tokens_get(e, prefix->str, prefix->len);
    if (!pt) {
        snprintf(msg, cap, "prefix: could not be tokenized");
        goto out;
    }
    ptoks = pt->toks;
    np = pt->n;
    job->trunk = np;
    for (size_t g = 0; g < groups->n; g++) {
        const spj_value *gr = &groups->items[g], *stem = spj_get(gr, "stem"), *os = spj_get(gr, "options");
        llama_token *gt = NULL;
        int ng = 0;
        if (splice_tokenize(e, pt, stem->str, stem->len, "", 0, &gt, &ng) != 0) {
            snprintf(msg, cap, "groups[%zu].stem: could not be tokenized", g);
            goto out;
        }
        for (size_t o = 0; o < os->n; o++) {
            const spj_value *ov = &os->items[o];
            if (ov->type != SPJ_STRING) {
                free(gt);
                snprintf(msg, cap, "groups[%zu].options[%zu]: expected a string", g, o);
                goto out;
            }
            option_tokens *ot = &job->opts[job->n_opts++];
            ot->group = (int)g;
            ot->index = (int)o;
            if (splice_tokenize(e, pt, stem->str, stem->len, ov->str, ov->len, &ot->toks, &ot->n) != 0) {
                free(gt);
                snprintf(msg, cap, "groups[%zu].options[%zu]: could not be tokenized", g, o);
                goto out;
            }
            ot->ctx = lcp(gt, ng, ot->toks, ot->n);
            int scored = ot->n - ot->ctx;
            const char *why = NULL;
            if (scored < 1)
                why = "adds no token after the stem";
            else if (scored > ENGINE_MAX_SCORED)
                why = "has more than 200 scored tokens";
            else if (ot->ctx < 1)
                why = "has no context before its first token";
            else if (ot->n > e->n_ctx)
                why = "is longer than the context";
            if (why) {
                free(gt);
                snprintf(msg, cap, "groups[%zu].options[%zu]: the text %s", g, o, why);
                goto out;
            }
            int t = lcp(ptoks, job->trunk, ot->toks, ot->n);
            if (t < job->trunk)
                job->trunk = t;
            if (ot->ctx < job->trunk)
                job->trunk = ot->ctx;
            if (ot->n > job->longest)
                job->longest = ot->n;
        }
        free(gt);
    }
    rc = 0;
out:
    spj_free(&root);
    if (rc)
        job_free(job);
    return rc;
}

/* Brings the trunk into the slot's sequence and the logits of its last
 * position into e->pred_buf (when trunk > 0). Returns the positions computed,
 * or -1 after answering an ERROR. */
static int load_trunk(engine *e, uint64_t id, int slot, const option_tokens *o0, int trunk, reuse_info *ri)
{
    int stale = 0, base;
    const llama_token *toks = o0->toks;
    ri->snapshot = "none";
    ri->reused = 0;
    if (trunk == 0) {
        slot_truncate(e, slot, 0);
        return 0;
    }
    snapshot *snap = snapshot_find(e, toks, trunk, trunk, &stale);
    ri->snapshot = snap ? "hit" : stale ? "stale" : "none";
    if (snap && snap->n == trunk) {
        slot_restore(e, slot, snap);
        memcpy(e->pred_buf, snap->logits, (size_t)e->n_vocab * sizeof(float));
        ri->reused = trunk;
        return 0;
    }
    /* the live rows have no logits: the trunk's last position is recomputed */
    base = slot_resume(e, slot, toks, trunk, snap);
    ri->reused = base;
    for (int a = base; a < trunk;) {
        int b = a + e->n_chunk < trunk ? a + e->n_chunk : trunk;
        batch_clear(&e->batch);
        for (int i = a; i < b; i++)
            batch_add(&e->batch, toks[i], i, &slot, 1, i == trunk - 1);
        int rc;
        if (model_decode(e, &rc) != 0) {
            if (rc == MODEL_DECODE_CANCELLED && e->cancel_running) {
                /* one ubatch per decode: llama.cpp dropped its rows, the slot
                 * keeps the positions computed before it */
                llama_memory_seq_rm(llama_get_memory(e->ctx), slot, e->slots[slot].n, -1);
                sp_write_error(&e->w, id, "CANCELLED", "cancelled");
                return -1;
            }
            slot_truncate(e, slot, 0);
            sp_write_error(&e->w, id, "BAD_REQUEST", "llama_decode of the prefix failed (%d)", rc);
            return -1;
        }
        slot_append(e, slot, toks + a, b - a);
        if (b == trunk)
            memcpy(e->pred_buf, llama_get_logits_ith(e->ctx, b - 1 - a), (size_t)e->n_vocab * sizeof(float));
        a = b;
    }
    return trunk - base;
}

/* Scores options idx[first .. last) of the job in one llama_decode, keeping
 * their logprobs in ot->lps (and in the score cache). trie is scratch of
 * n_batch entries. Returns the positions computed, or -1 after answering an
 * ERROR. */
static int run_chunk(engine *e, uint64_t id, int slot, score_job *job, const int *idx, int first, int last,
                     trie_node *trie, double pred_lse)
{
    llama_memory_t mem = llama_get_memory(e->ctx);
    struct llama_batch *b = &e->batch;
    const int trunk = job->trunk;
    batch_clear(b);
    for (int q = 0; q < last - first; q++) {
        option_tokens *ot = &job->opts[idx[first + q]];
        int seq = e->n_slots + q, cur = -1;
        /* the option's last token predicts nothing: it is never computed, so a
         * one-token option costs no position at all */
        for (int p = trunk; p < ot->n - 1; p++) {
            int node = cur < 0 ? -1 : trie[cur].first_child;
            if (cur < 0) {
                /* roots: nodes at position trunk */
                for (int i = 0; i < b->n_tokens && node < 0; i++)
                    if (b->pos[i] == trunk && b->token[i] == ot->toks[p])
                        node = i;
            } else {
                while (node >= 0 && b->token[node] != ot->toks[p])
                    node = trie[node].next_sibling;
            }
            if (node < 0) {
                node = b->n_tokens;
                batch_add(b, ot->toks[p], p, &seq, 1, 0);
                trie[node].first_child = -1;
                trie[node].next_sibling = cur < 0 ? -1 : trie[cur].first_child;
                trie[node].lse = NAN;
                if (cur >= 0)
                    trie[cur].first_child = node;
            } else {
                b->seq_id[node][b->n_seq_id[node]++] = seq;
            }
            if (p >= ot->ctx - 1 && p <= ot->n - 2)
                b->logits[node] = 1;
            ot->path[p - trunk] = node;
            cur = node;
        }
    }
    int computed = b->n_tokens, rc = 0;
    for (int q = 0; computed > 0 && q < last - first; q++) {
        llama_memory_seq_rm(mem, e->n_slots + q, -1, -1);
        if (trunk > 0)
            llama_memory_seq_cp(mem, slot, e->n_slots + q, 0, trunk);
    }
    if (computed > 0 && model_decode(e, &rc) != 0) {
        /* the trie's rows live in the scratch sequences only (the slot's
         * sequence is never in this batch): dropping them whole undoes a
         * failed or cancelled decode, the ubatches it finished included */
        for (int q = 0; q < last - first; q++)
            llama_memory_seq_rm(mem, e->n_slots + q, -1, -1);
        if (rc == MODEL_DECODE_CANCELLED && e->cancel_running)
            sp_write_error(&e->w, id, "CANCELLED", "cancelled");
        else
            sp_write_error(&e->w, id, "BAD_REQUEST", rc == 1 ? "the KV cache has no room for the options"
                                                              : "llama_decode of the options failed");
        return -1;
    }
    for (int j = first; j < last; j++) {
        option_tokens *ot = &job->opts[idx[j]];
        double *lps = ot->lps;
        int n = 0;
        for (int p = ot->ctx; p < ot->n; p++) {
            int prev = p - 1;
            const float *logits;
            double lse;
            if (prev == trunk - 1) {
                logits = e->pred_buf;
                lse = pred_lse;
            } else {
                int node = ot->path[prev - trunk];
                logits = llama_get_logits_ith(e->ctx, node);
                if (isnan(trie[node].lse))
                    trie[node].lse = model_logsumexp(logits, e->n_vocab);
                lse = trie[node].lse;
            }
            lps[n++] = (double)logits[ot->toks[p]] - lse;
        }
        ot->n_lps = n;
        score_cache_put(&e->scores, &ot->key, ot->ctx, lps, n);
    }
    for (int q = 0; q < last - first; q++)
        llama_memory_seq_rm(mem, e->n_slots + q, -1, -1);
    return computed;
}

/* Nodes option idx[j] would add to a trie already holding options
 * idx[first .. j): its positions up to its last but one (the last is never
 * computed) after the longest prefix it shares with the nodes already there. */
static int new_nodes(const score_job *job, const int *idx, int first, int j)
{
    const option_tokens *ot = &job->opts[idx[j]];
    int shared = job->trunk;
    for (int i = first; i < j; i++) {
        const option_tokens *oi = &job->opts[idx[i]];
        int l = lcp(oi->toks, oi->n, ot->toks, ot->n);
        if (l > oi->n - 1)
            l = oi->n - 1;
        if (l > shared)
            shared = l;
    }
    return ot->n - 1 > shared ? ot->n - 1 - shared : 0;
}

void serve_score(engine *e, pending *p)
{
    sp_request *rq = &p->rq;
    const int slot = (int)rq->slot;
    score_job job;
    int pin = 0;
    char msg[SP_REASON_MAX];
    if (job_parse(e, rq, &job, &pin, msg, sizeof msg) != 0) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "%s", msg);
        return;
    }
    const int cap_nodes = e->n_batch < e->n_ctx ? e->n_batch : e->n_ctx;
    /* options to compute, and options answered from the score cache */
    int *todo = malloc((size_t)job.n_opts * sizeof *todo), *cached = malloc((size_t)job.n_opts * sizeof *cached);
    trie_node *trie = malloc((size_t)e->n_batch * sizeof *trie);
    if (!todo || !cached || !trie) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory");
        goto out;
    }
    /* every option's key continues the trunk's hash: the trunk is hashed once */
    score_key trunk_key;
    score_key_init(&trunk_key);
    score_key_add(&trunk_key, job.opts[0].toks, job.trunk);
    int n_todo = 0, n_cached = 0;
    for (int j = 0; j < job.n_opts; j++) {
        option_tokens *ot = &job.opts[j];
        if (ot->n - job.trunk > cap_nodes) {
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "groups[%d].options[%d]: the text does not fit one batch of %d",
                           ot->group, ot->index, cap_nodes);
            goto out;
        }
        ot->path = malloc((size_t)(ot->n - job.trunk + 1) * sizeof(int));
        ot->lps = malloc(ENGINE_MAX_SCORED * sizeof(double));
        if (!ot->path || !ot->lps) {
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory");
            goto out;
        }
        ot->key = trunk_key;
        score_key_add(&ot->key, ot->toks + job.trunk, ot->n - job.trunk);
        ot->n_lps = score_cache_get(&e->scores, &ot->key, ot->ctx, ot->lps, ENGINE_MAX_SCORED);
        if (ot->n_lps >= 0)
            cached[n_cached++] = j;
        else
            todo[n_todo++] = j;
    }
    sp_write_accept(&e->w, rq->id, (uint64_t)job.longest);

    /* the positions the cached options would have needed count as reused */
    int reused_nodes = 0;
    for (int j = 0; j < n_cached; j++)
        reused_nodes += new_nodes(&job, cached, 0, j);

    reuse_info ri = { 0, "none" };
    int computed = 0, stale = 0;
    const snapshot *pinned = NULL;
    if (n_todo == 0 && job.trunk > 0)
        pinned = snapshot_find(e, job.opts[0].toks, job.trunk, job.trunk, &stale);
    if (n_todo > 0 || (pin && job.trunk > 0 && !(pinned && pinned->n == job.trunk))) {
        computed = load_trunk(e, rq->id, slot, &job.opts[0], job.trunk, &ri);
        if (computed < 0)
            goto out;
        if (stale && !strcmp(ri.snapshot, "none"))
            ri.snapshot = "stale"; /* released by the lookup above */
        if (pin && job.trunk > 0)
            snapshot_take(e, slot, job.opts[0].toks, job.trunk, e->pred_buf);
    } else {
        /* every option answered from the cache: the trunk is not touched */
        ri.reused = job.trunk;
        ri.snapshot = pinned ? "hit" : stale ? "stale" : "none";
    }
    double pred_lse = job.trunk > 0 && n_todo > 0 ? model_logsumexp(e->pred_buf, e->n_vocab) : NAN;

    for (int first = 0; first < n_todo;) {
        int last = first, nodes = 0;
        while (last < n_todo && last - first < e->n_score_seqs) {
            int add = new_nodes(&job, todo, first, last);
            if (nodes + add > cap_nodes)
                break;
            nodes += add;
            last++;
        }
        int c = run_chunk(e, rq->id, slot, &job, todo, first, last, trie, pred_lse);
        if (c < 0)
            goto out;
        computed += c;
        first = last;
        engine_poll(e);
        if (e->cancel_running) {
            sp_write_error(&e->w, rq->id, "CANCELLED", "cancelled");
            goto out;
        }
    }
    /* one SCORED per option in request order (spec 9.1) */
    for (int j = 0; j < job.n_opts; j++) {
        const option_tokens *ot = &job.opts[j];
        sp_write_scored(&e->w, rq->id, (uint64_t)ot->group, (uint64_t)ot->index, (uint64_t)ot->ctx, ot->n_lps, ot->lps);
    }
    sp_done d = { 0 };
    d.prompt_tokens = (uint64_t)job.longest;
    d.rss_gb = rss_gb();
    d.has_counters = 1;
    d.computed = (uint64_t)computed;
    d.reused = (uint64_t)(ri.reused + reused_nodes);
    d.snapshot = ri.snapshot;
    sp_write_done(&e->w, rq->id, &d);
out:
    free(trie);
    free(todo);
    free(cached);
    job_free(&job);
}
