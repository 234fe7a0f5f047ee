/* serveproto-quantize: a GGUF transcoded to F32, F16 or BF16 by llama.cpp's
 * own quantizer.
 *
 *   serveproto-quantize [--type f32|f16|bf16] [--threads N] [--tag KEY=VALUE]... IN.gguf OUT.gguf
 *
 * Calls llama_model_quantize (src/llama-quant.cpp of the vendored tree) with
 * allow_requantize and ftype LLAMA_FTYPE_ALL_F32 (the default),
 * LLAMA_FTYPE_MOSTLY_F16 or LLAMA_FTYPE_MOSTLY_BF16, so every 2-D weight is
 * dequantized by ggml's own to_float (ggml-quants.c) and written in that type
 * (F16 and BF16 round the dequantized F32 values to nearest); 1-D tensors
 * (norms) stay F32. --tag adds a string key to the output's metadata
 * (the gateway records which file it came from). Progress goes to stderr, one
 * line per tensor on a terminal (carriage return), else every quarter; exit 0
 * on success, 1 when llama.cpp refuses (its error on stderr), 2 on bad usage.
 * It writes OUT directly: the caller writes to a temporary name and renames.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llama.h"

#define MAX_TAGS 8

static int g_tty;
static int g_last_quarter = -1;
static enum ggml_log_level g_last_level = GGML_LOG_LEVEL_INFO;
static const char *g_type = "F32";

/* llama.cpp logs "[ i/ n] name - [shape], type = ..." before each tensor:
 * that line is the progress; other INFO/DEBUG lines are dropped, warnings
 * and errors pass through. */
static void on_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level == GGML_LOG_LEVEL_CONT) {
        level = g_last_level;
    } else {
        g_last_level = level;
    }
    int i, n;
    if (level == GGML_LOG_LEVEL_INFO && sscanf(text, "[%d/%d]", &i, &n) == 2 && n > 0) {
        if (g_tty) {
            fprintf(stderr, "\rserveproto-quantize: %s: %d/%d tensors", g_type, i, n);
            if (i == n) fputc('\n', stderr);
        } else {
            int quarter = 4 * i / n;
            if (quarter != g_last_quarter) {
                g_last_quarter = quarter;
                fprintf(stderr, "serveproto-quantize: %s: %d/%d tensors\n", g_type, i, n);
            }
        }
        return;
    }
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static int usage(void) {
    fprintf(stderr, "usage: serveproto-quantize [--type f32|f16|bf16] [--threads N] [--tag KEY=VALUE]... IN.gguf OUT.gguf\n");
    return 2;
}

int main(int argc, char **argv) {
    struct llama_model_kv_override tags[MAX_TAGS + 1];
    int n_tags = 0, threads = 0;
    enum llama_ftype ftype = LLAMA_FTYPE_ALL_F32;
    const char *in = NULL, *out = NULL;
    memset(tags, 0, sizeof tags);

    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--threads") == 0 && a + 1 < argc) {
            threads = atoi(argv[++a]);
            if (threads < 1) return usage();
        } else if (strcmp(argv[a], "--type") == 0 && a + 1 < argc) {
            const char *t = argv[++a];
            if (strcmp(t, "f32") == 0) {
                ftype = LLAMA_FTYPE_ALL_F32, g_type = "F32";
            } else if (strcmp(t, "f16") == 0) {
                ftype = LLAMA_FTYPE_MOSTLY_F16, g_type = "F16";
            } else if (strcmp(t, "bf16") == 0) {
                ftype = LLAMA_FTYPE_MOSTLY_BF16, g_type = "BF16";
            } else {
                fprintf(stderr, "serveproto-quantize: --type %s: not f32, f16 or bf16\n", t);
                return 2;
            }
        } else if (strcmp(argv[a], "--tag") == 0 && a + 1 < argc) {
            const char *kv = argv[++a], *eq = strchr(kv, '=');
            if (!eq || eq == kv || n_tags == MAX_TAGS) return usage();
            size_t klen = (size_t)(eq - kv), vlen = strlen(eq + 1);
            if (klen >= sizeof tags[0].key || vlen >= sizeof tags[0].val_str) {
                fprintf(stderr, "serveproto-quantize: --tag %s: key or value too long (127 bytes at most)\n", kv);
                return 2;
            }
            tags[n_tags].tag = LLAMA_KV_OVERRIDE_TYPE_STR;
            memcpy(tags[n_tags].key, kv, klen);
            memcpy(tags[n_tags].val_str, eq + 1, vlen);
            n_tags++;
        } else if (argv[a][0] == '-' && argv[a][1] != '\0') {
            return usage();
        } else if (!in) {
            in = argv[a];
        } else if (!out) {
            out = argv[a];
        } else {
            return usage();
        }
    }
    if (!in || !out) return usage();

    g_tty = isatty(STDERR_FILENO);
    llama_log_set(on_log, NULL);
    llama_backend_init();

    struct llama_model_quantize_params p = llama_model_quantize_default_params();
    p.nthread = threads;
    p.ftype = ftype;
    p.allow_requantize = true;        /* the source is quantized: dequantize it */
    p.quantize_output_tensor = true;  /* output.weight too, when the file has one */
    p.kv_overrides = n_tags ? tags : NULL;
    uint32_t rc = llama_model_quantize(in, out, &p);
    llama_backend_free();
    if (rc != 0) {
        fprintf(stderr, "serveproto-quantize: llama_model_quantize(%s -> %s) failed\n", in, out);
        return 1;
    }
    return 0;
}
