/* frame.c: the serve protocol's frame codec, engine side. See frame.h; the
 * rules cited as "section N" are spec/serve-protocol.md's. */
#include "frame.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define READ_CHUNK   65536        /* bytes asked of one read() */
#define MAX_FIELDS   32           /* fields of a request line we look at */
#define MAX_SKIP     ((uint64_t)1 << 62) /* larger byte counts are not trusted for skipping */

enum { ST_LINE = 0, ST_FRAME, ST_DISCARD_LINE };

const char *sp_kind_name(sp_kind kind)
{
    switch (kind) {
    case SP_SUBMIT: return "SUBMIT";
    case SP_IMAGE: return "IMAGE";
    case SP_STOP: return "STOP";
    case SP_CANCEL: return "CANCEL";
    case SP_DECIDE: return "DECIDE";
    case SP_SCORE: return "SCORE";
    case SP_PING: return "PING";
    }
    return "?";
}

void sp_request_free(sp_request *rq)
{
    free(rq->payload);
    free(rq->grammar);
    free(rq->token_ids);
    memset(rq, 0, sizeof *rq);
}

/* ---- numbers (section 1) ---- */

int sp_parse_uint(const char *s, size_t n, uint64_t *out)
{
    if (n == 0 || n > 20 || (s[0] == '0' && n > 1))
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* Moves *i past the ASCII digits at s[*i ..] (before n); returns how many. */
static size_t skip_digits(const char *s, size_t n, size_t *i)
{
    size_t from = *i;
    while (*i < n && s[*i] >= '0' && s[*i] <= '9')
        (*i)++;
    return *i - from;
}

/* -?(inf|nan|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?) */
int sp_parse_float(const char *s, size_t n, double *out)
{
    size_t i = 0;
    int neg = 0;
    if (i < n && s[i] == '-') {
        neg = 1;
        i++;
    }
    if (n - i == 3 && memcmp(s + i, "inf", 3) == 0) {
        *out = neg ? -INFINITY : INFINITY;
        return 0;
    }
    if (n - i == 3 && memcmp(s + i, "nan", 3) == 0) {
        *out = NAN;
        return 0;
    }
    if (skip_digits(s, n, &i) == 0)
        return -1;
    if (i < n && s[i] == '.') {
        i++;
        skip_digits(s, n, &i);
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (skip_digits(s, n, &i) == 0)
            return -1;
    }
    if (i != n || n >= 64)
        return -1;
    char tmp[64];
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    *out = strtod(tmp, NULL);
    return 0;
}

int sp_float_digits = 9;

char *sp_format_float(char out[SP_FLOAT_MAX], double x)
{
    if (isnan(x))
        strcpy(out, "nan");
    else if (isinf(x))
        strcpy(out, x > 0 ? "inf" : "-inf");
    else
        snprintf(out, SP_FLOAT_MAX, "%.*g", sp_float_digits, x);
    return out;
}

/* ---- reader ---- */

int sp_reader_init(sp_reader *rd, unsigned ext)
{
    memset(rd, 0, sizeof *rd);
    rd->cap = READ_CHUNK * 2;
    rd->buf = malloc(rd->cap);
    rd->ext = ext;
    rd->max_line = SP_MAX_LINE;
    rd->max_payload = SP_MAX_PAYLOAD;
    return rd->buf ? 0 : -1;
}

void sp_reader_set_limits(sp_reader *rd, size_t max_line, size_t max_payload)
{
    rd->max_line = max_line;
    rd->max_payload = max_payload;
}

uint64_t sp_reader_consumed(const sp_reader *rd)
{
    return rd->fed - (rd->end - rd->start);
}

void sp_reader_free(sp_reader *rd)
{
    sp_request_free(&rd->cur);
    free(rd->buf);
    memset(rd, 0, sizeof *rd);
}

/* Doubles *cap until n bytes fit after the first `used`, reallocating *buf.
 * The reader's and the writer's buffers both grow this way. 0, or -1 when
 * out of memory (the buffer is then unchanged). */
static int grow(unsigned char **buf, size_t *cap, size_t used, size_t n)
{
    if (*cap - used >= n)
        return 0;
    size_t c = *cap;
    while (c - used < n)
        c *= 2;
    unsigned char *b = realloc(*buf, c);
    if (!b)
        return -1;
    *buf = b;
    *cap = c;
    return 0;
}

/* Makes room for at least n more bytes after end. */
static int reserve(sp_reader *rd, size_t n)
{
    if (rd->start > 0 && (rd->start == rd->end || rd->cap - rd->end < n)) {
        memmove(rd->buf, rd->buf + rd->start, rd->end - rd->start);
        rd->end -= rd->start;
        rd->start = 0;
    }
    return grow(&rd->buf, &rd->cap, rd->end, n);
}

ssize_t sp_reader_fill(sp_reader *rd, int fd)
{
    if (reserve(rd, READ_CHUNK) < 0) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t got = read(fd, rd->buf + rd->end, rd->cap - rd->end);
    if (got > 0) {
        rd->end += (size_t)got;
        rd->fed += (uint64_t)got;
    }
    else if (got == 0)
        rd->eof = 1;
    return got;
}

int sp_reader_feed(sp_reader *rd, const void *data, size_t n)
{
    if (n == 0) {
        rd->eof = 1;
        return 0;
    }
    if (reserve(rd, n) < 0)
        return -1;
    memcpy(rd->buf + rd->end, data, n);
    rd->end += n;
    rd->fed += n;
    return 0;
}

static sp_status bad(sp_error *err, uint64_t id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static sp_status bad(sp_error *err, uint64_t id, const char *fmt, ...)
{
    err->id = id;
    snprintf(err->code, sizeof err->code, "BAD_FRAME");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->reason, sizeof err->reason, fmt, ap);
    va_end(ap);
    for (char *c = err->reason; *c; c++)
        if (*c == '\n')
            *c = ' ';
    return SP_BAD;
}

typedef struct field {
    const char *s;
    size_t n;
} field;

static int is_upper_kind(const char *s, size_t n)
{
    if (n == 0 || !(s[0] >= 'A' && s[0] <= 'Z'))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return 1;
}

static int is_key(const char *s, size_t n)
{
    if (n == 0 || !((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return 1;
}

static int field_is(const field *f, const char *lit)
{
    return f->n == strlen(lit) && memcmp(f->s, lit, f->n) == 0;
}

/* Printable, bounded copy of a field for an error reason. */
static const char *show(const field *f, char out[64])
{
    size_t n = f->n < 40 ? f->n : 40;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)f->s[i];
        out[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    strcpy(out + n, f->n > n ? "..." : "");
    return out;
}

/* One request line split on single spaces, and the payload byte counts it
 * announces as far as they can be read. */
typedef struct line_fields {
    field f[MAX_FIELDS];
    size_t nf;
    int spacing_ok;  /* no empty field: fields separated by exactly one space */
    int has_bytes;   /* the byte count field read as a uint below MAX_SKIP */
    int has_gbytes;  /* SUBMIT's optional gbytes field, likewise */
} line_fields;

/* Fills rq's kind-specific fields from a line whose id and field count were
 * checked; SP_FRAME, or SP_BAD with err filled. */
typedef sp_status (*kind_parser)(const sp_reader *rd, const line_fields *lf, sp_request *rq,
                                 sp_error *err);

static sp_status parse_submit(const sp_reader *rd, const line_fields *lf, sp_request *rq,
                              sp_error *err)
{
    const field *f = lf->f;
    uint64_t id = rq->id;
    char shown[64];
    if (sp_parse_uint(f[2].s, f[2].n, &rq->slot) < 0)
        return bad(err, id, "SUBMIT: bad slot '%s'", show(&f[2], shown));
    if (!lf->has_bytes)
        return bad(err, id, "SUBMIT: bad bytes '%s'", show(&f[3], shown));
    if (sp_parse_uint(f[4].s, f[4].n, &rq->max_tokens) < 0)
        return bad(err, id, "SUBMIT: bad max_tokens '%s'", show(&f[4], shown));
    if (sp_parse_float(f[5].s, f[5].n, &rq->temperature) < 0 || !isfinite(rq->temperature)
        || rq->temperature < 0)
        return bad(err, id, "SUBMIT: bad temp '%s'", show(&f[5], shown));
    if (sp_parse_float(f[6].s, f[6].n, &rq->top_p) < 0 || !(rq->top_p > 0 && rq->top_p <= 1))
        return bad(err, id, "SUBMIT: bad top_p '%s'", show(&f[6], shown));
    size_t k = 7;
    if (lf->nf > 7 && !memchr(f[7].s, '=', f[7].n)) {
        if (!lf->has_gbytes)
            return bad(err, id, "SUBMIT: bad gbytes '%s'", show(&f[7], shown));
        rq->has_gbytes = 1;
        k = 8;
    }
    int seen_logprobs = 0, seen_pin = 0, seen_ids = 0, seen_counters = 0;
    for (; k < lf->nf; k++) {
        const char *eq = memchr(f[k].s, '=', f[k].n);
        if (!eq)
            return bad(err, id, "SUBMIT: expected key=value, got '%s'", show(&f[k], shown));
        field key = {f[k].s, (size_t)(eq - f[k].s)};
        field val = {eq + 1, f[k].n - key.n - 1};
        if (!is_key(key.s, key.n) || val.n == 0)
            return bad(err, id, "SUBMIT: bad key=value '%s'", show(&f[k], shown));
        int *seen, *dst;
        uint64_t maxv;
        if (field_is(&key, "logprobs")) { seen = &seen_logprobs; dst = &rq->logprobs; maxv = SP_MAX_LOGPROBS; }
        else if (field_is(&key, "pin")) { seen = &seen_pin; dst = &rq->pin; maxv = 1; }
        else if (field_is(&key, "ids")) { seen = &seen_ids; dst = &rq->ids; maxv = 1; }
        else if (field_is(&key, "counters") && (rd->ext & SP_EXT_COUNTERS)) {
            seen = &seen_counters; dst = &rq->counters; maxv = 1;
        } else
            return bad(err, id, "SUBMIT: unknown key '%s'", show(&key, shown));
        if (*seen)
            return bad(err, id, "SUBMIT: key '%s' given twice", show(&key, shown));
        *seen = 1;
        uint64_t v;
        if (sp_parse_uint(val.s, val.n, &v) < 0 || v > maxv)
            return bad(err, id, "SUBMIT: bad %s '%s'", show(&key, shown), show(&val, (char[64]){0}));
        *dst = (int)v;
    }
    if (rq->max_tokens == 0 && rq->logprobs == 0)
        return bad(err, id, "SUBMIT: max_tokens=0 needs logprobs>0");
    return SP_FRAME;
}

static sp_status parse_image(const sp_reader *rd, const line_fields *lf, sp_request *rq,
                             sp_error *err)
{
    (void)rd;
    const field *f = lf->f;
    char shown[64];
    if (!lf->has_bytes)
        return bad(err, rq->id, "IMAGE: bad bytes '%s'", show(&f[2], shown));
    if (sp_parse_uint(f[3].s, f[3].n, &rq->grid_h) < 0)
        return bad(err, rq->id, "IMAGE: bad grid_h '%s'", show(&f[3], shown));
    if (sp_parse_uint(f[4].s, f[4].n, &rq->grid_w) < 0)
        return bad(err, rq->id, "IMAGE: bad grid_w '%s'", show(&f[4], shown));
    return SP_FRAME;
}

/* DECIDE and SCORE: <id> <slot> <bytes>. */
static sp_status parse_slot_bytes(const sp_reader *rd, const line_fields *lf, sp_request *rq,
                                  sp_error *err)
{
    (void)rd;
    const field *f = lf->f;
    const char *kn = sp_kind_name(rq->kind);
    char shown[64];
    if (sp_parse_uint(f[2].s, f[2].n, &rq->slot) < 0)
        return bad(err, rq->id, "%s: bad slot '%s'", kn, show(&f[2], shown));
    if (!lf->has_bytes)
        return bad(err, rq->id, "%s: bad bytes '%s'", kn, show(&f[3], shown));
    return SP_FRAME;
}

/* The request kinds (spec sections 4 and 9), as data. */
static const struct request_kind {
    const char *name;
    sp_kind kind;
    unsigned ext;        /* the SP_EXT_* flag the kind needs, or 0 */
    size_t nfields;      /* fields of the line, the kind included */
    int more_fields;     /* more may follow (SUBMIT's gbytes and keys) */
    size_t bytes_at;     /* index of the payload byte count, or 0 for none */
    kind_parser parse;   /* the kind's own fields, or NULL for <KIND> <id> */
} REQUEST_KINDS[] = {
    {"SUBMIT", SP_SUBMIT, 0, 7, 1, 3, parse_submit},
    {"IMAGE", SP_IMAGE, 0, 5, 0, 2, parse_image},
    {"STOP", SP_STOP, 0, 2, 0, 0, NULL},
    {"CANCEL", SP_CANCEL, 0, 2, 0, 0, NULL},
    {"DECIDE", SP_DECIDE, 0, 4, 0, 3, parse_slot_bytes},
    {"SCORE", SP_SCORE, SP_EXT_SCORE, 4, 0, 3, parse_slot_bytes},
    {"PING", SP_PING, SP_EXT_HEALTH, 2, 0, 0, NULL},
};

/* Splits a line on spaces into lf (spacing_ok tells whether every field is
 * non-empty); SP_FRAME, or SP_BAD for too many fields. */
static sp_status split_fields(const char *line, size_t n, line_fields *lf, sp_error *err)
{
    lf->nf = 0;
    lf->spacing_ok = 1;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < n && line[j] != ' ')
            j++;
        if (lf->nf == MAX_FIELDS)
            return bad(err, 0, "too many fields");
        field *f = &lf->f[lf->nf++];
        f->s = line + i;
        f->n = j - i;
        if (f->n == 0)
            lf->spacing_ok = 0;
        if (j == n)
            return SP_FRAME;
        i = j + 1;
    }
}

/* The request kind a line's first field names, among those the reader knows
 * (its extensions included), or NULL. */
static const struct request_kind *find_kind(const sp_reader *rd, const field *name)
{
    for (size_t k = 0; k < sizeof REQUEST_KINDS / sizeof REQUEST_KINDS[0]; k++) {
        const struct request_kind *rk = &REQUEST_KINDS[k];
        if (field_is(name, rk->name) && (rk->ext == 0 || (rd->ext & rk->ext)))
            return rk;
    }
    return NULL;
}

/* Parses one request line (without its '\n'). Fills rd->cur, and the payload
 * sizes the line announces (rd->sizes_ok, nparts, sizes) as far as they can
 * be read; returns SP_FRAME, or SP_BAD with err filled. The fields common to
 * every kind are read here, the rest by the kind's parser. */
static sp_status parse_line(sp_reader *rd, const char *line, size_t n, sp_error *err)
{
    line_fields lf;
    if (split_fields(line, n, &lf, err) == SP_BAD)
        return SP_BAD;
    const field *f = lf.f;
    size_t nf = lf.nf;
    if (n == 0)
        return bad(err, 0, "empty line");
    char shown[64];
    if (!is_upper_kind(f[0].s, f[0].n))
        return bad(err, 0, "bad kind '%s'", show(&f[0], shown));
    const struct request_kind *rk = find_kind(rd, &f[0]);
    if (!rk)
        return bad(err, 0, "unknown kind %s", show(&f[0], shown));
    const char *kn = rk->name;

    /* The id, and the payload byte counts, as far as they can be read:
     * errors name the id and skip the payload (section 7). */
    uint64_t id = 0, bytes = 0, gbytes = 0;
    if (nf > 1 && (sp_parse_uint(f[1].s, f[1].n, &id) < 0 || id == 0))
        id = 0;
    size_t at = rk->bytes_at;
    lf.has_bytes = at && nf > at && sp_parse_uint(f[at].s, f[at].n, &bytes) == 0 && bytes < MAX_SKIP;
    lf.has_gbytes = rk->kind == SP_SUBMIT && nf > 7 && !memchr(f[7].s, '=', f[7].n)
                    && sp_parse_uint(f[7].s, f[7].n, &gbytes) == 0 && gbytes < MAX_SKIP;
    rd->sizes_ok = lf.has_bytes && lf.spacing_ok;
    rd->nparts = rd->sizes_ok ? 1 + lf.has_gbytes : 0;
    rd->sizes[0] = bytes;
    rd->sizes[1] = lf.has_gbytes ? gbytes : 0;

    sp_request *rq = &rd->cur;
    memset(rq, 0, sizeof *rq);
    rq->kind = rk->kind;
    if (!lf.spacing_ok)
        return bad(err, id, "%s: fields must be separated by exactly one space", kn);
    if (nf < 2 || id == 0)
        return bad(err, id, "%s: bad id", kn);
    rq->id = id;
    if (nf < rk->nfields || (!rk->more_fields && nf != rk->nfields))
        return bad(err, id, "%s: expected %zu fields, got %zu", kn, rk->nfields - 1, nf - 1);
    return rk->parse ? rk->parse(rd, &lf, rq, err) : SP_FRAME;
}

int sp_parse_token_ids(const unsigned char *p, size_t n, uint64_t **out, size_t *count)
{
    if (n == 0)
        return -1;
    size_t cnt = 1;
    for (size_t i = 0; i < n; i++)
        cnt += p[i] == ' ';
    uint64_t *ids = malloc(cnt * sizeof *ids);
    if (!ids)
        return -1;
    size_t k = 0, i = 0;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != ' ')
            j++;
        if (sp_parse_uint((const char *)p + i, j - i, &ids[k]) < 0) {
            free(ids);
            return -1;
        }
        k++;
        if (j == n)
            break;
        i = j + 1;
    }
    *out = ids;
    *count = k;
    return 0;
}

