/* Pairs of sibling steps that read the same large operand, each pair run as one kernel that reads it once:
 *
 *   ce_pair    cross-entropy's loss and its gradient over the same logits and targets: one pass over each row
 *              computes the row's maximum and sum once, adds the row's loss and writes the row's gradient
 *              (ops/cuda's deft_cuda_cross_entropy_pair). Apart, the loss reads the logits and the gradient reads them
 *              again and folds each row a second time. The gradient needs only the loss's dloss, which no training
 *              step derives from the loss's value.
 *   act_pair   an activation made again in the backward pass (checkpoint.h's cheap recomputation of GELU, SiLU,
 *              tanh, sigmoid) and that activation's gradient, both reading the pre-activation x: y = act(x) and
 *              dx = dy act'(x) in one pass (deft_cuda_act_pair), as torch.compile's partitioner fuses them.
 *
 * Both kernels compute each value with the one-op kernels' formulas and folds, so a pair stores the unfused bits.
 *
 * A pair runs at the step of its later member. The steps between the two that read the earlier member (the scaling
 * of the loss; the weight gradient's product reading the recomputed activation), and the steps of that stretch that
 * read those, move to right after the later member, in their order. That keeps the order topological as long as the
 * later member reads none of them, and it keeps every value the same as long as no step in the stretch writes what
 * another reads (an optimizer, batch norm's running statistics): otherwise the pair is not formed. */
#include <stdlib.h>
#include <string.h>

#include "fusion_internal.h"
#include "fused.h"
#include "schedule.h"

static const deft_tensor *deft_pair_node(const deft_fusion *f, int id) { return f->p->graph->nodes[id]; }

static bool deft_pair_free(const deft_fusion *f, int id, const deft_tensor *like) {
    const deft_tensor *t = deft_pair_node(f, id);
    return deft_is_step(f, id) && f->group_of[id] < 0 && t->device.type == DEFT_CUDA &&
           t->device.index == like->device.index;
}

static bool deft_pair_same_shape(const deft_tensor *a, const deft_tensor *b) {
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]);
}

/* ---------------------------------------------------------------- moving the readers of the earlier member */
deft_status deft_steps_defer_readers(deft_program *p, int e, int r, bool *tainted, bool *ok) {
    const deft_graph *g = p->graph;
    int n_moved = 0;
    *ok = true;
    tainted[p->steps[e]] = true;
    for (int i = e + 1; i <= r && *ok; i++) {
        const deft_tensor *t = g->nodes[p->steps[i]];
        if (deft_op_updates_state(t->op)) *ok = false;
        for (int k = 0; k < t->nsrc && !tainted[t->id]; k++)
            tainted[t->id] = tainted[deft_view_base(g, t->src[k]->id, NULL)];
        n_moved += tainted[t->id];
    }
    *ok = *ok && !tainted[p->steps[r]];
    int *moved = *ok && n_moved > 0 ? malloc((size_t)n_moved * sizeof *moved) : NULL;
    const bool short_of_memory = *ok && n_moved > 0 && !moved;
    if (moved) {
        int m = 0, kept = e + 1;
        for (int i = e + 1; i <= r; i++) {
            const int id = p->steps[i];
            if (tainted[id]) moved[m++] = id;
            else p->steps[kept++] = id;
        }
        memcpy(p->steps + kept, moved, (size_t)n_moved * sizeof *moved);
        free(moved);
    }
    for (int i = e; i <= r; i++) tainted[p->steps[i]] = false;
    if (short_of_memory) {
        *ok = false;
        return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    }
    return DEFT_OK;
}

/* Forms the pair (a, b) as a group of `kind`, moving readers first; no group when they cannot move. */
static deft_status deft_pair_form(deft_fusion *f, int a, int b, deft_group_kind kind, bool *tainted) {
    const int e = f->pos[a] < f->pos[b] ? f->pos[a] : f->pos[b], r = f->pos[a] < f->pos[b] ? f->pos[b] : f->pos[a];
    bool ok = false;
    deft_status s = deft_steps_defer_readers(f->p, e, r, tainted, &ok);
    if (s != DEFT_OK || !ok) return s;
    deft_fusion_positions(f);
    deft_group *g = deft_group_add(f, kind);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    const int gi = (int)(g - f->p->groups);
    deft_group_join(f, gi, a < b ? a : b);
    deft_group_join(f, gi, a < b ? b : a);
    if (!deft_readers_after(f, gi, -1, f->pos[a] > f->pos[b] ? f->pos[a] : f->pos[b])) {
        f->group_of[a] = f->group_of[b] = -1;   /* cannot happen after the move; kept as the rule every group obeys */
        free(g->members);
        f->p->n_groups--;
    }
    return DEFT_OK;
}

