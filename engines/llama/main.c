/* serveproto-llama: a serve-protocol engine over llama.cpp (spec/serve-protocol.md).
 *
 * Reads top to bottom: options, model load (LOAD_FAIL with its kind), the
 * handshake (READY, CAPS, STAT), then the request loop: frames are read from
 * stdin and become tasks, the scheduler (sched.c) fills each llama_decode
 * from all of them, and while a decode runs, llama.cpp's abort callback reads
 * stdin between its graph nodes, so STOP / CANCEL / PING are served within one
 * ubatch (engine_decode_abort).
 * stdout carries only protocol frames; llama.cpp's logs go to stderr.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "persist.h"
#include "stack.h"

/* ---- options ---- */

typedef struct options {
    const char *model;
    int slots, ctx, ctx_max, pins, threads, threads_auto, score_seqs;
    int ubatch;         /* --ubatch: llama.cpp's physical batch, the cancellation grain */
    int chunk;          /* --chunk: a request's rows in a shared decode */
    int score_cache_mb; /* --score-cache-mb: SCORE results kept between requests */
    uint32_t seed;
    int kv_f16;     /* --kv-type f16: half the KV memory, logprobs off by ~1e-3 */
    int kv_set;     /* --kv-type given (else: f32 on the CPU, f16 with a GPU) */
    int flash_attn; /* --flash-attn (implied by --numerics invariant; the default with a GPU) */
    int no_flash_attn; /* --no-flash-attn: llama.cpp's attention without it (fast numerics only) */
    int fast;       /* --numerics fast: llama.cpp's shape-dependent kernels (digits move with batching) */
    int numerics_set; /* --numerics given (else: invariant on the CPU, fast with a GPU or --rpc) */
    int splice_check; /* --splice-check: SCORE tokenizes every text whole too and compares */
    int verbose;      /* --verbose: llama.cpp's informational log too, not only warnings and errors */
    device_options dev; /* --split-mode, --tensor-split, --main-gpu, --rpc (devices.c) */
    const char *cache_dir;    /* --cache-dir: the score cache and snapshots kept on disk (persist.c) */
    const char *model_sha256; /* --model-sha256: the model's identity there, else hashed at first use */
    int cache_disk_mb;        /* --cache-disk-mb: the directory's disk budget */
    int cache_read_only;      /* --cache-read-only: read the directory, never write it */
    const char *mmproj;       /* --mmproj: a vision projector for the model (picture.c; CAPS vision=1) */
} options;

static void usage(void)
{
    fprintf(stderr,
            "usage: serveproto-llama --model PATH [--slots N] [--ctx N] [--ctx-max N] [--pin-slots N]\n"
            "                        [--threads N|auto] [--score-seqs N] [--ubatch N] [--chunk N] [--seed N] [--kv-type f32|f16]\n"
            "                        [--numerics invariant|fast] [--score-cache-mb N] [--flash-attn | --no-flash-attn]\n"
            "                        [--float-digits 9..17] [--splice-check] [--verbose]\n"
            "                        [--split-mode none|layer|row] [--tensor-split A,B,...] [--main-gpu N]\n"
            "                        [--rpc HOST:PORT,...]\n"
            "                        [--cache-dir DIR [--cache-disk-mb N] [--cache-read-only] [--model-sha256 HEX]]\n"
            "                        [--mmproj PATH]\n"
            "Speaks the serve protocol (spec/serve-protocol.md) on stdin/stdout.\n");
}

static int parse_int_arg(const char *name, const char *v, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "serveproto-llama: %s must be an integer in %d..%d, got '%s'\n", name, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* The environment's `name` is set to exactly `value`. */
static int env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && !strcmp(v, value);
}

/* The environment's number `name` (atoi), or dflt where it is unset or empty. */
static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* v must be `no` or `yes`: *out is 0 or 1. */
static int parse_pair_arg(const char *name, const char *v, const char *no, const char *yes, int *out)
{
    if (strcmp(v, no) && strcmp(v, yes)) {
        fprintf(stderr, "serveproto-llama: %s must be %s or %s, got '%s'\n", name, no, yes, v);
        return -1;
    }
    *out = !strcmp(v, yes);
    return 0;
}

