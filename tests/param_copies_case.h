/* The compile option param_copies on one device (tests/test_param_copies.c on the CPU, cuda_test_param_copies.c on
 * cuda:0): tests/amp_net.h's MLP trained under autocast reading its optimizer's persistent low-precision copies of the
 * weights, against the same net casting them every step. */
#ifndef DEFT_TEST_PARAM_COPIES_CASE_H
#define DEFT_TEST_PARAM_COPIES_CASE_H

#include <string.h>

#include "amp_net.h"
#include "deft_testing.h"

#define PC_B 64
#define PC_IN 32
#define PC_HID 64
#define PC_CLS 8
#define PC_STEPS 6

/* The net's parameters, each read with deft_param_get, back to back into out (at most cap floats); the count. */
static inline int64_t pc_params(amp_net *n, float *out, int64_t cap) {
    int64_t at = 0;
    for (int i = 0; i < deft_testing_optimizer_param_count(n->opt); i++) {
        deft_tensor *t = deft_testing_optimizer_param(n->opt, i);
        const int64_t k = deft_tensor_numel(t);
        if (at + k > cap) return -1;
        CHECK_OK(deft_param_get(t, out + at, (size_t)k * sizeof *out));
        at += k;
    }
    return at;
}

/* fc2's weight set to w * gain, elementwise, between steps (deft_param_set). */
static inline void pc_rescale_w2(amp_net *n, float gain) {
    const size_t k = (size_t)(n->hidden * n->hidden);
    float *w = malloc(k * sizeof *w);
    if (!w) return;
    amp_weight(n, w);
    for (size_t i = 0; i < k; i++) w[i] *= gain;
    CHECK_OK(deft_param_set(n->w2, w, k * sizeof *w));
    free(w);
}

/* Nodes of op `op` that p needs, and of those how many ran at least once (*ran, may be NULL). */
static inline int pc_count_op(const deft_program *p, const deft_graph *g, const char *op, int *ran) {
    int k = 0;
    if (ran) *ran = 0;
    for (int id = 0; id < deft_graph_node_count(g); id++) {
        const deft_tensor *t = deft_testing_node(g, id);
        if (!deft_testing_is_op(t, op) || !deft_program_schedules(p, t)) continue;
        k++;
        if (ran && deft_program_node_runs(p, t) > 0) ++*ran;
    }
    return k;
}

/* Two nets from one seed, one compiled with `o`, the other with `o` and param_copies: PC_STEPS steps each, fc2's weight
 * rescaled between steps 3 and 4 on both; every loss and, at the end, every parameter bit for bit the same. */
