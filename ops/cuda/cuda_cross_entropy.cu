/* Fused cross-entropy and its gradient on a GPU, with the options of the node's p.ce (an ignore index, label
 * smoothing, mean or sum). The formulas are the CPU backend's (ops/cpu/cpu_cross_entropy.c): the row maximum is
 * subtracted before exp, the exponentials summed in double, and the row's loss formed in double.
 *
 * The loss may be f32 beside f16 or bf16 logits, and the gradient's dloss f32 beside them (autocast's loss,
 * deft_cross_entropy_as): halves load exactly into float and every kernel's order of work depends on the shape
 * alone, never on the dtype, so such logits give the loss bits that the same logits cast to f32 give, and the
 * gradient, rounded once from double through float, the bits of the f32 gradient's cast. Rows of at least
 * DEFT_CE_ROW_MIN classes take a block each (deft_k_ce_*_block); shorter ones a warp (the plain kernels). */
#include <string.h>

#include "cuda_block_reduce.cuh"
#include "cuda_common.cuh"
#include "cuda_tuning.h"
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

/* Every lane gets the result: the xor butterfly combines the same pairs in every lane, so they agree bit for bit. */
template <class A> __device__ __forceinline__ A deft_warp_max(A v) {
    for (int off = 16; off > 0; off >>= 1) v = deft_max_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
__device__ __forceinline__ double deft_warp_sum(double v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ long long deft_warp_sum_ll(long long v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* The row's maximum (NaN wins, so a row holding NaN gives NaN) and the sum of exp(x - max) in double; every lane of
 * the warp calls it and gets both. */
template <class T>
__device__ void deft_ce_row_stats(const T *x, int64_t c, int lane, typename deft_ty<T>::C *mx, double *sum) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C C;
    C m = -INFINITY;
    for (int64_t l = lane; l < c; l += 32) m = deft_max_nan(Ty::load(x[l]), m);
    m = deft_warp_max(m);
    double s = 0.0;
    for (int64_t l = lane; l < c; l += 32) s += (double)deft_math_exp(Ty::load(x[l]) - m);
    *mx = m;
    *sum = deft_warp_sum(s);
}

/* The loss of a row whose target tr is a class, in every lane: (1 - ls) (lse - x[t]) + ls (lse - mean(x)); without
 * smoothing only the first term, formed as it always was. */
template <class T>
__device__ double deft_ce_row_loss(const T *xr, int64_t c, int lane, int32_t tr, double ls) {
    typedef deft_ty<T> Ty;
    typename Ty::C m;
    double s;
    deft_ce_row_stats(xr, c, lane, &m, &s);
    const double nll = ((double)m - (double)Ty::load(xr[tr])) + log(s);
    if (ls == 0.0) return nll;
    double sx = 0.0;
    for (int64_t l = lane; l < c; l += 32) sx += (double)Ty::load(xr[l]);
    sx = deft_warp_sum(sx);
    return (1.0 - ls) * nll + ls * (((double)m - sx / (double)c) + log(s));
}

/* The loss in two kernels, a warp per row: the first has each block sum its warps' rows (each warp's rows in order,
 * then the warps in order) into deft_ce_partial[block], and count its rows not ignored into deft_ce_count[block]; the
 * second sums the blocks' partials in a fixed order and divides by the count (mean) or not (sum). The partition
 * depends only on N, so the loss does not depend on scheduling. deft_ce_partial and deft_ce_count are one buffer per
 * device: two cross-entropy losses must not run at once on one device (the executor runs a device's steps in order
 * on one stream). At most DEFT_CE_MAX_BLOCKS blocks (cuda_tuning.h). */
#define DEFT_CE_ROWS_PER_BLOCK (DEFT_CUDA_THREADS / 32)
__device__ double deft_ce_partial[DEFT_CE_MAX_BLOCKS];
__device__ long long deft_ce_count[DEFT_CE_MAX_BLOCKS];
/* The rows not ignored, for the gradient of a mean (deft_k_ce_count); the gradient runs on its device's stream as
 * well, after the count kernel. */
__device__ long long deft_ce_grad_count;

template <class T>
__global__ void deft_k_cross_entropy_rows(const T *x, const int32_t *t, int64_t rows, int64_t c,
                                          deft_device_errors *rec, deft_ce_opts o) {
    __shared__ double part[DEFT_CUDA_THREADS / 32];
    __shared__ long long cnt[DEFT_CUDA_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t stride = (int64_t)gridDim.x * nw;
    double acc = 0.0;
    long long n = 0;
    for (int64_t r = (int64_t)blockIdx.x * nw + warp; r < rows; r += stride) {
        const int32_t tr = t[r];
        if (deft_ce_ignored(o, tr)) continue;
        n++;
        if (tr < 0 || tr >= c) {
            if (lane == 0) deft_ce_record_bad(rec, r, tr, c);
            acc = NAN;
            continue;
        }
        acc += deft_ce_row_loss(x + r * c, c, lane, tr, o.ls);
    }
    if (lane == 0) {
        part[warp] = acc;
        cnt[warp] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        long long count = 0;
        for (int w = 0; w < nw; w++) {
            total += part[w];
            count += cnt[w];
        }
        deft_ce_partial[blockIdx.x] = total;
        deft_ce_count[blockIdx.x] = count;
    }
}

/* One warp; T is the loss's dtype (the logits' or f32). */
template <class T> __global__ void deft_k_cross_entropy_reduce(T *out, int nblocks, int sum) {
    double s = 0.0;
    long long n = 0;
    for (int b = threadIdx.x; b < nblocks; b += 32) {
        s += deft_ce_partial[b];
        n += deft_ce_count[b];
    }
    s = deft_warp_sum(s);
    n = deft_warp_sum_ll(n);
    /* The mean of no rows (all ignored) is NaN, as in torch. */
    if (threadIdx.x == 0) out[0] = deft_ty<T>::from_f64(sum ? s : n > 0 ? s / (double)n : (double)NAN);
}

/* One block: the rows not ignored into deft_ce_grad_count, for the gradient of a mean under an ignore index. */
__global__ void deft_k_ce_count(const int32_t *t, int64_t rows, deft_ce_opts o) {
    __shared__ long long part[DEFT_CUDA_THREADS / 32];
    long long n = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) n += deft_ce_ignored(o, t[r]) ? 0 : 1;
    n = deft_warp_sum_ll(n);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = n;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long total = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) total += part[w];
        deft_ce_grad_count = total;
    }
}

