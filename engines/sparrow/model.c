/* model.c: loads a .spdm file and runs the package's StaticModel forward
 * pass (sparrow_decider/static.py) in its float32 arithmetic (model.h). */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loading ---- */

typedef struct cursor {
    const unsigned char *p, *end;
    int bad;
} cursor;

static const void *take(cursor *c, size_t n)
{
    if (c->bad || (size_t)(c->end - c->p) < n) {
        c->bad = 1;
        return NULL;
    }
    const void *at = c->p;
    c->p += n;
    return at;
}

static uint32_t u32(cursor *c)
{
    uint32_t x = 0;
    const void *at = take(c, 4);
    if (at)
        memcpy(&x, at, 4);
    return x;
}

/* A copy of n bytes of the file (aligned); NULL on a short file or no memory. */
static void *copy(cursor *c, size_t n, int *nomem)
{
    const void *at = take(c, n);
    if (!at)
        return NULL;
    void *p = malloc(n ? n : 1);
    if (!p) {
        *nomem = 1;
        c->bad = 1;
        return NULL;
    }
    memcpy(p, at, n);
    return p;
}

/* rows x cols int8 and a float32 scale per row -> float32 q * scale (the package's _dequant). */
static float *dequant(cursor *c, size_t rows, size_t cols, int *nomem)
{
    int8_t *q = copy(c, rows * cols, nomem);
    float *s = copy(c, rows * sizeof(float), nomem);
    float *out = q && s ? malloc(rows * cols * sizeof(float)) : NULL;
    if (q && s && !out) {
        *nomem = 1;
        c->bad = 1;
    }
    for (size_t i = 0; out && i < rows; i++)
        for (size_t j = 0; j < cols; j++)
            out[i * cols + j] = (float)q[i * cols + j] * s[i];
    free(q);
    free(s);
    return out;
}

static int ranges(cursor *c, spm_ranges *r, int *nomem)
{
    r->n = u32(c);
    if (r->n > 0x110000)
        c->bad = 1;
    r->r = c->bad ? NULL : copy(c, (size_t)r->n * sizeof(spm_range), nomem);
    return r->r ? 0 : -1;
}

