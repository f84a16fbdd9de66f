/* libdeft_kernel_trace.so: every kernel a process runs, the nodes of replayed CUDA Graphs included, one line each in
 * the file $DEFT_KERNEL_TRACE (default kernel_trace.txt), through CUPTI's activity records. Loaded with LD_PRELOAD
 * into any program (deft's benches, a PyTorch script); scripts/graph_gaps.py reads the file. It measures what a
 * replay's events cannot split: the kernels' own time against the gaps between them.
 *
 * A line: K start end graph node stream correlation channel local_per_thread local_total grid block shared
 * shared_executed cache_executed registers launch_type carveout name (times in ns; graph 0: not a graph's node). */
#include <stdio.h>
#include <stdlib.h>

#include <cupti.h>

enum { TRACE_BUFFER_BYTES = 4 << 20, TRACE_FLUSH_MS = 200 };

static FILE *trace_out;

static void CUPTIAPI trace_buffer_wanted(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = TRACE_BUFFER_BYTES;
    *buffer = aligned_alloc(8, TRACE_BUFFER_BYTES);
    *max_records = 0;
}

static void trace_write(const CUpti_ActivityKernel10 *k) {
    fprintf(trace_out, "K %llu %llu %u %llu %u %u %u %u %llu %d %d %d %u %u %u %u %u %s\n",
            (unsigned long long)k->start, (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId,
            k->streamId, k->correlationId, k->channelID, k->localMemoryPerThread,
            (unsigned long long)k->localMemoryTotal_v2, k->gridX * k->gridY * k->gridZ,
            k->blockX * k->blockY * k->blockZ, k->staticSharedMemory + k->dynamicSharedMemory,
            k->sharedMemoryExecuted, (unsigned)k->cacheConfig.config.executed, (unsigned)k->registersPerThread,
            (unsigned)k->launchType, (unsigned)k->sharedMemoryCarveoutRequested, k->name ? k->name : "?");
}

static void CUPTIAPI trace_buffer_done(CUcontext context, uint32_t stream, uint8_t *buffer, size_t size,
                                       size_t valid) {
    (void)context;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            trace_write((const CUpti_ActivityKernel10 *)record);
    free(buffer);
}

__attribute__((constructor)) static void trace_start(void) {
    const char *path = getenv("DEFT_KERNEL_TRACE");
    trace_out = fopen(path && *path ? path : "kernel_trace.txt", "w");
    if (!trace_out) {
        fprintf(stderr, "deft_kernel_trace: cannot write %s: not tracing\n", path && *path ? path : "kernel_trace.txt");
        return;
    }
    if (cuptiActivityRegisterCallbacks(trace_buffer_wanted, trace_buffer_done) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "deft_kernel_trace: CUPTI refused the kernel records: not tracing\n");
        return;
    }
    /* Records reach the file while the program runs, not only at its exit (which may tear CUDA down first). */
    cuptiActivityFlushPeriod(TRACE_FLUSH_MS);
}

__attribute__((destructor)) static void trace_stop(void) {
    if (!trace_out) return;
    cuptiActivityFlushAll(1);
    fclose(trace_out);
    trace_out = NULL;
}
