/* sparrow.c: serveproto-sparrow, the decision engine of sparrow-decider's
 * static-embedding models (spec/sparrow-engine.md). It loads the .spdm file
 * (model.c), says CAPS chat=0 decide=1 decide_record=raw x_decide_json=sent,
 * and answers each DECIDE with one DECISION: the package's Decider.ask
 * probabilities per option in the record's order, with the logits and the
 * temperature. A decision takes well under a millisecond, so requests are
 * answered one at a time as they arrive; PING is answered between them, and
 * a CANCEL finds nothing in flight.
 *
 *   serveproto-sparrow --model PATH.spdm [--slots N]
 *   serveproto-sparrow --model PATH.spdm --tokenize   (stdin's text -> its token ids, for tests)
 */
#include "decide_record.h"
#include "frame.h"
#include "loop.h"
#include "stack.h"
#include "model.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SLOTS 64

static spm_model M;
static sp_writer W;
static int n_slots = 1;

/* The package's NOUL_DEFAULT: a noul side the caller did not describe. */
static const char *const noul_default[2] = {"the statement does not hold for this state",
                                            "the statement holds for this state"};

static void check(int rc)
{
    if (rc < 0 || W.failed) {
        fprintf(stderr, "serveproto-sparrow: stdout is gone; exiting\n");
        exit(1);
    }
}

/* _content() of a record text: a JSON value (state_type object / array, an option with json) is
 * re-indented as json.dumps(indent=2) only where lines matter (the state of a kv model); the token
 * sequence of the compact text is the same. Strings are stripped. */
static int answer(const decide_rec *r, decide_buf *b, uint64_t *input_tokens, char *err)
{
    const char *st = r->state->str;
    size_t st_len = r->state->len;
    char *indented = NULL;
    int json = 0;
    static const char *const json_types[] = {"object", "array", NULL};
    for (const char *const *t = json_types; *t; t++)
        json |= r->state_type->len == strlen(*t) && memcmp(r->state_type->str, *t, r->state_type->len) == 0;
    if (r->state_type->len == 4 && memcmp(r->state_type->str, "null", 4) == 0)
        st_len = 0;
    if (json && M.kv) {
        indented = spm_indent2(st, st_len, &st_len);
        if (!indented) {
            snprintf(err, DECIDE_ERR_MAX, "out of memory");
            return -2;
        }
        st = indented;
    } else {
        spm_strip(&M, &st, &st_len);
    }
    spm_state state;
    if (spm_state_read(&M, st, st_len, &state) < 0) {
        spm_state_free(&state);
        free(indented);
        snprintf(err, DECIDE_ERR_MAX, "out of memory");
        return -2;
    }
    uint64_t tokens_all = state.tokens;
    decide_buf_add(b, "{\"answers\":[", 12);
    int rc = 0;
    for (size_t i = 0; i < r->n && rc == 0; i++) {
        const decide_question *q = &r->q[i];
        size_t K = q->options->n;
        spm_option opts[DECIDE_MAX_OPTIONS];
        for (size_t o = 0; o < K; o++) {
            const spj_value *opt = &q->options->items[o];
            const spj_value *label = spj_get(opt, "label"), *text = spj_get(opt, "text");
            opts[o].label = label->str, opts[o].label_len = label->len;
            if (!text && q->kind == DECIDE_NOUL) { /* a side not described: the package's default */
                opts[o].text = noul_default[o], opts[o].text_len = strlen(noul_default[o]);
            } else if (text && text->type == SPJ_STRING) {
                opts[o].text = text->str, opts[o].text_len = text->len;
                spm_strip(&M, &opts[o].text, &opts[o].text_len);
            } else {
                opts[o].text = "", opts[o].text_len = 0;
            }
        }
        const char *instr = "";
        size_t instr_len = 0;
        if (q->instructions->type == SPJ_STRING) {
            instr = q->instructions->str, instr_len = q->instructions->len;
            spm_strip(&M, &instr, &instr_len);
        }
        float logits[DECIDE_MAX_OPTIONS], probs[DECIDE_MAX_OPTIONS];
        uint64_t tokens = 0;
        if (spm_question(&M, &state, q->kind, instr, instr_len, opts, K, logits, probs, &tokens) < 0) {
            snprintf(err, DECIDE_ERR_MAX, "out of memory");
            rc = -2;
            break;
        }
        tokens_all += tokens;
        decide_buf_add(b, i ? ",{\"id\":" : "{\"id\":", i ? 7 : 6);
        decide_buf_json_str(b, q->id->str, q->id->len);
        decide_buf_add(b, ",\"logits\":[", 11);
        for (size_t o = 0; o < K; o++)
            decide_buf_printf(b, "%s%.9g", o ? "," : "", (double)logits[o]);
        decide_buf_add(b, "],\"probs\":[", 11);
        for (size_t o = 0; o < K; o++)
            decide_buf_printf(b, "%s%.9g", o ? "," : "", (double)probs[o]);
        decide_buf_add(b, "],\"temperature\":", 16);
        decide_buf_num(b, M.temperature[q->kind]);
        decide_buf_printf(b, ",\"tokens\":%llu,\"state_tokens\":%llu,\"state_dropped\":%llu}",
                          (unsigned long long)(tokens + state.tokens), (unsigned long long)state.tokens,
                          (unsigned long long)state.dropped);
    }
    spm_state_free(&state);
    free(indented);
    *input_tokens = tokens_all;
    return rc;
}

