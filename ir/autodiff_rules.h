/* One backward rule per differentiable op (ir/autodiff_rules.c), used by deft_backward (ir/autodiff.c). */
#ifndef DEFT_AUTODIFF_RULES_H
#define DEFT_AUTODIFF_RULES_H

#include "graph_internal.h"

/* Adds to grads[src->id] the gradient that flows from t (whose gradient is dy) into each source with reach[src->id]
 * set. Returns DEFT_ERR_INVALID for an op with no rule. */
deft_status deft_grad_rule(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads);
/* The same for the image ops (conv2d, pooling, batch norm; ir/autodiff_rules_conv.c): false for other ops. */
bool deft_grad_rule_image(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads);
/* The same for the gathers and selection (embedding, index_select, where, masked_fill; ir/autodiff_rules_gather.c). */
bool deft_grad_rule_gather(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads);
/* The same for layer norm (ir/autodiff_rules_norm.c). */
bool deft_grad_rule_norm(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads);
/* grad (a node's summed gradient, built by the backward pass that added node ids >= first) as one concat when it is
 * the sum of gradients of step-1 slices along one axis over disjoint ranges (ir/autodiff_slices.c); else grad. */
deft_tensor *deft_join_slice_grads(deft_tensor *grad, int first);
/* g summed over the dims along which `like` was broadcast, giving like's shape (g itself when nothing was). */
deft_tensor *deft_reduce_to(deft_tensor *g, const deft_tensor *like);

#endif
