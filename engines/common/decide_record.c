/* decide_record.c: checks DECIDE records (see decide_record.h). The wire is a trust
 * boundary: every bound of spec/decision-record.md is checked again here, and
 * a refusal names the field by its path. */
#include "decide_record.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void decide_buf_add(decide_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void decide_buf_printf(decide_buf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        decide_buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string: '"', '\\' and control bytes escaped, UTF-8 kept as is. */
void decide_buf_json_str(decide_buf *b, const char *s, size_t n)
{
    decide_buf_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            decide_buf_add(b, e, 2);
        } else if (c < 0x20) {
            decide_buf_printf(b, "\\u%04x", c);
        } else {
            decide_buf_add(b, (const char *)&s[i], 1);
        }
    }
    decide_buf_add(b, "\"", 1);
}

/* A double that round-trips (%.17g); the rule never makes NaN or inf. */
void decide_buf_num(decide_buf *b, double x)
{
    decide_buf_printf(b, "%.17g", x);
}

/* "<field>: <reason>" into err; returns -1. */
#define invalid(err, ...) spj_refuse((err), DECIDE_ERR_MAX, __VA_ARGS__)

/* Refuses a key of o not in allowed (NULL-terminated). */
static int only_keys(const spj_value *o, const char *const *allowed, const char *path, char *err)
{
    for (size_t i = 0; i < o->n; i++) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strlen(*a) == o->key_lens[i] && memcmp(*a, o->keys[i], o->key_lens[i]) == 0)
                ok = 1;
        if (!ok)
            return invalid(err, "%s%s%.60s: unknown key", path, *path ? "." : "", o->keys[i]);
    }
    return 0;
}

static int is_str(const spj_value *v, const char *lit)
{
    return v && v->type == SPJ_STRING && v->len == strlen(lit) && memcmp(v->str, lit, v->len) == 0;
}

/* One question's parsed view. */


static int check_option(const spj_value *o, const char *path, int raw, char *err)
{
    static const char *const keys_default[] = {"label", "text", NULL};
    static const char *const keys_raw[] = {"label", "text", "json", NULL};
    if (o->type != SPJ_OBJECT)
        return invalid(err, "%s: expected an object", path);
    if (only_keys(o, raw ? keys_raw : keys_default, path, err) < 0)
        return -1;
    const spj_value *label = spj_get(o, "label"), *text = spj_get(o, "text");
    if (!label || label->type != SPJ_STRING)
        return invalid(err, "%s.label: expected a string", path);
    if (!text && !raw)
        return invalid(err, "%s.text: missing", path);
    if (text && text->type != SPJ_STRING && text->type != SPJ_NULL)
        return invalid(err, "%s.text: expected a string or null", path);
    const spj_value *json = spj_get(o, "json");
    if (json) {
        if (json->type != SPJ_BOOL || !json->boolean)
            return invalid(err, "%s.json: expected true", path);
        if (!text || text->type != SPJ_STRING)
            return invalid(err, "%s.json: set on an option without a text", path);
    }
    return 0;
}

