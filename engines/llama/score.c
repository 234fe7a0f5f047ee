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
 *
 * A group may continue a shorter part of the prefix (its "base", spec 9.1:
 * the content-free reading of a question beside the question itself). Its
 * options leave the trunk where their tokens leave the prefix's ("from"):
 * their scratch sequences copy the trunk's cells before that position only,
 * and their trie starts there, so they read the head of the prefix without
 * the rest and the slot keeps the whole trunk.
 *
 * A chunk that cuts a question (more options than scratch sequences: a
 * choice of 255 labels) keeps the question's stem for the next chunk: its
 * stem nodes are also tagged with the slot's *carry* sequence (one id per
 * slot above the scratch ones), and the question's options in later chunks
 * copy their context from the carry and recompute only the stem's last
 * position, whose logits they need. So a stem is computed once whatever the
 * number of options; the carry is dropped when the SCORE ends.
 *
 * A SCORE is a task of the scheduler (sched.c): its trunk is prefilled in
 * chunks like a SUBMIT's prompt, then each trie chunk is one fill of the
 * batch, its nodes after the other tasks' rows and its scratch sequences
 * those the batch has not given to another SCORE.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "persist.h"
#include "score_request.h"

typedef struct option_tokens {
    llama_token *toks; /* prefix + stem + option, owned */
    int n;
    int ctx;           /* context_tokens: lcp with prefix + stem */
    int based;         /* its group continues prefix[:base] with base < the prefix's bytes */
    int from;          /* where its path leaves the trunk: job->trunk, or earlier when based */
    int from0;         /* from as parsed (from and carried change once its stem is in the carry) */
    int carried;       /* its context is copied from the carry sequence, not from the slot */
    int anchor;        /* under `hidden`: its group's first option, whose context's last row is read */
    int group, index;
    int *path;         /* node of positions trunk .. n-1 (chunk-local), owned */
    score_key key;     /* hash of toks (score_cache.c) */
    double *lps;       /* n_lps logprobs once scored or found in the cache, owned */
    int n_lps;         /* -1: not in the score cache, until scored */
    int disk;          /* its numbers were read from a file of an earlier process (persist.c) */
} option_tokens;

typedef struct trie_node {
    int first_child, next_sibling;
    int root;          /* a root's position (its option's from), -1 below the roots */
    int carried;       /* a root of options whose context is the carry's */
    double lse;        /* logsumexp of its logits row once computed, else NAN */
} trie_node;

typedef struct score_job {
    option_tokens *opts;
    int n_opts;
    int trunk;         /* tokens shared by every option, in the slot's sequence */
    int src;           /* an option that holds the trunk's tokens (one whose from is the trunk) */
    int longest;       /* max ctx + scored tokens: ACCEPT's prompt_tokens */
    int n_groups;
    int n_hidden;      /* `hidden`: layers to read at each group's context end (hidden.c) */
    int hidden[ENGINE_MAX_HIDDEN];
    float *hid;        /* n_groups x n_hidden x n_embd, NAN until read, owned */
} score_job;

static void job_free(score_job *j)
{
    for (int i = 0; i < j->n_opts; i++) {
        free(j->opts[i].toks);
        free(j->opts[i].path);
        free(j->opts[i].lps);
    }
    free(j->opts);
    free(j->hid);
    memset(j, 0, sizeof *j);
}

/* With a projector: a picture marker in a stem or an option (only the prefix's are read), or 0. */
static int markers_outside_prefix(const sp_score_request *sr, const sp_score_rules *rules, char *msg, size_t cap)
{
    char f[96];
    for (size_t g = 0; g < sr->n_groups; g++) {
        const spj_value *stem = sr->groups[g].stem, *os = sr->groups[g].options;
        if (picture_markers(stem->str, stem->len)) {
            snprintf(msg, cap, "groups[%zu].stem: the picture marker %s is only read in the prefix", g, picture_marker());
            return -1;
        }
        for (size_t o = 0; o < os->n; o++)
            if (picture_markers(os->items[o].str, os->items[o].len)) {
                snprintf(msg, cap, "%s: the picture marker %s is only read in the prefix",
                         sp_score_field(rules, g, o, f, sizeof f), picture_marker());
                return -1;
            }
    }
    return 0;
}

/* With pictures (picture.h): what a SCORE with them cannot carry, or 0. Its groups continue the whole
 * prefix, with no hidden layers and no pin (no snapshot of a picture). */
static int pictures_refused(const sp_score_request *sr, char *msg, size_t cap)
{
    if (sr->pin) {
        snprintf(msg, cap, "pin: a prefix with pictures takes no snapshot");
        return -1;
    }
    if (sr->n_hidden) {
        snprintf(msg, cap, "hidden: not read with pictures");
        return -1;
    }
    for (size_t g = 0; g < sr->n_groups; g++)
        if (sr->groups[g].base < sr->prefix->len) {
            snprintf(msg, cap, "groups[%zu].base: not served with pictures (the group continues the whole prefix)", g);
            return -1;
        }
    return 0;
}