static int parse_options(int argc, char **argv, options *o)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (options){ .slots = 0, .pins = ENGINE_DEFAULT_PINS, .threads = ncpu > 0 ? (int)ncpu : 1,
                    .score_seqs = 0, .ubatch = ENGINE_UBATCH, .chunk = ENGINE_CHUNK, .seed = 42, .score_cache_mb = ENGINE_SCORE_CACHE_MB,
                    .cache_disk_mb = ENGINE_CACHE_DISK_MB };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            exit(0);
        }
        if (!strcmp(a, "--verbose")) {
            o->verbose = 1;
            continue;
        }
        if (!strcmp(a, "--splice-check")) {
            o->splice_check = 1;
            continue;
        }
        if (!strcmp(a, "--flash-attn") || !strcmp(a, "--no-flash-attn")) {
            o->no_flash_attn = !strcmp(a, "--no-flash-attn");
            o->flash_attn = !o->no_flash_attn;
            continue;
        }
        if (!strcmp(a, "--cache-read-only")) {
            o->cache_read_only = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "serveproto-llama: %s needs a value\n", a);
            return -1;
        }
        const char *v = argv[++i];
        int seed = 0, rc = 0;
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--slots"))
            rc = parse_int_arg(a, v, 1, ENGINE_MAX_SLOTS, &o->slots);
        else if (!strcmp(a, "--ctx"))
            rc = parse_int_arg(a, v, 8, 1 << 20, &o->ctx);
        else if (!strcmp(a, "--ctx-max"))
            rc = parse_int_arg(a, v, 8, 1 << 20, &o->ctx_max);
        else if (!strcmp(a, "--pin-slots"))
            rc = parse_int_arg(a, v, 1, 1024, &o->pins);
        else if (!strcmp(a, "--threads") && v && !strcmp(v, "auto")) {
            o->threads_auto = 1;
            o->threads = threads_cores();
        } else if (!strcmp(a, "--threads"))
            rc = parse_int_arg(a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--score-seqs"))
            rc = parse_int_arg(a, v, 1, 255, &o->score_seqs);
        else if (!strcmp(a, "--ubatch"))
            rc = parse_int_arg(a, v, 1, 2048, &o->ubatch);
        else if (!strcmp(a, "--chunk"))
            rc = parse_int_arg(a, v, 1, 2048, &o->chunk);
        else if (!strcmp(a, "--kv-type")) {
            rc = parse_pair_arg(a, v, "f32", "f16", &o->kv_f16);
            o->kv_set = 1;
        } else if (!strcmp(a, "--score-cache-mb")) {
            rc = parse_int_arg(a, v, 0, 1 << 20, &o->score_cache_mb);
        } else if (!strcmp(a, "--cache-dir")) {
            o->cache_dir = v;
        } else if (!strcmp(a, "--mmproj")) {
            o->mmproj = v;
        } else if (!strcmp(a, "--model-sha256")) {
            o->model_sha256 = v;
        } else if (!strcmp(a, "--cache-disk-mb")) {
            rc = parse_int_arg(a, v, 0, 1 << 30, &o->cache_disk_mb);
        } else if (!strcmp(a, "--float-digits")) {
            rc = parse_int_arg(a, v, 9, 17, &sp_float_digits);
        } else if (!strcmp(a, "--numerics")) {
            rc = parse_pair_arg(a, v, "invariant", "fast", &o->fast);
            o->numerics_set = 1;
        } else if (!strcmp(a, "--seed")) {
            rc = parse_int_arg(a, v, 0, 0x7fffffff, &seed);
            o->seed = (uint32_t)seed;
        } else if (devices_is_option(a)) {
            rc = devices_parse(&o->dev, a, v);
        } else {
            fprintf(stderr, "serveproto-llama: unknown option %s\n", a);
            return -1;
        }
        if (rc)
            return -1;
    }
    if (!o->model) {
        fprintf(stderr, "serveproto-llama: --model is required\n");
        return -1;
    }
    return 0;
}

/* ---- llama.cpp logs: to stderr, the errors kept to classify a failed load ----
 * Loading a model logs about a thousand informational lines; without --verbose
 * only warnings and errors (and their continuation lines) reach stderr. */

static char g_log_tail[4096];
static int g_log_verbose;

/* ud: the engine; while a decode is being aborted (e->abort_decode, until the step after it ends) its
 * warnings are expected, not shown. */
static void log_cb(enum ggml_log_level level, const char *text, void *ud)
{
    static int last_shown; /* whether the line a CONT continues was shown */
    const engine *e = ud;
    int important = level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN;
    int aborting = e && e->abort_decode;
    int shown = g_log_verbose || (important && !aborting) || (level == GGML_LOG_LEVEL_CONT && last_shown);
    if (level != GGML_LOG_LEVEL_CONT)
        last_shown = shown;
    if (shown)
        fputs(text, stderr);
    if (important || level == GGML_LOG_LEVEL_CONT) {
        size_t have = strlen(g_log_tail), add = strlen(text);
        if (have + add >= sizeof g_log_tail)
            have = 0;
        memcpy(g_log_tail + have, text, add < sizeof g_log_tail ? add + 1 : 1);
        g_log_tail[sizeof g_log_tail - 1] = '\0';
    }
}

/* The last log line with text, newlines folded, for LOAD_FAIL details. */
static const char *log_detail(void)
{
    for (char *c = g_log_tail; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    size_t n = strlen(g_log_tail);
    while (n && g_log_tail[n - 1] == ' ')
        g_log_tail[--n] = '\0';
    return n > 300 ? g_log_tail + n - 300 : g_log_tail;
}

static int log_has(const char *needle)
{
    return strstr(g_log_tail, needle) != NULL;
}

/* ---- load ---- */

static int load_fail(engine *e, const char *kind, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    fprintf(stderr, "serveproto-llama: LOAD_FAIL %s: %s\n", kind, detail);
    sp_write_load_fail(&e->w, kind, detail);
    return -1;
}

/* File stem without directories, ".gguf" or spaces: the CAPS model name. */
static void model_name(const char *path, char *out, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf"))
        n -= 5;
    if (n >= cap)
        n = cap - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (base[i] == ' ' || (unsigned char)base[i] < 0x21 || base[i] == 0x7f) ? '_' : base[i];
    out[n] = '\0';
    if (n == 0)
        snprintf(out, cap, "model");
}

/* --slots unset: as many slots as the KV cache of n_ctx cells each (plus
 * SCORE's scratch share and the long prompt's n_ctx_max - n_ctx) fits in
 * 1/ENGINE_AUTO_KV_SHARE of the memory free now (the host's), at least 1, at
 * most ENGINE_AUTO_SLOTS_MAX; a GPU build's first GPU: 1/ENGINE_AUTO_KV_SHARE_GPU
 * of its free memory, at most ENGINE_AUTO_SLOTS_GPU. A slot's cells: n_layer * (K + V) widths * the KV
 * type's bytes (an estimate from the model's shape: n_embd / n_head per head). */
static int auto_slots(engine *e, const options *o)
{
    int n_layer = llama_model_n_layer(e->model), n_head = llama_model_n_head(e->model);
    int n_head_kv = llama_model_n_head_kv(e->model), n_embd = llama_model_n_embd(e->model);
    double per_token = (double)n_layer * 2.0 * (n_head > 0 ? (double)n_embd / n_head : 0.0) * n_head_kv *
                       (o->kv_f16 ? 2.0 : 4.0);
    double per_slot = per_token * e->n_ctx;
    double avail = (double)model_mem_available();
    int cap = ENGINE_AUTO_SLOTS_MAX, share = ENGINE_AUTO_KV_SHARE;
    if (llama_supports_gpu_offload()) {
        for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU) {
                size_t free_b = 0, total_b = 0;
                ggml_backend_dev_memory(dev, &free_b, &total_b);
                avail = (double)free_b;
                cap = ENGINE_AUTO_SLOTS_GPU;
                share = ENGINE_AUTO_KV_SHARE_GPU;
                break;
            }
        }
    }
    if (per_slot <= 0 || avail <= 0)
        return 1;
    double lease = per_token * (e->n_ctx_max - e->n_ctx); /* the long prompt's cells past its slot */
    int n = (int)((avail / share - lease) / per_slot) - 1; /* one share is SCORE's scratch */
    return n < 1 ? 1 : n > cap ? cap : n;
}

