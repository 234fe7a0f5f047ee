/* score_request.c: the SCORE payload's grammar (score_request.h). */
#include "score_request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "<field>: <reason>" into err; returns -1. */
#define refuse(err, ...) spj_refuse((err), SP_SCORE_ERR_MAX, __VA_ARGS__)

/* "groups[g]" or "groups.g" */
static const char *group_field(const sp_score_rules *rules, size_t g, char *buf, size_t cap)
{
    snprintf(buf, cap, rules->dotted ? "groups.%zu" : "groups[%zu]", g);
    return buf;
}

const char *sp_score_field(const sp_score_rules *rules, size_t g, size_t o, char *buf, size_t cap)
{
    snprintf(buf, cap, rules->dotted ? "groups.%zu.options.%zu" : "groups[%zu].options[%zu]", g, o);
    return buf;
}

/* A key of o outside allowed (NULL-terminated), or NULL. */
static const char *other_key(const spj_value *o, const char *const *allowed)
{
    for (size_t i = 0; i < o->n; i++) {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strlen(*a) == o->key_lens[i] && memcmp(*a, o->keys[i], o->key_lens[i]) == 0;
        if (!ok)
            return o->keys[i];
    }
    return NULL;
}

/* v is a whole number from lo to hi. */
static int whole(const spj_value *v, double lo, double hi)
{
    return v->type == SPJ_NUMBER && v->number >= lo && v->number == floor(v->number) && v->number <= hi;
}

static int check_hidden(const spj_value *hv, const sp_score_rules *rules, sp_score_request *out, char *err)
{
    if (rules->hidden_layers <= 0)
        return refuse(err, "hidden: this engine reads no hidden states (x_hidden=0)");
    if (hv->type != SPJ_ARRAY || hv->n < 1 || hv->n > SP_SCORE_MAX_HIDDEN)
        return refuse(err, "hidden: expected an array of 1 to %d layers", SP_SCORE_MAX_HIDDEN);
    for (size_t k = 0; k < hv->n; k++) {
        if (!whole(&hv->items[k], 0, rules->hidden_layers - 1))
            return refuse(err, rules->dotted ? "hidden.%zu: expected a layer from 0 to %d"
                                             : "hidden[%zu]: expected a layer from 0 to %d",
                          k, rules->hidden_layers - 1);
        out->hidden[out->n_hidden++] = (int)hv->items[k].number;
    }
    return 0;
}

static int check_group(const spj_value *gv, size_t g, const sp_score_rules *rules, sp_score_request *out, char *err)
{
    static const char *const keys[] = { "stem", "options", "base", NULL };
    char f[64], of[96];
    group_field(rules, g, f, sizeof f);
    if (gv->type != SPJ_OBJECT)
        return refuse(err, "%s: expected an object", f);
    const char *other = rules->strict ? other_key(gv, keys) : NULL;
    if (other)
        return refuse(err, "%s.%.60s: unknown key", f, other);
    sp_score_group *gr = &out->groups[g];
    gr->stem = spj_get(gv, "stem");
    gr->options = spj_get(gv, "options");
    const spj_value *bv = spj_get(gv, "base");
    if (!gr->stem || gr->stem->type != SPJ_STRING)
        return refuse(err, "%s.stem: expected a string", f);
    if (!gr->options || gr->options->type != SPJ_ARRAY || gr->options->n == 0)
        return refuse(err, "%s.options: expected a non-empty array", f);
    gr->base = out->prefix->len;
    if (bv && !rules->base)
        return refuse(err, "%s.base: this engine takes no base (x_score_base=0)", f);
    if (bv && !whole(bv, 0, (double)out->prefix->len))
        return refuse(err, "%s.base: expected a whole number of bytes from 0 to the prefix's %zu", f,
                      out->prefix->len);
    if (bv)
        gr->base = (size_t)bv->number;
    for (size_t o = 0; o < gr->options->n; o++)
        if (gr->options->items[o].type != SPJ_STRING)
            return refuse(err, "%s: expected a string", sp_score_field(rules, g, o, of, sizeof of));
    out->n_options += gr->options->n;
    return 0;
}

static int check(const sp_score_rules *rules, sp_score_request *out, char *err)
{
    static const char *const keys[] = { "prefix", "groups", "pin", "hidden", NULL };
    const spj_value *r = &out->root;
    if (r->type != SPJ_OBJECT)
        return refuse(err, "payload: expected an object");
    const char *other = rules->strict ? other_key(r, keys) : NULL;
    if (other)
        return refuse(err, "%.60s: unknown key", other);
    out->prefix = spj_get(r, "prefix");
    const spj_value *groups = spj_get(r, "groups"), *pin = spj_get(r, "pin"), *hidden = spj_get(r, "hidden");
    if (!out->prefix || out->prefix->type != SPJ_STRING)
        return refuse(err, "prefix: expected a string");
    if (!groups || groups->type != SPJ_ARRAY || groups->n == 0)
        return refuse(err, "groups: expected a non-empty array");
    if (pin && pin->type != SPJ_BOOL)
        return refuse(err, "pin: expected a boolean");
    out->pin = pin ? pin->boolean : 0;
    if (hidden && check_hidden(hidden, rules, out, err) < 0)
        return -1;
    out->groups = calloc(groups->n, sizeof *out->groups);
    if (!out->groups)
        return refuse(err, "payload: out of memory");
    out->n_groups = groups->n;
    for (size_t g = 0; g < groups->n; g++)
        if (check_group(&groups->items[g], g, rules, out, err) < 0)
            return -1;
    return 0;
}

int sp_score_parse(const unsigned char *payload, size_t len, const sp_score_rules *rules, sp_score_request *out,
                   char err[SP_SCORE_ERR_MAX])
{
    char jerr[SPJ_ERR_MAX];
    memset(out, 0, sizeof *out);
    if (spj_parse((const char *)payload, len, &out->root, jerr) < 0)
        return refuse(err, "payload: not valid JSON (%s)", jerr);
    if (check(rules, out, err) < 0) {
        sp_score_free(out);
        return -1;
    }
    return 0;
}

void sp_score_free(sp_score_request *r)
{
    spj_free(&r->root);
    free(r->groups);
    memset(r, 0, sizeof *r);
}