/* With a projector, the SCORE's picture markers checked against its pictures (pics, NULL for none); with
 * pictures, the prefix's prelude prepared into *pp and *skip set to the bytes of the prefix it covers.
 * Returns 0, or -1 with the reason in msg. */
static int job_pictures(engine *e, const sp_score_request *sr, const sp_score_rules *rules, const picture_set *pics,
                        picture_prelude *pp, size_t *skip, char *msg, size_t cap)
{
    const spj_value *prefix = sr->prefix;
    if (e->mtmd && markers_outside_prefix(sr, rules, msg, cap) != 0)
        return -1;
    if (!pics)
        return e->mtmd ? picture_count_check("prefix", prefix->str, prefix->len, 0, msg, cap) : 0;
    if (pictures_refused(sr, msg, cap) != 0 ||
        picture_prepare(e, pics, "prefix", prefix->str, prefix->len, pp, msg, cap) != 0)
        return -1;
    *skip = pp->tail_off;
    return 0;
}

/* The job of the text after the prefix's last picture (job_parse) made the job of the whole prefix: the
 * prelude's n positions (PICTURE_TOKEN) before every option's tokens, in place of the BOS their whole-text
 * tokenization starts with where the model adds one (the text after a picture has none, as mtmd_tokenize
 * tokenizes it). Returns 0, or -1 with the reason in msg: no token after the pictures that every option
 * shares (a picture's positions have no logits, so the trunk's last position must be text), or more
 * positions than a slot holds. */
static int shift_for_pictures(engine *e, score_job *job, int n, char *msg, size_t cap)
{
    int bos = llama_vocab_get_add_bos(e->vocab) ? 1 : 0;
    for (int j = 0; bos && j < job->n_opts; j++)
        bos = job->opts[j].n > 0 && job->opts[j].toks[0] == llama_vocab_bos(e->vocab);
    job->trunk -= bos;
    job->longest -= bos;
    if (job->trunk == 0) {
        snprintf(msg, cap, "prefix: no token after its last picture that every option shares (a picture's positions "
                           "have no logits to score the next token from)");
        return -1;
    }
    if (job->longest + n > e->n_ctx) {
        snprintf(msg, cap, "prefix: %d positions with its pictures and the longest option, a slot holds %d",
                 job->longest + n, e->n_ctx);
        return -1;
    }
    for (int j = 0; j < job->n_opts; j++) {
        option_tokens *ot = &job->opts[j];
        llama_token *toks = malloc((size_t)(ot->n + n) * sizeof *toks);
        if (!toks) {
            snprintf(msg, cap, "payload: out of memory");
            return -1;
        }
        for (int i = 0; i < n; i++)
            toks[i] = PICTURE_TOKEN;
        memcpy(toks + n, ot->toks + bos, (size_t)(ot->n - bos) * sizeof *toks);
        free(ot->toks);
        ot->toks = toks;
        ot->n += n - bos;
        ot->ctx += n - bos;
        ot->from += n - bos;
        ot->from0 += n - bos;
    }
    job->trunk += n;
    job->longest += n;
    return 0;
}

/* Reads the payload into a job: its grammar (engines/common/score_request.h, with base and this engine's
 * hidden layers), then each text tokenized and its tokens checked. With pictures (pics not NULL) the
 * prefix's prelude is tokenized into *pp and the texts are the rest (picture.h). Returns 0, or -1 with
 * the reason in msg (answered as BAD_REQUEST, the field path first). */
