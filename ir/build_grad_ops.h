/* Builders for the ops only the backward pass makes (ir/autodiff.c); the kernels are in ops/. */
#ifndef DEFT_BUILD_GRAD_OPS_H
#define DEFT_BUILD_GRAD_OPS_H

#include "graph_internal.h"

/* dy * act'(x), for y = act(x) with act one of relu, gelu, silu, tanh, sigmoid. */
deft_tensor *deft_act_grad(deft_op act, deft_tensor *dy, deft_tensor *x);
/* a broadcast to shape (numpy rules), materialised. */
deft_tensor *deft_expand(deft_tensor *a, int ndim, const int64_t *shape);
/* Zeros shaped like `like`, with dy written where `slice` (a DEFT_OP_SLICE node of `like`) selected. */
deft_tensor *deft_slice_grad(deft_tensor *dy, const deft_tensor *slice);
/* d cross_entropy / d logits for the loss gradient dloss ([]). */
deft_tensor *deft_cross_entropy_grad(deft_tensor *dloss, deft_tensor *logits, deft_tensor *targets);

#endif