/* ---------------------------------------------------------------- the pairs */
static bool deft_same_ce(const deft_tensor *loss, const deft_tensor *grad) {
    return loss->p.ce.has_ignore == grad->p.ce.has_ignore && loss->p.ce.ignore_index == grad->p.ce.ignore_index &&
           loss->p.ce.smoothing == grad->p.ce.smoothing && loss->p.ce.reduction == grad->p.ce.reduction;
}

/* The gradient of loss step l over its logits and targets, -1 if none is free. */
static int deft_ce_partner(const deft_fusion *f, int l) {
    const deft_tensor *loss = deft_pair_node(f, l);
    const int x = loss->src[0]->id;
    for (int c = f->cons_start[x]; c < f->cons_start[x + 1]; c++) {
        const int id = f->cons[c];
        const deft_tensor *t = deft_pair_node(f, id);
        if (t->op == DEFT_OP_CROSS_ENTROPY_GRAD && deft_pair_free(f, id, loss) && t->src[1] == loss->src[0] &&
            t->src[2] == loss->src[1] && deft_same_ce(loss, t))
            return id;
    }
    return -1;
}

static bool deft_pair_act(deft_op act) {
    return act == DEFT_OP_GELU || act == DEFT_OP_GELU_TANH || act == DEFT_OP_SILU || act == DEFT_OP_TANH ||
           act == DEFT_OP_SIGMOID;
}

/* Whether act_grad step a may pair with an activation: of a kind with a pair kernel, its operands of its shape and
 * dtype. */
static bool deft_act_pairable(const deft_fusion *f, int a) {
    const deft_tensor *grad = deft_pair_node(f, a), *x = grad->src[1], *dy = grad->src[0];
    return deft_pair_act(grad->p.act) && deft_fused_dtype_ok(grad->dtype) && x->dtype == grad->dtype &&
           dy->dtype == grad->dtype && deft_pair_same_shape(x, grad) && deft_pair_same_shape(dy, grad);
}

/* Pairs act_grad step a with an activation of its kind over its x: the forward pass's own reads x too, but its
 * readers lead to a, so only a recomputation pairs; the latest candidate is tried first. */
static deft_status deft_act_pair_with(deft_fusion *f, int a, bool *tainted) {
    const deft_tensor *grad = deft_pair_node(f, a);
    const int x = grad->src[1]->id;
    for (int c = f->cons_start[x + 1] - 1; c >= f->cons_start[x] && f->group_of[a] < 0; c--) {
        const int id = f->cons[c];
        const deft_tensor *t = deft_pair_node(f, id);
        if (t->op != grad->p.act || t->nsrc != 1 || t->dtype != grad->dtype || !deft_pair_free(f, id, grad)) continue;
        deft_status s = deft_pair_form(f, id, a, DEFT_GROUP_ACT_PAIR, tainted);
        if (s != DEFT_OK) return s;
    }
    return DEFT_OK;
}

deft_status deft_fuse_pairs(deft_fusion *f) {
    deft_program *p = f->p;
    bool *tainted = calloc((size_t)(p->n_nodes ? p->n_nodes : 1), sizeof *tainted);
    if (!tainted) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    deft_status s = DEFT_OK;
    /* Steps move as pairs form: walk the nodes in id order, never the steps. */
    for (int id = 0; s == DEFT_OK && id < p->n_nodes; id++) {
        const deft_tensor *t = deft_pair_node(f, id);
        if (!deft_pair_free(f, id, t)) continue;
        if (t->op == DEFT_OP_CROSS_ENTROPY) {
            const int grad = deft_ce_partner(f, id);
            if (grad >= 0) s = deft_pair_form(f, id, grad, DEFT_GROUP_CE_PAIR, tainted);
        } else if (t->op == DEFT_OP_ACT_GRAD && deft_act_pairable(f, id)) {
            s = deft_act_pair_with(f, id, tainted);
        }
    }
    free(tainted);
    return s;
}
