/* Bad input to conv2d, pooling and batch norm: each fails when built, with DEFT_ERR_* and a message that says what
 * was wrong, recorded as the graph's first error; nothing aborts. */
#include "check.h"

#define CPU deft_cpu()

static deft_tensor *input(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape) {
    return deft_input(g, "x", dt, ndim, shape, CPU);
}

static void test_conv2d_errors(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = input(g, DEFT_F32, 4, (int64_t[]){2, 4, 8, 8});
    deft_tensor *w = input(g, DEFT_F32, 4, (int64_t[]){6, 4, 3, 3});
    CHECK_NULL_ERR(deft_conv2d(input(g, DEFT_F32, 3, (int64_t[]){4, 8, 8}), w, NULL, NULL),
                   "conv2d: the input is [4, 8, 8]; expected 4 dimensions [N, C, H, W]");
    CHECK(deft_graph_error(g) == DEFT_ERR_SHAPE);
    CHECK_NULL_ERR(deft_conv2d(x, input(g, DEFT_F32, 4, (int64_t[]){6, 3, 3, 3}), NULL, NULL),
                   "conv2d: the weight is [6, 3, 3, 3] for an input [2, 4, 8, 8] (NCHW) with 1 groups; expected "
                   "[O, C/groups, KH, KW] with C/groups = 4");
    CHECK_NULL_ERR(deft_conv2d(x, w, NULL, &(deft_conv2d_options){.layout = DEFT_NHWC}),
                   "expected [O, KH, KW, C/groups] with C/groups = 8");
    CHECK_NULL_ERR(deft_conv2d(x, input(g, DEFT_F64, 4, (int64_t[]){6, 4, 3, 3}), NULL, NULL),
                   "conv2d: the weight is f64 and the input f32");
    CHECK_NULL_ERR(deft_conv2d(x, w, NULL, &(deft_conv2d_options){.groups = 3}),
                   "conv2d: 3 groups do not divide the 4 input channels and the 6 output channels");
    CHECK_NULL_ERR(deft_conv2d(x, w, input(g, DEFT_F32, 1, (int64_t[]){5}), NULL),
                   "conv2d: the bias is [5] f32; expected [6] of f32");
    CHECK_NULL_ERR(deft_conv2d(x, w, NULL, &(deft_conv2d_options){.stride = {-1, 1}}),
                   "conv2d: stride[0] is -1; it must be >= 1");
    CHECK_NULL_ERR(deft_conv2d(x, w, NULL, &(deft_conv2d_options){.padding = {0, -2}}),
                   "conv2d: padding[1] is -2; it must be >= 0");
    CHECK_NULL_ERR(deft_conv2d(x, input(g, DEFT_F32, 4, (int64_t[]){6, 4, 5, 5}), NULL,
                               &(deft_conv2d_options){.dilation = {3, 1}}),
                   "conv2d: the window spans 13 along H but the padded input has only 8 (8 + 2 x 0)");
    CHECK_NULL_ERR(deft_conv2d(x, w, NULL, &(deft_conv2d_options){.layout = (deft_layout)7}),
                   "conv2d: unknown layout 7");
    deft_tensor *xi = input(g, DEFT_I32, 4, (int64_t[]){2, 4, 8, 8});
    CHECK_NULL_ERR(deft_conv2d(xi, input(g, DEFT_I32, 4, (int64_t[]){6, 4, 3, 3}), NULL, NULL),
                   "conv2d: needs a floating dtype (f32, f64, f16, bf16), got i32");
    CHECK_NULL_ERR(deft_conv2d_layer(x, 0, 3, 3, "c", NULL, 0), "conv2d_layer: 0 output channels");
    CHECK_NULL_ERR(deft_conv2d(x, NULL, NULL, NULL), "");   /* NULL in, NULL out: the earlier error stands */
    CHECK(strstr(deft_graph_errmsg(g), "conv2d: the input is [4, 8, 8]") != NULL);
    deft_graph_free(g);
}

