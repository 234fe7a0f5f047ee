/* text.c: the package's text handling, codepoint for codepoint
 * (sparrow_decider/wordpiece.py and static.py): BertNormalizer (controls
 * dropped, whitespace made spaces, CJK ideographs spaced, lowercase with
 * Python's final sigma, NFD, nonspacing marks dropped), BertPreTokenizer
 * (whitespace and punctuation), greedy longest-match WordPiece, and
 * kv_pairs()' regular expression. The Unicode classes come from the model
 * file (model.h), computed from the converting interpreter's unicodedata. */
#include "model.h"

#include <stdlib.h>
#include <string.h>

static int in(const spm_ranges *r, uint32_t cp)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r->r[mid].lo)
            hi = mid;
        else if (cp > r->r[mid].hi)
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

/* Decodes one UTF-8 sequence at s[*i] (the JSON reader let only valid UTF-8 through). */
static uint32_t next_cp(const char *s, size_t len, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s + *i;
    size_t left = len - *i;
    uint32_t cp;
    size_t n;
    if (u[0] < 0x80)
        cp = u[0], n = 1;
    else if ((u[0] & 0xe0) == 0xc0 && left >= 2)
        cp = (uint32_t)(u[0] & 0x1f) << 6 | (u[1] & 0x3f), n = 2;
    else if ((u[0] & 0xf0) == 0xe0 && left >= 3)
        cp = (uint32_t)(u[0] & 0x0f) << 12 | (uint32_t)(u[1] & 0x3f) << 6 | (u[2] & 0x3f), n = 3;
    else if ((u[0] & 0xf8) == 0xf0 && left >= 4)
        cp = (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3f) << 12 | (uint32_t)(u[2] & 0x3f) << 6 |
             (u[3] & 0x3f),
        n = 4;
    else
        cp = 0xfffd, n = 1;
    *i += n;
    return cp;
}

static size_t put_utf8(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3f)), out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f)), out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* The normalised form of cp (not dropped, not a space): its map entry, or itself. */
static const uint32_t *mapped(const spm_model *m, uint32_t cp, uint32_t *n, uint32_t *self)
{
    size_t lo = 0, hi = m->n_map;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->map_cp[mid] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < m->n_map && m->map_cp[lo] == cp) {
        *n = m->map_off[lo + 1] - m->map_off[lo];
        return m->map_out + m->map_off[lo];
    }
    *self = cp;
    *n = 1;
    return self;
}

/* CPython's handle_capital_sigma over the filtered codepoints f[0..n) at i. */
static uint32_t sigma(const spm_model *m, const uint32_t *f, size_t n, size_t i)
{
    size_t j = i;
    while (j > 0 && in(&m->ignorable, f[j - 1]))
        j--;
    int final = j > 0 && in(&m->cased, f[j - 1]);
    if (final) {
        j = i + 1;
        while (j < n && in(&m->ignorable, f[j]))
            j++;
        final = j == n || !in(&m->cased, f[j]);
    }
    return final ? 0x3c2 : 0x3c3;
}

/* WordPiece.normalize: text -> codepoints (malloc'd, *n of them). */
static uint32_t *normalize(const spm_model *m, const char *text, size_t len, size_t *n_out)
{
    uint32_t *f = malloc((3 * len + 1) * sizeof *f);
    if (!f)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp = next_cp(text, len, &i);
        if (in(&m->drop, cp))
            continue;
        if (in(&m->space, cp)) {
            f[n++] = ' ';
        } else if (in(&m->cjk, cp)) {
            f[n++] = ' ', f[n++] = cp, f[n++] = ' ';
        } else {
            f[n++] = cp;
        }
    }
    size_t cap = n + 16, k = 0;
    uint32_t *out = malloc(cap * sizeof *out);
    for (size_t i = 0; out && i < n; i++) {
        uint32_t cnt, self, sg;
        const uint32_t *mp;
        if (f[i] == 0x3a3) {
            sg = sigma(m, f, n, i);
            mp = &sg, cnt = 1;
        } else {
            mp = mapped(m, f[i], &cnt, &self);
        }
        if (k + cnt > cap) {
            cap = 2 * (k + cnt);
            uint32_t *grown = realloc(out, cap * sizeof *out);
            if (!grown) {
                free(out);
                out = NULL;
                break;
            }
            out = grown;
        }
        memcpy(out + k, mp, cnt * sizeof *out);
        k += cnt;
    }
    free(f);
    *n_out = k;
    return out;
}

static int32_t lookup(const spm_model *m, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    for (size_t at = (size_t)h & (m->n_slot - 1);; at = (at + 1) & (m->n_slot - 1)) {
        int32_t id = m->slot[at];
        if (id < 0)
            return -1;
        if (m->piece_len[id] == n && memcmp(m->piece[id], s, n) == 0)
            return id;
    }
}

