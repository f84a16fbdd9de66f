/* ZeRO-1 (the compile option zero_stage = 1 under dist): each optimizer of a replica's graph is sharded across the
 * dist's ranks before its storage is made. Rank r owns elements [lo, hi) of the flat storage, padded to a multiple of
 * world * 16 bytes so that every slice starts on a 16-byte vector (runtime/optimizer_zero.c), and keeps the state
 * (AdamW's moments, SGD's momentum) and the flat gradients of its slice only.
 *
 * What is reduced when: the replica cuts a sharded optimizer's gradients into the DDP buckets (passes/grad_buckets.h,
 * in the order the backward pass makes them) and, on its communication stream right after the step that makes a
 * bucket's last gradient, reduces each gradient's pieces to their owners (dist/dist_program.c, with the reduces built
 * below): the piece of gradient i inside rank r's slice, [max(off_i, lo_r), min(off_i + n_i, hi_r)), is one ncclReduce
 * (ncclAvg, root r), a bucket's pieces one NCCL group. On its root it lands at its place in the slice-sized flat
 * gradients; the gradients are in the optimizer's dtype (data parallel keeps f32 gradients under autocast,
 * ir/autocast.h), and a narrower one is refused. The bucket is joined back
 * before the step, which then (ops/cuda/cuda_optimizer.cu) sums the slice's squares, all-reduces that one f64 (so
 * clipping and the loss scale's verdict see the whole norm), updates the slice and all-gathers the parameters, through
 * the collectives below: ops/ sits below dist/, so it reaches them through the optimizer's zero.ops. With the compile
 * option param_copies the all-gather sends the bf16 (f16) copies, which each rank's update writes for its slice, and
 * only the f32 parameters the replica reads in f32 follow, broadcast piece by piece from their owners
 * (runtime/zero_f32.c); deft_dist_gather_params (dist/dist_gather.c) gathers the rest when the host wants them. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "dist.h"
#include "optimizer.h"
#include "optimizer_storage.h"
#include "program_state.h"

static deft_status deft_zero_all_reduce_sum(void *ctx, int local, double *x, void *stream) {
    return deft_nccl_all_reduce_sum_f64((deft_dist *)ctx, local, x, stream);
}

static deft_status deft_zero_all_gather(void *ctx, int local, void *buf, int64_t shard, deft_dtype dt, void *stream) {
    return deft_nccl_all_gather((deft_dist *)ctx, local, buf, (size_t)shard, dt, stream);
}

static deft_status deft_zero_broadcast_pieces(void *ctx, int local, void *buf, const deft_zero_f32_piece *pieces,
                                              int n, deft_dtype dt, void *stream) {
    return deft_nccl_broadcast_pieces((deft_dist *)ctx, local, buf, pieces, n, dt, stream);
}

static const deft_optimizer_zero_ops deft_zero_ops = {
    .all_reduce_sum = deft_zero_all_reduce_sum,
    .all_gather = deft_zero_all_gather,
    .broadcast_pieces = deft_zero_broadcast_pieces,
};

static const char *deft_zero_name(const deft_optimizer *o) { return o->step_node->name; }

/* What ZeRO-1 cannot shard. */
static deft_status deft_zero_refuse(const deft_optimizer *o) {
    if (o->device.type == DEFT_CPU)
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1: optimizer %s updates parameters on the cpu; "
                              "ZeRO-1 shards an optimizer on the replica's GPU", deft_zero_name(o));
    if (o->accumulate_steps > 1)
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1: optimizer %s accumulates %d micro-batches "
                              "per update (accumulate_steps); ZeRO-1 reduces every run's gradients to their owners "
                              "and takes one micro-batch per update", deft_zero_name(o), o->accumulate_steps);
    return DEFT_OK;
}

/* An optimizer given its storage by an earlier compile: sharded the same way (the communicator may be a new one). */
static deft_status deft_zero_check_made(deft_optimizer *o, deft_dist *d, int local) {
    const int world = d->world, rank = d->rank[local];
    if (!deft_optimizer_sharded(o))
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1: optimizer %s got its whole (unsharded) state "
                              "from an earlier compile of this graph without zero_stage; compile the ZeRO-1 replica "
                              "first", deft_zero_name(o));
    if (o->zero.world != world || o->zero.rank != rank)
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1: optimizer %s is sharded as rank %d of %d, "
                              "and this replica is rank %d of %d", deft_zero_name(o), o->zero.rank, o->zero.world,
                              rank, world);
    o->zero.ctx = d;
    o->zero.local = local;
    return DEFT_OK;
}

