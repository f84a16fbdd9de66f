/* Shared by cross-entropy's CUDA files (cuda_cross_entropy.cu: the warp, plain block and register kernels and the
 * launches; cuda_ce_stream.cu: the kernels that stream rows through shared memory): the options, the bad-target
 * record, and the block kernels' group loads and folds, which every block kernel uses so that all of them give the
 * same bits. Not installed. */
#ifndef DEFT_CUDA_CROSS_ENTROPY_CUH
#define DEFT_CUDA_CROSS_ENTROPY_CUH

#include <string.h>

#include "cuda_block_reduce.cuh"
#include "cuda_common.cuh"
#include "cuda_rounding.cuh"
#include "device_errors.h"

/* A target outside [0, C) (and not the ignore index) is data, known only once the kernel runs: the kernel records
 * the lowest such row in the device's error record (mem/device_errors.h) and carries on, its rows giving NaN; the
 * host reports the record when it next reads an output, so no launch waits for the host. The row is clamped so that
 * no key equals "none". */
__device__ __forceinline__ void deft_ce_record_bad(deft_device_errors *rec, int64_t row, int32_t target, int64_t c) {
    const unsigned long long r = (unsigned long long)(row < 0xfffffffell ? row : 0xfffffffell);
    const unsigned long long key = (r << 32) | (unsigned long long)(uint32_t)target;
    /* Only a kernel that lowered the key writes C; within one kernel every writer writes the same C. */
    if (key < atomicMin(&rec->ce_bad, key)) rec->ce_classes = (long long)c;
}

/* The options, by value: a captured graph keeps them. */
struct deft_ce_opts {
    int has_ignore;
    int32_t ignore_index;
    double ls;          /* label smoothing */
    int sum;            /* reduction: 1 sum, 0 mean */
};

__device__ __forceinline__ bool deft_ce_ignored(const deft_ce_opts &o, int32_t t) {
    return o.has_ignore && t == o.ignore_index;
}

/* ---- rows of many classes: a block per row ----
 * Thread k takes the groups of DEFT_CE_GROUP neighbouring classes k, k + B, k + 2B, ... (B threads), each group's
 * elements in order, and deft_block_reduce combines the threads in a fixed tree: the order depends on C alone (B is
 * deft_ce_row_threads(C)). */
#define DEFT_CE_ROW_MIN 1024
#define DEFT_CE_ROW_MAX_THREADS 1024
#define DEFT_CE_GROUP 8

/* Whole warps, about four groups a thread, at most DEFT_CE_ROW_MAX_THREADS: a function of C alone. */
static inline int deft_ce_row_threads(int64_t c) {
    const int64_t groups = (c + DEFT_CE_GROUP - 1) / DEFT_CE_GROUP, t = (groups / 4 + 31) / 32 * 32;
    return (int)(t < 32 ? 32 : t > DEFT_CE_ROW_MAX_THREADS ? DEFT_CE_ROW_MAX_THREADS : t);
}


/* Group g of the row into v (its elements that are < c: the count returned). A group is read with 16-byte loads
 * where the row starts on 16 bytes (8 halves in one, 8 floats in two), element by element otherwise, in the same
 * order either way. */
