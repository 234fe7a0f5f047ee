/* llama-mtmd-ref: llama.cpp's own multimodal path on a prompt with pictures, the reference of the
 * engine's pictures (tests/engines/test_llama_pictures.py; spec/llama-engine.md, "Pictures").
 *
 * usage: llama-mtmd-ref --model PATH --mmproj PATH --prompt-file FILE --image FILE [--image FILE ...]
 *                       [--threads N]
 * The prompt holds one media marker (mtmd_default_marker(), "<__media__>") per --image, in order; the
 * images are files stb_image decodes (mtmd_helper_bitmap_init_from_file). The whole prompt is tokenized
 * by mtmd_tokenize (BOS as the model asks, special tokens parsed); every chunk up to and including the
 * last picture is evaluated by mtmd_helper_eval_chunk_single (text chunks decoded, picture chunks
 * encoded by the projector and their embeddings decoded; no logits: llama.cpp keeps none at a picture's
 * positions); the text after the last picture is then one llama_decode with every position's logits.
 * Prints "positions P" (the positions before that text), then per token of that text
 * "<position> <token id> <logprob>", the logprob given the positions before it (nan for the first: no
 * logits at a picture's position), written as the engine writes numbers (sp_format_float) over the same
 * logsumexp (llama/lse.h): equal lines mean equal bits.
 *
 * The context takes the engine's CPU settings (F32 keys and values, flash attention, one unified KV
 * cache); run it with the engine's environment (GGML_CPU_USE_REF=1 LLAMA_KV_CELLS_IN_ORDER=1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "lse.h"
#include "mtmd-helper.h"
#include "mtmd.h"
#include "ref_common.h"

#define MAX_IMAGES 8

int main(int argc, char **argv)
{
    const char *model_path = NULL, *mmproj = NULL, *prompt_file = NULL, *image = NULL;
    const char *images[MAX_IMAGES];
    int n_images = 0, threads = 2;
    const ref_opt opts[] = {
        { "--model", &model_path, NULL, NULL },     { "--mmproj", &mmproj, NULL, NULL },
        { "--prompt-file", &prompt_file, NULL, NULL }, { "--image", &image, NULL, NULL },
        { "--threads", NULL, &threads, NULL },      { NULL, NULL, NULL, NULL },
    };
    /* --image repeats: read the arguments one option at a time */
    for (int i = 1; i < argc; i += 2) {
        char *pair[3] = { argv[0], argv[i], i + 1 < argc ? argv[i + 1] : NULL };
        if (!pair[2] || ref_args(3, pair, opts) != 0) {
            fprintf(stderr, "llama-mtmd-ref: bad argument '%s'\n", argv[i]);
            return 2;
        }
        if (image && n_images < MAX_IMAGES) {
            images[n_images++] = image;
            image = NULL;
        }
    }
    if (!model_path || !mmproj || !prompt_file || n_images == 0) {
        fprintf(stderr, "usage: llama-mtmd-ref --model PATH --mmproj PATH --prompt-file FILE --image FILE... "
                        "[--threads N]\n");
        return 2;
    }
    sp_float_digits = 17; /* every bit of a double: the test compares them with the engine's --float-digits 17 */
    static char prompt[1 << 16];
    long plen = read_prompt(prompt_file, prompt, sizeof prompt);
    if (plen < 0)
        return 1;
    struct llama_model *model = ref_load_model("llama-mtmd-ref", model_path, llama_model_default_params());
    if (!model)
        return 1;
    mtmd_helper_log_set(quiet, NULL);
    struct mtmd_context_params mp = mtmd_context_params_default();
    mp.use_gpu = false;
    mp.n_threads = threads;
    mp.print_timings = false;
    mtmd_context *mctx = mtmd_init_from_file(mmproj, model, mp);
    if (!mctx) {
        fprintf(stderr, "llama-mtmd-ref: cannot load %s\n", mmproj);
        return 1;
    }
    struct llama_context_params cp = ref_engine_context(4096, 1, threads);
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama-mtmd-ref: cannot create a context\n");
        return 1;
    }
    mtmd_bitmap *bitmaps[MAX_IMAGES];
    for (int i = 0; i < n_images; i++) {
        struct mtmd_helper_bitmap_wrapper bw =
            mtmd_helper_bitmap_init_from_file(mctx, images[i], false, mtmd_helper_init_opt_default());
        bitmaps[i] = bw.bitmap;
        if (!bitmaps[i]) {
            fprintf(stderr, "llama-mtmd-ref: cannot decode %s\n", images[i]);
            return 1;
        }
    }
    mtmd_input_text text = { .text = prompt, .text_len = (size_t)plen, .add_special = true, .parse_special = true };
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    int rc = mtmd_tokenize(mctx, chunks, &text, (const mtmd_bitmap **)bitmaps, (size_t)n_images);
    if (rc != 0) {
        fprintf(stderr, "llama-mtmd-ref: mtmd_tokenize failed (%d)\n", rc);
        return 1;
    }
    size_t n_chunks = mtmd_input_chunks_size(chunks);
    size_t last_pic = 0;
    for (size_t i = 0; i < n_chunks; i++)
        if (mtmd_input_chunk_get_type(mtmd_input_chunks_get(chunks, i)) == MTMD_INPUT_CHUNK_TYPE_IMAGE)
            last_pic = i;
    llama_pos n_past = 0;
    for (size_t i = 0; i <= last_pic; i++) {
        llama_pos next = n_past; /* a text chunk adds to it, a picture chunk sets it */
        if (mtmd_helper_eval_chunk_single(mctx, ctx, mtmd_input_chunks_get(chunks, i), n_past, 0, (int32_t)cp.n_batch,
                                          false, &next) != 0) {
            fprintf(stderr, "llama-mtmd-ref: evaluating chunk %zu failed\n", i);
            return 1;
        }
        n_past = next;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    printf("positions %d\n", (int)n_past);
    if (last_pic + 1 < n_chunks) {
        size_t nt = 0;
        const llama_token *toks = mtmd_input_chunk_get_tokens_text(mtmd_input_chunks_get(chunks, last_pic + 1), &nt);
        struct llama_batch b = llama_batch_init((int32_t)nt, 0, 1);
        for (size_t i = 0; i < nt; i++) {
            b.token[i] = toks[i];
            b.pos[i] = n_past + (llama_pos)i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = (int32_t)nt;
        if (llama_decode(ctx, b) != 0) {
            fprintf(stderr, "llama-mtmd-ref: decoding the text after the last picture failed\n");
            return 1;
        }
        for (size_t i = 0; i < nt; i++) {
            const float *row = i > 0 ? llama_get_logits_ith(ctx, (int32_t)i - 1) : NULL;
            char num[SP_FLOAT_MAX];
            sp_format_float(num, row ? (double)row[toks[i]] - lse_logsumexp(row, n_vocab) : NAN);
            printf("%d %d %s\n", (int)(n_past + (llama_pos)i), toks[i], num);
        }
        llama_batch_free(b);
    }
    mtmd_input_chunks_free(chunks);
    for (int i = 0; i < n_images; i++)
        mtmd_bitmap_free(bitmaps[i]);
    llama_free(ctx);
    mtmd_free(mctx);
    llama_model_free(model);
    return 0;
}
