/* llama-prefill-ref: llama.cpp's own batched decode of one prompt, nothing
 * else: the reference that bench/engine.py and the GPU ceiling table
 * (bench/results/NOTEBOOK.md) set our engine's prefill against.
 *
 * usage: llama-prefill-ref --model PATH --prompt-file FILE [--ctx N] [--threads N]
 *                          [--reps N] [--all-logits] [--ubatch N]
 *                          [--tokens N,...] [--modes MODE,...]
 *                          [--seqs S] [--shared P] [--background B]
 * The prompt is tokenized as the engine does (BOS when the model asks,
 * special tokens parsed) and decoded in batches of up to 2048 tokens into a
 * cleared KV cache, logits at the last position only (every position with
 * --all-logits), --reps times. Prints one line per rep on stdout:
 * "tokens=<n> seconds=<s>". Context parameters match serveproto-llama's.
 *
 * --tokens: the prompt's tokens repeated (or cut) to each count in turn,
 * instead of the prompt as it is; --modes: one context per mode, the model
 * loaded once: f32 (the engine's defaults: F32 keys and values, no flash
 * attention), f16 (F16 KV), fa-f32, fa-f16 (flash attention). With either,
 * each line also names the mode and the ubatch and gives tokens/s.
 *
 * A mixed decode, shaped like the engine's under load (--seqs S, --shared P,
 * --background B; any of them): before the timed part, B cells of another
 * sequence and a prefix of P tokens (seq 0) are decoded, untimed. Each rep
 * then copies the prefix to S sequences and times one llama_decode of the
 * --tokens count split into S contiguous groups, one a sequence on top of
 * the prefix, its last row an output (every row with --all-logits), up to
 * llama_synchronize; the groups are removed before the next rep. So the
 * decode attends over B + P + tokens cells as the engine's 16 slots do, and
 * its time against the one-sequence line is what the mixing costs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llama.h"
#include "ref_common.h"

/* Decodes n tokens, src[0..n_src) again and again, into sequence `seq` at positions pos0.., in batches of
 * n_batch, no output. Returns llama_decode's first non-zero code, or 0. */
