/* A data parallel replica: the gradients its optimizers read, cut into buckets in the order the backward pass
 * produces them (passes/grad_buckets.h), each all-reduced (averaged over the ranks) on a communication stream right
 * after the step that produces its last gradient, and joined back into the program's stream just before the first
 * step that reads one of them: the optimizer's piece for that bucket (passes/optimizer_split.h; the pieces run after
 * the backward pass, in bucket order, so the earlier buckets' updates overlap the last all-reduce), or the whole
 * step, which then waits for every bucket. Between the two the backward pass goes on: no step there reads or writes a bucket's
 * gradients (the planner keeps each gradient's buffer until its last reader, which comes at or after the join), so
 * the in-place all-reduce overlaps it safely. Fork and join are events, which a CUDA Graph capture records as
 * edges: the whole step, collectives included, is one graph.
 *
 * A sharded optimizer's gradients (ZeRO-1, dist/dist_zero.c) are cut into buckets the same way, in buckets of their
 * own; at the same points each such bucket is reduced to the gradients' owners instead (one ncclReduce per piece of
 * a rank's slice, into its slice-sized flat gradients), which only reads the gradients' buffers. */
#include <stdlib.h>
#include <string.h>

#include "cuda_tuning.h"
#include "device_internal.h"
#include "dist.h"
#include "grad_buckets.h"
#include "optimizer.h"
#include "optimizer_split.h"
#include "param_copies.h"
#include "program_graph.h"
#include "program_run.h"
#include "program_state.h"
#include "replica_hooks.h"
#include "zero_f32.h"

typedef struct deft_ddp_bucket {
    int ready;                /* the step after which its last gradient exists (-1: before the first step) */
    int join;                 /* the first later step reading one of its gradients (n_steps: none, the run's end) */
    int first, n;             /* its gradients: grads[first .. first + n) of the replica's table */
    size_t bytes;
    deft_dist_buffers bufs;
    void *fork, *done;        /* events: the program's stream to the communication stream, and back */
    void *fork_side;          /* the side lane's to the communication stream (passes/side_lane.h), when it has one */
    bool issued, joined;      /* in the run being queued */
    void *packed;             /* many gradients of one dtype: packed here and all-reduced by one call (NULL: not) */
    size_t packed_bytes;
    deft_optimizer *zero;     /* a sharded optimizer's bucket: reduced to the owners (NULL: all-reduced) */
    deft_dist_reduces reduces;
} deft_ddp_bucket;

typedef struct deft_ddp {
    deft_dist *dist;
    int local, device;
    void *stream;             /* the communication stream */
    int n_grads;
    int *grads;               /* node ids of the gradients, bucket by bucket */
    int *key;                 /* per gradient, its bucket's key (collected: one bucket per run of equal keys) */
    int *ready;               /* per gradient, the step producing it */
    int *param;               /* per gradient of a sharded optimizer, its parameter's index there (-1: none) */
    deft_optimizer **zopt;    /* per gradient, the sharded optimizer reading it (NULL: an all-reduced gradient) */
    void **data;
    size_t *count;
    deft_dtype *dtype;
    size_t *offset;           /* per gradient, its place in its bucket's packed buffer */
    size_t *bytes;            /* per gradient, its size in bytes (what the packing kernels copy) */
    int n_buckets;
    deft_ddp_bucket *buckets;
    bool broadcast_done;      /* rank 0's parameters were broadcast (the first run) */
} deft_ddp;

/* The step that produces node id's value (through a view, its base's), -1 for a leaf. */
static int deft_ddp_step_of(const deft_program *p, int id) {
    return p->nodes[deft_view_base(p->graph, id, NULL)].step;
}

static bool deft_ddp_has_grad(const deft_ddp *dd, int id) {
    for (int i = 0; i < dd->n_grads; i++)
        if (dd->grads[i] == id && !dd->zopt[i]) return true;
    return false;
}

/* Appends gradient id to the bucket of `key`, unless an earlier bucket all-reduces it (two steps reading one gradient).
 * A sharded optimizer's (zopt) is always added, as parameter `param` of it: its owners must receive it. */
