/* The explicit-product convolutions of ops/cuda/cuda_conv_gemm.cu (NHWC, fewer than 8 input channels: a network's
 * stem) against the CPU, with the rows cut into chunks of 256 (debug knob CONV_GEMM_ROWS) so that several products
 * make one output and the weight gradient sums several chunks, the last one short; unchunked; and with the path off
 * (conv_gemm DEFT_CONV_GEMM_NEVER, cuDNN) so both are checked on the same data; the fast im2col kernel and the plain
 * one (debug knob CONV_GEMM_PLAIN) both. Forward and weight gradient, f32, f16 and bf16;
 * the unchunked path runs in cuda_test_conv's stem cases. Skips (exit 77) where no GPU works. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "deft_testing.h"
#include "cuda_compare.h"

static uint64_t rng = 0xc0117e3aull;
/* The GPU programs' options: conv_gemm picks the path under test (main sets it before each pass). */
static deft_compile_options gemm_opts;

typedef struct stem_case {
    int64_t n, c, h, w, o, k, stride, pad, dil;
} stem_case;

typedef struct stem_ctx {
    const stem_case *k;
    int weight_grad;
    deft_dtype dt;
} stem_ctx;

static deft_tensor *as_f32_on_cpu(deft_device dev, deft_tensor *t) {
    return dev.type == DEFT_CPU && deft_tensor_dtype(t) != DEFT_F32 ? deft_to(t, dev, DEFT_F32) : t;
}

/* Sources: x, w, dy (all NHWC). */
static deft_tensor *build_stem(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g;
    const stem_ctx *c = ctx;
    const stem_case *k = c->k;
    const deft_conv2d_options o = {.stride = {k->stride, k->stride}, .padding = {k->pad, k->pad},
                                   .dilation = {k->dil, k->dil}, .layout = DEFT_NHWC};
    deft_tensor *y = deft_conv2d(as_f32_on_cpu(dev, x[0]), as_f32_on_cpu(dev, x[1]), NULL, &o);
    if (y && c->weight_grad) y = deft_conv2d_weight_grad(as_f32_on_cpu(dev, x[2]), y);
    return y && dev.type == DEFT_CPU && c->dt != DEFT_F32 ? deft_to(y, dev, c->dt) : y;
}

static double tol_of(deft_dtype dt) {
    return dt == DEFT_F32 ? 1e-4 : dt == DEFT_F16 ? 4e-3 : 2e-2;
}

static void stem_one(const stem_case *k, deft_dtype dt, int weight_grad, const char *path) {
    const int64_t span = k->dil * (k->k - 1) + 1;
    const int64_t oh = (k->h + 2 * k->pad - span) / k->stride + 1, ow = (k->w + 2 * k->pad - span) / k->stride + 1;
    const int64_t xs[4] = {k->n, k->h, k->w, k->c}, ws[4] = {k->o, k->k, k->k, k->c}, ys[4] = {k->n, oh, ow, k->o};
    ref_tensor in[3] = {ref_random(&rng, dt, 4, xs, -1.0, 1.0), ref_random(&rng, dt, 4, ws, -1.0, 1.0),
                        ref_random(&rng, dt, 4, ys, -1.0, 1.0)};
    const stem_ctx ctx = {k, weight_grad, dt};
    char name[160];
    snprintf(name, sizeof name, "%s conv2d%s %s x[%lld,%lld,%lld,%lld] o%lld k%lld s%lld p%lld d%lld (%lld rows)",
             path, weight_grad ? " dw" : "", dt_names[dt], (long long)k->n, (long long)k->h, (long long)k->w,
             (long long)k->c, (long long)k->o, (long long)k->k, (long long)k->stride, (long long)k->pad,
             (long long)k->dil, (long long)(k->n * oh * ow));
    compare_case_with(name, 3, in, build_stem, &ctx, tol_of(dt), 1, &gemm_opts);
    for (int i = 0; i < 3; i++) ref_free(&in[i]);
}

static const stem_case cases[] = {
    /* n  c   h   w   o  k  s  p  d */
    {3, 3, 30, 30, 16, 7, 2, 3, 1},    /* a ResNet stem, 675 rows: chunks of 256, 256 and 163 */
    {2, 1, 23, 21, 8, 3, 1, 2, 2},     /* one channel, dilation 2: 2 * 23 * 21 rows */
    {4, 5, 12, 13, 24, 5, 1, 2, 1},    /* 5 channels: a window row of 125, padded to 128 */
};

static void run_all(const char *path) {
    static const deft_dtype dts[] = {DEFT_F32, DEFT_F16, DEFT_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 3; d++)
            for (int wg = 0; wg < 2; wg++) stem_one(&cases[i], dts[d], wg, path);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    gemm_opts.conv_gemm = DEFT_CONV_GEMM_WITH_F32;   /* f32 too */
    CHECK_OK(deft_testing_set_debug("CONV_GEMM_ROWS", 256));
    run_all("chunked");
    CHECK_OK(deft_testing_set_debug("CONV_GEMM_PLAIN", 1));
    run_all("chunked plain im2col");
    CHECK_OK(deft_testing_set_debug("CONV_GEMM_ROWS", 0));
    CHECK_OK(deft_testing_set_debug("CONV_GEMM_PLAIN", 0));
    run_all("unchunked");
    gemm_opts.conv_gemm = DEFT_CONV_GEMM_NEVER;
    run_all("cudnn");
    return deft_check_finish();
}