static int job_parse(engine *e, const sp_request *rq, score_job *job, int *pin, char *msg, size_t cap,
                     const picture_set *pics, picture_prelude *pp)
{
    const sp_score_rules rules = { .base = 1, .hidden_layers = e->no_hidden ? 0 : hidden_layers(e) };
    sp_score_request sr;
    char err[SP_SCORE_ERR_MAX], f[96];
    memset(job, 0, sizeof *job);
    if (sp_score_parse(rq->payload, rq->payload_len, &rules, &sr, err) != 0) {
        snprintf(msg, cap, "%s", err);
        return -1;
    }
    int rc = -1;
    const llama_token *ptoks = NULL;
    int np = 0;
    const spj_value *prefix = sr.prefix;
    size_t skip = 0; /* the options continue the prefix's text after its last picture, if any */
    if (job_pictures(e, &sr, &rules, pics, pp, &skip, msg, cap) != 0)
        goto out;
    const char *ptext = prefix->str + skip;
    size_t plen = prefix->len - skip;
    *pin = sr.pin;
    job->n_hidden = sr.n_hidden;
    memcpy(job->hidden, sr.hidden, sizeof sr.hidden);
    job->opts = calloc(sr.n_options, sizeof *job->opts);
    job->n_groups = (int)sr.n_groups;
    if (job->n_hidden) {
        size_t nh = sr.n_groups * (size_t)job->n_hidden * (size_t)hidden_dim(e);
        job->hid = malloc(nh * sizeof(float));
        for (size_t i = 0; job->hid && i < nh; i++)
            job->hid[i] = NAN;
    }
    if (!job->opts || (job->n_hidden && !job->hid)) {
        snprintf(msg, cap, "payload: out of memory");
        goto out;
    }
    const prefix_tokens *pt = prefix_tokens_get(e, ptext, plen);
    if (!pt) {
        snprintf(msg, cap, "prefix: could not be tokenized");
        goto out;
    }
    ptoks = pt->toks;
    np = pt->n;
    job->trunk = np;
    int n_plain = 0; /* options of groups on the whole prefix: they alone set the trunk */
    for (size_t g = 0; g < sr.n_groups; g++) {
        const spj_value *stem = sr.groups[g].stem, *os = sr.groups[g].options;
        const size_t base = sr.groups[g].base;
        const prefix_tokens *gp = pt;
        if (base < prefix->len) {
            gp = prefix_tokens_get(e, prefix->str, base);
            if (!gp) {
                snprintf(msg, cap, "groups[%zu].base: the prefix's first %zu bytes could not be tokenized", g, base);
                goto out;
            }
            /* pt was the most recent entry, so gp's lookup evicted another: this finds it again */
            pt = prefix_tokens_get(e, ptext, plen);
            if (!pt) {
                snprintf(msg, cap, "prefix: could not be tokenized");
                goto out;
            }
            ptoks = pt->toks;
        }
        llama_token *gt = NULL;
        int ng = 0;
        stem_tokens stt;
        if (splice_stem(e, gp, stem->str, stem->len, &gt, &ng, &stt) != 0) {
            snprintf(msg, cap, "groups[%zu].stem: could not be tokenized", g);
            goto out;
        }
        for (size_t o = 0; o < os->n; o++) {
            const spj_value *ov = &os->items[o];
            option_tokens *ot = &job->opts[job->n_opts++];
            ot->group = (int)g;
            ot->index = (int)o;
            ot->anchor = job->n_hidden > 0 && o == 0;
            ot->based = gp != pt;
            if (splice_option(e, gp, &stt, stem->str, stem->len, ov->str, ov->len, &ot->toks, &ot->n) != 0) {
                free(gt);
                stem_tokens_free(&stt);
                snprintf(msg, cap, "%s: could not be tokenized", sp_score_field(&rules, g, o, f, sizeof f));
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
            else if (ot->n > e->n_ctx_max)
                why = "is longer than the context";
            if (why) {
                free(gt);
                stem_tokens_free(&stt);
                snprintf(msg, cap, "%s: the text %s", sp_score_field(&rules, g, o, f, sizeof f), why);
                goto out;
            }
            /* how far it runs along the prefix's tokens, no further than its context */
            int lead = lcp(ptoks, np, ot->toks, ot->n);
            ot->from = lead < ot->ctx ? lead : ot->ctx;
            if (!ot->based) {
                n_plain++;
                if (ot->from < job->trunk)
                    job->trunk = ot->from;
            }
            if (ot->n > job->longest)
                job->longest = ot->n;
        }
        free(gt);
        stem_tokens_free(&stt);
    }
    if (n_plain == 0) /* every group on a shorter base: the trunk is what they all share */
        for (int j = 0; j < job->n_opts; j++)
            if (job->opts[j].from < job->trunk)
                job->trunk = job->opts[j].from;
    job->src = -1;
    for (int j = 0; j < job->n_opts; j++) {
        option_tokens *ot = &job->opts[j];
        if (!ot->based || ot->from >= job->trunk) {
            ot->from = job->trunk; /* its tokens start with the trunk's */
            if (job->src < 0)
                job->src = j;
        } else if (ot->from == ot->ctx) {
            ot->from = ot->ctx - 1; /* only the trunk's last logits are kept: recompute the one it needs */
        }
        /* an anchor's context end is read in the trie: a trunk's last row may come from a snapshot */
        if (ot->anchor && ot->from > ot->ctx - 1)
            ot->from = ot->ctx - 1;
        ot->from0 = ot->from;
    }
    if (pics && shift_for_pictures(e, job, pp->n_pos, msg, cap) != 0)
        goto out;
    rc = 0;
out:
    sp_score_free(&sr);
    if (rc)
        job_free(job);
    return rc;
}

/* Nodes option idx[j] would add to a trie already holding options
 * idx[first .. j): its positions up to its last but one (the last is never
 * computed) after the longest prefix it shares with the nodes already there. */
static int new_nodes(const score_job *job, const int *idx, int first, int j)
{
    const option_tokens *ot = &job->opts[idx[j]];
    int shared = ot->from;
    for (int i = first; i < j; i++) {
        const option_tokens *oi = &job->opts[idx[i]];
        if (oi->from != ot->from || oi->carried != ot->carried)
            continue; /* paths leaving the trunk (or the carry) at different places share no node */
        int l = lcp(oi->toks, oi->n, ot->toks, ot->n);
        if (l > oi->n - 1)
            l = oi->n - 1;
        if (l > shared)
            shared = l;
    }
    return ot->n - 1 > shared ? ot->n - 1 - shared : 0;
}

typedef struct score_state {
    score_job job;
    int pin;
    int *todo, *cached;  /* options to compute, options answered from the score cache */
    int n_todo, n_cached;
    trie_node *trie;     /* n_batch entries: the trie of the chunk in the running decode */
    float *pred;         /* n_vocab: the logits of the trunk's last position */
    double pred_lse;
    int trunk_a;         /* the next trunk position to compute; job.trunk: loaded */
    int trunk_b;         /* the end of the trunk chunk in the running decode */
    int first, last;     /* todo[first .. last): the trie chunk in the running decode */
    int seq0;            /* its options' scratch sequences: seq0 + q */
    reuse_info ri;
    int stale;
    int computed, reused_nodes;
    int disk_nodes, n_disk; /* of reused_nodes and cached: the ones read from disk (DONE disk=) */
    int disk_trunk;         /* the trunk's positions restored from a snapshot file */
    int carry_group;     /* the group whose stem the carry holds (positions [0, carry_end)), -1 none */
    int carry_end;
    int carry_next;      /* the group whose stem the decode being run tags with the carry, -1 none */
    int carry_next_end;
    int carry_used;      /* the carry sequence holds cells: drop them at the end */
    picture_prelude pp;  /* with pictures: the prefix's prelude (picture.h), evaluated at the start */
} score_state;

/* The slot's carry sequence: above the slots and the scratch ones (main.c). */
static int carry_seq(const engine *e, const task *t)
{
    return e->n_slots + e->n_score_seqs + (int)t->rq.slot;
}

static void drop_carry(engine *e, task *t)
{
    score_state *st = t->st;
    if (st->carry_used)
        llama_memory_seq_rm(llama_get_memory(e->ctx), carry_seq(e, t), -1, -1);
    st->carry_used = 0;
    st->carry_group = st->carry_next = -1;
}

static void score_free(engine *e, task *t)
{
    score_state *st = t->st;
    if (!st)
        return;
    drop_carry(e, t);
    free(st->trie);
    free(st->todo);
    free(st->cached);
    free(st->pred);
    job_free(&st->job);
    picture_prelude_free(&st->pp);
    free(st);
    t->st = NULL;
}

/* One SCORED per option in request order (spec 9.1), DONE; ends the task. */
static void finish(engine *e, task *t)
{
    score_state *st = t->st;
    const int dim = hidden_dim(e);
    for (int g = 0; g < st->job.n_groups * st->job.n_hidden; g++)
        for (int i = 0; i < dim; i++)
            if (isnan(st->job.hid[(size_t)g * dim + i])) {
                sp_write_error(&e->w, t->rq.id, "BAD_REQUEST", "hidden[%d]: the layer's output was not read",
                               g % st->job.n_hidden);
                task_end(e, t);
                return;
            }
    for (int g = 0; g < st->job.n_groups; g++)
        for (int k = 0; k < st->job.n_hidden; k++)
            sp_write_hidden(&e->w, t->rq.id, (uint64_t)g, (uint64_t)st->job.hidden[k], dim,
                            st->job.hid + ((size_t)g * st->job.n_hidden + k) * dim);
    for (int j = 0; j < st->job.n_opts; j++) {
        const option_tokens *ot = &st->job.opts[j];
        sp_write_scored(&e->w, t->rq.id, (uint64_t)ot->group, (uint64_t)ot->index, (uint64_t)ot->ctx, ot->n_lps, ot->lps);
    }
    sp_done d = { 0 };
    d.prompt_tokens = (uint64_t)st->job.longest;
    d.rss_gb = rss_gb();
    d.has_counters = 1;
    d.computed = (uint64_t)st->computed;
    d.reused = (uint64_t)(st->ri.reused + st->reused_nodes);
    d.snapshot = st->ri.snapshot;
    d.has_disk = e->disk != NULL;
    d.disk = (uint64_t)(st->disk_nodes + st->disk_trunk);
    sp_write_done(&e->w, t->rq.id, &d);
    task_end(e, t);
}

/* The trunk is in the slot and its last logits in st->pred (pred_lse: their
 * logsumexp when known, else NAN), restored from snapshot `from` (NULL:
 * computed): the pin's snapshot, the trie's turn (or the end when every
 * option was cached). A trunk restored whole from a snapshot is that
 * snapshot's tokens and logits: its pin only moves the snapshot to this slot,
 * whose rows now hold them (as taking it again would, without copying
 * n_vocab logits), and the logsumexp is the one the snapshot keeps. */
static void trunk_loaded(engine *e, task *t, double pred_lse, snapshot *from)
{
    score_state *st = t->st;
    const int trunk = st->job.trunk;
    st->trunk_a = trunk;
    if (from) {
        if (st->pin)
            from->slot = (int)t->rq.slot;
        if (st->n_todo > 0)
            pred_lse = snapshot_lse(e, from);
    } else {
        if (isnan(pred_lse) && trunk > 0 && st->n_todo > 0)
            pred_lse = model_logsumexp(st->pred, e->n_vocab);
        snapshot *taken = st->pin && trunk > 0
            ? snapshot_take(e, (int)t->rq.slot, st->job.opts[st->job.src].toks, trunk, st->pred)
            : NULL;
        if (taken)
            taken->lse = pred_lse; /* NAN when not computed: snapshot_lse does it at its first use */
    }
    st->pred_lse = pred_lse;
}

static int score_start(engine *e, task *t)
{
    sp_request *rq = &t->rq;
    const int slot = (int)rq->slot;
    char msg[SP_REASON_MAX];
    score_state *st = calloc(1, sizeof *st);
    if (!st) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory");
        return -1;
    }
    t->st = st;
    st->carry_group = st->carry_next = -1;
    score_job *job = &st->job;
    if (job_parse(e, rq, job, &st->pin, msg, sizeof msg, t->pics, &st->pp) != 0) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "%s", msg);
        return -1;
    }
    const int cap_nodes = e->n_batch < e->n_ctx ? e->n_batch : e->n_ctx;
    st->todo = malloc((size_t)job->n_opts * sizeof *st->todo);
    st->cached = malloc((size_t)job->n_opts * sizeof *st->cached);
    st->trie = malloc((size_t)e->n_batch * sizeof *st->trie);
    st->pred = malloc((size_t)e->n_vocab * sizeof *st->pred);
    if (!st->todo || !st->cached || !st->trie || !st->pred) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory");
        return -1;
    }
    /* every option's key continues the trunk's hash: the trunk is hashed once */
    score_key trunk_key;
    score_key_init(&trunk_key);
    score_key_add(&trunk_key, job->opts[job->src].toks, job->trunk);
    for (int j = 0; j < job->n_opts; j++) {
        option_tokens *ot = &job->opts[j];
        if (ot->n - ot->from > cap_nodes) {
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "groups[%d].options[%d]: the text does not fit one batch of %d",
                           ot->group, ot->index, cap_nodes);
            return -1;
        }
        ot->path = malloc((size_t)(ot->n - ot->from + 1) * sizeof(int));
        ot->lps = malloc(ENGINE_MAX_SCORED * sizeof(double));
        if (!ot->path || !ot->lps) {
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory");
            return -1;
        }
        /* the key hashes all of an option's tokens (score_key_add streams) */
        if (ot->from == job->trunk) {
            ot->key = trunk_key;
            score_key_add(&ot->key, ot->toks + job->trunk, ot->n - job->trunk);
        } else {
            score_key_init(&ot->key);
            score_key_add(&ot->key, ot->toks, ot->n);
        }
        /* an anchor is computed: its context end's hidden states are not kept; a picture's options are
         * never looked up (their tokens do not say what the picture shows) */
        ot->n_lps = ot->anchor || t->pics ? -1
                               : persist_scores_get(e->disk, &e->scores, &ot->key, ot->ctx, ot->lps,
                                                    ENGINE_MAX_SCORED, &ot->disk);
        if (ot->n_lps >= 0) {
            st->cached[st->n_cached++] = j;
            st->n_disk += ot->disk;
        } else
            st->todo[st->n_todo++] = j;
    }
    sp_write_accept(&e->w, rq->id, (uint64_t)job->longest);

    /* the positions the cached options would have needed count as reused */
    for (int j = 0; j < st->n_cached; j++) {
        int nodes = new_nodes(job, st->cached, 0, j);
        st->reused_nodes += nodes;
        st->disk_nodes += job->opts[st->cached[j]].disk ? nodes : 0;
    }

    const int trunk = job->trunk;
    const snapshot *pinned = NULL;
    st->ri.snapshot = "none";
    if (st->n_todo == 0 && trunk > 0)
        pinned = snapshot_find(e, job->opts[job->src].toks, trunk, trunk, &st->stale);
    if (!(st->n_todo > 0 || (st->pin && trunk > 0 && !(pinned && pinned->n == trunk)))) {
        /* every option answered from the cache: the trunk is not touched */
        st->ri.reused = trunk;
        st->ri.snapshot = pinned ? "hit" : st->stale ? "stale" : "none";
        if (st->n_disk == st->n_cached) /* nothing but numbers from disk: the state's positions too */
            st->disk_trunk = trunk;
        finish(e, t);
        return 0;
    }
    /* the trunk: from a snapshot of exactly it, else the slot's live prefix
     * or a shallower snapshot and the rest computed (the live rows have no
     * logits: the trunk's last position is always recomputed) */
    int stale = 0;
    if (t->pics) {
        /* the prelude into the slot from position 0, the rest of the trunk (at least its last position,
         * shift_for_pictures) computed on it; no snapshot restored, none taken */
        if (picture_eval(e, &st->pp, slot, msg, sizeof msg) != 0) {
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "%s", msg);
            return -1;
        }
        st->computed += st->pp.n_pos;
        picture_prelude_free(&st->pp);
        st->trunk_a = slot_resume(e, slot, job->opts[job->src].toks, trunk, NULL);
        st->ri.reused = 0;
    } else if (trunk == 0) {
        slot_truncate(e, slot, 0);
        trunk_loaded(e, t, NAN, NULL);
    } else {
        snapshot *snap = snapshot_find(e, job->opts[job->src].toks, trunk, trunk, &stale);
        if (e->disk && !(snap && snap->n == trunk)) {
            /* a state an earlier process kept on disk, deeper than what is here (persist.c) */
            snapshot *kept = persist_state_restore(e->disk, e, slot, job->opts[job->src].toks, trunk,
                                                   snap ? snap->n : 0);
            if (kept) {
                snap = kept;
                st->disk_trunk = kept->n;
            }
        }
        st->ri.snapshot = snap ? "hit" : stale ? "stale" : "none";
        if (snap && snap->n == trunk) {
            slot_restore(e, slot, snap);
            memcpy(st->pred, snap->logits, (size_t)e->n_vocab * sizeof(float));
            st->ri.reused = trunk;
            trunk_loaded(e, t, NAN, snap);
        } else {
            st->trunk_a = slot_resume(e, slot, job->opts[job->src].toks, trunk, snap);
            st->ri.reused = st->trunk_a;
        }
    }
    if (st->stale && !strcmp(st->ri.snapshot, "none"))
        st->ri.snapshot = "stale"; /* released by the lookup above */
    if (st->trunk_a == trunk && st->n_todo == 0)
        finish(e, t);
    return 0;
}

