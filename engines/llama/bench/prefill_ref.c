/* llama-prefill-ref: llama.cpp's own batched decode of one prompt, nothing
 * else: the reference that bench/engine.py and the GPU ceiling table
 * (bench/README.md) set our engine's prefill against.
 *
 * usage: llama-prefill-ref --model PATH --prompt-file FILE [--ctx N] [--threads N]
 *                          [--reps N] [--all-logits] [--ubatch N]
 *                          [--tokens N,...] [--modes MODE,...]
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
 * each line also names the mode and the ubatch and gives tokens/s. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llama.h"
#include "ref_common.h"

int main(int argc, char **argv)
{
    const char *model_path = NULL, *prompt_path = NULL;
    int ctx = 4096, reps = 3, all = 0, ubatch = 512;
    const char *tokens_arg = NULL, *modes_arg = NULL;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = ncpu > 0 ? (int)ncpu : 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--all-logits"))
            all = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--model"))
            model_path = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--prompt-file"))
            prompt_path = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--ctx"))
            ctx = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--threads"))
            threads = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--ubatch"))
            ubatch = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--tokens"))
            tokens_arg = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--modes"))
            modes_arg = argv[++i];
        else {
            fprintf(stderr, "llama-prefill-ref: bad argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!model_path || !prompt_path || ctx < 8 || reps < 1 || threads < 1 || ubatch < 1) {
        fprintf(stderr, "usage: llama-prefill-ref --model PATH --prompt-file FILE [--ctx N] [--threads N] [--reps N] "
                        "[--all-logits] [--ubatch N] [--tokens N,...] [--modes f32|f16|fa-f32|fa-f16,...]\n");
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
    int sweep = tokens_arg || modes_arg;
    FILE *f = fopen(prompt_path, "rb");
    if (!f) {
        perror(prompt_path);
        return 1;
    }
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "llama-prefill-ref: cannot load %s\n", model_path);
        return 1;
    }
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