/* A warp per row over the whole grid: (softmax(row) - (1 - ls) onehot(t) - ls / C) * scale, with scale dloss / count
 * for a mean (count: `rows` without an ignore index, else the count kernel's) and dloss for a sum; ignored rows 0. */
template <class T, class D>
__global__ void deft_k_cross_entropy_grad(T *o, const D *dloss, const T *x, const int32_t *t, int64_t rows,
                                          int64_t c, deft_device_errors *rec, deft_ce_opts op) {
    typedef deft_ty<T> Ty;
    const int lane = threadIdx.x & 31;
    const int64_t warp0 = deft_tid() >> 5, nwarps = deft_nthreads() >> 5;
    const long long count = op.has_ignore ? deft_ce_grad_count : (long long)rows;
    const double dl = (double)deft_ty<D>::load(dloss[0]);
    const double scale = op.sum ? dl : count > 0 ? dl / (double)count : 0.0;
    const double hit = 1.0 - op.ls, base = op.ls / (double)c;
    for (int64_t r = warp0; r < rows; r += nwarps) {
        const int32_t tr = t[r];
        const T *xr = x + r * c;
        T *orow = o + r * c;
        if (deft_ce_ignored(op, tr)) {
            for (int64_t l = lane; l < c; l += 32) orow[l] = Ty::from_f64(0.0);
            continue;
        }
        if (tr < 0 || tr >= c) {
            if (lane == 0) deft_ce_record_bad(rec, r, tr, c);
            for (int64_t l = lane; l < c; l += 32) orow[l] = Ty::from_f64((double)NAN);
            continue;
        }
        typename Ty::C m;
        double s;
        deft_ce_row_stats(xr, c, lane, &m, &s);
        const double inv = 1.0 / s;
        for (int64_t l = lane; l < c; l += 32) {
            const double p = (double)deft_math_exp(Ty::load(xr[l]) - m) * inv;
            orow[l] = Ty::from_f64((p - (l == tr ? hit : 0.0) - base) * scale);
        }
    }
}

/* ---- rows of many classes: a block per row ----
 * Thread k takes the groups of DEFT_CE_GROUP neighbouring classes k, k + B, k + 2B, ... (B threads), each group's
 * elements in order, and deft_block_reduce combines the threads in a fixed tree: the order depends on C alone (B is
 * deft_ce_row_threads(C)). A group is read with 16-byte loads where the row starts on 16 bytes (8 halves in one, 8
 * floats in two), element by element otherwise, in the same order either way. A warp per row read a GPT-2 row
 * (50304 classes) as 32 scalar streams three times over; a block reads it wide, and its re-reads of the row come
 * soon enough to find it in L2. The max and the sum of exponentials take two passes (the sum needs the max). */
