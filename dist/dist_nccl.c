/* The NCCL calls of data parallel training (dist/dist.h). Communicators made for one rank of several processes
 * are non-blocking (config.blocking = 0): every call may answer ncclInProgress, and the host then polls
 * ncclCommGetAsyncError until the call is through, an error comes, or the deadline passes, when every communicator
 * is aborted (ncclCommAbort). So a peer that never joins or stops answering is an error here, never a hang. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "device_internal.h"
#include "cuda_kernels.h"
#include "cuda_tuning.h"
#include "dist.h"
#include "graph_internal.h"
#include "optimizer.h"

int deft_has_nccl_build(void) { return 1; }

static void deft_nccl_nap(void) {
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

static deft_status deft_nccl_fail(deft_dist *d, ncclResult_t r, const char *what, int local) {
    char msg[480];
    snprintf(msg, sizeof msg, "%s on rank %d (cuda:%d) failed: %s (%s)", what, d->rank[local], d->device[local],
             ncclGetErrorString(r), ncclGetLastError(NULL));
    deft_dist_abort(d, msg);
    return deft_set_error(DEFT_ERR_RUNTIME, "%s; the communicators were aborted", msg);
}

static deft_status deft_nccl_late(deft_dist *d, const char *what, int local) {
    char msg[480];
    snprintf(msg, sizeof msg, "%s: rank %d of %d waited more than %.3g s for its peers (one did not arrive, stopped or "
             "died)", what, d->rank[local], d->world, d->timeout_s);
    deft_dist_abort(d, msg);
    return deft_set_error(DEFT_ERR_RUNTIME, "%s; the communicators were aborted", msg);
}

/* Waits until communicator `local` has finished the call that answered r, within the deadline. */
static deft_status deft_nccl_settle(deft_dist *d, int local, ncclResult_t r, const char *what) {
    const double deadline = deft_dist_now() + d->timeout_s;
    while (r == ncclInProgress) {
        if (deft_dist_now() > deadline) return deft_nccl_late(d, what, local);
        deft_nccl_nap();
        ncclResult_t q = ncclCommGetAsyncError((ncclComm_t)d->comm[local], &r);
        if (q != ncclSuccess) r = q;
    }
    return r == ncclSuccess ? DEFT_OK : deft_nccl_fail(d, r, what, local);
}

static deft_status deft_nccl_cuda(cudaError_t e, const char *what, int device) {
    if (e == cudaSuccess) return DEFT_OK;
    (void)cudaGetLastError();
    return deft_set_error(DEFT_ERR_RUNTIME, "%s on cuda:%d failed: %s", what, device, cudaGetErrorString(e));
}

deft_status deft_nccl_unique_id(void *blob) {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return deft_set_error(DEFT_ERR_RUNTIME, "ncclGetUniqueId failed: %s (%s)", ncclGetErrorString(r),
                              ncclGetLastError(NULL));
    memcpy(blob, &id, sizeof id < DEFT_DIST_ID_BYTES ? sizeof id : DEFT_DIST_ID_BYTES);
    return DEFT_OK;
}

/* The communicators' configuration: d->blocks blocks per collective (NCCL refuses a least count without a most one). */
static ncclConfig_t deft_nccl_config(const deft_dist *d) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.minCTAs = cfg.maxCTAs = d->blocks;
    return cfg;
}

/* Every GPU in this process: nobody can fail to arrive, so the communicators are blocking ones, made in one group
 * (each ncclCommInitRankConfig would otherwise wait for the ranks after it). */
deft_status deft_nccl_init_local(deft_dist *d) {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    ncclConfig_t cfg = deft_nccl_config(d);
    ncclComm_t comms[DEFT_DIST_MAX_LOCAL] = {0};
    if (r == ncclSuccess) r = ncclGroupStart();
    if (r == ncclSuccess) {
        for (int i = 0; i < d->n_local && r == ncclSuccess; i++) {
            if (deft_cuda_set_device(d->device[i]) != DEFT_OK) r = ncclUnhandledCudaError;
            else r = ncclCommInitRankConfig(&comms[i], d->n_local, id, i, &cfg);
        }
        const ncclResult_t end = ncclGroupEnd();   /* always: the group must be closed */
        if (r == ncclSuccess) r = end;
    }
    if (r != ncclSuccess) {
        for (int i = 0; i < d->n_local; i++)
            if (comms[i]) (void)ncclCommDestroy(comms[i]);
        return deft_set_error(DEFT_ERR_RUNTIME, "ncclCommInitRankConfig over %d GPUs failed: %s (%s)", d->n_local,
                              ncclGetErrorString(r), ncclGetLastError(NULL));
    }
    for (int i = 0; i < d->n_local; i++) d->comm[i] = comms[i];
    d->nonblocking = false;
    return DEFT_OK;
}

