/* The gather tables of an optimizer on a GPU: for each set of gradient addresses a run has met, one device table of
 * (source, offset, count, dtype) rows that the optimizer's kernels read, so that one launch reads every gradient
 * where the backward pass left it (a ZeRO-1 step of several ranks needs none: the replica's reduces left this rank's
 * pieces in its flat gradients). A small cache per optimizer, built when a program is compiled
 * (runtime/kernel_prepare.c) or, for addresses met later, at a run outside a capture, and freed with the optimizer
 * (runtime/optimizer_storage.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "caching_allocator.h"
#include "cuda_kernels.h"
#include "device_internal.h"
#include "optimizer.h"
#include "optimizer_run.h"

static deft_status deft_opt_cuda_fail(cudaError_t e, const char *what) {
    (void)cudaGetLastError();
    return deft_set_error(DEFT_ERR_RUNTIME, "optimizer: %s failed: %s", what, cudaGetErrorString(e));
}

/* True when `st` is capturing, or when the runtime cannot say (then building a table would break the capture). */
static bool deft_opt_capturing(cudaStream_t st) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(st, &cs);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* The sources a node of `o` reads: its parameters' gradients, or for a finisher the pieces' sums. */
static int deft_opt_entries(const deft_optimizer *o) {
    return o->part && o->part->finisher ? o->part->n_pieces : o->n_params;
}

/* Row i of o's gather table for source address src, holding dtype dt. */
static deft_optimizer_segment deft_opt_row(const deft_optimizer *o, int i, const void *src, deft_dtype dt) {
    deft_optimizer_segment r;
    r.src = src;
    r.dtype = (int32_t)dt;
    r.pad = 0;
    if (o->part && o->part->finisher) {
        const deft_optimizer *w = o->part->whole;
        const int first = o->part->piece_first_param[i];
        r.offset = w->block_first[first];
        r.count = w->block_first[first + o->part->piece_n_params[i]] - r.offset;
    } else {
        r.offset = o->offsets[i];
        r.count = deft_shape_numel(o->params[i]->ndim, o->params[i]->shape);
    }
    return r;
}

/* The table built before for these gradient addresses and dtypes (a compare on the host, no device call), or NULL. */
static const deft_optimizer_segment *deft_opt_known_table(deft_optimizer *o, const void *const *grads,
                                                          const deft_dtype *dts) {
    const size_t ptr_bytes = (size_t)deft_opt_entries(o) * sizeof *grads;
    const size_t dt_bytes = (size_t)deft_opt_entries(o) * sizeof *dts;
    for (int i = 0; i < o->n_gathers; i++) {
        deft_optimizer_gather *e = &o->gathers[i];
        if (memcmp(e->grads, grads, ptr_bytes) == 0 && memcmp(e->dtypes, dts, dt_bytes) == 0) {
            e->last_used = ++o->gather_clock;
            return e->table;
        }
    }
    return NULL;
}

/* Copies the table for `grads` into e->table and waits for the copy (the host rows are freed at once). */
static deft_status deft_opt_fill_table(deft_optimizer *o, deft_optimizer_gather *e, const void *const *grads,
                                       const deft_dtype *dts, cudaStream_t st) {
    const size_t table_bytes = (size_t)deft_opt_entries(o) * sizeof(deft_optimizer_segment);
    deft_optimizer_segment *host = (deft_optimizer_segment *)malloc(table_bytes ? table_bytes : 1);
    if (!host) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    for (int i = 0; i < deft_opt_entries(o); i++) host[i] = deft_opt_row(o, i, grads[i], dts[i]);
    cudaError_t ce = cudaMemcpyAsync(e->table, host, table_bytes, cudaMemcpyHostToDevice, st);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(st);
    free(host);
    return ce == cudaSuccess ? DEFT_OK : deft_opt_cuda_fail(ce, "copying the gather table");
}