static int parse_ids(sp_request *rq)
{
    return sp_parse_token_ids(rq->payload, rq->payload_len, &rq->token_ids, &rq->n_token_ids);
}

/* A copy of n bytes with a NUL after them, or NULL when out of memory. */
static unsigned char *copy_payload(const unsigned char *p, size_t n)
{
    unsigned char *b = malloc(n + 1);
    if (b) {
        memcpy(b, p, n);
        b[n] = '\0';
    }
    return b;
}

/* The frame in rd->cur is whole in the buffer from rd->start: checks the
 * payloads' '\n', then gives the line's error or the request. */
static sp_status finish_frame(sp_reader *rd, sp_request *rq, sp_error *err)
{
    size_t pos = rd->start;
    uint64_t id = rd->cur.id;
    rd->state = ST_LINE;
    for (int p = 0; p < rd->nparts; p++) {
        size_t n = (size_t)rd->sizes[p];
        if (rd->buf[pos + n] != '\n') {
            rd->start = pos + n;
            sp_request_free(&rd->cur);
            return bad(err, id, "payload of %zu bytes not followed by '\\n'", n);
        }
        pos += n + 1;
    }
    if (rd->line_bad) {
        rd->start = pos;
        sp_request_free(&rd->cur);
        *err = rd->pending;
        return SP_BAD;
    }
    size_t at = rd->start;
    rd->start = pos;
    rd->cur.payload_len = (size_t)rd->sizes[0];
    rd->cur.payload = copy_payload(rd->buf + at, rd->cur.payload_len);
    if (rd->cur.has_gbytes) {
        rd->cur.grammar_len = (size_t)rd->sizes[1];
        rd->cur.grammar = copy_payload(rd->buf + at + rd->cur.payload_len + 1, rd->cur.grammar_len);
    }
    if (!rd->cur.payload || (rd->cur.has_gbytes && !rd->cur.grammar)) {
        sp_request_free(&rd->cur);
        return bad(err, id, "payload of %zu bytes: out of memory", (size_t)rd->sizes[0]);
    }
    if (rd->cur.ids && parse_ids(&rd->cur) < 0) {
        sp_request_free(&rd->cur);
        return bad(err, id, "SUBMIT: ids=1 payload is not token ids separated by single spaces");
    }
    *rq = rd->cur;
    memset(&rd->cur, 0, sizeof rd->cur);
    return SP_FRAME;
}

