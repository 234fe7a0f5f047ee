/* json.c: a small strict JSON reader. See json.h. */
#include "json.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
    const unsigned char *s;
    size_t n, i;
    char *err;
} parser;

static int fail(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(parser *p, const char *fmt, ...)
{
    if (p->err[0])
        return -1;
    int k = snprintf(p->err, SPJ_ERR_MAX, "byte %zu: ", p->i);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && k < SPJ_ERR_MAX)
        vsnprintf(p->err + k, SPJ_ERR_MAX - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static void skip_ws(parser *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n'
                           || p->s[p->i] == '\r'))
        p->i++;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else
        return 0;
    if (n < len)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return len;
}

static int put_utf8(char *out, size_t *o, uint32_t cp)
{
    if (cp < 0x80) {
        out[(*o)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*o)++] = (char)(0xC0 | (cp >> 6));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*o)++] = (char)(0xE0 | (cp >> 12));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*o)++] = (char)(0xF0 | (cp >> 18));
        out[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    }
    return 0;
}

static int hex4(parser *p, uint32_t *out)
{
    if (p->n - p->i < 4)
        return fail(p, "short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned c = p->s[p->i + (size_t)k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else
            return fail(p, "bad \\u escape");
    }
    p->i += 4;
    *out = v;
    return 0;
}

/* Reads a string at p->i (the opening quote); the unescaped text is at most
 * as long as the escaped one, so one allocation of that size suffices. */
