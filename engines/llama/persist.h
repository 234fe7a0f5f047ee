/* persist.h: the score cache and snapshots kept on disk (persist.c). */
#ifndef SERVEPROTO_LLAMA_PERSIST_H
#define SERVEPROTO_LLAMA_PERSIST_H

#include <stddef.h>
#include <stdint.h>

struct engine;
struct score_cache;
struct score_key;
struct snapshot;

/* --cache-dir and its companions (main.c). */
typedef struct persist_options {
    const char *dir;          /* NULL: nothing kept on disk */
    const char *model_path;
    const char *model_sha256; /* --model-sha256: else the engine hashes the model file at first use */
    const char *kv_type;      /* "f32" or "f16": part of the numerics a file must match */
    size_t disk_budget;       /* bytes (--cache-disk-mb) */
    int read_only;            /* --cache-read-only */
} persist_options;

/* What came from and went to disk (one stderr line at exit). */
typedef struct persist_stats {
    uint64_t files_loaded, files_skipped, files_written, files_evicted;
    uint64_t entries_loaded, entries_written, disk_hits;
    uint64_t states_written, states_restored, states_skipped;
} persist_stats;

typedef struct persist persist;

persist *persist_open(const persist_options *o, struct engine *e);
/* The score cache c with the files of p behind it (p NULL: memory only; score_cache.c knows no disk).
 * get: score_cache_get, the files of earlier runs loaded into c at the first lookup; *from_disk set when
 * the logprobs came from such a file. put: score_cache_put, the logprobs noted to be written. */
int persist_scores_get(persist *p, struct score_cache *c, const struct score_key *k, int ctx, double *lps, int cap,
                       int *from_disk);
void persist_scores_put(persist *p, struct score_cache *c, const struct score_key *k, int ctx, const double *lps,
                        int n_lps);
int persist_pending(const persist *p);
int persist_flush(persist *p);
/* The engine is idle (no task): snapshots not yet on disk are written, then the scores. */
void persist_idle(persist *p, struct engine *e);
int persist_idle_pending(const persist *p, const struct engine *e);
/* The deepest state file whose tokens are toks[0..k) with have < k <= n, restored into slot's
 * sequence (its old rows dropped) and made a snapshot; NULL: none (or it failed its checks). */
struct snapshot *persist_state_restore(persist *p, struct engine *e, int slot, const int32_t *toks, int n, int have);
void persist_close(persist *p);

#endif
