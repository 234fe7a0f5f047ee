/* score_cache.c: SCORE results kept between requests (spec/llama-engine.md,
 * "Nothing computed twice").
 *
 * With invariant numerics an option's logprobs are a function of its token
 * ids alone (the model and build fixed), so the numbers of an option scored
 * once are the numbers it would get again: they are kept, keyed by the
 * option's whole token sequence and its context length, and a later SCORE
 * of the same tokens answers from here without a forward pass. The key is a
 * 128-bit hash of the token ids (two independent 64-bit streams): entries
 * are compared by hash, length and context, not by their tokens, which for
 * a long state would cost more memory than the numbers. Least recently used
 * entries go first once the byte budget (--score-cache-mb) is spent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

struct score_entry {
    score_key key;
    int ctx, n_lps;
    int file;                           /* persist.c's file it was read from; -1: computed here */
    struct score_entry *next;           /* bucket chain */
    struct score_entry *lru_prev, *lru_next; /* most recently used at the head */
    double lps[];                       /* n_lps logprobs, nats */
};

/* 64-bit finalizer of splitmix64 (Steele et al. 2014): full avalanche. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void score_key_init(score_key *k)
{
    k->h1 = 0x243f6a8885a308d3ULL; /* digits of pi: any two distinct seeds */
    k->h2 = 0x13198a2e03707344ULL;
    k->n = 0;
}

void score_key_add(score_key *k, const llama_token *toks, int n)
{
    for (int i = 0; i < n; i++) {
        uint64_t t = (uint32_t)toks[i];
        k->h1 = mix64(k->h1 ^ t);
        k->h2 = mix64(k->h2 + (t << 32 | 0x9e3779b9U));
    }
    k->n += n;
}

static size_t entry_bytes(int n_lps)
{
    return sizeof(struct score_entry) + (size_t)n_lps * sizeof(double);
}

static int key_eq(const score_key *a, const score_key *b)
{
    return a->h1 == b->h1 && a->h2 == b->h2 && a->n == b->n;
}

int score_cache_init(score_cache *c, size_t budget)
{
    memset(c, 0, sizeof *c);
    c->budget = budget;
    if (budget == 0)
        return 0;
    /* about one bucket per 256 bytes of budget, a power of two */
    size_t nb = 1024;
    while (nb < budget / 256 && nb < ((size_t)1 << 24))
        nb <<= 1;
    c->buckets = calloc(nb, sizeof *c->buckets);
    if (!c->buckets)
        return -1;
    c->n_buckets = nb;
    return 0;
}

static struct score_entry **bucket_of(score_cache *c, const score_key *k, int ctx)
{
    return &c->buckets[(k->h1 ^ (uint64_t)ctx * 0x9e3779b97f4a7c15ULL) & (c->n_buckets - 1)];
}

static void lru_unlink(score_cache *c, struct score_entry *x)
{
    if (x->lru_prev)
        x->lru_prev->lru_next = x->lru_next;
    else
        c->lru_head = x->lru_next;
    if (x->lru_next)
        x->lru_next->lru_prev = x->lru_prev;
    else
        c->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = NULL;
}

static void lru_push(score_cache *c, struct score_entry *x)
{
    x->lru_prev = NULL;
    x->lru_next = c->lru_head;
    if (c->lru_head)
        c->lru_head->lru_prev = x;
    c->lru_head = x;
    if (!c->lru_tail)
        c->lru_tail = x;
}

static void evict(score_cache *c, struct score_entry *x)
{
    struct score_entry **pp = bucket_of(c, &x->key, x->ctx);
    while (*pp != x)
        pp = &(*pp)->next;
    *pp = x->next;
    lru_unlink(c, x);
    c->bytes -= entry_bytes(x->n_lps);
    c->entries--;
    free(x);
}

/* The logprobs kept for the tokens of key k at context ctx, at most cap of them, into lps: returns how
 * many (-1: none kept, or the cache is off), and in *file the one its entry was read from (persist.c's
 * index; -1: computed in this process). The cache's disk (persist.c) wraps this: persist_scores_get. */
int score_cache_get(score_cache *c, const score_key *k, int ctx, double *lps, int cap, int *file)
{
    if (!c->buckets)
        return -1;
    for (struct score_entry *x = *bucket_of(c, k, ctx); x; x = x->next) {
        if (x->ctx == ctx && key_eq(&x->key, k) && x->n_lps <= cap) {
            memcpy(lps, x->lps, (size_t)x->n_lps * sizeof *lps);
            lru_unlink(c, x);
            lru_push(c, x);
            c->hits++;
            *file = x->file;
            return x->n_lps;
        }
    }
    c->misses++;
    return -1;
}

/* Keeps n_lps logprobs for the tokens of key k at context ctx (the least recently used go past the
 * budget; nothing when the cache is off or already holds them). file >= 0 names the persist.c file they
 * were read from, -1: computed here (persist_scores_put notes those for the disk). */
void score_cache_put(score_cache *c, const score_key *k, int ctx, const double *lps, int n_lps, int file)
{
    size_t need = entry_bytes(n_lps);
    if (!c->buckets || need > c->budget)
        return;
    struct score_entry **b = bucket_of(c, k, ctx);
    for (struct score_entry *x = *b; x; x = x->next)
        if (x->ctx == ctx && key_eq(&x->key, k))
            return; /* the same tokens give the same numbers: nothing to update */
    while (c->bytes + need > c->budget && c->lru_tail)
        evict(c, c->lru_tail);
    struct score_entry *x = malloc(need);
    if (!x)
        return; /* a cache that cannot grow only costs time */
    x->key = *k;
    x->ctx = ctx;
    x->n_lps = n_lps;
    x->file = file;
    memcpy(x->lps, lps, (size_t)n_lps * sizeof *lps);
    b = bucket_of(c, k, ctx);
    x->next = *b;
    *b = x;
    lru_push(c, x);
    c->bytes += need;
    c->entries++;
}

void score_cache_free(score_cache *c)
{
    while (c->lru_tail)
        evict(c, c->lru_tail);
    free(c->buckets);
    memset(c, 0, sizeof *c);
}