static void deft_ddp_add(const deft_program *p, deft_ddp *dd, int id, int key, deft_optimizer *zopt, int param) {
    if (!zopt && deft_ddp_has_grad(dd, id)) return;
    dd->grads[dd->n_grads] = id;
    dd->key[dd->n_grads] = key;
    dd->param[dd->n_grads] = zopt ? param : -1;
    dd->zopt[dd->n_grads] = zopt;
    dd->ready[dd->n_grads++] = deft_ddp_step_of(p, id);
}

/* A whole step's gradients, in its buckets (passes/grad_buckets.h); each bucket's key is new and negative. */
static deft_status deft_ddp_add_whole(const deft_program *p, deft_ddp *dd, const deft_tensor *t,
                                      const deft_config *o, int *next_key) {
    deft_optimizer *zopt = deft_optimizer_sharded(t->p.optimizer) ? t->p.optimizer : NULL;
    deft_grad_buckets gb;
    deft_status s = deft_grad_buckets_cut(t, o, &gb);
    for (int b = 0; s == DEFT_OK && b < gb.n_buckets; b++, --*next_key)
        for (int j = gb.first[b]; j < gb.first[b + 1]; j++)
            deft_ddp_add(p, dd, t->src[gb.order[j]]->id, *next_key, zopt, gb.order[j]);
    deft_grad_buckets_free(&gb);
    return s;
}

/* The gradients the optimizer steps of p read, bucket by bucket: a piece's (per bucket, passes/optimizer_split.h) in
 * its bucket, keyed by it (a bucket's pieces run one after another); a whole step's cut as the split would cut it. */
static deft_status deft_ddp_collect(deft_program *p, deft_ddp *dd, const deft_config *o) {
    int cap = 0;
    for (int i = 0; i < p->n_steps; i++) {
        const deft_tensor *t = p->graph->nodes[p->steps[i]];
        if (t->op == DEFT_OP_OPTIMIZER && !(t->p.optimizer->part && t->p.optimizer->part->finisher)) cap += t->nsrc;
    }
    if (cap == 0)
        return deft_set_error(DEFT_ERR_INVALID, "data parallel: the program runs no optimizer step; compile the "
                              "optimizer's step (deft_optimizer_step) together with the loss");
    dd->grads = malloc((size_t)cap * sizeof *dd->grads);
    dd->key = malloc((size_t)cap * sizeof *dd->key);
    dd->ready = malloc((size_t)cap * sizeof *dd->ready);
    dd->param = malloc((size_t)cap * sizeof *dd->param);
    dd->zopt = malloc((size_t)cap * sizeof *dd->zopt);
    if (!dd->grads || !dd->key || !dd->ready || !dd->param || !dd->zopt)
        return deft_set_error(DEFT_ERR_OOM, "data parallel: out of host memory");
    int next_key = -1;
    deft_status s = DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < p->n_steps; i++) {
        const deft_tensor *t = p->graph->nodes[p->steps[i]];
        if (t->op != DEFT_OP_OPTIMIZER) continue;
        const deft_optimizer_part *part = t->p.optimizer->part;
        if (!part) s = deft_ddp_add_whole(p, dd, t, o, &next_key);
        else if (!part->finisher && p->split && p->split->per_bucket)
            for (int k = 0; k < t->nsrc; k++)
                deft_ddp_add(p, dd, t->src[k]->id, p->split->bucket_of[t->id - p->split->n_before], NULL, -1);
    }
    return s;
}

/* Whether step i reads a gradient of bucket b (any member of its fused group counts). */
static bool deft_ddp_step_reads(const deft_program *p, const deft_ddp *dd, const deft_ddp_bucket *b, int i) {
    const int id = p->steps[i];
    const deft_group *grp = p->nodes[id].group >= 0 ? &p->groups[p->nodes[id].group] : NULL;
    const int n_members = grp ? grp->n_members : 1;
    for (int m = 0; m < n_members; m++) {
        const deft_tensor *t = p->graph->nodes[grp ? grp->members[m] : id];
        for (int k = 0; k < t->nsrc; k++) {
            const int base = deft_view_base(p->graph, t->src[k]->id, NULL);
            for (int g = b->first; g < b->first + b->n; g++)
                if (deft_view_base(p->graph, dd->grads[g], NULL) == base) return true;
        }
    }
    return false;
}

/* One bucket per run of gradients of one key; it is all-reduced after the step producing its last gradient and
 * joined before the first later step reading one of them. */
