/* score_request.h: the SCORE payload (spec/serve-protocol.md 9.1) read and its shape checked, once for
 * every engine that serves SCORE (engines/fixture, engines/llama): the grammar of serveproto's Score and
 * score_shape (serveproto/_events.py), with the optional keys an engine advertises in CAPS (x_score_base:
 * a group's base; x_hidden: hidden layers). A refusal is "<field>: <reason>", the text of
 * ERROR <id> BAD_REQUEST, the field named by its path. What the texts are in tokens (an option's scored
 * tokens, its context, the context's length) is each engine's own, checked after it tokenizes;
 * sp_score_field names those fields the same way. */
#ifndef SERVEPROTO_SCORE_REQUEST_H
#define SERVEPROTO_SCORE_REQUEST_H

#include "json.h"

#include <stddef.h>

#define SP_SCORE_MAX_SCORED 200 /* scored tokens per option, at most (spec 9.1) */
#define SP_SCORE_MAX_HIDDEN 4   /* layers one SCORE's hidden may name (spec 9.1) */
#define SP_SCORE_ERR_MAX    256 /* room for a refusal */

/* What the engine serves beyond the base grammar, and how its refusals name fields. */
typedef struct sp_score_rules {
    int base;          /* CAPS x_score_base=1: a group may carry base */
    int hidden_layers; /* CAPS x_hidden: hidden may name layers 0 .. hidden_layers - 1 (0: hidden refused) */
    int strict;        /* a key the grammar does not name is refused (else ignored) */
    int dotted;        /* fields named groups.0.options.1 rather than the spec's groups[0].options[1] (the
                        * fixture's texts, which its tests assert) */
} sp_score_rules;

/* One group, checked: pointers into the request's tree. */
typedef struct sp_score_group {
    const spj_value *stem;    /* a string */
    const spj_value *options; /* an array of strings, at least one (options->items[o], options->n) */
    size_t base;              /* the prefix's bytes the group continues: base, else the prefix's length */
} sp_score_group;

/* A checked SCORE payload; it owns its parsed tree and groups (free with sp_score_free). */
typedef struct sp_score_request {
    spj_value root;
    const spj_value *prefix;  /* a string */
    sp_score_group *groups;   /* n_groups, at least one */
    size_t n_groups;
    size_t n_options;         /* over all groups */
    int pin;                  /* pin, else 0 */
    int n_hidden;             /* hidden's layers, in the request's order (0: no hidden) */
    int hidden[SP_SCORE_MAX_HIDDEN];
} sp_score_request;

/* Reads payload[0..len) under rules into *out. Returns 0, or -1 with "<field>: <reason>" in err (*out then
 * owns nothing). The checks, in order: JSON, an object, (strict) no other keys than prefix, groups, pin and
 * hidden, prefix a string, groups a non-empty array, pin a boolean, hidden (served, an array of 1 to
 * SP_SCORE_MAX_HIDDEN whole layer numbers below hidden_layers), then each group in turn: an object, (strict)
 * no other keys than stem, options and base, stem a string, options a non-empty array, base (served, a whole
 * number of bytes from 0 to the prefix's length), each option a string. */
int sp_score_parse(const unsigned char *payload, size_t len, const sp_score_rules *rules, sp_score_request *out,
                   char err[SP_SCORE_ERR_MAX]);
void sp_score_free(sp_score_request *r);

/* Option o of group g named in rules' style into buf (cap bytes): "groups[1].options[0]" or
 * "groups.1.options.0". Returns buf. */
const char *sp_score_field(const sp_score_rules *rules, size_t g, size_t o, char *buf, size_t cap);

#endif
