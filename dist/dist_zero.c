/* ZeRO-1 (the compile option zero_stage = 1 under dist): each optimizer of a replica's graph is sharded across the
 * dist's ranks before its storage is made. Rank r owns elements [lo, hi) of the flat storage, padded to a multiple of
 * world * 16 bytes so that every slice starts on a 16-byte vector, and keeps the state (AdamW's moments, SGD's
 * momentum) of its slice only. Its step (ops/cuda/cuda_optimizer.cu) reduce-scatters the gathered gradients, updates
 * the slice and all-gathers the parameters, through the collectives below: ops/ sits below dist/, so it reaches them
 * through the optimizer's zero.ops. The replica's buckets leave a sharded optimizer's gradients alone
 * (dist/dist_program.c): its reduce-scatter replaces their all-reduce. */
#include <stdio.h>

#include "checked.h"
#include "dist.h"
#include "optimizer.h"
#include "program_state.h"

static deft_status deft_zero_reduce_scatter(void *ctx, int local, void *buf, int64_t shard, deft_dtype dt,
                                            void *stream) {
    return deft_nccl_reduce_scatter_avg((deft_dist *)ctx, local, buf, (size_t)shard, dt, stream);
}

static deft_status deft_zero_all_reduce_sum(void *ctx, int local, double *x, void *stream) {
    return deft_nccl_all_reduce_sum_f64((deft_dist *)ctx, local, x, stream);
}

static deft_status deft_zero_all_gather(void *ctx, int local, void *buf, int64_t shard, deft_dtype dt, void *stream) {
    return deft_nccl_all_gather((deft_dist *)ctx, local, buf, (size_t)shard, dt, stream);
}

static const deft_optimizer_zero_ops deft_zero_ops = {
    .reduce_scatter = deft_zero_reduce_scatter,
    .all_reduce_sum = deft_zero_all_reduce_sum,
    .all_gather = deft_zero_all_gather,
};

static const char *deft_zero_name(const deft_optimizer *o) { return o->step_node->name; }

/* What ZeRO-1 v1 cannot shard. */
static deft_status deft_zero_refuse(const deft_optimizer *o) {
    if (o->device.type == DEFT_CPU)
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1: optimizer %s updates parameters on the cpu; "
                              "ZeRO-1 shards an optimizer on the replica's GPU", deft_zero_name(o));
    if (o->accumulate_steps > 1)
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1: optimizer %s accumulates %d micro-batches "
                              "per update (accumulate_steps); ZeRO-1 reduce-scatters every run's gradients and takes "
                              "one micro-batch per update", deft_zero_name(o), o->accumulate_steps);
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
    const int64_t world = d->world, quantum = world * (int64_t)(16 / deft_dtype_size(o->dtype));
    int64_t padded = 0;
    if (!deft_i64_add(o->total, quantum - 1, &padded) || !deft_i64_mul(padded / quantum, quantum, &padded))
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1: optimizer %s's %lld elements overflow when "
                              "padded for %lld ranks", deft_zero_name(o), (long long)o->total, (long long)world);
    const int64_t shard = padded / world, rank = d->rank[local];
    o->zero = (deft_optimizer_zero){.world = (int)world, .rank = (int)rank, .lo = rank * shard,
                                    .hi = (rank + 1) * shard, .padded = padded, .ops = &deft_zero_ops, .ctx = d,
                                    .local = local};
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