sp_status sp_reader_next(sp_reader *rd, sp_request *rq, sp_error *err)
{
    for (;;) {
        size_t avail = rd->end - rd->start;
        if (rd->skip) {
            size_t take = rd->skip < avail ? (size_t)rd->skip : avail;
            rd->start += take;
            rd->skip -= take;
            if (rd->skip && !rd->eof)
                return SP_NEED_DATA;
            rd->skip = 0;
            *err = rd->pending;
            return SP_BAD;
        }
        if (rd->state == ST_DISCARD_LINE) {
            /* an overlong line: reported once its '\n' is consumed */
            unsigned char *nl = memchr(rd->buf + rd->start, '\n', avail);
            rd->start = nl ? (size_t)(nl - rd->buf) + 1 : rd->end;
            if (!nl && !rd->eof)
                return SP_NEED_DATA;
            rd->state = ST_LINE;
            *err = rd->pending;
            return SP_BAD;
        }
        if (rd->state == ST_FRAME) {
            uint64_t total = rd->sizes[0] + rd->sizes[1] + (uint64_t)rd->nparts;
            if (avail >= total)
                return finish_frame(rd, rq, err);
            if (!rd->eof)
                return SP_NEED_DATA;
            rd->start = rd->end;
            rd->state = ST_LINE;
            sp_request_free(&rd->cur);
            return bad(err, 0, "end of input inside a frame (%zu bytes dropped)", avail);
        }
        /* ST_LINE */
        unsigned char *line = rd->buf + rd->start;
        unsigned char *nl = memchr(line, '\n', avail < rd->max_line ? avail : rd->max_line);
        if (!nl) {
            if (avail >= rd->max_line) {
                rd->state = ST_DISCARD_LINE;
                rd->start += rd->max_line;
                bad(&rd->pending, 0, "line over %zu bytes", rd->max_line);
                continue;
            }
            if (!rd->eof)
                return SP_NEED_DATA;
            if (avail == 0)
                return SP_EOF;
            rd->start = rd->end;
            return bad(err, 0, "end of input inside a line (%zu bytes dropped)", avail);
        }
        size_t n = (size_t)(nl - line);
        rd->start += n + 1;
        rd->sizes_ok = 0;
        rd->nparts = 0;
        sp_status st = parse_line(rd, (const char *)line, n, err);
        if (rd->sizes_ok) {
            if (rd->sizes[0] > rd->max_payload || rd->sizes[1] > rd->max_payload) {
                rd->skip = rd->sizes[0] + rd->sizes[1] + (uint64_t)rd->nparts;
                bad(&rd->pending, st == SP_BAD ? err->id : rd->cur.id,
                    "payload over %zu bytes", rd->max_payload);
                sp_request_free(&rd->cur);
                continue;
            }
            rd->line_bad = st == SP_BAD;
            if (rd->line_bad) {
                rd->pending = *err;
                rd->cur.id = err->id;
            }
            rd->state = ST_FRAME;
            continue;
        }
        if (st == SP_BAD) {
            sp_request_free(&rd->cur);
            return SP_BAD;
        }
        *rq = rd->cur;
        memset(&rd->cur, 0, sizeof rd->cur);
        return SP_FRAME;
    }
}

