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
/* deft_cross_entropy_ex with a loss of loss_dtype: the logits' or f32 (autocast's f32 loss of bf16 or f16 logits,
 * which the kernels read as they are, computing as if they had been cast to f32). */
deft_tensor *deft_cross_entropy_as(deft_tensor *logits, deft_tensor *targets, const deft_cross_entropy_options *o,
                                   deft_dtype loss_dtype);
/* The options a loss node was built with, for a rebuild (autocast) to build it again. */
deft_cross_entropy_options deft_cross_entropy_options_of(const deft_tensor *loss);
/* dq, dk and dv stacked ([3, B, H, T, D]) for attention node attn whose gradient is dout (ir/build_attention.c),
 * and one of them (0: dq, 1: dk, 2: dv) as a view of that node. A packed attn (p.attn.heads) gets qkv's gradient
 * [B, T, 3C] instead, dq, dk and dv at their places: the whole gradient, no parts. */
deft_tensor *deft_attention_grad(deft_tensor *dout, const deft_tensor *attn);
deft_tensor *deft_attention_grad_part(deft_tensor *grad, int which);
/* The gradients of the gathers (ir/build_gather.c): each sums dy's rows into the table (or a's shape) in the order
 * of an index_order node it builds over the index. */
deft_tensor *deft_embedding_grad(deft_tensor *dy, const deft_tensor *embedding);
deft_tensor *deft_index_select_grad(deft_tensor *dy, const deft_tensor *index_select);
/* deft_layer_norm with its value in out_dtype: x's, or bf16 or f16 from f32 x, weight and bias (what autocast builds
 * where only a low-precision product reads the value: ir/autocast_layer_norm.c); statistics f32. */
deft_tensor *deft_layer_norm_as(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, double eps,
                                deft_dtype out_dtype);
/* Layer norm's backward nodes (ir/build_layer_norm.c) for node ln whose gradient is dy: dx, and the sums [2, C] of
 * dy * xhat (row 0: the weight's gradient) and of dy (row 1: the bias's), a row of which deft_layer_norm_sums_row
 * views as [C], both in x's dtype; dy is read in ln's dtype (cast to it when it has another). ln's weight and bias,
 * NULL when it has none. */
deft_tensor *deft_layer_norm_input_grad(deft_tensor *dy, const deft_tensor *ln);
deft_tensor *deft_layer_norm_grad_sums(deft_tensor *dy, const deft_tensor *ln);
deft_tensor *deft_layer_norm_sums_row(deft_tensor *sums, int row);
deft_tensor *deft_layer_norm_weight_of(const deft_tensor *ln);
deft_tensor *deft_layer_norm_bias_of(const deft_tensor *ln);

#endif