static deft_status deft_ddp_cut(deft_program *p, deft_ddp *dd) {
    const size_t n = (size_t)(dd->n_grads > 0 ? dd->n_grads : 1);
    dd->buckets = calloc(n, sizeof *dd->buckets);
    dd->data = malloc(n * sizeof *dd->data);
    dd->count = malloc(n * sizeof *dd->count);
    dd->dtype = malloc(n * sizeof *dd->dtype);
    if (!dd->buckets || !dd->data || !dd->count || !dd->dtype)
        return deft_set_error(DEFT_ERR_OOM, "data parallel: out of host memory");
    for (int i = 0; i < dd->n_grads; i++) {
        const deft_tensor *t = p->graph->nodes[dd->grads[i]];
        deft_ddp_bucket *b = dd->n_buckets ? &dd->buckets[dd->n_buckets - 1] : NULL;
        if (!b || dd->key[i] != dd->key[i - 1]) {
            b = &dd->buckets[dd->n_buckets++];
            *b = (deft_ddp_bucket){.ready = -1, .first = i, .zero = dd->zopt[i]};
        }
        b->n++;
        b->bytes += deft_tensor_bytes(t);
        if (dd->ready[i] > b->ready) b->ready = dd->ready[i];
        dd->data[i] = deft_program_data(p, dd->grads[i]);
        dd->count[i] = (size_t)deft_shape_numel(t->ndim, t->shape);
        dd->dtype[i] = t->dtype;
    }
    deft_status s = DEFT_OK;
    for (int k = 0; k < dd->n_buckets; k++) {
        deft_ddp_bucket *b = &dd->buckets[k];
        b->bufs = (deft_dist_buffers){b->n, dd->data + b->first, dd->count + b->first, dd->dtype + b->first};
        b->join = p->n_steps;
        for (int i = b->ready + 1; i < p->n_steps && b->join == p->n_steps; i++)
            if (deft_ddp_step_reads(p, dd, b, i)) b->join = i;
        /* A world of one reduces nothing: its sharded step gathers the gradients where they lie. */
        if (s == DEFT_OK && b->zero && dd->dist->world > 1)
            s = deft_zero_reduces_new(b->zero, b->n, dd->param + b->first, dd->data + b->first, dd->dtype + b->first,
                                      &b->reduces);
    }
    return s;
}

int deft_ddp_local_of(const deft_program *p, const deft_dist *d) {
    const deft_ddp *dd = p->ddp;
    return dd && dd->dist == d ? dd->local : -1;
}

int deft_ddp_bucket_layout(const deft_program *p, size_t *bytes, int *joins, int max) {
    const deft_ddp *dd = p ? p->ddp : NULL;
    if (!dd) return -1;
    for (int k = 0; k < dd->n_buckets && k < max; k++) {
        if (bytes) bytes[k] = dd->buckets[k].bytes;
        if (joins) joins[k] = dd->buckets[k].join;
    }
    return dd->n_buckets;
}

int deft_ddp_zero_buckets(const deft_program *p, size_t *bytes, int *ready, int *joins, int *pieces, int max) {
    const deft_ddp *dd = p ? p->ddp : NULL;
    if (!dd) return -1;
    int n = 0;
    for (int k = 0; k < dd->n_buckets; k++) {
        const deft_ddp_bucket *b = &dd->buckets[k];
        if (!b->zero) continue;
        if (n < max) {
            if (bytes) bytes[n] = b->bytes;
            if (ready) ready[n] = b->ready;
            if (joins) joins[n] = b->join;
            if (pieces) pieces[n] = b->reduces.n;
        }
        n++;
    }
    return n;
}

/* A bucket of at least DEFT_DDP_PACK_FROM (cuda_tuning.h) gradients of one dtype is packed into one buffer (each
 * gradient 16-byte aligned, the gaps zero) and all-reduced by one NCCL call, rather than as a group of one call per
 * gradient, which NCCL runs below its bandwidth when they are small. ResNet-18's steps got shorter on two and four
 * GPUs (bench/RESULTS.md, "Eleventh round"); the mid MLP's buckets (a weight and its bias) stay as they are. */