static int fill_seq(struct llama_context *lctx, struct llama_batch *b, int n_batch, const llama_token *src, int n_src,
                    int n, int seq, int pos0)
{
    for (int a = 0; a < n; a += n_batch) {
        int m = n - a < n_batch ? n - a : n_batch;
        b->n_tokens = m;
        for (int i = 0; i < m; i++) {
            b->token[i] = src[(a + i) % n_src];
            b->pos[i] = pos0 + a + i;
            b->n_seq_id[i] = 1;
            b->seq_id[i][0] = seq;
            b->logits[i] = 0;
        }
        int rc = llama_decode(lctx, *b);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The mixed decodes (the header comment): background on seq 1 and the prefix on seq 0, untimed; then per size
 * and rep one timed decode of S groups on seqs 2..S+1, each a copy of the prefix. One line per rep. */
static int mixed_run(struct llama_context *lctx, struct llama_batch *b, int n_batch, const llama_token *seq,
                     int n_seq, const int *sizes, int n_sizes, int reps, int all, int seqs, int shared,
                     int background, const char *mode, unsigned ubatch)
{
    llama_memory_t mem = llama_get_memory(lctx);
    llama_memory_clear(mem, true);
    if ((background > 0 && fill_seq(lctx, b, n_batch, seq, n_seq, background, 1, 0) != 0) ||
        (shared > 0 && fill_seq(lctx, b, n_batch, seq, n_seq, shared, 0, 0) != 0)) {
        fprintf(stderr, "llama-prefill-ref: the untimed prefill failed\n");
        return 1;
    }
    for (int k = 0; k < n_sizes; k++) {
        int m_all = sizes[k];
        for (int r = 0; r < reps; r++) {
            for (int s = 0; s < seqs; s++) {
                llama_memory_seq_rm(mem, 2 + s, -1, -1);
                if (shared > 0)
                    llama_memory_seq_cp(mem, 0, 2 + s, -1, -1);
            }
            b->n_tokens = m_all;
            for (int i = 0; i < m_all; i++) {
                int g = (int)((long)i * seqs / m_all), g0 = (int)(((long)g * m_all + seqs - 1) / seqs);
                int g1 = (int)(((long)(g + 1) * m_all + seqs - 1) / seqs);
                b->token[i] = seq[(shared + i) % n_seq];
                b->pos[i] = shared + (i - g0);
                b->n_seq_id[i] = 1;
                b->seq_id[i][0] = 2 + g;
                b->logits[i] = (int8_t)(all || i == g1 - 1);
            }
            double t0 = now_s();
            if (llama_decode(lctx, *b) != 0) {
                fprintf(stderr, "llama-prefill-ref: the mixed decode failed\n");
                return 1;
            }
            llama_synchronize(lctx);
            double dt = now_s() - t0;
            printf("tokens=%d seconds=%.6f mode=%s ubatch=%u tokens_per_s=%.0f seqs=%d shared=%d background=%d\n",
                   m_all, dt, mode, ubatch, m_all / dt, seqs, shared, background);
            fflush(stdout);
        }
    }
    for (int s = 0; s < seqs; s++)
        llama_memory_seq_rm(mem, 2 + s, -1, -1);
    return 0;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *prompt_path = NULL;
    int ctx = 4096, reps = 3, all = 0, ubatch = 512, seqs = 0, shared = 0, background = 0;
    const char *tokens_arg = NULL, *modes_arg = NULL;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = ncpu > 0 ? (int)ncpu : 1;
    const ref_opt opts[] = { { "--all-logits", NULL, NULL, &all }, { "--model", &model_path, NULL, NULL },
                             { "--prompt-file", &prompt_path, NULL, NULL }, { "--ctx", NULL, &ctx, NULL },
                             { "--threads", NULL, &threads, NULL }, { "--reps", NULL, &reps, NULL },
                             { "--ubatch", NULL, &ubatch, NULL }, { "--tokens", &tokens_arg, NULL, NULL },
                             { "--modes", &modes_arg, NULL, NULL }, { "--seqs", NULL, &seqs, NULL },
                             { "--shared", NULL, &shared, NULL }, { "--background", NULL, &background, NULL },
                             { NULL, NULL, NULL, NULL } };
    int bad = ref_args(argc, argv, opts);
    if (bad) {
        fprintf(stderr, "llama-prefill-ref: bad argument %s\n", argv[bad]);
        return 2;
    }
    int mixed = seqs > 0 || shared > 0 || background > 0;
    if (seqs < 1)
        seqs = 1;
    if (!model_path || !prompt_path || ctx < 8 || reps < 1 || threads < 1 || ubatch < 1 || seqs > 120 ||
        shared < 0 || background < 0) {
        fprintf(stderr, "usage: llama-prefill-ref --model PATH --prompt-file FILE [--ctx N] [--threads N] [--reps N] "
                        "[--all-logits] [--ubatch N] [--tokens N,...] [--modes f32|f16|fa-f32|fa-f16,...] "
                        "[--seqs 1..120] [--shared N] [--background N]\n");
        return 2;
    }
    int sizes[16], n_sizes = 0;
    for (const char *c = tokens_arg; c && *c && n_sizes < 16;) {
        sizes[n_sizes] = atoi(c);
        if (sizes[n_sizes] < 1 || sizes[n_sizes] > ctx) {
            fprintf(stderr, "llama-prefill-ref: --tokens: each count must be 1..%d (--ctx)\n", ctx);
            return 2;
        }
        n_sizes++;
        c = strchr(c, ',');
        c = c ? c + 1 : NULL;
    }
    char modes[8][16];
    int n_modes = 0;
    for (const char *c = modes_arg ? modes_arg : "f32"; c && *c && n_modes < 8;) {
        size_t m = strcspn(c, ",");
        snprintf(modes[n_modes], sizeof modes[0], "%.*s", (int)m, c);
        if (strcmp(modes[n_modes], "f32") && strcmp(modes[n_modes], "f16") && strcmp(modes[n_modes], "fa-f32") &&
            strcmp(modes[n_modes], "fa-f16")) {
            fprintf(stderr, "llama-prefill-ref: --modes: %s is not f32, f16, fa-f32 or fa-f16\n", modes[n_modes]);
            return 2;
        }
        n_modes++;
        c = c[m] ? c + m + 1 : NULL;
    }
    int sweep = tokens_arg || modes_arg || mixed;
    static char text[1 << 20];
    long got = read_prompt(prompt_path, text, sizeof text);
    if (got < 0)
        return 1;
    size_t len = (size_t)got;

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999;
    struct llama_model *model = ref_load_model("llama-prefill-ref", model_path, mp);
    if (!model)
        return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_batch = ctx < 2048 ? ctx : 2048;
    llama_token *toks = malloc((len + 8) * sizeof *toks);
    int n = llama_tokenize(vocab, text, (int32_t)len, toks, (int32_t)len + 8, true, true);
    if (n <= 0 || n > ctx) {
        fprintf(stderr, "llama-prefill-ref: the prompt has %d tokens (context %d)\n", n, ctx);
        return 1;
    }
    if (n_sizes == 0)
        sizes[n_sizes++] = n;
    int longest = 0;
    for (int k = 0; k < n_sizes; k++)
        longest = sizes[k] > longest ? sizes[k] : longest;
    llama_token *seq = malloc((size_t)longest * sizeof *seq);
    for (int i = 0; i < longest; i++) /* the prompt again and again (BOS included: a benchmark's tokens) */
        seq[i] = toks[i % n];
    struct llama_batch b = llama_batch_init(n_batch, 0, 1);
    if (mixed)
        for (int k = 0; k < n_sizes; k++)
            if (sizes[k] > n_batch || sizes[k] < seqs || shared + background + sizes[k] > 2 * ctx) {
                fprintf(stderr, "llama-prefill-ref: a mixed decode of %d tokens needs %d..%d tokens and "
                                "--shared + --background + tokens <= 2 x --ctx\n", sizes[k], seqs, n_batch);
                return 2;
            }
    for (int mi = 0; mi < n_modes; mi++) {
        const char *mode = modes[mi];
        int fa = !strncmp(mode, "fa-", 3), kv16 = !strcmp(mode + (fa ? 3 : 0), "f16");
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t)ctx * 2; /* one slot + the engine's scratch, as serveproto-llama --slots 1 */
        cp.n_batch = (uint32_t)n_batch;
        cp.n_ubatch = (uint32_t)(n_batch < ubatch ? n_batch : ubatch);
        cp.n_seq_max = 1 + 128;
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        cp.kv_unified = true;
        cp.no_perf = true;
        cp.type_k = kv16 ? GGML_TYPE_F16 : GGML_TYPE_F32; /* f32: as serveproto-llama's defaults */
        cp.type_v = cp.type_k;
        cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        struct llama_context *lctx = llama_init_from_model(model, cp);
        if (!lctx) {
            fprintf(stderr, "llama-prefill-ref: cannot create the context (%s)\n", mode);
            return 1;
        }
        if (mixed) {
            if (mixed_run(lctx, &b, n_batch, seq, longest, sizes, n_sizes, reps, all, seqs, shared, background, mode,
                          cp.n_ubatch) != 0)
                return 1;
            llama_free(lctx);
            continue;
        }
        for (int k = 0; k < n_sizes; k++) {
            int m_all = sizes[k];
            for (int r = 0; r < reps; r++) {
                llama_memory_clear(llama_get_memory(lctx), true);
                double t0 = now_s();
                for (int a = 0; a < m_all; a += n_batch) {
                    int m = m_all - a < n_batch ? m_all - a : n_batch;
                    b.n_tokens = m;
                    for (int i = 0; i < m; i++) {
                        b.token[i] = seq[a + i];
                        b.pos[i] = a + i;
                        b.n_seq_id[i] = 1;
                        b.seq_id[i][0] = 0;
                        b.logits[i] = (int8_t)(all || a + i == m_all - 1);
                    }
                    if (llama_decode(lctx, b) != 0) {
                        fprintf(stderr, "llama-prefill-ref: llama_decode failed\n");
                        return 1;
                    }
                }
                (void)llama_get_logits_ith(lctx, -1);
                double dt = now_s() - t0;
                if (sweep)
                    printf("tokens=%d seconds=%.6f mode=%s ubatch=%u tokens_per_s=%.0f\n", m_all, dt, mode, cp.n_ubatch,
                           m_all / dt);
                else
                    printf("tokens=%d seconds=%.6f\n", m_all, dt);
                fflush(stdout);
            }
        }
        llama_free(lctx);
    }
    llama_batch_free(b);
    free(seq);
    free(toks);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
