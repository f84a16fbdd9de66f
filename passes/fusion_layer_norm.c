/* Layer norm groups. In a pre-norm transformer the residual stream is h = h + f(...) and the next layer norm reads h:
 *
 *   ln_add        the add s = a + b and the layer norm of s run as one kernel (ops/cuda's deft_cuda_layer_norm_add)
 *                 that reads a and b once, stores s (the stream still needs it: the next add and layer norm's
 *                 gradient read it) and the normalised value: a pass over [..., C] fewer per layer norm. Under
 *                 autocast one operand is often the cast to f32 of a bf16 or f16 value (a projection's output); when
 *                 nothing else reads that cast it joins too, and the kernel widens its source on load. Where autocast
 *                 made the layer norm write its value in bf16 or f16 (ir/autocast_layer_norm.c), s stays f32 and
 *                 only the normalised value is stored narrow.
 *   ln_grad_add   in the backward pass the stream's gradient is d_res + dx (the add autodiff makes where two
 *                 gradients meet): dx's kernel adds d_res as it stores, and dx itself never reaches memory.
 *   ln_grad_sums  dx (with that add when it qualifies, as ln_grad_add) and the weight gradient node reading the same
 *                 dy, x and ln: one kernel reads each row once for both, summing the weight and bias gradients'
 *                 partials as it goes (ops/cuda/cuda_layer_norm.cu). It runs at its last member's step, so every
 *                 other reader of dx, the add and the weight gradient must come after that. Formed before ln_grad_add,
 *                 which takes the dx nodes whose weight gradient could not join.
 *
 * Each value is rounded as its own kernel rounds it (the same kernels run), so a group gives the unfused steps' bits.
 * ln_add runs at the layer norm's step, later than the add's own: every other reader of s must come after it, or the
 * group is not formed. ln_grad_add runs at the add's step, and dx has no reader but the add. The operands the kernels
 * read element for element must have the add's shape and dtype and be no views. */
#include <stdlib.h>
#include <string.h>

#include "fusion_internal.h"

static const deft_tensor *deft_ln_node(const deft_fusion *f, int id) { return f->p->graph->nodes[id]; }

static int deft_ln_readers(const deft_fusion *f, int id) { return f->cons_start[id + 1] - f->cons_start[id]; }

/* A free step on the GPU of `like`. */
static bool deft_ln_free_step(const deft_fusion *f, int id, const deft_tensor *like) {
    const deft_tensor *t = deft_ln_node(f, id);
    return deft_is_step(f, id) && f->group_of[id] < 0 && t->device.type == DEFT_CUDA &&
           t->device.index == like->device.index;
}

/* Whether operand r of add can be read by the kernel element for element. */
static bool deft_ln_plain_operand(const deft_tensor *r, const deft_tensor *add) {
    return !r->is_view && r->dtype == add->dtype && r->ndim == add->ndim &&
           !memcmp(r->shape, add->shape, (size_t)add->ndim * sizeof add->shape[0]);
}

/* An add of two operands of its own shape and dtype on ln's GPU, free to join. */
static bool deft_ln_plain_add(const deft_fusion *f, int add, const deft_tensor *ln) {
    const deft_tensor *a = deft_ln_node(f, add);
    return a->op == DEFT_OP_ADD && a->nsrc == 2 && deft_ln_free_step(f, add, ln) &&
           deft_ln_plain_operand(a->src[0], a) && deft_ln_plain_operand(a->src[1], a);
}

/* The operand of add that is a cast to f32 of a bf16 or f16 value which only add reads (-1: none). */
static int deft_ln_widening_cast(const deft_fusion *f, const deft_tensor *add) {
    for (int k = 1; k >= 0; k--) {
        const deft_tensor *c = add->src[k];
        if (c->op != DEFT_OP_CAST || add->dtype != DEFT_F32 || !deft_ln_free_step(f, c->id, add) ||
            f->p->nodes[c->id].is_output || deft_ln_readers(f, c->id) != 1 || c->src[0]->is_view ||
            (c->src[0]->dtype != DEFT_BF16 && c->src[0]->dtype != DEFT_F16))
            continue;
        if (add->src[1 - k] != c) return c->id;   /* x + x reads the cast twice */
    }
    return -1;
}

static deft_group *deft_ln_group_new(deft_fusion *f, deft_group_kind kind) {
    deft_group *g = deft_group_add(f, kind);
    if (g) g->norm = g->add = g->cast = g->residual = -1;
    return g;
}

/* Undoes the last group (its readers would run before it). */
static void deft_ln_group_drop(deft_fusion *f) {
    deft_group *g = &f->p->groups[f->p->n_groups - 1];
    for (int m = 0; m < g->n_members; m++) f->group_of[g->members[m]] = -1;
    free(g->members);
    f->p->n_groups--;
}