/* With --numerics invariant on a GPU: one decode of two tokens runs every
 * matmul and attention of the model once; an op that ggml-cuda has no
 * batch-invariant kernel for (float weights through cuBLAS, a mixture of
 * experts, an unsupported head size...) logs "batch-dependent kernel" there
 * (llama/patches/numerics/0006), and the load is refused rather than serve digits
 * that move with the batch. */
static int gpu_invariant_check(engine *e)
{
    llama_token bos = llama_vocab_bos(e->vocab);
    llama_batch b = llama_batch_init(2, 0, 1);
    for (int i = 0; i < 2; i++) {
        b.token[i] = bos >= 0 ? bos : 0;
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = i == 1;
    }
    b.n_tokens = 2;
    g_log_tail[0] = '\0';
    int rc = llama_decode(e->ctx, b);
    llama_synchronize(e->ctx);
    llama_batch_free(b);
    llama_memory_seq_rm(llama_get_memory(e->ctx), 0, -1, -1);
    if (rc != 0)
        return load_fail(e, "nomem", "the first decode failed (%d): %s", rc, log_detail());
    if (log_has("batch-dependent kernel"))
        return load_fail(e, "unsupported", "--numerics invariant on this GPU: %s (use --numerics fast)", log_detail());
    return 0;
}

/* ---- load, by concern: the file, numerics, the model, sizes, the context, scheduling, buffers ---- */

/* io / format are told apart before llama.cpp sees the file. */
static int check_model_file(engine *e, const options *o)
{
    int fd = open(o->model, O_RDONLY);
    if (fd < 0)
        return load_fail(e, "io", "%s: %s", o->model, strerror(errno));
    unsigned char magic[4];
    ssize_t got = read(fd, magic, sizeof magic);
    int rerr = errno;
    close(fd);
    if (got < 0)
        return load_fail(e, "io", "%s: %s", o->model, strerror(rerr));
    if (got < 4 || memcmp(magic, "GGUF", 4) != 0)
        return load_fail(e, "format", "%s: not a GGUF file (bad magic)", o->model);
    return 0;
}

/* The options' defaults that depend on the device, and the numerics asked of llama.cpp (*cfg, applied
 * by llamax_configure before the model loads).
 *
 * A GPU build defaults to llama.cpp's own kernels (spec/llama-engine.md): flash attention on an F16 KV
 * cache (1.12x the document's requests/s of F32 KV without it on an H200, and CUDA graphs on), and the
 * weights read into memory rather than mapped (load_model). --numerics invariant there runs ggml-cuda's
 * batch-invariant kernels (llama/patches/numerics/0006), checked at the end of load. A build on stock
 * llama.cpp (LLAMA_PATCHES=none) has no invariant kernels: fast unless --numerics says otherwise, and
 * then llamax_configure refuses the load. */
static int numerics_config(engine *e, options *o, int gpu, llamax_config *cfg)
{
    if (gpu) {
        if (!o->numerics_set)
            o->fast = 1;
        if (!o->kv_set)
            o->kv_f16 = 1;
        if (!o->no_flash_attn)
            o->flash_attn = 1;
    } else if (o->dev.n_rpc > 0 && !o->numerics_set) {
        /* The engine cannot see which kernels an rpc-server runs: invariant only when asked for,
         * the servers being this build's ggml-rpc-server with GGML_CPU_USE_REF=1 (devices.c). */
        o->fast = 1;
    }
    llamax_kernels invariant_kernels = gpu ? LLAMAX_KERNELS_CUDA_INVARIANT : LLAMAX_KERNELS_CPU_REF;
    if (!o->numerics_set && !llamax_has_kernels(invariant_kernels))
        o->fast = 1;
    if (o->no_flash_attn && !o->fast)
        return load_fail(e, "unsupported", "--no-flash-attn: invariant numerics need flash attention (use --numerics fast)");
    memset(cfg, 0, sizeof *cfg);
    /* the reference kernels keep flash attention on its row-by-row path and every matmul on the per-row
     * vec_dot path, whatever the batch shape; a sequence's new cells go above its old ones (patch 0003),
     * so its cells lie in position order whatever other slots freed */
    cfg->kernels = o->fast ? LLAMAX_KERNELS_STOCK : invariant_kernels;
    cfg->kv_cells_in_order = !o->fast;
    /* CUDA graphs off with that pair (F32 KV, no flash attention): on an H200 with llama.cpp 0c1e57098bba
     * it aborted in cudaGraphLaunch ("an illegal instruction was encountered") on a warm SCORE after a
     * 13.5K-token state, every time; F16 KV, flash attention or no graphs each avoided it (bench/results/NOTEBOOK.md,
     * "Known"). No effect on the CPU. */
    cfg->cuda_graphs_off = !o->kv_f16 && !(o->flash_attn || !o->fast);
    return 0;
}

