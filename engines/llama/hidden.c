/* hidden.c: the hidden states SCORE returns under `hidden` (spec 9.1, CAPS
 * x_hidden).
 *
 * llama.cpp computes a layer's output as the graph tensor "l_out-<il>"
 * ([n_embd, n_tokens] of one ubatch, F32). The context is created with
 * hidden_eval as its graph evaluation callback (llama_context_params.cb_eval):
 * the scheduler asks it, node by node, whether it wants a tensor's data, and
 * computes the graph up to each wanted node before handing it over. SCORE
 * (score.c) registers, while it fills the batch, the batch rows and layers it
 * wants and where to copy them (hidden_want); the callback copies those rows
 * out of the ubatch that holds them and asks for nothing in a decode without
 * wants, so the graph is then computed in one piece as without a callback.
 *
 * Rows: llama.cpp splits a batch of the unified KV cache into ubatches of
 * consecutive rows (split_simple), computed in order. Layer 0's output holds
 * every row of its ubatch, so asking about it (its shape is known before it is
 * computed) marks the start of the next ubatch. The last layer keeps only the
 * rows that output logits (inp_out_ids), in batch order; a wanted row always
 * outputs logits (score.c), so its index there is the number of output rows
 * before it in the ubatch.
 *
 * The copy is of values already computed: it changes no number of the decode.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#include <ggml-backend.h>

typedef struct hidden_want_t {
    int row, layer;
    float *dst;        /* n_embd floats */
} hidden_want_t;

static hidden_want_t *g_want;
static int g_n_want, g_cap_want;
static uint64_t g_serial;   /* e->decodes of the decode the wants belong to */
static int g_u0, g_un;      /* the ubatch being computed: batch rows [g_u0, g_u0 + g_un) */

int hidden_layers(const engine *e)
{
    return llama_model_n_layer(e->model);
}

int hidden_dim(const engine *e)
{
    return llama_model_n_embd(e->model);
}

int hidden_want(engine *e, int row, int layer, float *dst)
{
    if (g_serial != e->decodes) { /* the first want of the batch being filled */
        g_n_want = 0;
        g_serial = e->decodes;
    }
    if (g_n_want == g_cap_want) {
        int cap = g_cap_want ? 2 * g_cap_want : 64;
        hidden_want_t *w = realloc(g_want, (size_t)cap * sizeof *w);
        if (!w)
            return -1;
        g_want = w;
        g_cap_want = cap;
    }
    g_want[g_n_want++] = (hidden_want_t){ row, layer, dst };
    g_u0 = g_un = 0;
    return 0;
}

/* The layer of an "l_out-<il>" tensor, else -1. */
static int layer_of(const struct ggml_tensor *t)
{
    if (strncmp(t->name, "l_out-", 6) != 0)
        return -1;
    char *end;
    long il = strtol(t->name + 6, &end, 10);
    return *end == '\0' && end != t->name + 6 ? (int)il : -1;
}

bool hidden_eval(struct ggml_tensor *t, bool ask, void *user_data)
{
    engine *e = user_data;
    if (g_n_want == 0 || g_serial != e->decodes || !e->in_decode)
        return false;
    int il = layer_of(t);
    if (il < 0)
        return false;
    if (ask && il == 0) {
        g_u0 += g_un;
        g_un = (int)t->ne[1];
    }
    int any = 0;
    const int n_embd = (int)t->ne[0];
    for (int i = 0; i < g_n_want; i++) {
        const hidden_want_t *w = &g_want[i];
        if (w->layer != il || w->row < g_u0 || w->row >= g_u0 + g_un)
            continue;
        any = 1;
        if (ask)
            break;
        int r = w->row - g_u0;
        if (t->ne[1] != g_un) { /* only the output rows: count those before it */
            r = 0;
            for (int b = g_u0; b < w->row; b++)
                r += e->batch.logits[b] != 0;
        }
        if (t->type != GGML_TYPE_F32 || r >= t->ne[1] || n_embd != hidden_dim(e))
            continue; /* left NAN: SCORE answers an error */
        ggml_backend_tensor_get(t, w->dst, (size_t)r * t->nb[1], (size_t)n_embd * sizeof(float));
    }
    return any || !ask;
}
