/* llama-prefill-ref: llama.cpp's own batched decode of one prompt, nothing
 * else: the reference that bench/engine.py sets our engine's prefill against.
 *
 * usage: llama-prefill-ref --model PATH --prompt-file FILE [--ctx N] [--threads N]
 *                          [--reps N] [--all-logits]
 * The prompt is tokenized as the engine does (BOS when the model asks,
 * special tokens parsed) and decoded in batches of up to 2048 tokens into a
 * cleared KV cache, logits at the last position only (every position with
 * --all-logits), --reps times. Prints one line per rep on stdout:
 * "tokens=<n> seconds=<s>". Context parameters match serveproto-llama's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llama.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *prompt_path = NULL;
    int ctx = 4096, reps = 3, all = 0;
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
        else {
            fprintf(stderr, "llama-prefill-ref: bad argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!model_path || !prompt_path || ctx < 8 || reps < 1 || threads < 1) {
        fprintf(stderr, "usage: llama-prefill-ref --model PATH --prompt-file FILE [--ctx N] [--threads N] [--reps N] [--all-logits]\n");
        return 2;
    }
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
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)ctx * 2; /* one slot + the engine's scratch, as serveproto-llama --slots 1 */
    cp.n_batch = (uint32_t)n_batch;
    cp.n_ubatch = (uint32_t)(n_batch < 512 ? n_batch : 512);
    cp.n_seq_max = 1 + 128;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.kv_unified = true;
    cp.no_perf = true;
    cp.type_k = GGML_TYPE_F32; /* as serveproto-llama's defaults */
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *lctx = llama_init_from_model(model, cp);
    if (!lctx) {
        fprintf(stderr, "llama-prefill-ref: cannot create the context\n");
        return 1;
    }
    llama_token *toks = malloc((len + 8) * sizeof *toks);
    int n = llama_tokenize(vocab, text, (int32_t)len, toks, (int32_t)len + 8, true, true);
    if (n <= 0 || n > ctx) {
        fprintf(stderr, "llama-prefill-ref: the prompt has %d tokens (context %d)\n", n, ctx);
        return 1;
    }
    struct llama_batch b = llama_batch_init(n_batch, 0, 1);
    for (int r = 0; r < reps; r++) {
        llama_memory_clear(llama_get_memory(lctx), true);
        double t0 = now_s();
        for (int a = 0; a < n; a += n_batch) {
            int m = n - a < n_batch ? n - a : n_batch;
            b.n_tokens = m;
            for (int i = 0; i < m; i++) {
                b.token[i] = toks[a + i];
                b.pos[i] = a + i;
                b.n_seq_id[i] = 1;
                b.seq_id[i][0] = 0;
                b.logits[i] = (int8_t)(all || a + i == n - 1);
            }
            if (llama_decode(lctx, b) != 0) {
                fprintf(stderr, "llama-prefill-ref: llama_decode failed\n");
                return 1;
            }
        }
        (void)llama_get_logits_ith(lctx, -1);
        printf("tokens=%d seconds=%.6f\n", n, now_s() - t0);
        fflush(stdout);
    }
    llama_batch_free(b);
    free(toks);
    llama_free(lctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
