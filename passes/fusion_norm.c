/* Batch norm groups: a normalisation (DEFT_OP_BATCH_NORM) whose value only an add reads, whose value only a ReLU
 * reads (the end of a ResNet block: relu(bn(conv(x)) + identity)), or whose value only a ReLU reads (bn then relu),
 * runs as one kernel that stores the last member alone (ops/cuda's deft_cuda_batch_norm_epilogue). The values in
 * between never reach memory: one pass over the activations instead of three, and two launches fewer. ReLU's
 * gradient reads its output, and batch norm's gradient its input, so nothing later needs them.
 *
 * Every member's only reader is the next member, so the group's readers all come after its root; its inputs (the
 * normalisation's, and the add's other operand) are computed before the add, which runs no earlier than the
 * normalisation. The add's other operand must have the add's shape and dtype and be no view: the kernel reads it
 * element for element. */
#include <string.h>

#include "fusion_internal.h"

static const deft_tensor *deft_norm_node(const deft_fusion *f, int id) { return f->p->graph->nodes[id]; }

/* The only consumer of id (-1 when it has none, several, or is an output). */
static int deft_norm_only_reader(const deft_fusion *f, int id) {
    if (f->p->nodes[id].is_output || f->cons_start[id + 1] - f->cons_start[id] != 1) return -1;
    return f->cons[f->cons_start[id]];
}

/* Whether node id may join a group as a member after `prev`: a free step on prev's GPU, of prev's shape and dtype. */
static bool deft_norm_may_follow(const deft_fusion *f, int id, int prev) {
    if (id < 0 || !deft_is_step(f, id) || f->group_of[id] >= 0) return false;
    const deft_tensor *t = deft_norm_node(f, id), *u = deft_norm_node(f, prev);
    return t->device.type == u->device.type && t->device.index == u->device.index && t->dtype == u->dtype &&
           t->ndim == u->ndim && !memcmp(t->shape, u->shape, (size_t)t->ndim * sizeof t->shape[0]);
}

/* The operand of add node `add` other than `from`, when the kernel can read it element for element; -1 otherwise. */
static int deft_norm_residual(const deft_fusion *f, int add, int from) {
    const deft_tensor *a = deft_norm_node(f, add);
    if (a->op != DEFT_OP_ADD || a->nsrc != 2 || (a->src[0]->id == from) == (a->src[1]->id == from)) return -1;
    const deft_tensor *r = a->src[0]->id == from ? a->src[1] : a->src[0];
    if (r->is_view || r->dtype != a->dtype || r->ndim != a->ndim ||
        memcmp(r->shape, a->shape, (size_t)a->ndim * sizeof a->shape[0]))
        return -1;
    return r->id;
}

static deft_status deft_norm_group(deft_fusion *f, int bn) {
    const deft_tensor *t = deft_norm_node(f, bn);
    if (t->op != DEFT_OP_BATCH_NORM || t->device.type != DEFT_CUDA || !deft_is_step(f, bn) || f->group_of[bn] >= 0)
        return DEFT_OK;
    int next = deft_norm_only_reader(f, bn), add = -1, residual = -1, relu = -1;
    if (deft_norm_may_follow(f, next, bn) && (residual = deft_norm_residual(f, next, bn)) >= 0) {
        add = next;
        next = deft_norm_only_reader(f, add);
    }
    if (deft_norm_may_follow(f, next, add >= 0 ? add : bn) && deft_norm_node(f, next)->op == DEFT_OP_RELU)
        relu = next;
    if (add < 0 && relu < 0) return DEFT_OK;
    deft_group *g = deft_group_add(f, DEFT_GROUP_NORM);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    const int gi = (int)(g - f->p->groups);
    g->norm = bn;
    g->residual = residual;
    g->relu = relu >= 0;
    deft_group_join(f, gi, bn);
    if (add >= 0) deft_group_join(f, gi, add);
    if (relu >= 0) deft_group_join(f, gi, relu);
    return DEFT_OK;
}

deft_status deft_fuse_norm_epilogues(deft_fusion *f) {
    deft_status s = DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < f->p->n_steps; i++) s = deft_norm_group(f, f->p->steps[i]);
    return s;
}
