/* llamax.c: the one seam between the engine and what our patches add to llama.cpp (llamax.h;
 * engines/llama/patches/README.md for each patch, its switch and its feature macro). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-cuda.h"
#include "llamax.h"

/* A patch absent (stock llama.cpp): its feature macro reads 0. */
#ifndef SERVEPROTO_PATCH_CPU_USE_REF
#define SERVEPROTO_PATCH_CPU_USE_REF 0
#endif
#ifndef SERVEPROTO_PATCH_FA_KEEP_F32
#define SERVEPROTO_PATCH_FA_KEEP_F32 0
#endif
#ifndef SERVEPROTO_PATCH_KV_CELLS_IN_ORDER
#define SERVEPROTO_PATCH_KV_CELLS_IN_ORDER 0
#endif
#ifndef SERVEPROTO_PATCH_CUDA_INVARIANT
#define SERVEPROTO_PATCH_CUDA_INVARIANT 0
#endif
#ifndef SERVEPROTO_PATCH_KV_SEQ_OPS_USED_CELLS
#define SERVEPROTO_PATCH_KV_SEQ_OPS_USED_CELLS 0
#endif
#ifndef SERVEPROTO_PATCH_EVAL_CALLBACK_SYNC
#define SERVEPROTO_PATCH_EVAL_CALLBACK_SYNC 0
#endif
#ifndef SERVEPROTO_PATCH_UNICODE_ISOLATED_NUMBERS
#define SERVEPROTO_PATCH_UNICODE_ISOLATED_NUMBERS 0
#endif
#ifndef SERVEPROTO_PATCH_BPE_WORD_CACHE
#define SERVEPROTO_PATCH_BPE_WORD_CACHE 0
#endif
#ifndef SERVEPROTO_PATCH_CUDA_GRAPHS_FIXED_SHAPES
#define SERVEPROTO_PATCH_CUDA_GRAPHS_FIXED_SHAPES 0
#endif
#ifndef SERVEPROTO_PATCH_CPU_FA_OWN_CELLS
#define SERVEPROTO_PATCH_CPU_FA_OWN_CELLS 0
#endif
#ifndef SERVEPROTO_PATCH_CPU_FA_ROW_BLOCKS
#define SERVEPROTO_PATCH_CPU_FA_ROW_BLOCKS 0
#endif
#ifndef SERVEPROTO_PATCH_CPU_Q4_1_FOUR_COLUMNS
#define SERVEPROTO_PATCH_CPU_Q4_1_FOUR_COLUMNS 0
#endif
#ifndef SERVEPROTO_PATCH_CPU_FA_MASK_BITS_PER_OP
#define SERVEPROTO_PATCH_CPU_FA_MASK_BITS_PER_OP 0
#endif
#ifndef SERVEPROTO_PATCH_CPU_Q4_1_EIGHT_COLUMNS
#define SERVEPROTO_PATCH_CPU_Q4_1_EIGHT_COLUMNS 0
#endif
#ifndef SERVEPROTO_PATCH_CPU_FA_TILE_LANES
#define SERVEPROTO_PATCH_CPU_FA_TILE_LANES 0
#endif
#ifndef SERVEPROTO_PATCH_OUTPUT_RING
#define SERVEPROTO_PATCH_OUTPUT_RING 0
#endif
#ifndef SERVEPROTO_PATCH_RING_SCHED_COPIES
#define SERVEPROTO_PATCH_RING_SCHED_COPIES 0
#endif
#ifndef SERVEPROTO_PATCH_DECODE_PROFILE
#define SERVEPROTO_PATCH_DECODE_PROFILE 0
#endif

/* CAPS x_patches: each feature's name, in the patches' order of application (by group). */
static const struct {
    const char *name;
    int on;
} features[] = {
    { "use_ref", SERVEPROTO_PATCH_CPU_USE_REF },                 /* numerics/0001 */
    { "fa_keep_f32", SERVEPROTO_PATCH_FA_KEEP_F32 },             /* numerics/0002 */
    { "kv_in_order", SERVEPROTO_PATCH_KV_CELLS_IN_ORDER },       /* numerics/0003 */
    { "cuda_invariant", SERVEPROTO_PATCH_CUDA_INVARIANT },       /* numerics/0006 */
    { "kv_used_cells", SERVEPROTO_PATCH_KV_SEQ_OPS_USED_CELLS }, /* speed/0004 */
    { "eval_sync", SERVEPROTO_PATCH_EVAL_CALLBACK_SYNC },         /* speed/0005 */
    { "isolated_numbers", SERVEPROTO_PATCH_UNICODE_ISOLATED_NUMBERS }, /* speed/0008 */
    { "bpe_word_cache", SERVEPROTO_PATCH_BPE_WORD_CACHE },        /* speed/0009 */
    { "cuda_graph_shapes", SERVEPROTO_PATCH_CUDA_GRAPHS_FIXED_SHAPES }, /* speed/0012 */
    { "fa_own_cells", SERVEPROTO_PATCH_CPU_FA_OWN_CELLS },        /* speed/0013 */
    { "fa_row_blocks", SERVEPROTO_PATCH_CPU_FA_ROW_BLOCKS },      /* speed/0014 */
    { "q4_1_four_columns", SERVEPROTO_PATCH_CPU_Q4_1_FOUR_COLUMNS }, /* speed/0015 */
    { "fa_mask_bits", SERVEPROTO_PATCH_CPU_FA_MASK_BITS_PER_OP },   /* speed/0016 */
    { "q4_1_eight_columns", SERVEPROTO_PATCH_CPU_Q4_1_EIGHT_COLUMNS }, /* speed/0017 */
    { "fa_tile_lanes", SERVEPROTO_PATCH_CPU_FA_TILE_LANES },       /* speed/0018 */
    { "output_ring", SERVEPROTO_PATCH_OUTPUT_RING },              /* api/0010 */
    { "ring_copies", SERVEPROTO_PATCH_RING_SCHED_COPIES },        /* api/0011 */
    { "decode_profile", SERVEPROTO_PATCH_DECODE_PROFILE },        /* profile/0007 */
};

