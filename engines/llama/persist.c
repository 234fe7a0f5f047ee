/* persist.c: the score cache and pinned snapshots kept on disk, so a restart
 * computes nothing it computed before (spec/llama-engine.md, "Kept on disk").
 *
 * Only with invariant numerics: there a number is a function of the model,
 * the build and the token ids, so a number read back is the number a cold
 * engine would compute. Every file names what it was computed under (model
 * sha256, engine build, numerics, chat template, format version) and carries
 * checksums; a file that does not match, or does not check, is skipped with
 * one stderr line saying why. A file that checks is still read as data, not
 * trusted: every number is checked finite and every size bounded by what this
 * model's files can hold before anything is allocated or served; a damaged
 * file is removed (or, read-only, remembered), so it is not read again at
 * every request or restart. Files are written to a temporary name and
 * renamed (a reader sees whole files or none), mode 0600 in folders made
 * 0700 (a state file holds the user's text as token ids); a disk budget
 * removes the least recently used files; an flock on the directory's lock
 * file keeps two engines from evicting at once.
 *
 * Layout under --cache-dir (DIR):
 *   DIR/manifest.json                 {"format": "serveproto-cache", "version": 1}
 *   DIR/lock                          flock: shared to load, exclusive to evict
 *   DIR/scores/<model16>/<name>.spc   SCORE results (kind 1), one file per flush
 *   DIR/states/<model16>/<key>.sps    a snapshot's tokens, logits and KV rows (kind 2)
 * where <model16> is the first 16 hex digits of the model's sha256.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include "xxhash/xxhash.h"
#include "sha256/sha256.h"

#include "engine.h"
#include "persist.h"

#ifndef SP_BUILD_ID
#define SP_BUILD_ID "unknown"
#endif

#define PERSIST_VERSION    1
#define PERSIST_KIND_SCORES 1
#define PERSIST_KIND_STATE  2
#define PERSIST_PATH_CAP   4096
#define PERSIST_DIR_MAX    2048  /* bytes of --cache-dir */
#define PERSIST_MAX_FILES  65536
#define PERSIST_TMP_AGE_S  600   /* a temporary file this old was left by a killed writer */
#define PERSIST_PENDING_MAX (4u << 20) /* payload bytes of one scores file, at most (a flush splits) */
#define PERSIST_BAD_MAX    1024  /* files remembered as failing their checks (read-only: not removed) */

static const char MAGIC[8] = { 'S', 'P', 'C', 'A', 'C', 'H', 'E', '\n' };

/* Every file starts with this, little-endian (the engine refuses big-endian hosts' files by
 * their checksums). header_sum: see header_sum(); payload_sum: XXH3_64bits of the payload. */
typedef struct file_header {
    char magic[8];
    uint32_t version, kind;
    char model[64];     /* the model's sha256, hex */
    char build[32];     /* SP_BUILD_ID: the engine's sources, llama.cpp's version and patches, flags */
    char numerics[32];  /* "invariant kv=f32" */
    char tmpl[64];      /* sha256 of the model's chat template, hex ("" hashed when it has none) */
    uint64_t payload_bytes, payload_sum, n_records;
    char reserved[16];
    uint64_t header_sum;
} file_header;
_Static_assert(sizeof(file_header) == 256, "the header is 256 bytes");

/* A scores record: the score_key, the option's ctx, then n_lps doubles. */
typedef struct score_record {
    uint64_t h1, h2;
    int32_t n, ctx, n_lps, pad;
} score_record;

typedef struct loaded_file {
    char name[256];
    int touched;        /* an entry of it was used: its mtime is moved to now at the next flush */
} loaded_file;

struct persist {
    char dir[PERSIST_PATH_CAP];
    char scores_dir[PERSIST_PATH_CAP], states_dir[PERSIST_PATH_CAP];
    char model_path[PERSIST_PATH_CAP];
    file_header id;     /* this engine's identity: the fields a file must match */
    int have_id;
    int read_only;      /* --cache-read-only, or the directory could not be written */
    int off;            /* the manifest is another version: nothing read or written */
    size_t budget;      /* bytes on disk */
    int scores_loaded;
    loaded_file *files;
    int n_files, cap_files;
    unsigned char *pending; /* score records not yet written */
    size_t n_pending, cap_pending;
    uint64_t pending_records;
    uint64_t seq;       /* file names made by this process */
    uint64_t state_cell_max; /* bytes of llama.cpp's sequence state per cell, at most (state_bound) */
    int write_failing;  /* the last write failed: said once, the next ones are tried all the same */
    uint64_t writes_failed;
    persist_stats stats;
};

static void plog(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("serveproto-llama: cache: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* snprintf that says whether the whole path fit (a cut path would name another file). */
static int join(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap ? 0 : -1;
}

static void hex(const unsigned char *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
}

/* sha256 of a file, hex into out[64]. */
static int sha256_file(const char *path, char *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    sha256_t s;
    sha256_init(&s);
    static unsigned char buf[1 << 20];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, f)) > 0)
        sha256_update(&s, buf, r);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return -1;
    unsigned char d[32];
    sha256_final(&s, d);
    hex(d, 32, out);
    return 0;
}

static void field(char *dst, size_t cap, const char *src)
{
    memset(dst, 0, cap);
    size_t n = strlen(src);
    memcpy(dst, src, n < cap ? n : cap);
}

/* Folders made 0700 and files 0600: a state file holds the user's text as token ids, and the scores
 * what was asked (the decision log is 0600 too). A folder that exists keeps its mode: an operator who
 * shares it with a replica under another user sets that. */
static int mkdirs(const char *path)
{
    char tmp[PERSIST_PATH_CAP];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0700) && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(tmp, 0700) && errno != EEXIST ? -1 : 0;
}

/* Writes len bytes (and the header first when h) to dir/name through a temporary file and a
 * rename, fsynced: a reader sees the whole file or none, even after kill -9 or a power cut. */