static void on_decide(const sp_request *rq)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t id = rq->id;
    if (rq->slot >= (uint64_t)n_slots) {
        check(sp_write_error(&W, id, "BAD_REQUEST", "slot %llu out of range (slots=%d)",
                             (unsigned long long)rq->slot, n_slots));
        return;
    }
    decide_rec rec;
    char err[DECIDE_ERR_MAX];
    if (decide_record_check(rq->payload, rq->payload_len, 1, &rec, err) < 0) {
        check(sp_write_error(&W, id, "DECIDE_INVALID", "%s", err));
        return;
    }
    decide_buf b = {0};
    uint64_t tokens = 0;
    int rc = answer(&rec, &b, &tokens, err);
    decide_record_free(&rec);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    decide_buf_printf(&b, "],\"input_tokens\":%llu,\"engine_ms\":%.3f}", (unsigned long long)tokens, ms);
    if (rc < 0 || b.oom) {
        free(b.p);
        check(sp_write_error(&W, id, "DECIDE_FAILED", "%s", rc < 0 ? err : "out of memory"));
        return;
    }
    check(sp_write_accept(&W, id, tokens));
    check(sp_write_decision(&W, id, b.p, b.len));
    sp_done d = {.prompt_tokens = tokens};
    check(sp_write_done(&W, id, &d));
    free(b.p);
}

/* A work request: DECIDE is answered, SUBMIT, SCORE and IMAGE refused (STOP, CANCEL, PING: the loop's). */
static void on_request(void *eng, sp_request *rq)
{
    (void)eng;
    if (rq->kind == SP_DECIDE)
        on_decide(rq);
    else if (rq->kind == SP_SUBMIT || rq->kind == SP_SCORE)
        check(sp_write_error(&W, rq->id, "NOT_SUPPORTED", "this engine only decides (chat=0)"));
    else if (rq->kind == SP_IMAGE)
        check(sp_write_error(&W, rq->id, "NOT_SUPPORTED", "no vision tower (vision=0)"));
}

/* Nothing is ever in flight between frames: every DECIDE is answered before the next frame is read. */
static void *find_none(void *eng, uint64_t id)
{
    (void)eng, (void)id;
    return NULL;
}

static void no_stop(void *eng, void *task)
{
    (void)eng, (void)task;
}

static void no_cancel(void *eng, void *task, uint64_t id)
{
    (void)eng, (void)task, (void)id;
}

static int none_active(void *eng)
{
    (void)eng;
    return 0;
}

static const sp_loop_ops loop_ops = {
    .request = on_request,
    .find = find_none,
    .stop = no_stop,
    .cancel = no_cancel,
    .active = none_active,
    .not_found = {"no request ", " in flight"},
    .name = "serveproto-sparrow",
};

static int tokenize_stdin(void)
{
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    size_t n;
    while (text && (n = fread(text + len, 1, cap - len, stdin)) > 0) {
        len += n;
        if (len == cap) {
            char *grown = realloc(text, cap *= 2);
            if (!grown)
                free(text);
            text = grown;
        }
    }
    int32_t *ids = malloc((size_t)M.max_len * sizeof *ids);
    long k = text && ids ? spm_encode(&M, text, len, ids, NULL) : -1;
    for (long i = 0; i < k; i++)
        printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(text);
    free(ids);
    return k < 0;
}

static void usage_exit(const char *why)
{
    fprintf(stderr, "serveproto-sparrow: %s\nusage: serveproto-sparrow --model PATH.spdm [--slots N] [--tokenize]\n",
            why);
    exit(2);
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    int tokenize = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--slots") && i + 1 < argc) {
            n_slots = atoi(argv[++i]);
            if (n_slots < 1 || n_slots > MAX_SLOTS)
                usage_exit("--slots: 1 to 64");
        } else if (!strcmp(argv[i], "--tokenize"))
            tokenize = 1;
        else
            usage_exit(argv[i]);
    }
    if (!model)
        usage_exit("--model is required");
    signal(SIGPIPE, SIG_IGN);
    if (sp_stack_install("serveproto-sparrow") < 0) {
        perror("serveproto-sparrow: sigaction");
        return 1;
    }
    if (sp_writer_init(&W, 1) < 0)
        return 1;
    const char *kind = "format";
    char detail[512];
    if (spm_load(&M, model, &kind, detail, sizeof detail) < 0) {
        fprintf(stderr, "serveproto-sparrow: %s\n", detail);
        sp_write_load_fail(&W, kind, detail);
        return 1;
    }
    if (tokenize) {
        int rc = tokenize_stdin();
        spm_free(&M);
        return rc;
    }
    char caps[512];
    snprintf(caps, sizeof caps, "chat=0 decide=1 decide_record=raw x_decide_json=sent slots=%d model=%s x_health=1 " SP_STACK_CAPS,
             n_slots, M.name);
    static const double stat[4] = {0, 0, 0, 0};
    check(sp_write_ready(&W));
    check(sp_write_caps(&W, caps));
    check(sp_write_stat(&W, stat, 4));
    sp_loop in;
    if (sp_loop_init(&in, SP_EXT_HEALTH, &W, &loop_ops, NULL) < 0)
        return 1;
    while (!in.eof) {
        sp_loop_wait(&in, -1);
        check(W.failed ? -1 : 0);
    }
    sp_loop_free(&in);
    sp_writer_free(&W);
    spm_free(&M);
    return 0;
}