const char *llamax_patches(void)
{
    static char out[512];
    if (!out[0]) {
        size_t n = 0;
        for (size_t i = 0; i < sizeof features / sizeof features[0]; i++)
            if (features[i].on)
                n += (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, "%s%s", n ? "," : "",
                                      features[i].name);
        if (n == 0)
            snprintf(out, sizeof out, "none");
    }
    return out;
}

int llamax_has_kernels(llamax_kernels kernels)
{
    switch (kernels) {
    case LLAMAX_KERNELS_CPU_REF:
        return SERVEPROTO_PATCH_CPU_USE_REF && SERVEPROTO_PATCH_FA_KEEP_F32 && SERVEPROTO_PATCH_KV_CELLS_IN_ORDER;
    case LLAMAX_KERNELS_CUDA_INVARIANT:
        return SERVEPROTO_PATCH_CUDA_INVARIANT && SERVEPROTO_PATCH_KV_CELLS_IN_ORDER;
    default:
        return 1;
    }
}

int llamax_has_output_ring(void)
{
    return SERVEPROTO_PATCH_OUTPUT_RING;
}

const char *llamax_configure(const llamax_config *c, char *err, size_t cap)
{
    if (!llamax_has_kernels(c->kernels) || (c->kv_cells_in_order && !SERVEPROTO_PATCH_KV_CELLS_IN_ORDER)) {
        snprintf(err, cap, "--numerics invariant: this engine is built on llama.cpp without %s "
                           "(engines/llama/patches/numerics; x_patches=%s); use --numerics fast",
                 c->kernels == LLAMAX_KERNELS_CUDA_INVARIANT ? "ggml-cuda's invariant kernels (patch 0006)"
                                                             : "the reference kernels (patches 0001-0003)",
                 llamax_patches());
        return "unsupported";
    }
    /* read when llama.cpp creates the CPU backend (patch 0001) and builds the graph (0002); on a GPU
     * build the CUDA backend's switch instead (0006), whose flash attention takes the F16 K and V that
     * 0002 would keep in F32 under the CPU's */
    if (c->kernels == LLAMAX_KERNELS_CPU_REF)
        setenv("GGML_CPU_USE_REF", "1", 1);
    else if (c->kernels == LLAMAX_KERNELS_CUDA_INVARIANT)
        setenv("GGML_CUDA_INVARIANT", "1", 1);
    if (c->kv_cells_in_order)
        setenv("LLAMA_KV_CELLS_IN_ORDER", "1", 0);
    /* ggml-cuda reads it at the first graph it computes; no effect on the CPU */
    if (c->cuda_graphs_off)
        setenv("GGML_CUDA_DISABLE_GRAPHS", "1", 0);
    return NULL;
}

const char *llamax_invariant_skip(void)
{
    const char *skip = SERVEPROTO_PATCH_CUDA_INVARIANT ? getenv("GGML_CUDA_INVARIANT_SKIP") : NULL;
    return skip && *skip ? skip : NULL;
}

int llamax_output_ring(struct llama_context *ctx, int on)
{
#if SERVEPROTO_PATCH_OUTPUT_RING
    llama_set_output_ring(ctx, on != 0);
    return 0;
#else
    (void)ctx;
    return on ? -1 : 0;
#endif
}

const float *llamax_logits_prev_ith(struct llama_context *ctx, int32_t row)
{
#if SERVEPROTO_PATCH_OUTPUT_RING
    return llama_get_logits_prev_ith(ctx, row);
#else
    (void)ctx;
    (void)row;
    return NULL;
#endif
}

const char *llamax_profile_path(void)
{
    const char *path = getenv("SERVEPROTO_PROFILE");
    return path && *path ? path : NULL;
}

int llamax_decode_profile(uint64_t *out, int n)
{
#if SERVEPROTO_PATCH_DECODE_PROFILE
    return serveproto_decode_profile(out, n);
#else
    (void)out;
    (void)n;
    return 0;
#endif
}
