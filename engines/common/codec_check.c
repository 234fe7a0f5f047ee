/* codec_check.c: runs bytes and events through the C frame codec so tests can
 * compare it with the Python implementation and spec/vectors/.
 *
 *   codec-check read [--ext all|none|score,counters,health] [--max-line N] [--max-payload N] [--chunk N]
 *       stdin: request frames (bytes). stdout: one JSON object per line per
 *       event the reader gives, in order:
 *         {"event": "Submit", "id": 1, "slot": 0, "prompt": "<hex>", "max_tokens": 0,
 *          "temperature": "<%.17g>", "top_p": "<%.17g>", "grammar": "<hex>"|null,
 *          "logprobs": 1, "pin": true, "ids": false, "counters": false}
 *         {"event": "Image", "id", "data": "<hex>", "grid_h", "grid_w"}
 *         {"event": "Stop"|"Cancel"|"Ping", "id"}
 *         {"event": "Decide"|"Score", "id", "slot", "record"|"payload": "<hex>"}
 *         {"event": "Error", "id", "code", "reason"}     (a refused frame)
 *       and {"event": "EOF"} last. Floats are strings so nan/inf survive JSON.
 *       Every object also has "consumed": the input bytes the reader had
 *       used up when it gave the event. Submit has "token_ids" (a list) with ids=1.
 *   codec-check write
 *       stdin: one JSON object per line, an event to write with the field
 *       names of serveproto's events (bytes as hex strings, floats as numbers
 *       or "nan"/"inf"/"-inf"); stdout: the frames the C writer makes.
 *       Kinds: Ready, Caps{values: {k: v}} (written in the given order),
 *       Stat{fields}, LoadFail{kind, detail}, Accept{id, prompt_tokens},
 *       Echo{id, position, logprob, top: [[tid, lp]...], text},
 *       Data{id, text, logprob|null, top}, Decision{id, record},
 *       Done{id, emitted, tok_s, hit_pct, rss_gb, prompt_tokens,
 *            length_limited, computed|null, reused|null, snapshot|null, disk?},
 *       Error{id, code, reason}, Scored{id, group, option, context_tokens, logprobs},
 *       Pong{id, values}.
 *   codec-check json
 *       stdin: one JSON text; stdout: its tree re-serialised canonically
 *       (exit 1 and the parse error on stderr when refused).
 * Exit status 2 on a usage error or an input this tool cannot understand.
 */
#include "frame.h"
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *msg)
{
    fprintf(stderr, "codec-check: %s\n", msg);
    exit(2);
}

static void put_hex(const unsigned char *p, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++)
        printf("%02x", p[i]);
    putchar('"');
}

static void put_str(const char *s)
{
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c < 0x20)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
    putchar('"');
}

static void put_float(double x)
{
    char s[40];
    if (isnan(x)) strcpy(s, "nan");
    else if (isinf(x)) strcpy(s, x > 0 ? "inf" : "-inf");
    else snprintf(s, sizeof s, "%.17g", x);
    printf("\"%s\"", s);
}

static unsigned char *slurp(size_t *len)
{
    size_t cap = 1 << 16;
    unsigned char *buf = malloc(cap);
    ssize_t n;
    *len = 0;
    while (buf && (n = read(0, buf + *len, cap - *len)) > 0) {
        *len += (size_t)n;
        if (*len == cap)
            buf = realloc(buf, cap *= 2);
    }
    if (!buf)
        die("out of memory");
    return buf;
}

/* chunk == 0: one read() per NEED_DATA; else all of stdin, then handed to
 * the reader chunk bytes at a time (incremental parsing must not change
 * what comes out). */
