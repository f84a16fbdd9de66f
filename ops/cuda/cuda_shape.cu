/* Layout changes that need a copy: permute, strided slices and concat. They move elements without looking at them,
 * so they work by element size (2, 4 or 8 bytes) and serve every dtype. */
#include <string.h>

#include "cuda_common.cuh"

/* out (contiguous over s.shape) [i] = in[base + sum of index * s.st[0]]. */
template <class E> __global__ void deft_k_gather(E *o, const E *in, int64_t n, deft_cuda_strides s) {
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        int64_t oi, unused;
        deft_cuda_offsets(s, i, &oi, &unused);
        o[i] = in[oi];
    }
}

/* Copies the strided view (shape, strides in elements) of `in` into contiguous `out`. */
static deft_status deft_strided_copy(const deft_tensor *n, void *out, const void *in, int ndim, const int64_t *shape,
                                     const int64_t *strides, cudaStream_t st) {
    const int64_t total = deft_shape_numel(ndim, shape);
    deft_cuda_strides s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    memcpy(s.shape, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(s.st[0], strides, sizeof(int64_t) * (size_t)ndim);
    deft_cuda_coalesce(&s, 1);
    const size_t esz = deft_dtype_size(n->dtype);
    if (s.ndim == 0 || (s.ndim == 1 && s.st[0][0] == 1)) {
        /* The view is one contiguous run after all. */
        cudaError_t e = cudaMemcpyAsync(out, in, (size_t)total * esz, cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess) return DEFT_OK;
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: copy failed: %s", deft_op_name(n->op),
                              cudaGetErrorString(e));
    }
    return deft_with_elem_size(esz, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type E;
        deft_k_gather<E><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (E *)out, (const E *)in, total, s);
        return deft_cuda_check_launch(n, "gather");
    });
}

deft_status deft_cuda_permute(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    const deft_tensor *src = n->src[0];
    if (src->ndim != n->ndim)
        return deft_set_error(DEFT_ERR_SHAPE, "permute: input rank %d against output rank %d", src->ndim, n->ndim);
    int64_t s[DEFT_MAX_DIMS], istr[DEFT_MAX_DIMS];
    deft_shape_strides(src->ndim, src->shape, s);
    /* Output dim i walks input dim perm[i]. */
    for (int i = 0; i < n->ndim; i++) {
        const int p = n->p.perm[i];
        if (p < 0 || p >= src->ndim)
            return deft_set_error(DEFT_ERR_SHAPE, "permute: perm[%d] = %d out of range for rank %d", i, p, src->ndim);
        istr[i] = s[p];
    }
    return deft_strided_copy(n, out, a, n->ndim, n->shape, istr, st);
}

deft_status deft_cuda_slice(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    const deft_tensor *src = n->src[0];
    const int ax = n->p.slice.axis;
    if (src->ndim != n->ndim || ax < 0 || ax >= n->ndim || n->p.slice.step <= 0 || n->p.slice.start < 0)
        return deft_set_error(DEFT_ERR_SHAPE, "slice: axis %d, start %lld, step %lld do not fit rank %d",
                              ax, (long long)n->p.slice.start, (long long)n->p.slice.step, src->ndim);
    int64_t istr[DEFT_MAX_DIMS];
    deft_shape_strides(src->ndim, src->shape, istr);
    const int64_t base = n->p.slice.start * istr[ax];
    istr[ax] *= n->p.slice.step;
    const char *from = (const char *)a + (size_t)base * deft_dtype_size(n->dtype);
    return deft_strided_copy(n, out, from, n->ndim, n->shape, istr, st);
}

/* One input of a concat: [outer, len, inner] written into the output's [outer, total_len, inner] at column
 * `at` (units of inner blocks). */
template <class E>
__global__ void deft_k_concat_part(E *o, const E *in, int64_t n, int64_t len_inner, int64_t total_inner,
                                   int64_t at_inner) {
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        const int64_t row = i / len_inner, col = i - row * len_inner;
        o[row * total_inner + at_inner + col] = in[i];
    }
}

deft_status deft_cuda_concat(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    const int ax = n->p.axis;
    if (ax < 0 || ax >= n->ndim)
        return deft_set_error(DEFT_ERR_SHAPE, "concat: axis %d out of range for rank %d", ax, n->ndim);
    const int64_t inner = deft_shape_numel(n->ndim - ax - 1, n->shape + ax + 1);
    const int64_t total_inner = n->shape[ax] * inner;
    return deft_with_elem_size(deft_dtype_size(n->dtype), [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type E;
        int64_t at = 0;
        /* One launch per input, all on the same stream: inputs are few, and each launch reads contiguously. */
        for (int k = 0; k < n->nsrc; k++) {
            const deft_tensor *src = n->src[k];
            const int64_t cnt = deft_shape_numel(src->ndim, src->shape);
            if (src->ndim != n->ndim || at + src->shape[ax] > n->shape[ax])
                return deft_set_error(DEFT_ERR_SHAPE, "concat: input %d does not fit the output", k);
            if (cnt > 0) {
                deft_k_concat_part<E><<<deft_cuda_blocks(cnt, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
                    (E *)out, (const E *)in[k], cnt, src->shape[ax] * inner, total_inner, at * inner);
                deft_status s = deft_cuda_check_launch(n, "concat");
                if (s != DEFT_OK) return s;
            }
            at += src->shape[ax];
        }
        return DEFT_OK;
    });
}