/* A new entry: registered only once its table is on the device, so that a failure (out of memory under a limit,
 * say) leaves the cache as it was and the next run simply tries again. */
static deft_status deft_opt_new_table(deft_optimizer *o, const void *const *grads, const deft_dtype *dts,
                                      cudaStream_t st, const deft_optimizer_segment **out) {
    const size_t ptr_bytes = (size_t)deft_opt_entries(o) * sizeof *grads;
    const size_t dt_bytes = (size_t)deft_opt_entries(o) * sizeof *dts;
    deft_optimizer_gather e;
    memset(&e, 0, sizeof e);
    e.grads = (const void **)malloc(ptr_bytes ? ptr_bytes : 1);
    e.dtypes = (deft_dtype *)malloc(dt_bytes ? dt_bytes : 1);
    if (!e.grads || !e.dtypes) {
        free(e.grads);
        free(e.dtypes);
        return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    }
    void *table = NULL;
    deft_status s = deft_caching_alloc(o->device, (size_t)deft_opt_entries(o) * sizeof(deft_optimizer_segment), st,
                                       "optimizer.gather", &table);
    e.table = (deft_optimizer_segment *)table;
    if (s == DEFT_OK) s = deft_opt_fill_table(o, &e, grads, dts, st);
    if (s != DEFT_OK) {
        (void)deft_caching_free(o->device, table);
        free(e.grads);
        free(e.dtypes);
        return s;
    }
    memcpy(e.grads, grads, ptr_bytes);
    memcpy(e.dtypes, dts, dt_bytes);
    e.last_used = ++o->gather_clock;
    o->gathers[o->n_gathers++] = e;
    *out = e.table;
    return DEFT_OK;
}

/* Refills the least recently used table; another program's queued step may still read it, hence the device wait.
 * Until the copy is done the entry matches no addresses, so a failure leaves nothing half built. */
static deft_status deft_opt_reuse_table(deft_optimizer *o, const void *const *grads, const deft_dtype *dts,
                                        cudaStream_t st, const deft_optimizer_segment **out) {
    deft_optimizer_gather *e = &o->gathers[0];
    for (int i = 1; i < o->n_gathers; i++)
        if (o->gathers[i].last_used < e->last_used) e = &o->gathers[i];
    deft_status s = deft_device_synchronize(o->device);
    if (s != DEFT_OK) return s;
    const size_t ptr_bytes = (size_t)deft_opt_entries(o) * sizeof *grads;
    memset(e->grads, 0, ptr_bytes);
    s = deft_opt_fill_table(o, e, grads, dts, st);
    if (s != DEFT_OK) return s;
    memcpy(e->grads, grads, ptr_bytes);
    memcpy(e->dtypes, dts, (size_t)deft_opt_entries(o) * sizeof *dts);
    e->last_used = ++o->gather_clock;
    *out = e->table;
    return DEFT_OK;
}

/* The device gather table for these gradient addresses: one built before, or a new one. Building waits for the
 * stream: it happens on a program's first run, never during a capture. */
static deft_status deft_opt_gather_table_of(deft_optimizer *o, const void *const *grads, const deft_dtype *dts,
                                         cudaStream_t st, const deft_optimizer_segment **out) {
    *out = deft_opt_known_table(o, grads, dts);
    if (*out) return DEFT_OK;
    if (deft_opt_capturing(st))
        return deft_set_error(DEFT_ERR_STATE, "optimizer: the gradients sit at addresses this optimizer has not seen "
                              "while its stream is capturing a CUDA Graph; run the step once eagerly first");
    deft_status s = o->n_gathers < DEFT_OPTIMIZER_GATHER_CACHE ? deft_opt_new_table(o, grads, dts, st, out)
                                                                : deft_opt_reuse_table(o, grads, dts, st, out);
    if (s == DEFT_OK) return DEFT_OK;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", deft_errmsg());
    return deft_set_error(s, "optimizer %s: building its gather table: %s", o->step_node->name, msg);
}