/* Options todo[first .. last) that fit `budget` nodes and `seqs` scratch
 * sequences; *nodes: their nodes. A chunk cut by the budget ends at a
 * question's end when it holds a whole question: the next chunk would
 * compute the cut question's stem again. */
static int pack(const score_state *st, int budget, int seqs, int *nodes)
{
    const score_job *job = &st->job;
    int last = st->first, sum = 0, cut = -1, sum_cut = 0;
    while (last < st->n_todo && last - st->first < seqs) {
        int add = new_nodes(job, st->todo, st->first, last);
        if (sum + add > budget)
            break;
        if (last > st->first && job->opts[st->todo[last]].group != job->opts[st->todo[last - 1]].group) {
            cut = last;
            sum_cut = sum;
        }
        sum += add;
        last++;
    }
    if (last < st->n_todo && cut > st->first &&
        job->opts[st->todo[last]].group == job->opts[st->todo[last - 1]].group) {
        last = cut;
        sum = sum_cut;
    }
    *nodes = sum;
    return last;
}

/* The fewest rows worth a decode: the trie of the next whole question (its
 * stem and every option), so a decode shared by many SCOREs, each with a small
 * share of the ubatch, does not cut a question and compute its stem twice.
 * A question larger than a ubatch is cut between decodes instead (its stem
 * kept in the carry, keep_stem), so that no decode holds more than one
 * ubatch of rows: the bound on how long a CANCEL waits where llama.cpp does
 * not call the abort callback (a GPU build reads stdin between decodes
 * only). Only one option longer than a ubatch by itself runs past it. */