deft_status deft_nccl_init_rank(deft_dist *d, const void *id_blob) {
    deft_status s = deft_cuda_set_device(d->device[0]);
    if (s != DEFT_OK) return s;
    ncclUniqueId id;
    memcpy(&id, id_blob, sizeof id);
    ncclConfig_t cfg = deft_nccl_config(d);
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, d->world, id, d->rank[0], &cfg);
    d->comm[0] = comm;
    d->nonblocking = true;
    if (r != ncclSuccess && r != ncclInProgress && !comm)
        return deft_set_error(DEFT_ERR_RUNTIME, "ncclCommInitRankConfig on rank %d failed: %s (%s)", d->rank[0],
                              ncclGetErrorString(r), ncclGetLastError(NULL));
    return deft_nccl_settle(d, 0, r, "ncclCommInitRankConfig");
}

void deft_dist_abort(deft_dist *d, const char *why) {
    if (!d->aborted) snprintf(d->failure, sizeof d->failure, "%s", why);
    d->aborted = true;
    for (int i = 0; i < d->n_local; i++)
        if (d->comm[i]) {
            (void)ncclCommAbort((ncclComm_t)d->comm[i]);
            d->comm[i] = NULL;
        }
}

void deft_nccl_destroy(deft_dist *d) {
    for (int i = 0; i < d->n_local; i++) {
        if (!d->comm[i]) continue;
        if (d->nonblocking &&
            deft_nccl_settle(d, i, ncclCommFinalize((ncclComm_t)d->comm[i]), "ncclCommFinalize") != DEFT_OK)
            return;   /* settle aborted them all */
        (void)ncclCommDestroy((ncclComm_t)d->comm[i]);
        d->comm[i] = NULL;
    }
}

static ncclDataType_t deft_nccl_type(deft_dtype dt) {
    switch (dt) {
    case DEFT_F64: return ncclFloat64;
    case DEFT_F16: return ncclFloat16;
    case DEFT_BF16: return ncclBfloat16;
    case DEFT_I32: return ncclInt32;
    default: return ncclFloat32;
    }
}

/* One NCCL group over the buffers: NCCL aggregates the group's operations into one launch. */
static deft_status deft_nccl_group(deft_dist *d, int local, const deft_dist_buffers *b, void *stream, bool reduce) {
    const char *what = reduce ? "ncclAllReduce (average of the gradients)" : "ncclBroadcast (rank 0's parameters)";
    if (d->aborted) return deft_set_error(DEFT_ERR_RUNTIME, "%s: the communicators were aborted: %s", what, d->failure);
    deft_status s = deft_cuda_set_device(d->device[local]);
    if (s != DEFT_OK) return s;
    if ((s = deft_dist_gate_pass(d, local, what)) != DEFT_OK) return s;
    ncclComm_t comm = (ncclComm_t)d->comm[local];
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < b->n && (r == ncclSuccess || r == ncclInProgress); i++)
        r = reduce ? ncclAllReduce(b->data[i], b->data[i], b->count[i], deft_nccl_type(b->dtype[i]), ncclAvg, comm,
                                   (cudaStream_t)stream)
                   : ncclBroadcast(b->data[i], b->data[i], b->count[i], deft_nccl_type(b->dtype[i]), 0, comm,
                                   (cudaStream_t)stream);
    ncclResult_t end = ncclGroupEnd();   /* always: the group must be closed */
    if (r != ncclSuccess && r != ncclInProgress) return deft_nccl_fail(d, r, what, local);
    s = deft_nccl_settle(d, local, end, what);
    return s == DEFT_OK ? deft_dist_gate_pass(d, local, what) : s;
}

deft_status deft_nccl_all_reduce_avg(deft_dist *d, int local, const deft_dist_buffers *b, void *stream) {
    return deft_nccl_group(d, local, b, stream, true);
}

