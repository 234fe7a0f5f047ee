/* splice.c: SCORE's continuations tokenized from near the prefix's end.
 *
 * Spec 9.1 defines an option's tokens as the whole-text tokenization of
 * prefix + stem + option. llama.cpp's tokenizer runs at about 1.4 MB/s, so
 * tokenizing a 13.5K-token prefix again for every stem and option cost
 * 17-35 ms each (bench/results/NOTEBOOK.md). Here the prefix is tokenized once (and
 * kept, keyed by its bytes, for the SCOREs that repeat it); a continuation
 * is the prefix's tokens before a cut plus the tokenization of the text from
 * the cut's byte offset on.
 *
 * Why that equals the whole-text tokenization: a byte-level BPE tokenizer
 * (LLAMA_VOCAB_TYPE_BPE) first splits the text around special tokens, then
 * splits each fragment with its pre-tokenizer regex, then runs BPE inside
 * each piece on its own. The cut is taken only where every regex llama.cpp
 * ships splits whatever follows: before a token starting with a space that
 * follows a printable ASCII character other than a space (no pattern joins
 * "x" to " y": the space opens the next piece), or right after a control
 * token without lstrip/rstrip (a special-token boundary). The pieces before
 * the cut end inside the prefix's bytes, so they and their BPE tokens are the
 * same in the prefix and in the whole text; the tail's pieces start at the
 * cut in both. The cut is backed up SPLICE_BACK tokens or more from the
 * prefix's end, and as a check the tail must reproduce the prefix's tokens
 * from the cut up to its last SPLICE_FREE tokens (those may merge with the
 * continuation); when the check fails, or no cut qualifies, or the tokenizer
 * is not byte-level BPE, the continuation is tokenized whole.
 * A group's options share its stem: splice_stem tokenizes prefix + stem
 * once as above and keeps that tail (the prefix's bytes from its cut, the
 * stem) as a prefix of its own with a cut of its own near the stem's end, so
 * splice_option tokenizes each option from there, with the same check, and
 * a question's stem is not tokenized again for every option.
 * --splice-check tokenizes every continuation whole as well and counts
 * (and logs) any difference; tests/engines/test_llama_engine_splice.py runs it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define SPLICE_BACK   6   /* the cut sits at least this many tokens before the prefix's end */
#define SPLICE_SEARCH 96  /* and at most this many */
#define SPLICE_FREE   2   /* prefix tokens at the end the tail may tokenize otherwise */

static void entry_free(prefix_tokens *p)
{
    free(p->text);
    free(p->toks);
    memset(p, 0, sizeof *p);
}

void prefix_tokens_free(engine *e)
{
    for (int i = 0; i < ENGINE_PREFIXES; i++)
        entry_free(&e->prefixes[i]);
}

/* Finds p->cut / p->cut_off (-1 when none qualifies): the token byte
 * offsets come from each token's piece, which must spell the text exactly.
 * `whole`: p's tokens are a whole text's, so a first BOS was added by the
 * tokenizer (0: a tail's, every token spelled). */
static void find_cut(engine *e, prefix_tokens *p, int whole)
{
    p->cut = -1;
    p->cut_off = 0;
    if (llama_vocab_type(e->vocab) != LLAMA_VOCAB_TYPE_BPE || llama_vocab_get_add_eos(e->vocab))
        return;
    int first = 0;
    if (whole && p->n > 0 && llama_vocab_get_add_bos(e->vocab) && p->toks[0] == llama_vocab_bos(e->vocab))
        first = 1; /* added by the tokenizer, not spelled in the text */
    size_t *off = malloc((size_t)(p->n + 1) * sizeof *off);
    if (!off)
        return;
    size_t pos = 0;
    char piece[256];
    for (int i = 0; i < p->n; i++) {
        off[i] = pos;
        if (i < first)
            continue;
        int k = model_piece(e, p->toks[i], piece, sizeof piece);
        if (k <= 0 || pos + (size_t)k > p->len || memcmp(p->text + pos, piece, (size_t)k) != 0) {
            free(off);
            return;
        }
        pos += (size_t)k;
    }
    if (pos != p->len) {
        free(off);
        return;
    }
    int lo = p->n - SPLICE_SEARCH > first + 1 ? p->n - SPLICE_SEARCH : first + 1;
    for (int i = p->n - SPLICE_BACK; i >= lo; i--) {
        size_t o = off[i];
        unsigned char prev = o > 0 ? (unsigned char)p->text[o - 1] : 0;
        int space_cut = p->text[o] == ' ' && prev > 0x20 && prev < 0x7f;
        enum llama_token_attr a = llama_vocab_get_attr(e->vocab, p->toks[i - 1]);
        int control_cut = llama_vocab_is_control(e->vocab, p->toks[i - 1]) &&
                          !(a & (LLAMA_TOKEN_ATTR_LSTRIP | LLAMA_TOKEN_ATTR_RSTRIP)) &&
                          !(llama_vocab_get_attr(e->vocab, p->toks[i]) & LLAMA_TOKEN_ATTR_LSTRIP);
        if (space_cut || control_cut) {
            p->cut = i;
            p->cut_off = o;
            break;
        }
    }
    free(off);
}

