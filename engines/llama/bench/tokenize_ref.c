/* llama-tokenize-ref: llama.cpp's own llama_tokenize of texts, timed: what
 * a SCORE's start pays per stem and option (bench/results/NOTEBOOK.md, "Tokenizing").
 *
 * usage: llama-tokenize-ref --model PATH --texts FILE [--reps N] [--ids]
 * FILE holds the texts separated by NUL bytes. Each is tokenized as the
 * engine does (model_tokenize: BOS when the model asks, special tokens
 * parsed) --reps times (default 100); one line per text on stdout:
 * "bytes=<n> tokens=<n> us=<mean microseconds a call>", and with --ids a
 * second line of its token ids. Only the vocabulary is loaded.
 * LLAMA_UNICODE_STD_REGEX=1 (llama/patches/speed/0008) takes llama.cpp's stock
 * std::regex split of \p{N} instead of the patch's, LLAMA_BPE_NO_WORD_CACHE=1
 * (0009) merges every word again instead of keeping each word's tokens: both
 * for comparing the patched tokenizer with the stock one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"
#include "ref_common.h"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap + 1);
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *b = realloc(buf, 2 * cap + 1);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *texts = NULL;
    int reps = 100, ids = 0;
    const ref_opt opts[] = { { "--model", &model, NULL, NULL }, { "--texts", &texts, NULL, NULL },
                             { "--reps", NULL, &reps, NULL }, { "--ids", NULL, NULL, &ids }, { NULL, NULL, NULL, NULL } };
    if (ref_args(argc, argv, opts) || !model || !texts || reps < 1) {
        fprintf(stderr, "usage: llama-tokenize-ref --model PATH --texts FILE [--reps N] [--ids]\n");
        return 2;
    }
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *m = ref_load_model("llama-tokenize-ref", model, mp);
    if (!m)
        return 1;
    const struct llama_vocab *v = llama_model_get_vocab(m);
    size_t len = 0;
    char *buf = read_all(texts, &len);
    if (!buf) {
        fprintf(stderr, "llama-tokenize-ref: cannot read %s\n", texts);
        return 1;
    }
    int cap = (int)len + 16;
    llama_token *toks = malloc((size_t)cap * sizeof *toks);
    for (char *s = buf; toks && s < buf + len; s += strlen(s) + 1) {
        int n = (int)strlen(s), nt = 0;
        double t0 = now_s();
        for (int r = 0; r < reps; r++)
            nt = llama_tokenize(v, s, n, toks, cap, true, true);
        double us = (now_s() - t0) / reps * 1e6;
        printf("bytes=%d tokens=%d us=%.2f\n", n, nt, us);
        if (ids) {
            for (int i = 0; i < nt; i++)
                printf(i ? " %d" : "%d", toks[i]);
            putchar('\n');
        }
    }
    free(toks);
    free(buf);
    llama_model_free(m);
    llama_backend_free();
    return 0;
}
