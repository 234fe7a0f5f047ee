/* decide_record.h: the DECIDE record (spec/decision-record.md), engine side, shared
 * by every decision engine (engines/fixture, engines/sparrow): the record
 * checked against every rule of the spec (the wire is a trust boundary; a
 * refusal names the field by its path), and a growable buffer to write the
 * DECISION answer into. The engine only computes the probabilities. */
#ifndef SERVEPROTO_DECIDE_RECORD_H
#define SERVEPROTO_DECIDE_RECORD_H

#include "json.h"

#include <stddef.h>
#include <stdint.h>

#define DECIDE_MAX_QUESTIONS 64
#define DECIDE_MAX_OPTIONS   255
#define DECIDE_ERR_MAX       512

enum { DECIDE_NOUL = 0, DECIDE_CHOICE = 1, DECIDE_SCORE = 2 }; /* a question's type */

/* One question's checked view (pointers into the record's tree). */
typedef struct decide_question {
    const spj_value *id, *type, *instructions, *options;
    int kind; /* DECIDE_NOUL, DECIDE_CHOICE or DECIDE_SCORE */
} decide_question;

/* A checked record; it owns its parsed tree (free with decide_record_free). */
typedef struct decide_rec {
    spj_value root;
    const spj_value *state, *state_type; /* strings */
    size_t n;                            /* questions, 1 to DECIDE_MAX_QUESTIONS */
    decide_question q[DECIDE_MAX_QUESTIONS];
} decide_rec;

/* Parses and checks record[0..len) in the form the engine takes (raw != 0:
 * the raw form, else the default form). Returns 0 and fills *out, or -1 with
 * "<field>: <reason>" in err (the text of ERROR <id> DECIDE_INVALID; *out
 * then owns nothing). */
int decide_record_check(const unsigned char *record, size_t len, int raw, decide_rec *out,
                        char err[DECIDE_ERR_MAX]);
void decide_record_free(decide_rec *r);

/* A growable string; on allocation failure it sets oom and drops output. */
typedef struct decide_buf {
    char *p;
    size_t len, cap;
    int oom;
} decide_buf;

void decide_buf_add(decide_buf *b, const char *s, size_t n);
void decide_buf_printf(decide_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string: '"', '\\' and control bytes escaped, UTF-8 kept as is. */
void decide_buf_json_str(decide_buf *b, const char *s, size_t n);
/* A double that round-trips (%.17g); the caller never passes NaN or inf. */
void decide_buf_num(decide_buf *b, double x);

#endif