/* The prefix's tokens, from the kept entries or tokenized now (evicting the
 * least recently used entry). The pointer stays valid until the next call.
 * Returns NULL when out of memory or when the tokenizer fails. */
const prefix_tokens *prefix_tokens_get(engine *e, const char *text, size_t len)
{
    prefix_tokens *lru = &e->prefixes[0];
    for (int i = 0; i < ENGINE_PREFIXES; i++) {
        prefix_tokens *p = &e->prefixes[i];
        if (p->text && p->len == len && memcmp(p->text, text, len) == 0) {
            p->last_use = ++e->clock;
            return p;
        }
        if (!p->text || (lru->text && p->last_use < lru->last_use))
            lru = p;
    }
    entry_free(lru);
    lru->text = malloc(len + 1);
    if (!lru->text || model_tokenize(e, text, len, &lru->toks, &lru->n) != 0) {
        entry_free(lru);
        return NULL;
    }
    memcpy(lru->text, text, len);
    lru->text[len] = '\0';
    lru->len = len;
    lru->last_use = ++e->clock;
    find_cut(e, lru, 1);
    return lru;
}

static int tokenize_whole(engine *e, const prefix_tokens *p, const char *a, size_t na, const char *b, size_t nb,
                          llama_token **out, int *n_out)
{
    char *s = malloc(p->len + na + nb + 1);
    if (!s)
        return -1;
    memcpy(s, p->text, p->len);
    memcpy(s + p->len, a, na);
    memcpy(s + p->len + na, b, nb);
    s[p->len + na + nb] = '\0';
    int rc = model_tokenize(e, s, p->len + na + nb, out, n_out);
    free(s);
    return rc;
}

/* *out = head[0 .. n_head) + tail (malloc'ed; tail, malloc'ed, is freed).
 * Returns 0, or -1 (out of memory). */
static int join_tokens(const llama_token *head, int n_head, llama_token *tail, int n_tail, llama_token **out,
                       int *n_out)
{
    llama_token *t = malloc((size_t)(n_head + n_tail) * sizeof *t);
    if (!t) {
        free(tail);
        return -1;
    }
    memcpy(t, head, (size_t)n_head * sizeof *t);
    memcpy(t + n_head, tail, (size_t)n_tail * sizeof *t);
    free(tail);
    *out = t;
    *n_out = n_head + n_tail;
    return 0;
}

/* Splices: the prefix's tokens before the cut, then the tail's. Returns 0,
 * 1 when the tail failed its check (nothing allocated), or -1. */
static int tokenize_spliced(engine *e, const prefix_tokens *p, const char *a, size_t na, const char *b, size_t nb,
                            llama_token **out, int *n_out)
{
    size_t nt = p->len - p->cut_off;
    char *s = malloc(nt + na + nb + 1);
    if (!s)
        return -1;
    memcpy(s, p->text + p->cut_off, nt);
    memcpy(s + nt, a, na);
    memcpy(s + nt + na, b, nb);
    s[nt + na + nb] = '\0';
    llama_token *tail = NULL;
    int n_tail = 0;
    int rc = model_tokenize_ex(e, s, nt + na + nb, 0, &tail, &n_tail);
    free(s);
    if (rc != 0)
        return -1;
    int must = p->n - SPLICE_FREE - p->cut;
    if (n_tail < must || memcmp(tail, p->toks + p->cut, (size_t)must * sizeof *tail) != 0) {
        free(tail);
        return 1;
    }
    return join_tokens(p->toks, p->cut, tail, n_tail, out, n_out);
}

/* --splice-check: tokenizes p's text + a + b whole as well and counts (and
 * logs) a difference from the splice in *out, which then takes the whole
 * text's tokens. Returns 0, or -1 (*out freed). */
static int check_whole(engine *e, const prefix_tokens *p, const char *a, size_t na, const char *b, size_t nb,
                       llama_token **out, int *n_out)
{
    llama_token *w = NULL;
    int nw = 0;
    if (tokenize_whole(e, p, a, na, b, nb, &w, &nw) != 0) {
        free(*out);
        return -1;
    }
    if (nw != *n_out || memcmp(w, *out, (size_t)nw * sizeof *w) != 0) {
        e->splice.mismatched++;
        fprintf(stderr, "serveproto-llama: splice mismatch: prefix %zu bytes cut at token %d, "
                        "continuation '%.*s%.*s': %d tokens spliced, %d whole\n",
                p->len, p->cut, (int)na, a, (int)nb, b, *n_out, nw);
        free(*out);
        *out = w;
        *n_out = nw;
    } else {
        free(w);
    }
    return 0;
}