static uint64_t fnv(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

int spm_load(spm_model *m, const char *path, const char **kind, char *detail, size_t detail_len)
{
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "rb");
    if (!f) {
        *kind = "io";
        snprintf(detail, detail_len, "cannot open %s", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = size > 0 ? malloc((size_t)size) : NULL;
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        free(buf);
        *kind = buf ? "io" : "nomem";
        snprintf(detail, detail_len, "cannot read %s", path);
        return -1;
    }
    fclose(f);
    cursor c = {buf, buf + size, 0};
    int nomem = 0;
    const void *magic = take(&c, 8);
    if (!magic || memcmp(magic, "SPDMv1\0\0", 8) != 0) {
        free(buf);
        *kind = "format";
        snprintf(detail, detail_len, "%s: not a .spdm file of this layout (SPDMv1)", path);
        return -1;
    }
    m->dim = u32(&c), m->hidden = u32(&c), m->n_vocab = u32(&c), m->max_len = u32(&c);
    m->kv = u32(&c), m->max_pairs = u32(&c), m->unk_id = u32(&c);
    uint32_t name_len = u32(&c);
    const char *name = take(&c, name_len);
    if (name)
        snprintf(m->name, sizeof m->name, "%.*s", (int)name_len, name);
    for (int k = 0; k < 3; k++) {
        const void *t = take(&c, 8);
        if (t)
            memcpy(&m->temperature[k], t, 8);
    }
    if (c.bad || m->dim == 0 || m->dim > SPM_MAX_DIM || m->hidden == 0 || m->hidden > 4096 ||
        m->n_vocab == 0 || m->unk_id >= m->n_vocab || m->max_len == 0 || m->max_pairs > 64) {
        free(buf);
        *kind = "unsupported";
        snprintf(detail, detail_len, "%s: dim %u, hidden %u, vocabulary %u: not a geometry this engine serves",
                 path, m->dim, m->hidden, m->n_vocab);
        return -1;
    }
    size_t D = m->dim, H = m->hidden;
    m->n_feat = m->kv ? 10 : 6;
    m->emb_q = copy(&c, (size_t)m->n_vocab * D, &nomem);
    m->emb_s = copy(&c, (size_t)m->n_vocab * sizeof(float), &nomem);
    m->kind = dequant(&c, 3, D, &nomem);
    m->w0 = dequant(&c, H, m->n_feat * D, &nomem);
    m->b0 = copy(&c, H * sizeof(float), &nomem);
    m->w2 = dequant(&c, H, H, &nomem);
    m->b2 = copy(&c, H * sizeof(float), &nomem);
    m->w4 = dequant(&c, 1, H, &nomem);
    m->b4 = copy(&c, sizeof(float), &nomem);
    if (m->kv) {
        const void *t = take(&c, 4);
        if (t)
            memcpy(&m->tau, t, 4);
        m->g = dequant(&c, D, 4, &nomem);
        m->gb = copy(&c, D * sizeof(float), &nomem);
    }
    m->piece = calloc(m->n_vocab, sizeof *m->piece);
    m->piece_len = calloc(m->n_vocab, sizeof *m->piece_len);
    m->n_slot = 1;
    while (m->n_slot < 2 * (size_t)m->n_vocab)
        m->n_slot <<= 1;
    m->slot = malloc(m->n_slot * sizeof *m->slot);
    if (!m->piece || !m->piece_len || !m->slot)
        nomem = 1, c.bad = 1;
    else
        memset(m->slot, 0xff, m->n_slot * sizeof *m->slot);
    for (uint32_t i = 0; !c.bad && i < m->n_vocab; i++) {
        const unsigned char *l = take(&c, 2);
        uint16_t n = l ? (uint16_t)(l[0] | l[1] << 8) : 0;
        const char *s = take(&c, n);
        if (!s)
            break;
        m->piece[i] = malloc((size_t)n + 1);
        if (!m->piece[i]) {
            nomem = 1, c.bad = 1;
            break;
        }
        memcpy(m->piece[i], s, n);
        m->piece[i][n] = '\0';
        m->piece_len[i] = n;
        size_t h = (size_t)fnv(s, n) & (m->n_slot - 1);
        while (m->slot[h] >= 0)
            h = (h + 1) & (m->n_slot - 1);
        m->slot[h] = (int32_t)i;
    }
    const char *uni = (const char *)c.p;
    size_t uni_len = strnlen(uni, (size_t)(c.end - c.p));
    take(&c, uni_len + 1);
    ranges(&c, &m->drop, &nomem);
    ranges(&c, &m->space, &nomem);
    ranges(&c, &m->cjk, &nomem);
    ranges(&c, &m->isspace, &nomem);
    ranges(&c, &m->punct, &nomem);
    ranges(&c, &m->ignorable, &nomem);
    ranges(&c, &m->cased, &nomem);
    m->n_digit = u32(&c);
    if (m->n_digit > 0x10000)
        c.bad = 1;
    m->digit = c.bad ? NULL : copy(&c, (size_t)m->n_digit * 12, &nomem);
    m->n_map = u32(&c);
    if (m->n_map > 0x110000)
        c.bad = 1;
    const unsigned char *map_at = c.p;
    size_t total = 0;
    for (uint32_t i = 0; !c.bad && i < m->n_map; i++) {
        u32(&c);
        uint32_t n = u32(&c);
        take(&c, (size_t)n * 4);
        total += n;
    }
    if (!c.bad) {
        m->map_cp = malloc(((size_t)m->n_map + 1) * 4);
        m->map_off = malloc(((size_t)m->n_map + 1) * 4);
        m->map_out = malloc((total + 1) * 4);
        if (!m->map_cp || !m->map_off || !m->map_out)
            nomem = 1, c.bad = 1;
    }
    if (!c.bad) {
        cursor mc = {map_at, c.end, 0};
        uint32_t off = 0;
        for (uint32_t i = 0; i < m->n_map; i++) {
            m->map_cp[i] = u32(&mc);
            uint32_t n = u32(&mc);
            m->map_off[i] = off;
            for (uint32_t k = 0; k < n; k++)
                m->map_out[off++] = u32(&mc);
        }
        m->map_off[m->n_map] = off;
    }
    const void *end = take(&c, 8);
    int ok = !c.bad && end && memcmp(end, "SPDMEND\0", 8) == 0 && c.p == c.end;
    if (!ok) {
        *kind = nomem ? "nomem" : "format";
        snprintf(detail, detail_len, "%s: %s", path, nomem ? "out of memory" : "short or corrupt .spdm file");
        free(buf);
        spm_free(m);
        return -1;
    }
    free(buf);
    return 0;
}

void spm_free(spm_model *m)
{
    free(m->emb_q), free(m->emb_s), free(m->kind), free(m->w0), free(m->b0), free(m->w2), free(m->b2);
    free(m->w4), free(m->b4), free(m->g), free(m->gb);
    for (uint32_t i = 0; m->piece && i < m->n_vocab; i++)
        free(m->piece[i]);
    free(m->piece), free(m->piece_len), free(m->slot);
    spm_ranges *rs[] = {&m->drop, &m->space, &m->cjk, &m->isspace, &m->punct, &m->ignorable, &m->cased};
    for (size_t i = 0; i < sizeof rs / sizeof *rs; i++)
        free(rs[i]->r);
    free(m->digit), free(m->map_cp), free(m->map_off), free(m->map_out);
    memset(m, 0, sizeof *m);
}

/* ---- numpy's float32 arithmetic ---- */

/* numpy's pairwise_sum (numpy/_core/src/umath/loops_utils.h.src), which
 * add.reduce over a contiguous last axis runs. */
static float pairwise_sum(const float *a, size_t n, size_t stride)
{
    if (n < 8) {
        float res = -0.0f;
        for (size_t i = 0; i < n; i++)
            res += a[i * stride];
        return res;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; j++)
            r[j] = a[j * stride];
        size_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++)
                r[j] += a[(i + j) * stride];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++)
            res += a[i * stride];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2, stride) + pairwise_sum(a + n2 * stride, n - n2, stride);
}