static int do_read(unsigned ext, size_t max_line, size_t max_payload, size_t chunk)
{
    sp_reader rd;
    if (sp_reader_init(&rd, ext) < 0)
        die("out of memory");
    sp_reader_set_limits(&rd, max_line, max_payload);
    size_t len = 0, fed = 0;
    unsigned char *input = chunk ? slurp(&len) : NULL;
    for (;;) {
        sp_request rq;
        sp_error err;
        sp_status st = sp_reader_next(&rd, &rq, &err);
        if (st == SP_NEED_DATA) {
            if (!chunk) {
                if (sp_reader_fill(&rd, 0) < 0)
                    die("read failed");
                continue;
            }
            size_t n = len - fed < chunk ? len - fed : chunk;
            if (sp_reader_feed(&rd, input + fed, n) < 0)
                die("out of memory");
            fed += n;
            continue;
        }
        printf("{\"consumed\": %llu, ", (unsigned long long)sp_reader_consumed(&rd));
        if (st == SP_EOF) {
            printf("\"event\": \"EOF\"}\n");
            break;
        }
        if (st == SP_BAD) {
            printf("\"event\": \"Error\", \"id\": %llu, \"code\": ", (unsigned long long)err.id);
            put_str(err.code);
            printf(", \"reason\": ");
            put_str(err.reason);
            printf("}\n");
            continue;
        }
        unsigned long long id = (unsigned long long)rq.id;
        switch (rq.kind) {
        case SP_SUBMIT:
            printf("\"event\": \"Submit\", \"id\": %llu, \"slot\": %llu, \"prompt\": ", id,
                   (unsigned long long)rq.slot);
            put_hex(rq.payload, rq.payload_len);
            printf(", \"max_tokens\": %llu, \"temperature\": ", (unsigned long long)rq.max_tokens);
            put_float(rq.temperature);
            printf(", \"top_p\": ");
            put_float(rq.top_p);
            printf(", \"grammar\": ");
            if (rq.has_gbytes)
                put_hex(rq.grammar, rq.grammar_len);
            else
                printf("null");
            if (rq.ids) {
                printf(", \"token_ids\": [");
                for (size_t i = 0; i < rq.n_token_ids; i++)
                    printf("%s%llu", i ? ", " : "", (unsigned long long)rq.token_ids[i]);
                printf("]");
            }
            printf(", \"logprobs\": %d, \"pin\": %s, \"ids\": %s, \"counters\": %s}\n", rq.logprobs,
                   rq.pin ? "true" : "false", rq.ids ? "true" : "false",
                   rq.counters ? "true" : "false");
            break;
        case SP_IMAGE:
            printf("\"event\": \"Image\", \"id\": %llu, \"data\": ", id);
            put_hex(rq.payload, rq.payload_len);
            printf(", \"grid_h\": %llu, \"grid_w\": %llu}\n", (unsigned long long)rq.grid_h,
                   (unsigned long long)rq.grid_w);
            break;
        case SP_DECIDE:
        case SP_SCORE:
            printf("\"event\": \"%s\", \"id\": %llu, \"slot\": %llu, \"%s\": ",
                   rq.kind == SP_DECIDE ? "Decide" : "Score", id, (unsigned long long)rq.slot,
                   rq.kind == SP_DECIDE ? "record" : "payload");
            put_hex(rq.payload, rq.payload_len);
            printf("}\n");
            break;
        case SP_STOP:
        case SP_CANCEL:
        case SP_PING:
            printf("\"event\": \"%s\", \"id\": %llu}\n",
                   rq.kind == SP_STOP ? "Stop" : rq.kind == SP_CANCEL ? "Cancel" : "Ping", id);
            break;
        }
        sp_request_free(&rq);
    }
    sp_reader_free(&rd);
    free(input);
    return 0;
}

/* ---- write ---- */

static const spj_value *need(const spj_value *o, const char *key, spj_type t)
{
    const spj_value *v = spj_get(o, key);
    if (!v || v->type != t) {
        fprintf(stderr, "codec-check: field %s: expected %s\n", key, spj_type_name(t));
        exit(2);
    }
    return v;
}

static uint64_t need_uint(const spj_value *o, const char *key)
{
    double d = need(o, key, SPJ_NUMBER)->number;
    if (d < 0 || d != floor(d))
        die("expected an unsigned integer");
    return (uint64_t)d;
}

static double as_float(const spj_value *v)
{
    if (v->type == SPJ_NUMBER)
        return v->number;
    if (v->type == SPJ_STRING) {
        double x;
        if (sp_parse_float(v->str, v->len, &x) == 0)
            return x;
    }
    die("expected a float");
    return 0;
}

static double need_float(const spj_value *o, const char *key)
{
    const spj_value *v = spj_get(o, key);
    if (!v)
        die("missing float");
    return as_float(v);
}

/* Decodes a hex string field into a malloc'd buffer. */
static unsigned char *need_hex(const spj_value *o, const char *key, size_t *n)
{
    const spj_value *v = need(o, key, SPJ_STRING);
    if (v->len % 2)
        die("odd hex length");
    unsigned char *b = malloc(v->len / 2 + 1);
    for (size_t i = 0; i < v->len / 2; i++) {
        unsigned x;
        if (sscanf(v->str + 2 * i, "%2x", &x) != 1)
            die("bad hex");
        b[i] = (unsigned char)x;
    }
    *n = v->len / 2;
    return b;
}

