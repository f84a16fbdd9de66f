/* What the convolution, pooling and batch norm builders share with their backward rules (ir/autodiff_rules_conv.c):
 * the geometry of an image tensor and the builders of the gradient ops. */
#ifndef DEFT_BUILD_CONV_H
#define DEFT_BUILD_CONV_H

#include "graph_internal.h"

/* The axes of N, C, H and W of a 4-D image tensor in a layout (deft_layout). */
typedef struct deft_image_axes {
    int n, c, h, w;
} deft_image_axes;
static inline deft_image_axes deft_image_axes_of(int layout) {
    return layout == DEFT_NHWC ? (deft_image_axes){0, 3, 1, 2} : (deft_image_axes){0, 1, 2, 3};
}

/* dx of conv2d node `conv` from its output gradient dy. */
deft_tensor *deft_conv2d_input_grad(deft_tensor *dy, const deft_tensor *conv);
/* dw of conv2d node `conv`. */
deft_tensor *deft_conv2d_weight_grad(deft_tensor *dy, const deft_tensor *conv);
/* dx of a max, average or adaptive average pooling node. */
deft_tensor *deft_pool2d_grad(deft_tensor *dy, const deft_tensor *pool);
/* The gradients of batch norm node `bn` (DEFT_OP_BATCH_NORM) from its output gradient dy. The sums node ([2, C] of
 * the statistics' dtype: the sums of dy and of dy xhat per channel, one pass over dy and x) gives the bias gradient
 * (row 0) and the weight gradient (row 1) as views, and is what the training dx reads; evaluation's dx takes no sums
 * (NULL). */
deft_tensor *deft_batch_norm_grad_sums(deft_tensor *dy, const deft_tensor *bn);
deft_tensor *deft_batch_norm_input_grad(deft_tensor *dy, const deft_tensor *bn, deft_tensor *sums);
deft_tensor *deft_batch_norm_sums_row(deft_tensor *sums, int row);

#endif