/* ---- writer ---- */

int sp_write_fd_sink(void *fd_ptr, const unsigned char *frame, size_t len)
{
    int fd = *(int *)fd_ptr;
    while (len > 0) {
        ssize_t n = write(fd, frame, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        frame += n;
        len -= (size_t)n;
    }
    return 0;
}

int sp_writer_init(sp_writer *w, int fd)
{
    memset(w, 0, sizeof *w);
    w->cap = 4096;
    w->buf = malloc(w->cap);
    w->fd = fd;
    w->sink = sp_write_fd_sink;
    w->ctx = &w->fd;
    return w->buf ? 0 : -1;
}

void sp_writer_set_sink(sp_writer *w, sp_sink_fn sink, void *ctx)
{
    w->sink = sink;
    w->ctx = ctx;
}

void sp_writer_free(sp_writer *w)
{
    free(w->buf);
    memset(w, 0, sizeof *w);
}

static int wb_reserve(sp_writer *w, size_t n)
{
    return grow(&w->buf, &w->cap, w->len, n);
}

static int wb_bytes(sp_writer *w, const void *p, size_t n)
{
    if (wb_reserve(w, n) < 0)
        return -1;
    if (n)
        memcpy(w->buf + w->len, p, n);
    w->len += n;
    return 0;
}

static int wb_vprintf(sp_writer *w, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0 || wb_reserve(w, (size_t)n + 1) < 0)
        return -1;
    vsnprintf((char *)w->buf + w->len, (size_t)n + 1, fmt, ap);
    w->len += (size_t)n;
    return 0;
}