static int write_atomic(persist *p, const char *dir, const char *name, const file_header *h, const void *a,
                        size_t na, const void *b, size_t nb)
{
    char tmp[PERSIST_PATH_CAP], dst[PERSIST_PATH_CAP];
    (void)join(tmp, sizeof tmp, "%s/.tmp-%d-%llu", dir, (int)getpid(), (unsigned long long)++p->seq);
    (void)join(dst, sizeof dst, "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    /* testing only: a pause after the header, so that a test can kill -9 the engine mid-write */
    const char *delay = getenv("SERVEPROTO_CACHE_WRITE_DELAY_MS");
    const void *parts[3] = { h, a, b };
    size_t lens[3] = { h ? sizeof *h : 0, na, nb };
    int ok = 1;
    for (int i = 0; i < 3 && ok; i++) {
        const char *c = parts[i];
        size_t left = lens[i];
        while (left > 0) {
            ssize_t w = write(fd, c, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                ok = 0;
                break;
            }
            c += w;
            left -= (size_t)w;
        }
        if (i == 0 && delay && *delay)
            usleep((useconds_t)atoi(delay) * 1000u);
    }
    ok = ok && fsync(fd) == 0;
    int err = errno;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, dst) != 0) {
        err = errno;
        unlink(tmp);
        errno = err;
        return -1;
    }
    /* the rename itself made durable */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

/* A write failed (a full disk, a quota, EFBIG past a file-size limit: main.c ignores SIGXFSZ so that
 * the write says so instead of killing the engine). Serving goes on and what was not written costs a
 * recomputation after a restart; the next write is tried all the same (a full disk frees up, a scores
 * file of a few hundred bytes fits under a limit a state file does not), and only the first failure in
 * a row is said. */
static void write_failed(persist *p, const char *dir)
{
    if (!p->write_failing)
        plog("%s: a write failed (%s): serving on; later writes are tried again", dir, strerror(errno));
    p->write_failing = 1;
    p->writes_failed++;
}

static void write_done(persist *p)
{
    if (p->write_failing)
        plog("writing again (%llu writes failed before this one)", (unsigned long long)p->writes_failed);
    p->write_failing = 0;
    p->writes_failed = 0;
}

/* The manifest: the layout's version. Made when missing; another version turns the cache off. */
static int check_manifest(persist *p)
{
    char path[PERSIST_PATH_CAP];
    (void)join(path, sizeof path, "%s/manifest.json", p->dir);
    /* O_NONBLOCK and a regular file only: a FIFO put in its place would block the engine's start */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd >= 0 && (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))) {
        close(fd);
        plog("%s is not a regular file: the cache is not used", path);
        return -1;
    }
    if (fd >= 0) {
        char buf[512];
        ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
        close(fd);
        buf[r > 0 ? r : 0] = '\0';
        const char *v = strstr(buf, "\"version\"");
        int version = -1;
        if (strstr(buf, "\"serveproto-cache\"") && v && (v = strchr(v, ':')))
            version = atoi(v + 1);
        if (version != PERSIST_VERSION) {
            plog("%s: format version %d, this engine reads version %d: the cache is not used", path, version,
                 PERSIST_VERSION);
            return -1;
        }
        return 0;
    }
    if (p->read_only)
        return 0;
    static const char body[] = "{\"format\": \"serveproto-cache\", \"version\": 1}\n";
    if (write_atomic(p, p->dir, "manifest.json", NULL, body, sizeof body - 1, NULL, 0) != 0) {
        plog("%s is not writable (%s): serving on, nothing will be written", p->dir, strerror(errno));
        p->read_only = 1;
    }
    return 0;
}

/* An integer of the model's GGUF metadata ("<architecture>.<key>"), or def. */
static long meta_int(const struct llama_model *m, const char *key, long def)
{
    char arch[64], name[192], val[64];
    if (llama_model_meta_val_str(m, "general.architecture", arch, sizeof arch) < 0)
        return def;
    snprintf(name, sizeof name, "%s.%s", arch, key);
    if (llama_model_meta_val_str(m, name, val, sizeof val) < 0)
        return def;
    char *end;
    long v = strtol(val, &end, 10);
    return end != val && v > 0 ? v : def;
}

/* The most bytes one cell takes in llama.cpp's sequence state of this model (llama-kv-cache.cpp,
 * state_write_meta and state_write_data): its position, sequence and extension fields, and each
 * layer's K and V rows in F32 (the widest type the engine keeps them in), counted as if every query
 * head had its own KV head. A bound, not the size (about 3 times it on the default model): a file's
 * header cannot make the engine allocate more than a state of its length can need. */
static uint64_t state_cell_bound(const engine *e)
{
    const struct llama_model *m = e->model;
    long n_embd = llama_model_n_embd(m), n_head = llama_model_n_head(m), n_head_kv = llama_model_n_head_kv(m);
    long heads = n_head > n_head_kv ? n_head : n_head_kv;
    if (heads < 1)
        heads = 1;
    long dk = meta_int(m, "attention.key_length", n_embd / heads), dv = meta_int(m, "attention.value_length", dk);
    long dim = (dk > dv ? dk : dv) * heads;
    if (dim < n_embd)
        dim = n_embd;
    return 64 + (uint64_t)llama_model_n_layer(m) * 2u * (uint64_t)dim * sizeof(float);
}