static int check_question(const spj_value *q, size_t qi, int raw, decide_question *out, char *err)
{
    static const char *const keys[] = {"id", "type", "instructions", "options", NULL};
    char path[64];
    snprintf(path, sizeof path, "questions.%zu", qi);
    if (q->type != SPJ_OBJECT)
        return invalid(err, "%s: expected an object", path);
    if (only_keys(q, keys, path, err) < 0)
        return -1;
    out->id = spj_get(q, "id");
    out->type = spj_get(q, "type");
    out->instructions = spj_get(q, "instructions");
    out->options = spj_get(q, "options");
    if (!out->id || out->id->type != SPJ_STRING || out->id->len == 0)
        return invalid(err, "%s.id: expected a non-empty string", path);
    int noul = is_str(out->type, "noul"), choice = is_str(out->type, "choice"),
        score = is_str(out->type, "score");
    if (!noul && !choice && !score)
        return invalid(err, "%s.type: expected \"noul\", \"choice\" or \"score\"", path);
    out->kind = noul ? DECIDE_NOUL : choice ? DECIDE_CHOICE : DECIDE_SCORE;
    if (!out->instructions)
        return invalid(err, "%s.instructions: missing", path);
    if (out->instructions->type != SPJ_STRING && !(raw && out->instructions->type == SPJ_NULL))
        return invalid(err, "%s.instructions: expected a string%s", path, raw ? " or null" : "");
    const spj_value *opts = out->options;
    if (!opts || opts->type != SPJ_ARRAY)
        return invalid(err, "%s.options: expected an array", path);
    if (noul && opts->n != 2)
        return invalid(err, "%s.options: a noul has exactly 2 options, got %zu", path, opts->n);
    if (opts->n < 1 || opts->n > DECIDE_MAX_OPTIONS)
        return invalid(err, "%s.options: expected 1 to %d options, got %zu", path,
                       DECIDE_MAX_OPTIONS, opts->n);
    for (size_t i = 0; i < opts->n; i++) {
        char opath[96];
        snprintf(opath, sizeof opath, "%s.options.%zu", path, i);
        if (check_option(&opts->items[i], opath, raw, err) < 0)
            return -1;
        const spj_value *label = spj_get(&opts->items[i], "label");
        char want[24];
        if (noul)
            snprintf(want, sizeof want, "%s", i == 0 ? "false" : "true");
        else if (score)
            snprintf(want, sizeof want, "%zu", i);
        if ((noul || score) && !is_str(label, want))
            return invalid(err, "%s.label: expected \"%s\"", opath, want);
        for (size_t j = 0; choice && j < i; j++) {
            const spj_value *other = spj_get(&opts->items[j], "label");
            if (other->len == label->len && memcmp(other->str, label->str, label->len) == 0)
                return invalid(err, "%s.label: duplicate of options.%zu", opath, j);
        }
    }
    return 0;
}

int decide_record_check(const unsigned char *record, size_t len, int raw, decide_rec *out,
                        char err[DECIDE_ERR_MAX])
{
    static const char *const keys_default[] = {"state", "state_type", "questions", NULL};
    static const char *const keys_raw[] = {"record", "state", "state_type", "questions", NULL};
    static const char *const state_types[] = {"string", "object", "array", "number", "boolean", "null", NULL};
    memset(out, 0, sizeof *out);
    char jerr[SPJ_ERR_MAX];
    if (spj_parse((const char *)record, len, &out->root, jerr) < 0)
        return invalid(err, "record: not valid JSON (%s)", jerr);
    const spj_value *root = &out->root;
    if (root->type != SPJ_OBJECT) {
        invalid(err, "record: expected an object");
        goto bad;
    }
    if (only_keys(root, raw ? keys_raw : keys_default, "", err) < 0)
        goto bad;
    const spj_value *form = spj_get(root, "record");
    if (raw && !is_str(form, "raw")) {
        invalid(err, "record: expected \"raw\" (this engine takes the raw form)");
        goto bad;
    }
    const spj_value *state = spj_get(root, "state"), *state_type = spj_get(root, "state_type");
    const spj_value *questions = spj_get(root, "questions");
    if (!state || state->type != SPJ_STRING) {
        invalid(err, "state: expected a string");
        goto bad;
    }
    int type_ok = 0;
    for (const char *const *t = state_types; *t; t++)
        type_ok |= is_str(state_type, *t);
    if (!type_ok) {
        invalid(err, "state_type: expected one of string, object, array, number, boolean, null");
        goto bad;
    }
    if (!questions || questions->type != SPJ_ARRAY) {
        invalid(err, "questions: expected an array");
        goto bad;
    }
    if (questions->n < 1 || questions->n > DECIDE_MAX_QUESTIONS) {
        invalid(err, "questions: expected 1 to %d questions, got %zu", DECIDE_MAX_QUESTIONS, questions->n);
        goto bad;
    }
    for (size_t i = 0; i < questions->n; i++) {
        if (check_question(&questions->items[i], i, raw, &out->q[i], err) < 0)
            goto bad;
        for (size_t j = 0; j < i; j++)
            if (out->q[j].id->len == out->q[i].id->len &&
                memcmp(out->q[j].id->str, out->q[i].id->str, out->q[i].id->len) == 0) {
                invalid(err, "questions.%zu.id: duplicate of questions.%zu.id", i, j);
                goto bad;
            }
    }
    out->state = state;
    out->state_type = state_type;
    out->n = questions->n;
    return 0;
bad:
    decide_record_free(out);
    return -1;
}

void decide_record_free(decide_rec *r)
{
    spj_free(&r->root);
    memset(r, 0, sizeof *r);
}