deft_status deft_nccl_all_reduce_packed(deft_dist *d, int local, const deft_dist_buffers *b, const size_t *offset,
                                        const size_t *bytes, void *packed, size_t packed_bytes, void *stream) {
    const char *what = "ncclAllReduce (average of a packed bucket)";
    if (d->aborted) return deft_set_error(DEFT_ERR_RUNTIME, "%s: the communicators were aborted: %s", what, d->failure);
    deft_status s = deft_cuda_set_device(d->device[local]);
    if (s == DEFT_OK) s = deft_cuda_dist_pack(b->data, offset, bytes, b->n, packed, 0, stream);
    if (s == DEFT_OK) {
        s = deft_dist_gate_pass(d, local, what);
    }
    if (s == DEFT_OK) {
        const size_t count = packed_bytes / deft_dtype_size(b->dtype[0]);
        ncclResult_t r = ncclAllReduce(packed, packed, count, deft_nccl_type(b->dtype[0]), ncclAvg,
                                       (ncclComm_t)d->comm[local], (cudaStream_t)stream);
        s = deft_nccl_settle(d, local, r, what);
        if (s == DEFT_OK) s = deft_dist_gate_pass(d, local, what);
    }
    if (s == DEFT_OK) s = deft_cuda_dist_pack(b->data, offset, bytes, b->n, packed, 1, stream);
    return s;
}

/* The checks before one of ZeRO-1's collectives (the step's in place: the slice of rank r at buf + r * shard), and
 * the gate before it. */
static deft_status deft_nccl_zero_call(deft_dist *d, int local, const char *what) {
    if (d->aborted) return deft_set_error(DEFT_ERR_RUNTIME, "%s: the communicators were aborted: %s", what, d->failure);
    deft_status s = deft_cuda_set_device(d->device[local]);
    return s == DEFT_OK ? deft_dist_gate_pass(d, local, what) : s;
}

/* A queued collective settled, and the gate after it. */
static deft_status deft_nccl_zero_done(deft_dist *d, int local, ncclResult_t r, const char *what) {
    deft_status s = deft_nccl_settle(d, local, r, what);
    return s == DEFT_OK ? deft_dist_gate_pass(d, local, what) : s;
}

deft_status deft_nccl_reduce_avg(deft_dist *d, int local, const deft_dist_reduces *red, void *stream) {
    const char *what = "ncclReduce (ZeRO-1: the average of a bucket's gradients, to their owners)";
    deft_status s = deft_nccl_zero_call(d, local, what);
    if (s != DEFT_OK) return s;
    ncclComm_t comm = (ncclComm_t)d->comm[local];
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < red->n && (r == ncclSuccess || r == ncclInProgress); i++)
        r = ncclReduce(red->send[i], red->recv[i], red->count[i], deft_nccl_type(red->dtype[i]), ncclAvg,
                       red->root[i], comm, (cudaStream_t)stream);
    ncclResult_t end = ncclGroupEnd();   /* always: the group must be closed */
    if (r != ncclSuccess && r != ncclInProgress) return deft_nccl_fail(d, r, what, local);
    return deft_nccl_zero_done(d, local, end, what);
}

deft_status deft_nccl_all_reduce_sum_f64(deft_dist *d, int local, double *x, void *stream) {
    const char *what = "ncclAllReduce (ZeRO-1: the gradient norm's sum of squares)";
    deft_status s = deft_nccl_zero_call(d, local, what);
    if (s != DEFT_OK) return s;
    ncclResult_t r = ncclAllReduce(x, x, 1, ncclFloat64, ncclSum, (ncclComm_t)d->comm[local], (cudaStream_t)stream);
    return deft_nccl_zero_done(d, local, r, what);
}

deft_status deft_nccl_all_gather(deft_dist *d, int local, void *buf, size_t shard, deft_dtype dt, void *stream) {
    const char *what = "ncclAllGather (ZeRO-1: the updated parameters)";
    deft_status s = deft_nccl_zero_call(d, local, what);
    if (s != DEFT_OK) return s;
    const char *mine = (const char *)buf + (size_t)d->rank[local] * shard * deft_dtype_size(dt);
    ncclResult_t r = ncclAllGather(mine, buf, shard, deft_nccl_type(dt), (ncclComm_t)d->comm[local],
                                   (cudaStream_t)stream);
    return deft_nccl_zero_done(d, local, r, what);
}

deft_status deft_nccl_broadcast_pieces(deft_dist *d, int local, void *buf, const deft_zero_f32_piece *pieces,
                                       int n, deft_dtype dt, void *stream) {
    const char *what = "ncclBroadcast (ZeRO-1: the f32 parameters read in f32, from their owners)";
    deft_status s = deft_nccl_zero_call(d, local, what);
    if (s != DEFT_OK) return s;
    ncclComm_t comm = (ncclComm_t)d->comm[local];
    const size_t esz = deft_dtype_size(dt);
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
        char *at = (char *)buf + (size_t)pieces[i].lo * esz;
        r = ncclBroadcast(at, at, (size_t)(pieces[i].hi - pieces[i].lo), deft_nccl_type(dt), pieces[i].root, comm,
                          (cudaStream_t)stream);
    }
    ncclResult_t end = ncclGroupEnd();   /* always: the group must be closed */
    if (r != ncclSuccess && r != ncclInProgress) return deft_nccl_fail(d, r, what, local);
    return deft_nccl_zero_done(d, local, end, what);
}