static inline void pc_same_as_casts(deft_device dev, amp_optim opt, deft_compile_options o, const char *what) {
    amp_net a, b;
    if (!amp_build_with(&a, dev, PC_B, PC_IN, PC_HID, PC_CLS, opt)) return;
    if (!amp_build_with(&b, dev, PC_B, PC_IN, PC_HID, PC_CLS, opt)) {
        amp_free(&a);
        return;
    }
    deft_compile_options oc = o;
    oc.param_copies = 1;
    deft_program *pa = amp_compile(&a, &o), *pb = amp_compile(&b, &oc);
    CHECK_MSG(pa && pb, "%s: compile: %s", what, deft_errmsg());
    int same = pa && pb;
    for (int k = 0; same && k < PC_STEPS; k++) {
        if (k == 3) {
            pc_rescale_w2(&a, 0.5f);
            pc_rescale_w2(&b, 0.5f);
        }
        const float la = amp_step(&a, pa, (uint64_t)k, 1.0f), lb = amp_step(&b, pb, (uint64_t)k, 1.0f);
        same = memcmp(&la, &lb, sizeof la) == 0 && la == la;
        CHECK_MSG(same, "%s: step %d: loss %.9g with casts, %.9g with copies", what, k, la, lb);
    }
    enum { CAP = 16384 };
    float *va = malloc(CAP * sizeof *va), *vb = malloc(CAP * sizeof *vb);
    const int64_t na = same && va && vb ? pc_params(&a, va, CAP) : -1, nb = na > 0 ? pc_params(&b, vb, CAP) : -1;
    if (same) CHECK_MSG(na > 0 && na == nb && memcmp(va, vb, (size_t)na * sizeof *va) == 0,
                        "%s: the parameters differ after %d steps", what, PC_STEPS);
    /* The copies replace every weight's cast: the program casts fewer values and reads the copies it computes not. */
    if (pa && pb) {
        int computed = 0;
        const int casts_a = pc_count_op(pa, a.g, "cast", NULL), casts_b = pc_count_op(pb, b.g, "cast", NULL);
        const int copies = pc_count_op(pb, b.g, "param_copy", &computed);
        CHECK_MSG(copies >= 3 && casts_b <= casts_a - copies, "%s: %d copies read, %d casts computed (%d without)",
                  what, copies, casts_b, casts_a);
        CHECK_MSG(computed == 0 && pc_count_op(pa, a.g, "param_copy", NULL) == 0, "%s: %d copies computed", what,
                  computed);
        deft_memory_report ra, rb;
        CHECK_OK(deft_program_memory(pa, &ra));
        CHECK_OK(deft_program_memory(pb, &rb));
        const size_t low = deft_dtype_size(o.autocast);
        CHECK_MSG(rb.persistent_bytes >= ra.persistent_bytes + (size_t)copies * low,
                  "%s: persistent bytes %zu with copies, %zu without", what, rb.persistent_bytes,
                  ra.persistent_bytes);
    }
    printf("%s: %d steps bit for bit the same\n", what, PC_STEPS);
    free(va);
    free(vb);
    deft_program_free(pa);
    deft_program_free(pb);
    amp_free(&a);
    amp_free(&b);
}

/* Refusals: without autocast, a value other than 0 and 1, and a program of the other low precision once the copies
 * exist in one; each leaves the graph able to compile and run as before. */
static inline void pc_refusals(deft_device dev) {
    amp_net n;
    if (!amp_build_with(&n, dev, PC_B, PC_IN, PC_HID, PC_CLS, (amp_optim){1, NULL})) return;
    CHECK_NULL_ERR(amp_compile(&n, &(deft_compile_options){.param_copies = 1}),
                   "param_copies keeps the parameters' low-precision copies of autocast");
    CHECK_NULL_ERR(amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16, .param_copies = 2}),
                   "param_copies must be 0 or 1, got 2");
    deft_program *p = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16, .param_copies = 1});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    const float before = p ? amp_step(&n, p, 0, 1.0f) : NAN;
    CHECK_NULL_ERR(amp_compile(&n, &(deft_compile_options){.autocast = DEFT_F16, .loss_scale.disable = 1,
                                                          .param_copies = 1}),
                   "keeps bf16 copies of its parameters for another program");
    /* The refused compile left the bf16 program and its copies as they were: it trains on. */
    const float after = p ? amp_step(&n, p, 0, 1.0f) : NAN;
    CHECK_MSG(after < before, "the loss of batch 0: %g, then %g", before, after);
    deft_program_free(p);
    amp_free(&n);
}

/* The copies are made by the first program that steps or reads the optimizer: while a program compiled without
 * them steps it (whose captured step would write none), a program reading them is refused; once that one is freed,
 * it compiles and trains as the casting program did. */
static inline void pc_order(deft_device dev) {
    amp_net n;
    if (!amp_build_with(&n, dev, PC_B, PC_IN, PC_HID, PC_CLS, (amp_optim){1, NULL})) return;
    deft_program *casts = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16});
    CHECK_MSG(casts != NULL, "compile: %s", deft_errmsg());
    const float first = casts ? amp_step(&n, casts, 0, 1.0f) : NAN;
    CHECK_NULL_ERR(amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16, .param_copies = 1}),
                   "whose optimizer a live program compiled without param_copies steps");
    deft_program_free(casts);
    deft_program *copies = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16, .param_copies = 1});
    CHECK_MSG(copies != NULL, "compile after the casting program was freed: %s", deft_errmsg());
    const float second = copies ? amp_step(&n, copies, 0, 1.0f) : NAN;
    CHECK_MSG(second < first, "the loss of batch 0: %g, then %g", first, second);
    /* The other order is fine: a program compiled after the copies exist writes them in its step. */
    deft_program *later = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16});
    CHECK_MSG(later != NULL, "a casting program after the copies: %s", deft_errmsg());
    deft_program_free(later);
    deft_program_free(copies);
    amp_free(&n);
}