static int wb_printf(sp_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int wb_printf(sp_writer *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = wb_vprintf(w, fmt, ap);
    va_end(ap);
    return r;
}

static int wb_float(sp_writer *w, double x)
{
    char s[SP_FLOAT_MAX];
    sp_format_float(s, x);
    return wb_bytes(w, s, strlen(s));
}

/* Text to the end of the line, with each '\n' made a space. */
static int wb_text(sp_writer *w, const char *s)
{
    size_t start = w->len;
    if (wb_bytes(w, s, strlen(s)) < 0)
        return -1;
    for (size_t i = start; i < w->len; i++)
        if (w->buf[i] == '\n')
            w->buf[i] = ' ';
    return 0;
}

static int wb_alts(sp_writer *w, int k, const sp_alt *top)
{
    int r = wb_printf(w, " %d", k);
    for (int i = 0; i < k && r == 0; i++) {
        r |= wb_printf(w, " %lld ", (long long)top[i].token_id);
        r |= wb_float(w, top[i].logprob);
    }
    return r;
}

/* Sends the buffered frame; an earlier formatting failure (r != 0) drops it. */
static int emit(sp_writer *w, int r)
{
    size_t len = w->len;
    w->len = 0;
    if (w->failed)
        return -1;
    if (r != 0)
        return -1;
    if (w->sink(w->ctx, w->buf, len) < 0) {
        w->failed = 1;
        return -1;
    }
    return 0;
}

int sp_write_ready(sp_writer *w)
{
    return emit(w, wb_bytes(w, "\x01\x01READY\x01\x01\n", 10));
}

int sp_write_caps(sp_writer *w, const char *fields)
{
    if (!fields || !*fields)
        return emit(w, wb_bytes(w, "CAPS\n", 5));
    return emit(w, wb_printf(w, "CAPS %s\n", fields));
}

int sp_write_stat(sp_writer *w, const double *fields, int n)
{
    int r = wb_bytes(w, "STAT", 4);
    for (int i = 0; i < n; i++) {
        r |= wb_bytes(w, " ", 1);
        r |= wb_float(w, fields[i]);
    }
    r |= wb_bytes(w, "\n", 1);
    return emit(w, r);
}

int sp_write_load_fail(sp_writer *w, const char *kind, const char *detail)
{
    int r = wb_printf(w, "LOAD_FAIL kind=%s", kind);
    if (detail && *detail) {
        r |= wb_bytes(w, " ", 1);
        r |= wb_text(w, detail);
    }
    r |= wb_bytes(w, "\n", 1);
    return emit(w, r);
}

int sp_write_accept(sp_writer *w, uint64_t id, uint64_t prompt_tokens)
{
    return emit(w, wb_printf(w, "ACCEPT %llu %llu\n", (unsigned long long)id,
                             (unsigned long long)prompt_tokens));
}

/* The end of a frame's line, then its payload of n bytes and the payload's '\n'. */
static int wb_payload(sp_writer *w, const void *p, size_t n)
{
    int r = wb_bytes(w, "\n", 1);
    r |= wb_bytes(w, p, n);
    r |= wb_bytes(w, "\n", 1);
    return r;
}

int sp_write_echo(sp_writer *w, uint64_t id, uint64_t position, double logprob,
                  int k, const sp_alt *top, const void *text, size_t n)
{
    int r = wb_printf(w, "ECHO %llu %zu %llu ", (unsigned long long)id, n,
                      (unsigned long long)position);
    r |= wb_float(w, logprob);
    r |= wb_alts(w, k, top);
    r |= wb_payload(w, text, n);
    return emit(w, r);
}

int sp_write_data(sp_writer *w, uint64_t id, const void *text, size_t n,
                  int has_tail, double logprob, int k, const sp_alt *top)
{
    int r = wb_printf(w, "DATA %llu %zu", (unsigned long long)id, n);
    if (has_tail) {
        r |= wb_bytes(w, " ", 1);
        r |= wb_float(w, logprob);
        r |= wb_alts(w, k, top);
    }
    r |= wb_payload(w, text, n);
    return emit(w, r);
}

int sp_write_decision(sp_writer *w, uint64_t id, const void *json, size_t n)
{
    int r = wb_printf(w, "DECISION %llu %zu\n", (unsigned long long)id, n);
    r |= wb_bytes(w, json, n);
    r |= wb_bytes(w, "\n", 1);
    return emit(w, r);
}

int sp_write_done(sp_writer *w, uint64_t id, const sp_done *d)
{
    int r = wb_printf(w, "DONE %llu STAT %llu ", (unsigned long long)id,
                      (unsigned long long)d->emitted);
    r |= wb_float(w, d->tok_s);
    r |= wb_bytes(w, " ", 1);
    r |= wb_float(w, d->hit_pct);
    r |= wb_bytes(w, " ", 1);
    r |= wb_float(w, d->rss_gb);
    r |= wb_printf(w, " %llu %d", (unsigned long long)d->prompt_tokens, d->length_limited ? 1 : 0);
    if (d->has_counters)
        r |= wb_printf(w, " computed=%llu reused=%llu snapshot=%s",
                       (unsigned long long)d->computed, (unsigned long long)d->reused,
                       d->snapshot ? d->snapshot : "none");
    if (d->has_counters && d->has_disk)
        r |= wb_printf(w, " disk=%llu", (unsigned long long)d->disk);
    r |= wb_bytes(w, "\n", 1);
    return emit(w, r);
}

int sp_write_error(sp_writer *w, uint64_t id, const char *code, const char *reason_fmt, ...)
{
    int r = wb_printf(w, "ERROR %llu %s", (unsigned long long)id, code);
    if (reason_fmt && *reason_fmt) {
        char reason[SP_REASON_MAX];
        va_list ap;
        va_start(ap, reason_fmt);
        vsnprintf(reason, sizeof reason, reason_fmt, ap);
        va_end(ap);
        if (reason[0]) {
            r |= wb_bytes(w, " ", 1);
            r |= wb_text(w, reason);
        }
    }
    r |= wb_bytes(w, "\n", 1);
    return emit(w, r);
}

int sp_write_scored(sp_writer *w, uint64_t id, uint64_t group, uint64_t option,
                    uint64_t context_tokens, int n, const double *logprobs)
{
    int r = wb_printf(w, "SCORED %llu %llu %llu %llu %d", (unsigned long long)id,
                      (unsigned long long)group, (unsigned long long)option,
                      (unsigned long long)context_tokens, n);
    for (int i = 0; i < n; i++) {
        r |= wb_bytes(w, " ", 1);
        r |= wb_float(w, logprobs[i]);
    }
    r |= wb_bytes(w, "\n", 1);
    return emit(w, r);
}

int sp_write_hidden(sp_writer *w, uint64_t id, uint64_t group, uint64_t layer, int n, const float *values)
{
    int r = wb_printf(w, "HIDDEN %llu %zu %llu %llu\n", (unsigned long long)id, (size_t)n * 4,
                      (unsigned long long)group, (unsigned long long)layer);
    for (int i = 0; i < n; i++) { /* IEEE binary32, little-endian, whatever the host's order */
        uint32_t u;
        memcpy(&u, &values[i], 4);
        unsigned char b[4] = { (unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                               (unsigned char)(u >> 24) };
        r |= wb_bytes(w, b, 4);
    }
    r |= wb_bytes(w, "\n", 1);
    return emit(w, r);
}

int sp_write_pong(sp_writer *w, uint64_t id, const char *fields)
{
    int r = wb_printf(w, "PONG %llu", (unsigned long long)id);
    if (fields && *fields)
        r |= wb_printf(w, " %s", fields);
    r |= wb_bytes(w, "\n", 1);
    return emit(w, r);
}

int sp_write_line(sp_writer *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = wb_vprintf(w, fmt, ap);
    va_end(ap);
    r |= wb_bytes(w, "\n", 1);
    return emit(w, r);
}