#define DEFT_CE_ROW_MIN 1024
#define DEFT_CE_ROW_MAX_THREADS 1024
#define DEFT_CE_GROUP 8

/* Whole warps, about four groups a thread, at most DEFT_CE_ROW_MAX_THREADS: a function of C alone. */
static int deft_ce_row_threads(int64_t c) {
    const int64_t groups = (c + DEFT_CE_GROUP - 1) / DEFT_CE_GROUP, t = (groups / 4 + 31) / 32 * 32;
    return (int)(t < 32 ? 32 : t > DEFT_CE_ROW_MAX_THREADS ? DEFT_CE_ROW_MAX_THREADS : t);
}

/* Group g of the row into v (its elements that are < c: the count returned). */
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

/* The row's maximum (NaN wins), the sum of exp(x - max) in double and, with want_sx, the sum of x; every thread of
 * the block calls it and gets all three. */
template <class T>
__device__ void deft_ce_block_stats(const T *x, int64_t c, bool want_sx, typename deft_ty<T>::C *mx, double *sum,
                                    double *sumx) {
    typedef typename deft_ty<T>::C C;
    const int64_t ng = (c + DEFT_CE_GROUP - 1) / DEFT_CE_GROUP;
    const bool wide = ((uintptr_t)x & 15) == 0;
    C v[DEFT_CE_GROUP];
    C m = -INFINITY;
    for (int64_t g = threadIdx.x; g < ng; g += blockDim.x) {
        const int n = deft_ce_group(x, c, g, wide, v);
#pragma unroll
        for (int j = 0; j < DEFT_CE_GROUP; j++)
            if (j < n) m = deft_max_nan(v[j], m);
    }
    m = deft_block_reduce(m, deft_r_max());
    double s = 0.0, sx = 0.0;
    for (int64_t g = threadIdx.x; g < ng; g += blockDim.x) {
        const int n = deft_ce_group(x, c, g, wide, v);
#pragma unroll
        for (int j = 0; j < DEFT_CE_GROUP; j++)
            if (j < n) {
                s += (double)deft_math_exp(v[j] - m);
                if (want_sx) sx += (double)v[j];
            }
    }
    *mx = m;
    *sum = deft_block_reduce(s, deft_r_sum());
    *sumx = want_sx ? deft_block_reduce(sx, deft_r_sum()) : 0.0;
}

/* The loss's first kernel with a block per row (grid-stride): block b sums its rows' losses in order into
 * deft_ce_partial[b] and counts them into deft_ce_count[b], for deft_k_cross_entropy_reduce. A row's target is
 * the same for the whole block, so every thread takes the same branches (the reductions synchronise the block). */
template <class T>
__global__ void __launch_bounds__(DEFT_CE_ROW_MAX_THREADS)
    deft_k_ce_rows_block(const T *x, const int32_t *t, int64_t rows, int64_t c, deft_device_errors *rec,
                         deft_ce_opts o) {
    typedef deft_ty<T> Ty;
    double acc = 0.0;
    long long n = 0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int32_t tr = t[r];
        if (deft_ce_ignored(o, tr)) continue;
        n++;
        if (tr < 0 || tr >= c) {
            if (threadIdx.x == 0) deft_ce_record_bad(rec, r, tr, c);
            acc = NAN;
            continue;
        }
        const T *xr = x + r * c;
        typename Ty::C m;
        double s, sx;
        deft_ce_block_stats(xr, c, o.ls != 0.0, &m, &s, &sx);
        const double nll = ((double)m - (double)Ty::load(xr[tr])) + log(s);
        acc += o.ls == 0.0 ? nll : (1.0 - o.ls) * nll + o.ls * (((double)m - sx / (double)c) + log(s));
    }
    if (threadIdx.x == 0) {
        deft_ce_partial[blockIdx.x] = acc;
        deft_ce_count[blockIdx.x] = n;
    }
}

/* The gradient with a block per row (grid-stride), each element formed as deft_k_cross_entropy_grad forms it and
 * written in groups, with 16-byte stores where both rows start on 16 bytes. */
