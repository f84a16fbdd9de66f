/* Running a fused group (passes/fusion.c) at its root's step. */
#include "cuda_kernels.h"
#include "cuda_matmul.h"
#include "device_internal.h"
#include "fused.h"
#include "fusion_internal.h"
#include "program_run.h"
#include "program_state.h"

#ifdef DEFT_HAVE_CUDA
static deft_status deft_run_elementwise(deft_program *p, const deft_group *g, void *stream) {
    const void *in[DEFT_FUSED_MAX_INPUTS];
    void *out[DEFT_FUSED_MAX_STORES + 1];   /* a reduction ending the chain is the last */
    for (int j = 0; j < g->n_inputs; j++) in[j] = deft_program_data(p, g->inputs[j]);
    for (int s = 0; s < g->n_stores; s++) out[s] = deft_program_data(p, g->stores[s]);
    return deft_cuda_fused_run(g->kernel, out, in, stream);
}

static deft_status deft_run_matmul(deft_program *p, const deft_group *g, void *stream) {
    const deft_tensor *mm = p->graph->nodes[g->matmul];
    deft_mm_epilogue ep = {(deft_mm_epilogue_kind)g->epilogue, NULL, NULL};
    void *out;
    if (g->epilogue == DEFT_MM_EPI_BGRAD_B) {
        out = deft_program_data(p, g->matmul);
        const int sum = g->members[0] == g->matmul ? g->members[1] : g->members[0];
        ep.bias_grad = deft_program_data(p, sum);
    } else {
        out = deft_program_data(p, g->root);
        ep.bias = deft_program_data(p, g->bias);
    }
    return deft_cuda_matmul_fused(mm, out, deft_program_data(p, mm->src[0]->id), deft_program_data(p, mm->src[1]->id),
                                  &ep, stream, p->cuda_flags);
}

/* The products of a batch in member order, each with the bias gradient that sums its b, if the group holds one. */
static deft_status deft_run_matmul_batch(deft_program *p, const deft_group *g, void *stream) {
    deft_mm_part parts[DEFT_MM_BATCH_MAX];
    int n = 0;
    for (int m = 0; m < g->n_members; m++) {
        const deft_tensor *mm = p->graph->nodes[g->members[m]];
        if (mm->op != DEFT_OP_MATMUL) continue;
        if (n == DEFT_MM_BATCH_MAX)
            return deft_set_error(DEFT_ERR_INVALID, "a batch of more than %d products", DEFT_MM_BATCH_MAX);
        parts[n] = (deft_mm_part){mm, deft_program_data(p, mm->id), deft_program_data(p, mm->src[0]->id),
                                  deft_program_data(p, mm->src[1]->id), NULL};
        for (int k = 0; k < g->n_members; k++) {
            const deft_tensor *sum = p->graph->nodes[g->members[k]];
            if (deft_is_bias_grad_of(sum, mm)) parts[n].bias_grad = deft_program_data(p, sum->id);
        }
        n++;
    }
    return deft_cuda_matmul_batch(parts, n, stream, p->cuda_flags);
}

/* The normalisation's inputs as its own step would pass them, its output stored in the group's one store. */
static deft_status deft_run_norm(deft_program *p, const deft_group *g, void *stream) {
    const deft_tensor *bn = p->graph->nodes[g->norm];
    const void *in[8];   /* batch norm reads x, its statistics, and its weight and bias when it has them */
    if (bn->nsrc > 8) return deft_set_error(DEFT_ERR_INVALID, "%s: batch norm with %d inputs", bn->name, bn->nsrc);
    for (int k = 0; k < bn->nsrc; k++) in[k] = deft_program_data(p, bn->src[k]->id);
    const void *residual = g->residual >= 0 ? deft_program_data(p, g->residual) : NULL;
    return deft_cuda_batch_norm_epilogue(bn, deft_program_data(p, g->root), in, residual, g->relu, stream);
}

/* The backward nodes of the batch norm, the sums first (dx reads them), each reading the ReLU's incoming gradient and
 * output in place of the masked gradient, which is never stored. */
