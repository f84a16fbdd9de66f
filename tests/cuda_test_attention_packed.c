/* deft_attention_packed on cuda:0 against the composition it replaces (q, k, v sliced out of qkv [B, T, 3C] and
 * permuted to [B, H, T, D], deft_attention, the output permuted back), run through the public API with each
 * implementation (debug knob ATTENTION_KERNEL: 1 deft's plain kernels, 2 its tensor-core ones, 3 cuDNN's fused
 * attention; 2 and 3 fall back to the plain kernels where they refuse a case, in both forms alike), f32, bf16 and
 * f16, causal and not, H = 1, D = 5 (plain only), 32, 64 and 128, T = 1 and T off the kernels' tiles:
 *   plain, tensor cores   the output and qkv's gradient are equal value for value (==): the kernels read the rows
 *                         through strides and sum in the same order whatever the layout, and the apart form's
 *                         slices, permutes and concat only copy;
 *   cuDNN                 within bf16 2e-2 (output) and 3e-2 (gradient), f16 5e-3 and 1e-2 of the apart form, as
 *                         the largest error over the largest magnitude (cuDNN may pick other engines for other
 *                         strides); the programs compile with `deterministic` so that both backward passes are
 *                         cuDNN's atomics-free form.
 * Then, with hand-fed buffers on a stream (bf16, B 2, T 64, H 2, D 64, causal): cuDNN's forward and backward take
 * the packed nodes (DEFT_OK from deft_cudnn_attention: cuDNN ran, its plan described as packed) and agree with
 * deft's own kernels on the same nodes (output 2e-2, log-sum-exp 1e-3, gradient 3e-2); qkv 2 bytes off 16-byte
 * alignment is refused by cuDNN (deft's kernels then run it) and the plain kernel's result there equals its result
 * on the aligned copy bit for bit. Skips (exit 77) without a GPU; DEFT_TEST_GPU_AS_CPU=1 runs the first part on the
 * CPU's kernel instead. */
#include <string.h>

#include "check.h"
#include "deft_testing.h"
#include "ref.h"
#include "attention_packed_run.h"

static uint64_t rng = 0x9ac4ed0cull;
static deft_device GPU;

static const pk_shape shapes[] = {
    {2, 37, 3, 64, 0, 0}, {1, 130, 2, 32, 0, 0}, {2, 20, 2, 5, 0, 0}, {1, 1, 2, 64, 0, 0}, {2, 77, 1, 128, 0, 0},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void compare_case(const pk_shape *s, deft_dtype dt, int kernel) {
    double *qkv, *r;
    pk_random(&rng, s, dt, 1.5, &qkv, &r);
    const deft_compile_options opts = {.deterministic = 1};
    pk_result a = {0}, p = {0};
    const int ok = pk_run(s, 0, dt, GPU, &opts, qkv, r, &a) && pk_run(s, 1, dt, GPU, &opts, qkv, r, &p);
    const int64_t n = pk_numel_y(s);
    if (ok && kernel != 3) {
        const int64_t dy = pk_differ(p.y, a.y, n), dg = pk_differ(p.dqkv, a.dqkv, 3 * n);
        CHECK_MSG(dy == 0 && dg == 0, "kernel %d %s B %lld T %lld H %lld D %lld causal %d: %lld of %lld outputs and "
                  "%lld of %lld gradients differ", kernel, deft_dtype_name(dt), (long long)s->b, (long long)s->t,
                  (long long)s->h, (long long)s->d, s->causal, (long long)dy, (long long)n, (long long)dg,
                  (long long)(3 * n));
    } else if (ok) {
        const double ty = dt == DEFT_BF16 ? 2e-2 : dt == DEFT_F16 ? 5e-3 : 1e-6;
        const double tg = dt == DEFT_BF16 ? 3e-2 : dt == DEFT_F16 ? 1e-2 : 1e-6;
        const double ey = pk_rel_err(p.y, a.y, n), eg = pk_rel_err(p.dqkv, a.dqkv, 3 * n);
        CHECK_MSG(ey <= ty && eg <= tg, "kernel 3 %s B %lld T %lld H %lld D %lld causal %d: output off by %.3g (tol "
                  "%g), gradient by %.3g (tol %g)", deft_dtype_name(dt), (long long)s->b, (long long)s->t,
                  (long long)s->h, (long long)s->d, s->causal, ey, ty, eg, tg);
    }
    if (ok) {   /* not a comparison of zeros or NaNs */
        const double e = pk_rel_err(p.dqkv, p.dqkv, 3 * n);
        CHECK_MSG(e == 0.0, "packed gradient holds NaN (%s)", deft_dtype_name(dt));
    }
    pk_result_free(&a);
    pk_result_free(&p);
    free(qkv);
    free(r);
}

static void test_each_kernel(void) {
    const deft_dtype dts[3] = {DEFT_F32, DEFT_BF16, DEFT_F16};
    for (int kernel = 1; kernel <= 3; kernel++) {
        CHECK_OK(deft_testing_set_debug("ATTENTION_KERNEL", kernel));
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < N_SHAPES; i++)
                for (int causal = 0; causal < 2; causal++) {
                    pk_shape s = shapes[i];
                    s.causal = causal;
                    compare_case(&s, dts[k], kernel);
                }
    }
    CHECK_OK(deft_testing_set_debug("ATTENTION_KERNEL", 0));
}

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_util.h"