/* The devices, the numerics' switches, then the model itself (LOAD_FAIL by what llama.cpp logged). */
static int load_model(engine *e, options *o, int gpu, const llamax_config *cfg)
{
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999;
    /* read, not mapped: the input embedding, which stays on the host, never takes a page fault of the
     * file in the middle of a decode */
    if (gpu)
        mp.load_mode = LLAMA_LOAD_MODE_NONE;
    char err[512];
    const char *fail = devices_apply(&o->dev, &mp, err, sizeof err);
    if (fail)
        return load_fail(e, fail, "%s", err);
    devices_caps(&o->dev, e->devices_caps, sizeof e->devices_caps);
    /* Repacked weights (Q4_0, Q4_K, IQ4_NL... interleaved for AVX2/AMX) switch
     * between a GEMV and a GEMM kernel by batch rows: off for invariant digits. */
    if (!o->fast)
        mp.use_extra_bufts = false;
    fail = llamax_configure(cfg, err, sizeof err);
    if (fail)
        return load_fail(e, fail, "%s", err);
    g_log_tail[0] = '\0';
    e->model = llama_model_load_from_file(o->model, mp);
    if (!e->model) {
        if (log_has("unknown model architecture") || log_has("unsupported"))
            return load_fail(e, "unsupported", "%s", log_detail());
        if (log_has("alloc") || log_has("Cannot allocate memory") || log_has("out of memory"))
            return load_fail(e, "nomem", "%s", log_detail());
        return load_fail(e, "format", "%s", log_detail());
    }
    e->vocab = llama_model_get_vocab(e->model);
    e->n_vocab = llama_vocab_n_tokens(e->vocab);
    return 0;
}

/* Contexts, slots, sequence ids and batches, from the options and the model's trained context. */
static void size_engine(engine *e, const options *o)
{
    int train = llama_model_n_ctx_train(e->model);
    e->n_ctx = o->ctx ? o->ctx : (train > 0 && train < ENGINE_DEFAULT_CTX ? train : ENGINE_DEFAULT_CTX);
    /* The longest prompt: the model's trained context (at most ENGINE_DEFAULT_CTX_MAX unless --ctx-max
     * says more), never less than a slot. One slot at a time may pass n_ctx (the lease, sched.c): the
     * cache holds n_ctx_max - n_ctx cells more for it, so it never takes another slot's share. */
    e->n_ctx_max = o->ctx_max ? o->ctx_max : (train > ENGINE_DEFAULT_CTX_MAX ? ENGINE_DEFAULT_CTX_MAX : train);
    if (e->n_ctx_max < e->n_ctx)
        e->n_ctx_max = e->n_ctx;
    e->lease_slot = -1;
    e->slots_auto = o->slots == 0;
    e->n_slots = o->slots ? o->slots : auto_slots(e, o);
    e->n_pins = o->pins;
    /* --score-seqs unset: every sequence id above the slots and their carries (ENGINE_MAX_SEQ in
     * all), so that many SCOREs in one decode each still get the sequences of a whole question or
     * several. Each slot has one more sequence, its SCORE's carry: the stem of a question cut
     * between two chunks, kept for the next one (score.c) */
    int seqs_left = ENGINE_MAX_SEQ - 2 * e->n_slots;
    /* SERVEPROTO_PAD_ROWS=M (pad.c, opt-in): a decode of fewer rows than a ubatch is padded up to a
     * multiple of M in a sequence of its own, the last id */
    e->pad_rows = env_int("SERVEPROTO_PAD_ROWS", 0);
    if (e->pad_rows < 0)
        e->pad_rows = 0;
    if (e->pad_rows)
        seqs_left--;
    e->n_score_seqs = o->score_seqs && o->score_seqs < seqs_left ? o->score_seqs : seqs_left;
    e->pad_seq = 2 * e->n_slots + e->n_score_seqs;
    e->n_batch = e->n_ctx < 2048 ? e->n_ctx : 2048;

    e->n_ubatch = e->n_batch < o->ubatch ? e->n_batch : o->ubatch;
    e->n_chunk = o->chunk < e->n_ubatch ? o->chunk : e->n_ubatch;
    e->seed = o->seed;
    e->splice_check = o->splice_check;
    model_name(o->model, e->model_name, sizeof e->model_name);
}

/* llama.cpp's context for those sizes: one unified KV cache for every slot. */
static struct llama_context_params context_params(engine *e, const options *o)
{
    struct llama_context_params cp = llama_context_default_params();
    /* the slots + SCORE scratch + the long prompt's cells past its slot */
    cp.n_ctx = (uint32_t)e->n_ctx * (uint32_t)(e->n_slots + 1) + (uint32_t)(e->n_ctx_max - e->n_ctx);
    cp.n_batch = (uint32_t)e->n_batch;
    cp.n_ubatch = (uint32_t)e->n_ubatch;
    cp.n_seq_max = (uint32_t)(2 * e->n_slots + e->n_score_seqs + (e->pad_rows > 0));
    /* llama.cpp reserves room for n_seq_max outputs: never fewer than that */
    cp.n_outputs_max = cp.n_batch > cp.n_seq_max ? cp.n_batch : cp.n_seq_max;
    cp.n_threads = o->threads;
    cp.n_threads_batch = o->threads;
    cp.kv_unified = true;
    cp.no_perf = true;
    /* F32 keys and values by default: an F16 KV cache rounds them. */
    cp.type_k = o->kv_f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    cp.type_v = cp.type_k;
    /* Invariant numerics (spec/llama-engine.md, "Reproducible digits"): flash
     * attention visits a query row's unmasked cells one by one in cell order,
     * so a row's attention depends on its own context only, not on the other
     * rows of the batch, the masked cells between or the cells' indices;
     * without it the KQ softmax and the KQV product sum cells lane by lane
     * by cell index. The reference kernels (llamax_config's kernels)
     * keep flash attention on its row-by-row path and every matmul on the
     * per-row vec_dot path, whatever the batch shape. */
    cp.flash_attn_type = o->flash_attn || !o->fast ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    /* SCORE's hidden states (hidden.c); asks for nothing without them. SERVEPROTO_NO_EVAL_CALLBACK=1
     * leaves the callback out (CAPS x_hidden=0): the benchmark of what it costs (bench/results/NOTEBOOK.md) */
    e->no_hidden = env_is("SERVEPROTO_NO_EVAL_CALLBACK", "1");
    cp.cb_eval = e->no_hidden ? NULL : hidden_eval;
    cp.cb_eval_user_data = e;
    return cp;
}