static deft_status deft_run_norm_grad(deft_program *p, const deft_group *g, void *stream) {
    const deft_tensor *mask = p->graph->nodes[g->mask];
    const void *relu_out = deft_program_data(p, mask->src[1]->id);
    const deft_op order[2] = {DEFT_OP_BATCH_NORM_WEIGHT_GRAD, DEFT_OP_BATCH_NORM_GRAD};
    deft_status s = DEFT_OK;
    for (int o = 0; o < 2; o++) {
        for (int m = 0; s == DEFT_OK && m < g->n_members; m++) {
            const deft_tensor *n = p->graph->nodes[g->members[m]];
            const void *in[5];   /* dx reads dy, x, its statistics, the sums and its weight */
            if (n->op != order[o]) continue;
            if (n->nsrc > 5)
                return deft_set_error(DEFT_ERR_INVALID, "%s: batch norm grad with %d inputs", n->name, n->nsrc);
            in[0] = deft_program_data(p, mask->src[0]->id);
            for (int k = 1; k < n->nsrc; k++) in[k] = deft_program_data(p, n->src[k]->id);
            s = deft_cuda_batch_norm_grad_masked(n, deft_program_data(p, n->id), in, relu_out, stream);
        }
    }
    return s;
}

/* The add's operands (the cast's source in place of the cast), its value s when stored, the layer norm's other
 * sources as its own step passes them. */
static deft_status deft_run_ln_add(deft_program *p, const deft_group *g, void *stream) {
    const deft_tensor *ln = p->graph->nodes[g->norm], *add = p->graph->nodes[g->add];
    const void *in[3] = {NULL, NULL, NULL};   /* x (unread), weight, bias */
    for (int k = 1; k < ln->nsrc && k < 3; k++) in[k] = deft_program_data(p, ln->src[k]->id);
    const deft_tensor *a = add->src[0], *b = add->src[1];
    if (g->cast >= 0 && a->id == g->cast) {   /* the cast read through its source, as b (a + b == b + a) */
        a = add->src[1];
        b = add->src[0];
    }
    const deft_tensor *bsrc = g->cast >= 0 ? b->src[0] : b;
    void *s = p->nodes[g->add].buffer >= 0 ? deft_program_data(p, g->add) : NULL;
    return deft_cuda_layer_norm_add(ln, deft_program_data(p, g->norm), s, deft_program_data(p, a->id),
                                    deft_program_data(p, bsrc->id), bsrc->dtype, in, stream);
}

/* dx computed from its sources and added to the residual gradient, stored as the add's value. */
static deft_status deft_run_ln_grad_add(deft_program *p, const deft_group *g, void *stream) {
    const deft_tensor *dx = p->graph->nodes[g->norm];
    const void *in[4];
    for (int k = 0; k < dx->nsrc && k < 4; k++) in[k] = deft_program_data(p, dx->src[k]->id);
    return deft_cuda_layer_norm_grad_add(dx, deft_program_data(p, g->add), in, deft_program_data(p, g->residual),
                                         stream);
}

/* dx (added to the residual gradient when the add is a member, stored as the add's value) and the weight gradient
 * reading the same dy, x and ln, in one pass. */
static deft_status deft_run_ln_grad_sums(deft_program *p, const deft_group *g, void *stream) {
    const deft_tensor *dx = p->graph->nodes[g->norm], *wg = NULL;
    for (int m = 0; m < g->n_members; m++)
        if (p->graph->nodes[g->members[m]]->op == DEFT_OP_LAYER_NORM_WEIGHT_GRAD) wg = p->graph->nodes[g->members[m]];
    if (!wg) return deft_set_error(DEFT_ERR_INVALID, "%s: a layer norm group without its weight gradient", dx->name);
    const void *in[4];
    for (int k = 0; k < dx->nsrc && k < 4; k++) in[k] = deft_program_data(p, dx->src[k]->id);
    const bool add = g->add >= 0;
    return deft_cuda_layer_norm_grad_sums(dx, deft_program_data(p, add ? g->add : g->norm), in,
                                          add ? deft_program_data(p, g->residual) : NULL, wg,
                                          deft_program_data(p, wg->id), stream);
}

