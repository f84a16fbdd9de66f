/* What a GPU cannot run is refused when the program is compiled, with the reason, rather than when a step fails in
 * the middle of a run. */
#include <stdio.h>

#include "cuda_kernels.h"
#include "gpu_support.h"

deft_status deft_check_gpu_support(const deft_program *p) {
#ifdef DEFT_HAVE_CUDA
    for (int i = 0; i < p->n_steps; i++) {
        const deft_tensor *t = p->graph->nodes[p->steps[i]];
        const bool attention = t->op == DEFT_OP_ATTENTION || t->op == DEFT_OP_ATTENTION_GRAD;
        if (t->device.type != DEFT_CUDA || !(deft_op_is_conv(t->op) || attention)) continue;
        char why[160];
        const bool ok = attention ? deft_cuda_attention_supported(t, why, sizeof why)
                                  : deft_cuda_conv_supported(t, why, sizeof why);
        if (!ok)
            return deft_set_error(DEFT_ERR_DTYPE, "compile: %s (%s) on cuda:%d: %s", t->name, deft_op_name(t->op),
                                  t->device.index, why);
    }
#else
    (void)p;   /* without CUDA no node lives on a GPU: the builders refuse the device */
#endif
    return DEFT_OK;
}