static deft_status deft_zero_place(deft_optimizer *o, deft_dist *d, int local) {
    deft_optimizer_zero z;
    deft_status s = deft_optimizer_zero_slices(o, d->world, d->rank[local], &z);
    if (s != DEFT_OK) return s;
    z.ops = &deft_zero_ops;
    z.ctx = d;
    z.local = local;
    o->zero = z;
    return DEFT_OK;
}

deft_status deft_zero_shard(deft_graph *g, const deft_config *c) {
    deft_dist *d = c->dist;
    if (c->dist_local < 0 || c->dist_local >= d->n_local)
        return deft_set_error(DEFT_ERR_INVALID, "data parallel: dist_local %d, but the dist holds %d communicator(s)",
                              c->dist_local, d->n_local);
    for (int i = 0; i < g->n_optimizers; i++) {
        deft_optimizer *o = g->optimizers[i];
        if (!o->step_node || o->part) continue;
        deft_status s = deft_zero_refuse(o);
        if (s == DEFT_OK) s = o->materialized ? deft_zero_check_made(o, d, c->dist_local)
                                              : deft_zero_place(o, d, c->dist_local);
        if (s != DEFT_OK) return s;
    }
    return DEFT_OK;
}

/* Counts the pieces of the n gradients (out NULL) or writes them. */
static int64_t deft_zero_pieces(deft_optimizer *o, int n, const int *param, void *const *data, const deft_dtype *dtype,
                            deft_dist_reduces *out) {
    int64_t k = 0;
    for (int j = 0; j < n; j++) {
        const int i = param[j];
        const int64_t off = o->offsets[i], count = deft_shape_numel(o->params[i]->ndim, o->params[i]->shape);
        const size_t gsz = deft_dtype_size(dtype[j]);
        int first, last;
        deft_optimizer_zero_ranks(o, off, count, &first, &last);
        for (int r = first; r <= last; r++, k++) {
            if (!out) continue;
            int64_t a, e;
            deft_optimizer_zero_piece(o, off, count, r, &a, &e);
            char *mine = (char *)o->flat_grads;
            out->send[k] = (char *)data[j] + (size_t)(a - off) * gsz;
            /* Read on the root only; elsewhere the send buffer stands in (NCCL wants no null pointer). */
            out->recv[k] = r == o->zero.rank ? mine + deft_optimizer_zero_dest_offset(o, a) : out->send[k];
            out->count[k] = (size_t)(e - a);
            out->dtype[k] = dtype[j];
            out->root[k] = r;
        }
    }
    return k;
}

deft_status deft_zero_reduces_new(deft_optimizer *o, int n, const int *param, void *const *data,
                                  const deft_dtype *dtype, deft_dist_reduces *out) {
    *out = (deft_dist_reduces){0};
    if (!deft_optimizer_sharded(o) || !o->flat_grads)
        return deft_set_error(DEFT_ERR_STATE, "data parallel: ZeRO-1 bucket of %s, which has no sharded storage",
                              deft_zero_name(o));
    for (int j = 0; j < n; j++)
        if (dtype[j] != o->dtype)
            return deft_set_error(DEFT_ERR_DTYPE, "data parallel: ZeRO-1 optimizer %s reduces its gradients into its "
                                  "%s flat gradients, and parameter %d's gradient is %s", deft_zero_name(o),
                                  deft_dtype_name(o->dtype), param[j], deft_dtype_name(dtype[j]));
    const int64_t m = deft_zero_pieces(o, n, param, data, dtype, NULL);
    if (m > INT_MAX)   /* NCCL's group and the reduces' count are indexed by int */
        return deft_set_error(DEFT_ERR_INVALID, "data parallel: ZeRO-1 bucket of %s: %lld pieces are more than an int "
                              "counts", deft_zero_name(o), (long long)m);
    const size_t cap = (size_t)(m > 0 ? m : 1);
    out->send = malloc(cap * sizeof *out->send);
    out->recv = malloc(cap * sizeof *out->recv);
    out->count = malloc(cap * sizeof *out->count);
    out->dtype = malloc(cap * sizeof *out->dtype);
    out->root = malloc(cap * sizeof *out->root);
    if (!out->send || !out->recv || !out->count || !out->dtype || !out->root) {
        deft_zero_reduces_free(out);
        return deft_set_error(DEFT_ERR_OOM, "data parallel: out of host memory");
    }
    out->n = (int)deft_zero_pieces(o, n, param, data, dtype, out);
    return DEFT_OK;
}

void deft_zero_reduces_free(deft_dist_reduces *r) {
    free(r->send);
    free(r->recv);
    free(r->count);
    free(r->dtype);
    free(r->root);
    *r = (deft_dist_reduces){0};
}
