/* engine.h: the llama engine's shared state (engines/llama, spec/serve-protocol.md).
 *
 * One process serves one model. KV slot s is llama.cpp sequence s; SCORE
 * borrows the sequences above the slots as scratch, one per continuation,
 * in a unified KV cache so copied prefix rows are shared, not duplicated.
 * Requests on different slots run at once (sched.c): each llama_decode is
 * filled from every runnable request, a chunk of at most its share of one
 * ubatch each, least recently served first. While a decode runs, the engine
 * reads stdin from llama.cpp's abort callback, between the graph nodes
 * (main.c: engine_decode_abort), so PING is answered, STOP recorded and a
 * CANCEL aborts the decode within one ubatch of ENGINE_UBATCH positions.
 */
#ifndef SERVEPROTO_LLAMA_ENGINE_H
#define SERVEPROTO_LLAMA_ENGINE_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "frame.h"
#include "loop.h"
#include "score_request.h"
#include "llama.h"
#include "llamax.h" /* what our llama.cpp patches add: only through it */
#include "picture.h" /* pictures (--mmproj): only through it */

#define ENGINE_MAX_LOGPROBS   SP_MAX_LOGPROBS /* CAPS max_logprobs */
#define ENGINE_AUTO_SLOTS_MAX 4               /* --slots unset: at most this many, sized from memory (main.c) */
#define ENGINE_AUTO_SLOTS_GPU 32              /* the same on a GPU, where a decode of many requests' rows costs
                                                 little more than one of a few: batching pays (bench/results/NOTEBOOK.md,
                                                 "Whole ubatches": 32 slots against the earlier 16 at 32
                                                 clients) */
