/* Checks of where autocast put the conv net's casts (tests/amp_conv_net.h), read from the compiled graph itself;
 * shared by test_autocast_conv.c (CPU) and cuda_test_autocast_conv.c (cuda:0). The policy (ir/autocast_image.c):
 * conv2d in L on L sources; batch norm in f32; pooling in its input's dtype. On the CPU, which has no half
 * convolution or pooling kernels, those nodes run in f32 on sources widened from L, and their result is rounded to
 * L at once. */
#ifndef DEFT_TEST_AMP_CONV_POLICY_H
#define DEFT_TEST_AMP_CONV_POLICY_H

#include <stdio.h>

#include "amp_conv_net.h"
#include "deft_testing.h"

/* Whether t is a cast of a node in dtype `from`. */
static inline int acp_widened_from(const deft_tensor *t, deft_dtype from) {
    return deft_testing_is_op(t, "cast") && deft_tensor_dtype(deft_testing_src(t, 0)) == from;
}

/* The dtype of t's input k. */
static inline deft_dtype acp_src_dtype(const deft_tensor *t, int k) {
    return deft_tensor_dtype(deft_testing_src(t, k));
}

/* The forward image nodes the program computes, and what each runs in. Returns the number of problems found. */
static inline int acp_check_image_nodes(const deft_program *p, const amp_conv_net *n, deft_dtype L, int cpu) {
    int convs = 0, bns = 0, pools = 0, bad = 0;
    for (int id = 0; id < deft_graph_node_count(n->g); id++) {
        const deft_tensor *t = deft_testing_node(n->g, id);
        if (!deft_program_schedules(p, t)) continue;
        const deft_dtype dt = deft_tensor_dtype(t);
        const int nsrc = deft_testing_src_count(t);
        if (deft_testing_is_op(t, "conv2d")) {
            convs++;
            for (int k = 0; k < nsrc; k++) {
                const deft_tensor *s = deft_testing_src(t, k);
                bad += cpu ? !(dt == DEFT_F32 && acp_widened_from(s, L)) : deft_tensor_dtype(s) != L;
            }
            bad += dt != (cpu ? DEFT_F32 : L);
        } else if (deft_testing_is_op(t, "bn_stats")) {   /* x in L, statistics in f32 */
            bad += dt != DEFT_F32 || acp_src_dtype(t, 0) != L;
        } else if (deft_testing_is_op(t, "batch_norm")) {   /* x and y in L, weight and bias in f32 */
            bns++;
            bad += dt != L || acp_src_dtype(t, 0) != L;
            for (int k = 1; k < nsrc; k++) bad += acp_src_dtype(t, k) != DEFT_F32;
        } else if (deft_testing_is_op(t, "max_pool2d") || deft_testing_is_op(t, "avg_pool2d") ||
                   deft_testing_is_op(t, "adaptive_avg_pool2d")) {
            pools++;
            bad += dt != acp_src_dtype(t, 0);
        }
        if (bad) {
            printf("  policy broken at %s (%s %s)\n", deft_tensor_name(t), deft_testing_op(t), deft_dtype_name(dt));
            return bad;
        }
    }
    CHECK_MSG(convs == 4 && bns == 1 && pools == 3, "%d convolutions, %d batch norms, %d pools", convs, bns, pools);
    return bad + (convs != 4) + (bns != 1) + (pools != 3);
}

/* The casts of the rewrite the program runs with source `src`, and the one of them into dtype `to` (NULL when none or
 * several). The program's recomputations of x's cast in the backward pass (passes/checkpoint.h) are not the rewrite's. */
static inline int acp_casts_of(const deft_program *p, const deft_tensor *src, deft_dtype to, deft_tensor **one) {
    int count = 0, into = 0;
    *one = NULL;
    const deft_graph *g = deft_testing_graph_of(src);
    for (int id = 0; id < deft_graph_node_count(g); id++) {
        deft_tensor *t = deft_testing_node(g, id);
        if (!deft_testing_is_op(t, "cast") || deft_testing_src(t, 0) != src || !deft_program_schedules(p, t)) continue;
        if (deft_testing_ckpt_role(t) == DEFT_TESTING_CKPT_RECOMPUTE) continue;
        count++;
        if (deft_tensor_dtype(t) == to) into++, *one = t;
    }
    if (into != 1) *one = NULL;
    return count;
}