persist *persist_open(const persist_options *o, engine *e)
{
    /* a bounded folder name: every path under it (names up to 255 bytes) fits PERSIST_PATH_CAP */
    if (strlen(o->dir) > PERSIST_DIR_MAX) {
        plog("--cache-dir is longer than %d bytes: the cache is not used", PERSIST_DIR_MAX);
        return NULL;
    }
    persist *p = calloc(1, sizeof *p);
    if (!p || join(p->model_path, sizeof p->model_path, "%s", o->model_path) != 0) {
        free(p);
        return NULL;
    }
    (void)join(p->dir, sizeof p->dir, "%s", o->dir);
    p->budget = o->disk_budget;
    p->read_only = o->read_only;
    p->state_cell_max = state_cell_bound(e);
    memcpy(p->id.magic, MAGIC, sizeof MAGIC);
    p->id.version = PERSIST_VERSION;
    field(p->id.build, sizeof p->id.build, SP_BUILD_ID);
    /* a GPU's invariant digits are that GPU model's: neither the CPU's nor another GPU's (patch 0006) */
    char gpu[16] = "";
    if (e->gpu_name[0]) {
        unsigned char g[32];
        char g_hex[9] = "";
        sha256_hash(g, (const unsigned char *)e->gpu_name, strlen(e->gpu_name));
        hex(g, 4, g_hex);
        snprintf(gpu, sizeof gpu, " gpu=%s", g_hex);
    }
    char numerics[64];
    snprintf(numerics, sizeof numerics, "%s kv=%s%s", e->numerics, o->kv_type, gpu);
    field(p->id.numerics, sizeof p->id.numerics, numerics);
    const char *tmpl = llama_model_chat_template(e->model, NULL);
    unsigned char d[32];
    sha256_hash(d, (const unsigned char *)(tmpl ? tmpl : ""), tmpl ? strlen(tmpl) : 0);
    hex(d, 32, p->id.tmpl);
    if (o->model_sha256 && *o->model_sha256) {
        if (strlen(o->model_sha256) != 64) {
            plog("--model-sha256 must be 64 hex digits: the cache is not used");
            free(p);
            return NULL;
        }
        for (int i = 0; i < 64; i++)
            p->id.model[i] = (char)(o->model_sha256[i] | 0x20); /* lower case */
        p->have_id = 1;
    }
    if (!p->read_only && mkdirs(p->dir) != 0) {
        plog("%s cannot be made (%s): serving on, nothing will be written", p->dir, strerror(errno));
        p->read_only = 1;
    }
    if (check_manifest(p) != 0)
        p->off = 1;
    return p;
}

/* The model's sha256 (hashing the file once, at the first use of the cache, unless
 * --model-sha256 gave it), and the per-model folders. */
static int ensure_id(persist *p)
{
    if (p->off)
        return -1;
    if (!p->have_id) {
        char h[65];
        if (sha256_file(p->model_path, h) != 0) {
            plog("%s: cannot read the model to hash it (%s): the cache is not used", p->model_path, strerror(errno));
            p->off = 1;
            return -1;
        }
        memcpy(p->id.model, h, 64);
        p->have_id = 1;
    }
    if (!p->scores_dir[0]) {
        (void)join(p->scores_dir, sizeof p->scores_dir, "%s/scores/%.16s", p->dir, p->id.model);
        (void)join(p->states_dir, sizeof p->states_dir, "%s/states/%.16s", p->dir, p->id.model);
        if (!p->read_only && (mkdirs(p->scores_dir) != 0 || mkdirs(p->states_dir) != 0)) {
            plog("%s is not writable (%s): serving on, nothing will be written", p->dir, strerror(errno));
            p->read_only = 1;
        }
    }
    return 0;
}

/* The header's checksum: the first 8 bytes of the sha256 of the 248 bytes before it, little-endian
 * (sha256 here so that a tool in any language checks a header; the payload's is XXH3, for speed). */
static uint64_t header_sum(const file_header *h)
{
    unsigned char d[32];
    sha256_hash(d, (const unsigned char *)h, offsetof(file_header, header_sum));
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | d[i];
    return v;
}

static void header_seal(file_header *h)
{
    h->header_sum = header_sum(h);
}

/* Why a header is not this engine's (NULL: it is). */
static const char *header_mismatch(const persist *p, const file_header *h, uint32_t kind, char *why, size_t cap)
{
    if (memcmp(h->magic, MAGIC, sizeof MAGIC) != 0)
        return "not a serveproto cache file (bad magic)";
    if (h->header_sum != header_sum(h))
        return "header checksum mismatch (torn or corrupted)";
    if (h->version != PERSIST_VERSION) {
        snprintf(why, cap, "format version %u, this engine reads version %u", h->version, PERSIST_VERSION);
        return why;
    }
    if (h->kind != kind) {
        snprintf(why, cap, "kind %u, expected %u", h->kind, kind);
        return why;
    }
    /* the identity fields, each with its reason: the file's value, then this engine's */
    const struct {
        const char *file, *mine;
        size_t n;
        const char *reason;
    } ids[] = {
        { h->model, p->id.model, sizeof h->model, "another model (sha256 %.12s..., this model %.12s...)" },
        { h->build, p->id.build, sizeof h->build, "another engine build (%.32s, this engine %.32s)" },
        { h->numerics, p->id.numerics, sizeof h->numerics, "other numerics (%.32s, this engine %.32s)" },
        { h->tmpl, p->id.tmpl, sizeof h->tmpl, "another chat template (sha256 %.12s..., this model's %.12s...)" },
    };
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++)
        if (memcmp(ids[i].file, ids[i].mine, ids[i].n) != 0) {
            snprintf(why, cap, ids[i].reason, ids[i].file, ids[i].mine);
            return why;
        }
    return NULL;
}

/* Files that failed their checks and were not removed (a read-only folder, or nothing this engine
 * wrote: a FIFO, a file of another layout): known by their inode and mtime, so that a request on
 * their state does not read them again, and a file written in their place is read. */
typedef struct bad_file {
    dev_t dev;
    ino_t ino;
    struct timespec mtime;
} bad_file;

static bad_file g_bad[PERSIST_BAD_MAX];
static int g_n_bad, g_next_bad;

static int same_file(const bad_file *b, const struct stat *sb)
{
    return b->dev == sb->st_dev && b->ino == sb->st_ino && b->mtime.tv_sec == sb->st_mtim.tv_sec &&
           b->mtime.tv_nsec == sb->st_mtim.tv_nsec;
}

static int known_bad(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return 1; /* removed meanwhile: nothing to read */
    for (int i = 0; i < g_n_bad; i++)
        if (same_file(&g_bad[i], &sb))
            return 1;
    return 0;
}

/* A file skipped: one line naming it and why. A damaged one (torn, corrupted, or numbers that are
 * not finite: anything this engine's own writes never leave) is removed when the folder is
 * writable, so that it is neither read nor kept fresh at every restart and a state pinned again is
 * written anew; else, and for what is not ours to remove (a FIFO, another build's file), it is
 * remembered for this process. */
