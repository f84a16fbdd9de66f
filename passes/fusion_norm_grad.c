/* Batch norm's backward with the ReLU gradient above it folded in. In a ResNet's backward pass the gradient of a
 * ReLU (DEFT_OP_ACT_GRAD of DEFT_OP_RELU: its incoming gradient where its output y > 0, 0 elsewhere) is often read by
 * nothing but the backward nodes of the batch norm under it: the sums of dy and dy xhat
 * (DEFT_OP_BATCH_NORM_WEIGHT_GRAD) and dx (DEFT_OP_BATCH_NORM_GRAD), each reading it whole. Those kernels can read the
 * ReLU's incoming gradient and y instead and mask each element on load, rounded as the act_grad kernel stores it
 * (ops/cuda's deft_cuda_batch_norm_grad_masked): the same bits, without writing the masked gradient and reading it
 * back twice, and a launch fewer. The masked gradient is a member that is never stored, so it gets no buffer.
 *
 * The group runs both kernels at the later one's step (dx, which reads the sums), so every reader of the sums (the
 * weight and bias gradients, views of them) must come after dx, or the group is not formed. The sums are stored
 * whoever reads them: dx reads them from memory. y now lives until that step instead of until the ReLU's gradient;
 * a buffer of its size is what the masked gradient no longer takes. */
#include <stdlib.h>
#include <string.h>

#include "fusion_internal.h"

static const deft_tensor *deft_ng_node(const deft_fusion *f, int id) { return f->p->graph->nodes[id]; }

/* Whether node id is the gradient of a ReLU on a GPU that the pass may fold: a free step that nobody reads as an
 * output, over operands that are no views (the kernels read them element for element). */
static bool deft_is_foldable_relu_grad(const deft_fusion *f, int id) {
    const deft_tensor *t = deft_ng_node(f, id);
    return t->op == DEFT_OP_ACT_GRAD && t->p.act == DEFT_OP_RELU && t->device.type == DEFT_CUDA &&
           deft_is_step(f, id) && f->group_of[id] < 0 && !f->p->nodes[id].is_output && !t->src[0]->is_view &&
           !t->src[1]->is_view;
}

/* Whether node id is a free batch norm backward step on mask's GPU that reads mask as its dy and nowhere else. */
static bool deft_reads_as_dy(const deft_fusion *f, int id, int mask) {
    const deft_tensor *t = deft_ng_node(f, id), *m = deft_ng_node(f, mask);
    if ((t->op != DEFT_OP_BATCH_NORM_GRAD && t->op != DEFT_OP_BATCH_NORM_WEIGHT_GRAD) || !deft_is_step(f, id) ||
        f->group_of[id] >= 0 || t->src[0]->id != mask || t->device.type != m->device.type ||
        t->device.index != m->device.index)
        return false;
    for (int k = 1; k < t->nsrc; k++)
        if (t->src[k]->id == mask) return false;
    return true;
}

/* The readers of mask when they are one batch norm's backward nodes: its sums, its dx, or both, reading the same
 * statistics (and in training dx reads those sums). Returns how many (0: leave mask alone). */
static int deft_bn_readers(const deft_fusion *f, int mask, int readers[2]) {
    const int n = f->cons_start[mask + 1] - f->cons_start[mask];
    if (n < 1 || n > 2) return 0;
    for (int c = 0; c < n; c++) {
        readers[c] = f->cons[f->cons_start[mask] + c];
        if (!deft_reads_as_dy(f, readers[c], mask)) return 0;
    }
    if (n == 1) return 1;
    const deft_tensor *a = deft_ng_node(f, readers[0]), *b = deft_ng_node(f, readers[1]);
    if (a->op == b->op) return 0;
    const deft_tensor *sums = a->op == DEFT_OP_BATCH_NORM_WEIGHT_GRAD ? a : b, *dx = sums == a ? b : a;
    const int batch = dx->p.bn.batch;   /* dx: (dy, x, stats, sums[, weight]) in training, (dy, stats[, weight]) */
    const bool same_norm = dx->nsrc >= 2 + 2 * batch && dx->src[1 + batch] == sums->src[2] &&
                           (!batch || (dx->src[1] == sums->src[1] && dx->src[3] == sums));
    return same_norm ? 2 : 0;
}

static deft_status deft_norm_grad_group(deft_fusion *f, int mask) {
    int readers[2];
    const int n = deft_is_foldable_relu_grad(f, mask) ? deft_bn_readers(f, mask, readers) : 0;
    if (n == 0) return DEFT_OK;
    deft_group *g = deft_group_add(f, DEFT_GROUP_NORM_GRAD);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    const int gi = (int)(g - f->p->groups);
    g->mask = mask;
    deft_group_join(f, gi, mask);
    int at = f->pos[mask];
    for (int c = 0; c < n; c++) {
        deft_group_join(f, gi, readers[c]);
        if (f->pos[readers[c]] > at) at = f->pos[readers[c]];
    }
    if (deft_readers_after(f, gi, -1, at)) return DEFT_OK;
    /* A reader of the sums runs before dx: the sums cannot wait for dx's step. */
    for (int m = 0; m < g->n_members; m++) f->group_of[g->members[m]] = -1;
    free(g->members);
    f->p->n_groups--;
    return DEFT_OK;
}

deft_status deft_fuse_norm_grads(deft_fusion *f) {
    deft_status s = DEFT_OK;
    /* The compile option no_relu_grad_fold leaves every ReLU gradient its own kernel: what folding gives can then be
     * measured, and compared bit for bit, with everything else fused as usual. */
    if (!f->p->config.fold_relu_grad) return s;
    for (int i = 0; s == DEFT_OK && i < f->p->n_steps; i++) s = deft_norm_grad_group(f, f->p->steps[i]);
    return s;
}