deft_status deft_nccl_gather_whole(deft_dist *d, int n, const int *locals, void *const *bufs, size_t shard,
                                   deft_dtype dt, void *const *streams) {
    const char *what = "ncclAllGather (deft_dist_gather_params: the f32 parameters)";
    if (d->aborted) return deft_set_error(DEFT_ERR_RUNTIME, "%s: the communicators were aborted: %s", what, d->failure);
    const size_t esz = deft_dtype_size(dt);
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
        const int l = locals[i];
        if (deft_cuda_set_device(d->device[l]) != DEFT_OK) {
            (void)ncclGroupEnd();
            return deft_set_error(DEFT_ERR_RUNTIME, "%s: cuda:%d cannot be made current", what, d->device[l]);
        }
        const char *mine = (const char *)bufs[i] + (size_t)d->rank[l] * shard * esz;
        r = ncclAllGather(mine, bufs[i], shard, deft_nccl_type(dt), (ncclComm_t)d->comm[l], (cudaStream_t)streams[i]);
    }
    ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return deft_nccl_fail(d, r, what, locals[0]);
    deft_status s = DEFT_OK;
    for (int i = 0; i < n && s == DEFT_OK; i++) s = deft_nccl_settle(d, locals[i], end, what);
    for (int i = 0; i < n && s == DEFT_OK; i++) s = deft_nccl_wait_stream(d, locals[i], streams[i]);
    return s;
}

deft_status deft_nccl_zero(int device, void *ptr, size_t bytes) {
    deft_status s = deft_cuda_set_device(device);
    if (s == DEFT_OK) s = deft_nccl_cuda(cudaMemset(ptr, 0, bytes), "cudaMemset (a packed bucket)", device);
    return s;
}

deft_status deft_nccl_broadcast0(deft_dist *d, int local, const deft_dist_buffers *b, void *stream) {
    return deft_nccl_group(d, local, b, stream, false);
}

deft_status deft_nccl_wait_stream(deft_dist *d, int local, void *stream) {
    if (d->aborted) return deft_set_error(DEFT_ERR_RUNTIME, "data parallel: the communicators were aborted: %s",
                                          d->failure);
    deft_status s = deft_cuda_set_device(d->device[local]);
    if (s != DEFT_OK) return s;
    const double deadline = deft_dist_now() + d->timeout_s;
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess) return DEFT_OK;
        if (e != cudaErrorNotReady) return deft_nccl_cuda(e, "cudaStreamQuery (a data parallel step)", d->device[local]);
        ncclResult_t async = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError((ncclComm_t)d->comm[local], &async);
        if (q != ncclSuccess) return deft_nccl_fail(d, q, "ncclCommGetAsyncError", local);
        if (async != ncclSuccess && async != ncclInProgress)
            return deft_nccl_fail(d, async, "a collective of the step", local);
        if (deft_dist_now() > deadline) return deft_nccl_late(d, "data parallel step", local);
        deft_nccl_nap();
    }
}

deft_status deft_nccl_stream_new(int device, void **stream) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    int least = 0, greatest = 0;
    cudaStream_t st;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    /* The highest priority: a bucket's all-reduce should start as soon as it can, between backward kernels. */
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&st, cudaStreamDefault, greatest);
    s = deft_nccl_cuda(e, "cudaStreamCreateWithPriority", device);
    if (s == DEFT_OK) *stream = st;
    return s;
}

void deft_nccl_stream_free(int device, void *stream) {
    if (!stream || deft_cuda_set_device(device) != DEFT_OK) return;
    if (cudaStreamDestroy((cudaStream_t)stream) != cudaSuccess) (void)cudaGetLastError();
}

deft_status deft_nccl_event_new(int device, void **event) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaEvent_t ev;
    s = deft_nccl_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate", device);
    if (s == DEFT_OK) *event = ev;
    return s;
}

void deft_nccl_event_free(int device, void *event) {
    if (!event || deft_cuda_set_device(device) != DEFT_OK) return;
    if (cudaEventDestroy((cudaEvent_t)event) != cudaSuccess) (void)cudaGetLastError();
}

deft_status deft_nccl_stream_after(int device, void *waiter, void *stream, void *event) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    s = deft_nccl_cuda(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream), "cudaEventRecord", device);
    if (s == DEFT_OK)
        s = deft_nccl_cuda(cudaStreamWaitEvent((cudaStream_t)waiter, (cudaEvent_t)event, 0), "cudaStreamWaitEvent",
                           device);
    return s;
}