/* z / max(||z||, 1e-12) in place (the package's _n). */
static void unit(float *z, size_t n)
{
    float sq[SPM_MAX_DIM];
    for (size_t i = 0; i < n; i++)
        sq[i] = z[i] * z[i];
    float norm = sqrtf(pairwise_sum(sq, n, 1));
    if (!(norm > 1e-12f))
        norm = 1e-12f;
    for (size_t i = 0; i < n; i++)
        z[i] = z[i] / norm;
}

/* A matrix-vector product row . x, summed in double, rounded once. */
static float dot(const float *row, const float *x, size_t n)
{
    double acc = 0.0;
    for (size_t i = 0; i < n; i++)
        acc += (double)row[i] * (double)x[i];
    return (float)acc;
}

/* The package's gelu with its Abramowitz-Stegun 7.1.26 erf (engine.py), in float32. */
static float gelu(float x)
{
    float u = x / 1.41421356237309515f;
    float s = u > 0.0f ? 1.0f : u < 0.0f ? -1.0f : 0.0f;
    float a = fabsf(u);
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f);
    float y = 1.0f - poly * t * expf(-a * a);
    return 0.5f * x * (1.0f + s * y);
}

/* softmax over n values in place (engine.py's softmax): x - max, exp, / pairwise sum. */
static void softmax(float *x, size_t n)
{
    float m = x[0];
    for (size_t i = 1; i < n; i++)
        if (x[i] > m)
            m = x[i];
    for (size_t i = 0; i < n; i++)
        x[i] = expf(x[i] - m);
    float sum = pairwise_sum(x, n, 1);
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] / sum;
}