static void file_bad(persist *p, const char *path, const char *why, int damaged)
{
    int removed = damaged && !p->read_only && !p->off && unlink(path) == 0;
    plog("%s skipped: %s%s", path, why, removed ? "; removed" : "");
    p->stats.files_skipped++;
    struct stat sb;
    if (removed || stat(path, &sb) != 0)
        return;
    for (int i = 0; i < g_n_bad; i++)
        if (same_file(&g_bad[i], &sb))
            return;
    g_bad[g_next_bad] = (bad_file){ sb.st_dev, sb.st_ino, sb.st_mtim };
    g_next_bad = (g_next_bad + 1) % PERSIST_BAD_MAX;
    if (g_n_bad < PERSIST_BAD_MAX)
        g_n_bad++;
}

/* Reads and checks a whole file of `kind` whose payload this model's files never make larger than
 * max_payload: its payload (malloc'd) or NULL, the reason said (file_bad). */
static unsigned char *read_checked(persist *p, const char *path, uint32_t kind, uint64_t max_payload, file_header *h,
                                   size_t *n_out)
{
    /* O_NONBLOCK: a FIFO under a cache file's name would block the open until a writer came */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return NULL; /* removed meanwhile (another engine evicted it): nothing to say */
    struct stat sb;
    unsigned char *buf = NULL;
    const char *why = NULL;
    int damaged = 1;
    char whybuf[256];
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        why = "not a regular file";
        damaged = 0;
        goto out;
    }
    if ((size_t)sb.st_size < sizeof *h) {
        why = "shorter than its header (torn or corrupted)";
        goto out;
    }
    if (pread(fd, h, sizeof *h, 0) != (ssize_t)sizeof *h) {
        why = "unreadable header";
        goto out;
    }
    if ((why = header_mismatch(p, h, kind, whybuf, sizeof whybuf))) {
        /* bad magic or a torn header is damage; another build's, model's... file is another engine's */
        damaged = !memcmp(h->magic, MAGIC, sizeof MAGIC) && h->header_sum != header_sum(h);
        goto out;
    }
    /* before allocating: a sealed header over a sparse file once made the engine allocate gigabytes */
    if (h->payload_bytes > max_payload) {
        snprintf(whybuf, sizeof whybuf, "its header says %llu payload bytes, more than such a file holds (at most %llu)",
                 (unsigned long long)h->payload_bytes, (unsigned long long)max_payload);
        why = whybuf;
        goto out;
    }
    if ((uint64_t)sb.st_size != sizeof *h + h->payload_bytes) {
        snprintf(whybuf, sizeof whybuf, "%lld bytes, its header says %llu (torn or corrupted)", (long long)sb.st_size,
                 (unsigned long long)(sizeof *h + h->payload_bytes));
        why = whybuf;
        goto out;
    }
    buf = malloc(h->payload_bytes ? h->payload_bytes : 1);
    if (!buf) {
        why = "out of memory reading it";
        damaged = 0;
        goto out;
    }
    size_t got = 0;
    while (got < h->payload_bytes) {
        ssize_t r = pread(fd, buf + got, h->payload_bytes - got, (off_t)(sizeof *h + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got != h->payload_bytes) {
        why = "short read";
    } else if (XXH3_64bits(buf, h->payload_bytes) != h->payload_sum) {
        why = "payload checksum mismatch (torn or corrupted)";
    }
out:
    close(fd);
    if (why) {
        free(buf);
        file_bad(p, path, why, damaged);
        return NULL;
    }
    *n_out = h->payload_bytes;
    return buf;
}

/* Finite: neither NaN nor an infinity, read from the bits (whatever the compiler's float flags). */
static int finite64(const unsigned char *b)
{
    uint64_t v;
    memcpy(&v, b, 8);
    return (v >> 52 & 0x7ff) != 0x7ff;
}

static int finite32(const unsigned char *b)
{
    uint32_t v;
    memcpy(&v, b, 4);
    return (v >> 23 & 0xff) != 0xff;
}

/* Rows of ggml type `type` (F32, F16, BF16: the types of a KV cache this engine keeps): 1 when every
 * value is finite, 0 when one is not, -1 for another type. */
static int rows_finite(const unsigned char *b, uint64_t n, int32_t type)
{
    if (type == 0) { /* GGML_TYPE_F32 */
        for (uint64_t i = 0; i + 4 <= n; i += 4)
            if (!finite32(b + i))
                return 0;
        return 1;
    }
    if (type == 1 || type == 30) { /* GGML_TYPE_F16: exponent 0x7c00; GGML_TYPE_BF16: 0x7f80 */
        const uint16_t mask = type == 1 ? 0x7c00 : 0x7f80;
        for (uint64_t i = 0; i + 2 <= n; i += 2) {
            uint16_t v;
            memcpy(&v, b + i, 2);
            if ((v & mask) == mask)
                return 0;
        }
        return 1;
    }
    return -1;
}

typedef struct reader {
    const unsigned char *b;
    uint64_t n, at;
} reader;

static int take(reader *r, void *dst, uint64_t k)
{
    if (r->n - r->at < k)
        return -1;
    memcpy(dst, r->b + r->at, k);
    r->at += k;
    return 0;
}

/* k bytes of rows of `type`, checked finite and stepped over: 0; 1 for a value that is not finite;
 * -1 (why said) for a type this engine does not check, -2 when the rows end early. */
static int take_rows(reader *r, uint64_t k, int32_t type, char *why, size_t cap)
{
    if (r->n - r->at < k)
        return -2;
    int ok = rows_finite(r->b + r->at, k, type);
    if (ok == 0)
        snprintf(why, cap, "a KV row holds a value that is not finite");
    else if (ok < 0)
        snprintf(why, cap, "KV rows of ggml type %d, which this engine does not check", type);
    if (ok <= 0)
        return ok == 0 ? 1 : -1;
    r->at += k;
    return 0;
}

/* llama.cpp's sequence state of one sequence (llama_state_seq_get_data: llama-context.cpp's magic and
 * sequence id, then llama-kv-cache.cpp's state_write: per stream a cell count, each cell's position,
 * extension (ext bytes: llama_kv_cell_ext, on M-RoPE and n-gram models) and sequence, then each
 * layer's K rows and V rows, plain or transposed) walked to its end, every K and V value checked
 * finite: a NaN row restored makes every answer on the state NaN, which the gateway takes for a broken
 * engine. 0, 1 for a value that is not finite, -1 for a layout this walk does not know; why says. */
static int state_rows_check(const unsigned char *b, uint64_t n, uint64_t ext, char *why, size_t cap)
{
    reader r = { b, n, 0 };
    uint32_t magic, n_stream;
    int32_t seq;
    if (take(&r, &magic, 4) || take(&r, &seq, 4) || take(&r, &n_stream, 4) || n_stream == 0 || n_stream > 4096)
        goto layout;
    for (uint32_t s = 0; s < n_stream; s++) {
        uint32_t cells, v_trans, n_layer;
        if (take(&r, &cells, 4))
            goto layout;
        if (cells == 0)
            continue;
        for (uint32_t c = 0; c < cells; c++) {
            int32_t pos, sid;
            uint32_t n_seq;
            if (take(&r, &pos, 4) || take(&r, &n_seq, 4) || n_seq != 1 || r.n - r.at < ext)
                goto layout;
            r.at += ext;
            if (take(&r, &sid, 4) || sid != seq)
                goto layout;
        }
        if (take(&r, &v_trans, 4) || take(&r, &n_layer, 4) || v_trans > 1 || n_layer == 0 || n_layer > 4096)
            goto layout;
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t l = 0; l < n_layer; l++) {
                int32_t type;
                uint64_t row;
                if (take(&r, &type, 4))
                    goto layout;
                if (kv == 1 && v_trans) { /* element size, then the row's length: one row per dimension */
                    uint32_t el, dim;
                    if (take(&r, &el, 4) || take(&r, &dim, 4) || el == 0 || el > 8)
                        goto layout;
                    row = (uint64_t)el * dim;
                } else if (take(&r, &row, 8) || row == 0 || row > n) {
                    goto layout;
                }
                if (row > n / cells)
                    goto layout;
                int t = take_rows(&r, row * cells, type, why, cap);
                if (t == -2)
                    goto layout;
                if (t != 0)
                    return t;
            }
    }
    if (r.at == n)
        return 0;
layout:
    snprintf(why, cap, "its KV rows are not in the layout this engine checks");
    return -1;
}

