/* llama-logit-hash: a hash of every logit of a few decodes, to compare two
 * builds' kernels bit for bit (a patch that must not move the digits: 0013,
 * 0014, 0015). The decodes take the engine's CPU context settings (F32 K
 * and V, flash attention, one unified KV cache); run it with the engine's
 * environment (GGML_CPU_USE_REF=1 LLAMA_KV_CELLS_IN_ORDER=1).
 *
 * usage: llama-logit-hash --model PATH --prompt-file FILE [--threads N]
 *                         [--tokens N] [--background B]
 * The prompt's tokens, repeated to N (default 700): first B (default 300)
 * cells of another sequence (not hashed), then the N tokens as one sequence
 * in ubatches of 512 with every logit; then a ubatch of 40 tokens each for
 * two sequences copied from the first (rows of two sequences, each on its
 * own cells, in one decode); then five single-token steps. Prints one line
 * after each stage, "<stage> <FNV-1a 64 of every logit so far>": equal lines
 * from two builds mean equal logits, bit for bit. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_common.h"

static uint64_t hash = 1469598103934665603ull;

static void mix(const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        hash ^= c[i];
        hash *= 1099511628211ull;
    }
}

/* Decodes t[0..n) into `seq` from position pos0 in ubatches of 512, hashing every logit when `outs`. */
static int decode(struct llama_context *c, struct llama_batch *b, const llama_token *t, int n, int seq, int pos0,
                  int outs, int n_vocab)
{
    for (int a = 0; a < n; a += 512) {
        int m = n - a < 512 ? n - a : 512;
        b->n_tokens = m;
        for (int i = 0; i < m; i++) {
            b->token[i] = t[a + i];
            b->pos[i] = pos0 + a + i;
            b->n_seq_id[i] = 1;
            b->seq_id[i][0] = seq;
            b->logits[i] = (int8_t)outs;
        }
        if (llama_decode(c, *b) != 0)
            return 1;
        if (outs)
            mix(llama_get_logits(c), (size_t)m * n_vocab * sizeof(float));
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *prompt_path = NULL;
    int threads = 2, ntok = 700, bg = 300;
    const ref_opt opts[] = { { "--model", &model_path, NULL, NULL }, { "--prompt-file", &prompt_path, NULL, NULL },
                             { "--threads", NULL, &threads, NULL }, { "--tokens", NULL, &ntok, NULL },
                             { "--background", NULL, &bg, NULL }, { NULL, NULL, NULL, NULL } };
    int bad = ref_args(argc, argv, opts);
    if (bad) {
        fprintf(stderr, "llama-logit-hash: bad argument %s\n", argv[bad]);
        return 2;
    }
    if (!model_path || !prompt_path || threads < 1 || ntok < 1 || ntok > 6000 || bg < 0 || bg > 6000) {
        fprintf(stderr, "usage: llama-logit-hash --model PATH --prompt-file FILE [--threads N] [--tokens 1..6000] "
                        "[--background 0..6000]\n");
        return 2;
    }
    static char text[1 << 20];
    long got = read_prompt(prompt_path, text, sizeof text);
    if (got < 0)
        return 1;
    size_t len = (size_t)got;

    struct llama_model *model = ref_load_model("llama-logit-hash", model_path, llama_model_default_params());
    if (!model)
        return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token *toks = malloc((len + 8) * sizeof *toks);
    int n = llama_tokenize(vocab, text, (int32_t)len, toks, (int32_t)len + 8, true, true);
    if (n <= 0) {
        fprintf(stderr, "llama-logit-hash: the prompt has no tokens\n");
        return 1;
    }
    const int longest = 12000;
    llama_token *seq = malloc(longest * sizeof *seq);
    for (int i = 0; i < longest; i++)
        seq[i] = toks[i % n];

    struct llama_context *c = llama_init_from_model(model, ref_engine_context(16384, 129, threads));
    if (!c) {
        fprintf(stderr, "llama-logit-hash: cannot create the context\n");
        return 1;
    }
    struct llama_batch b = llama_batch_init(512, 0, 1);
    llama_memory_t mem = llama_get_memory(c);
    if ((bg && decode(c, &b, seq + 7, bg, 1, 0, 0, n_vocab)) || decode(c, &b, seq, ntok, 0, 0, 1, n_vocab)) {
        fprintf(stderr, "llama-logit-hash: llama_decode failed\n");
        return 1;
    }
    printf("document %016llx\n", (unsigned long long)hash);
    llama_memory_seq_cp(mem, 0, 2, -1, -1);
    llama_memory_seq_cp(mem, 0, 3, -1, -1);
    b.n_tokens = 80;
    for (int i = 0; i < 80; i++) {
        b.token[i] = seq[100 + i];
        b.pos[i] = ntok + i % 40;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 2 + i / 40;
        b.logits[i] = 1;
    }
    if (llama_decode(c, b) != 0) {
        fprintf(stderr, "llama-logit-hash: llama_decode failed\n");
        return 1;
    }
    mix(llama_get_logits(c), (size_t)80 * n_vocab * sizeof(float));
    printf("two-sequences %016llx\n", (unsigned long long)hash);
    for (int s = 0; s < 5; s++)
        if (decode(c, &b, seq + 300 + s, 1, 2, ntok + 40 + s, 1, n_vocab)) {
            fprintf(stderr, "llama-logit-hash: llama_decode failed\n");
            return 1;
        }
    printf("steps %016llx\n", (unsigned long long)hash);
    llama_batch_free(b);
    llama_free(c);
    free(seq);
    free(toks);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