static sp_alt *need_top(const spj_value *o, int *k)
{
    const spj_value *t = need(o, "top", SPJ_ARRAY);
    sp_alt *alts = calloc(t->n + 1, sizeof *alts);
    for (size_t i = 0; i < t->n; i++) {
        const spj_value *pair = &t->items[i];
        if (pair->type != SPJ_ARRAY || pair->n != 2 || pair->items[0].type != SPJ_NUMBER)
            die("top: expected [token_id, logprob] pairs");
        alts[i].token_id = (int64_t)pair->items[0].number;
        alts[i].logprob = as_float(&pair->items[1]);
    }
    *k = (int)t->n;
    return alts;
}

/* "k=v k=v" from an object of strings, in the object's order. */
static char *kv_fields(const spj_value *o)
{
    size_t cap = 1;
    for (size_t i = 0; i < o->n; i++) {
        if (o->items[i].type != SPJ_STRING)
            die("values: expected strings");
        cap += o->key_lens[i] + o->items[i].len + 2;
    }
    char *s = calloc(cap, 1);
    for (size_t i = 0; i < o->n; i++) {
        if (i)
            strcat(s, " ");
        strcat(s, o->keys[i]);
        strcat(s, "=");
        strcat(s, o->items[i].str);
    }
    return s;
}

static int write_one(sp_writer *w, const spj_value *ev)
{
    const char *kind = need(ev, "event", SPJ_STRING)->str;
    if (!strcmp(kind, "Ready"))
        return sp_write_ready(w);
    if (!strcmp(kind, "Caps") || !strcmp(kind, "Pong")) {
        char *f = kv_fields(need(ev, "values", SPJ_OBJECT));
        int r = kind[0] == 'C' ? sp_write_caps(w, f) : sp_write_pong(w, need_uint(ev, "id"), f);
        free(f);
        return r;
    }
    if (!strcmp(kind, "Stat")) {
        const spj_value *f = need(ev, "fields", SPJ_ARRAY);
        double x[16];
        if (f->n > 16)
            die("too many STAT fields");
        for (size_t i = 0; i < f->n; i++)
            x[i] = as_float(&f->items[i]);
        return sp_write_stat(w, x, (int)f->n);
    }
    if (!strcmp(kind, "LoadFail"))
        return sp_write_load_fail(w, need(ev, "kind", SPJ_STRING)->str, need(ev, "detail", SPJ_STRING)->str);
    uint64_t id = need_uint(ev, "id");
    if (!strcmp(kind, "Accept"))
        return sp_write_accept(w, id, need_uint(ev, "prompt_tokens"));
    if (!strcmp(kind, "Echo") || !strcmp(kind, "Data")) {
        size_t n;
        int k;
        unsigned char *text = need_hex(ev, "text", &n);
        sp_alt *top = need_top(ev, &k);
        const spj_value *lp = spj_get(ev, "logprob");
        int r = kind[0] == 'E'
            ? sp_write_echo(w, id, need_uint(ev, "position"), as_float(lp), k, top, text, n)
            : sp_write_data(w, id, text, n, lp && lp->type != SPJ_NULL,
                            lp && lp->type != SPJ_NULL ? as_float(lp) : 0, k, top);
        free(text);
        free(top);
        return r;
    }
    if (!strcmp(kind, "Decision")) {
        size_t n;
        unsigned char *rec = need_hex(ev, "record", &n);
        int r = sp_write_decision(w, id, rec, n);
        free(rec);
        return r;
    }
    if (!strcmp(kind, "Done")) {
        sp_done d = {0};
        d.emitted = need_uint(ev, "emitted");
        d.tok_s = need_float(ev, "tok_s");
        d.hit_pct = need_float(ev, "hit_pct");
        d.rss_gb = need_float(ev, "rss_gb");
        d.prompt_tokens = need_uint(ev, "prompt_tokens");
        const spj_value *ll = need(ev, "length_limited", SPJ_BOOL);
        d.length_limited = ll->boolean;
        const spj_value *c = spj_get(ev, "computed");
        if (c && c->type != SPJ_NULL) {
            d.has_counters = 1;
            d.computed = need_uint(ev, "computed");
            d.reused = need_uint(ev, "reused");
            d.snapshot = need(ev, "snapshot", SPJ_STRING)->str;
            const spj_value *k = spj_get(ev, "disk");
            if (k && k->type != SPJ_NULL) {
                d.has_disk = 1;
                d.disk = need_uint(ev, "disk");
            }
        }
        return sp_write_done(w, id, &d);
    }
    if (!strcmp(kind, "Error")) {
        const spj_value *reason = spj_get(ev, "reason");
        return sp_write_error(w, id, need(ev, "code", SPJ_STRING)->str, "%s",
                              reason && reason->type == SPJ_STRING ? reason->str : "");
    }
    if (!strcmp(kind, "Scored")) {
        const spj_value *l = need(ev, "logprobs", SPJ_ARRAY);
        double *lps = calloc(l->n + 1, sizeof *lps);
        for (size_t i = 0; i < l->n; i++)
            lps[i] = as_float(&l->items[i]);
        int r = sp_write_scored(w, id, need_uint(ev, "group"), need_uint(ev, "option"),
                                need_uint(ev, "context_tokens"), (int)l->n, lps);
        free(lps);
        return r;
    }
    if (!strcmp(kind, "Hidden")) {
        const spj_value *l = need(ev, "values", SPJ_ARRAY);
        float *vals = calloc(l->n + 1, sizeof *vals);
        for (size_t i = 0; i < l->n; i++)
            vals[i] = (float)as_float(&l->items[i]);
        int r = sp_write_hidden(w, id, need_uint(ev, "group"), need_uint(ev, "layer"), (int)l->n, vals);
        free(vals);
        return r;
    }
    die("unknown event kind");
    return -1;
}

