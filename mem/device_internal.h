/* Device memory and device facts for the rest of the library. CPU memory and CUDA memory behind one interface. */
#ifndef DEFT_DEVICE_INTERNAL_H
#define DEFT_DEVICE_INTERNAL_H

#include "deft.h"

#ifdef __cplusplus
extern "C" {
#endif

/* DEFT_OK if d names a device this process can use; otherwise a clear error (unknown index, no CUDA). */
deft_status deft_device_check(deft_device d);

/* Memory on a device (256-byte aligned), from the caching allocator. bytes == 0 gives NULL and DEFT_OK. */
deft_status deft_mem_alloc(deft_device d, size_t bytes, void **out);
/* The same, with a tag (a graph node's name, or the caller's) shown in memory snapshots and history. */
deft_status deft_mem_alloc_tagged(deft_device d, size_t bytes, const char *tag, void **out);
void deft_mem_free(deft_device d, void *ptr);
/* Copies between any two devices (host memory is the CPU device); returns once the copy is complete. */
deft_status deft_mem_copy(deft_device dst_dev, void *dst, deft_device src_dev, const void *src, size_t bytes);
/* Waits for all work queued on the device. */
deft_status deft_device_synchronize(deft_device d);

/* ---- the CUDA side (mem/cuda_device_cuda.c when built with CUDA, mem/cuda_device_nocuda.c otherwise) ---- */
int deft_cuda_count(void);      /* visible, working GPUs; 0 without CUDA or without a GPU */
deft_status deft_cuda_name(int index, char *buf, size_t n);
deft_status deft_cuda_memory(int index, size_t *free_bytes, size_t *total_bytes);
int deft_cuda_started(void);
deft_status deft_cuda_alloc(int index, size_t bytes, void **out);
void deft_cuda_free(int index, void *ptr);
/* kind: 0 host->device, 1 device->host, 2 device->device (peer copies when the devices differ). */
deft_status deft_cuda_copy(int dst_index, void *dst, int src_index, const void *src, size_t bytes, int kind);
deft_status deft_cuda_synchronize(int index);
deft_status deft_cuda_set_device(int index);
/* The SMs (multiprocessors) of cuda:index: one wave of one-block-per-SM work, which kernel grids and GPU fusion
 * decisions are sized to (base/cuda_tuning.h). Asked of the device once and kept. DEFT_CUDA_SMS_FALLBACK where
 * it cannot be asked (a build without CUDA, no such device, a failed query); no error is set. */
int deft_cuda_sm_count(int index);
#define DEFT_CUDA_SMS_FALLBACK 132   /* an H100 SXM's or an H200's, the cards deft's tuning was measured on */

#ifdef __cplusplus
}
#endif
#endif