#define ENGINE_AUTO_KV_SHARE  8               /* --slots unset: the KV cache takes at most 1/this of free memory */
#define ENGINE_AUTO_KV_SHARE_GPU 4            /* ... of a GPU's free memory (the model's weights are loaded) */
#define ENGINE_DEFAULT_CTX    4096            /* tokens per slot, capped by the model's n_ctx_train */
#define ENGINE_DEFAULT_CTX_MAX 32768          /* --ctx-max unset: the longest prompt is the model's n_ctx_train,
                                                 at most this many tokens (and never fewer than a slot's) */
#define ENGINE_DEFAULT_PINS   4               /* snapshots kept (CAPS pin_slots) */
#define ENGINE_MAX_SEQ        256             /* llama.cpp's sequence ids (LLAMA_MAX_SEQ): slots + SCORE scratch */
#define ENGINE_MAX_SLOTS      120             /* slots and their SCORE carries, 2 ids each, leave 16 for scratch */
#define ENGINE_MAX_SCORED     SP_SCORE_MAX_SCORED /* scored tokens per SCORE option (spec 9.1) */
#define ENGINE_QUEUE_MAX      256             /* requests in flight */
#define ENGINE_UBATCH         512             /* llama.cpp's physical batch (--ubatch): a CANCEL waits at most one */
#define ENGINE_CHUNK          128             /* rows a request takes from a decode that others share (--chunk) */
#define ENGINE_POLL_US        1000            /* the abort callback reads stdin at most this often (microseconds) */
#define ENGINE_PREFIXES       4               /* SCORE prefixes whose tokens are kept (splice.c) */
#define ENGINE_SCORE_CACHE_MB 64              /* SCORE results kept between requests (score_cache.c) */
#define ENGINE_CACHE_DISK_MB  2048            /* --cache-dir's disk budget (persist.c) */

#define DEVICES_MAX      16  /* llama_max_devices() of this llama.cpp: --tensor-split entries, --rpc servers */
#define DEVICES_NAME_CAP 256 /* bytes of one --rpc host:port or --tensor-split entry */

/* --split-mode, --tensor-split, --main-gpu and --rpc, passed to llama.cpp (devices.c). */
typedef struct device_options {
    int split_mode, split_mode_set;     /* enum llama_split_mode: none, layer, row */
    float tensor_split[DEVICES_MAX];    /* shares per device, the rest 0 */
    int n_tensor_split;
    int main_gpu, main_gpu_set;
    char rpc[DEVICES_MAX][DEVICES_NAME_CAP]; /* host:port of each ggml-rpc-server */
    int n_rpc;
    struct ggml_backend_device *devices[DEVICES_MAX + 1]; /* with --rpc: llama_model_params.devices, NULL-ended */
} device_options;

/* A task's life (sched.c; spec/llama-engine.md, "Many requests at once"),
 * every transition written down:
 *   FREE -> QUEUED        a SUBMIT or SCORE taken from stdin (main.c: on_request)
 *   QUEUED -> FREE        CANCEL before it started: answered CANCELLED at once (main.c: on_cancel)
 *   QUEUED -> RUNNING     its start runs, between decodes, in arrival order (tasks.c: tasks_start_new);
 *                         a start that answers it whole (-1) ends it: -> FREE
 *   RUNNING -> CANCELLED  CANCEL arrived; a decode holding its rows aborts (main.c: on_cancel)
 *   RUNNING -> FREE       its DONE or ERROR is written (task_end), from want, fill, decoded, fail
 *   CANCELLED -> FREE     answered CANCELLED at the next step (sched.c: sched_step), or its DONE
 *                         when the decode it is in finishes it first (a CANCEL read while the
 *                         device computes, overlap: the decode is not aborted; a pending task,
 *                         the pipeline: after its rows are read)
 * RUNNING and CANCELLED tasks hold their kind's state (st); QUEUED ones hold nothing. STOP is
 * not a state: a flag that a generation's want reads (and a SCORE ignores). */
typedef enum task_state {
    TASK_FREE = 0,  /* the entry is unused (a zeroed task) */
    TASK_QUEUED,    /* taken, not started */
    TASK_RUNNING,   /* started: st holds its kind's state */
    TASK_CANCELLED, /* started, CANCEL arrived: answered between decodes */
} task_state;

struct task_ops;

/* A request taken from stdin and not yet answered (sched.c). A task is
 * started (tokenized, ACCEPTed) between decodes, then gives rows to the
 * decodes until it ends: it writes its DONE or ERROR and is freed at once.
 * The scheduler runs it through its kind's operations (ops), never by kind. */
typedef struct task {
    task_state state;
    const struct task_ops *ops; /* submit_ops or score_ops (main.c) */
    sp_request rq;
    uint64_t arrival;  /* arrival order (ties of served) */
    uint64_t served;   /* the decode that last took rows from it */
    int stop;       /* STOP arrived: generate nothing more */
    int row0, rows; /* its rows in the batch being decoded (rows 0: none) */
    int pending;    /* its rows are in the decode left in flight, not read yet (gpu_pipe.c, the pipeline) */
    uint64_t in_us; /* SERVEPROTO_PROFILE: when it was taken from stdin (profile_now_us), for its answer's time */
    picture_set *pics; /* its IMAGE frames' pictures, owned (NULL: none); it starts only with no decode in flight */
    void *st;       /* its kind's state (submit.c's or score.c's) */
} task;

/* Started: st holds its kind's state (RUNNING or CANCELLED). */
static inline int task_started(const task *t)
{
    return t->state == TASK_RUNNING || t->state == TASK_CANCELLED;
}

/* The tokens whose KV rows sequence `slot` holds, positions 0 .. n-1. */
typedef struct slot_state {
    llama_token *tokens; /* capacity n_ctx */
    int n;
} slot_state;

/* A pin=1 snapshot: token ids, the slot whose KV rows hold them, and the
 * logits of the last position (they predict the first position after it). */
typedef struct snapshot {
    int used;
    int slot;
    llama_token *tokens; /* owned, n entries */
    int n;
    float *logits;       /* owned, n_vocab entries */
    double lse;          /* their logsumexp (model_logsumexp), NAN until computed (snapshot_lse) */
    uint64_t last_use;   /* LRU clock */
    int on_disk;         /* --cache-dir: a file holds it (persist.c writes the others when idle) */
} snapshot;

/* How a request's prompt positions were obtained (counters of spec 9.2). */
typedef struct reuse_info {
    int reused;          /* positions taken from the KV cache or a snapshot */
    const char *snapshot;/* "none", "hit", "stale" */
} reuse_info;

/* A SCORE prefix's tokenization, kept so that a continuation is tokenized
 * from a safe cut near the prefix's end instead of from byte 0 (splice.c). */
typedef struct prefix_tokens {
    char *text;          /* owned copy of the prefix bytes; NULL: unused entry */
    size_t len;
    llama_token *toks;   /* owned, n entries: the prefix's whole-text tokenization */
    int n;
    int cut;             /* tails start at token cut; -1: no safe cut, tokenize whole */
    size_t cut_off;      /* byte offset in text where token cut starts */
    uint64_t last_use;   /* LRU clock */
} prefix_tokens;

/* A SCORE group's stem tokenized once, its tail kept so that each option is
 * tokenized from a cut near the stem's end (splice.c, splice_stem). */
typedef struct stem_tokens {
    prefix_tokens tail;  /* the prefix's bytes from its cut + the stem, and their tokens */
    int head;            /* the prefix's tokens before tail (its cut); -1: no tail kept */
} stem_tokens;

/* How the continuations of SCORE were tokenized (stderr with --splice-check). */
typedef struct splice_stats {
    uint64_t spliced;    /* prefix tokens + a tail tokenized from the cut */
    uint64_t whole;      /* no safe cut, or the tail failed its check: whole text */
    uint64_t mismatched; /* --splice-check: the splice differed from the whole text */
    uint64_t stem;       /* of the spliced: an option tokenized from its stem's cut (splice_option) */
} splice_stats;

/* SCORE results kept between requests (score_cache.c). */
typedef struct score_key {
    uint64_t h1, h2;     /* two independent hashes of the token ids */
    int n;               /* tokens hashed */
} score_key;

struct score_entry;
typedef struct score_cache {
    struct score_entry **buckets;
    size_t n_buckets;    /* a power of two; 0: the cache is off */
    struct score_entry *lru_head, *lru_tail;
    size_t bytes, budget;
    uint64_t entries, hits, misses;
} score_cache;

/* profile.c: SERVEPROTO_PROFILE, a decode step's time by part (microseconds) */
#define ENGINE_PROFILE_PARTS 7 /* gap, start, fill, decode, early, sync, read */
typedef struct engine_profile {
    int on;
    FILE *f;
    uint64_t t0, reported, last_end;
    uint64_t decodes, rows, outputs;
    int max_rows; /* the most rows one decode held */
    uint64_t early; /* tasks started early, while the device computed (overlap) */
    uint64_t pipelined; /* decodes whose rows were read after the next decode was queued (the pipeline) */
    uint64_t waited;    /* waits for the next requests while the device computed (the pipeline) */
    uint64_t whole;     /* decodes of a whole ubatch of rows (or more) */
    uint64_t cut;       /* decodes of fewer rows although the runnable tasks wanted a ubatch (units, n_chunk) */
    uint64_t starved;   /* decodes of fewer rows because the runnable tasks wanted fewer */
    uint64_t answered, answer_us; /* requests answered after they started, and their microseconds from
                                     being read off stdin to the answer */
    uint64_t readout_us, lse_us;  /* the decodes' rows read (readout.c: readout_pending), and of that the
                                     logsumexps (rows_lse) */
    uint64_t alone, alone_us;     /* llama_decode calls with no decode in flight, and their microseconds:
                                     on a GPU, llama_decode's own host work with the device idle */
    uint64_t padded;              /* rows of padding decoded (SERVEPROTO_PAD_ROWS; not in rows) */
    uint64_t late, late_us;       /* the late fill's waits (gpu_pipe.c) and their microseconds */
    uint64_t us[ENGINE_PROFILE_PARTS];
} engine_profile;
/* llama_decode's own split (llama/patches/profile/0007, on with SERVEPROTO_PROFILE; llamax_decode_profile):
 * microseconds of batch checked, memory (ubatches split, cells found),
 * output buffer, cells applied, graph built, graph allocated, inputs set,
 * graph computed or queued, outputs queued; then ubatches, graphs reused,
 * KV cells attended (n_kv) and tokens, summed over ubatches. */
#define SERVEPROTO_DECODE_PARTS 9

/* The late fill (late_fill.c; SERVEPROTO_PIPELINE_LATE=US, with the pipeline): what it has measured of the
 * device and the host, to fill the next decode just before the device needs it. Microseconds of
 * CLOCK_MONOTONIC (profile_now_us). */
typedef struct late_fill {
    int margin_us;     /* the fill is due this long before the host's own lead (0: off) */
    uint64_t end_us;   /* when the decode read last ended on the device (its read waited for it; 0: unknown) */
    double us_row;     /* the device's time a row, padding included (0: none measured yet) */
    double lead_us;    /* from the end of a step's wait to the next llama_decode's return: the starts, the
                        * fill and llama_decode's own host work (0: none measured yet) */
    uint64_t left_us;  /* when the last step's wait ended (0: the step read at once) */
    uint64_t queued_last_us, queued_prev_us; /* when the last llama_decode returned, and the one before */
    int after_late;    /* the decode in flight was filled after a late wait */
} late_fill;

/* How the scheduler reads stdin while it waits on the device (tasks.c, gpu_pipe.c): a hook that main.c
 * sets, so no call climbs back from the scheduler to main.c. Each frame read is taken by the frame loop's
 * hooks as it comes (a task queued, a CANCEL recorded, a PING answered). */
typedef struct engine_input {
    void (*poll)(void *ctx);                 /* takes what stdin holds now, without blocking */
    void (*wait)(void *ctx, int timeout_ms); /* waits at most timeout_ms for stdin, then takes what came */
    void *ctx;
} engine_input;

typedef struct engine {
    struct llama_model *model;
    struct llama_context *ctx;
    const struct llama_vocab *vocab;
    int n_vocab;
    int n_slots;
    int n_ctx;           /* per slot */
    int n_ctx_max;       /* the longest prompt (CAPS x_max_prompt, --ctx-max): a slot past n_ctx holds the lease */
    int lease_slot;      /* the one slot whose sequence may pass n_ctx, up to n_ctx_max (-1: none; sched.c) */
    int n_pins;
    int n_score_seqs;
    int n_batch;
    int n_ubatch;        /* llama.cpp's physical batch (--ubatch) */
    int n_chunk;         /* --chunk: a request's rows in a decode shared with others, at most */
    int slots_auto;      /* --slots unset: n_slots was sized from memory */
    char model_name[256];
    const char *numerics;  /* "invariant" or "fast" (CAPS numerics) */
    char gpu_name[64];     /* the local GPU that computes (its description), "" on the CPU: persist keys */
    char devices_caps[1024]; /* CAPS keys of --split-mode, --tensor-split, --main-gpu, --rpc (devices.c) */

    slot_state *slots;
    snapshot *snaps;
    uint64_t clock;

    struct llama_batch batch;   /* n_batch tokens, up to n_score_seqs seq ids each: the decode being filled */
    struct llama_batch batch_pend; /* the same size: the decode left in flight (pipeline), its rows unread */
    task *pend[ENGINE_QUEUE_MAX]; /* that decode's tasks */
    int n_pend;
    int pipeline;               /* the next decode may be queued before the last one's rows are read: the
                                 * rows of others at least this many (0: never; gpu_pipe.c) */
    int read_prev;              /* the rows being read are the decode before the last one (engine_logits) */
    int pipe_wait_ms;           /* after a read from the ring ended requests, wait this long at most for
                                 * the next ones (SERVEPROTO_PIPELINE_WAIT_MS; gpu_pipe.c) */
    int pipe_fill;              /* ... until the other tasks want this many rows (SERVEPROTO_PIPELINE_FILL,
                                 * default e->pipeline) */
    late_fill late;             /* the late fill (late_fill.c): with the pipeline, the next decode filled just
                                 * before the device needs it */
    struct {
        int us_row;             /* SERVEPROTO_TEST_DEVICE_US_ROW (tests only, 0: off): on the CPU, each decode
                                 * also holds a pretend device this long a row (whole ubatches) after
                                 * llama_decode returns, in the order queued, and its read waits for it
                                 * (test_device.c) */
        uint64_t busy_until, end_last, end_prev; /* when that device is free; when the last decode and the
                                 * one before end on it (microseconds, profile_now_us) */
    } test_device;
    llama_token_data *cand;     /* n_vocab candidates for the sampler */
    int n_threads;              /* the decodes' CPU threads now */
    int threads_auto;           /* --threads auto: n_threads moves between 1 and threads_max (threads.c) */
    int threads_max;
    double thr_wall0, thr_cpu0; /* the running decode's start: monotonic and process CPU seconds */
    double thr_share;           /* CPU time got over n_threads x wall, averaged over the last decodes */
    int thr_samples;            /* decodes measured since the last change */
    double thr_changed;         /* when n_threads last changed (monotonic s) */
    double thr_probe_s;         /* seconds after a change before trying one more thread */
    int thr_trying;             /* the last change added a thread, not yet found to hold */
    /* read-out of one batch: per row, its logits, logsumexp, top-k */
    const float **echo_rows;    /* n_batch */
    double *echo_lse;           /* n_batch */
    int *echo_k;                /* n_batch */
    sp_alt *echo_top;           /* n_batch * ENGINE_MAX_LOGPROBS */
    double *row_lse;            /* n_batch: a SCORE row's logsumexp after its decode (readout.c), else NAN */
    const float **row_logits;   /* n_batch: those rows' logits, in turn */
    int *row_index;             /* n_batch: and their batch rows */
    uint32_t seed;              /* sampling seed (--seed), mixed with the request id */
    prefix_tokens prefixes[ENGINE_PREFIXES];
    splice_stats splice;
    score_cache scores;         /* --score-cache-mb; only with invariant numerics */
    struct persist *disk;       /* --cache-dir: the files behind the score cache (loaded at its first lookup, new
                                 * results noted: persist_scores_get, persist_scores_put) and the pinned snapshots */
    int splice_check;           /* --splice-check: tokenize whole too and compare */

    sp_loop in;                 /* stdin's frames (engines/common/loop.h; in.eof: stdin ended) */
    engine_input input;         /* stdin read while the scheduler waits on the device (main.c sets it) */
    sp_writer w;
    int out_failed;             /* stdout is gone */

    task tasks[ENGINE_QUEUE_MAX];
    int n_tasks;                /* used entries of tasks */
    uint64_t arrivals;          /* tasks taken so far */
    uint64_t decodes;           /* llama_decode calls so far */
    int in_decode;              /* a llama_decode is running: only the abort callback reads stdin */
    int abort_decode;           /* CANCEL of a task in the running decode: it aborts (returns 2) */
    int solo;                   /* the last decode found no KV room: the next one takes one task */
    int no_hidden;              /* SERVEPROTO_NO_EVAL_CALLBACK=1: no graph callback, no hidden states */
    int overlap;                /* the backend computes a decode after llama_decode returns (a GPU):
                                 * stdin is read and arriving tasks started meanwhile (tasks.c) */
    int scratch_used;           /* scratch sequences given to the batch being built */
    int pad_rows;               /* SERVEPROTO_PAD_ROWS=M: a decode of fewer rows than a ubatch is padded up to
                                 * a multiple of M (0: never; pad.c) */
    int pad_seq;                /* the padding's sequence, above the carries */
    int padded;                 /* rows of padding in the decode being built */
    uint64_t polled_us;         /* when the abort callback last read stdin (CLOCK_MONOTONIC) */
    uint64_t skip_submit_id;    /* a refused IMAGE's id: its SUBMIT or SCORE (and further IMAGEs) are dropped */
    struct mtmd_context *mtmd;  /* --mmproj: the projector (picture.c); NULL: CAPS vision=0 */
    picture_set *pics_in;       /* IMAGE frames read, waiting for their SUBMIT or SCORE (main.c) */
    engine_profile prof;        /* SERVEPROTO_PROFILE (profile.c) */
} engine;

/* model.c */
int model_tokenize(engine *e, const char *text, size_t len, llama_token **out, int *n_out);
int model_tokenize_ex(engine *e, const char *text, size_t len, int add_special, llama_token **out, int *n_out);
int model_piece(engine *e, llama_token tok, char *buf, size_t cap);
double model_logsumexp(const float *logits, int n);
int model_top_k(engine *e, const float *logits, double lse, int k, sp_alt *out);
#define MODEL_DECODE_CANCELLED 2 /* llama_decode's status when the abort callback stopped it */
int model_decode(engine *e, int *err_code);
uint64_t model_mem_available(void);
void batch_clear(struct llama_batch *b);
void batch_add(struct llama_batch *b, llama_token tok, int pos, const int *seqs, int n_seqs, int logits);
double rss_gb(void);

/* devices.c: llama.cpp's split options and RPC servers */
int devices_is_option(const char *flag);
int devices_parse(device_options *d, const char *flag, const char *value);
int devices_local_gpu(void);
/* The first local GPU's description ("NVIDIA H200"), or "" without one. */
const char *devices_local_gpu_name(void);
const char *devices_apply(device_options *d, struct llama_model_params *mp, char *err, size_t cap);
void devices_caps(const device_options *d, char *out, size_t cap);

/* slots.c: prefix reuse and snapshots */
int lcp(const llama_token *a, int na, const llama_token *b, int nb);
int snapshot_valid(engine *e, snapshot *s);
snapshot *snapshot_find(engine *e, const llama_token *toks, int n, int max_len, int *stale);
snapshot *snapshot_take(engine *e, int slot, const llama_token *toks, int n, const float *logits);
double snapshot_lse(engine *e, snapshot *s);
void slot_truncate(engine *e, int slot, int keep);
void slot_restore(engine *e, int slot, snapshot *s);
int slot_resume(engine *e, int slot, const llama_token *toks, int n, snapshot *snap);
void slot_append(engine *e, int slot, const llama_token *toks, int n);

/* splice.c: a prefix's tokens kept, continuations tokenized from near its end */
const prefix_tokens *prefix_tokens_get(engine *e, const char *text, size_t len);
int splice_tokenize(engine *e, const prefix_tokens *p, const char *a, size_t na, const char *b, size_t nb,
                    llama_token **out, int *n_out);
int splice_stem(engine *e, const prefix_tokens *p, const char *stem, size_t ns, llama_token **out, int *n_out,
                stem_tokens *st);
int splice_option(engine *e, const prefix_tokens *p, const stem_tokens *st, const char *stem, size_t ns,
                  const char *opt, size_t no, llama_token **out, int *n_out);
void stem_tokens_free(stem_tokens *st);
void prefix_tokens_free(engine *e);

/* score_cache.c: an option's logprobs kept by the hash of its tokens */
void score_key_init(score_key *k);
void score_key_add(score_key *k, const llama_token *toks, int n);
int score_cache_init(score_cache *c, size_t budget);
int score_cache_get(score_cache *c, const score_key *k, int ctx, double *lps, int cap, int *file);
void score_cache_put(score_cache *c, const score_key *k, int ctx, const double *lps, int n_lps, int file);
void score_cache_free(score_cache *c);

/* hidden.c: layer outputs read during a decode (SCORE's `hidden`, spec 9.1) */
#define ENGINE_MAX_HIDDEN SP_SCORE_MAX_HIDDEN /* layers a SCORE may ask for */
int hidden_layers(const engine *e);
int hidden_dim(const engine *e);
int hidden_want(engine *e, int row, int layer, float *dst);
bool hidden_eval(struct ggml_tensor *t, bool ask, void *user_data);

/* main.c: llama.cpp's abort callback (the frames read while a decode runs on the CPU) */
bool engine_decode_abort(void *data);

/* profile.c: SERVEPROTO_PROFILE */
uint64_t profile_now_us(void);
void profile_init(engine_profile *p);
void profile_step(engine_profile *p, const uint64_t mark[ENGINE_PROFILE_PARTS], int rows, int outputs);
void profile_idle(engine_profile *p);
void profile_free(engine_profile *p);

/* threads.c: --threads auto */
int threads_cores(void);
void threads_before(engine *e);
void threads_after(engine *e);

/* sched.c: the decode loop, one step at a time */
int sched_step(engine *e);
int sched_lease(engine *e, int slot);

/* tasks.c: tasks started and ended */
void task_end(engine *e, task *t);
int tasks_start_new(engine *e);
void tasks_start_early(engine *e);

/* pad.c: SERVEPROTO_PAD_ROWS */
void pad_batch(engine *e);

/* readout.c: a decode's rows read */
const float *engine_logits(const engine *e, int row);
double readout_row_lse(const engine *e, int row, const float *logits);
void readout_pending(engine *e, int prev);

/* gpu_pipe.c: the GPU pipeline, a decode left in flight while the next is filled */
void pipe_queued(engine *e, task *const *in, int n_in);
uint64_t pipe_keep_or_read(engine *e, int ended, int late);

/* late_fill.c: SERVEPROTO_PIPELINE_LATE, what the device and the host are measured to take */
void late_learn(engine *e, uint64_t t0, uint64_t t1);
void late_queued(late_fill *l, uint64_t queued_us, int rc);
int late_due(const late_fill *l, int rows, uint64_t *due);

/* test_device.c: SERVEPROTO_TEST_DEVICE_US_ROW, the tests' pretend device */
void test_device_queued(engine *e, uint64_t now, int rows);
void test_device_wait(engine *e, int prev);

/* submit.c / score.c: a request as a task, one table of operations per kind,
 * which the scheduler calls without knowing the kind. start: tokenize, reuse,
 * ACCEPT (0), or answer it whole (-1: the task is ended). unit / want: the
 * fewest and the most rows it can use in the next decode (want 0: none now;
 * want may end the task, e.g. a generation whose STOP arrived). fill: adds at
 * most `budget` rows and `seq_budget` scratch sequences to e->batch, returns
 * the rows added. decoded: reads its rows' logits after a decode. undo: the
 * decode failed or was aborted; the KV cache is put back as before the fill.
 * fail: answers the failure of llama_decode status rc (the scheduler ends the
 * task after). free: frees its state (task_end). */
typedef struct task_ops {
    int scratch; /* it takes scratch sequences (SCORE's trie rows): they are shared among such tasks */
    int row_lse; /* its decoded reads every logits row's logsumexp (SCORE): readout.c's rows_lse computes
                    them first, spread over threads (readout_row_lse) */
    int (*start)(struct engine *e, struct task *t);
    int (*unit)(struct engine *e, struct task *t);
    int (*want)(struct engine *e, struct task *t);
    int (*fill)(struct engine *e, struct task *t, int budget, int seq_budget);
    void (*decoded)(struct engine *e, struct task *t);
    void (*undo)(struct engine *e, struct task *t);
    void (*fail)(struct engine *e, struct task *t, int rc);
    void (*free)(struct engine *e, struct task *t);
} task_ops;

/* The table of a kind whose operations are named <kind>_start, <kind>_unit, ... */
#define TASK_OPS(kind, uses_scratch, reads_row_lse)                                              \
    {                                                                                            \
        .scratch = (uses_scratch), .row_lse = (reads_row_lse), .start = kind##_start,            \
        .unit = kind##_unit, .want = kind##_want, .fill = kind##_fill, .decoded = kind##_decoded, \
        .undo = kind##_undo, .fail = kind##_fail, .free = kind##_free,                           \
    }

extern const task_ops submit_ops; /* submit.c: SUBMIT, a prefill then a generation */
extern const task_ops score_ops;  /* score.c: SCORE, a trunk then its options' trie */

#endif
