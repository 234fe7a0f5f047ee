/* stack.h: the engine's main thread leaves its stack on stderr when the
 * gateway sends SIGUSR2 (spec/serve-protocol.md, CAPS key x_stack), so a
 * stall the gateway is about to kill names the call it was stuck in.
 *
 * The block written (fd 2, each line whole, nothing else interleaved by this
 * module):
 *   <name>: stack at a stall (SIGUSR2), thread main:
 *   <one line per frame, glibc's backtrace_symbols_fd format:
 *    binary(function+0xoff)[0xaddr], innermost first; a static function shows as
 *    binary(+0xoff), which `addr2line -f -e binary 0xoff` names>
 *   <name>: end of stack
 * The handler then returns: the engine goes on where it was (an interrupted
 * poll/read returns EINTR, which the frame loop takes as "nothing read";
 * other calls restart, SA_RESTART).
 */
#ifndef SERVEPROTO_STACK_H
#define SERVEPROTO_STACK_H

#include <signal.h>

/* The signal, and the CAPS pair an engine that called sp_stack_install
 * advertises (the gateway sends the signal only then: without the handler
 * its default action would kill the engine). */
#define SP_STACK_SIGNAL SIGUSR2
#define SP_STACK_CAPS   "x_stack=SIGUSR2"

/* Installs the handler; the calling thread is the one whose stack is
 * written (call it from main, before any other thread starts). name prefixes
 * the two framing lines (kept, not copied: a string literal). Returns 0, or
 * -1 (errno set) when sigaction fails. */
int sp_stack_install(const char *name);

#endif