static int do_write(void)
{
    sp_writer w;
    if (sp_writer_init(&w, 1) < 0)
        die("out of memory");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        if (n == 1 && line[0] == '\n')
            continue;
        spj_value ev;
        char err[SPJ_ERR_MAX];
        if (spj_parse(line, (size_t)n, &ev, err) < 0) {
            fprintf(stderr, "codec-check: %s\n", err);
            return 2;
        }
        if (write_one(&w, &ev) < 0)
            die("write failed");
        spj_free(&ev);
    }
    free(line);
    sp_writer_free(&w);
    return 0;
}

/* ---- json ---- */

static void dump(const spj_value *v)
{
    switch (v->type) {
    case SPJ_NULL: printf("null"); break;
    case SPJ_BOOL: printf(v->boolean ? "true" : "false"); break;
    case SPJ_NUMBER: printf("%.17g", v->number); break;
    case SPJ_STRING: put_hex((const unsigned char *)v->str, v->len); break;
    case SPJ_ARRAY:
        putchar('[');
        for (size_t i = 0; i < v->n; i++) {
            if (i) putchar(',');
            dump(&v->items[i]);
        }
        putchar(']');
        break;
    case SPJ_OBJECT:
        putchar('{');
        for (size_t i = 0; i < v->n; i++) {
            if (i) putchar(',');
            put_hex((const unsigned char *)v->keys[i], v->key_lens[i]);
            putchar(':');
            dump(&v->items[i]);
        }
        putchar('}');
        break;
    }
}

static int do_json(void)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t n;
    while ((n = read(0, buf + len, cap - len)) > 0) {
        len += (size_t)n;
        if (len == cap)
            buf = realloc(buf, cap *= 2);
    }
    spj_value v;
    char err[SPJ_ERR_MAX];
    if (spj_parse(buf, len, &v, err) < 0) {
        fprintf(stderr, "%s\n", err);
        free(buf);
        return 1;
    }
    dump(&v);
    putchar('\n');
    spj_free(&v);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: codec-check read [--ext all|none|LIST] | write | json");
    if (!strcmp(argv[1], "read")) {
        unsigned ext = SP_EXT_ALL;
        size_t max_line = SP_MAX_LINE, max_payload = SP_MAX_PAYLOAD, chunk = 0;
        for (int i = 2; i + 1 < argc; i += 2) {
            if (!strcmp(argv[i], "--ext")) {
                ext = 0;
                if (!strcmp(argv[i + 1], "all"))
                    ext = SP_EXT_ALL;
                else if (strcmp(argv[i + 1], "none")) {
                    if (strstr(argv[i + 1], "score")) ext |= SP_EXT_SCORE;
                    if (strstr(argv[i + 1], "counters")) ext |= SP_EXT_COUNTERS;
                    if (strstr(argv[i + 1], "health")) ext |= SP_EXT_HEALTH;
                }
            } else if (!strcmp(argv[i], "--max-line"))
                max_line = strtoull(argv[i + 1], NULL, 10);
            else if (!strcmp(argv[i], "--max-payload"))
                max_payload = strtoull(argv[i + 1], NULL, 10);
            else if (!strcmp(argv[i], "--chunk"))
                chunk = strtoull(argv[i + 1], NULL, 10);
            else
                die("usage: codec-check read [--ext all|none|LIST] [--max-line N] [--max-payload N] [--chunk N]");
        }
        if (argc % 2)
            die("usage: codec-check read [--ext all|none|LIST] [--max-line N] [--max-payload N] [--chunk N]");
        return do_read(ext, max_line, max_payload, chunk);
    }
    if (!strcmp(argv[1], "write"))
        return do_write();
    if (!strcmp(argv[1], "json"))
        return do_json();
    die("unknown mode");
    return 2;
}