static deft_status deft_ln_add_group(deft_fusion *f, int ln) {
    const deft_tensor *t = deft_ln_node(f, ln);
    if (t->op != DEFT_OP_LAYER_NORM || !deft_ln_free_step(f, ln, t)) return DEFT_OK;
    const int add = t->src[0]->id;
    if (!deft_ln_plain_add(f, add, t)) return DEFT_OK;
    deft_group *g = deft_ln_group_new(f, DEFT_GROUP_LN_ADD);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    const int gi = (int)(g - f->p->groups);
    g->norm = ln;
    g->add = add;
    g->cast = deft_ln_widening_cast(f, deft_ln_node(f, add));
    if (g->cast >= 0) deft_group_join(f, gi, g->cast);
    deft_group_join(f, gi, add);
    deft_group_join(f, gi, ln);
    if (!deft_readers_after(f, gi, -1, f->pos[ln])) deft_ln_group_drop(f);
    return DEFT_OK;
}

/* dx read by nothing but an add of the residual gradient (either operand), neither of them an output. */
static deft_status deft_ln_grad_add_group(deft_fusion *f, int dx) {
    const deft_tensor *t = deft_ln_node(f, dx);
    if (t->op != DEFT_OP_LAYER_NORM_GRAD || !deft_ln_free_step(f, dx, t) || f->p->nodes[dx].is_output ||
        deft_ln_readers(f, dx) != 1)
        return DEFT_OK;
    const int add = f->cons[f->cons_start[dx]];
    if (!deft_ln_plain_add(f, add, t)) return DEFT_OK;
    const deft_tensor *a = deft_ln_node(f, add);
    if ((a->src[0]->id == dx) == (a->src[1]->id == dx) || !deft_ln_plain_operand(t, a)) return DEFT_OK;
    deft_group *g = deft_ln_group_new(f, DEFT_GROUP_LN_GRAD_ADD);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    const int gi = (int)(g - f->p->groups);
    g->norm = dx;
    g->add = add;
    g->residual = a->src[0]->id == dx ? a->src[1]->id : a->src[0]->id;
    deft_group_join(f, gi, dx);
    deft_group_join(f, gi, add);
    return DEFT_OK;
}

/* The weight gradient node reading dx's dy, x and ln, free to join on dx's GPU (-1: none). */
static int deft_ln_weight_grad_of(const deft_fusion *f, const deft_tensor *dx) {
    const int dy = dx->src[0]->id;
    for (int c = f->cons_start[dy]; c < f->cons_start[dy + 1]; c++) {
        const deft_tensor *w = deft_ln_node(f, f->cons[c]);
        if (w->op == DEFT_OP_LAYER_NORM_WEIGHT_GRAD && w->nsrc == 3 && w->src[0] == dx->src[0] &&
            w->src[1] == dx->src[1] && w->src[2] == dx->src[2] && w->dtype == dx->dtype &&
            deft_ln_free_step(f, w->id, dx))
            return w->id;
    }
    return -1;
}

/* dx and its weight gradient, with the add of the residual gradient when dx qualifies for ln_grad_add. */
static deft_status deft_ln_grad_sums_group(deft_fusion *f, int dx) {
    const deft_tensor *t = deft_ln_node(f, dx);
    if (t->op != DEFT_OP_LAYER_NORM_GRAD || !deft_ln_free_step(f, dx, t)) return DEFT_OK;
    const int wg = deft_ln_weight_grad_of(f, t);
    if (wg < 0) return DEFT_OK;
    int add = -1, residual = -1;
    if (!f->p->nodes[dx].is_output && deft_ln_readers(f, dx) == 1) {
        const int a = f->cons[f->cons_start[dx]];
        const deft_tensor *an = deft_ln_node(f, a);
        if (deft_ln_plain_add(f, a, t) && (an->src[0]->id == dx) != (an->src[1]->id == dx) &&
            deft_ln_plain_operand(t, an)) {
            add = a;
            residual = an->src[0]->id == dx ? an->src[1]->id : an->src[0]->id;
        }
    }
    deft_group *g = deft_ln_group_new(f, DEFT_GROUP_LN_GRAD_SUMS);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    const int gi = (int)(g - f->p->groups);
    g->norm = dx;
    g->add = add;
    g->residual = residual;
    deft_group_join(f, gi, dx);
    deft_group_join(f, gi, wg);
    if (add >= 0) deft_group_join(f, gi, add);
    int at = f->pos[dx] > f->pos[wg] ? f->pos[dx] : f->pos[wg];
    if (add >= 0 && f->pos[add] > at) at = f->pos[add];
    if (!deft_readers_after(f, gi, -1, at)) deft_ln_group_drop(f);
    return DEFT_OK;
}

deft_status deft_fuse_layer_norms(deft_fusion *f) {
    deft_status s = DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < f->p->n_steps; i++) s = deft_ln_add_group(f, f->p->steps[i]);
    for (int i = 0; s == DEFT_OK && i < f->p->n_steps; i++) s = deft_ln_grad_sums_group(f, f->p->steps[i]);
    for (int i = 0; s == DEFT_OK && i < f->p->n_steps; i++) s = deft_ln_grad_add_group(f, f->p->steps[i]);
    return s;
}