template <class T>
__device__ __forceinline__ int deft_ce_group(const T *x, int64_t c, int64_t g, bool wide, typename deft_ty<T>::C *v) {
    typedef deft_ty<T> Ty;
    const int64_t l0 = g * DEFT_CE_GROUP;
    if (l0 + DEFT_CE_GROUP > c) {
        const int n = (int)(c - l0);
#pragma unroll
        for (int j = 0; j < DEFT_CE_GROUP; j++)
            if (j < n) v[j] = Ty::load(x[l0 + j]);
        return n;
    }
    if (wide) {
        constexpr int per = (int)(16 / sizeof(T));
#pragma unroll
        for (int k = 0; k < DEFT_CE_GROUP; k += per) {
            const uint4 raw = *reinterpret_cast<const uint4 *>(x + l0 + k);
            T e[per];
            memcpy(e, &raw, sizeof raw);
#pragma unroll
            for (int j = 0; j < per; j++) v[k + j] = Ty::load(e[j]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < DEFT_CE_GROUP; j++) v[j] = Ty::load(x[l0 + j]);
    }
    return DEFT_CE_GROUP;
}

/* exp(x) of a logit less its row's maximum (x <= 0), as every block kernel takes it: in float, one ex2 of x log2(e)
 * (exp2f: ex2.approx, within 2 ulp), not expf's longer sequence, which held the streamed rows' pass to the SM's issue
 * rate rather than the memory's. The product x log2(e) adds a relative error of |x| 2^-24 at most, in terms that
 * are e^x small: the row's sum, dominated by the terms near its maximum, moves by under 1e-7 of itself. f64 keeps
 * exp. */
template <class C> __device__ __forceinline__ C deft_ce_exp(C x) { return deft_math_exp(x); }
template <> __device__ __forceinline__ float deft_ce_exp<float>(float x) {
    return exp2f(deft_rn_mul(x, 1.44269504088896340736f));
}

/* One group's elements v[0, n) folded into the maximum (NaN wins), and into the sum of exp(v - m) and, with want_sx,
 * the sum of v: every block kernel folds a group with these, so all of them combine the same values in the same
 * order. A group's exponentials (and values) are added in the compute type C, in order, and the group's sum into
 * the thread's double: the double sum's conversions, one an element, cost the kernels more than the memory did
 * (conversions to and from double issue at a quarter of the float rate or less). For float C the group's sum of
 * at most 8 terms in (0, 1] is within 7 float roundings of exact (3.5e-7 relative), so log(sum), and with it the
 * loss, is within 4e-7 of the double sum's: under half an f32 ulp of a loss of 1 or more. */
template <class C> __device__ __forceinline__ C deft_ce_fold_max(const C *v, int n, C m) {
#pragma unroll
    for (int j = 0; j < DEFT_CE_GROUP; j++)
        if (j < n) m = deft_max_nan(v[j], m);
    return m;
}
template <class C>
__device__ __forceinline__ void deft_ce_fold_sum(const C *v, int n, C m, bool want_sx, double *s, double *sx) {
    C gs = C(0), gx = C(0);
#pragma unroll
    for (int j = 0; j < DEFT_CE_GROUP; j++)
        if (j < n) {
            gs = deft_rn_add(gs, deft_ce_exp(deft_rn_sub(v[j], m)));
            if (want_sx) gx = deft_rn_add(gx, v[j]);
        }
    *s += (double)gs;
    if (want_sx) *sx += (double)gx;
}

/* The gradient's constants in the compute type: scale (dloss, over the count for a mean), hit = 1 - ls, base =
 * ls / C, each formed in double and rounded once, and inv = 1 / sum(exp), per row. */
/* The row's maximum (NaN wins), the sum of exp(x - max) in double and, with want_sx, the sum of x; every thread of
 * the block calls it and gets all three. x may be in global or shared memory; wide: it starts on 16 bytes. */
template <class T>
__device__ __forceinline__ void deft_ce_block_stats(const T *x, int64_t c, bool wide, bool want_sx,
                                                    typename deft_ty<T>::C *mx, double *sum, double *sumx) {
    typedef typename deft_ty<T>::C C;
    const int64_t ng = (c + DEFT_CE_GROUP - 1) / DEFT_CE_GROUP;
    C v[DEFT_CE_GROUP];
    C m = -INFINITY;
    for (int64_t g = threadIdx.x; g < ng; g += blockDim.x)
        m = deft_ce_fold_max(v, deft_ce_group(x, c, g, wide, v), m);
    m = deft_block_reduce(m, deft_r_max());
    double s = 0.0, sx = 0.0;
    for (int64_t g = threadIdx.x; g < ng; g += blockDim.x)
        deft_ce_fold_sum(v, deft_ce_group(x, c, g, wide, v), m, want_sx, &s, &sx);
    *mx = m;
    *sum = deft_block_reduce(s, deft_r_sum());
    *sumx = want_sx ? deft_block_reduce(sx, deft_r_sum()) : 0.0;
}

template <class C> struct deft_ce_gk {
    C scale, hit, base;
};
template <class C> __device__ __forceinline__ deft_ce_gk<C> deft_ce_gk_of(double scale, double ls, int64_t c) {
    deft_ce_gk<C> k;
    k.scale = (C)scale;
    k.hit = (C)(1.0 - ls);
    k.base = (C)(ls / (double)c);
    return k;
}

/* The gradient of one group, l0 its first class: (exp(v - m) inv - [class == tr] hit - base) scale, in the compute
 * type (float for halves and f32: the double form's two conversions an element held the kernel at half the memory's
 * rate; the float form is within 3 float roundings of it, relative to the larger of p and hit, times scale), rounded
 * once to T, and stored with 16-byte stores where wide and the group is whole. Halves are the f32 gradient rounded
 * once, so half logits still give the cast of the f32 logits' gradient. */
template <class T, class I>
__device__ __forceinline__ void deft_ce_grad_store(T *orow, I l0, const typename deft_ty<T>::C *v, int n,
                                                   typename deft_ty<T>::C m, typename deft_ty<T>::C inv, int32_t tr,
                                                   const deft_ce_gk<typename deft_ty<T>::C> &k, bool wide) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C C;
    T w[DEFT_CE_GROUP];
#pragma unroll
    for (int j = 0; j < DEFT_CE_GROUP; j++)
        if (j < n) {
            const C p = deft_rn_mul(deft_ce_exp(deft_rn_sub(v[j], m)), inv);
            const C d = deft_rn_sub(deft_rn_sub(p, l0 + j == tr ? k.hit : C(0)), k.base);
            w[j] = Ty::store(deft_rn_mul(d, k.scale));
        }
    if (wide && n == DEFT_CE_GROUP) {
        constexpr int per = (int)(16 / sizeof(T));
#pragma unroll
        for (int q = 0; q < DEFT_CE_GROUP; q += per) {
            uint4 raw;
            memcpy(&raw, w + q, sizeof raw);
            *reinterpret_cast<uint4 *>(orow + l0 + q) = raw;
        }
    } else {
#pragma unroll
        for (int j = 0; j < DEFT_CE_GROUP; j++)
            if (j < n) orow[l0 + j] = w[j];
    }
}

