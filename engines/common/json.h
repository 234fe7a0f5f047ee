/* json.h: a small strict JSON reader (RFC 8259) for DECIDE records and SCORE
 * payloads.
 *
 * spj_parse() reads one UTF-8 JSON text into a tree of spj_value. Strings are
 * unescaped to UTF-8 (\uXXXX with surrogate pairs; a lone surrogate is an
 * error), invalid UTF-8 is refused, nesting deeper than SPJ_MAX_DEPTH is
 * refused, and so is an object with a key twice (a record on a trust boundary
 * has one reading, not the last-key-wins one). Numbers are doubles (strtod).
 *
 * Ownership: the tree is owned by its root; spj_free(&root) frees it all.
 */
#ifndef SERVEPROTO_JSON_H
#define SERVEPROTO_JSON_H

#include <stddef.h>

#define SPJ_MAX_DEPTH 64   /* arrays / objects nested at most this deep */
#define SPJ_ERR_MAX   128  /* room for a parse error message */

typedef enum spj_type {
    SPJ_NULL = 0,
    SPJ_BOOL,
    SPJ_NUMBER,
    SPJ_STRING,
    SPJ_ARRAY,
    SPJ_OBJECT,
} spj_type;

typedef struct spj_value {
    spj_type type;
    int boolean;               /* SPJ_BOOL: 0 or 1 */
    double number;             /* SPJ_NUMBER */
    char *str;                 /* SPJ_STRING: UTF-8, NUL-terminated (may hold NULs: use len) */
    size_t len;                /* SPJ_STRING: bytes */
    struct spj_value *items;   /* SPJ_ARRAY items, SPJ_OBJECT values, n of them */
    char **keys;               /* SPJ_OBJECT keys (NUL-terminated), parallel to items */
    size_t *key_lens;          /* SPJ_OBJECT key lengths in bytes */
    size_t n;
} spj_value;

/* Parses text[0..len) into *out. Returns 0, or -1 with a message in err
 * (e.g. "byte 17: expected ':'") and *out left as SPJ_NULL. */
int spj_parse(const char *text, size_t len, spj_value *out, char err[SPJ_ERR_MAX]);

/* Frees a parsed tree and zeroes it. */
void spj_free(spj_value *v);

/* The value of key in an object, or NULL (also when v is not an object). */
const spj_value *spj_get(const spj_value *v, const char *key);

/* Name of a type: "null", "boolean", "number", "string", "array", "object". */
const char *spj_type_name(spj_type t);

/* A checker's refusal of a parsed text: the message ("<field>: <reason>") formatted into err, at most cap
 * bytes. Returns -1, the checker's answer. */
int spj_refuse(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