/* ---- listing, eviction ---- */

typedef struct dir_file {
    char path[PERSIST_PATH_CAP];
    off_t size;
    struct timespec mtime;
    int tmp;
} dir_file;

static int is_cache_name(const char *n, int *tmp)
{
    size_t l = strlen(n);
    *tmp = !strncmp(n, ".tmp-", 5);
    return *tmp || (l > 4 && (!strcmp(n + l - 4, ".spc") || !strcmp(n + l - 4, ".sps")));
}

/* Appends the cache files of dir (and, depth > 0, of its subfolders) to *fs. */
static void list_files(const char *dir, int depth, dir_file **fs, int *n, int *cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) && *n < PERSIST_MAX_FILES) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        char path[PERSIST_PATH_CAP];
        (void)join(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0)
            continue;
        if (S_ISDIR(sb.st_mode)) {
            if (depth > 0)
                list_files(path, depth - 1, fs, n, cap);
            continue;
        }
        int tmp;
        if (!S_ISREG(sb.st_mode) || !is_cache_name(de->d_name, &tmp))
            continue;
        if (*n == *cap) {
            int nc = *cap ? 2 * *cap : 64;
            dir_file *g = realloc(*fs, (size_t)nc * sizeof *g);
            if (!g)
                break;
            *fs = g;
            *cap = nc;
        }
        dir_file *f = &(*fs)[(*n)++];
        snprintf(f->path, sizeof f->path, "%s", path);
        f->size = sb.st_size;
        f->mtime = sb.st_mtim;
        f->tmp = tmp;
    }
    closedir(d);
}

static int by_mtime(const void *a, const void *b)
{
    const dir_file *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->path, y->path);
}