/* What the engine promises (CAPS x_numerics, the score cache, its files): 1 for invariant digits.
 * GGML_CUDA_INVARIANT_SKIP (patch 0006, llamax_invariant_skip) leaves parts of the GPU's invariant
 * kernels out to price them: their digits move, so then it promises nothing. */
static int numerics_promise(engine *e, const options *o, int gpu)
{
    int invariant = !o->fast;
    const char *skip = llamax_invariant_skip();
    if (gpu && invariant && skip) {
        invariant = 0;
        fprintf(stderr, "serveproto-llama: GGML_CUDA_INVARIANT_SKIP=%s: digits move without those parts: "
                        "CAPS x_numerics=fast, no score cache, no cache files\n", skip);
    }
    e->numerics = invariant ? "invariant" : "fast";
    if (gpu)
        snprintf(e->gpu_name, sizeof e->gpu_name, "%s", devices_local_gpu_name());
    return invariant;
}

/* How the scheduler (sched.c; tasks.c, gpu_pipe.c, late_fill.c) runs decodes: the abort callback, the overlap, the pipeline and the late
 * fill; the test switches of those paths on the CPU. */
static int schedule_config(engine *e, const options *o, int gpu)
{
    /* SERVEPROTO_NO_ABORT_CALLBACK=1: as on a GPU build, whose backend never calls it: a CANCEL
     * is read between decodes only (the tests of that path run on the CPU) */
    if (!env_is("SERVEPROTO_NO_ABORT_CALLBACK", "1"))
        llama_set_abort_callback(e->ctx, engine_decode_abort, e);
    /* overlap (tasks.c): on where llama_decode returns before the device is done, a GPU or rpc
     * servers; SERVEPROTO_OVERLAP=1 runs that path on the CPU too (its tests), =0 turns it off */
    const char *overlap = getenv("SERVEPROTO_OVERLAP");
    e->overlap = overlap && *overlap ? strcmp(overlap, "0") != 0 : gpu || o->dev.n_rpc > 0;
    /* the pipeline (gpu_pipe.c): a decode's rows may be read after the next decode is queued, from
     * llama.cpp's output ring (llama/patches/api/0010), N the rows the other tasks must want for it
     * (SERVEPROTO_PIPELINE=N; 0: off). On by default on a local GPU (a quarter of the ubatch; on the
     * H200 it gave 1.09x / 1.24x requests/s, bench/results/NOTEBOOK.md "The pipeline"); off on the CPU, which
     * computes inside llama_decode and gains nothing (its tests turn it on), with --rpc servers and
     * on stock llama.cpp (no ring) */
    int ring = llamax_has_output_ring();
    e->pipeline = env_int("SERVEPROTO_PIPELINE", ring && gpu && o->dev.n_rpc == 0 ? e->n_ubatch / 4 : 0);
    if (e->pipeline < 0)
        e->pipeline = 0;
    e->pipe_wait_ms = env_int("SERVEPROTO_PIPELINE_WAIT_MS", 2);
    e->pipe_fill = env_int("SERVEPROTO_PIPELINE_FILL", e->pipeline);
    /* the late fill (late_fill.c): with the pipeline, the next decode filled this many microseconds before
     * the host's measured lead on the device's predicted end (SERVEPROTO_PIPELINE_LATE=US; unset: off) */
    e->late.margin_us = env_int("SERVEPROTO_PIPELINE_LATE", 0);
    if (e->late.margin_us < 0)
        e->late.margin_us = 0;
    /* a pretend device for the tests of the late fill on the CPU (test_device.c) */
    e->test_device.us_row = env_int("SERVEPROTO_TEST_DEVICE_US_ROW", 0);
    if (llamax_output_ring(e->ctx, e->pipeline > 0) != 0)
        return load_fail(e, "unsupported", "SERVEPROTO_PIPELINE=%d: this engine is built on llama.cpp without "
                         "the output ring (engines/llama/patches/api/0010; x_patches=%s); unset it or set 0",
                         e->pipeline, llamax_patches());
    return 0;
}

/* The slots, snapshots, read-out rows and batches; the threads. */
static int alloc_buffers(engine *e, const options *o, int gpu)
{
    e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
    e->snaps = calloc((size_t)e->n_pins, sizeof *e->snaps);
    e->cand = malloc((size_t)e->n_vocab * sizeof *e->cand);
    int ok = e->slots && e->snaps && e->cand;
    for (int s = 0; ok && s < e->n_slots; s++)
        ok = (e->slots[s].tokens = malloc((size_t)e->n_ctx_max * sizeof(llama_token))) != NULL;
    if (!ok)
        return load_fail(e, "nomem", "allocating the engine's buffers failed");
    e->n_threads = o->threads;
    e->threads_max = o->threads;
    /* on a GPU the CPU threads wait for the device: nothing to adapt */
    e->threads_auto = o->threads_auto && !gpu && o->dev.n_rpc == 0;
    e->echo_rows = malloc((size_t)e->n_batch * sizeof *e->echo_rows);
    e->echo_lse = malloc((size_t)e->n_batch * sizeof *e->echo_lse);
    e->echo_k = malloc((size_t)e->n_batch * sizeof *e->echo_k);
    e->echo_top = malloc((size_t)e->n_batch * ENGINE_MAX_LOGPROBS * sizeof *e->echo_top);
    e->row_lse = malloc((size_t)e->n_batch * sizeof *e->row_lse);
    e->row_logits = malloc((size_t)e->n_batch * sizeof *e->row_logits);
    e->row_index = malloc((size_t)e->n_batch * sizeof *e->row_index);
    if (!e->echo_rows || !e->echo_lse || !e->echo_k || !e->echo_top || !e->row_lse || !e->row_logits || !e->row_index)
        return load_fail(e, "nomem", "allocating the read-out buffers failed");
    e->batch = llama_batch_init(e->n_batch, 0, e->n_score_seqs + 1); /* a stem's node: its options and the carry */
    e->batch_pend = llama_batch_init(e->n_batch, 0, e->n_score_seqs + 1);
    return 0;
}

