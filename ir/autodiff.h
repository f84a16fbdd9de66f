/* What ir/autodiff.c offers the rest of the library beyond deft_backward: the record of its calls and a backward pass
 * that hands its gradients back instead of publishing them (the autocast rewrite, ir/autocast.c, re-derives the
 * backward pass of its low-precision forward with it). */
#ifndef DEFT_AUTODIFF_H
#define DEFT_AUTODIFF_H

#include "graph_internal.h"

/* One deft_backward call: its loss, and the node ids [first, end) it added (the seed, the gradient nodes, the sums
 * that joined gradients of an earlier call). */
typedef struct deft_backward_call {
    deft_tensor *loss;
    int first, end;
} deft_backward_call;

/* The backward pass of `loss` from the gradient `seed` (a node of the loss's shape and dtype): builds the gradient
 * nodes and sets *grads to a calloc'd array, indexed by node id up to loss->id, of each node's summed gradient (NULL
 * where none flows). Nothing is published: t->grad is left alone and the call is not recorded. */
deft_status deft_backward_collect(deft_tensor *loss, deft_tensor *seed, deft_tensor ***grads);

#endif
