/* What a program's first run would build, built at compile instead: cuDNN's fused attention plans (ops/cuda's
 * deft_cuda_prepare_node; building one compiles and loads kernels), the cuBLAS and cuBLASLt handles of its GPUs
 * (making one allocates on the device), and its optimizers' gather tables (building one copies from pageable memory
 * and waits for the stream). So the first step does not pay for them, and no run waits on the host for them. (A
 * data-parallel replica's first run is kept safe from such waits by its collectives' gate, dist/dist_gate.c.) */
#include <stdlib.h>

#include "cuda_kernels.h"
#include "device_internal.h"
#include "optimizer_run.h"
#include "program_graph.h"
#include "program_run.h"
#include "program_state.h"

#ifdef DEFT_HAVE_CUDA
/* The gather table of optimizer step `id`, for the addresses its run will read. */
static deft_status deft_prepare_optimizer(const deft_program *p, int id, void *stream) {
    const deft_tensor *t = p->graph->nodes[id];
    const void **in = malloc((size_t)(t->nsrc ? t->nsrc : 1) * sizeof *in);
    if (!in) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    for (int k = 0; k < t->nsrc; k++) in[k] = deft_program_data(p, t->src[k]->id);
    deft_status s = deft_optimizer_cuda_prepare(t->p.optimizer, t->src, in, stream);
    free((void *)in);
    return s;
}

static deft_status deft_prepare_handles(const deft_lanes *L) {
    deft_status s = DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < L->n; i++) {
        s = deft_cuda_set_device(L->device[i]);
        if (s == DEFT_OK) s = deft_cuda_cublas_prepare(L->device[i]);
        if (s == DEFT_OK) s = deft_cuda_cublaslt_prepare(L->device[i]);
    }
    return s;
}
#endif

deft_status deft_program_prepare_kernels(const deft_program *p) {
#ifdef DEFT_HAVE_CUDA
    const deft_lanes *L = &p->gpu->lanes;
    deft_status s = deft_prepare_handles(L);
    for (int i = 0; s == DEFT_OK && i < p->n_steps && L->n > 0; i++) {
        const int id = p->steps[i];
        const deft_tensor *t = p->graph->nodes[id];
        if (t->device.type != DEFT_CUDA || p->nodes[id].group >= 0) continue;
        const int lane = deft_lanes_step_lane(p, id);
        void *stream = L->stream[lane > 0 && lane < L->n ? lane : 0];
        s = deft_cuda_set_device(t->device.index);
        if (s == DEFT_OK && t->op == DEFT_OP_OPTIMIZER) s = deft_prepare_optimizer(p, id, stream);
        else if (s == DEFT_OK) s = deft_cuda_prepare_node(t, stream, p->cuda_flags);
    }
    return s;
#else
    (void)p;
    return DEFT_OK;
#endif
}