static bool deft_ddp_packs(const deft_ddp_bucket *b) {
    if (b->zero || b->bufs.n < DEFT_DDP_PACK_FROM) return false;
    for (int i = 1; i < b->bufs.n; i++)
        if (b->bufs.dtype[i] != b->bufs.dtype[0]) return false;
    return true;
}

static deft_status deft_ddp_pack_buffers(deft_ddp *dd) {
    dd->offset = malloc((size_t)(dd->n_grads ? dd->n_grads : 1) * sizeof *dd->offset);
    dd->bytes = malloc((size_t)(dd->n_grads ? dd->n_grads : 1) * sizeof *dd->bytes);
    if (!dd->offset || !dd->bytes) return deft_set_error(DEFT_ERR_OOM, "data parallel: out of host memory");
    deft_status s = DEFT_OK;
    for (int k = 0; s == DEFT_OK && k < dd->n_buckets; k++) {
        deft_ddp_bucket *b = &dd->buckets[k];
        if (dd->dist->world < 2 || !deft_ddp_packs(b)) continue;
        size_t at = 0;
        for (int i = 0; i < b->bufs.n; i++) {
            at = (at + 15) / 16 * 16;
            dd->offset[b->first + i] = at;
            dd->bytes[b->first + i] = b->bufs.count[i] * deft_dtype_size(b->bufs.dtype[i]);
            at += dd->bytes[b->first + i];
        }
        b->packed_bytes = (at + 15) / 16 * 16;
        s = deft_mem_alloc_tagged(deft_cuda(dd->device), b->packed_bytes, "data parallel bucket", &b->packed);
        if (s == DEFT_OK) s = deft_nccl_zero(dd->device, b->packed, b->packed_bytes);
    }
    return s;
}

int deft_ddp_packed_buckets(const deft_program *p) {
    const deft_ddp *dd = p ? p->ddp : NULL;
    int n = 0;
    for (int k = 0; dd && k < dd->n_buckets; k++) n += dd->buckets[k].packed != NULL;
    return dd ? n : -1;
}

static deft_status deft_ddp_check(const deft_program *p, const deft_config *o) {
    const deft_dist *d = o->dist;
    if (o->dist_local < 0 || o->dist_local >= d->n_local)
        return deft_set_error(DEFT_ERR_INVALID, "data parallel: dist_local %d, but the dist holds %d communicator(s)",
                              o->dist_local, d->n_local);
    if (d->aborted) return deft_set_error(DEFT_ERR_RUNTIME, "data parallel: the dist failed: %s", d->failure);
    if (o->optimizer_in_backward)
        return deft_set_error(DEFT_ERR_INVALID, "data parallel: optimizer_in_backward is not supported with dist "
                              "(a piece would read its gradients before their bucket is all-reduced)");
    const int want = d->device[o->dist_local];
    const deft_lanes *L = &p->gpu->lanes;
    const int gpus = L->n - (L->side ? 1 : 0);   /* the side lane shares lane 0's GPU */
    if (gpus != 1 || L->host_steps > 0 || p->gpu->device != want) {
        char found[64] = "the cpu";
        if (gpus > 1) snprintf(found, sizeof found, "%d GPUs", gpus);
        else if (gpus == 1) snprintf(found, sizeof found, "cuda:%d%s", p->gpu->device, L->host_steps ? " and the cpu" : "");
        return deft_set_error(DEFT_ERR_DEVICE, "data parallel: rank %d's replica must run on cuda:%d alone, but its "
                              "steps run on %s", d->rank[o->dist_local], want, found);
    }
    return DEFT_OK;
}

deft_status deft_ddp_attach(deft_program *p, const deft_config *o) {
    if (!o->dist) return DEFT_OK;
    deft_status s = deft_ddp_check(p, o);
    if (s != DEFT_OK) return s;
    deft_ddp *dd = calloc(1, sizeof *dd);
    if (!dd) return deft_set_error(DEFT_ERR_OOM, "data parallel: out of host memory");
    *dd = (deft_ddp){.dist = o->dist, .local = o->dist_local, .device = o->dist->device[o->dist_local]};
    p->ddp = dd;
    s = deft_ddp_collect(p, dd, o);
    if (s == DEFT_OK) s = deft_ddp_cut(p, dd);
    if (s == DEFT_OK) s = deft_ddp_pack_buffers(dd);
    if (s == DEFT_OK) s = deft_nccl_stream_new(dd->device, &dd->stream);
    for (int k = 0; s == DEFT_OK && k < dd->n_buckets; k++) {
        s = deft_nccl_event_new(dd->device, &dd->buckets[k].fork);
        if (s == DEFT_OK) s = deft_nccl_event_new(dd->device, &dd->buckets[k].done);
        if (s == DEFT_OK && p->gpu->lanes.side) s = deft_nccl_event_new(dd->device, &dd->buckets[k].fork_side);
    }
    return s;
}

