/* Test support for ZeRO-1's arithmetic without GPUs (deft_testing_zero_plan): the slices, the bytes a sharded
 * optimizer holds and plans, and the reduces its replica queues, computed by the library's own functions on a shallow
 * copy of an optimizer whose flat gradients and gradient are host buffers of the right sizes (never read or
 * written: the reduces are only built, and their addresses reported relative to those buffers). */
#include "deft_testing.h"

#include <stdlib.h>

#include "dist.h"
#include "optimizer.h"
#include "optimizer_storage.h"
#include "zero_f32.h"

/* The bytes c (a sharded copy) would allocate and plan. */
static void deft_testing_zero_sizes(const deft_optimizer *c, deft_testing_zero *out) {
    const size_t esz = deft_dtype_size(c->dtype), arrays = c->kind == DEFT_OPTIM_ADAMW ? 2u : 1u;
    *out = (deft_testing_zero){.world = c->zero.world, .rank = c->zero.rank, .lo = c->zero.lo, .hi = c->zero.hi,
                               .padded = c->zero.padded, .total = c->total};
    out->state_bytes = arrays * (size_t)deft_optimizer_state_count(c) * esz;
    out->grad_bytes = deft_optimizer_keeps_grads(c) ? (size_t)deft_optimizer_grad_count(c) * esz : 0;
    out->planned_bytes = deft_optimizer_state_bytes(c);
}

/* Piece k of r, its addresses relative to the buffers they point into (the gradient of parameter offset `off`). */
static deft_testing_zero_piece deft_testing_zero_piece_of(const deft_optimizer *c, const deft_dist_reduces *r, int k,
                                                          const char *grad, int64_t off) {
    const size_t sent = (size_t)((const char *)r->send[k] - grad);
    deft_testing_zero_piece q = {.root = r->root[k], .count = (int64_t)r->count[k], .send_offset = sent,
                                 .start = off + (int64_t)(sent / deft_dtype_size(r->dtype[k])),
                                 .dest_offset = (size_t)-1};
    if (r->root[k] == c->zero.rank) q.dest_offset = (size_t)((const char *)r->recv[k] - (const char *)c->flat_grads);
    return q;
}

int deft_testing_zero_plan(const deft_optimizer *o, int world, int rank, int param, deft_dtype dt,
                           deft_testing_zero *out, deft_testing_zero_piece *pieces, int max) {
    if (!o || param < 0 || param >= o->n_params) {
        deft_set_error(DEFT_ERR_INVALID, "zero_plan: parameter %d of %d", param, o ? o->n_params : 0);
        return -1;
    }
    deft_optimizer c = *o;
    if (deft_optimizer_zero_slices(o, world, rank, &c.zero) != DEFT_OK) return -1;
    const size_t esz = deft_dtype_size(o->dtype), slice = (size_t)deft_optimizer_state_count(&c) * esz;
    const int64_t numel = deft_shape_numel(o->params[param]->ndim, o->params[param]->shape);
    char *flat = calloc(1, slice ? slice : 1), *grad = calloc(1, (size_t)(numel > 0 ? numel : 1) * deft_dtype_size(dt));
    int n = -1;
    if (!flat || !grad) {
        deft_set_error(DEFT_ERR_OOM, "zero_plan: out of host memory");
    } else {
        c.flat_grads = flat;
        deft_testing_zero_sizes(&c, out);
        deft_dist_reduces r;
        void *data = grad;
        if (deft_zero_reduces_new(&c, 1, &param, &data, &dt, &r) == DEFT_OK) {
            for (int k = 0; k < r.n && k < max; k++)
                pieces[k] = deft_testing_zero_piece_of(&c, &r, k, grad, o->offsets[param]);
            n = r.n;
            deft_zero_reduces_free(&r);
        }
    }
    free(flat);
    free(grad);
    return n;
}

int deft_testing_zero_f32_plan(const deft_program *p, const deft_optimizer *o, int world, int rank, bool *reads,
                               deft_testing_zero_piece *pieces, int max) {
    if (!p || !o) {
        deft_set_error(DEFT_ERR_INVALID, "zero_f32_plan: program or optimizer is NULL");
        return -1;
    }
    deft_optimizer c = *o;
    if (deft_optimizer_zero_slices(o, world, rank, &c.zero) != DEFT_OK) return -1;
    const int64_t n = deft_zero_f32_plan(p, &c, reads, NULL);
    deft_zero_f32_piece *all = calloc((size_t)(n ? n : 1), sizeof *all);
    if (!all) {
        deft_set_error(DEFT_ERR_OOM, "zero_f32_plan: out of host memory");
        return -1;
    }
    deft_zero_f32_plan(p, &c, reads, all);
    for (int64_t k = 0; k < n && k < max; k++)
        pieces[k] = (deft_testing_zero_piece){.root = all[k].root, .start = all[k].lo, .count = all[k].hi - all[k].lo,
                                              .send_offset = (size_t)-1, .dest_offset = (size_t)-1};
    free(all);
    return (int)n;
}

deft_status deft_testing_zero_partial(deft_optimizer *o, const bool *f32_param) {
    if (!o) return deft_set_error(DEFT_ERR_INVALID, "zero_partial: optimizer is NULL");
    deft_optimizer_zero_f32_forget(o);
    if (!f32_param) return DEFT_OK;
    bool *flags = malloc((size_t)(o->n_params ? o->n_params : 1) * sizeof *flags);
    if (!flags) return deft_set_error(DEFT_ERR_OOM, "zero_partial: out of host memory");
    for (int i = 0; i < o->n_params; i++) flags[i] = f32_param[i];
    o->zero.f32_param = flags;
    o->f32_partial = true;
    return DEFT_OK;
}