template <class T, class D>
__global__ void __launch_bounds__(DEFT_CE_ROW_MAX_THREADS)
    deft_k_ce_grad_block(T *o, const D *dloss, const T *x, const int32_t *t, int64_t rows, int64_t c,
                         deft_device_errors *rec, deft_ce_opts op) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C C;
    const long long count = op.has_ignore ? deft_ce_grad_count : (long long)rows;
    const double dl = (double)deft_ty<D>::load(dloss[0]);
    const double scale = op.sum ? dl : count > 0 ? dl / (double)count : 0.0;
    const double hit = 1.0 - op.ls, base = op.ls / (double)c;
    const int64_t ng = (c + DEFT_CE_GROUP - 1) / DEFT_CE_GROUP;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int32_t tr = t[r];
        const T *xr = x + r * c;
        T *orow = o + r * c;
        const bool ignored = deft_ce_ignored(op, tr);
        if (!ignored && (tr < 0 || tr >= c)) {
            if (threadIdx.x == 0) deft_ce_record_bad(rec, r, tr, c);
            for (int64_t l = threadIdx.x; l < c; l += blockDim.x) orow[l] = Ty::from_f64((double)NAN);
            continue;
        }
        if (ignored) {
            for (int64_t l = threadIdx.x; l < c; l += blockDim.x) orow[l] = Ty::from_f64(0.0);
            continue;
        }
        C m;
        double s, sx;
        deft_ce_block_stats(xr, c, false, &m, &s, &sx);
        const double inv = 1.0 / s;
        const bool wide = (((uintptr_t)xr | (uintptr_t)orow) & 15) == 0;
        for (int64_t g = threadIdx.x; g < ng; g += blockDim.x) {
            C v[DEFT_CE_GROUP];
            T w[DEFT_CE_GROUP];
            const int n = deft_ce_group(xr, c, g, wide, v);
            const int64_t l0 = g * DEFT_CE_GROUP;
#pragma unroll
            for (int j = 0; j < DEFT_CE_GROUP; j++)
                if (j < n) {
                    const double p = (double)deft_math_exp(v[j] - m) * inv;
                    w[j] = Ty::from_f64((p - (l0 + j == tr ? hit : 0.0) - base) * scale);
                }
            if (wide && n == DEFT_CE_GROUP) {
                constexpr int per = (int)(16 / sizeof(T));
#pragma unroll
                for (int k = 0; k < DEFT_CE_GROUP; k += per) {
                    uint4 raw;
                    memcpy(&raw, w + k, sizeof raw);
                    *reinterpret_cast<uint4 *>(orow + l0 + k) = raw;
                }
            } else {
#pragma unroll
                for (int j = 0; j < DEFT_CE_GROUP; j++)
                    if (j < n) orow[l0 + j] = w[j];
            }
        }
    }
}

static bool deft_ce_same_shape(const deft_tensor *a, const deft_tensor *b) {
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

static deft_status deft_ce_check(const deft_tensor *n, const deft_tensor *logits, const deft_tensor *targets,
                                 deft_ce_opts *o) {
    if (logits->ndim != 2 || targets->ndim != 1 || targets->shape[0] != logits->shape[0])
        return deft_set_error(DEFT_ERR_SHAPE, "%s: logits must be [N, C] and targets [N]", deft_op_name(n->op));
    if (!(n->p.ce.smoothing >= 0.0 && n->p.ce.smoothing < 1.0) ||
        (n->p.ce.reduction != DEFT_REDUCTION_MEAN && n->p.ce.reduction != DEFT_REDUCTION_SUM))
        return deft_set_error(DEFT_ERR_INVALID, "%s: label smoothing %g or reduction %d out of range",
                              deft_op_name(n->op), n->p.ce.smoothing, n->p.ce.reduction);
    o->has_ignore = n->p.ce.has_ignore;
    o->ignore_index = n->p.ce.ignore_index;
    o->ls = n->p.ce.smoothing;
    o->sum = n->p.ce.reduction == DEFT_REDUCTION_SUM;
    return DEFT_OK;
}

deft_status deft_cuda_cross_entropy(const deft_tensor *n, void *out, const void *logits, const void *targets,
                                    cudaStream_t st) {
    deft_ce_opts o;
    const deft_tensor *lg = n->src[0];
    deft_status s = deft_ce_check(n, lg, n->src[1], &o);
    if (s != DEFT_OK) return s;
    const bool float_logits =
        lg->dtype == DEFT_F32 || lg->dtype == DEFT_F64 || lg->dtype == DEFT_F16 || lg->dtype == DEFT_BF16;
    if (!float_logits || (n->dtype != lg->dtype && n->dtype != DEFT_F32))
        return deft_set_error(DEFT_ERR_DTYPE, "cross_entropy: a %s loss of %s logits (the logits' dtype or f32)",
                              deft_dtype_name(n->dtype), deft_dtype_name(lg->dtype));
    const int64_t rows = lg->shape[0], c = lg->shape[1];
    deft_device_errors *rec = NULL;
    s = deft_device_errors_get(n->device.index, st, &rec);
    if (s != DEFT_OK) return s;
    const bool by_block = c >= DEFT_CE_ROW_MIN;
    const int64_t per_block = by_block ? 1 : DEFT_CE_ROWS_PER_BLOCK, want = (rows + per_block - 1) / per_block;
    const int blocks = (int)(want < 1 ? 1 : want > DEFT_CE_MAX_BLOCKS ? DEFT_CE_MAX_BLOCKS : want);
    s = deft_with_float_dtype(lg, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        if (by_block)
            deft_k_ce_rows_block<T><<<blocks, deft_ce_row_threads(c), 0, st>>>((const T *)logits,
                                                                                (const int32_t *)targets, rows, c,
                                                                                rec, o);
        else
            deft_k_cross_entropy_rows<T><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(
                (const T *)logits, (const int32_t *)targets, rows, c, rec, o);
        return deft_cuda_check_launch(n, "cross_entropy rows");
    });
    if (s != DEFT_OK) return s;
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        deft_k_cross_entropy_reduce<T><<<1, 32, 0, st>>>((T *)out, blocks, o.sum);
        return deft_cuda_check_launch(n, "cross_entropy reduce");
    });
}

