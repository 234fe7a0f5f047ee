/* frame.h: the serve protocol's frame codec, engine side (spec/serve-protocol.md).
 *
 * Reading. An sp_reader owns a byte buffer that the engine fills with
 * sp_reader_fill() (one read() on a descriptor, e.g. after poll() said it is
 * readable) or sp_reader_feed() (bytes from anywhere). sp_reader_next() never
 * blocks: it parses the next complete request frame out of the buffered bytes
 * (line + payloads, strictly, per sections 1, 4, 7 and 8) or says it needs
 * more. So an engine can poll stdin between decode steps for STOP / CANCEL /
 * PING and parse whatever arrived without stalling generation:
 *
 *     sp_reader rd; sp_reader_init(&rd, SP_EXT_ALL);
 *     for (;;) {
 *         sp_request rq; sp_error err;
 *         sp_status st = sp_reader_next(&rd, &rq, &err);
 *         if (st == SP_FRAME) { handle(&rq); sp_request_free(&rq); continue; }
 *         if (st == SP_BAD)   { sp_write_error(&w, err.id, err.code, "%s", err.reason); continue; }
 *         if (st == SP_EOF)   break;
 *         if (sp_reader_fill(&rd, 0) < 0) break;          // SP_NEED_DATA: read more
 *     }
 *
 * A bad request frame is reported as SP_BAD with the code and the request id
 * to answer with (id 0 when the id cannot be read). When the bad line
 * announced a payload whose byte count could be read, the reader first takes
 * that payload (and its '\n'), so SP_BAD comes only once the stream is back in
 * step (section 7); a payload byte count over the limit is skipped by
 * discarding. A frame is judged once it is whole, as serveproto's Python
 * reader does: first each payload's closing '\n' (a missing one is an error
 * and the byte in its place is left unread), then the line. A frame cut by
 * the end of input is BAD_FRAME with id 0. The reader stays usable after
 * SP_BAD.
 *
 * Writing. An sp_writer formats each reply frame whole (line and payload)
 * into its buffer and hands it to its sink in one call, so every frame is
 * flushed as it is written and a fault injector (engines/fixture) can sit
 * between the engine and the pipe. Floats are printed with "%.9g"; NaN is
 * always "nan" (never "-nan"), infinities "inf" / "-inf" (section 1).
 *
 * Ownership: an sp_request owns its payload buffers (free with
 * sp_request_free); the reader and the writer own their buffers (free with
 * sp_reader_free / sp_writer_free). Nothing here is thread-safe.
 */
#ifndef SERVEPROTO_FRAME_H
#define SERVEPROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Limits (spec section 1). */
#define SP_MAX_LINE      4096               /* bytes of a line, its '\n' included */
#define SP_MAX_PAYLOAD   ((size_t)64 << 20) /* bytes of one payload the reader keeps */
#define SP_MAX_LOGPROBS  32                 /* largest logprobs= a request may ask (section 4) */
#define SP_CODE_MAX      24                 /* room for an error code, NUL included */
#define SP_REASON_MAX    512                /* room for an error reason, NUL included */

/* Extensions a reader accepts (section 9); a plain engine passes 0 and then
 * SCORE / PING are unknown kinds and counters= an unknown key. */
enum {
    SP_EXT_SCORE    = 1 << 0, /* SCORE requests (9.1) */
    SP_EXT_COUNTERS = 1 << 1, /* the counters= key on SUBMIT (9.2) */
    SP_EXT_HEALTH   = 1 << 2, /* PING requests (9.3) */
    SP_EXT_ALL      = SP_EXT_SCORE | SP_EXT_COUNTERS | SP_EXT_HEALTH,
};

typedef enum sp_kind {
    SP_SUBMIT = 1,
    SP_IMAGE,
    SP_STOP,
    SP_CANCEL,
    SP_DECIDE,
    SP_SCORE,
    SP_PING,
} sp_kind;

/* Name of a request kind ("SUBMIT", ...), or "?" for a value outside sp_kind. */
const char *sp_kind_name(sp_kind kind);