static void compare_dev(const char *what, const void *got, const void *want, size_t off, deft_dtype dt, int64_t n,
                        double tol) {
    double *g = dev_read(got, off, dt, n), *w = dev_read(want, off, dt, n);
    const double e = pk_rel_err(g, w, n);
    CHECK_MSG(e <= tol, "%s: cuDNN against deft's kernels off by %.3g (tol %g)", what, e, tol);
    free(g);
    free(w);
}

/* Whether cuDNN ran node n (DEFT_OK); prints its plan line or its refusal, and wants " packed" in the plan. */
static int cudnn_ran(deft_status s, const deft_tensor *n, unsigned flags, const char *what) {
    static char line[8192];
    const int planned = deft_cudnn_attention_describe(n, flags, line, sizeof line);
    printf("    %s: %s %s\n", what, deft_status_name(s), s == DEFT_OK || planned ? line : deft_errmsg());
    CHECK_MSG(s == DEFT_OK, "%s: cuDNN did not run the packed node: %s", what, deft_errmsg());
    CHECK_MSG(planned && strstr(line, " packed"), "%s: no packed plan: %s", what, line);
    return s == DEFT_OK;
}

static void test_cudnn_direct(void) {
    const int64_t b = 2, t = 64, h = 2, d = 64, c = h * d, n = b * t * c;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "qkv", DEFT_BF16, 3, (int64_t[]){b, t, 3 * c}, GPU);
    deft_tensor *dy = deft_input(g, "dy", DEFT_BF16, 3, (int64_t[]){b, t, c}, GPU);
    deft_tensor *fwd = deft_attention_packed(x, (int)h, &(deft_attention_options){.causal = 1});
    deft_tensor *grad = fwd ? deft_attention_grad(dy, fwd) : NULL;
    CHECK_MSG(fwd && grad, "nodes: %s", deft_errmsg());
    /* the same problem apart: where cuDNN takes that, it must take the packed one too */
    deft_tensor *q = deft_input(g, "q", DEFT_BF16, 4, (int64_t[]){b, h, t, d}, GPU);
    const int usable = fwd && deft_cudnn_attention_usable(deft_attention(q, q, q, NULL));
    CHECK_MSG(!usable || deft_cudnn_attention_usable(fwd), "cuDNN takes the problem apart but not packed");
    if (!usable || !fwd || !grad) {
        printf("cuDNN's fused attention is not usable here (no cuDNN in the build, an older runtime or GPU): the "
               "direct part skipped\n");
        deft_graph_free(g);
        return;
    }
    cudaStream_t st = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t fb = deft_testing_node_buffer_bytes(fwd), gb = deft_testing_node_buffer_bytes(grad);
    void *raw = malloc((size_t)(3 * n) * 2);
    for (int64_t i = 0; i < 3 * n; i++) ref_store(raw, DEFT_BF16, i, ref_unif(&rng, -1.5, 1.5));
    char *qkv = dev_alloc((size_t)(3 * n) * 2), *dout = dev_alloc((size_t)n * 2);
    if (qkv) CUDA_OK(cudaMemcpy(qkv, raw, (size_t)(3 * n) * 2, cudaMemcpyHostToDevice));
    for (int64_t i = 0; i < n; i++) ref_store(raw, DEFT_BF16, i, ref_unif(&rng, -1.0, 1.0));
    if (dout) CUDA_OK(cudaMemcpy(dout, raw, (size_t)n * 2, cudaMemcpyHostToDevice));
    free(raw);
    void *fc = dev_alloc(fb), *fo = dev_alloc(fb), *gc = dev_alloc(gb), *go = dev_alloc(gb);
    char *skew = dev_alloc((size_t)(3 * n) * 2 + 16);
    void *f1 = dev_alloc(fb), *f2 = dev_alloc(fb);
    CUDA_OK(cudaDeviceSynchronize());
    if (fwd && grad && qkv && dout && fc && fo && gc && go && skew && f1 && f2) {
        const void *in[1] = {qkv};
        const size_t lse = deft_testing_node_extra_offset(fwd);
        if (cudnn_ran(deft_cudnn_attention(fwd, fc, in, st), fwd, 0, "packed forward")) {
            CHECK_OK(deft_cuda_attention_own(fwd, fo, in, st));
            CUDA_OK(cudaStreamSynchronize(st));
            compare_dev("packed forward output", fc, fo, 0, DEFT_BF16, n, 2e-2);
            compare_dev("packed forward log-sum-exp", fc, fo, lse, DEFT_F32, b * h * t, 1e-3);
            const void *gin[3] = {dout, qkv, fo};
            if (cudnn_ran(deft_cudnn_attention(grad, gc, gin, st), grad, DEFT_CUDA_DETERMINISTIC, "packed backward")) {
                CHECK_OK(deft_cuda_attention_own(grad, go, gin, st));
                CUDA_OK(cudaStreamSynchronize(st));
                compare_dev("packed gradient", gc, go, 0, DEFT_BF16, 3 * n, 3e-2);
            }
        }
        /* qkv 2 bytes off alignment: cuDNN refuses; the plain kernel gives the aligned copy's bits */
        CUDA_OK(cudaMemcpy(skew + 2, qkv, (size_t)(3 * n) * 2, cudaMemcpyDeviceToDevice));
        const void *off[1] = {skew + 2};
        const deft_status s = deft_cudnn_attention(fwd, f1, off, st);
        CHECK_MSG(s == DEFT_CUDNN_ATTENTION_REFUSED && strstr(deft_errmsg(), "aligned"), "misaligned qkv: %s, %s",
                  deft_status_name(s), deft_errmsg());
        CHECK_OK(deft_testing_set_debug("ATTENTION_KERNEL", 1));
        CHECK_OK(deft_cuda_attention_own(fwd, f1, off, st));
        CHECK_OK(deft_cuda_attention_own(fwd, f2, in, st));
        CHECK_OK(deft_testing_set_debug("ATTENTION_KERNEL", 0));
        CUDA_OK(cudaStreamSynchronize(st));
        double *y1 = dev_read(f1, 0, DEFT_BF16, n), *y2 = dev_read(f2, 0, DEFT_BF16, n);
        CHECK_MSG(pk_differ(y1, y2, n) == 0 && pk_rel_err(y2, y2, n) == 0.0, "misaligned qkv: the plain kernel's "
                  "output differs from the aligned one's");
        free(y1);
        free(y2);
    }
    void *bufs[] = {qkv, dout, fc, fo, gc, go, skew, f1, f2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    deft_cudnn_attention_release(0);
    deft_stream_workspaces_release(0, st);
    cudaStreamDestroy(st);
    deft_graph_free(g);
}
#endif

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    test_each_kernel();
#ifdef DEFT_HAVE_CUDA
    if (GPU.type == DEFT_CUDA) test_cudnn_direct();
#endif
    return deft_check_finish();
}
