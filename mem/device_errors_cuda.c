/* The device error records (mem/device_errors.h): one small cudaMalloc per GPU, made on first use and kept for
 * the life of the process, like cuBLAS handles. They bypass the caching allocator on purpose: a record must exist
 * for the data checks to run at all, so neither a memory limit nor the allocator's statistics should see it. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "device_errors.h"
#include "device_internal.h"
#include "base.h"

static deft_device_errors *deft_error_records[DEFT_DEVICE_ERRORS_MAX_DEVICES];
static pthread_mutex_t deft_error_records_mu = PTHREAD_MUTEX_INITIALIZER;

static deft_status deft_errors_fail(cudaError_t e, const char *what, int device) {
    (void)cudaGetLastError();
    return deft_set_error(e == cudaErrorMemoryAllocation ? DEFT_ERR_OOM : DEFT_ERR_RUNTIME,
                          "device error record on cuda:%d: %s failed: %s (%s)", device, what, cudaGetErrorString(e),
                          cudaGetErrorName(e));
}

/* Makes `device` current and remembers the caller's, so that reading a record moves no thread's device. */
static deft_status deft_errors_enter(int device, int *prev) {
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess) return deft_errors_fail(e, "cudaGetDevice", device);
    if (*prev == device) return DEFT_OK;
    e = cudaSetDevice(device);
    return e == cudaSuccess ? DEFT_OK : deft_errors_fail(e, "cudaSetDevice", device);
}

static void deft_errors_leave(int device, int prev) {
    if (prev != device && cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
}

/* Sets the record to "no error" and waits until that is done: the legacy stream orders the reset before any later
 * kernel on a blocking stream, and the wait covers non-blocking ones too. */
static cudaError_t deft_errors_clear(deft_device_errors *rec) {
    cudaError_t e = cudaMemset(rec, 0xff, sizeof *rec);
    return e == cudaSuccess ? cudaStreamSynchronize(0) : e;
}

static deft_status deft_errors_create(int device, void *stream, deft_device_errors **out) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (stream && cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        cs = cudaStreamCaptureStatusActive;
    }
    if (cs != cudaStreamCaptureStatusNone)
        return deft_set_error(DEFT_ERR_STATE, "the device error record of cuda:%d is created on first use, which a "
                              "CUDA Graph capture forbids; run the step once eagerly first", device);
    int prev;
    deft_status s = deft_errors_enter(device, &prev);
    if (s != DEFT_OK) return s;
    void *mem = NULL;
    cudaError_t e = cudaMalloc(&mem, sizeof(deft_device_errors));
    if (e == cudaSuccess) {
        e = deft_errors_clear(mem);
        if (e != cudaSuccess) {
            s = deft_errors_fail(e, "clearing", device);
            if (cudaFree(mem) != cudaSuccess) (void)cudaGetLastError();
        } else {
            *out = mem;
        }
    } else {
        s = deft_errors_fail(e, "cudaMalloc", device);
    }
    deft_errors_leave(device, prev);
    return s;
}

deft_status deft_device_errors_get(int device, void *stream, deft_device_errors **out) {
    *out = NULL;
    if (device < 0 || device >= DEFT_DEVICE_ERRORS_MAX_DEVICES)
        return deft_set_error(DEFT_ERR_DEVICE, "cuda:%d is past the %d devices whose data errors deft records",
                              device, DEFT_DEVICE_ERRORS_MAX_DEVICES);
    pthread_mutex_lock(&deft_error_records_mu);
    *out = deft_error_records[device];
    pthread_mutex_unlock(&deft_error_records_mu);
    if (*out) return DEFT_OK;
    /* Made outside the lock: making one waits for the device, and a thread holding the lock through that wait would
     * stop every other thread's first use, on any device, until this device's queued work is done. */
    deft_device_errors *made = NULL;
    deft_status s = deft_errors_create(device, stream, &made);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&deft_error_records_mu);
    if (!deft_error_records[device]) deft_error_records[device] = made, made = NULL;
    *out = deft_error_records[device];
    pthread_mutex_unlock(&deft_error_records_mu);
    if (made && cudaFree(made) != cudaSuccess) (void)cudaGetLastError();   /* another thread's came first */
    return DEFT_OK;
}

/* A gather's bad index: the lowest position any such kernel saw since the last read. */
static deft_status deft_errors_report_gather(const deft_device_errors *r, int device) {
    const int index = (int)(int32_t)(uint32_t)(r->gather_bad & 0xffffffffull);
    const long long pos = (long long)(r->gather_bad >> 32);
    const bool embedding = r->gather_op == DEFT_GATHER_ERR_EMBEDDING;
    return deft_set_error(DEFT_ERR_INVALID,
                          "%s: %s %d at position %lld is outside [0, %lld) (found on cuda:%d by a run since the last "
                          "read; the rows it selected are NaN, and nothing is summed for it in the gradient)",
                          embedding ? "embedding" : "index_select", embedding ? "token id" : "index", index, pos,
                          r->gather_rows, device);
}

static deft_status deft_errors_report(const deft_device_errors *r, int device) {
    if (r->ce_bad == DEFT_DEVICE_ERRORS_NONE) return deft_errors_report_gather(r, device);
    const int target = (int)(int32_t)(uint32_t)(r->ce_bad & 0xffffffffull);
    const long long row = (long long)(r->ce_bad >> 32);
    return deft_set_error(DEFT_ERR_INVALID,
                          "cross_entropy: target %d of row %lld is outside [0, %lld) (found on cuda:%d by a run since "
                          "the last read; the loss and gradients of that run are NaN)",
                          target, row, r->ce_classes, device);
}

deft_status deft_device_errors_take(int device) {
    if (device < 0 || device >= DEFT_DEVICE_ERRORS_MAX_DEVICES) return DEFT_OK;   /* no record can exist */
    pthread_mutex_lock(&deft_error_records_mu);
    deft_device_errors *rec = deft_error_records[device];
    pthread_mutex_unlock(&deft_error_records_mu);
    if (!rec) return DEFT_OK;
    int prev;
    deft_status s = deft_errors_enter(device, &prev);
    if (s != DEFT_OK) return s;
    deft_device_errors r;
    memset(&r, 0xff, sizeof r);   /* no error recorded */
    cudaError_t e = cudaMemcpy(&r, rec, sizeof r, cudaMemcpyDeviceToHost);
    const bool bad = r.ce_bad != DEFT_DEVICE_ERRORS_NONE || r.gather_bad != DEFT_DEVICE_ERRORS_NONE;
    if (e != cudaSuccess) s = deft_errors_fail(e, "reading", device);
    else if (bad && (e = deft_errors_clear(rec)) != cudaSuccess)
        s = deft_errors_fail(e, "clearing", device);
    deft_errors_leave(device, prev);
    if (s != DEFT_OK || !bad) return s;
    return deft_errors_report(&r, device);
}

void deft_device_errors_release(int device) {
    if (device < 0 || device >= DEFT_DEVICE_ERRORS_MAX_DEVICES) return;
    pthread_mutex_lock(&deft_error_records_mu);
    deft_device_errors *rec = deft_error_records[device];
    deft_error_records[device] = NULL;
    pthread_mutex_unlock(&deft_error_records_mu);
    if (rec && cudaFree(rec) != cudaSuccess) (void)cudaGetLastError();
}