/* The mean of the embedding rows of ids (the package's _pool: [0] when empty), not normalised. */
static void pool_ids(const spm_model *m, const int32_t *ids, size_t n, float *out)
{
    static const int32_t pad = 0;
    if (n == 0)
        ids = &pad, n = 1;
    size_t D = m->dim;
    for (size_t i = 0; i < n; i++) {
        const int8_t *q = m->emb_q + (size_t)ids[i] * D;
        float s = m->emb_s[ids[i]];
        for (size_t j = 0; j < D; j++) {
            float v = (float)q[j] * s;
            out[j] = i ? out[j] + v : v;
        }
    }
    for (size_t j = 0; j < D; j++)
        out[j] = out[j] / (float)n;
}

/* Tokenizes and pools text; *tokens += the ids read. */
static int pool_text(const spm_model *m, const char *text, size_t len, float *out, uint64_t *tokens,
                     uint64_t *dropped)
{
    int32_t *ids = malloc((size_t)m->max_len * sizeof *ids);
    if (!ids)
        return -1;
    size_t total = 0;
    long n = spm_encode(m, text, len, ids, &total);
    if (n < 0) {
        free(ids);
        return -1;
    }
    pool_ids(m, ids, (size_t)n, out);
    free(ids);
    if (tokens)
        *tokens += (uint64_t)n;
    if (dropped)
        *dropped += total - (uint64_t)n;
    return 0;
}

/* value_features(v) of static.py, rounded to float32 as np.array(..., np.float32) does. */
static void value_features(double v, float out[4])
{
    double a = fabs(v);
    out[0] = (float)fmax(-1.0, fmin(1.0, v / 100.0));
    out[1] = (float)(copysign(log1p(a), v) / 5.0);
    out[2] = (float)(0 < a && a < 1 ? 1.0 : 0.0);
    out[3] = (float)fmax(-1.0, fmin(1.0, v / 10.0));
}

int spm_state_read(const spm_model *m, const char *content, size_t len, spm_state *st)
{
    memset(st, 0, sizeof *st);
    if (pool_text(m, content, len, st->s, &st->tokens, &st->dropped) < 0)
        return -1;
    unit(st->s, m->dim);
    if (!m->kv)
        return 0;
    spm_pair pairs[64];
    int P = spm_kv_pairs(m, content, len, pairs, (int)m->max_pairs);
    if (P < 0)
        return -1;
    st->n_pairs = P;
    if (P == 0)
        return 0;
    size_t D = m->dim;
    st->ek = malloc((size_t)P * D * sizeof(float));
    st->el = malloc((size_t)P * D * sizeof(float));
    st->pv = malloc((size_t)P * D * sizeof(float));
    if (!st->ek || !st->el || !st->pv)
        return -1;
    for (int p = 0; p < P; p++) {
        float *ek = st->ek + (size_t)p * D, *el = st->el + (size_t)p * D, *pv = st->pv + (size_t)p * D;
        if (pool_text(m, content + pairs[p].key, pairs[p].key_len, ek, NULL, NULL) < 0 ||
            pool_text(m, content + pairs[p].label, pairs[p].label_len, el, NULL, NULL) < 0)
            return -1;
        unit(ek, D);
        unit(el, D);
        float vf[4];
        value_features(pairs[p].value, vf);
        for (size_t j = 0; j < D; j++) {
            float g = tanhf(dot(m->g + j * 4, vf, 4) + m->gb[j]);
            pv[j] = ek[j] * g;
        }
    }
    for (size_t j = 0; j < D; j++) {
        float acc = st->pv[j];
        for (int p = 1; p < P; p++)
            acc += st->pv[(size_t)p * D + j];
        st->kvm[j] = acc / (float)P;
    }
    return 0;
}

void spm_state_free(spm_state *st)
{
    free(st->ek), free(st->el), free(st->pv);
    st->ek = st->el = st->pv = NULL;
}