/* The score cache, and its directory on disk (persist.c): kept numbers equal fresh ones only when the
 * arithmetic is invariant. */
static int open_score_cache(engine *e, const options *o, int invariant)
{
    if (score_cache_init(&e->scores, invariant ? (size_t)o->score_cache_mb << 20 : 0) != 0)
        return load_fail(e, "nomem", "allocating the score cache failed");
    if (o->cache_dir && !invariant)
        fprintf(stderr, "serveproto-llama: cache: --numerics fast: nothing read from or kept in %s\n", o->cache_dir);
    else if (o->cache_dir && o->score_cache_mb == 0)
        fprintf(stderr, "serveproto-llama: cache: --score-cache-mb 0: nothing read from or kept in %s\n", o->cache_dir);
    else if (o->cache_dir) {
        persist_options po = { .dir = o->cache_dir, .model_path = o->model, .model_sha256 = o->model_sha256,
                               .kv_type = o->kv_f16 ? "f16" : "f32", .disk_budget = (size_t)o->cache_disk_mb << 20,
                               .read_only = o->cache_read_only };
        e->disk = persist_open(&po, e);
    }
    return 0;
}

/* The model and everything the engine serves it with; LOAD_FAIL (kind and detail) on the first failure. */
static int load(engine *e, options *o)
{
    if (check_model_file(e, o) != 0)
        return -1;
    int gpu = devices_local_gpu();
    llamax_config cfg;
    if (numerics_config(e, o, gpu, &cfg) != 0 || load_model(e, o, gpu, &cfg) != 0)
        return -1;
    size_engine(e, o);
    struct llama_context_params cp = context_params(e, o);
    int invariant = numerics_promise(e, o, gpu);
    g_log_tail[0] = '\0';
    e->ctx = llama_init_from_model(e->model, cp);
    if (!e->ctx)
        return load_fail(e, "nomem", "creating the context of %u tokens failed: %s", cp.n_ctx, log_detail());
    if (gpu && !o->fast && gpu_invariant_check(e) != 0)
        return -1;
    if (schedule_config(e, o, gpu) != 0 || alloc_buffers(e, o, gpu) != 0)
        return -1;
    if (o->mmproj) {
        char err[512];
        if (access(o->mmproj, R_OK) != 0)
            return load_fail(e, "io", "--mmproj %s: %s", o->mmproj, strerror(errno));
        g_log_tail[0] = '\0';
        if (picture_load(e, o->mmproj, o->threads, gpu, log_cb, e, err, sizeof err) != 0) {
            const char *why = log_detail();
            return load_fail(e, "unsupported", "%s%s%s", err, *why ? ": " : "", why);
        }
    }
    return open_score_cache(e, o, invariant);
}

static void engine_free(engine *e)
{
    if (e->slots)
        for (int s = 0; s < e->n_slots; s++)
            free(e->slots[s].tokens);
    if (e->snaps)
        for (int i = 0; i < e->n_pins; i++) {
            free(e->snaps[i].tokens);
            free(e->snaps[i].logits);
        }
    free(e->slots);
    free(e->snaps);
    free(e->cand);
    free(e->echo_rows);
    free(e->echo_lse);
    free(e->echo_k);
    free(e->echo_top);
    free(e->row_lse);
    free(e->row_logits);
    free(e->row_index);
    prefix_tokens_free(e);
    picture_set_free(e->pics_in);
    picture_unload(e);
    if (e->disk) {
        persist_close(e->disk); /* the results not yet written go now */
        e->disk = NULL;
    }
    score_cache_free(&e->scores);
    if (e->splice_check)
        fprintf(stderr, "serveproto-llama: splice check: %llu spliced, %llu whole, %llu mismatched, "
                        "%llu from a stem's cut\n",
                (unsigned long long)e->splice.spliced, (unsigned long long)e->splice.whole,
                (unsigned long long)e->splice.mismatched, (unsigned long long)e->splice.stem);
    if (e->batch.token)
        llama_batch_free(e->batch);
    if (e->batch_pend.token)
        llama_batch_free(e->batch_pend);
    if (e->ctx)
        llama_free(e->ctx);
    if (e->model)
        llama_model_free(e->model);
    for (int i = 0; i < ENGINE_QUEUE_MAX; i++)
        if (e->tasks[i].state != TASK_FREE)
            task_end(e, &e->tasks[i]);
    sp_loop_free(&e->in);
    sp_writer_free(&e->w);
}

static void handshake(engine *e)
{
    char caps[2048];
    snprintf(caps, sizeof caps,
             "chat=1 slots=%d n_ctx=%d x_max_prompt=%d n_vocab=%d model=%s pin_slots=%d max_logprobs=%d x_score=1 x_score_base=1%s "
             "x_hidden=%d x_hidden_dim=%d x_counters=1 x_health=1 x_numerics=%s x_batched=1 n_ubatch=%d n_chunk=%d x_threads=%s%d%s%s " SP_STACK_CAPS
             " x_patches=%s",
             e->n_slots, e->n_ctx, e->n_ctx_max, e->n_vocab, e->model_name, e->n_pins, ENGINE_MAX_LOGPROBS,
             e->mtmd ? " vision=1" : "", e->no_hidden ? 0 : hidden_layers(e),
             hidden_dim(e), e->numerics, e->n_ubatch,
             e->n_chunk, e->threads_auto ? "auto:" : "", e->threads_max, e->devices_caps,
             e->disk ? " x_persist=1" : "", llamax_patches());
    sp_write_ready(&e->w);
    sp_write_caps(&e->w, caps);
    double stat[4] = { 0.0, 0.0, 0.0, rss_gb() };
    sp_write_stat(&e->w, stat, 4);
}

