/* ref_common.h: what llama-prefill-ref and llama-tokenize-ref share, a
 * monotonic clock and a log callback that prints llama.cpp's errors only. */
#ifndef SERVEPROTO_REF_COMMON_H
#define SERVEPROTO_REF_COMMON_H

#include <stdio.h>
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

#endif