/* WordPiece._wp of one word (cps[0..n)): ids appended to out; returns how many. */
static size_t wordpiece(const spm_model *m, const uint32_t *cps, size_t n, int32_t *out)
{
    if (n > SPM_MAX_WORD) {
        out[0] = (int32_t)m->unk_id;
        return 1;
    }
    char buf[2 + SPM_MAX_WORD * 4];
    size_t off[SPM_MAX_WORD + 1];
    off[0] = 0;
    char word[SPM_MAX_WORD * 4];
    for (size_t i = 0; i < n; i++)
        off[i + 1] = off[i] + put_utf8(cps[i], word + off[i]);
    size_t k = 0, start = 0;
    while (start < n) {
        int32_t cur = -1;
        size_t end = n;
        for (; start < end; end--) {
            size_t p = 0;
            if (start > 0)
                buf[p++] = '#', buf[p++] = '#';
            memcpy(buf + p, word + off[start], off[end] - off[start]);
            p += off[end] - off[start];
            cur = lookup(m, buf, p);
            if (cur >= 0)
                break;
        }
        if (cur < 0) {
            out[0] = (int32_t)m->unk_id;
            return 1;
        }
        out[k++] = cur;
        start = end;
    }
    return k;
}

long spm_encode(const spm_model *m, const char *text, size_t len, int32_t *ids, size_t *n_total)
{
    size_t n;
    uint32_t *cps = normalize(m, text, len, &n);
    if (!cps)
        return -1;
    size_t kept = 0, total = 0;
    int32_t piece[SPM_MAX_WORD];
    int full = 0;
    for (size_t i = 0; i < n;) {
        if (in(&m->isspace, cps[i])) {
            i++;
            continue;
        }
        size_t j = i + 1;
        if (!in(&m->punct, cps[i]))
            while (j < n && !in(&m->isspace, cps[j]) && !in(&m->punct, cps[j]))
                j++;
        size_t c = wordpiece(m, cps + i, j - i, piece);
        total += c;
        /* the package stops after the word that reaches max_len and cuts there */
        for (size_t k = 0; k < c && !full; k++)
            if (kept < m->max_len)
                ids[kept++] = piece[k];
        if (kept >= m->max_len)
            full = 1;
        if (full && !n_total)
            break;
        i = j;
    }
    free(cps);
    if (n_total)
        *n_total = total;
    return (long)kept;
}

/* ---- static.py's text helpers ---- */

static int is_space(const spm_model *m, uint32_t cp)
{
    return in(&m->isspace, cp);
}

void spm_strip(const spm_model *m, const char **text, size_t *len)
{
    const char *s = *text;
    size_t a = 0, b = *len;
    while (a < b) {
        size_t i = a;
        if (!is_space(m, next_cp(s, b, &i)))
            break;
        a = i;
    }
    while (b > a) {
        size_t start = b - 1;
        while (start > a && ((unsigned char)s[start] & 0xc0) == 0x80)
            start--;
        size_t i = start;
        if (!is_space(m, next_cp(s, b, &i)))
            break;
        b = start;
    }
    *text = s + a;
    *len = b - a;
}

/* A line boundary of str.splitlines: its length in bytes at s[i] (\r\n is one), or 0. */
static size_t line_break(const char *s, size_t len, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    if (c == '\r')
        return i + 1 < len && s[i + 1] == '\n' ? 2 : 1;
    if (c == '\n' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e)
        return 1;
    if (c == 0xc2 && i + 1 < len && (unsigned char)s[i + 1] == 0x85)
        return 2;
    if (c == 0xe2 && i + 2 < len && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xa8 || (unsigned char)s[i + 2] == 0xa9))
        return 3;
    return 0;
}

static int key_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == ' ' ||
           c == '.' || c == '-';
}