static void test_device_mismatch(void) {
    /* Two graphs stand in for two devices where there is no GPU: mixing them is refused the same way. */
    deft_graph *g = deft_graph_new(), *h = deft_graph_new();
    deft_tensor *x = input(g, DEFT_F32, 4, (int64_t[]){1, 2, 5, 5});
    deft_tensor *w = input(h, DEFT_F32, 4, (int64_t[]){2, 2, 3, 3});
    CHECK_NULL_ERR(deft_conv2d(x, w, NULL, NULL), "conv2d: inputs come from different graphs");
    deft_graph_free(g);
    deft_graph_free(h);
}

static void test_pool_errors(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = input(g, DEFT_F32, 4, (int64_t[]){2, 3, 7, 7});
    CHECK_NULL_ERR(deft_max_pool2d(x, NULL), "max_pool2d: options are NULL; the kernel size is required");
    CHECK(deft_graph_error(g) == DEFT_ERR_INVALID);
    CHECK_NULL_ERR(deft_avg_pool2d(x, &(deft_pool2d_options){.kernel = {0, 2}}), "avg_pool2d: kernel[0] is 0");
    CHECK_NULL_ERR(deft_max_pool2d(x, &(deft_pool2d_options){.kernel = {3, 3}, .padding = {2, 1}}),
                   "max_pool2d: padding[0] is 2; it must be at most half the kernel (3)");
    CHECK_NULL_ERR(deft_max_pool2d(x, &(deft_pool2d_options){.kernel = {9, 2}}),
                   "max_pool2d: the window spans 9 along H but the padded input has only 7");
    CHECK_NULL_ERR(deft_avg_pool2d(x, &(deft_pool2d_options){.kernel = {2, 2}, .stride = {1, -1}}),
                   "avg_pool2d: stride[1] is -1");
    CHECK_NULL_ERR(deft_max_pool2d(input(g, DEFT_F32, 2, (int64_t[]){3, 7}), &(deft_pool2d_options){.kernel = {2, 2}}),
                   "max_pool2d: the input is [3, 7]; expected 4 dimensions");
    CHECK_NULL_ERR(deft_adaptive_avg_pool2d(x, 0, 2, DEFT_NCHW),
                   "adaptive_avg_pool2d: the output size 0 x 2 must be positive");
    CHECK_NULL_ERR(deft_adaptive_avg_pool2d(x, 2, 2, (deft_layout)-1), "adaptive_avg_pool2d: unknown layout -1");
    deft_graph_free(g);
}