int spm_question(const spm_model *m, const spm_state *st, int kind, const char *instr, size_t instr_len,
                 const spm_option *opts, size_t K, float *logits, float *probs, uint64_t *tokens)
{
    size_t D = m->dim, H = m->hidden, F = m->n_feat * D;
    float q[SPM_MAX_DIM], om[SPM_MAX_DIM];
    float *o = malloc(K * D * sizeof(float)), *f = malloc(F * sizeof(float));
    float *h1 = malloc(H * sizeof(float)), *h2 = malloc(H * sizeof(float));
    float *kvo = m->kv ? calloc(K * D, sizeof(float)) : NULL;
    char *text = NULL;
    int rc = -1;
    if (!o || !f || !h1 || !h2 || (m->kv && !kvo))
        goto done;
    if (pool_text(m, instr, instr_len, q, tokens, NULL) < 0)
        goto done;
    for (size_t j = 0; j < D; j++)
        q[j] = q[j] + m->kind[(size_t)kind * D + j];
    unit(q, D);
    for (size_t k = 0; k < K; k++) {
        /* f"{name} {desc or ''}" */
        size_t n = opts[k].label_len + 1 + opts[k].text_len;
        char *t = realloc(text, n + 1);
        if (!t)
            goto done;
        text = t;
        memcpy(text, opts[k].label, opts[k].label_len);
        text[opts[k].label_len] = ' ';
        memcpy(text + opts[k].label_len + 1, opts[k].text, opts[k].text_len);
        if (pool_text(m, text, n, o + k * D, tokens, NULL) < 0)
            goto done;
        unit(o + k * D, D);
    }
    for (size_t j = 0; j < D; j++) {
        float acc = o[j];
        for (size_t k = 1; k < K; k++)
            acc += o[k * D + j];
        om[j] = acc / (float)K;
    }
    if (m->kv && st->n_pairs > 0) {
        size_t P = (size_t)st->n_pairs;
        float att[64];
        for (size_t k = 0; k < K; k++) {
            for (size_t p = 0; p < P; p++)
                att[p] = m->tau * dot(o + k * D, st->el + p * D, D);
            softmax(att, P);
            for (size_t j = 0; j < D; j++) {
                double acc = 0.0;
                for (size_t p = 0; p < P; p++)
                    acc += (double)att[p] * (double)st->pv[p * D + j];
                kvo[k * D + j] = (float)acc;
            }
        }
    }
    const float *s = st->s;
    float zero[SPM_MAX_DIM] = {0};
    const float *kvm = m->kv && st->n_pairs > 0 ? st->kvm : zero;
    for (size_t k = 0; k < K; k++) {
        const float *ok = o + k * D;
        for (size_t j = 0; j < D; j++) {
            f[j] = ok[j];
            f[D + j] = s[j] * ok[j];
            f[2 * D + j] = q[j] * ok[j];
            f[3 * D + j] = s[j] * q[j] * ok[j];
            f[4 * D + j] = ok[j] - om[j];
            f[5 * D + j] = (s[j] - om[j]) * ok[j];
            if (m->kv) {
                const float *kv = kvo + k * D;
                f[6 * D + j] = kvm[j] * ok[j];
                f[7 * D + j] = kvm[j] * q[j] * ok[j];
                f[8 * D + j] = kv[j];
                f[9 * D + j] = kv[j] * q[j];
            }
        }
        for (size_t i = 0; i < H; i++)
            h1[i] = gelu(dot(m->w0 + i * F, f, F) + m->b0[i]);
        for (size_t i = 0; i < H; i++)
            h2[i] = gelu(dot(m->w2 + i * H, h1, H) + m->b2[i]);
        logits[k] = dot(m->w4, h2, H) + m->b4[0];
    }
    float t = (float)m->temperature[kind];
    for (size_t k = 0; k < K; k++)
        probs[k] = logits[k] / t;
    softmax(probs, K);
    rc = 0;
done:
    free(o), free(f), free(h1), free(h2), free(kvo), free(text);
    return rc;
}