static int score_unit(engine *e, task *t)
{
    score_state *st = t->st;
    const score_job *job = &st->job;
    if (st->trunk_a < job->trunk)
        return 1;
    int last = st->first, nodes;
    while (last < st->n_todo && job->opts[st->todo[last]].group == job->opts[st->todo[st->first]].group)
        last++;
    pack(st, 1 << 30, last > st->first ? last - st->first : 1, &nodes);
    if (nodes > e->n_ubatch) {
        int one = new_nodes(job, st->todo, st->first, st->first);
        nodes = one > e->n_ubatch ? one : e->n_ubatch;
    }
    return nodes > 0 ? nodes : 1;
}

static int score_want(engine *e, task *t)
{
    score_state *st = t->st;
    if (st->trunk_a < st->job.trunk)
        return st->job.trunk - st->trunk_a;
    int nodes;
    pack(st, e->n_ubatch, e->n_score_seqs, &nodes);
    return nodes > 0 ? nodes : 1;
}

/* When the chunk in the batch ends inside a question (its next option is
 * the same question's), tags that question's stem nodes with the carry
 * sequence too, so the next chunk's options of it read the stem from there.
 * A question already carried keeps its carry; one whose options leave the
 * trunk in different places, or whose stem adds fewer than two positions,
 * is not carried (its stem is computed again, as before the carry). */
