/* Errors that only the data can reveal (a cross-entropy target outside [0, C), a token id outside an embedding's
 * table) are found by kernels, which cannot stop the stream or wait for the host. They record the first one in a
 * small record in device memory, one per GPU, and the host reports it where it waits for the device anyway:
 * deft_program_read. A step therefore never synchronises the host to check its data, eager or replayed as a CUDA
 * Graph alike.
 *
 * runtime/device_errors.c decides which records a program reads; mem/device_errors_cuda.c owns the records
 * (mem/device_errors_nocuda.c without CUDA, where no kernel can write one). */
#ifndef DEFT_DEVICE_ERRORS_H
#define DEFT_DEVICE_ERRORS_H

#include "deft.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DEFT_DEVICE_ERRORS_NONE (~0ull)
#define DEFT_DEVICE_ERRORS_MAX_DEVICES 64

/* Written by kernels with atomics; laid out the same in C and CUDA. */
typedef struct deft_device_errors {
    /* The lowest bad row seen, as (row << 32) | (uint32) target (atomicMin keeps the first row whatever the
     * scheduling); DEFT_DEVICE_ERRORS_NONE when there is none. */
    unsigned long long ce_bad;
    long long ce_classes;   /* C of the cross-entropy whose row is in ce_bad */
    /* The same for a gather's index outside [0, rows) (an embedding's ids, index_select's index, the order of their
     * gradients): the lowest bad position, as (position << 32) | (uint32) index, the rows it indexes, and which op
     * (DEFT_GATHER_ERR_*) for the message. */
    unsigned long long gather_bad;
    long long gather_rows;
    long long gather_op;
} deft_device_errors;

#define DEFT_GATHER_ERR_EMBEDDING 0
#define DEFT_GATHER_ERR_INDEX_SELECT 1

/* The record of cuda:device, created and cleared on first use (a program makes those of its GPUs when it is compiled,
 * runtime/device_errors.c). Creating it allocates and waits for the device, which a stream capture forbids: under
 * capture without a record, `stream` (a cudaStream_t) being captured gives DEFT_ERR_STATE. No lock is held while it
 * waits. */
deft_status deft_device_errors_get(int device, void *stream, deft_device_errors **out);

/* Waits for the work queued on cuda:device (on the legacy stream and the blocking streams programs run on), reads
 * its record and clears it: DEFT_ERR_INVALID with the recorded error's message, once, or DEFT_OK when none was
 * recorded or no record exists. */
deft_status deft_device_errors_take(int device);

/* Frees cuda:device's record (deft_memory_release_all; the caller waited for the device). A recorded error not yet
 * taken goes with it; the next use makes a new record. */
void deft_device_errors_release(int device);

#ifdef __cplusplus
}
#endif
#endif