template <class T, class D>
static deft_status deft_ce_grad_launch(const deft_tensor *n, void *out, const void *dloss, const void *logits,
                                       const void *targets, int64_t rows, int64_t c, deft_device_errors *rec,
                                       const deft_ce_opts &o, cudaStream_t st) {
    if (c >= DEFT_CE_ROW_MIN) {
        const unsigned blocks = (unsigned)(rows < 1 ? 1 : rows > DEFT_CUDA_MAX_BLOCKS ? DEFT_CUDA_MAX_BLOCKS : rows);
        deft_k_ce_grad_block<T, D><<<blocks, deft_ce_row_threads(c), 0, st>>>(
            (T *)out, (const D *)dloss, (const T *)logits, (const int32_t *)targets, rows, c, rec, o);
    } else {
        deft_k_cross_entropy_grad<T, D><<<deft_cuda_blocks(rows * 32, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (T *)out, (const D *)dloss, (const T *)logits, (const int32_t *)targets, rows, c, rec, o);
    }
    return deft_cuda_check_launch(n, "cross_entropy_grad");
}

deft_status deft_cuda_cross_entropy_grad(const deft_tensor *n, void *out, const void *dloss, const void *logits,
                                         const void *targets, cudaStream_t st) {
    deft_ce_opts o;
    deft_status s = deft_ce_check(n, n->src[1], n->src[2], &o);
    if (s != DEFT_OK) return s;
    if (deft_shape_numel(n->src[0]->ndim, n->src[0]->shape) != 1 || !deft_ce_same_shape(n, n->src[1]))
        return deft_set_error(DEFT_ERR_SHAPE, "cross_entropy_grad: wants a one-element loss gradient and an output "
                                              "of the logits' shape");
    const deft_dtype dd = n->src[0]->dtype;
    if (n->src[1]->dtype != n->dtype || (dd != n->dtype && dd != DEFT_F32))
        return deft_set_error(DEFT_ERR_DTYPE, "cross_entropy_grad: a %s gradient of %s logits with a %s dloss",
                              deft_dtype_name(n->dtype), deft_dtype_name(n->src[1]->dtype), deft_dtype_name(dd));
    const int64_t rows = n->src[1]->shape[0], c = n->src[1]->shape[1];
    deft_device_errors *rec = NULL;
    s = deft_device_errors_get(n->device.index, st, &rec);
    if (s != DEFT_OK) return s;
    if (o.has_ignore && !o.sum) {
        deft_k_ce_count<<<1, DEFT_CUDA_THREADS, 0, st>>>((const int32_t *)targets, rows, o);
        s = deft_cuda_check_launch(n, "cross_entropy_grad count");
        if (s != DEFT_OK) return s;
    }
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        if (dd == n->dtype) return deft_ce_grad_launch<T, T>(n, out, dloss, logits, targets, rows, c, rec, o, st);
        return deft_ce_grad_launch<T, float>(n, out, dloss, logits, targets, rows, c, rec, o, st);
    });
}
