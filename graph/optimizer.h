/* An optimizer's state, shared by graph/optimizer.c (building) and runtime/optimizer_run.c (running). */
#ifndef DEFT_OPTIMIZER_H
#define DEFT_OPTIMIZER_H

#include "graph_internal.h"

typedef enum deft_optimizer_kind { DEFT_OPTIM_SGD, DEFT_OPTIM_ADAMW } deft_optimizer_kind;

struct deft_optimizer {
    deft_graph *graph;
    deft_optimizer_kind kind;
    deft_sgd_options sgd;
    deft_adamw_options adamw;
    int accumulate_steps;
    double max_grad_norm;
    double lr;
    deft_dtype dtype;
    deft_device device;
    int n_params;
    deft_tensor **params;
    int64_t *offsets;          /* element offset of each parameter in the flat storage */
    int64_t total;             /* elements in the flat storage */
    /* Flat storage on the optimizer's device: the parameters' values (each parameter's storage points into it),
     * the gradients summed over the micro-batches of one update, and the per-element state (SGD: momentum buffer;
     * AdamW: the first and second moments). */
    void *flat_params, *flat_grads, *state0, *state1;
    int micro;                 /* runs since the last update */
    int64_t updates;
    double last_norm;
    deft_tensor *step_node;
};

void deft_optimizer_destroy(struct deft_optimizer *opt);

/* Bytes of the flat gradients and the state (the flat parameters count as the parameters themselves). */
static inline size_t deft_optimizer_state_bytes(const struct deft_optimizer *opt) {
    return (size_t)opt->total * deft_dtype_size(opt->dtype) * (opt->kind == DEFT_OPTIM_ADAMW ? 3u : 2u);
}

/* Runs the optimizer's node: grads[i] is parameter i's gradient for this run; out (one f32) receives the norm. */
deft_status deft_optimizer_run(struct deft_optimizer *opt, const void *const *grads, void *out);

#endif
