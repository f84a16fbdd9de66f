/* Test support for the graph layer: nodes, their ops and inputs, autocast's marks and rewrites, seeded random values.
 * Tests see nodes only through these calls, so the node struct can change without touching them. */
#include "deft_testing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autocast.h"
#include "build_conv.h"
#include "build_grad_ops.h"
#include "graph_internal.h"
#include "program_state.h"
#include "rng.h"

_Static_assert(DEFT_TESTING_AUTOCAST_NONE == DEFT_AUTOCAST_NONE && DEFT_TESTING_AUTOCAST_CAST == DEFT_AUTOCAST_CAST &&
                   DEFT_TESTING_AUTOCAST_NODE == DEFT_AUTOCAST_NODE,
               "deft_testing.h's autocast marks follow ir/autocast.h");
_Static_assert(DEFT_TESTING_CKPT_USER == DEFT_CKPT_USER && DEFT_TESTING_CKPT_RECOMPUTE == DEFT_CKPT_RECOMPUTE &&
                   DEFT_TESTING_CKPT_BACKWARD_COPY == DEFT_CKPT_BACKWARD_COPY &&
                   DEFT_TESTING_CKPT_OPTIMIZER_PART == DEFT_CKPT_OPTIMIZER_PART,
               "deft_testing.h's checkpoint roles follow ir/graph_internal.h");

/* The op named `name`; a name no op has is a broken test, not a failed check, so it stops the test at once. */
static deft_op deft_testing_op_named(const char *name) {
    for (int op = 0; name && op < DEFT_OP_COUNT; op++)
        if (strcmp(deft_op_name((deft_op)op), name) == 0) return (deft_op)op;
    fprintf(stderr, "deft_testing: no op is named \"%s\"\n", name ? name : "(null)");
    abort();
}

deft_tensor *deft_testing_node(const deft_graph *g, int id) {
    return g && id >= 0 && id < g->n_nodes ? g->nodes[id] : NULL;
}

int deft_testing_node_id(const deft_tensor *t) { return t ? t->id : -1; }

deft_graph *deft_testing_graph_of(const deft_tensor *t) { return t ? t->graph : NULL; }

const char *deft_testing_op(const deft_tensor *t) { return t ? deft_op_name(t->op) : NULL; }

int deft_testing_is_op(const deft_tensor *t, const char *op) {
    const deft_op want = deft_testing_op_named(op);
    return t && t->op == want;
}

int deft_testing_src_count(const deft_tensor *t) { return t ? t->nsrc : 0; }

deft_tensor *deft_testing_src(const deft_tensor *t, int k) { return t && k >= 0 && k < t->nsrc ? t->src[k] : NULL; }

const int64_t *deft_testing_shape(const deft_tensor *t) { return t ? t->shape : NULL; }

const char *deft_testing_act(const deft_tensor *t) {
    return t && t->op == DEFT_OP_ACT_GRAD ? deft_op_name(t->p.act) : NULL;
}

int deft_testing_matmul_transposed(const deft_tensor *mm, int operand) {
    if (!mm || mm->op != DEFT_OP_MATMUL) return 0;
    return (operand == 0 ? mm->p.matmul.trans_a : mm->p.matmul.trans_b) != 0;
}

deft_tensor *deft_testing_view_base(const deft_tensor *t) {
    return t ? t->graph->nodes[deft_view_base(t->graph, t->id, NULL)] : NULL;
}

int deft_testing_has_device_copy(const deft_tensor *t) { return t && t->dev_data != NULL; }

int deft_testing_autocast_mark(const deft_tensor *t) { return t ? t->autocast : DEFT_TESTING_AUTOCAST_NONE; }

int deft_testing_ckpt_role(const deft_tensor *t) { return t ? t->ckpt_role : DEFT_TESTING_CKPT_USER; }

deft_tensor *deft_testing_node_copy_on(const deft_tensor *t, deft_device d) {
    deft_tensor *copy = t ? malloc(sizeof *copy) : NULL;
    if (!copy) return NULL;
    *copy = *t;
    copy->device = d;
    return copy;
}

void deft_testing_node_copy_free(deft_tensor *copy) { free(copy); }

void deft_testing_keep_input_casts(deft_graph *g, int keep) {
    if (g) g->keep_input_casts = keep != 0;
}

deft_status deft_testing_autocast_get(deft_graph *g, deft_dtype dtype, int scaled, int f32_grads,
                                      deft_testing_autocast **out) {
    return deft_autocast_get(g, dtype, scaled, f32_grads, 0, out);
}

deft_tensor *deft_testing_autocast_map(const deft_testing_autocast *ac, const deft_tensor *t) {
    return ac && t && t->id < ac->n_user ? ac->map[t->id] : NULL;
}

deft_tensor *deft_testing_autocast_latest(const deft_graph *g, const deft_tensor *t) {
    return g && g->autocasts ? deft_testing_autocast_map(g->autocasts, t) : NULL;
}

deft_tensor *deft_testing_act_grad(const char *act, deft_tensor *dy, deft_tensor *x) {
    return deft_act_grad(deft_testing_op_named(act), dy, x);
}

double deft_testing_rng_uniform01(uint64_t seed, uint64_t i) { return deft_rng_uniform01(seed, i); }

double deft_testing_rng_normal(uint64_t seed, uint64_t i) { return deft_rng_normal(seed, i); }
