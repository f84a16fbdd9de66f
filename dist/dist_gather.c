/* deft_dist_gather_params: ZeRO-1 replicas stepped with param_copies all-gather their bf16 (f16) copies each step
 * and keep the f32 values of most parameters current in their owner's slice only (runtime/zero_f32.c); this
 * collective gathers the f32 storage whole on every rank, so that the host may read, save or set the parameters
 * again. */
#include <stdlib.h>

#include "dist.h"
#include "optimizer.h"
#include "program_graph.h"
#include "program_state.h"
#include "zero_f32.h"

/* The k-th optimizer of g that gathers its copies (deft_optimizer_gathers_low), NULL past the last. */
static deft_optimizer *deft_gathering_optimizer(const deft_graph *g, int k) {
    for (int i = 0; i < g->n_optimizers; i++)
        if (deft_optimizer_gathers_low(g->optimizers[i]) && k-- == 0) return g->optimizers[i];
    return NULL;
}

static deft_status deft_gather_check(const deft_dist *d, deft_program *const *replicas, int n) {
    if (!d) return deft_set_error(DEFT_ERR_INVALID, "dist_gather_params: dist is NULL");
    if (!replicas || n != d->n_local)
        return deft_set_error(DEFT_ERR_INVALID, "dist_gather_params: %d replica(s) given, and the dist holds %d "
                              "communicator(s): pass one replica for each, in dist_local order", replicas ? n : 0,
                              d->n_local);
    for (int i = 0; i < n; i++) {
        if (!replicas[i]) return deft_set_error(DEFT_ERR_INVALID, "dist_gather_params: replica %d is NULL", i);
        if (deft_ddp_local_of(replicas[i], d) != i)
            return deft_set_error(DEFT_ERR_INVALID, "dist_gather_params: replica %d is no replica of this dist "
                                  "compiled with dist_local %d", i, i);
    }
    return DEFT_OK;
}

/* The k-th gathering optimizer of every replica, the same shape on each; *none when no replica has one. */
static deft_status deft_gather_pick(deft_program *const *replicas, int n, int k, deft_optimizer **opts, bool *none) {
    int found = 0;
    for (int i = 0; i < n; i++) found += (opts[i] = deft_gathering_optimizer(replicas[i]->graph, k)) != NULL;
    *none = found == 0;
    for (int i = 0; i < n && found > 0; i++)
        if (!opts[i] || opts[i]->zero.padded != opts[0]->zero.padded || opts[i]->dtype != opts[0]->dtype)
            return deft_set_error(DEFT_ERR_INVALID, "dist_gather_params: replica %d's sharded optimizers with copies "
                                  "differ from replica 0's (the %d-th of them); build every replica from the same "
                                  "graph and options", i, k + 1);
    return DEFT_OK;
}

static deft_status deft_gather_one(deft_dist *d, deft_program *const *replicas, int n, deft_optimizer **opts) {
    int locals[DEFT_DIST_MAX_LOCAL];
    void *bufs[DEFT_DIST_MAX_LOCAL], *streams[DEFT_DIST_MAX_LOCAL];
    for (int i = 0; i < n; i++) {
        locals[i] = i;
        bufs[i] = opts[i]->flat_params;
        streams[i] = replicas[i]->gpu->stream;
    }
    const deft_optimizer_zero *z = &opts[0]->zero;
    deft_status s = deft_nccl_gather_whole(d, n, locals, bufs, (size_t)(z->hi - z->lo), opts[0]->dtype, streams);
    for (int i = 0; s == DEFT_OK && i < n; i++) deft_optimizer_f32_gathered(opts[i]);
    return s;
}

deft_status deft_dist_gather_params(deft_dist *d, deft_program *const *replicas, int n) {
    deft_status s = deft_gather_check(d, replicas, n);
    for (int i = 0; s == DEFT_OK && i < n; i++) s = deft_ddp_wait(replicas[i]);   /* the last steps are done */
    deft_optimizer *opts[DEFT_DIST_MAX_LOCAL] = {0};
    for (int k = 0; s == DEFT_OK; k++) {
        bool none = false;
        s = deft_gather_pick(replicas, n, k, opts, &none);
        if (s != DEFT_OK || none) break;
        s = deft_gather_one(d, replicas, n, opts);
    }
    return s;
}