static int lock_dir(const persist *p, int how)
{
    char path[PERSIST_PATH_CAP];
    (void)join(path, sizeof path, "%s/lock", p->dir);
    int fd = open(path, (p->read_only ? O_RDONLY : O_RDWR | O_CREAT) | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    if (flock(fd, how) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void unlock_dir(int fd)
{
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

/* Least recently used files out until the cache's files fit the budget (every model's: the budget
 * is the directory's); temporary files of killed writers out too. One engine at a time: an
 * engine that finds another evicting leaves it to that one. */
static void evict(persist *p)
{
    int fd = lock_dir(p, LOCK_EX | LOCK_NB);
    if (fd < 0)
        return;
    dir_file *fs = NULL;
    int n = 0, cap = 0;
    char sub[PERSIST_PATH_CAP];
    (void)join(sub, sizeof sub, "%s/scores", p->dir);
    list_files(sub, 1, &fs, &n, &cap);
    (void)join(sub, sizeof sub, "%s/states", p->dir);
    list_files(sub, 1, &fs, &n, &cap);
    qsort(fs, (size_t)n, sizeof *fs, by_mtime);
    uint64_t total = 0;
    time_t now = time(NULL);
    for (int i = 0; i < n; i++) {
        if (fs[i].tmp && now - fs[i].mtime.tv_sec > PERSIST_TMP_AGE_S) {
            unlink(fs[i].path);
            fs[i].size = -1;
            continue;
        }
        total += (uint64_t)fs[i].size;
    }
    for (int i = 0; i < n && total > p->budget; i++) {
        if (fs[i].size < 0 || fs[i].tmp)
            continue;
        if (unlink(fs[i].path) == 0) {
            total -= (uint64_t)fs[i].size;
            p->stats.files_evicted++;
        }
    }
    free(fs);
    unlock_dir(fd);
}

/* ---- the score cache ---- */

static void persist_scores_load(persist *p, score_cache *c)
{
    if (p->scores_loaded)
        return;
    p->scores_loaded = 1;
    if (ensure_id(p) != 0)
        return;
    int fd = lock_dir(p, LOCK_SH);
    dir_file *fs = NULL;
    int n = 0, cap = 0;
    list_files(p->scores_dir, 0, &fs, &n, &cap);
    /* oldest first: past the memory budget the most recently used files stay */
    qsort(fs, (size_t)n, sizeof *fs, by_mtime);
    for (int i = 0; i < n; i++) {
        if (fs[i].tmp)
            continue;
        file_header h;
        size_t len = 0;
        unsigned char *buf = read_checked(p, fs[i].path, PERSIST_KIND_SCORES, PERSIST_PENDING_MAX, &h, &len);
        if (!buf)
            continue;
        /* every record whole and every logprob finite before one is served: a NaN answered from here
         * is a protocol violation to the gateway, which restarts the engine, which reads it again */
        const char *why = NULL;
        char whybuf[160];
        uint64_t recs = 0;
        for (size_t off = 0; off < len && !why; recs++) {
            score_record r;
            if (len - off < sizeof r) {
                why = "a record cut short";
                break;
            }
            memcpy(&r, buf + off, sizeof r);
            if (r.n_lps < 0 || r.n_lps > ENGINE_MAX_SCORED || r.n < 0 || r.ctx < 0 ||
                (size_t)r.n_lps * sizeof(double) > len - off - sizeof r) {
                snprintf(whybuf, sizeof whybuf, "record %llu is not one this engine writes", (unsigned long long)recs);
                why = whybuf;
                break;
            }
            for (int j = 0; j < r.n_lps && !why; j++)
                if (!finite64(buf + off + sizeof r + (size_t)j * sizeof(double))) {
                    snprintf(whybuf, sizeof whybuf, "record %llu holds a logprob that is not finite",
                             (unsigned long long)recs);
                    why = whybuf;
                }
            off += sizeof r + (size_t)r.n_lps * sizeof(double);
        }
        if (!why && recs != h.n_records) {
            snprintf(whybuf, sizeof whybuf, "%llu records, its header says %llu", (unsigned long long)recs,
                     (unsigned long long)h.n_records);
            why = whybuf;
        }
        if (why) {
            file_bad(p, fs[i].path, why, 1);
            free(buf);
            continue;
        }
        if (p->n_files == p->cap_files) {
            int nc = p->cap_files ? 2 * p->cap_files : 64;
            loaded_file *g = realloc(p->files, (size_t)nc * sizeof *g);
            if (!g) {
                free(buf);
                break;
            }
            p->files = g;
            p->cap_files = nc;
        }
        int idx = p->n_files++;
        const char *base = strrchr(fs[i].path, '/');
        (void)join(p->files[idx].name, sizeof p->files[idx].name, "%s", base ? base + 1 : fs[i].path);
        p->files[idx].touched = 0;
        for (size_t off = 0; off < len;) { /* checked above */
            score_record r;
            memcpy(&r, buf + off, sizeof r);
            score_key k = { r.h1, r.h2, r.n };
            double lps[ENGINE_MAX_SCORED];
            memcpy(lps, buf + off + sizeof r, (size_t)r.n_lps * sizeof(double));
            score_cache_put(c, &k, r.ctx, lps, r.n_lps, idx);
            off += sizeof r + (size_t)r.n_lps * sizeof(double);
        }
        p->stats.entries_loaded += recs;
        p->stats.files_loaded++;
        free(buf);
    }
    free(fs);
    unlock_dir(fd);
}

static void persist_scores_note(persist *p, const score_key *k, int ctx, const double *lps, int n_lps)
{
    if (p->read_only || p->off)
        return;
    size_t need = sizeof(score_record) + (size_t)n_lps * sizeof(double);
    if (p->n_pending + need > p->cap_pending) {
        size_t nc = p->cap_pending ? 2 * p->cap_pending : 65536;
        while (nc < p->n_pending + need)
            nc *= 2;
        unsigned char *g = realloc(p->pending, nc);
        if (!g)
            return; /* not kept on disk: only costs a recomputation after a restart */
        p->pending = g;
        p->cap_pending = nc;
    }
    score_record r = { k->h1, k->h2, k->n, ctx, n_lps, 0 };
    memcpy(p->pending + p->n_pending, &r, sizeof r);
    memcpy(p->pending + p->n_pending + sizeof r, lps, (size_t)n_lps * sizeof(double));
    p->n_pending += need;
    p->pending_records++;
}

static void persist_scores_touch(persist *p, int file)
{
    if (file >= 0 && file < p->n_files)
        p->files[file].touched = 1;
    p->stats.disk_hits++;
}

int persist_scores_get(persist *p, score_cache *c, const score_key *k, int ctx, double *lps, int cap, int *from_disk)
{
    *from_disk = 0;
    if (p && c->buckets)
        persist_scores_load(p, c); /* once: the files of earlier runs */
    int file = -1;
    const int n = score_cache_get(c, k, ctx, lps, cap, &file);
    if (n >= 0 && file >= 0 && p) {
        persist_scores_touch(p, file);
        *from_disk = 1;
    }
    return n;
}

void persist_scores_put(persist *p, score_cache *c, const score_key *k, int ctx, const double *lps, int n_lps)
{
    if (p && c->buckets)
        persist_scores_note(p, k, ctx, lps, n_lps);
    score_cache_put(c, k, ctx, lps, n_lps, -1);
}

int persist_pending(const persist *p)
{
    if (p->read_only || p->off)
        return 0;
    for (int i = 0; i < p->n_files; i++)
        if (p->files[i].touched)
            return 1;
    return p->n_pending > 0;
}

int persist_flush(persist *p)
{
    if (!persist_pending(p) || ensure_id(p) != 0)
        return 0;
    int rc = 0, wrote = 0;
    /* files of PERSIST_PENDING_MAX payload bytes at most, cut between records: a reader then knows
     * the most a scores file holds before it allocates */
    for (size_t off = 0; off < p->n_pending;) {
        size_t end = off;
        uint64_t recs = 0;
        while (end < p->n_pending) {
            score_record r;
            memcpy(&r, p->pending + end, sizeof r);
            size_t need = sizeof r + (size_t)r.n_lps * sizeof(double);
            if (end > off && end + need - off > PERSIST_PENDING_MAX)
                break;
            end += need;
            recs++;
        }
        file_header h = p->id;
        h.kind = PERSIST_KIND_SCORES;
        h.payload_bytes = end - off;
        h.payload_sum = XXH3_64bits(p->pending + off, end - off);
        h.n_records = recs;
        header_seal(&h);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        char name[128];
        snprintf(name, sizeof name, "%lld%09ld-%d-%llu.spc", (long long)ts.tv_sec, ts.tv_nsec, (int)getpid(),
                 (unsigned long long)++p->seq);
        if (write_atomic(p, p->scores_dir, name, &h, p->pending + off, end - off, NULL, 0) != 0) {
            write_failed(p, p->scores_dir);
            rc = -1;
        } else {
            write_done(p);
            p->stats.files_written++;
            wrote = 1;
            p->stats.entries_written += recs;
        }
        off = end;
    }
    p->n_pending = 0;
    p->pending_records = 0;
    /* a file whose entries served is recently used: the disk budget keeps it longest */
    for (int i = 0; i < p->n_files && !p->read_only; i++)
        if (p->files[i].touched) {
            char path[PERSIST_PATH_CAP];
            (void)join(path, sizeof path, "%s/%s", p->scores_dir, p->files[i].name);
            utimensat(AT_FDCWD, path, NULL, 0);
            p->files[i].touched = 0;
        }
    if (wrote)
        evict(p);
    return rc;
}

void persist_close(persist *p)
{
    if (!p)
        return;
    persist_flush(p);
    const persist_stats *st = &p->stats;
    if (st->files_loaded || st->files_written || st->files_skipped || st->states_written || st->states_restored)
        plog("%llu scores files read (%llu entries, %llu answers from them), %llu written (%llu entries), "
             "%llu skipped, %llu evicted; %llu states written, %llu restored, %llu refused",
             (unsigned long long)st->files_loaded, (unsigned long long)st->entries_loaded,
             (unsigned long long)st->disk_hits, (unsigned long long)st->files_written,
             (unsigned long long)st->entries_written, (unsigned long long)st->files_skipped,
             (unsigned long long)st->files_evicted, (unsigned long long)st->states_written,
             (unsigned long long)st->states_restored, (unsigned long long)st->states_skipped);
    free(p->files);
    free(p->pending);
    free(p);
}

/* ---- snapshots ----
 * A state file (kind 2) holds one snapshot: its token ids, the logits of its last position and its
 * sequence's KV rows as llama_state_seq_get_data gives them. Named <h1><h2>-<n>.sps after the
 * score_key of its tokens, so a prompt finds the files of its prefixes by hashing its own tokens. */

typedef struct state_head {
    int32_t n, n_vocab;
    uint64_t state_bytes;
} state_head;

typedef struct disk_state {
    uint64_t h1, h2;
    int n;
} disk_state;

static disk_state *g_states;
static int g_n_states, g_cap_states;
static struct timespec g_states_mtime; /* the folder's mtime when it was listed */

static void states_add(uint64_t h1, uint64_t h2, int n)
{
    for (int i = 0; i < g_n_states; i++)
        if (g_states[i].h1 == h1 && g_states[i].h2 == h2 && g_states[i].n == n)
            return;
    if (g_n_states == g_cap_states) {
        int nc = g_cap_states ? 2 * g_cap_states : 64;
        disk_state *g = realloc(g_states, (size_t)nc * sizeof *g);
        if (!g)
            return;
        g_states = g;
        g_cap_states = nc;
    }
    g_states[g_n_states++] = (disk_state){ h1, h2, n };
}

/* The state files on disk now (listed again when the folder changed: another engine wrote one). */
static void states_list(persist *p)
{
    struct stat sb;
    if (stat(p->states_dir, &sb) != 0)
        return;
    if (sb.st_mtim.tv_sec == g_states_mtime.tv_sec && sb.st_mtim.tv_nsec == g_states_mtime.tv_nsec)
        return;
    g_states_mtime = sb.st_mtim;
    g_n_states = 0;
    DIR *d = opendir(p->states_dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        unsigned long long h1, h2;
        int n, used = 0;
        if (sscanf(de->d_name, "%16llx%16llx-%d.sps%n", &h1, &h2, &n, &used) == 3 && used == (int)strlen(de->d_name))
            states_add(h1, h2, n);
    }
    closedir(d);
}

static void state_name(char *out, size_t cap, const score_key *k)
{
    snprintf(out, cap, "%016llx%016llx-%d.sps", (unsigned long long)k->h1, (unsigned long long)k->h2, k->n);
}

/* Writes snapshot s (its rows are in its slot's first s->n positions) to a state file. Idle only:
 * the rows are copied to the first scratch sequence, whose state alone is saved, then dropped. */
static int state_write(persist *p, engine *e, snapshot *s)
{
    score_key k;
    score_key_init(&k);
    score_key_add(&k, s->tokens, s->n);
    char name[128];
    state_name(name, sizeof name, &k);
    char path[PERSIST_PATH_CAP];
    (void)join(path, sizeof path, "%s/%s", p->states_dir, name);
    if (access(path, F_OK) == 0) {
        utimensat(AT_FDCWD, path, NULL, 0); /* written before (by this engine or another): used now */
        return 0;
    }
    llama_memory_t mem = llama_get_memory(e->ctx);
    const int scratch = e->n_slots;
    llama_memory_seq_rm(mem, scratch, -1, -1);
    llama_memory_seq_cp(mem, s->slot, scratch, 0, s->n);
    size_t size = llama_state_seq_get_size(e->ctx, scratch);
    size_t head_bytes = sizeof(state_head) + (size_t)s->n * sizeof(int32_t) + (size_t)e->n_vocab * sizeof(float);
    unsigned char *buf = malloc(head_bytes + size);
    int rc = -1;
    if (buf) {
        size_t got = llama_state_seq_get_data(e->ctx, buf + head_bytes, size, scratch);
        if (got > 0) {
            state_head sh = { s->n, e->n_vocab, got };
            memcpy(buf, &sh, sizeof sh);
            memcpy(buf + sizeof sh, s->tokens, (size_t)s->n * sizeof(int32_t));
            memcpy(buf + sizeof sh + (size_t)s->n * sizeof(int32_t), s->logits, (size_t)e->n_vocab * sizeof(float));
            file_header h = p->id;
            h.kind = PERSIST_KIND_STATE;
            h.payload_bytes = head_bytes + got;
            h.payload_sum = XXH3_64bits(buf, head_bytes + got);
            h.n_records = 1;
            header_seal(&h);
            rc = write_atomic(p, p->states_dir, name, &h, buf, head_bytes + got, NULL, 0);
            if (rc != 0) {
                write_failed(p, p->states_dir);
            } else {
                write_done(p);
                p->stats.states_written++;
                states_add(k.h1, k.h2, k.n);
            }
        }
    }
    free(buf);
    llama_memory_seq_rm(mem, scratch, -1, -1);
    return rc;
}

int persist_idle_pending(const persist *p, const engine *e)
{
    if (p->read_only || p->off)
        return 0;
    for (int i = 0; i < e->n_pins; i++)
        if (e->snaps[i].used && !e->snaps[i].on_disk)
            return 1;
    return persist_pending(p);
}

void persist_idle(persist *p, engine *e)
{
    if (!persist_idle_pending(p, e) || ensure_id(p) != 0)
        return;
    int wrote = 0;
    for (int i = 0; i < e->n_pins && !p->read_only; i++) {
        snapshot *s = &e->snaps[i];
        if (!s->used || s->on_disk)
            continue;
        s->on_disk = 1; /* tried once: a failure is not retried at every idle moment */
        if (snapshot_valid(e, s) && state_write(p, e, s) == 0)
            wrote = 1;
    }
    if (wrote && !persist_pending(p))
        evict(p);
    persist_flush(p);
}

snapshot *persist_state_restore(persist *p, engine *e, int slot, const llama_token *toks, int n, int have)
{
    if (p->off || ensure_id(p) != 0)
        return NULL;
    states_list(p);
    if (g_n_states == 0)
        return NULL;
    /* the live prefix of the slot is free: a file must go deeper */
    const slot_state *sl = &e->slots[slot];
    int live = lcp(sl->tokens, sl->n, toks, n);
    if (live > have)
        have = live;
    /* hash the prompt's prefixes once, ascending, and keep the deepest that a file has */
    int best = -1;
    score_key k;
    score_key_init(&k);
    int at = 0;
    for (;;) {
        int next = -1;
        for (int i = 0; i < g_n_states; i++)
            if (g_states[i].n > at && g_states[i].n <= n && g_states[i].n <= e->n_ctx &&
                (next < 0 || g_states[i].n < g_states[next].n))
                next = i;
        if (next < 0)
            break;
        int m = g_states[next].n;
        score_key_add(&k, toks + at, m - at);
        at = m;
        for (int i = 0; i < g_n_states; i++)
            if (g_states[i].n == m && g_states[i].h1 == k.h1 && g_states[i].h2 == k.h2 && m > have) {
                char name[128], path[PERSIST_PATH_CAP];
                state_name(name, sizeof name, &k);
                (void)join(path, sizeof path, "%s/%s", p->states_dir, name);
                if (!known_bad(path)) /* skipped once by this process: not read at every request */
                    best = i;
            }
    }
    if (best < 0)
        return NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char name[128], path[PERSIST_PATH_CAP];
    score_key bk = { g_states[best].h1, g_states[best].h2, g_states[best].n };
    state_name(name, sizeof name, &bk);
    (void)join(path, sizeof path, "%s/%s", p->states_dir, name);
    state_head sh;
    const int m = bk.n;
    snapshot *snap = NULL;
    size_t head_bytes = sizeof sh + (size_t)m * sizeof(int32_t) + (size_t)e->n_vocab * sizeof(float);
    file_header h;
    size_t len = 0;
    unsigned char *buf =
        read_checked(p, path, PERSIST_KIND_STATE, head_bytes + 65536 + (uint64_t)m * p->state_cell_max, &h, &len);
    if (!buf) {
        p->stats.states_skipped++;
        return NULL;
    }
    if (len >= sizeof sh)
        memcpy(&sh, buf, sizeof sh);
    const char *why = NULL;
    char whybuf[160];
    int bad = 1;
    if (len < head_bytes || sh.n != m || sh.n_vocab != e->n_vocab || head_bytes + sh.state_bytes != len ||
        memcmp(buf + sizeof sh, toks, (size_t)m * sizeof(int32_t)) != 0) {
        why = "its tokens are not the ones its name says";
    } else {
        /* the numbers, finite before they are served: the last position's logits, then the KV rows */
        const unsigned char *logits = buf + sizeof sh + (size_t)m * sizeof(int32_t);
        for (int v = 0; v < e->n_vocab && !why; v++)
            if (!finite32(logits + (size_t)v * sizeof(float)))
                why = "a logit of its last position is not finite";
        /* no extension bytes per cell, else llama_kv_cell_ext's 12 (M-RoPE, n-gram models) */
        for (uint64_t ext = 0; !why && ext <= 12; ext += 12) {
            bad = state_rows_check(buf + head_bytes, sh.state_bytes, ext, whybuf, sizeof whybuf);
            if (bad == 0)
                break;
            if (bad > 0 || ext == 12)
                why = whybuf;
        }
    }
    if (why) {
        file_bad(p, path, why, bad > 0);
        p->stats.states_skipped++;
        free(buf);
        return NULL;
    }
    llama_memory_t mem = llama_get_memory(e->ctx);
    llama_memory_seq_rm(mem, slot, -1, -1);
    e->slots[slot].n = 0;
    if (llama_state_seq_set_data(e->ctx, buf + head_bytes, sh.state_bytes, slot) == 0) {
        plog("%s skipped: llama.cpp refused its rows (no room in the KV cache?)", path);
        llama_memory_seq_rm(mem, slot, -1, -1);
        p->stats.states_skipped++;
        free(buf);
        return NULL;
    }
    memcpy(e->slots[slot].tokens, toks, (size_t)m * sizeof *toks);
    e->slots[slot].n = m;
    snapshot_take(e, slot, toks, m, (const float *)(buf + sizeof sh + (size_t)m * sizeof(int32_t)));
    free(buf);
    int stale = 0;
    snap = snapshot_find(e, toks, m, m, &stale);
    if (snap && snap->n == m)
        snap->on_disk = 1;
    if (!p->read_only) /* recently used, for the writer's eviction; a replica never touches the folder */
        utimensat(AT_FDCWD, path, NULL, 0);
    p->stats.states_restored++;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    plog("%s: a state of %d positions restored (%.1f MB) in %.1f ms", path, m, (double)len / 1e6,
         (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    return snap;
}