static void keep_stem(engine *e, task *t, int row0)
{
    score_state *st = t->st;
    const score_job *job = &st->job;
    struct llama_batch *b = &e->batch;
    st->carry_next = -1;
    if (st->last >= st->n_todo || st->last == st->first)
        return;
    const option_tokens *lo = &job->opts[st->todo[st->last - 1]];
    const int g = lo->group;
    if (job->opts[st->todo[st->last]].group != g || g == st->carry_group)
        return;
    int first = st->last - 1, end = lo->ctx;
    while (first > st->first && job->opts[st->todo[first - 1]].group == g)
        first--;
    for (int j = first; j < st->n_todo && job->opts[st->todo[j]].group == g; j++) {
        const option_tokens *o = &job->opts[st->todo[j]];
        if (o->from != lo->from || o->carried != lo->carried)
            return;
        if (o->ctx < end)
            end = o->ctx;
    }
    if (end - lo->from < 2 || end - 1 > lo->n - 2)
        return;
    llama_memory_t mem = llama_get_memory(e->ctx);
    const int carry = carry_seq(e, t);
    llama_memory_seq_rm(mem, carry, -1, -1);
    if (lo->from > 0)
        llama_memory_seq_cp(mem, (int)t->rq.slot, carry, 0, lo->from);
    for (int p = lo->from; p < end; p++) {
        int row = row0 + lo->path[p - lo->from];
        b->seq_id[row][b->n_seq_id[row]++] = carry;
    }
    st->carry_used = 1;
    st->carry_group = -1; /* its old content is gone: nothing may copy from it until this decode ends */
    st->carry_next = g;
    st->carry_next_end = end;
}