/* The scale of every gradient element: dloss for a sum, dloss / count for a mean (0 when no row counts). */
__device__ __forceinline__ double deft_ce_grad_scale(const deft_ce_opts &op, double dl, long long count) {
    return op.sum ? dl : count > 0 ? dl / (double)count : 0.0;
}

/* The loss of a row from its statistics, in double: (1 - ls) (lse - x[t]) + ls (lse - mean(x)); without smoothing
 * only the first term. */
__device__ __forceinline__ double deft_ce_row_nll(double m, double xt, double s, double sx, int64_t c, double ls) {
    const double nll = (m - xt) + log(s);
    return ls == 0.0 ? nll : (1.0 - ls) * nll + ls * ((m - sx / (double)c) + log(s));
}

/* The streaming kernels (cuda_ce_stream.cu): the loss's partials and counts per plain block (nb of them, as the
 * plain kernel's grid), and the gradient; false where they do not take the rows (nothing launched). */
bool deft_cuda_ce_stream_loss(deft_dtype dt, const void *x, const int32_t *t, int64_t rows, int64_t c, int nb,
                              deft_device_errors *rec, const deft_ce_opts &o, double *partial, long long *count,
                              cudaStream_t st);
bool deft_cuda_ce_stream_grad(deft_dtype dt, bool f32_dloss, void *out, const void *dloss, const void *x,
                              const int32_t *t, int64_t rows, int64_t c, deft_device_errors *rec,
                              const deft_ce_opts &o, const long long *grad_count, cudaStream_t st);

/* Both from one read of each row, the rows walked as the loss's nb plain blocks (the loss's partials and counts, and
 * the gradient); false where the rows do not stream (nothing launched). */
bool deft_cuda_ce_stream_pair(deft_dtype dt, bool f32_dloss, void *out, const void *dloss, const void *x,
                              const int32_t *t, int64_t rows, int64_t c, int nb, deft_device_errors *rec,
                              const deft_ce_opts &o, double *partial, long long *count, const long long *grad_count,
                              cudaStream_t st);

#endif
