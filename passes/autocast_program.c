/* Compiling under autocast (ir/autocast.h): the outputs mapped to their counterparts in the rewrite, the user's
 * tensors aliased to them for reading. Loss scaling in the optimizers is the runtime's (runtime/optimizer_storage.c).
 * The options were checked and resolved once (compile_config.c). */
#include <stdlib.h>

#include "autocast.h"
#include "optimizer.h"
#include "program_state.h"

deft_status deft_autocast_outputs(deft_graph *g, const deft_config *c, deft_tensor *const *outputs, int n,
                                  deft_tensor ***mapped) {
    *mapped = NULL;
    if (c->autocast == DEFT_F32) return DEFT_OK;
    deft_autocast *ac;
    /* The step reads bf16 gradients directly. f16 ones are widened first: f16 steps reading them directly differed
     * in the last bits (bench/RESULTS.md, "Fifth round") from tests/amp_ref.h's reference, whose network, compiled
     * with every gradient as an output, already differs before any update with no_fusion; until a reference that runs
     * the same kernels settles it, f16 keeps its casts. Data parallel averages f32 gradients, as PyTorch's DDP does,
     * unless asked to average the bf16 ones (dist_reduce_dtype). */
    const int f32_grads = (c->dist != NULL && !c->dist_bf16_grads) || c->autocast != DEFT_BF16;
    deft_status s = deft_autocast_get(g, c->autocast, c->loss_scaled, f32_grads, c->param_copies, &ac);
    if (s != DEFT_OK) return s;
    deft_tensor **m = malloc((size_t)n * sizeof *m);
    if (!m) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    for (int i = 0; i < n && s == DEFT_OK; i++) s = deft_autocast_output(ac, outputs[i], &m[i]);
    if (s != DEFT_OK) {
        free(m);
        return s;
    }
    *mapped = m;
    return DEFT_OK;
}

deft_status deft_autocast_alias(deft_program *p, deft_tensor *const *user, int n) {
    p->alias = malloc((size_t)(p->n_nodes ? p->n_nodes : 1) * sizeof *p->alias);
    if (!p->alias) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    for (int id = 0; id < p->n_nodes; id++) p->alias[id] = id;
    for (int i = 0; i < n; i++) {
        p->alias[user[i]->id] = p->outputs[i];
        p->nodes[user[i]->id].is_output = true;
    }
    return DEFT_OK;
}