/* splice_tokenize; *spliced says whether the tokens came from the splice
 * (and, under --splice-check, matched the whole text's). */
static int splice_or_whole(engine *e, const prefix_tokens *p, const char *a, size_t na, const char *b, size_t nb,
                           llama_token **out, int *n_out, int *spliced)
{
    int rc = 1;
    *spliced = 0;
    if (p->cut >= 0) {
        rc = tokenize_spliced(e, p, a, na, b, nb, out, n_out);
        if (rc < 0)
            return -1;
    }
    if (rc == 1) {
        e->splice.whole++;
        return tokenize_whole(e, p, a, na, b, nb, out, n_out);
    }
    e->splice.spliced++;
    uint64_t bad = e->splice.mismatched;
    if (e->splice_check && check_whole(e, p, a, na, b, nb, out, n_out) != 0)
        return -1;
    *spliced = e->splice.mismatched == bad;
    return 0;
}

/* Tokenizes p's text + a + b (a, b: the stem and the option, either may be
 * empty) exactly as model_tokenize would the concatenation, in time that
 * grows with the bytes after the prefix's cut. *out is malloc'ed and owned
 * by the caller. Returns 0, or -1 (out of memory, tokenizer error). */
int splice_tokenize(engine *e, const prefix_tokens *p, const char *a, size_t na, const char *b, size_t nb,
                    llama_token **out, int *n_out)
{
    int spliced;
    return splice_or_whole(e, p, a, na, b, nb, out, n_out, &spliced);
}

void stem_tokens_free(stem_tokens *st)
{
    entry_free(&st->tail);
    st->head = -1;
}

/* The tokens of p's text + stem, as splice_tokenize, into *out; and *st
 * (freed with stem_tokens_free) for splice_option: when those tokens were
 * spliced, their tail (from the prefix's cut: the prefix's last bytes and
 * the stem) becomes a prefix of its own, with a cut near the stem's end, so
 * each option is tokenized from there instead of from the prefix's cut. The
 * same argument as the prefix's cut holds there (the file's head): the tail
 * tokenized alone is the whole text's tokens from the prefix's cut on.
 * Returns 0, or -1 (out of memory, tokenizer error). */
int splice_stem(engine *e, const prefix_tokens *p, const char *stem, size_t ns, llama_token **out, int *n_out,
                stem_tokens *st)
{
    int spliced;
    memset(st, 0, sizeof *st);
    st->head = -1;
    if (splice_or_whole(e, p, stem, ns, "", 0, out, n_out, &spliced) != 0)
        return -1;
    if (!spliced)
        return 0;
    prefix_tokens *t = &st->tail;
    size_t nt = p->len - p->cut_off;
    t->n = *n_out - p->cut;
    t->len = nt + ns;
    t->text = malloc(t->len + 1);
    t->toks = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *t->toks);
    if (!t->text || !t->toks) {
        stem_tokens_free(st);
        return 0; /* the options go the prefix's way */
    }
    memcpy(t->text, p->text + p->cut_off, nt);
    memcpy(t->text + nt, stem, ns);
    t->text[t->len] = '\0';
    memcpy(t->toks, *out + p->cut, (size_t)t->n * sizeof *t->toks);
    find_cut(e, t, 0);
    if (t->cut < 0)
        stem_tokens_free(st);
    else
        st->head = p->cut;
    return 0;
}

/* Tokenizes p's text + stem + opt exactly as model_tokenize would, like
 * splice_tokenize, but from st's cut near the stem's end when splice_stem
 * kept one (and its tail passes the check), in time that grows with the
 * bytes after that cut. Returns 0, or -1 (out of memory, tokenizer error). */
int splice_option(engine *e, const prefix_tokens *p, const stem_tokens *st, const char *stem, size_t ns,
                  const char *opt, size_t no, llama_token **out, int *n_out)
{
    if (st->head < 0)
        return splice_tokenize(e, p, stem, ns, opt, no, out, n_out);
    llama_token *r = NULL;
    int nr = 0;
    int rc = tokenize_spliced(e, &st->tail, "", 0, opt, no, &r, &nr);
    if (rc < 0)
        return -1;
    if (rc == 1)
        return splice_tokenize(e, p, stem, ns, opt, no, out, n_out);
    if (join_tokens(p->toks, st->head, r, nr, out, n_out) != 0)
        return -1;
    e->splice.spliced++;
    e->splice.stem++;
    if (!e->splice_check)
        return 0;
    /* the whole text: p's text + stem + opt (check_whole joins p's text with a and b) */
    return check_whole(e, p, stem, ns, opt, no, out, n_out);
}