static void score_decoded(engine *e, task *t);

/* Adds a trunk chunk, or the trie of the next options that fit. */
static int score_fill(engine *e, task *t, int budget, int seqs)
{
    score_state *st = t->st;
    score_job *job = &st->job;
    int slot = (int)t->rq.slot;
    struct llama_batch *b = &e->batch;
    const int trunk = job->trunk;
    if (st->trunk_a < trunk) {
        st->trunk_b = st->trunk_a + budget < trunk ? st->trunk_a + budget : trunk;
        for (int i = st->trunk_a; i < st->trunk_b; i++)
            batch_add(b, job->opts[job->src].toks[i], i, &slot, 1, i == trunk - 1);
        return st->trunk_b - st->trunk_a;
    }
    if (seqs < 1)
        return 0;
    int nodes;
    st->last = pack(st, budget, seqs, &nodes);
    if (st->last == st->first)
        return 0;
    st->seq0 = e->n_slots + e->scratch_used;
    e->scratch_used += st->last - st->first;
    const int row0 = b->n_tokens;
    trie_node *trie = st->trie;
    for (int q = 0; q < st->last - st->first; q++) {
        option_tokens *ot = &job->opts[st->todo[st->first + q]];
        int seq = st->seq0 + q, cur = -1;
        /* the option's last token predicts nothing: it is never computed, so a
         * one-token option costs no position at all */
        for (int p = ot->from; p < ot->n - 1; p++) {
            int node = cur < 0 ? -1 : trie[cur].first_child;
            if (cur < 0) {
                /* roots: this chunk's nodes that leave the trunk where this option does */
                for (int i = 0; i < b->n_tokens - row0 && node < 0; i++)
                    if (trie[i].root == p && trie[i].carried == ot->carried && b->token[row0 + i] == ot->toks[p])
                        node = i;
            } else {
                while (node >= 0 && b->token[row0 + node] != ot->toks[p])
                    node = trie[node].next_sibling;
            }
            if (node < 0) {
                node = b->n_tokens - row0;
                batch_add(b, ot->toks[p], p, &seq, 1, 0);
                trie[node].first_child = -1;
                trie[node].next_sibling = cur < 0 ? -1 : trie[cur].first_child;
                trie[node].root = cur < 0 ? p : -1;
                trie[node].carried = ot->carried;
                trie[node].lse = NAN;
                if (cur >= 0)
                    trie[cur].first_child = node;
            } else {
                b->seq_id[row0 + node][b->n_seq_id[row0 + node]++] = seq;
            }
            if (p >= ot->ctx - 1 && p <= ot->n - 2)
                b->logits[row0 + node] = 1;
            ot->path[p - ot->from] = node;
            cur = node;
        }
    }
    llama_memory_t mem = llama_get_memory(e->ctx);
    const int carry = carry_seq(e, t);
    for (int q = 0; q < st->last - st->first; q++) {
        const option_tokens *ot = &job->opts[st->todo[st->first + q]];
        llama_memory_seq_rm(mem, st->seq0 + q, -1, -1);
        if (ot->from > 0)
            llama_memory_seq_cp(mem, ot->carried ? carry : slot, st->seq0 + q, 0, ot->from);
    }
    /* the anchors' context ends: their rows' layer outputs, copied during the decode (hidden.c) */
    for (int q = 0; q < st->last - st->first; q++) {
        const option_tokens *ot = &job->opts[st->todo[st->first + q]];
        if (!ot->anchor)
            continue;
        const int row = row0 + ot->path[ot->ctx - 1 - ot->from];
        for (int k = 0; k < job->n_hidden; k++)
            hidden_want(e, row, job->hidden[k],
                        job->hid + ((size_t)ot->group * job->n_hidden + k) * (size_t)hidden_dim(e));
    }
    /* after those copies: the carry may now take the stem of the question this chunk cuts */
    keep_stem(e, t, row0);
    int rows = b->n_tokens - row0;
    if (rows == 0) {
        /* every option of the chunk is one token after the trunk: nothing to
         * compute, their logprobs come from the trunk's logits */
        score_decoded(e, t);
        return 0;
    }
    return rows;
}

