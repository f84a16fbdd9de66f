/* How a program's step runs on its GPUs: a stream per GPU (runtime/program_lanes.h), and after a first eager run, one
 * CUDA Graph replay per step. runtime/program_graph_cuda.c with CUDA, runtime/program_graph_nocuda.c without. */
#ifndef DEFT_PROGRAM_GRAPH_H
#define DEFT_PROGRAM_GRAPH_H

#include "graph_internal.h"
#include "program_lanes.h"

struct deft_program;

typedef enum deft_graph_state {
    DEFT_GRAPH_OFF = 0,     /* eager every run: CPU steps, pageable copies, the option, or an op a replay would bake */
    DEFT_GRAPH_WARMUP,      /* the next run is eager (handles, workspaces and scratch get created outside capture) */
    DEFT_GRAPH_CAPTURE,     /* the next run captures the step and replays it */
    DEFT_GRAPH_READY        /* every run is one replay */
} deft_graph_state;

/* A captured step bakes in the address of every input slot it reads; inputs fed by deft_program_feed_async alternate
 * between two slots (runtime/prefetch.c), so one graph is kept per combination of slots, named by `key` (bit i: the
 * i-th double-slotted input reads its second slot). Inputs that all alternate together need two. */
#define DEFT_GRAPH_EXECS 4

typedef struct deft_graph_exec {
    uint64_t key;
    void *graph, *exec;     /* cudaGraph_t, cudaGraphExec_t; NULL when the entry is unused */
    uint64_t last_used;     /* the run that last launched it, to evict the stalest when the table is full */
} deft_graph_exec;

typedef struct deft_program_gpu {
    int device;             /* lane 0's GPU (where a run starts and ends, and inputs are prefetched), or -1 */
    void *stream;           /* lane 0's stream */
    deft_lanes lanes;       /* a stream per GPU the program touches */
    deft_graph_exec execs[DEFT_GRAPH_EXECS];
    uint64_t key;           /* the slots the next run reads (set by runtime/prefetch.c before each run) */
    uint64_t launches;
    deft_graph_state state;
    char why_eager[256];    /* why the program does not replay a graph */
    int64_t replays;
    int64_t captures;       /* graphs captured (one per slot combination met, more after evictions) */
} deft_program_gpu;

/* Creates p's streams and decides whether p can replay graphs (no GPU work is queued). */
deft_status deft_program_gpu_init(struct deft_program *p, int allow_graphs);
void deft_program_gpu_free(struct deft_program *p);
/* Runs every step of p: eagerly on its streams, capturing, or as one replay, as its state says. `run_steps` queues
 * the steps, beginning and ending on the stream it is given (lane 0's). */
deft_status deft_program_gpu_run(struct deft_program *p, deft_status (*run_steps)(struct deft_program *, void *));

/* ---- the CUDA calls (runtime/program_graph_cuda.c; without CUDA, program_graph_nocuda.c answers DEFT_ERR_NO_CUDA) ---- */
/* side: the stream of a side lane (passes/side_lane.h), whose cuDNN and cuBLAS scratch have the smaller caps
 * DEFT_CUDNN_SIDE_WORKSPACE_BYTES and DEFT_CUBLAS_SIDE_WORKSPACE_BYTES (mem/cuda_workspace.h). */
deft_status deft_cuda_stream_create(int device, int side, void **stream);
void deft_cuda_stream_destroy(int device, void *stream);
deft_status deft_cuda_capture_begin(int device, void *stream);
/* Ends the capture (always, so the stream leaves capture mode) and instantiates the graph. */
deft_status deft_cuda_capture_end(int device, void *stream, void **graph, void **exec);
deft_status deft_cuda_graph_launch(int device, void *exec, void *stream);
void deft_cuda_graph_destroy(int device, void *graph, void *exec);
deft_status deft_cuda_stream_sync(int device, void *stream);
/* The bytes of library scratch the stream holds (asked = 0) or the largest its chosen algorithms asked for (1), over
 * cuBLAS's, cuDNN's and batch norm's (mem/cuda_workspace.h); 0 without CUDA. */
size_t deft_cuda_stream_workspace_bytes(int device, void *stream, int asked);
/* Notes in p what its streams' scratch holds per GPU (p->workspace_bytes), after a run. */
void deft_program_gpu_note_workspaces(struct deft_program *p);
/* Of every stream of p, the scratch held (asked = 0) or asked for (1) on cuda:device; for the tests. */
size_t deft_program_gpu_workspace(const struct deft_program *p, int device, int asked);
/* Lets `device` reach `peer`'s memory when cudaDeviceCanAccessPeer says it can. Where it cannot, or enabling is
 * refused, copies between the two are staged by the driver: only a failure to ask is an error. */
deft_status deft_cuda_peer_enable(int device, int peer);
/* Queues a copy on `stream` (of the GPU that does it: the destination's, or the source's for a copy to the host):
 * host to GPU, GPU to host, or between two GPUs (cudaMemcpyPeerAsync). Host memory is page-locked for the copy to be
 * asynchronous and capturable. */
deft_status deft_cuda_copy_async(deft_device dst_dev, void *dst, deft_device src_dev, const void *src, size_t bytes,
                                 void *stream);

#endif
