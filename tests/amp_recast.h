/* Autocast recasts its inputs where the backward pass reads them (passes/checkpoint.h, deft_ckpt_input_casts): the
 * checks shared by test_autocast_recast.c (CPU) and cuda_test_autocast_recast.c (cuda:0), on tests/amp_net.h.
 * The reference is the same net compiled with the internal switch deft_testing_keep_input_casts, which keeps x's cast
 * for the backward pass as before; recomputing a value gives the same bits, so every loss and every parameter must
 * be bit-identical to it, under any checkpoint policy. */
#ifndef DEFT_TEST_AMP_RECAST_H
#define DEFT_TEST_AMP_RECAST_H

#include <string.h>

#include "amp_conv_net.h"
#include "amp_net.h"
#include "deft_testing.h"

#define RC_B 2048   /* large enough that dropping a hidden activation lowers the peak */
#define RC_IN 32
#define RC_HID 64
#define RC_CLS 8
#define RC_STEPS 6

/* The cast of the input x the autocast rewrite inserted (NULL when there is none). */
static inline const deft_tensor *rc_input_cast(const amp_net *n) {
    for (int id = 0; id < deft_graph_node_count(n->g); id++) {
        const deft_tensor *t = deft_testing_node(n->g, id);
        if (deft_testing_is_op(t, "cast") && deft_testing_autocast_mark(t) == DEFT_TESTING_AUTOCAST_CAST &&
            deft_testing_src(t, 0) == n->x && deft_testing_ckpt_role(t) == DEFT_TESTING_CKPT_USER)
            return t;
    }
    return NULL;
}

/* Whether p drops x's cast (and so recasts it in the backward pass). */
static inline int rc_drops_input_cast(const deft_program *p, const amp_net *n) {
    const deft_tensor *c = rc_input_cast(n);
    deft_testing_node_plan np;
    if (c) deft_testing_program_node_plan(p, c, &np);
    return c && np.dropped;
}

/* Losses of RC_STEPS steps, then fc1's and fc2's weights, appended into out (float bits). */
typedef struct rc_trace {
    float loss[RC_STEPS];
    float w1[RC_HID * RC_IN], w2[RC_HID * RC_HID];
} rc_trace;

static inline void rc_train(amp_net *n, deft_program *p, rc_trace *tr) {
    memset(tr, 0, sizeof *tr);
    for (int k = 0; k < RC_STEPS; k++) tr->loss[k] = amp_step(n, p, (uint64_t)k, 1.0f);
    CHECK_OK(deft_param_get(deft_graph_find(n->g, "fc1.weight"), tr->w1, sizeof tr->w1));
    amp_weight(n, tr->w2);
}

/* The run of the net on dev under opts with x's cast kept (the reference), into ref. */
static inline void rc_reference(deft_device dev, const deft_compile_options *opts, rc_trace *ref) {
    amp_net n;
    memset(ref, 0, sizeof *ref);
    if (!amp_build(&n, dev, RC_B, RC_IN, RC_HID, RC_CLS)) return;
    deft_testing_keep_input_casts(n.g, 1);
    deft_program *p = amp_compile(&n, opts);
    CHECK_MSG(p != NULL, "reference compile: %s", deft_errmsg());
    if (p) {
        if (opts->checkpoint == DEFT_CHECKPOINT_NONE) CHECK(!rc_drops_input_cast(p, &n));
        rc_train(&n, p, ref);
    }
    amp_free(&n);
}

/* Compiles the net under opts (x's cast recast), checks it drops x's cast and trains bit-identically to ref;
 * returns the program's checkpoint report in *r. what names the case in messages. */