/* The dtypes of a node's sources (n of them), for the gather table's rows: a finisher's are the pieces' f64 sums. Small
 * steps use `small`; *out is to be freed when it is not `small`. */
#define DEFT_OPT_SMALL 64
static deft_status deft_opt_src_dtypes(deft_tensor *const *srcs, int n, deft_dtype *small, deft_dtype **out) {
    *out = n <= DEFT_OPT_SMALL ? small : (deft_dtype *)malloc((size_t)n * sizeof **out);
    if (!*out) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    for (int i = 0; i < n; i++) (*out)[i] = srcs[i]->dtype;
    return DEFT_OK;
}

/* The gather table for this run's gradients, at grads in their sources' dtypes. */
static deft_status deft_opt_table_for(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads,
                                      cudaStream_t st, const deft_optimizer_segment **table) {
    deft_dtype small[DEFT_OPT_SMALL], *dts = NULL;
    deft_status s = deft_opt_src_dtypes(srcs, deft_opt_entries(o), small, &dts);
    if (s == DEFT_OK) s = deft_opt_gather_table_of(o, grads, dts, st, table);
    if (dts != small) free(dts);
    return s;
}

/* The checks every GPU run of o makes before its table is built. */
static deft_status deft_opt_check_run(deft_optimizer *o, const void *const *grads) {
    if (o->part) {
        const deft_optimizer *w = o->part->whole;
        if (!w->dev || !w->dev_blocks || !w->step_node)
            return deft_set_error(DEFT_ERR_STATE, "optimizer: a part of a step run before the step's device state");
        for (int i = 0; i < deft_opt_entries(o); i++)
            if (!grads[i])
                return deft_set_error(DEFT_ERR_INVALID, "optimizer %s: source %d of a part of the step has no storage",
                                      w->step_node->name, i);
        return deft_cuda_set_device(o->device.index);
    }
    if (!o->step_node) return deft_set_error(DEFT_ERR_STATE, "optimizer: run before its step node was built");
    if (!o->dev) return deft_set_error(DEFT_ERR_STATE, "optimizer %s: no device state on the GPU", o->step_node->name);
    if (o->total <= 0 || o->n_params <= 0)
        return deft_set_error(DEFT_ERR_STATE, "optimizer %s: no parameters", o->step_node->name);
    for (int i = 0; i < o->n_params; i++)
        if (!grads[i] && deft_shape_numel(o->params[i]->ndim, o->params[i]->shape) > 0)
            return deft_set_error(DEFT_ERR_INVALID, "optimizer %s: the gradient of %s has no storage",
                                  o->step_node->name, o->params[i]->name);
    return deft_cuda_set_device(o->device.index);
}

/* A sharded step in a world of several ranks reads nothing but the flat gradients, where the replica's reduces put
 * this rank's pieces during the backward pass: no table. */
static bool deft_opt_reads_reduced(const deft_optimizer *o) {
    return !o->part && deft_optimizer_sharded(o) && o->zero.world > 1;
}

deft_status deft_optimizer_cuda_run(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads, void *out,
                                    void *stream) {
    const deft_optimizer_segment *table = NULL;
    deft_status s = deft_opt_check_run(o, grads);
    if (s == DEFT_OK && !deft_opt_reads_reduced(o))
        s = deft_opt_table_for(o, srcs, grads, (cudaStream_t)stream, &table);
    if (s != DEFT_OK) return s;
    return o->part ? deft_cuda_optimizer_part_run(o, table, out, stream) : deft_cuda_optimizer_run(o, table, out, stream);
}

deft_status deft_optimizer_cuda_prepare(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads,
                                        void *stream) {
    if (deft_opt_reads_reduced(o) || deft_opt_check_run(o, grads) != DEFT_OK) return DEFT_OK;
    const deft_optimizer_segment *table = NULL;
    return deft_opt_table_for(o, srcs, grads, (cudaStream_t)stream, &table);
}
