/* The CUDA side of device_internal.h, through the CUDA runtime API.
 *
 * Nothing here runs at load time: the runtime (and its driver context) starts on the first call that needs it, so a
 * program that only uses the CPU never pays for CUDA and never fails for the lack of a driver.
 *
 * CUDA_VISIBLE_DEVICES is honoured by the runtime itself: it renumbers the visible GPUs from 0, so cuda:N here is the
 * N-th visible GPU and every count and index below is already in that numbering. */
#include <stdatomic.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "device_internal.h"
#include "base.h"

static atomic_int deft_cuda_was_started;
/* -1 until asked: the count cannot change within a process, and asking the driver costs a call each time. */
static atomic_int deft_cuda_cached_count = -1;

static void deft_cuda_mark_started(void) { atomic_store(&deft_cuda_was_started, 1); }

int deft_cuda_started(void) { return atomic_load(&deft_cuda_was_started); }

int deft_cuda_count(void) {
    deft_cuda_mark_started();
    int cached = atomic_load(&deft_cuda_cached_count);
    if (cached >= 0) return cached;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        /* No driver, no device, or a driver older than the runtime: all mean "no usable GPU", not a failure.
         * The error is cleared so that it does not surface from a later, unrelated call. */
        (void)cudaGetLastError();
        n = 0;
    }
    atomic_store(&deft_cuda_cached_count, n);
    return n;
}

/* DEFT_ERR_RUNTIME with the CUDA error string; clears the (non-sticky) error so later calls start clean. */
static deft_status deft_cuda_fail(cudaError_t e, const char *what, int index) {
    (void)cudaGetLastError();
    return deft_set_error(DEFT_ERR_RUNTIME, "%s on cuda:%d failed: %s (%s)", what, index, cudaGetErrorString(e),
                          cudaGetErrorName(e));
}

static deft_status deft_cuda_check_index(int index) {
    int count = deft_cuda_count();
    if (count == 0)
        return deft_set_error(DEFT_ERR_NO_CUDA, "cuda:%d is not available: no CUDA GPU is usable here", index);
    if (index < 0 || index >= count)
        return deft_set_error(DEFT_ERR_DEVICE, "cuda:%d does not exist: %d CUDA device%s visible", index, count,
                              count == 1 ? " is" : "s are");
    return DEFT_OK;
}

/* Makes `index` current for one call and remembers the caller's device, so that asking about or allocating on one
 * GPU does not move the calling thread's current device under code that relies on it. */
static deft_status deft_cuda_enter(int index, int *prev) {
    deft_status s = deft_cuda_check_index(index);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess) return deft_cuda_fail(e, "cudaGetDevice", index);
    if (*prev == index) return DEFT_OK;
    e = cudaSetDevice(index);
    if (e != cudaSuccess) return deft_cuda_fail(e, "cudaSetDevice", index);
    return DEFT_OK;
}

static void deft_cuda_leave(int index, int prev) {
    if (prev != index && cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
}

deft_status deft_cuda_set_device(int index) {
    deft_status s = deft_cuda_check_index(index);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaSetDevice(index);
    return e == cudaSuccess ? DEFT_OK : deft_cuda_fail(e, "cudaSetDevice", index);
}

/* 0 until asked, per device: a device's SM count cannot change within a process. */
#define DEFT_CUDA_SMS_KEPT 64
static atomic_int deft_cuda_kept_sms[DEFT_CUDA_SMS_KEPT];

int deft_cuda_sm_count(int index) {
    if (index < 0 || index >= deft_cuda_count()) return DEFT_CUDA_SMS_FALLBACK;
    if (index < DEFT_CUDA_SMS_KEPT) {
        const int kept = atomic_load(&deft_cuda_kept_sms[index]);
        if (kept > 0) return kept;
    }
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index) != cudaSuccess || sms < 1) {
        (void)cudaGetLastError();
        return DEFT_CUDA_SMS_FALLBACK;
    }
    if (index < DEFT_CUDA_SMS_KEPT) atomic_store(&deft_cuda_kept_sms[index], sms);
    return sms;
}

deft_status deft_cuda_name(int index, char *buf, size_t n) {
    if (!buf || n == 0) return deft_set_error(DEFT_ERR_INVALID, "cuda name: no buffer");
    deft_status s = deft_cuda_check_index(index);
    if (s != DEFT_OK) return s;
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, index);
    if (e != cudaSuccess) return deft_cuda_fail(e, "cudaGetDeviceProperties", index);
    snprintf(buf, n, "%s", prop.name);
    return DEFT_OK;
}

deft_status deft_cuda_memory(int index, size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes) return deft_set_error(DEFT_ERR_INVALID, "cuda memory: NULL argument");
    int prev;
    deft_status s = deft_cuda_enter(index, &prev);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    deft_cuda_leave(index, prev);
    return e == cudaSuccess ? DEFT_OK : deft_cuda_fail(e, "cudaMemGetInfo", index);
}