/* ---- frames in (engines/common/loop.h: the loop; here the engine's part) ---- */

static void *find_task(void *eng, uint64_t id)
{
    engine *e = eng;
    for (int i = 0; i < ENGINE_QUEUE_MAX; i++)
        if (e->tasks[i].state != TASK_FREE && e->tasks[i].rq.id == id)
            return &e->tasks[i];
    return NULL;
}

/* The IMAGE frames read and not taken by their request, dropped. */
static void pics_drop(engine *e)
{
    picture_set_free(e->pics_in);
    e->pics_in = NULL;
}

/* An IMAGE frame (section 4): without a projector refused, its request dropped when it comes; else
 * kept for the SUBMIT or SCORE of its id (several IMAGEs of one id: one picture each, in order). */
static void on_image(engine *e, sp_request *rq)
{
    if (!e->mtmd || e->skip_submit_id == rq->id) {
        if (e->skip_submit_id != rq->id)
            sp_write_error(&e->w, rq->id, "NOT_SUPPORTED", "this engine has no image tower (vision=0; --mmproj)");
        e->skip_submit_id = rq->id;
        return;
    }
    picture_set *ps = e->pics_in;
    if (!ps && !(ps = e->pics_in = calloc(1, sizeof *ps))) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "out of memory");
        e->skip_submit_id = rq->id;
        return;
    }
    ps->id = rq->id;
    if (ps->n == PICTURE_MAX || rq->grid_h > UINT32_MAX || rq->grid_w > UINT32_MAX) {
        if (ps->n == PICTURE_MAX)
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "IMAGE: more than %d pictures for one request", PICTURE_MAX);
        else
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "IMAGE: grid_h or grid_w over %u", UINT32_MAX);
        pics_drop(e);
        e->skip_submit_id = rq->id;
        return;
    }
    picture *p = &ps->p[ps->n++];
    p->bytes = rq->payload;
    p->len = rq->payload_len;
    p->grid_h = (uint32_t)rq->grid_h;
    p->grid_w = (uint32_t)rq->grid_w;
    rq->payload = NULL;
    rq->payload_len = 0;
}

/* A free task for a SUBMIT or SCORE, or NULL once its refusal is written: its id in flight, its slot out
 * of range or serving another request, or the queue full. */
static task *task_for(engine *e, const sp_request *rq)
{
    if (find_task(e, rq->id)) {
        sp_write_error(&e->w, rq->id, "DUPLICATE_ID", "id %llu is in flight", (unsigned long long)rq->id);
        return NULL;
    }
    if (rq->slot >= (uint64_t)e->n_slots) {
        sp_write_error(&e->w, rq->id, "BAD_REQUEST", "slot %llu is out of range 0..%d",
                       (unsigned long long)rq->slot, e->n_slots - 1);
        return NULL;
    }
    for (int j = 0; j < ENGINE_QUEUE_MAX; j++)
        if (e->tasks[j].state != TASK_FREE && e->tasks[j].rq.slot == rq->slot) {
            sp_write_error(&e->w, rq->id, "SLOT_BUSY", "slot %llu is serving request %llu",
                           (unsigned long long)rq->slot, (unsigned long long)e->tasks[j].rq.id);
            return NULL;
        }
    for (int j = 0; j < ENGINE_QUEUE_MAX; j++)
        if (e->tasks[j].state == TASK_FREE)
            return &e->tasks[j];
    sp_write_error(&e->w, rq->id, "BAD_REQUEST", "too many requests in flight (%d)", ENGINE_QUEUE_MAX);
    return NULL;
}

/* A work request: SUBMIT and SCORE become a task (or are refused), IMAGE is
 * kept for them, DECIDE is refused. Takes *rq's buffers into the task. */
static void on_request(void *eng, sp_request *rq)
{
    engine *e = eng;
    if (rq->kind == SP_SUBMIT || rq->kind == SP_SCORE || rq->kind == SP_IMAGE || rq->kind == SP_DECIDE) {
        /* what follows IMAGEs must be their request: else they are answered BAD_REQUEST (section 4) */
        if (e->pics_in && e->pics_in->id != rq->id) {
            sp_write_error(&e->w, e->pics_in->id, "BAD_REQUEST", "IMAGE: not followed by its SUBMIT or SCORE");
            e->skip_submit_id = e->pics_in->id; /* answered: its request, should it come later, is dropped */
            pics_drop(e);
        }
    }
    if (rq->kind == SP_IMAGE) {
        on_image(e, rq);
        return;
    }
    if (rq->kind == SP_DECIDE) {
        if (e->pics_in) { /* a DECIDE of the IMAGEs' id: one answer for both */
            sp_write_error(&e->w, rq->id, "BAD_REQUEST", "IMAGE: not followed by its SUBMIT or SCORE");
            pics_drop(e);
            return;
        }
        sp_write_error(&e->w, rq->id, "NOT_SUPPORTED", "this engine has no decision mode (decide=0)");
        return;
    }
    if (rq->kind != SP_SUBMIT && rq->kind != SP_SCORE)
        return; /* STOP, CANCEL, PING: the loop's */
    if (e->skip_submit_id == rq->id) {
        e->skip_submit_id = 0; /* its IMAGE was already refused */
        return;
    }
    task *t = task_for(e, rq);
    if (!t) {
        pics_drop(e); /* its IMAGEs go with its refusal */
        return;
    }
    memset(t, 0, sizeof *t);
    t->state = TASK_QUEUED;
    t->ops = rq->kind == SP_SCORE ? &score_ops : &submit_ops; /* the one place that knows the kinds */
    t->rq = *rq;
    t->arrival = ++e->arrivals;
    t->in_us = e->prof.on ? profile_now_us() : 0;
    t->pics = e->pics_in; /* the IMAGEs of its id, if any (the check above dropped others) */
    e->pics_in = NULL;
    e->n_tasks++;
    memset(rq, 0, sizeof *rq);
}

