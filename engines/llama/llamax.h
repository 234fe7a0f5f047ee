/* llamax.h: the one seam between the engine and what our patches add to llama.cpp
 * (engines/llama/patches/README.md).
 *
 * llamax.c is the only file of the engine that calls a symbol a patch adds or sets / reads an
 * environment switch a patch reads (tests/gateway/test_layers.py holds every other file to that).
 * Each patch defines a feature macro (SERVEPROTO_PATCH_*) in a public header it touches; on stock
 * llama.cpp (`make -C engines all LLAMA_PATCHES=none`) the macro is absent and the feature is off:
 * what needs it is refused at load with LOAD_FAIL unsupported, or the capability is absent
 * (llamax_patches: CAPS x_patches).
 */
#ifndef SERVEPROTO_LLAMAX_H
#define SERVEPROTO_LLAMAX_H

#include <stddef.h>
#include <stdint.h>

#include "llama.h"

/* Which kernels compute the digits (spec/llama-engine.md, "Reproducible digits"). */
typedef enum llamax_kernels {
    LLAMAX_KERNELS_STOCK = 0,      /* llama.cpp's own, shape-dependent (--numerics fast) */
    LLAMAX_KERNELS_CPU_REF,        /* the CPU backend's reference kernels, F32 KV kept in F32 into flash
                                    * attention (patches 0001, 0002: GGML_CPU_USE_REF=1) */
    LLAMAX_KERNELS_CUDA_INVARIANT, /* ggml-cuda's batch-invariant kernels (patch 0006: GGML_CUDA_INVARIANT=1) */
} llamax_kernels;

/* What the engine asks of llama.cpp before the model loads (the patches read it when llama.cpp creates
 * its backends and caches, so it is set once, before llama_model_load_from_file). */
typedef struct llamax_config {
    llamax_kernels kernels;
    int kv_cells_in_order; /* a sequence's new KV cells above its old ones (patch 0003); a value the user
                            * gave LLAMA_KV_CELLS_IN_ORDER is kept (=0 shows what it buys) */
    int cuda_graphs_off;   /* stock ggml-cuda's GGML_CUDA_DISABLE_GRAPHS=1 (a value the user set is kept) */
} llamax_config;

/* The patched features this build has, comma-separated CAPS names ("none" on stock llama.cpp):
 * the value of CAPS x_patches. */
const char *llamax_patches(void);

/* Whether this build has what `kernels` needs (every patch of it). */
int llamax_has_kernels(llamax_kernels kernels);

/* Whether this build has llama.cpp's output ring (patch 0010: llamax_output_ring). */
int llamax_has_output_ring(void);

/* Applies *c (environment switches the patches read). Returns NULL, or a LOAD_FAIL kind
 * ("unsupported") with err (cap bytes) saying which patch this build lacks. */
const char *llamax_configure(const llamax_config *c, char *err, size_t cap);

/* GGML_CUDA_INVARIANT_SKIP (patch 0006: parts of the GPU's invariant kernels left out, to price them),
 * or NULL where it is unset, empty or the build lacks the patch. */
const char *llamax_invariant_skip(void);

/* Turns llama.cpp's output ring on or off (patch 0010). Returns 0, or -1 when asked on and the build
 * lacks the patch (nothing changed). */
int llamax_output_ring(struct llama_context *ctx, int on);

/* Row `row`'s logits of the decode before the last one (the output ring, patch 0010): n_vocab floats,
 * or NULL where it has none (or the build lacks the patch). */
const float *llamax_logits_prev_ith(struct llama_context *ctx, int32_t row);

/* The profile file's path stem (SERVEPROTO_PROFILE; patch 0007 reads it too), or NULL when unset or empty. */
const char *llamax_profile_path(void);

/* llama_decode's own host time by part (patch 0007, on with SERVEPROTO_PROFILE), summed since the start:
 * copies up to n counters to out and returns how many (0 where the build lacks the patch). */
int llamax_decode_profile(uint64_t *out, int n);

#endif
