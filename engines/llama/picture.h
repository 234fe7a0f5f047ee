/* picture.h: pictures read by llama.cpp's multimodal library (libmtmd) and a projector (--mmproj),
 * spec/serve-protocol.md section 4 (IMAGE) and spec/llama-engine.md "Pictures". The only file that
 * calls mtmd is picture.c.
 *
 * A request with pictures (IMAGE frames, then its SUBMIT or SCORE) marks where each goes in its prompt
 * (SUBMIT) or prefix (SCORE) with mtmd's media marker, "<__media__>". The text up to the end of the last
 * marker is its *prelude*: mtmd_tokenize splits it into text and picture chunks and
 * mtmd_helper_eval_chunk_single evaluates them into the slot's sequence from position 0 (the
 * projector encodes each picture, its embeddings are decoded), as llama.cpp's own multimodal path does.
 * The text after the last marker is tokenized on its own (no BOS), as mtmd_tokenize tokenizes it, and
 * read like any prompt's tokens on top. In the slot's token list the prelude's positions hold
 * PICTURE_TOKEN, which no token id equals: no later prompt reuses them, no snapshot holds them, and a
 * picture request's options are never answered from nor kept in the score cache. */
#ifndef SERVEPROTO_LLAMA_PICTURE_H
#define SERVEPROTO_LLAMA_PICTURE_H

#include <stddef.h>
#include <stdint.h>

#include "ggml.h"

#define PICTURE_MAX   8  /* pictures of one request */
#define PICTURE_TOKEN (-1)

struct engine;
struct mtmd_context;

/* One IMAGE frame's picture: an encoded file (PNG, JPEG, BMP, GIF: what stb_image decodes) when grid_h
 * and grid_w are 0, else grid_h rows of grid_w RGB pixels, 8 bits a channel (3 * grid_h * grid_w bytes). */
typedef struct picture {
    unsigned char *bytes; /* owned */
    size_t len;
    uint32_t grid_h, grid_w;
} picture;

/* The pictures of one request, in the order of their markers. */
typedef struct picture_set {
    uint64_t id; /* the request's id */
    int n;
    picture p[PICTURE_MAX];
} picture_set;

/* A request's prelude, tokenized (picture_prepare), then evaluated (picture_eval). */
typedef struct picture_prelude {
    void *chunks;     /* mtmd_input_chunks, owned */
    int n_pos;        /* its positions: the text before and between the pictures, and the pictures' */
    size_t tail_off;  /* the byte of the text after the last marker */
} picture_prelude;

/* Loads the projector for the engine's model (mtmd_init_from_file) into e->mtmd; log: llama.cpp's log
 * callback for mtmd's messages. Returns 0, or -1 with the reason in err (LOAD_FAIL's detail): the file
 * cannot be read or is no projector, it has no vision encoder, its output width is not the model's
 * embedding width, or it needs M-RoPE positions (the engine's positions are token indices). */
int picture_load(struct engine *e, const char *mmproj, int threads, int use_gpu, ggml_log_callback log, void *log_data,
                 char *err, size_t cap);
void picture_unload(struct engine *e);

/* The marker, "<__media__>". */
const char *picture_marker(void);
/* Occurrences of the marker in text[0..len). */
int picture_markers(const char *text, size_t len);
/* 0 when text[0..len) holds exactly n markers (n: the request's pictures), else -1 with a BAD_REQUEST
 * reason in msg naming field ("prompt", "prefix"). */
int picture_count_check(const char *field, const char *text, size_t len, int n, char *msg, size_t cap);

/* Tokenizes the prelude of text[0..len) (field: the name of that text in errors, "prompt" or "prefix")
 * with the pictures of ps (decoded here). Returns 0, or -1 with a BAD_REQUEST reason in msg, the field
 * first: no marker, markers and pictures in different numbers, bytes that are no picture. */
int picture_prepare(struct engine *e, const picture_set *ps, const char *field, const char *text, size_t len,
                    picture_prelude *out, char *msg, size_t cap);
/* Evaluates the prelude into the slot's sequence from position 0 (its earlier rows dropped), and
 * records PICTURE_TOKEN at its positions. Returns 0, or -1 with the reason in msg (the slot is then
 * empty). */
int picture_eval(struct engine *e, const picture_prelude *pp, int slot, char *msg, size_t cap);
void picture_prelude_free(picture_prelude *pp);

void picture_set_free(picture_set *ps);

#endif
