/* Builders for the ops only the backward pass makes (ir/autodiff.c); the kernels are in ops/. */
#ifndef DEFT_BUILD_GRAD_OPS_H
#define DEFT_BUILD_GRAD_OPS_H

#include "graph_internal.h"

/* dy * act'(x), for y = act(x) with act one of relu, gelu, gelu_tanh, silu, tanh, sigmoid. */
deft_tensor *deft_act_grad(deft_op act, deft_tensor *dy, deft_tensor *x);
/* a broadcast to shape (numpy rules), materialised. */
deft_tensor *deft_expand(deft_tensor *a, int ndim, const int64_t *shape);
/* Zeros shaped like `like`, with dy written where `slice` (a DEFT_OP_SLICE node of `like`) selected. */
deft_tensor *deft_slice_grad(deft_tensor *dy, const deft_tensor *slice);
/* d cross_entropy / d logits for the loss gradient dloss ([]). */
deft_tensor *deft_cross_entropy_grad(deft_tensor *dloss, deft_tensor *logits, deft_tensor *targets);
/* The gradient of the loss node `loss` (DEFT_OP_CROSS_ENTROPY) for dloss: its sources and its options (p.ce). */
deft_tensor *deft_cross_entropy_grad_for(deft_tensor *dloss, const deft_tensor *loss);
/* The options a loss node was built with, for a rebuild (autocast) to build it again. */
deft_cross_entropy_options deft_cross_entropy_options_of(const deft_tensor *loss);
/* dq, dk and dv stacked ([3, B, H, T, D]) for attention node attn whose gradient is dout (ir/build_attention.c),
 * and one of them (0: dq, 1: dk, 2: dv) as a view of that node. */
deft_tensor *deft_attention_grad(deft_tensor *dout, const deft_tensor *attn);
deft_tensor *deft_attention_grad_part(deft_tensor *grad, int which);
/* The gradients of the gathers (ir/build_gather.c): each sums dy's rows into the table (or a's shape) in the order
 * of an index_order node it builds over the index. */
deft_tensor *deft_embedding_grad(deft_tensor *dy, const deft_tensor *embedding);
deft_tensor *deft_index_select_grad(deft_tensor *dy, const deft_tensor *index_select);

#endif