/* One cast to L per conv and fc parameter (w3, read by two convolutions, included), none of batch norm's; one of x. */
static inline int acp_check_param_casts(const deft_program *p, const amp_conv_net *n, deft_dtype L,
                                        deft_tensor **casts, int *n_casts) {
    const char *low[] = {"x", "c1.weight", "c1.bias", "c2.weight", "c3.weight", "fc.weight", "fc.bias"};
    const char *none[] = {"bn2.weight", "bn2.bias", "bn2.running_mean", "bn2.running_var"};
    int bad = 0;
    *n_casts = 0;
    for (int i = 0; i < 7; i++) {
        deft_tensor *src = deft_graph_find(n->g, low[i]), *c = NULL;
        const int count = src ? acp_casts_of(p, src, L, &c) : -1;
        CHECK_MSG(count == 1 && c, "%s: %d casts (one to %s expected)", low[i], count, deft_dtype_name(L));
        bad += !(count == 1 && c);
        if (c) casts[(*n_casts)++] = c;
    }
    for (int i = 0; i < 4; i++) {
        deft_tensor *src = deft_graph_find(n->g, none[i]), *c;
        const int count = src ? acp_casts_of(p, src, L, &c) : -1;
        CHECK_MSG(count == 0, "%s: %d casts (none expected)", none[i], count);
        bad += count != 0;
    }
    return bad;
}

/* The dtype the program computes the user's node `name` in under L: that of "<name>@<L>"; on the CPU, a convolution
 * or pooling node there that runs in f32 on sources widened from L stands for L, its result cast at once to L
 * ("<name>@<L>.<L>"). 0 when there is no such node. */
static inline int acp_counterpart_dtype(const amp_conv_net *n, const char *name, deft_dtype L, int cpu,
                                        deft_dtype *dt) {
    char at[80], low[96];
    snprintf(at, sizeof at, "%s@%s", name, deft_dtype_name(L));
    snprintf(low, sizeof low, "%s.%s", at, deft_dtype_name(L));
    const deft_tensor *t = deft_graph_find(n->g, at), *c = deft_graph_find(n->g, low);
    if (!t) return 0;
    *dt = deft_tensor_dtype(t);
    const int image = deft_testing_is_op(t, "conv2d") || deft_testing_is_op(t, "max_pool2d") ||
                      deft_testing_is_op(t, "adaptive_avg_pool2d") || deft_testing_is_op(t, "avg_pool2d");
    if (cpu && image && deft_tensor_dtype(t) == DEFT_F32 && acp_widened_from(deft_testing_src(t, 0), L)) {
        if (!c || deft_testing_src(c, 0) != t) return 0;
        *dt = deft_tensor_dtype(c);
    }
    return 1;
}

/* The dtype each named node runs in: all in L, batch norm too (its x and y in L, computing in f32 with f32 weight
 * and statistics). */
static inline int acp_check_named(const amp_conv_net *n, deft_dtype L, int cpu) {
    const char *names[] = {"c1", "p1", "c2", "bn2", "p2", "c3a", "c3b", "gap", "logits"};
    const deft_dtype want[] = {L, L, L, L, L, L, L, L, L};
    int bad = 0;
    for (int i = 0; i < 9; i++) {
        deft_dtype dt = DEFT_DTYPE_COUNT;
        const int ok = acp_counterpart_dtype(n, names[i], L, cpu, &dt) && dt == want[i];
        CHECK_MSG(ok, "%s@%s runs in %s; the policy says %s", names[i], deft_dtype_name(L),
                  dt < DEFT_DTYPE_COUNT ? deft_dtype_name(dt) : "(none)", deft_dtype_name(want[i]));
        bad += !ok;
    }
    return bad;
}

#endif
