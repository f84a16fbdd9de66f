/* ZeRO-1's share of an optimizer's storage (ir/optimizer.h's deft_optimizer_zero; dist/dist_zero.c shards with it):
 * the slices, the update's blocks of this rank's slice on the device, and the check
 * that a program steps a sharded optimizer only as a ZeRO-1 replica. */
#include <stdlib.h>

#include "checked.h"
#include "device_internal.h"
#include "optimizer_storage.h"
#include "program_state.h"
#include "zero_f32.h"

deft_status deft_optimizer_zero_slices(const deft_optimizer *o, int world, int rank, deft_optimizer_zero *z) {
    if (world < 1 || rank < 0 || rank >= world)
        return deft_set_error(DEFT_ERR_INVALID, "zero_stage 1: rank %d of a world of %d", rank, world);
    const int64_t quantum = (int64_t)world * (int64_t)(16 / deft_dtype_size(o->dtype));
    int64_t padded = 0;
    if (!deft_i64_add(o->total, quantum - 1, &padded) || !deft_i64_mul(padded / quantum, quantum, &padded))
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1: optimizer %s's %lld elements overflow when "
                              "padded for %d ranks", o->step_node ? o->step_node->name : "(unnamed)",
                              (long long)o->total, world);
    const int64_t shard = padded / world;
    *z = (deft_optimizer_zero){.world = world, .rank = rank, .lo = rank * shard, .hi = (rank + 1) * shard,
                               .padded = padded};
    return DEFT_OK;
}

/* The norm's blocks (never crossing a parameter) cut at lo and hi, padding left out, relative to lo: the update under
 * parameter groups takes each block's parameter from them, as the unsharded step does. */
static int deft_zero_count_blocks(const deft_optimizer *o, deft_optimizer_block *out) {
    const int64_t lo = o->zero.lo, hi = o->zero.hi < o->total ? o->zero.hi : o->total;
    int n = 0;
    for (int i = 0; i < o->n_params; i++)
        for (int b = o->block_first[i]; b < o->block_first[i + 1]; b++) {
            int64_t a, e;
            deft_optimizer_block_range(o, i, b, &a, &e);
            if (a < lo) a = lo;
            if (e > hi) e = hi;
            if (a >= e) continue;
            if (out) out[n] = (deft_optimizer_block){.lo = a - lo, .hi = e - lo, .param = i};
            n++;
        }
    return n;
}

deft_status deft_optimizer_zero_blocks_new(deft_optimizer *o) {
    if (!deft_optimizer_sharded(o) || !o->dev) return DEFT_OK;
    const int n = deft_zero_count_blocks(o, NULL);
    o->zero.n_blocks = n;
    if (n == 0) return DEFT_OK;
    deft_optimizer_block *host = calloc((size_t)n, sizeof *host);
    if (!host) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    deft_zero_count_blocks(o, host);
    void *dev = NULL;
    deft_status s = deft_mem_alloc_tagged(o->device, (size_t)n * sizeof *host, "optimizer.blocks", &dev);
    if (s == DEFT_OK) s = deft_mem_copy(o->device, dev, deft_cpu(), host, (size_t)n * sizeof *host);
    free(host);
    if (s != DEFT_OK) {
        deft_mem_free(o->device, dev);
        return s;
    }
    o->zero.dev_blocks = dev;
    return DEFT_OK;
}

void deft_optimizer_zero_release(deft_optimizer *o) {
    if (o->zero.dev_blocks) deft_mem_free(o->device, o->zero.dev_blocks);
    o->zero.dev_blocks = NULL;
    o->zero.n_blocks = 0;
    deft_optimizer_zero_f32_forget(o);
}

void deft_optimizers_unshard_unmade(deft_graph *g) {
    for (int i = 0; i < g->n_optimizers; i++)
        if (!g->optimizers[i]->materialized) g->optimizers[i]->zero = (deft_optimizer_zero){0};
}

/* A sharded step updates only this rank's slice and needs the others' collectives: a program that is no ZeRO-1
 * replica must not run it. */
deft_status deft_program_check_sharding(const deft_program *p) {
    const bool zero = p->config.dist && p->config.zero_stage == 1;
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed || t->op != DEFT_OP_OPTIMIZER) continue;
        const deft_optimizer *o = deft_optimizer_whole(t->p.optimizer);
        if (deft_optimizer_sharded(o) && !zero)
            return deft_set_error(DEFT_ERR_INVALID, "compile: %s steps an optimizer sharded by ZeRO-1 (rank %d of "
                                  "%d, compiled before with zero_stage 1); compile its step with the same dist and "
                                  "zero_stage 1", t->name, o->zero.rank, o->zero.world);
    }
    return DEFT_OK;
}
