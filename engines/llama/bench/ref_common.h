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

#endif
