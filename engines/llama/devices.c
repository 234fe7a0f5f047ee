/* devices.c: where the model's layers go. llama.cpp's own split options (--split-mode,
 * --tensor-split, --main-gpu) passed through, and --rpc host:port,... registering
 * ggml-rpc-servers as devices (llama.cpp's RPC backend, the way common/arg.cpp's --rpc
 * does it), checked first so that a bad value or an unreachable server is a clear error
 * naming the flag instead of an abort inside ggml-rpc (spec/llama-engine.md, "Several devices"). */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine.h"
#include "ggml-backend.h"

#define RPC_CONNECT_MS 3000 /* how long the check of an --rpc server waits for its TCP handshake */

static const char *split_names[] = { "none", "layer", "row" };

/* Whether flag is one of this file's options (each takes a value). */
int devices_is_option(const char *flag)
{
    return !strcmp(flag, "--split-mode") || !strcmp(flag, "--tensor-split") || !strcmp(flag, "--main-gpu") ||
           !strcmp(flag, "--rpc");
}

/* Splits "a,b,c" into at most max entries of cap bytes each; -1 for an empty entry or too many. */
static int split_list(const char *v, char out[][DEVICES_NAME_CAP], int max)
{
    int n = 0;
    const char *p = v;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0 || len >= DEVICES_NAME_CAP || n == max)
            return -1;
        memcpy(out[n], p, len);
        out[n++][len] = '\0';
        if (!c)
            return n;
        p = c + 1;
    }
}

/* host:port as ggml-rpc reads it (the first ':' separates them, so no IPv6 literals). */
static int parse_endpoint(const char *ep, char *host, size_t cap, char *port)
{
    const char *c = strchr(ep, ':');
    if (!c || c == ep || (size_t)(c - ep) >= cap)
        return -1;
    char *end;
    errno = 0;
    long p = strtol(c + 1, &end, 10);
    if (errno || *end || end == c + 1 || p < 1 || p > 65535)
        return -1;
    memcpy(host, ep, (size_t)(c - ep));
    host[c - ep] = '\0';
    snprintf(port, 8, "%ld", p);
    return 0;
}

/* Reads one option's value into d. Returns 0, or -1 after a line on stderr naming the flag and the
 * accepted values. Only the syntax is checked here: devices and servers are checked by devices_apply. */
int devices_parse(device_options *d, const char *flag, const char *v)
{
    if (!strcmp(flag, "--split-mode")) {
        for (int i = 0; i < 3; i++)
            if (!strcmp(v, split_names[i])) {
                d->split_mode = i;
                d->split_mode_set = 1;
                return 0;
            }
        fprintf(stderr, "serveproto-llama: --split-mode must be none, layer or row, got '%s'\n", v);
        return -1;
    }
    if (!strcmp(flag, "--tensor-split")) {
        char parts[DEVICES_MAX][DEVICES_NAME_CAP];
        int n = split_list(v, parts, DEVICES_MAX);
        float sum = 0.0f;
        for (int i = 0; i < n; i++) {
            char *end;
            errno = 0;
            float x = strtof(parts[i], &end);
            if (errno || *end || end == parts[i] || !isfinite(x) || x < 0.0f) {
                n = -1;
                break;
            }
            d->tensor_split[i] = x;
            sum += x;
        }
        if (n < 0 || !(sum > 0.0f)) {
            fprintf(stderr, "serveproto-llama: --tensor-split must be a comma-separated list of at most %d "
                    "non-negative numbers, not all 0 (a share of the model per device), got '%s'\n", DEVICES_MAX, v);
            return -1;
        }
        d->n_tensor_split = n;
        return 0;
    }
    if (!strcmp(flag, "--main-gpu")) {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || *end || end == v || x < 0 || x >= DEVICES_MAX) {
            fprintf(stderr, "serveproto-llama: --main-gpu must be a device index in 0..%d, got '%s'\n",
                    DEVICES_MAX - 1, v);
            return -1;
        }
        d->main_gpu = (int)x;
        d->main_gpu_set = 1;
        return 0;
    }
    /* --rpc */
    int n = split_list(v, d->rpc, DEVICES_MAX);
    char host[DEVICES_NAME_CAP], port[8];
    for (int i = 0; i < n; i++)
        if (parse_endpoint(d->rpc[i], host, sizeof host, port) != 0) {
            n = -1;
            break;
        }
    if (n < 0) {
        fprintf(stderr, "serveproto-llama: --rpc must be a comma-separated list of at most %d host:port "
                "servers (port 1..65535), got '%s'\n", DEVICES_MAX, v);
        return -1;
    }
    d->n_rpc = n;
    return 0;
}

/* 0 once a TCP connection to ep is accepted within RPC_CONNECT_MS; else -1 with why in err. */
static int rpc_reachable(const char *ep, char *err, size_t cap)
{
    char host[DEVICES_NAME_CAP], port[8];
    parse_endpoint(ep, host, sizeof host, port); /* checked by devices_parse */
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        snprintf(err, cap, "--rpc %s: cannot resolve %s: %s", ep, host, gai_strerror(rc));
        return -1;
    }
    int why = ECONNREFUSED;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            why = errno;
            continue;
        }
        int ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS) {
            struct pollfd pfd = { .fd = fd, .events = POLLOUT };
            int soerr = 0;
            socklen_t len = sizeof soerr;
            if (poll(&pfd, 1, RPC_CONNECT_MS) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0)
                ok = soerr == 0;
            why = ok ? 0 : (soerr ? soerr : ETIMEDOUT);
        } else if (!ok) {
            why = errno;
        }
        close(fd);
        if (ok) {
            freeaddrinfo(res);
            return 0;
        }
    }
    freeaddrinfo(res);
    snprintf(err, cap, "--rpc %s: cannot connect: %s (is a ggml-rpc-server listening there?)", ep, strerror(why));
    return -1;
}