void deft_ddp_free(deft_program *p) {
    deft_ddp *dd = p->ddp;
    if (!dd) return;
    for (int k = 0; dd->buckets && k < dd->n_buckets; k++) {
        deft_nccl_event_free(dd->device, dd->buckets[k].fork);
        deft_nccl_event_free(dd->device, dd->buckets[k].done);
        if (dd->buckets[k].fork_side) deft_nccl_event_free(dd->device, dd->buckets[k].fork_side);
        if (dd->buckets[k].packed) deft_mem_free(deft_cuda(dd->device), dd->buckets[k].packed);
        deft_zero_reduces_free(&dd->buckets[k].reduces);
    }
    deft_nccl_stream_free(dd->device, dd->stream);
    free(dd->grads);
    free(dd->key);
    free(dd->ready);
    free(dd->param);
    free(dd->zopt);
    free(dd->data);
    free(dd->count);
    free(dd->dtype);
    free(dd->offset);
    free(dd->bytes);
    free(dd->buckets);
    free(dd);
    p->ddp = NULL;
}

deft_status deft_ddp_check_run(const deft_program *p) {
    const deft_ddp *dd = p->ddp;
    if (!dd) return DEFT_OK;
    const deft_dist *d = dd->dist;
    if (d->aborted)
        return deft_set_error(DEFT_ERR_RUNTIME, "run: rank %d's communicator was aborted: %s", d->rank[dd->local],
                              d->failure);
    if (d->n_local > 1 && !d->running)
        return deft_set_error(DEFT_ERR_STATE, "run: this replica (rank %d) shares a communicator with %d local GPUs, "
                              "whose all-reduces must run together: run them with deft_dist_run",
                              d->rank[dd->local], d->n_local);
    return DEFT_OK;
}

/* The parameters (and buffers such as batch norm's running statistics) that p reads on its GPU. */
static deft_status deft_ddp_broadcast(deft_program *p, deft_ddp *dd) {
    int n = 0;
    for (int id = 0; id < p->n_nodes; id++)
        n += p->nodes[id].needed && p->graph->nodes[id]->op == DEFT_OP_PARAM;
    void **data = malloc((size_t)(n ? n : 1) * sizeof *data);
    size_t *count = malloc((size_t)(n ? n : 1) * sizeof *count);
    deft_dtype *dtype = malloc((size_t)(n ? n : 1) * sizeof *dtype);
    deft_status s = data && count && dtype ? DEFT_OK : deft_set_error(DEFT_ERR_OOM, "data parallel: out of host memory");
    int k = 0;
    for (int id = 0; s == DEFT_OK && id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed || t->op != DEFT_OP_PARAM) continue;
        data[k] = deft_program_data(p, id);
        count[k] = (size_t)deft_shape_numel(t->ndim, t->shape);
        dtype[k++] = t->dtype;
    }
    deft_dist_buffers b = {k, data, count, dtype};
    if (s == DEFT_OK && k > 0) s = deft_nccl_broadcast0(dd->dist, dd->local, &b, p->gpu->stream);
    free(data);
    free(count);
    free(dtype);
    return s;
}

deft_status deft_ddp_begin_run(deft_program *p) {
    deft_ddp *dd = p->ddp;
    if (!dd) return DEFT_OK;
    if (!dd->broadcast_done && dd->dist->world > 1) {
        /* Rank 0's f32 values would be sent whole, and they are current in its slice only. */
        deft_status s = deft_graph_check_f32_current(p->graph, "data parallel: the first run's broadcast");
        if (s == DEFT_OK) s = deft_ddp_broadcast(p, dd);
        /* The parameters changed under their low-precision copies: written again behind the broadcast. */
        if (s == DEFT_OK) deft_param_copies_mark_stale(p->graph, NULL);
        if (s == DEFT_OK) s = deft_param_copies_refresh(p);
        if (s != DEFT_OK) return s;
        dd->broadcast_done = true;
    }
    for (int k = 0; k < dd->n_buckets; k++) dd->buckets[k].issued = dd->buckets[k].joined = false;
    return deft_ddp_after_step(p, -1);   /* buckets of gradients no step produces */
}

