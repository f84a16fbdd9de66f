/* Running an optimizer's node: on the CPU between the steps around it (ops/cpu/cpu_optimizer.c), on a GPU queued on
 * the stream once its gather table is there (runtime/optimizer_tables_cuda.c), with the per-run state on the device. */
#include "cpu_kernels.h"
#include "optimizer_run.h"

deft_status deft_optimizer_run(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads, void *out,
                               void *stream) {
    if (!(o->part && o->part->finisher)) {
        deft_status s = deft_optimizer_check_grads(o, o->step_node->name, srcs, o->n_params);
        if (s != DEFT_OK) return s;
    }
    if (o->device.type != DEFT_CPU) {
#ifdef DEFT_HAVE_CUDA
        return deft_optimizer_cuda_run(o, srcs, grads, out, stream);
#else
        char d[32];
        (void)stream;
        if (o->part)
            return deft_set_error(DEFT_ERR_NO_CUDA, "optimizer: the parameters are on a GPU, but deft was built without "
                                  "CUDA");
        return deft_set_error(DEFT_ERR_NO_CUDA, "optimizer: the parameters are on %s, but deft was built without CUDA",
                              deft_device_str(o->device, d, sizeof d));
#endif
    }
    (void)stream;
    return o->part ? deft_cpu_optimizer_part_run(o, srcs, grads, out) : deft_cpu_optimizer_run(o, srcs, grads, out);
}