/* One parsed request frame. Fields a kind does not carry are 0. */
typedef struct sp_request {
    sp_kind kind;
    uint64_t id;            /* 1 .. 2^64-1 */
    uint64_t slot;          /* SUBMIT, DECIDE, SCORE */
    uint64_t max_tokens;    /* SUBMIT */
    double temperature;     /* SUBMIT, finite, >= 0 */
    double top_p;           /* SUBMIT, in (0, 1] */
    int has_gbytes;         /* SUBMIT: the optional grammar byte count was present */
    int logprobs;           /* SUBMIT keys, 0 when absent: logprobs 0..32, */
    int pin, ids, counters; /* pin / ids / counters 0 or 1 */
    uint64_t grid_h, grid_w;/* IMAGE */
    /* The payload (prompt, image, decision record, score JSON), owned by the
     * request; a NUL follows its last byte so text can be read as a C string
     * (it may hold NULs of its own: use payload_len). NULL when the kind has
     * no payload. */
    unsigned char *payload;
    size_t payload_len;
    unsigned char *grammar; /* SUBMIT's second payload when has_gbytes, else NULL */
    size_t grammar_len;
    /* SUBMIT with ids=1: the payload's token ids, parsed (the reader refuses
     * a payload that is not uints separated by single spaces, or is empty,
     * with BAD_FRAME). Range checks against the vocabulary are the engine's. */
    uint64_t *token_ids;
    size_t n_token_ids;
} sp_request;

/* Frees a request's payloads and zeroes it. Safe on a zeroed request. */
void sp_request_free(sp_request *rq);

/* A bad request frame: answer with ERROR <id> <code> <reason>. */
typedef struct sp_error {
    uint64_t id;                 /* 0 when the id could not be read */
    char code[SP_CODE_MAX];      /* "BAD_FRAME" (the reader reports nothing else) */
    char reason[SP_REASON_MAX];  /* one line, no '\n' */
} sp_error;

typedef enum sp_status {
    SP_NEED_DATA = 0, /* no complete frame buffered: fill and call again */
    SP_FRAME,         /* *rq holds a request (the caller frees it) */
    SP_BAD,           /* *err holds the error to answer; the reader goes on */
    SP_EOF,           /* the input ended and every buffered byte was used */
} sp_status;

/* The reader's state: read it through the functions below, not the fields. */
typedef struct sp_reader {
    unsigned char *buf;   /* buffered input, buf[start .. end) unread */
    size_t cap, start, end;
    unsigned ext;         /* SP_EXT_* flags */
    size_t max_line;      /* SP_MAX_LINE unless set */
    size_t max_payload;   /* SP_MAX_PAYLOAD unless set */
    uint64_t fed;         /* bytes ever given to the reader */
    int eof;              /* the input has ended */
    /* the frame being assembled: its line is parsed, its payloads are
     * awaited whole (state ST_FRAME), then their '\n' checked, then either
     * the request or the line's error (line_bad) is given */
    int state;
    sp_request cur;
    int line_bad;
    int sizes_ok;         /* the line's payload byte counts could be read */
    int nparts;           /* payloads announced: 0, 1, or 2 (SUBMIT with gbytes) */
    uint64_t sizes[2];
    uint64_t skip;        /* bytes to discard (a payload over the limit, '\n' included) */
    sp_error pending;     /* answered once the frame is in or skipped */
} sp_reader;

/* Initialises a reader accepting the extensions in ext. Returns 0, or -1 when
 * out of memory. */
int sp_reader_init(sp_reader *rd, unsigned ext);
void sp_reader_free(sp_reader *rd);
/* Overrides the line limit ('\n' included) and the payload limit, in bytes. */
void sp_reader_set_limits(sp_reader *rd, size_t max_line, size_t max_payload);
/* Bytes of input used up so far (parsed, or skipped as a bad frame's). */
uint64_t sp_reader_consumed(const sp_reader *rd);

/* One read() from fd into the buffer. Returns the bytes read (> 0), 0 at end
 * of input (the reader is then at EOF), or -1 with errno set (EINTR and
 * EAGAIN are the caller's to retry). */
ssize_t sp_reader_fill(sp_reader *rd, int fd);

/* Appends n bytes to the buffer; n == 0 marks the end of input. Returns 0,
 * or -1 when out of memory. */
int sp_reader_feed(sp_reader *rd, const void *data, size_t n);

/* The next request frame, or SP_NEED_DATA / SP_BAD / SP_EOF (see sp_status). */
sp_status sp_reader_next(sp_reader *rd, sp_request *rq, sp_error *err);

/* Strict number parsing (section 1), exposed for engines and tests.
 * Each returns 0 on success, -1 when s[0..n) is not the production. */
int sp_parse_uint(const char *s, size_t n, uint64_t *out);
int sp_parse_float(const char *s, size_t n, double *out);
/* ASCII decimal token ids separated by single spaces (SUBMIT ids=1), at
 * least one; *out is malloc'd (the caller frees it). */