/* The pair's members, whichever id is lower. */
static const deft_tensor *deft_pair_member(const deft_program *p, const deft_group *g, deft_op op) {
    const deft_tensor *a = p->graph->nodes[g->members[0]], *b = p->graph->nodes[g->members[1]];
    return a->op == op ? a : b;
}

static deft_status deft_run_ce_pair(deft_program *p, const deft_group *g, void *stream) {
    const deft_tensor *loss = deft_pair_member(p, g, DEFT_OP_CROSS_ENTROPY);
    const deft_tensor *grad = deft_pair_member(p, g, DEFT_OP_CROSS_ENTROPY_GRAD);
    return deft_cuda_cross_entropy_pair(loss, grad, deft_program_data(p, loss->id), deft_program_data(p, grad->id),
                                        deft_program_data(p, grad->src[0]->id), deft_program_data(p, loss->src[0]->id),
                                        deft_program_data(p, loss->src[1]->id), stream);
}

static deft_status deft_run_act_pair(deft_program *p, const deft_group *g, void *stream) {
    const deft_tensor *grad = deft_pair_member(p, g, DEFT_OP_ACT_GRAD);
    const deft_tensor *act = grad == p->graph->nodes[g->members[0]] ? p->graph->nodes[g->members[1]]
                                                                     : p->graph->nodes[g->members[0]];
    return deft_cuda_act_pair(act, grad, deft_program_data(p, act->id), deft_program_data(p, grad->id),
                              deft_program_data(p, grad->src[1]->id), deft_program_data(p, grad->src[0]->id), stream);
}

static deft_status deft_run_casts(deft_program *p, const deft_group *g, void *stream) {
    const deft_tensor *casts[DEFT_CASTS_MAX];
    void *out[DEFT_CASTS_MAX];
    const void *in[DEFT_CASTS_MAX];
    if (g->n_members > DEFT_CASTS_MAX)
        return deft_set_error(DEFT_ERR_INVALID, "a group of %d casts (at most %d)", g->n_members, DEFT_CASTS_MAX);
    for (int m = 0; m < g->n_members; m++) {
        casts[m] = p->graph->nodes[g->members[m]];
        out[m] = deft_program_data(p, g->members[m]);
        in[m] = deft_program_data(p, casts[m]->src[0]->id);
    }
    return deft_cuda_casts_run(casts, out, in, g->n_members, stream);
}
#endif

deft_status deft_group_run(deft_program *p, const deft_group *g, void *stream) {
#ifdef DEFT_HAVE_CUDA
    deft_status s = deft_cuda_set_device(p->graph->nodes[g->root]->device.index);
    if (s != DEFT_OK) return s;
    switch (g->kind) {
    case DEFT_GROUP_ELEMENTWISE: return deft_run_elementwise(p, g, stream);
    case DEFT_GROUP_NORM: return deft_run_norm(p, g, stream);
    case DEFT_GROUP_CASTS: return deft_run_casts(p, g, stream);
    case DEFT_GROUP_NORM_GRAD: return deft_run_norm_grad(p, g, stream);
    case DEFT_GROUP_MATMUL_BATCH: return deft_run_matmul_batch(p, g, stream);
    case DEFT_GROUP_LN_ADD: return deft_run_ln_add(p, g, stream);
    case DEFT_GROUP_LN_GRAD_ADD: return deft_run_ln_grad_add(p, g, stream);
    case DEFT_GROUP_LN_GRAD_SUMS: return deft_run_ln_grad_sums(p, g, stream);
    case DEFT_GROUP_CE_PAIR: return deft_run_ce_pair(p, g, stream);
    case DEFT_GROUP_ACT_PAIR: return deft_run_act_pair(p, g, stream);
    default: return deft_run_matmul(p, g, stream);
    }
#else
    (void)p;
    (void)g;
    (void)stream;
    return deft_set_error(DEFT_ERR_NO_CUDA, "deft was built without CUDA");
#endif
}
