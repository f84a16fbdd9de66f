/* Checks of where autocast put the conv net's casts (tests/amp_conv_net.h), read from the compiled graph itself;
 * shared by test_autocast_conv.c (CPU) and cuda_test_autocast_conv.c (cuda:0). The policy (graph/autocast_image.c):
 * conv2d in L on L sources; batch norm in f32; pooling in its input's dtype. On the CPU, which has no half
 * convolution or pooling kernels, those nodes run in f32 on sources widened from L, and their result is rounded to
 * L at once. */
#ifndef DEFT_TEST_AMP_CONV_POLICY_H
#define DEFT_TEST_AMP_CONV_POLICY_H

#include <stdio.h>

#include "amp_conv_net.h"
#include "graph_internal.h"

/* Whether t is a cast of a node in dtype `from`. */
static inline int acp_widened_from(const deft_tensor *t, deft_dtype from) {
    return t->op == DEFT_OP_CAST && t->src[0]->dtype == from;
}

/* The forward image nodes the program computes, and what each runs in. Returns the number of problems found. */
static inline int acp_check_image_nodes(const deft_program *p, const amp_conv_net *n, deft_dtype L, int cpu) {
    int convs = 0, bns = 0, pools = 0, bad = 0;
    for (int id = 0; id < deft_graph_node_count(n->g); id++) {
        const deft_tensor *t = n->g->nodes[id];
        if (!deft_program_schedules(p, t)) continue;
        switch (t->op) {
        case DEFT_OP_CONV2D:
            convs++;
            for (int k = 0; k < t->nsrc; k++)
                bad += cpu ? !(t->dtype == DEFT_F32 && acp_widened_from(t->src[k], L)) : t->src[k]->dtype != L;
            bad += t->dtype != (cpu ? DEFT_F32 : L);
            break;
        case DEFT_OP_BN_STATS:   /* x in L, statistics in f32 */
            bad += t->dtype != DEFT_F32 || t->src[0]->dtype != L;
            break;
        case DEFT_OP_BATCH_NORM:   /* x and y in L, weight and bias in f32 */
            bns++;
            bad += t->dtype != L || t->src[0]->dtype != L;
            for (int k = 1; k < t->nsrc; k++) bad += t->src[k]->dtype != DEFT_F32;
            break;
        case DEFT_OP_MAX_POOL2D:
        case DEFT_OP_AVG_POOL2D:
        case DEFT_OP_ADAPTIVE_AVG_POOL2D:
            pools++;
            bad += t->dtype != t->src[0]->dtype;
            break;
        default: break;
        }
        if (bad) {
            printf("  policy broken at %s (%s %s)\n", t->name, deft_op_name(t->op), deft_dtype_name(t->dtype));
            return bad;
        }
    }
    CHECK_MSG(convs == 4 && bns == 1 && pools == 3, "%d convolutions, %d batch norms, %d pools", convs, bns, pools);
    return bad + (convs != 4) + (bns != 1) + (pools != 3);
}

/* The casts of the rewrite the program runs with source `src`, and the one of them into dtype `to` (NULL when none or
 * several). The program's recomputations of x's cast in the backward pass (graph/checkpoint.h) are not the rewrite's. */
static inline int acp_casts_of(const deft_program *p, const deft_tensor *src, deft_dtype to, deft_tensor **one) {
    int count = 0, into = 0;
    *one = NULL;
    for (int id = 0; id < deft_graph_node_count(src->graph); id++) {
        deft_tensor *t = src->graph->nodes[id];
        if (t->op != DEFT_OP_CAST || t->src[0] != src || !deft_program_schedules(p, t)) continue;
        if (t->ckpt_role == DEFT_CKPT_RECOMPUTE) continue;
        count++;
        if (t->dtype == to) into++, *one = t;
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
    *dt = t->dtype;
    const int image = t->op == DEFT_OP_CONV2D || t->op == DEFT_OP_MAX_POOL2D || t->op == DEFT_OP_ADAPTIVE_AVG_POOL2D ||
                      t->op == DEFT_OP_AVG_POOL2D;
    if (cpu && image && t->dtype == DEFT_F32 && acp_widened_from(t->src[0], L)) {
        if (!c || c->src[0] != t) return 0;
        *dt = c->dtype;
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
