/* Groups of casts of parameters and constants: autocast casts each f32 master weight to bf16 or f16 once a step,
 * a couple of dozen small launches on ResNet-18, each mostly launch latency rather than copying (bench/RESULTS.md,
 * "Fifth round").
 * Their inputs exist before any step runs, so all the casts of one device and one dtype pair run as one launch
 * (ops/cuda's deft_cuda_casts_run) at the first one's step: every reader of any of them comes after it. Their values
 * then all live from that step on; each is read again in the backward pass (a weight's input gradient), so the
 * peak, at the end of the forward pass, holds them all either way. Recomputed casts (activation checkpointing) are
 * left where the rewrite put them: running them early would keep alive what it chose to drop. */
#include <stdlib.h>

#include "fusion_internal.h"
#include "optimizer.h"
#include "fused.h"
#include "cuda_kernels.h"

_Static_assert(DEFT_CASTS_MAX <= DEFT_FUSED_MAX_OPS, "a group's members array holds DEFT_FUSED_MAX_OPS");

static bool deft_is_leaf_cast(const deft_fusion *f, int id) {
    const deft_tensor *t = f->p->graph->nodes[id];
    if (t->op != DEFT_OP_CAST || t->device.type != DEFT_CUDA || !deft_is_step(f, id) || f->group_of[id] >= 0 ||
        t->ckpt_role == DEFT_CKPT_RECOMPUTE)
        return false;
    const deft_tensor *src = t->src[0];
    return (src->op == DEFT_OP_PARAM || src->op == DEFT_OP_CONSTANT) && !src->is_view && src->dtype != t->dtype &&
           src->device.type == t->device.type && src->device.index == t->device.index;
}

static bool deft_same_casts(const deft_tensor *a, const deft_tensor *b) {
    return a->dtype == b->dtype && a->src[0]->dtype == b->src[0]->dtype && a->device.index == b->device.index;
}

/* Notes in last_write the leaves that step i (node t) writes: an optimizer's parameters, batch norm's running
 * statistics. Another op that writes state marks every leaf. */
static void deft_note_writes(const deft_fusion *f, const deft_tensor *t, int i, int *last_write) {
    if (!deft_op_updates_state(t->op)) return;
    if (t->op == DEFT_OP_OPTIMIZER && t->p.optimizer) {
        for (int k = 0; k < t->p.optimizer->n_params; k++) last_write[t->p.optimizer->params[k]->id] = i;
    } else if (t->op == DEFT_OP_BN_STATS) {
        for (int k = 1; k < t->nsrc; k++) last_write[t->src[k]->id] = i;
    } else {
        for (int id = 0; id < f->p->n_nodes; id++) last_write[id] = i;
    }
}

/* Puts every free leaf cast like `first` (same device and dtypes), in step order from `from`, into groups of at most
 * DEFT_CASTS_MAX. A cast whose parameter a step since the group's first has written (an optimizer step) starts a
 * new group: it must read what that step wrote. */
static deft_status deft_group_casts_like(deft_fusion *f, int first, int from, int *last_write) {
    const deft_tensor *like = f->p->graph->nodes[first];
    for (int id = 0; id < f->p->n_nodes; id++) last_write[id] = -1;
    int gi = -1, root_step = from;
    for (int i = from; i < f->p->n_steps; i++) {
        const int id = f->p->steps[i];
        const deft_tensor *t = f->p->graph->nodes[id];
        deft_note_writes(f, t, i, last_write);
        if (!deft_is_leaf_cast(f, id) || !deft_same_casts(like, t)) continue;
        if (gi < 0 || f->p->groups[gi].n_members == DEFT_CASTS_MAX || last_write[t->src[0]->id] >= root_step) {
            if (!deft_group_add(f, DEFT_GROUP_CASTS)) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
            gi = f->p->n_groups - 1;
            root_step = i;
        }
        deft_group_join(f, gi, id);
    }
    return DEFT_OK;
}

deft_status deft_fuse_leaf_casts(deft_fusion *f) {
    int *last_write = malloc((size_t)(f->p->n_nodes ? f->p->n_nodes : 1) * sizeof *last_write);
    if (!last_write) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    deft_status s = DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < f->p->n_steps; i++)
        if (deft_is_leaf_cast(f, f->p->steps[i])) s = deft_group_casts_like(f, f->p->steps[i], i, last_write);
    free(last_write);
    return s;
}