static inline void rc_check_same(deft_device dev, const deft_compile_options *opts, const rc_trace *ref,
                                 const char *what, deft_checkpoint_report *r) {
    amp_net n;
    memset(r, 0, sizeof *r);
    if (!amp_build(&n, dev, RC_B, RC_IN, RC_HID, RC_CLS)) return;
    deft_program *p = amp_compile(&n, opts);
    CHECK_MSG(p != NULL, "%s: compile: %s", what, deft_errmsg());
    if (p) {
        CHECK_MSG(rc_drops_input_cast(p, &n), "%s: x's cast is kept for the backward pass", what);
        CHECK_OK(deft_program_checkpoint(p, r));
        rc_trace got;
        rc_train(&n, p, &got);
        for (int k = 0; k < RC_STEPS; k++)
            CHECK_MSG(memcmp(&got.loss[k], &ref->loss[k], sizeof(float)) == 0, "%s: step %d loss %.9g, kept %.9g",
                      what, k, got.loss[k], ref->loss[k]);
        CHECK_MSG(memcmp(got.w1, ref->w1, sizeof got.w1) == 0, "%s: fc1.weight differs from the run keeping x's cast",
                  what);
        CHECK_MSG(memcmp(got.w2, ref->w2, sizeof got.w2) == 0, "%s: fc2.weight differs from the run keeping x's cast",
                  what);
        CHECK_MSG(isfinite(got.loss[RC_STEPS - 1]) && got.loss[RC_STEPS - 1] < got.loss[0],
                  "%s: the loss did not fall (%.6g -> %.6g)", what, got.loss[0], got.loss[RC_STEPS - 1]);
    }
    amp_free(&n);
}

/* Under dt (bf16, or f16 with loss scaling, whose step copy must still unscale) without a policy: the same bits as
 * keeping the cast, and the report counts one value dropped, the batch in dt, and one recomputation. */
static inline void rc_check_no_policy(deft_device dev, deft_dtype dt) {
    const deft_compile_options o = {.autocast = dt};
    rc_trace ref;
    rc_reference(dev, &o, &ref);
    deft_checkpoint_report r;
    char what[64];
    snprintf(what, sizeof what, "%s, no checkpoint policy", deft_dtype_name(dt));
    rc_check_same(dev, &o, &ref, what, &r);
    CHECK_MSG(r.policy == DEFT_CHECKPOINT_NONE && r.dropped == 1 && r.recomputed == 1 &&
                  r.dropped_bytes == (size_t)RC_B * RC_IN * 2 && r.recompute_bytes > 0,
              "%s: policy %d, %d dropped (%zu bytes), %d recomputed (%g bytes moved)", what, r.policy, r.dropped,
              r.dropped_bytes, r.recomputed, r.recompute_bytes);
    CHECK_MSG(r.peak_bytes <= r.peak_bytes_without, "%s: peak %zu bytes, %zu keeping x's cast", what, r.peak_bytes,
              r.peak_bytes_without);
}

/* The conv net (tests/amp_conv_net.h) under bf16 in `layout`, recasting x and keeping its cast: 4 losses bit-identical,
 * and the program recasting drops the cast the first convolution reads (on the CPU the f32 copy widened from x's
 * bf16 cast, recomputed from x through both casts). Returns the number of nodes recomputed. */
static inline int rc_check_conv(deft_device dev, deft_layout layout) {
    /* On the CPU the convolutions read f32 widenings of bf16 values, which the cheap recomputations would drop too. */
    const deft_compile_options o = {.autocast = DEFT_BF16, .no_cheap_recompute = 1};
    float loss[2][4];
    int recomputed = 0;
    for (int keep = 0; keep < 2; keep++) {
        amp_conv_net n;
        if (!acn_build(&n, dev, 8, layout)) return 0;
        deft_testing_keep_input_casts(n.g, keep);
        deft_program *p = acn_compile(&n, &o);
        CHECK_MSG(p != NULL, "conv net compile: %s", deft_errmsg());
        for (int k = 0; k < 4; k++) loss[keep][k] = p ? acn_step(&n, p, (uint64_t)k) : NAN;
        deft_checkpoint_report r = {0};
        if (p) CHECK_OK(deft_program_checkpoint(p, &r));
        if (!keep) CHECK_MSG(r.dropped == 1, "conv net: %d casts of x dropped", r.dropped);
        if (!keep) recomputed = r.recomputed;
        else CHECK_MSG(r.dropped == 0, "conv net keeping x's cast: %d dropped", r.dropped);
        acn_free(&n);
    }
    CHECK_MSG(memcmp(loss[0], loss[1], sizeof loss[0]) == 0, "conv net (%s): losses %.9g %.9g %.9g %.9g recasting x, "
              "%.9g %.9g %.9g %.9g keeping its cast", layout == DEFT_NHWC ? "NHWC" : "NCHW", loss[0][0], loss[0][1],
              loss[0][2], loss[0][3], loss[1][0], loss[1][1], loss[1][2], loss[1][3]);
    return recomputed;
}

#endif