/* "1.50 GiB": OOM messages are read by people deciding what to shrink. */
static const char *deft_cuda_bytes_str(size_t b, char *buf, size_t n) {
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, n, "%zu bytes", b);
    else snprintf(buf, n, "%.2f %s", v, units[u]);
    return buf;
}

static deft_status deft_cuda_oom(int index, size_t bytes) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    char want[32], fr[32], tot[32];
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    return deft_set_error(DEFT_ERR_OOM,
                          "out of memory on cuda:%d: tried to allocate %s (%zu bytes); %s free of %s total. "
                          "Try a smaller batch, a memory budget, or activation checkpointing",
                          index, deft_cuda_bytes_str(bytes, want, sizeof want),
                          bytes, deft_cuda_bytes_str(free_b, fr, sizeof fr),
                          deft_cuda_bytes_str(total_b, tot, sizeof tot));
}

deft_status deft_cuda_alloc(int index, size_t bytes, void **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "cuda alloc: NULL output");
    *out = NULL;
    if (bytes == 0) return DEFT_OK;
    int prev;
    deft_status s = deft_cuda_enter(index, &prev);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaErrorMemoryAllocation) s = deft_cuda_oom(index, bytes);   /* free memory is read on `index` */
    else if (e != cudaSuccess) s = deft_cuda_fail(e, "cudaMalloc", index);
    deft_cuda_leave(index, prev);
    if (s != DEFT_OK) *out = NULL;
    return s;
}

void deft_cuda_free(int index, void *ptr) {
    if (!ptr) return;
    int prev;
    if (deft_cuda_enter(index, &prev) != DEFT_OK) return;
    /* A free cannot be reported to anyone (callers free on error paths); clear the error instead of leaving it to
     * surface from the next launch. */
    if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
    deft_cuda_leave(index, prev);
}

/* cudaMemcpy returns before a device-to-device copy (or the DMA of a pageable host-to-device copy) has finished; the
 * contract of deft_mem_copy is that the copy is complete, and work on non-blocking streams does not order behind
 * the legacy stream, so wait for it. */
static deft_status deft_cuda_wait_legacy(int index) {
    cudaError_t e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? DEFT_OK : deft_cuda_fail(e, "cudaStreamSynchronize", index);
}

static deft_status deft_cuda_copy_on(int index, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                                     const char *what) {
    int prev;
    deft_status s = deft_cuda_enter(index, &prev);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
    if (e != cudaSuccess) s = deft_cuda_fail(e, what, index);
    else if (kind != cudaMemcpyDeviceToHost) s = deft_cuda_wait_legacy(index);
    deft_cuda_leave(index, prev);
    return s;
}

static deft_status deft_cuda_copy_peer(int dst_index, void *dst, int src_index, const void *src, size_t bytes) {
    deft_status s = deft_cuda_check_index(src_index);
    if (s != DEFT_OK) return s;
    int prev;
    s = deft_cuda_enter(dst_index, &prev);
    if (s != DEFT_OK) return s;
    /* cudaMemcpyPeer stages through the host when the GPUs have no peer access, so it works between any two. */
    cudaError_t e = cudaMemcpyPeer(dst, dst_index, src, src_index, bytes);
    if (e != cudaSuccess) s = deft_cuda_fail(e, "cudaMemcpyPeer", dst_index);
    else s = deft_cuda_wait_legacy(dst_index);
    deft_cuda_leave(dst_index, prev);
    return s;
}

deft_status deft_cuda_copy(int dst_index, void *dst, int src_index, const void *src, size_t bytes, int kind) {
    if (bytes == 0) return DEFT_OK;
    if (!dst || !src) return deft_set_error(DEFT_ERR_INVALID, "cuda copy: NULL pointer for %zu bytes", bytes);
    switch (kind) {
    case 0: return deft_cuda_copy_on(dst_index, dst, src, bytes, cudaMemcpyHostToDevice, "copy from the host");
    case 1: return deft_cuda_copy_on(src_index, dst, src, bytes, cudaMemcpyDeviceToHost, "copy to the host");
    case 2:
        if (dst_index == src_index)
            return deft_cuda_copy_on(dst_index, dst, src, bytes, cudaMemcpyDeviceToDevice, "device copy");
        return deft_cuda_copy_peer(dst_index, dst, src_index, src, bytes);
    default: return deft_set_error(DEFT_ERR_INVALID, "cuda copy: unknown kind %d", kind);
    }
}

deft_status deft_cuda_synchronize(int index) {
    int prev;
    deft_status s = deft_cuda_enter(index, &prev);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) s = deft_cuda_fail(e, "cudaDeviceSynchronize", index);
    deft_cuda_leave(index, prev);
    return s;
}