static void test_batch_norm_errors(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = input(g, DEFT_F32, 4, (int64_t[]){2, 3, 4, 4});
    deft_tensor *rm = deft_param(g, "rm", DEFT_F32, 1, (int64_t[]){3}, CPU, DEFT_INIT_ZEROS);
    deft_tensor *rv = deft_param(g, "rv", DEFT_F32, 1, (int64_t[]){3}, CPU, DEFT_INIT_ONES);
    deft_tensor *w4 = deft_param(g, "w4", DEFT_F32, 1, (int64_t[]){4}, CPU, DEFT_INIT_ONES);
    CHECK_NULL_ERR(deft_batch_norm(x, w4, NULL, rm, rv, NULL),
                   "batch_norm: weight is [4]; expected [3] (one per channel)");
    CHECK(deft_graph_error(g) == DEFT_ERR_SHAPE);
    deft_batch_norm_options nhwc = deft_batch_norm_defaults();
    nhwc.layout = DEFT_NHWC;   /* the channel axis is now the last: 4 channels */
    CHECK_NULL_ERR(deft_batch_norm(x, NULL, NULL, rm, rv, &nhwc), "batch_norm: running_mean is [3]; expected [4]");
    CHECK(deft_batch_norm(x, w4, NULL, NULL, NULL, &nhwc) != NULL);
    CHECK_NULL_ERR(deft_batch_norm(x, NULL, NULL, rm, NULL, NULL),
                   "batch_norm: give both running_mean and running_var, or neither");
    deft_tensor *computed = deft_mul_scalar(rm, 1.0);
    CHECK_NULL_ERR(deft_batch_norm(x, NULL, NULL, computed, rv, NULL),
                   "running statistics must be parameters (deft_param), which the op updates in place");
    deft_tensor *rm64 = deft_param(g, "rm64", DEFT_F64, 1, (int64_t[]){3}, CPU, DEFT_INIT_ZEROS);
    CHECK_NULL_ERR(deft_batch_norm(x, NULL, NULL, rm64, rv, NULL),
                   "batch_norm: running_mean is f64 for an input of f32; expected f32");
    /* halves take f32 parameters and statistics (torch's cuDNN contract), and nothing else */
    deft_tensor *xh = input(g, DEFT_BF16, 4, (int64_t[]){2, 3, 4, 4});
    deft_tensor *w3 = deft_param(g, "w3", DEFT_F32, 1, (int64_t[]){3}, CPU, DEFT_INIT_ONES);
    deft_tensor *w3h = deft_param(g, "w3h", DEFT_BF16, 1, (int64_t[]){3}, CPU, DEFT_INIT_ONES);
    deft_tensor *y = deft_batch_norm(xh, w3, w3, rm, rv, NULL);
    CHECK(y != NULL && deft_tensor_dtype(y) == DEFT_BF16);
    CHECK_NULL_ERR(deft_batch_norm(xh, w3h, NULL, rm, rv, NULL),
                   "batch_norm: weight is bf16 for an input of bf16; expected f32");
    CHECK_NULL_ERR(deft_batch_norm(x, w3h, NULL, rm, rv, NULL),
                   "batch_norm: weight is bf16 for an input of f32; expected f32");
    CHECK_NULL_ERR(deft_batch_norm(input(g, DEFT_F64, 4, (int64_t[]){2, 3, 4, 4}), NULL, NULL, rm, rv, NULL),
                   "batch_norm: running_mean is f32 for an input of f64; expected f64");
    deft_batch_norm_options bad = deft_batch_norm_defaults();
    bad.momentum = 1.5;
    CHECK_NULL_ERR(deft_batch_norm(x, NULL, NULL, rm, rv, &bad), "batch_norm: momentum 1.5 must be in [0, 1]");
    bad = deft_batch_norm_defaults();
    bad.eps = -1e-5;
    CHECK_NULL_ERR(deft_batch_norm(x, NULL, NULL, rm, rv, &bad), "eps -1e-05 finite and >= 0");
    CHECK_NULL_ERR(deft_batch_norm(input(g, DEFT_F32, 1, (int64_t[]){3}), NULL, NULL, NULL, NULL, NULL),
                   "batch_norm: the input is [3]; it needs a batch and a channel axis");
    deft_tensor *one = input(g, DEFT_F32, 4, (int64_t[]){1, 3, 1, 1});
    CHECK_NULL_ERR(deft_batch_norm(one, NULL, NULL, rm, rv, NULL),
                   "batch_norm: expected more than 1 value per channel when using the batch's statistics");
    deft_batch_norm_options eval = deft_batch_norm_defaults();
    eval.eval = 1;
    CHECK(deft_batch_norm(one, NULL, NULL, rm, rv, &eval) != NULL);   /* evaluation needs no batch statistics */
    CHECK_NULL_ERR(deft_batch_norm(input(g, DEFT_I32, 4, (int64_t[]){2, 3, 4, 4}), NULL, NULL, NULL, NULL, NULL),
                   "batch_norm: needs a floating dtype");
    CHECK_NULL_ERR(deft_batch_norm_layer(x, "bn", &bad), "batch_norm: momentum 0.1 must be in [0, 1] and eps -1e-05");
    deft_graph_free(g);
}

int main(void) {
    test_conv2d_errors();
    test_device_mismatch();
    test_pool_errors();
    test_batch_norm_errors();
    return deft_check_finish();
}