/* Drops the chunk's scratch sequences whole: the trie's rows live there only. */
static void drop_scratch(engine *e, score_state *st)
{
    llama_memory_t mem = llama_get_memory(e->ctx);
    for (int q = 0; q < st->last - st->first; q++)
        llama_memory_seq_rm(mem, st->seq0 + q, -1, -1);
}

static void score_decoded(engine *e, task *t)
{
    score_state *st = t->st;
    score_job *job = &st->job;
    const int trunk = job->trunk;
    if (st->trunk_a < trunk) {
        int slot = (int)t->rq.slot;
        slot_append(e, slot, job->opts[job->src].toks + st->trunk_a, st->trunk_b - st->trunk_a);
        st->computed += st->trunk_b - st->trunk_a;
        if (st->trunk_b == trunk) {
            const int row = t->row0 + trunk - 1 - st->trunk_a;
            const float *pred = engine_logits(e, row);
            memcpy(st->pred, pred, (size_t)e->n_vocab * sizeof(float));
            trunk_loaded(e, t, readout_row_lse(e, row, pred), NULL);
            if (st->n_todo == 0)
                finish(e, t);
        } else {
            st->trunk_a = st->trunk_b;
        }
        return;
    }
    trie_node *trie = st->trie;
    for (int j = st->first; j < st->last; j++) {
        option_tokens *ot = &job->opts[st->todo[j]];
        double *lps = ot->lps;
        int n = 0;
        for (int p = ot->ctx; p < ot->n; p++) {
            int prev = p - 1;
            const float *logits;
            double lse;
            if (prev < ot->from) { /* only when from is the trunk: its last position */
                logits = st->pred;
                lse = st->pred_lse;
            } else {
                int node = ot->path[prev - ot->from];
                logits = engine_logits(e, t->row0 + node);
                if (isnan(trie[node].lse))
                    trie[node].lse = readout_row_lse(e, t->row0 + node, logits);
                lse = trie[node].lse;
            }
            lps[n++] = (double)logits[ot->toks[p]] - lse;
        }
        ot->n_lps = n;
        if (!t->pics) /* a picture's options are not kept: their tokens do not say what it shows */
            persist_scores_put(e->disk, &e->scores, &ot->key, ot->ctx, lps, n);
    }
    drop_scratch(e, st);
    if (st->carry_next >= 0) {
        /* the cut question's later options read its stem from the carry and compute its last position */
        st->carry_group = st->carry_next;
        st->carry_end = st->carry_next_end;
        st->carry_next = -1;
        for (int j = st->last; j < st->n_todo && job->opts[st->todo[j]].group == st->carry_group; j++) {
            option_tokens *ot = &job->opts[st->todo[j]];
            ot->from = (ot->ctx < st->carry_end ? ot->ctx : st->carry_end) - 1;
            ot->carried = 1;
        }
    }
    /* rows of this chunk: the nodes the fill added (trie indices 0 .. rows-1) */
    st->computed += t->rows;
    st->first = st->last;
    if (st->first == st->n_todo)
        finish(e, t);
}

/* The trunk's rows: as a SUBMIT's prefill (submit.c, submit_undo); the
 * trie's: dropped with their scratch sequences, the finished ubatches of the
 * decode included, so the chunk is computed again whole. */
static void score_undo(engine *e, task *t)
{
    score_state *st = t->st;
    if (st->trunk_a < st->job.trunk) {
        int slot = (int)t->rq.slot;
        llama_memory_seq_rm(llama_get_memory(e->ctx), slot, e->slots[slot].n, -1);
        return;
    }
    drop_scratch(e, st);
    if (st->carry_next >= 0) {
        /* the fill emptied the carry for a stem this decode did not keep: options that were to
         * read the old one read their context from the slot again, as parsed */
        for (int j = st->first; j < st->n_todo; j++) {
            option_tokens *ot = &st->job.opts[st->todo[j]];
            if (ot->carried) {
                ot->from = ot->from0;
                ot->carried = 0;
            }
        }
        drop_carry(e, t);
    }
}

static void score_fail(engine *e, task *t, int rc)
{
    score_state *st = t->st;
    if (st->trunk_a < st->job.trunk) {
        slot_truncate(e, (int)t->rq.slot, 0);
        sp_write_error(&e->w, t->rq.id, "BAD_REQUEST", "llama_decode of the prefix failed (%d)", rc);
        return;
    }
    sp_write_error(&e->w, t->rq.id, "BAD_REQUEST", rc == 1 ? "the KV cache has no room for the options"
                                                           : "llama_decode of the options failed");
}

const task_ops score_ops = TASK_OPS(score, 1, 1);