static void on_stop(void *eng, void *t)
{
    (void)eng;
    ((task *)t)->stop = 1;
}

static void on_cancel(void *eng, void *task_, uint64_t id)
{
    engine *e = eng;
    task *t = task_;
    if (t->state == TASK_QUEUED) {
        /* holds nothing yet: answered at once, even inside a decode */
        sp_write_error(&e->w, id, "CANCELLED", "cancelled before it ran");
        task_end(e, t);
    } else {
        /* answered by the scheduler between decodes; a decode that has
         * its rows aborts now (the others in it retry their chunks); a
         * pending task's rows are in the decode before, already computed */
        t->state = TASK_CANCELLED;
        if (e->in_decode && t->rows > 0 && !t->pending)
            e->abort_decode = 1;
    }
}

static int n_active(void *eng)
{
    return ((engine *)eng)->n_tasks;
}

static const sp_loop_ops engine_loop_ops = {
    .request = on_request, .find = find_task, .stop = on_stop, .cancel = on_cancel, .active = n_active,
    .not_found = { "no request ", " in flight" }, .name = "serveproto-llama",
};

/* Non-blocking: takes whatever stdin has now (called between decode steps). */
static void engine_poll(engine *e)
{
    sp_loop_poll(&e->in);
}

/* The scheduler's input hook (engine.h: engine_input), over the frame loop: ctx is the engine's sp_loop. */
static void input_poll(void *in)
{
    sp_loop_poll(in);
}

static void input_wait(void *in, int timeout_ms)
{
    sp_loop_wait(in, timeout_ms);
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* llama.cpp's abort callback (llama_set_abort_callback). The CPU backend calls
 * it on the calling thread after every node of the graph it computes, so
 * within one ubatch: here stdin is read without blocking (at most every
 * ENGINE_POLL_US), PING answered, STOP recorded, and a CANCEL of a task with
 * rows in the running decode aborts it. llama_decode then returns 2 after
 * removing the aborted ubatch's positions from each sequence of its tokens'
 * first seq id; ubatches already computed stay in the cache, and each task of
 * the decode puts its slot and scratch sequences right (sched.c: undo). A GPU
 * backend does not call it: there the checks between decodes remain. */
bool engine_decode_abort(void *data)
{
    engine *e = data;
    if (!e->in_decode)
        return false;
    if (!e->abort_decode) {
        uint64_t t = now_us();
        if (t - e->polled_us < ENGINE_POLL_US)
            return false;
        e->polled_us = t;
        engine_poll(e);
    }
    return e->abort_decode != 0;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_options(argc, argv, &o) != 0) {
        /* the error above stays the last lines (the gateway quotes an engine's last stderr lines) */
        fprintf(stderr, "serveproto-llama: --help lists the options\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    /* past a file-size limit (ulimit -f, systemd LimitFSIZE=) a cache write then fails with EFBIG,
     * which persist.c takes like a full disk, instead of the signal killing the engine */
    signal(SIGXFSZ, SIG_IGN);
    /* SIGUSR2 writes this thread's stack (the frame loop's, llama_decode's) to stderr: the gateway
     * sends it to an engine that missed its PING before killing it (common/stack.h) */
    if (sp_stack_install("serveproto-llama") != 0) {
        perror("serveproto-llama: sigaction");
        return 1;
    }
    static engine e; /* large; zero-initialised */
    if (sp_writer_init(&e.w, 1) != 0 || sp_loop_init(&e.in, SP_EXT_ALL, &e.w, &engine_loop_ops, &e) != 0) {
        fprintf(stderr, "serveproto-llama: out of memory\n");
        return 1;
    }
    e.input = (engine_input){ .poll = input_poll, .wait = input_wait, .ctx = &e.in };
    g_log_verbose = o.verbose;
    llama_log_set(log_cb, &e);
    llama_backend_init();
    if (load(&e, &o) != 0) {
        engine_free(&e);
        llama_backend_free();
        return 1;
    }
    profile_init(&e.prof);
    handshake(&e);
    while (!e.w.failed) {
        engine_poll(&e);
        if (sched_step(&e))
            continue;
        if (e.n_tasks > 0) {
            /* tasks that cannot run are a bug: answer them rather than spin */
            for (int i = 0; i < ENGINE_QUEUE_MAX; i++)
                if (e.tasks[i].state != TASK_FREE) {
                    fprintf(stderr, "serveproto-llama: request %llu cannot make progress\n",
                            (unsigned long long)e.tasks[i].rq.id);
                    sp_write_error(&e.w, e.tasks[i].rq.id, "BAD_REQUEST", "the engine could not schedule it");
                    task_end(&e, &e.tasks[i]);
                }
            continue;
        }
        /* idle: what was computed since the last write goes to disk before waiting for more, and
         * before the end (engine_free frees the pinned snapshots before persist_close writes the
         * last scores) */
        if (e.disk && persist_idle_pending(e.disk, &e))
            persist_idle(e.disk, &e);
        if (e.in.eof)
            break;
        sp_loop_read(&e.in);
        sp_loop_drain(&e.in);
    }
    if (e.late.margin_us > 0 && e.pipeline) /* what the late fill learned (late_fill.c) */
        fprintf(stderr, "serveproto-llama: late fill: %.2f us a row on the device, lead %.0f us\n", e.late.us_row,
                e.late.lead_us);
    profile_free(&e.prof);
    int rc = e.w.failed ? 1 : 0;
    if (e.w.failed)
        fprintf(stderr, "serveproto-llama: stdout is gone, exiting\n");
    engine_free(&e);
    llama_backend_free();
    return rc;
}