deft_status deft_ddp_after_step(deft_program *p, int step) {
    deft_ddp *dd = p->ddp;
    deft_status s = DEFT_OK;
    /* One rank's average is its own gradient: NCCL would still read and write every bucket (a measurable share of
     * the mid MLP's step: bench/RESULTS.md, "Tenth round"), so a world of one queues nothing. */
    if (dd && dd->dist->world == 1) return DEFT_OK;
    for (int k = 0; dd && s == DEFT_OK && k < dd->n_buckets; k++) {
        deft_ddp_bucket *b = &dd->buckets[k];
        if (b->ready != step) continue;
        const deft_lanes *L = &p->gpu->lanes;
        s = deft_nccl_stream_after(dd->device, dd->stream, p->gpu->stream, b->fork);
        /* A bucket's gradients may come from both lanes: the all-reduce waits for what each queued so far. */
        if (s == DEFT_OK && L->side && L->forked[L->side])
            s = deft_nccl_stream_after(dd->device, dd->stream, L->stream[L->side], b->fork_side);
        b->issued = s == DEFT_OK;
        if (s == DEFT_OK && b->zero) s = deft_nccl_reduce_avg(dd->dist, dd->local, &b->reduces, dd->stream);
        else if (s == DEFT_OK)
            s = b->packed ? deft_nccl_all_reduce_packed(dd->dist, dd->local, &b->bufs, dd->offset + b->first,
                                                        dd->bytes + b->first,
                                                        b->packed, b->packed_bytes, dd->stream)
                          : deft_nccl_all_reduce_avg(dd->dist, dd->local, &b->bufs, dd->stream);
    }
    return s;
}

/* Joins the issued buckets read at `step`; at the run's end (step n_steps) every one still out, even after a
 * failure, so that a capture ends with the communication stream back in it. */
static deft_status deft_ddp_join(deft_program *p, int step) {
    deft_ddp *dd = p->ddp;
    deft_status s = DEFT_OK;
    for (int k = 0; dd && k < dd->n_buckets; k++) {
        deft_ddp_bucket *b = &dd->buckets[k];
        if (!b->issued || b->joined || (b->join != step && step != p->n_steps)) continue;
        deft_status j = deft_nccl_stream_after(dd->device, p->gpu->stream, dd->stream, b->done);
        b->joined = true;
        if (s == DEFT_OK) s = j;
    }
    return s;
}

deft_status deft_ddp_before_step(deft_program *p, int step) { return deft_ddp_join(p, step); }

deft_status deft_ddp_end_run(deft_program *p) { return deft_ddp_join(p, p->n_steps); }

deft_status deft_ddp_wait(deft_program *p) {
    deft_ddp *dd = p->ddp;
    if (!dd) return DEFT_OK;
    return deft_nccl_wait_stream(dd->dist, dd->local, p->gpu->stream);
}

deft_status deft_program_dist_synchronize(deft_program *p) {
    if (!p) return deft_set_error(DEFT_ERR_INVALID, "dist_synchronize: program is NULL");
    if (!p->ddp) return deft_set_error(DEFT_ERR_STATE, "dist_synchronize: the program is not a data parallel replica "
                                       "(compile it with the option dist)");
    return deft_ddp_wait(p);
}

static const deft_replica_hooks deft_ddp_hooks = {
    .attach = deft_ddp_attach,
    .shard = deft_zero_shard,
    .free = deft_ddp_free,
    .check_run = deft_ddp_check_run,
    .begin_run = deft_ddp_begin_run,
    .before_step = deft_ddp_before_step,
    .after_step = deft_ddp_after_step,
    .end_run = deft_ddp_end_run,
    .wait = deft_ddp_wait,
};

void deft_ddp_register(void) { deft_replica_hooks_register(&deft_ddp_hooks); }
