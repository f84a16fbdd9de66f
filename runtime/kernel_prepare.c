/* What kernels' libraries build on a node's first run, built at compile instead (ops/cuda's deft_cuda_prepare_node:
 * cuDNN's fused attention plans, whose building compiles and loads kernels). A data-parallel replica's first run
 * queues collectives that finish only once every replica's thread has queued its own; a thread that stops there to
 * build a plan, behind a lock another thread holds while it waits on its own device, could keep them from it. At
 * compile no collective is in flight, and the first step also stops costing the builds. */
#include "cuda_kernels.h"
#include "device_internal.h"
#include "program_graph.h"
#include "program_run.h"
#include "program_state.h"

deft_status deft_program_prepare_kernels(const deft_program *p) {
#ifdef DEFT_HAVE_CUDA
    const deft_lanes *L = &p->gpu->lanes;
    for (int i = 0; i < p->n_steps && L->n > 0; i++) {
        const int id = p->steps[i];
        const deft_tensor *t = p->graph->nodes[id];
        if (t->device.type != DEFT_CUDA || p->nodes[id].group >= 0) continue;
        const int lane = deft_lanes_step_lane(p, id);
        deft_status s = deft_cuda_set_device(t->device.index);
        if (s == DEFT_OK) s = deft_cuda_prepare_node(t, L->stream[lane > 0 && lane < L->n ? lane : 0], p->cuda_flags);
        if (s != DEFT_OK) return s;
    }
#else
    (void)p;
#endif
    return DEFT_OK;
}