static int alpha(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

/* The value of a decimal digit (Python's \d), or -1. */
static int digit_at(const spm_model *m, const char *s, size_t len, size_t *i)
{
    if (*i >= len)
        return -1;
    size_t j = *i;
    uint32_t cp = next_cp(s, len, &j);
    for (uint32_t k = 0; k < m->n_digit; k++) {
        const uint32_t *d = m->digit + 3 * k;
        if (cp >= d[0] && cp <= d[1]) {
            *i = j;
            return (int)((d[2] + cp - d[0]) % 10);
        }
    }
    return -1;
}

static size_t skip_space(const spm_model *m, const char *s, size_t len, size_t i)
{
    while (i < len) {
        size_t j = i;
        if (!is_space(m, next_cp(s, len, &j)))
            break;
        i = j;
    }
    return i;
}

/* From just past a key at i: \s*[:=]\s*(-?\d+(?:\.\d+)?)\s*(%?); *end past it, *value. 0: no match. */
static int kv_rest(const spm_model *m, const char *s, size_t len, size_t i, size_t *end, double *value)
{
    i = skip_space(m, s, len, i);
    if (i >= len || (s[i] != ':' && s[i] != '='))
        return 0;
    i = skip_space(m, s, len, i + 1);
    char num[256];
    size_t k = 0;
    if (i < len && s[i] == '-')
        num[k++] = '-', i++;
    int d, digits = 0;
    while ((d = digit_at(m, s, len, &i)) >= 0) {
        if (k < sizeof num - 2)
            num[k++] = (char)('0' + d);
        digits++;
    }
    if (!digits)
        return 0;
    if (i + 1 < len && s[i] == '.') {
        size_t j = i + 1;
        if ((d = digit_at(m, s, len, &j)) >= 0) {
            num[k++] = '.';
            num[k++] = (char)('0' + d);
            while ((d = digit_at(m, s, len, &j)) >= 0)
                if (k < sizeof num - 1)
                    num[k++] = (char)('0' + d);
            i = j;
        }
    }
    num[k] = '\0';
    *value = strtod(num, NULL);
    i = skip_space(m, s, len, i);
    if (i < len && s[i] == '%')
        i++;
    *end = i;
    return 1;
}

int spm_kv_pairs(const spm_model *m, const char *s, size_t len, spm_pair *out, int max)
{
    int n = 0;
    size_t line = 0;
    while (line < len && n < max) {
        size_t eol = line, br = 0;
        while (eol < len && !(br = line_break(s, len, eol)))
            eol++;
        /* the line's label: the text before its first ':', stripped */
        const char *head = s + line;
        size_t head_len = 0;
        while (line + head_len < eol && s[line + head_len] != ':')
            head_len++;
        spm_strip(m, &head, &head_len);
        for (size_t p = line; p < eol && n < max;) {
            int hit = 0;
            if (alpha(s[p])) {
                for (size_t k = 0; k <= 40 && p + 1 + k <= eol; k++) {
                    if (k > 0 && !key_char(s[p + k]))
                        break;
                    size_t end;
                    double v;
                    if (kv_rest(m, s, eol, p + 1 + k, &end, &v)) {
                        size_t ks = p, kl = 1 + k;
                        while (kl > 0 && s[ks + kl - 1] == ' ')
                            kl--;
                        out[n].key = ks, out[n].key_len = kl, out[n].value = v;
                        if (head_len > 0 && !(head_len == kl && memcmp(head, s + ks, kl) == 0))
                            out[n].label = (size_t)(head - s), out[n].label_len = head_len;
                        else
                            out[n].label = ks, out[n].label_len = kl;
                        n++;
                        p = end;
                        hit = 1;
                        break;
                    }
                }
            }
            if (!hit) {
                size_t j = p;
                next_cp(s, eol, &j);
                p = j;
            }
        }
        line = eol + br;
    }
    return n;
}

char *spm_indent2(const char *c, size_t len, size_t *out_len)
{
    size_t cap = 2 * len + 64, k = 0;
    char *out = malloc(cap);
    int depth = 0, str = 0;
    for (size_t i = 0; out && i < len; i++) {
        if (cap - k < (size_t)(2 * depth + 8)) {
            cap = 2 * cap + (size_t)(2 * depth + 8);
            char *grown = realloc(out, cap);
            if (!grown) {
                free(out);
                return NULL;
            }
            out = grown;
        }
        char ch = c[i];
        if (str) {
            out[k++] = ch;
            if (ch == '\\')
                out[k++] = c[++i];
            else if (ch == '"')
                str = 0;
            continue;
        }
        if (ch == '"') {
            str = 1;
            out[k++] = ch;
        } else if (ch == '{' || ch == '[') {
            out[k++] = ch;
            if (i + 1 < len && (c[i + 1] == '}' || c[i + 1] == ']')) {
                out[k++] = c[++i];
                continue;
            }
            depth++;
            out[k++] = '\n';
            for (int d = 0; d < 2 * depth; d++)
                out[k++] = ' ';
        } else if (ch == '}' || ch == ']') {
            depth--;
            out[k++] = '\n';
            for (int d = 0; d < 2 * depth; d++)
                out[k++] = ' ';
            out[k++] = ch;
        } else if (ch == ',') {
            out[k++] = ',';
            out[k++] = '\n';
            for (int d = 0; d < 2 * depth; d++)
                out[k++] = ' ';
        } else if (ch == ':') {
            out[k++] = ':';
            out[k++] = ' ';
        } else if (ch != ' ' && ch != '\n' && ch != '\t' && ch != '\r') {
            out[k++] = ch;
        }
    }
    if (out) {
        out[k] = '\0';
        *out_len = k;
    }
    return out;
}