int sp_parse_token_ids(const unsigned char *p, size_t n, uint64_t **out, size_t *count);

/* Formats x as the protocol writes floats: "%.9g", "nan", "inf", "-inf".
 * out needs SP_FLOAT_MAX bytes. Returns out. */
#define SP_FLOAT_MAX 32
char *sp_format_float(char out[SP_FLOAT_MAX], double x);
/* Significant digits sp_format_float writes: 9 by default (a float32 to the
 * last digit); 17 prints a double so that it reads back to the same bits
 * (engines' --float-digits, for tests that compare bits). */
extern int sp_float_digits;

/* ---- writing ---- */

/* Receives each frame whole; returns 0, or -1 when the output is gone. */
typedef int (*sp_sink_fn)(void *ctx, const unsigned char *frame, size_t len);

typedef struct sp_writer {
    unsigned char *buf;
    size_t len, cap;
    sp_sink_fn sink;
    void *ctx;
    int fd;       /* the default sink writes here */
    int failed;   /* a sink call failed: every later write returns -1 */
} sp_writer;

/* A writer whose frames go to fd with write() (retrying short writes and
 * EINTR). Returns 0, or -1 when out of memory. */
int sp_writer_init(sp_writer *w, int fd);
/* Replaces the sink (ctx is passed back to it). sp_write_fd_sink(&w->fd, ...)
 * is the default one, for a fault injector to call after its own work. */
void sp_writer_set_sink(sp_writer *w, sp_sink_fn sink, void *ctx);
int sp_write_fd_sink(void *fd_ptr, const unsigned char *frame, size_t len);
void sp_writer_free(sp_writer *w);

/* One alternative in an ECHO or DATA tail. */
typedef struct sp_alt {
    int64_t token_id;
    double logprob;
} sp_alt;

/* Counters of extension 9.2 and the fields of DONE. */
typedef struct sp_done {
    uint64_t emitted;        /* DATA frames sent */
    double tok_s;            /* generation speed, tokens per second */
    double hit_pct;          /* colibri's expert-cache hit rate; 0 here */
    double rss_gb;           /* resident memory, GB */
    uint64_t prompt_tokens;
    int length_limited;      /* 0 or 1 */
    int has_counters;        /* append computed= reused= snapshot= */
    uint64_t computed, reused;
    const char *snapshot;    /* "none", "hit" or "stale" */
    int has_disk;            /* append disk= (x_persist=1): positions of reused read from disk */
    uint64_t disk;
} sp_done;

/* Each writer returns 0 when the frame went to the sink, -1 otherwise.
 * Text arguments are written as given; a reason or detail has each '\n'
 * replaced by a space so the line stays one line. */
int sp_write_ready(sp_writer *w);                                  /* \x01\x01READY\x01\x01 */
int sp_write_caps(sp_writer *w, const char *fields);               /* CAPS <fields> */
int sp_write_stat(sp_writer *w, const double *fields, int n);      /* STAT <f>... */
int sp_write_load_fail(sp_writer *w, const char *kind, const char *detail);
int sp_write_accept(sp_writer *w, uint64_t id, uint64_t prompt_tokens);
int sp_write_echo(sp_writer *w, uint64_t id, uint64_t position, double logprob,
                  int k, const sp_alt *top, const void *text, size_t n);
/* has_tail = 0 writes DATA <id> <n> (byte-identical to colibri). */
int sp_write_data(sp_writer *w, uint64_t id, const void *text, size_t n,
                  int has_tail, double logprob, int k, const sp_alt *top);
int sp_write_decision(sp_writer *w, uint64_t id, const void *json, size_t n);
int sp_write_done(sp_writer *w, uint64_t id, const sp_done *d);
/* reason: printf format, may be NULL or "" for none. */
int sp_write_error(sp_writer *w, uint64_t id, const char *code, const char *reason_fmt, ...)
    __attribute__((format(printf, 4, 5)));
int sp_write_scored(sp_writer *w, uint64_t id, uint64_t group, uint64_t option,
                    uint64_t context_tokens, int n, const double *logprobs);
/* HIDDEN <id> <bytes> <group> <layer>\n + n float32 values, little-endian (SCORE's
 * `hidden`, 9.1): the bits as computed. */
int sp_write_hidden(sp_writer *w, uint64_t id, uint64_t group, uint64_t layer, int n, const float *values);
/* fields: "" or "key=value ..." after the id. */
int sp_write_pong(sp_writer *w, uint64_t id, const char *fields);
/* A free-form line (telemetry); fmt must not produce '\n'. */
int sp_write_line(sp_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