/* Whether this build has a local GPU device (CUDA...); RPC devices, also typed GPU, are not
 * registered yet when the engine asks (before devices_apply). */
/* The first local GPU (a discrete one before an integrated one), or NULL. */
static ggml_backend_dev_t local_gpu(void)
{
    ggml_backend_dev_t d = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
    return d ? d : ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_IGPU);
}

int devices_local_gpu(void)
{
    return local_gpu() != NULL;
}

const char *devices_local_gpu_name(void)
{
    ggml_backend_dev_t d = local_gpu();
    const char *name = d ? ggml_backend_dev_description(d) : NULL;
    return name ? name : "";
}

/* Registers the --rpc servers (each checked reachable first) and sets the model parameters' devices,
 * split_mode, main_gpu and tensor_split. Returns NULL, or the LOAD_FAIL kind with err naming the
 * flag: "io" for a server that cannot be resolved or reached, "unsupported" for a value that does
 * not fit the devices (more --tensor-split entries than devices, --main-gpu past the last one). */
const char *devices_apply(device_options *d, struct llama_model_params *mp, char *err, size_t cap)
{
    /* the local GPUs, before any RPC device (also typed GPU) is registered */
    int n_dev = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        enum ggml_backend_dev_type t = ggml_backend_dev_type(ggml_backend_dev_get(i));
        if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU)
            n_dev++;
    }
    if (d->n_rpc > 0) {
        ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
        typedef ggml_backend_reg_t (*add_server_fn)(const char *endpoint);
        add_server_fn add = reg ? (add_server_fn)ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server")
                                : NULL;
        if (!add) {
            snprintf(err, cap, "--rpc: this engine is built without llama.cpp's RPC backend (GGML_RPC)");
            return "unsupported";
        }
        for (int i = 0; i < d->n_rpc; i++)
            if (rpc_reachable(d->rpc[i], err, cap) != 0)
                return "io";
        /* RPC devices first, in --rpc order, then the local GPUs, as llama.cpp's default selection
         * orders them; an explicit list so that --tensor-split's entries meet known devices. */
        int n = 0;
        for (int i = 0; i < d->n_rpc; i++) {
            ggml_backend_reg_t r = add(d->rpc[i]);
            if (!r || ggml_backend_reg_dev_count(r) == 0) {
                snprintf(err, cap, "--rpc %s: the server offers no device", d->rpc[i]);
                return "unsupported";
            }
            ggml_backend_register(r);
            for (size_t j = 0; j < ggml_backend_reg_dev_count(r) && n < DEVICES_MAX; j++)
                d->devices[n++] = ggml_backend_reg_dev_get(r, j);
        }
        for (size_t i = 0; i < ggml_backend_dev_count() && n < DEVICES_MAX; i++) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
            if ((t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) &&
                strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "RPC") != 0)
                d->devices[n++] = dev;
        }
        d->devices[n] = NULL;
        n_dev = n;
        mp->devices = d->devices;
    }
    /* row splits each weight over split buffers, which only some backends have (CUDA); llama.cpp
     * refuses the load otherwise ("does not support split buffers"): said here, naming the flag */
    if (d->split_mode_set && d->split_mode == LLAMA_SPLIT_MODE_ROW)
        for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
            int used = t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU;
            if (d->n_rpc > 0) {
                used = 0;
                for (int j = 0; d->devices[j]; j++)
                    used |= d->devices[j] == dev;
            }
            if (used && !ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev),
                                                           "ggml_backend_split_buffer_type")) {
                snprintf(err, cap, "--split-mode row needs devices with split buffers (CUDA GPUs); %s has none "
                         "(use --split-mode layer)", ggml_backend_dev_name(dev));
                return "unsupported";
            }
        }
    if (d->n_tensor_split > n_dev) {
        snprintf(err, cap, "--tensor-split has %d entries but the engine has %d devices to split over%s",
                 d->n_tensor_split, n_dev, n_dev ? "" : " (a CPU build without --rpc)");
        return "unsupported";
    }
    if (d->main_gpu_set && d->main_gpu >= n_dev) {
        snprintf(err, cap, "--main-gpu %d: the engine has %d devices (0..%d)%s", d->main_gpu, n_dev, n_dev - 1,
                 n_dev ? "" : " (a CPU build without --rpc)");
        return "unsupported";
    }
    if (d->split_mode_set)
        mp->split_mode = (enum llama_split_mode)d->split_mode;
    if (d->main_gpu_set)
        mp->main_gpu = d->main_gpu;
    if (d->n_tensor_split > 0)
        mp->tensor_split = d->tensor_split; /* llama_max_devices() entries, the rest 0 */
    return NULL;
}

/* The CAPS keys of the options given (x_split_mode, x_tensor_split, x_main_gpu, x_rpc), each
 * after a space, into out; empty when none was given (or they do not fit in cap). */
void devices_caps(const device_options *d, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
#define CAPS_ADD(...) (n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, __VA_ARGS__))
    if (d->split_mode_set)
        CAPS_ADD(" x_split_mode=%s", split_names[d->split_mode]);
    if (d->n_tensor_split > 0)
        for (int i = 0; i < d->n_tensor_split; i++)
            CAPS_ADD("%s%g", i ? "," : " x_tensor_split=", (double)d->tensor_split[i]);
    if (d->main_gpu_set)
        CAPS_ADD(" x_main_gpu=%d", d->main_gpu);
    for (int i = 0; i < d->n_rpc; i++)
        CAPS_ADD("%s%s", i ? "," : " x_rpc=", d->rpc[i]);
#undef CAPS_ADD
    if (n >= cap)
        out[0] = '\0'; /* never a cut value */
}
