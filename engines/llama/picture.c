/* picture.c: pictures through llama.cpp's multimodal library (picture.h); the only file calling mtmd. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "mtmd-helper.h"
#include "mtmd.h"
#include "picture.h"

int picture_load(engine *e, const char *mmproj, int threads, int use_gpu, ggml_log_callback log, void *log_data,
                 char *err, size_t cap)
{
    mtmd_helper_log_set(log, log_data);
    struct mtmd_context_params mp = mtmd_context_params_default();
    mp.use_gpu = use_gpu != 0;
    mp.n_threads = threads;
    mp.print_timings = false;
    mtmd_context *m = mtmd_init_from_file(mmproj, e->model, mp);
    if (!m) {
        snprintf(err, cap, "--mmproj %s: not a projector for this model (mtmd_init_from_file failed)", mmproj);
        return -1;
    }
    const char *why = !mtmd_support_vision(m) ? "it has no vision encoder"
                      : mtmd_decode_use_mrope(m) ? "it places pictures by M-RoPE positions, which this engine does not"
                                                 : NULL;
    if (why) {
        snprintf(err, cap, "--mmproj %s: %s", mmproj, why);
        mtmd_free(m);
        return -1;
    }
    e->mtmd = m;
    return 0;
}

void picture_unload(engine *e)
{
    if (e->mtmd)
        mtmd_free(e->mtmd);
    e->mtmd = NULL;
}

const char *picture_marker(void)
{
    return mtmd_default_marker();
}

int picture_markers(const char *text, size_t len)
{
    const char *mk = mtmd_default_marker();
    const size_t ml = strlen(mk);
    int n = 0;
    for (const char *p = text, *end = text + len; (p = memmem(p, (size_t)(end - p), mk, ml)) != NULL; p += ml)
        n++;
    return n;
}

int picture_count_check(const char *field, const char *text, size_t len, int n, char *msg, size_t cap)
{
    const int markers = picture_markers(text, len);
    if (markers == n)
        return 0;
    snprintf(msg, cap, "%s: %d picture marker%s %s for %d picture%s%s", field, markers, markers == 1 ? "" : "s",
             mtmd_default_marker(), n, n == 1 ? "" : "s", n == 0 ? " (IMAGE frames)" : "");
    return -1;
}

/* Picture k of ps as an mtmd bitmap, or NULL with the reason in msg. */
static mtmd_bitmap *bitmap_of(engine *e, const picture_set *ps, int k, char *msg, size_t cap)
{
    const picture *p = &ps->p[k];
    char who[48];
    snprintf(who, sizeof who, "image %d of %d", k + 1, ps->n);
    if (p->grid_h || p->grid_w) {
        const uint64_t want = 3ull * p->grid_h * p->grid_w;
        if (!p->grid_h || !p->grid_w || want != p->len) {
            snprintf(msg, cap, "%s: grid_h %u x grid_w %u RGB pixels are %llu bytes, got %zu", who, p->grid_h,
                     p->grid_w, (unsigned long long)want, p->len);
            return NULL;
        }
        mtmd_bitmap *b = mtmd_bitmap_init(p->grid_w, p->grid_h, p->bytes);
        if (!b)
            snprintf(msg, cap, "%s: out of memory", who);
        return b;
    }
    struct mtmd_helper_bitmap_wrapper w =
        mtmd_helper_bitmap_init_from_buf(e->mtmd, p->bytes, p->len, false, mtmd_helper_init_opt_default());
    if (w.video_ctx)
        mtmd_helper_video_free(w.video_ctx);
    if (!w.bitmap) {
        snprintf(msg, cap, "%s: the bytes are not a picture (PNG, JPEG, BMP, GIF; or raw RGB with grid_h and grid_w)",
                 who);
        return NULL;
    }
    if (mtmd_bitmap_is_audio(w.bitmap)) {
        mtmd_bitmap_free(w.bitmap);
        snprintf(msg, cap, "%s: the bytes are sound, not a picture", who);
        return NULL;
    }
    return w.bitmap;
}

int picture_prepare(engine *e, const picture_set *ps, const char *field, const char *text, size_t len,
                    picture_prelude *out, char *msg, size_t cap)
{
    memset(out, 0, sizeof *out);
    const char *mk = mtmd_default_marker();
    const size_t ml = strlen(mk);
    if (picture_count_check(field, text, len, ps->n, msg, cap) != 0)
        return -1;
    const char *last = NULL;
    for (const char *p = text, *end = text + len; (p = memmem(p, (size_t)(end - p), mk, ml)) != NULL; p += ml)
        last = p;
    out->tail_off = (size_t)(last - text) + ml;

    mtmd_bitmap *bm[PICTURE_MAX] = { 0 };
    int rc = -1;
    for (int k = 0; k < ps->n; k++)
        if (!(bm[k] = bitmap_of(e, ps, k, msg, cap)))
            goto out;
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    mtmd_input_text in = { .text = text, .text_len = out->tail_off, .add_special = true, .parse_special = true };
    int t = chunks ? mtmd_tokenize(e->mtmd, chunks, &in, (const mtmd_bitmap **)bm, (size_t)ps->n) : -1;
    if (t != 0) {
        if (chunks)
            mtmd_input_chunks_free(chunks);
        snprintf(msg, cap, "%s: the pictures could not be prepared (mtmd_tokenize: %d)", field, t);
        goto out;
    }
    out->chunks = chunks;
    out->n_pos = (int)mtmd_helper_get_n_pos(chunks);
    rc = 0;
out:
    for (int k = 0; k < ps->n; k++)
        if (bm[k])
            mtmd_bitmap_free(bm[k]);
    return rc;
}

int picture_eval(engine *e, const picture_prelude *pp, int slot, char *msg, size_t cap)
{
    slot_truncate(e, slot, 0);
    e->slots[slot].n = 0;
    const mtmd_input_chunks *chunks = pp->chunks;
    llama_pos n_past = 0;
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        llama_pos next = n_past; /* a text chunk adds to it, a picture chunk sets it */
        /* no logits: llama.cpp's path keeps none at a picture's positions, the text after it is read
         * by the request's own decodes */
        if (mtmd_helper_eval_chunk_single(e->mtmd, e->ctx, mtmd_input_chunks_get(chunks, i), n_past, slot, e->n_ubatch,
                                          false, &next) != 0) {
            slot_truncate(e, slot, 0);
            snprintf(msg, cap, "evaluating the pictures failed (chunk %zu)", i);
            return -1;
        }
        n_past = next;
    }
    slot_state *sl = &e->slots[slot];
    for (int i = 0; i < pp->n_pos; i++)
        sl->tokens[i] = PICTURE_TOKEN;
    sl->n = pp->n_pos;
    return 0;
}

void picture_prelude_free(picture_prelude *pp)
{
    if (pp->chunks)
        mtmd_input_chunks_free(pp->chunks);
    memset(pp, 0, sizeof *pp);
}

void picture_set_free(picture_set *ps)
{
    if (!ps)
        return;
    for (int k = 0; k < ps->n; k++)
        free(ps->p[k].bytes);
    free(ps);
}
