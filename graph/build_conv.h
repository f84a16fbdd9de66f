/* What the convolution, pooling and batch norm builders share with their backward rules (graph/autodiff_rules_conv.c):
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
/* dx and dweight of batch norm node `bn` (DEFT_OP_BATCH_NORM). */
deft_tensor *deft_batch_norm_input_grad(deft_tensor *dy, const deft_tensor *bn);
deft_tensor *deft_batch_norm_weight_grad(deft_tensor *dy, const deft_tensor *bn);

#endif