static int parse_string(parser *p, char **out, size_t *out_len)
{
    p->i++; /* the quote */
    size_t start = p->i, end = start;
    while (end < p->n && p->s[end] != '"') {
        if (p->s[end] == '\\')
            end++;
        end++;
    }
    if (end >= p->n)
        return fail(p, "unterminated string");
    char *buf = malloc(end - start + 1);
    if (!buf)
        return fail(p, "out of memory");
    size_t o = 0;
    while (p->i < end) {
        unsigned c = p->s[p->i];
        if (c < 0x20) {
            free(buf);
            return fail(p, "control byte 0x%02x in a string", c);
        }
        if (c == '\\') {
            p->i++;
            unsigned e = p->s[p->i++];
            switch (e) {
            case '"': buf[o++] = '"'; break;
            case '\\': buf[o++] = '\\'; break;
            case '/': buf[o++] = '/'; break;
            case 'b': buf[o++] = '\b'; break;
            case 'f': buf[o++] = '\f'; break;
            case 'n': buf[o++] = '\n'; break;
            case 'r': buf[o++] = '\r'; break;
            case 't': buf[o++] = '\t'; break;
            case 'u': {
                uint32_t cp, lo;
                if (hex4(p, &cp) < 0) {
                    free(buf);
                    return -1;
                }
                if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    free(buf);
                    return fail(p, "lone low surrogate");
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (p->i + 2 > end || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                        free(buf);
                        return fail(p, "lone high surrogate");
                    }
                    p->i += 2;
                    if (hex4(p, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF) {
                        free(buf);
                        return fail(p, "bad low surrogate");
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                put_utf8(buf, &o, cp);
                break;
            }
            default:
                free(buf);
                return fail(p, "bad escape");
            }
            continue;
        }
        size_t k = utf8_len(p->s + p->i, end - p->i);
        if (k == 0) {
            free(buf);
            return fail(p, "invalid UTF-8");
        }
        memcpy(buf + o, p->s + p->i, k);
        o += k;
        p->i += k;
    }
    p->i = end + 1;
    buf[o] = '\0';
    *out = buf;
    *out_len = o;
    return 0;
}

/* Skips a run of decimal digits; returns how many there were. */
static size_t skip_digits(parser *p)
{
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++;
    return p->i - start;
}

static int parse_number(parser *p, double *out)
{
    size_t start = p->i;
    if (p->i < p->n && p->s[p->i] == '-')
        p->i++;
    if (p->i < p->n && p->s[p->i] == '0')
        p->i++;
    else if (p->i < p->n && p->s[p->i] >= '1' && p->s[p->i] <= '9')
        skip_digits(p);
    else
        return fail(p, "bad number");
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (skip_digits(p) == 0)
            return fail(p, "bad number");
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        if (skip_digits(p) == 0)
            return fail(p, "bad number");
    }
    size_t len = p->i - start;
    char tmp[352];
    if (len >= sizeof tmp)
        return fail(p, "number too long");
    memcpy(tmp, p->s + start, len);
    tmp[len] = '\0';
    *out = strtod(tmp, NULL);
    return 0;
}

static int parse_value(parser *p, spj_value *v, int depth);

/* Appends a zeroed item to v's items (and a key slot for objects). */
static spj_value *grow(parser *p, spj_value *v, size_t *cap)
{
    if (v->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        spj_value *items = realloc(v->items, nc * sizeof *items);
        if (!items) {
            fail(p, "out of memory");
            return NULL;
        }
        v->items = items;
        if (v->type == SPJ_OBJECT) {
            char **keys = realloc(v->keys, nc * sizeof *keys);
            if (keys)
                v->keys = keys;
            size_t *kl = keys ? realloc(v->key_lens, nc * sizeof *kl) : NULL;
            if (kl)
                v->key_lens = kl;
            if (!keys || !kl) {
                fail(p, "out of memory");
                return NULL;
            }
        }
        *cap = nc;
    }
    spj_value *it = &v->items[v->n];
    memset(it, 0, sizeof *it);
    if (v->type == SPJ_OBJECT) {
        v->keys[v->n] = NULL;
        v->key_lens[v->n] = 0;
    }
    v->n++;
    return it;
}

static int same_key(const spj_value *v, size_t a, size_t b)
{
    return v->key_lens[a] == v->key_lens[b] && memcmp(v->keys[a], v->keys[b], v->key_lens[a]) == 0;
}

/* Refuses an object with a key twice, in O(n) expected time (an open
 * addressing table of key indices), so a hostile record with many keys
 * costs no more than reading it. */
static int check_duplicates(parser *p, const spj_value *v)
{
    if (v->n < 2)
        return 0;
    size_t cap = 4;
    while (cap < 2 * v->n)
        cap *= 2;
    size_t *table = malloc(cap * sizeof *table);
    if (!table)
        return fail(p, "out of memory");
    for (size_t i = 0; i < cap; i++)
        table[i] = SIZE_MAX;
    for (size_t k = 0; k < v->n; k++) {
        uint64_t h = 0xcbf29ce484222325ULL;
        for (size_t i = 0; i < v->key_lens[k]; i++)
            h = (h ^ (unsigned char)v->keys[k][i]) * 0x100000001b3ULL;
        size_t slot = (size_t)h & (cap - 1);
        while (table[slot] != SIZE_MAX) {
            if (same_key(v, table[slot], k)) {
                free(table);
                return fail(p, "duplicate key \"%.40s\"", v->keys[k]);
            }
            slot = (slot + 1) & (cap - 1);
        }
        table[slot] = k;
    }
    free(table);
    return 0;
}

static int parse_container(parser *p, spj_value *v, int depth)
{
    int obj = p->s[p->i] == '{';
    char close = obj ? '}' : ']';
    v->type = obj ? SPJ_OBJECT : SPJ_ARRAY;
    if (depth >= SPJ_MAX_DEPTH)
        return fail(p, "nested deeper than %d", SPJ_MAX_DEPTH);
    p->i++;
    size_t cap = 0;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return 0;
    }
    for (;;) {
        skip_ws(p);
        char *key = NULL;
        size_t key_len = 0;
        if (obj) {
            if (p->i >= p->n || p->s[p->i] != '"')
                return fail(p, "expected a string key");
            if (parse_string(p, &key, &key_len) < 0)
                return -1;
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                return fail(p, "expected ':'");
            }
            p->i++;
        }
        spj_value *it = grow(p, v, &cap);
        if (!it) {
            free(key);
            return -1;
        }
        if (obj) {
            v->keys[v->n - 1] = key;
            v->key_lens[v->n - 1] = key_len;
        }
        if (parse_value(p, it, depth + 1) < 0)
            return -1;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            return obj ? check_duplicates(p, v) : 0;
        }
        return fail(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int literal(parser *p, const char *lit)
{
    size_t k = strlen(lit);
    if (p->n - p->i < k || memcmp(p->s + p->i, lit, k) != 0)
        return fail(p, "unexpected byte");
    p->i += k;
    return 0;
}

static int parse_value(parser *p, spj_value *v, int depth)
{
    skip_ws(p);
    if (p->i >= p->n)
        return fail(p, "unexpected end");
    switch (p->s[p->i]) {
    case '{':
    case '[':
        return parse_container(p, v, depth);
    case '"':
        v->type = SPJ_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't':
        v->type = SPJ_BOOL;
        v->boolean = 1;
        return literal(p, "true");
    case 'f':
        v->type = SPJ_BOOL;
        return literal(p, "false");
    case 'n':
        return literal(p, "null");
    default:
        v->type = SPJ_NUMBER;
        return parse_number(p, &v->number);
    }
}

int spj_parse(const char *text, size_t len, spj_value *out, char err[SPJ_ERR_MAX])
{
    parser p = {(const unsigned char *)text, len, 0, err};
    err[0] = '\0';
    memset(out, 0, sizeof *out);
    if (parse_value(&p, out, 0) == 0) {
        skip_ws(&p);
        if (p.i == p.n)
            return 0;
        fail(&p, "trailing bytes");
    }
    spj_free(out);
    return -1;
}

void spj_free(spj_value *v)
{
    if (v->type == SPJ_ARRAY || v->type == SPJ_OBJECT) {
        for (size_t k = 0; k < v->n; k++) {
            spj_free(&v->items[k]);
            if (v->keys)
                free(v->keys[k]);
        }
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
    free(v->str);
    memset(v, 0, sizeof *v);
}

const spj_value *spj_get(const spj_value *v, const char *key)
{
    if (!v || v->type != SPJ_OBJECT)
        return NULL;
    size_t kl = strlen(key);
    for (size_t k = 0; k < v->n; k++)
        if (v->key_lens[k] == kl && memcmp(v->keys[k], key, kl) == 0)
            return &v->items[k];
    return NULL;
}

const char *spj_type_name(spj_type t)
{
    switch (t) {
    case SPJ_NULL: return "null";
    case SPJ_BOOL: return "boolean";
    case SPJ_NUMBER: return "number";
    case SPJ_STRING: return "string";
    case SPJ_ARRAY: return "array";
    case SPJ_OBJECT: return "object";
    }
    return "?";
}

int spj_refuse(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}
