/* model.c: the small numeric and llama.cpp helpers the requests share:
 * tokenization, token text, the full-vocabulary log-softmax, top-k, batches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "lse.h"

/* Tokenizes text (BOS added when the model asks for it, special tokens such
 * as <|im_start|> parsed). *out is malloc'ed and owned by the caller.
 * Returns 0, or -1 on failure (out of memory, tokenizer error). */
int model_tokenize(engine *e, const char *text, size_t len, llama_token **out, int *n_out)
{
    return model_tokenize_ex(e, text, len, 1, out, n_out);
}

/* As model_tokenize; add_special = 0 adds no BOS/EOS (a text's tail). */
int model_tokenize_ex(engine *e, const char *text, size_t len, int add_special, llama_token **out, int *n_out)
{
    if (len > (size_t)INT32_MAX / 2)
        return -1;
    int cap = (int)len + 8;
    llama_token *toks = malloc((size_t)cap * sizeof *toks);
    if (!toks)
        return -1;
    int n = llama_tokenize(e->vocab, text, (int32_t)len, toks, cap, add_special != 0, true);
    if (n < 0 && n != INT32_MIN) {
        cap = -n;
        llama_token *t2 = realloc(toks, (size_t)cap * sizeof *toks);
        if (!t2) {
            free(toks);
            return -1;
        }
        toks = t2;
        n = llama_tokenize(e->vocab, text, (int32_t)len, toks, cap, add_special != 0, true);
    }
    if (n < 0) {
        free(toks);
        return -1;
    }
    *out = toks;
    *n_out = n;
    return 0;
}

/* The token's text (special tokens rendered) into buf; returns its length in
 * bytes (0 when it does not fit in cap, which 256 bytes always avoids). */
int model_piece(engine *e, llama_token tok, char *buf, size_t cap)
{
    int n = llama_token_to_piece(e->vocab, tok, buf, (int32_t)cap, 0, true);
    return n < 0 ? 0 : n;
}

/* log(sum_i exp(logits[i])) over n >= 1 logits: lse.h (shared with llama-mtmd-ref, so a reference's
 * logprobs are the engine's to the bit). */
double model_logsumexp(const float *logits, int n)
{
    return lse_logsumexp(logits, n);
}

/* The k (<= ENGINE_MAX_LOGPROBS) most likely tokens of a logit row, most likely
 * first (ties: lower token id first), with their log-softmax given lse.
 * Returns the number written (min(k, n_vocab)). */
int model_top_k(engine *e, const float *logits, double lse, int k, sp_alt *out)
{
    int ids[ENGINE_MAX_LOGPROBS];
    int m = 0;
    if (k > e->n_vocab)
        k = e->n_vocab;
    for (int t = 0; t < e->n_vocab; t++) {
        float v = logits[t];
        if (m == k && !(v > logits[ids[m - 1]]))
            continue;
        int j = m < k ? m++ : m - 1;
        while (j > 0 && v > logits[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = t;
    }
    for (int i = 0; i < m; i++) {
        out[i].token_id = ids[i];
        out[i].logprob = (double)logits[ids[i]] - lse;
    }
    return m;
}

void batch_clear(struct llama_batch *b)
{
    b->n_tokens = 0;
}

/* Appends one token to the batch; the caller keeps n_tokens below the batch's
 * capacity and n_seqs below its per-token sequence capacity. */
void batch_add(struct llama_batch *b, llama_token tok, int pos, const int *seqs, int n_seqs, int logits)
{
    int i = b->n_tokens++;
    b->token[i] = tok;
    b->pos[i] = pos;
    b->n_seq_id[i] = n_seqs;
    for (int s = 0; s < n_seqs; s++)
        b->seq_id[i][s] = seqs[s];
    b->logits[i] = (int8_t)(logits != 0);
}

/* Runs the engine's batch through llama_decode. Returns 0, or -1 with
 * *err_code set to llama_decode's status (1: no room in the KV cache for the
 * batch, MODEL_DECODE_CANCELLED: a request in the batch was cancelled, < 0: an
 * error), failures logged to stderr. */
int model_decode(engine *e, int *err_code)
{
    int rc = llama_decode(e->ctx, e->batch);
    if (rc == 0)
        return 0;
    *err_code = rc;
    if (rc == MODEL_DECODE_CANCELLED && e->abort_decode)
        return -1;
    fprintf(stderr, "serveproto-llama: llama_decode of %d tokens failed (%d)\n", e->batch.n_tokens, rc);
    return -1;
}

/* Resident memory in GB (10^9 bytes), from /proc/self/statm; 0 when unknown. */
double rss_gb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0.0;
    unsigned long size = 0, res = 0;
    int ok = fscanf(f, "%lu %lu", &size, &res) == 2;
    fclose(f);
    if (!ok)
        return 0.0;
    return (double)res * (double)sysconf(_SC_PAGESIZE) / 1e9;
}

/* Memory available to new allocations in bytes (MemAvailable of
 * /proc/meminfo); 0 when unknown. */
uint64_t model_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024u;
}
