/* ref_common.h: what llama-prefill-ref, llama-logit-hash and llama-tokenize-ref share: a monotonic
 * clock, their command lines, the prompt file, and the model loaded with llama.cpp's errors only. */
#ifndef SERVEPROTO_REF_COMMON_H
#define SERVEPROTO_REF_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

/* Seconds on CLOCK_MONOTONIC. */
static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* llama_log_set callback: errors to stderr, nothing else. */
static inline void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* The prompt file of llama-prefill-ref and llama-logit-hash: up to cap - 1 bytes of `path` into buf.
 * Returns the length, or -1 after perror when the file cannot be opened. */
static inline long read_prompt(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t len = fread(buf, 1, cap - 1, f);
    fclose(f);
    return (long)len;
}

/* One option of these programs' command lines: `name`, then a value into *str or *num (atoi); or a
 * flag, *flag = 1. */
typedef struct ref_opt {
    const char *name;
    const char **str;
    int *num;
    int *flag;
} ref_opt;

/* Reads argv[1..] against opts (ended by a NULL name). Returns 0, or the index of the first argument
 * that is none of them or lacks its value. */
static inline int ref_args(int argc, char **argv, const ref_opt *opts)
{
    for (int i = 1; i < argc; i++) {
        const ref_opt *o = opts;
        while (o->name && strcmp(o->name, argv[i]))
            o++;
        if (o->name && o->flag)
            *o->flag = 1;
        else if (o->name && o->str && i + 1 < argc)
            *o->str = argv[++i];
        else if (o->name && o->num && i + 1 < argc)
            *o->num = atoi(argv[++i]);
        else
            return i;
    }
    return 0;
}

/* The model at `path`, llama.cpp logging its errors only; NULL after "`prog`: cannot load" on stderr. */
static inline struct llama_model *ref_load_model(const char *prog, const char *path, struct llama_model_params mp)
{
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(path, mp);
    if (!model)
        fprintf(stderr, "%s: cannot load %s\n", prog, path);
    return model;
}

/* The engine's CPU context settings (F32 keys and values, flash attention, one unified KV cache, batches
 * of 2048 in ubatches of 512) with n_ctx cells, n_seq sequences and `threads` threads: what llama-logit-hash
 * and llama-mtmd-ref decode with. */
static inline struct llama_context_params ref_engine_context(int n_ctx, int n_seq, int threads)
{
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_seq_max = (uint32_t)n_seq;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.kv_unified = true;
    cp.no_perf = true;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    return cp;
}

#endif
