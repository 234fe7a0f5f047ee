/* model.h: a static-embedding decision model of sparrow-decider (its
 * static.py): the .spdm file gateway/engine/sparrow_model.py converts
 * (spec/sparrow-engine.md, "Model file"), its tokenizer (text.c: the
 * package's BERT uncased WordPiece and key-value reader) and its forward pass
 * (model.c: mean pooling, the features, the MLP, the temperature).
 *
 * Arithmetic: float32 wherever the package's numpy is float32, each
 * element-wise operation and each reduction in numpy's own order (an axis-0
 * mean row by row; a last-axis sum pairwise, as numpy's pairwise_sum); the
 * matrix products accumulate in double and round once to float32 (numpy's
 * OpenBLAS sums in an order of its kernels': the one place the digits differ).
 * Build with -ffp-contract=off so every float operation stays as written.
 */
#ifndef SERVEPROTO_SPARROW_MODEL_H
#define SERVEPROTO_SPARROW_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define SPM_MAX_DIM      1024
#define SPM_MAX_FEATURES 10  /* blocks of dim features per option: 6, or 10 with kv */
#define SPM_MAX_WORD     100 /* a longer word is [UNK] (the package's max_chars) */

typedef struct spm_range {
    uint32_t lo, hi; /* inclusive */
} spm_range;

typedef struct spm_ranges {
    uint32_t n;
    spm_range *r;
} spm_ranges;

typedef struct spm_model {
    uint32_t dim, hidden, n_vocab, max_len, kv, max_pairs, unk_id;
    char name[128];
    double temperature[3]; /* noul, choice, score: temperature_by_kind */
    /* weights, dequantised as the package does (float32 q8 * scale) */
    int8_t *emb_q;   /* n_vocab x dim, dequantised per row on lookup */
    float *emb_s;    /* n_vocab */
    float *kind;     /* 3 x dim */
    float *w0, *b0;  /* hidden x (n_feat*dim), hidden */
    float *w2, *b2;  /* hidden x hidden */
    float *w4, *b4;  /* 1 x hidden, 1 */
    float tau;       /* kv: the attention's scale */
    float *g, *gb;   /* kv: dim x 4, dim */
    uint32_t n_feat; /* 6, or 10 with kv */
    /* vocabulary: pieces by id, and an open-addressing table of ids by piece */
    char **piece;
    uint16_t *piece_len;
    int32_t *slot;   /* hash slots: id, or -1 */
    size_t n_slot;
    /* Unicode tables (sparrow_model.py, _unicode_tables) */
    spm_ranges drop, space, cjk, isspace, punct, ignorable, cased;
    uint32_t n_digit;
    uint32_t *digit;   /* n_digit x (lo, hi, value of lo) */
    uint32_t n_map;
    uint32_t *map_cp;  /* sorted codepoints whose normalised form is not themselves */
    uint32_t *map_off; /* n_map + 1 offsets into map_out */
    uint32_t *map_out;
} spm_model;

/* Loads path. Returns 0, or -1 with kind ("io", "format", "nomem") and a
 * detail for LOAD_FAIL. */
int spm_load(spm_model *m, const char *path, const char **kind, char *detail, size_t detail_len);
void spm_free(spm_model *m);

/* ---- text.c ---- */

/* WordPiece.encode(text, max_len) of the package: at most m->max_len ids
 * into ids (room for max_len); *n_total (may be NULL) gets the ids the
 * whole text makes (more than returned when it was cut). Returns the count
 * kept, or -1 when out of memory. text is valid UTF-8. */
long spm_encode(const spm_model *m, const char *text, size_t len, int32_t *ids, size_t *n_total);

/* One key-value pair of kv_pairs(): byte spans of the content text. */
typedef struct spm_pair {
    size_t key, key_len, label, label_len;
    double value;
} spm_pair;

/* kv_pairs(text, max_pairs) of the package (static.py). Returns the count
 * (at most max), or -1 when out of memory. */
int spm_kv_pairs(const spm_model *m, const char *text, size_t len, spm_pair *out, int max);

/* _content(): the span of text without Python's str.strip() whitespace. */
void spm_strip(const spm_model *m, const char **text, size_t *len);

/* json.dumps(value, indent=2, ensure_ascii=False) of the value whose
 * json.dumps(..., separators=(",", ":")) is compact[0..len): only the
 * whitespace between tokens changes. malloc'd, NUL-terminated; NULL when out
 * of memory. */
char *spm_indent2(const char *compact, size_t len, size_t *out_len);

/* ---- model.c ---- */

/* One option as the package pools it: f"{label} {text}". */
typedef struct spm_option {
    const char *label, *text;
    size_t label_len, text_len;
} spm_option;

/* The state's part of every question: its pooled vector and its pairs. */
typedef struct spm_state {
    float s[SPM_MAX_DIM];     /* the normalised mean embedding */
    int n_pairs;
    float *ek, *el, *pv;      /* n_pairs x dim: keys, labels (normalised), emb(key) * g(value) */
    float kvm[SPM_MAX_DIM];   /* pv.mean(0) */
    uint64_t tokens, dropped; /* state tokens read, and cut past max_len */
} spm_state;

/* Pools the state's content text (already stripped / indented) once per
 * request. Returns 0, or -1 when out of memory. */
int spm_state_read(const spm_model *m, const char *content, size_t len, spm_state *st);
void spm_state_free(spm_state *st);

/* One question: logits (n_options, before the temperature) and probs
 * (softmax of logits / temperature, float32 as the package's). kind is
 * 0 noul, 1 choice, 2 score. *tokens gets the tokens read for the
 * instructions and options. Returns 0, or -1 when out of memory. */
int spm_question(const spm_model *m, const spm_state *st, int kind, const char *instr, size_t instr_len,
                 const spm_option *opts, size_t n_options, float *logits, float *probs, uint64_t *tokens);

#endif
