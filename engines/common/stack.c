/* stack.c: SIGUSR2 writes the main thread's stack to stderr (stack.h).
 *
 * Async-signal-safety: write, pthread_self, pthread_equal and pthread_kill are
 * on POSIX's list; glibc's backtrace is not, for one reason: its first call
 * dlopens libgcc_s (malloc, locks). sp_stack_install calls it once, so the
 * handler's calls only walk the unwind tables (the trick backtrace(3) itself
 * documents). backtrace_symbols_fd writes to the fd without malloc, unlike
 * backtrace_symbols. */
#include "stack.h"

#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define STACK_MAX_FRAMES 128

static const char *g_name = "engine";
static pthread_t g_main;
static volatile sig_atomic_t g_busy; /* a block is being written: a second signal is dropped */

static void write_all(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0)
            return; /* EINTR included: a stderr that fails drops the block, never blocks the engine */
        s += w;
        n -= (size_t)w;
    }
}

static void write_line(const char *a, const char *b)
{
    char line[256];
    size_t na = strlen(a), nb = strlen(b);
    if (na + nb + 1 > sizeof line)
        na = sizeof line - nb - 1;
    memcpy(line, a, na);
    memcpy(line + na, b, nb);
    line[na + nb] = '\n';
    write_all(line, na + nb + 1);
}

static void on_signal(int sig)
{
    (void)sig;
    int saved = errno; /* the interrupted code may be about to read it */
    if (!pthread_equal(pthread_self(), g_main)) {
        /* the kernel gave it to another thread (an OpenMP worker, a CUDA
         * thread): the stack wanted is the main thread's */
        pthread_kill(g_main, SP_STACK_SIGNAL);
        errno = saved;
        return;
    }
    if (g_busy) {
        errno = saved;
        return;
    }
    g_busy = 1;
    void *frames[STACK_MAX_FRAMES];
    int n = backtrace(frames, STACK_MAX_FRAMES);
    write_line(g_name, ": stack at a stall (SIGUSR2), thread main:");
    backtrace_symbols_fd(frames, n, 2);
    write_line(g_name, ": end of stack");
    g_busy = 0;
    errno = saved;
}

int sp_stack_install(const char *name)
{
    g_name = name;
    g_main = pthread_self();
    void *preload[1];
    backtrace(preload, 1); /* loads libgcc_s now, not in the handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(SP_STACK_SIGNAL, &sa, NULL);
}