/* A compile that makes the copies and then fails (the arena past a memory limit) gives them back: the allocator holds
 * what it held before, and without the limit the same program compiles and trains. On the CPU's allocator: the
 * batch is large enough that the arena needs a segment of its own, beyond the limit, while the copies fit below it. */
static inline void pc_failed_compile(deft_device dev) {
    enum { BIG = 65536 };
    amp_net n;
    if (!amp_build_with(&n, dev, BIG, PC_IN, PC_HID, PC_CLS, (amp_optim){1, NULL})) return;
    deft_program *fwd = deft_compile(n.g, &n.loss, 1, NULL);   /* gives the optimizer its storage */
    CHECK_MSG(fwd != NULL, "compile the loss: %s", deft_errmsg());
    deft_program_free(fwd);
    const deft_compile_options o = {.autocast = DEFT_BF16, .param_copies = 1};
    deft_memory_stats before, after;
    CHECK_OK(deft_memory_empty_cache(dev));   /* the loss program's arena, cached, would hold the new one */
    CHECK_OK(deft_memory_stats_get(dev, &before));
    CHECK_OK(deft_memory_set_limit(dev, (size_t)before.reserved_bytes.current + ((size_t)24 << 20)));
    deft_program *bad = amp_compile(&n, &o);
    CHECK_MSG(bad == NULL && strstr(deft_errmsg(), "arena") != NULL, "under the limit: %s",
              bad ? "compiled" : deft_errmsg());
    deft_program_free(bad);
    CHECK_OK(deft_memory_set_limit(dev, 0));
    CHECK_OK(deft_memory_stats_get(dev, &after));
    CHECK_MSG(after.allocated_bytes.current == before.allocated_bytes.current,
              "a failed compile left %lld bytes allocated (%lld before)", (long long)after.allocated_bytes.current,
              (long long)before.allocated_bytes.current);
    deft_program *p = amp_compile(&n, &o);
    CHECK_MSG(p != NULL, "compile without the limit: %s", deft_errmsg());
    const float first = p ? amp_step(&n, p, 0, 1.0f) : NAN, second = p ? amp_step(&n, p, 0, 1.0f) : NAN;
    CHECK_MSG(second < first, "the loss of batch 0: %g, then %g", first, second);
    deft_program_free(p);
    amp_free(&n);
}

static inline void pc_suite(deft_device dev) {
    const deft_step_options clip = {.accumulate_steps = 1, .max_grad_norm = 0.5};
    const deft_step_options accum = {.accumulate_steps = 2, .max_grad_norm = 0.0};
    const deft_compile_options bf16 = {.autocast = DEFT_BF16};
    pc_same_as_casts(dev, (amp_optim){0, NULL}, bf16, "bf16 sgd momentum");
    pc_same_as_casts(dev, (amp_optim){1, NULL}, bf16, "bf16 adamw");
    pc_same_as_casts(dev, (amp_optim){1, &clip}, bf16, "bf16 adamw, clipped");
    pc_same_as_casts(dev, (amp_optim){0, &accum}, bf16, "bf16 sgd, 2 micro-batches");
    pc_same_as_casts(dev, (amp_optim){1, NULL}, (deft_compile_options){.autocast = DEFT_BF16, .optimizer_in_backward = 1},
                     "bf16 adamw, optimizer in backward");
    pc_same_as_casts(dev, (amp_optim){1, &clip}, (deft_compile_options){.autocast = DEFT_F16},
                     "f16 adamw, clipped, loss scaling");
    pc_refusals(dev);
    pc_order(dev);
    if (dev.type == DEFT_CPU) pc_failed_compile(dev);
}

#endif
