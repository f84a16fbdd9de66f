/* Several casts of one dtype pair in one launch: a fused group of passes/fusion_casts.c (autocast's casts of the
 * f32 master weights, a couple of dozen small launches a step otherwise, each mostly launch latency).
 *
 * The casts' elements are cut into units of four; a thread takes a unit, finds its cast by bisection over the
 * units' prefix sums (passed by value, so a captured graph keeps them) and converts it as the one-op kernels do
 * (deft_cast_four, deft_cast_one), so the values are those of the separate casts bit for bit. A cast whose source
 * and destination are aligned for four elements moves them in one load and one store; the others, and the tail of
 * each, one element at a time. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"

struct deft_casts_args {
    const void *src[DEFT_CASTS_MAX];
    void *dst[DEFT_CASTS_MAX];
    int64_t count[DEFT_CASTS_MAX];        /* elements */
    int64_t first_unit[DEFT_CASTS_MAX + 1];
    bool vec[DEFT_CASTS_MAX];
    int n;
};

template <class TI, class TO>
__device__ __forceinline__ void deft_casts_unit(const TI *a, TO *o, int64_t e, int64_t count, bool vec) {
    if (vec && e + 4 <= count) {
        deft_cast_four<TI, TO>(a + e, o + e);
        return;
    }
    for (int64_t i = e; i < e + 4 && i < count; i++) o[i] = deft_cast_one<TI, TO>(a[i]);
}

template <class TI, class TO> __global__ void deft_k_casts(const deft_casts_args args) {
    const int64_t units = args.first_unit[args.n];
    for (int64_t u = deft_tid(); u < units; u += deft_nthreads()) {
        int lo = 0, hi = args.n - 1;   /* the last cast starting at or before unit u */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (args.first_unit[mid] <= u) lo = mid;
            else hi = mid - 1;
        }
        deft_casts_unit<TI, TO>((const TI *)args.src[lo], (TO *)args.dst[lo], 4 * (u - args.first_unit[lo]),
                                args.count[lo], args.vec[lo]);
    }
}

deft_status deft_cuda_casts_run(const deft_tensor *const *casts, void *const *out, const void *const *in, int n,
                                void *stream) {
    if (n < 1 || n > DEFT_CASTS_MAX)
        return deft_set_error(DEFT_ERR_INVALID, "cuda casts: %d casts in one launch (1 to %d)", n, DEFT_CASTS_MAX);
    const deft_dtype from = casts[0]->src[0]->dtype, to = casts[0]->dtype;
    deft_casts_args args = {};
    args.n = n;
    for (int i = 0; i < n; i++) {
        const deft_tensor *c = casts[i];
        if (c->op != DEFT_OP_CAST || c->src[0]->dtype != from || c->dtype != to)
            return deft_set_error(DEFT_ERR_INVALID, "cuda casts: %s is not a cast from %s to %s", c->name,
                                  deft_dtype_name(from), deft_dtype_name(to));
        args.src[i] = in[i], args.dst[i] = out[i];
        args.count[i] = deft_shape_numel(c->ndim, c->shape);
        args.vec[i] = (uintptr_t)in[i] % (4 * deft_dtype_size(from)) == 0 &&
                      (uintptr_t)out[i] % (4 * deft_dtype_size(to)) == 0;
        args.first_unit[i + 1] = args.first_unit[i] + (args.count[i] + 3) / 4;
    }
    const int64_t units = args.first_unit[n];
    if (units == 0) return DEFT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    return deft_cuda_with_dtype(from, [&](auto tin) -> deft_status {
        typedef typename decltype(tin)::type TI;
        return deft_cuda_with_dtype(to, [&](auto tout) -> deft_status {
            typedef typename decltype(tout)::type TO;
            deft_k_casts<TI, TO><<<deft_cuda_blocks(units, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(args);
            return deft_cuda_check_launch(casts[0], "casts");
        });
    });
}
