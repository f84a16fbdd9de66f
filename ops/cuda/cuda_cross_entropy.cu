/* Fused cross-entropy and its gradient on a GPU, with the options of the node's p.ce (an ignore index, label
 * smoothing, mean or sum). The formulas are the CPU backend's (ops/cpu/cpu_cross_entropy.c): the row maximum is
 * subtracted before exp and the row's loss formed in double. Rows shorter than DEFT_CE_ROW_MIN take a warp each and
 * sum their exponentials in double; longer ones a block each, which sums each group of 8 exponentials in the compute
 * type (float for halves and f32) and the groups in double, and forms the gradient in the compute type, rounded once
 * to the logits' dtype (cuda_cross_entropy.cuh says why and what it costs: under half an f32 ulp of the loss).
 *
 * The loss may be f32 beside f16 or bf16 logits, and the gradient's dloss f32 beside them (autocast's loss,
 * deft_cross_entropy_as): halves load exactly into float and every kernel's order of work depends on the shape
 * alone, never on the dtype, so such logits give the loss bits that the same logits cast to f32 give, and the
 * gradient the bits of the f32 gradient's cast. Rows of at least DEFT_CE_ROW_MIN classes stream through shared
 * memory where they fit it twice and start on 16 bytes (cuda_ce_stream.cu), else are held in registers where they
 * fit (deft_k_ce_*_regs), else re-read each pass (deft_k_ce_*_block, the plain kernels, which the CE_REFERENCE debug
 * knob forces); all three fold with the same functions in the same order, so they give the same bits. Every gradient
 * kernel reads a row before writing it, so the gradient may take over the logits' buffer (ir/op_table.c). */
#include <string.h>

#include "config.h"
#include "cuda_block_reduce.cuh"
#include "cuda_common.cuh"
#include "cuda_cross_entropy.cuh"
#include "cuda_kernels.h"
#include "cuda_tuning.h"
#include "device_errors.h"

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

/* ---- rows of many classes: a block per row (the groups and folds: cuda_cross_entropy.cuh) ----
 * A warp per row read a GPT-2 row (50304 classes) as 32 scalar streams three times over; a block reads it wide, and
 * its re-reads of the row come soon enough to find it in L2. The max and the sum of exponentials take two passes
 * (the sum needs the max): these plain kernels read the row again for each, the register kernels below and the
 * streaming ones (cuda_ce_stream.cu) once. */


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
        deft_ce_block_stats(xr, c, ((uintptr_t)xr & 15) == 0, o.ls != 0.0, &m, &s, &sx);
        acc += deft_ce_row_nll((double)m, (double)Ty::load(xr[tr]), s, sx, c, o.ls);
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
    const deft_ce_gk<C> gk =
        deft_ce_gk_of<C>(deft_ce_grad_scale(op, (double)deft_ty<D>::load(dloss[0]), count), op.ls, c);
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
        deft_ce_block_stats(xr, c, ((uintptr_t)xr & 15) == 0, false, &m, &s, &sx);
        const C inv = (C)(1.0 / s);
        const bool wide = (((uintptr_t)xr | (uintptr_t)orow) & 15) == 0;
        for (int64_t g = threadIdx.x; g < ng; g += blockDim.x) {
            C v[DEFT_CE_GROUP];
            const int n = deft_ce_group(xr, c, g, wide, v);
            deft_ce_grad_store(orow, g * DEFT_CE_GROUP, v, n, m, inv, tr, gk, wide);
        }
    }
}

/* ---- rows held in registers ----
 * The plain block kernels above read a row twice for the loss (max, then the sum) and three times for the gradient
 * (max, sum, then the write): GPT-2's bf16 logits are far larger than L2, so every pass is a trip to memory. These
 * kernels load thread k's groups (k, k + B, ... with B the plain kernels' deft_ce_row_threads(C)) once into
 * registers, as the raw bytes of the logits, and take the max, the sum and the gradient from there with the same
 * folds (deft_ce_fold_*, deft_ce_grad_store) and the same block reductions: the plain kernels' bits from one read.
 * G is the most groups a thread holds; rows needing more (and f64 logits) keep the plain kernels. Every thread has
 * its whole share of the row in registers before the first block reduction returns, so writing the gradient over
 * the logits (the planner's in place, passes/schedule.c) is safe. */
template <class T> struct deft_ce_pack {
    uint4 w[DEFT_CE_GROUP * sizeof(T) / 16];
};

/* Which of this thread's G slots hold a group of a row of c classes (ng groups): slots [0, k), slot tail (if any,
 * else -1) holding the row's last group, of tail_n < DEFT_CE_GROUP classes. The slots' lengths follow from these
 * three rather than from each slot's group index, which would hold a register a slot. Within a row the register
 * kernels count in int: their rows have at most 8 * DEFT_CE_GROUP * 1024 classes. */
struct deft_ce_slots {
    int k, tail, tail_n;
};
__device__ __forceinline__ deft_ce_slots deft_ce_slots_of(int64_t c64) {
    /* Formed afresh for each row from a copy the compiler cannot see through: hoisted out of the row loop, the
     * slots' lengths would hold G registers for the whole kernel. */
    int c;
    asm volatile("cvt.u32.u64 %0, %1;" : "=r"(c) : "l"(c64));
    const int ng = (c + DEFT_CE_GROUP - 1) / DEFT_CE_GROUP;
    const int tid = threadIdx.x, b = blockDim.x, last = ng - 1, tail_n = c - last * DEFT_CE_GROUP;
    deft_ce_slots sl;
    sl.k = tid < ng ? (last - tid) / b + 1 : 0;
    sl.tail = tail_n < DEFT_CE_GROUP && tid == last % b ? last / b : -1;
    sl.tail_n = tail_n;
    return sl;
}
__device__ __forceinline__ int deft_ce_slot_len(const deft_ce_slots &sl, int i) {
    return i == sl.tail ? sl.tail_n : DEFT_CE_GROUP;
}
/* The first class of slot i's group. */
__device__ __forceinline__ int deft_ce_slot_class(int i) { return (int)(threadIdx.x + i * blockDim.x) * DEFT_CE_GROUP; }

/* This thread's groups of the row xr into pk[0, sl.k). */
template <class T, int G>
__device__ __forceinline__ void deft_ce_regs_load(const T *xr, const deft_ce_slots &sl, bool wide,
                                                  deft_ce_pack<T> *pk) {
    constexpr int words = (int)(sizeof(deft_ce_pack<T>) / 16);
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (i >= sl.k) continue;
        const int n = deft_ce_slot_len(sl, i);
        const T *src = xr + deft_ce_slot_class(i);
        if (wide && n == DEFT_CE_GROUP) {
#pragma unroll
            for (int k = 0; k < words; k++) pk[i].w[k] = reinterpret_cast<const uint4 *>(src)[k];
        } else {
            T e[DEFT_CE_GROUP];
#pragma unroll
            for (int j = 0; j < DEFT_CE_GROUP; j++) e[j] = j < n ? src[j] : deft_ty<T>::from_f64(0.0);
            memcpy(pk[i].w, e, sizeof e);
        }
    }
}

template <class T>
__device__ __forceinline__ void deft_ce_unpack(const deft_ce_pack<T> &pk, typename deft_ty<T>::C *v) {
    T e[DEFT_CE_GROUP];
    memcpy(e, pk.w, sizeof e);
#pragma unroll
    for (int j = 0; j < DEFT_CE_GROUP; j++) v[j] = deft_ty<T>::load(e[j]);
}

/* deft_ce_block_stats on the groups in pk; the sum of x with SX. */
template <class T, int G, bool SX>
__device__ __forceinline__ void deft_ce_regs_stats(const deft_ce_pack<T> *pk, const deft_ce_slots &sl,
                                                   typename deft_ty<T>::C *mx, double *sum, double *sumx) {
    typedef typename deft_ty<T>::C C;
    C v[DEFT_CE_GROUP];
    C m = -INFINITY;
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (i >= sl.k) continue;
        deft_ce_unpack(pk[i], v);
        m = deft_ce_fold_max(v, deft_ce_slot_len(sl, i), m);
    }
    m = deft_block_reduce(m, deft_r_max());
    double s = 0.0, sx = 0.0;
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (i >= sl.k) continue;
        deft_ce_unpack(pk[i], v);
        deft_ce_fold_sum(v, deft_ce_slot_len(sl, i), m, SX, &s, &sx);
    }
    *mx = m;
    *sum = deft_block_reduce(s, deft_r_sum());
    *sumx = SX ? deft_block_reduce(sx, deft_r_sum()) : 0.0;
}

/* deft_k_ce_rows_block with the row in registers; LS: with label smoothing (o.ls != 0), which sums x as well. */
template <class T, int G, bool LS>
__global__ void __launch_bounds__(DEFT_CE_ROW_MAX_THREADS)
    deft_k_ce_rows_regs(const T *x, const int32_t *t, int64_t rows, int64_t c, deft_device_errors *rec,
                        deft_ce_opts o) {
    typedef deft_ty<T> Ty;
    /* the block's sum and count: thread 0's alone, kept in shared memory rather than in every thread's registers */
    __shared__ double acc;
    __shared__ long long n;
    const int cn = (int)c;
    if (threadIdx.x == 0) {
        acc = 0.0;
        n = 0;
    }
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int32_t tr = t[r];
        if (deft_ce_ignored(o, tr)) continue;
        if (tr < 0 || tr >= cn) {
            if (threadIdx.x == 0) {
                deft_ce_record_bad(rec, r, tr, c);
                n++;
                acc = NAN;
            }
            continue;
        }
        const T *xr = x + r * c;
        const deft_ce_slots sl = deft_ce_slots_of(c);
        deft_ce_pack<T> pk[G];
        deft_ce_regs_load<T, G>(xr, sl, ((uintptr_t)xr & 15) == 0, pk);
        typename Ty::C m;
        double s, sx;
        deft_ce_regs_stats<T, G, LS>(pk, sl, &m, &s, &sx);
        if (threadIdx.x == 0) {
            n++;
            acc += deft_ce_row_nll((double)m, (double)Ty::load(xr[tr]), s, sx, c, LS ? o.ls : 0.0);
        }
    }
    if (threadIdx.x == 0) {
        deft_ce_partial[blockIdx.x] = acc;
        deft_ce_count[blockIdx.x] = n;
    }
}

/* deft_k_ce_grad_block with the row in registers: read once, written once. */
template <class T, class D, int G>
__global__ void __launch_bounds__(DEFT_CE_ROW_MAX_THREADS)
    deft_k_ce_grad_regs(T *o, const D *dloss, const T *x, const int32_t *t, int64_t rows, int64_t c,
                        deft_device_errors *rec, deft_ce_opts op) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C C;
    /* the rows' scale, formed as deft_k_ce_grad_block forms it, in shared memory: registers hold the row */
    __shared__ double k_scale;
    if (threadIdx.x == 0) {
        const long long count = op.has_ignore ? deft_ce_grad_count : (long long)rows;
        k_scale = deft_ce_grad_scale(op, (double)deft_ty<D>::load(dloss[0]), count);
    }
    __syncthreads();
    const int cn = (int)c;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int32_t tr = t[r];
        const bool ignored = deft_ce_ignored(op, tr);
        if (ignored || tr < 0 || tr >= cn) {
            if (!ignored && threadIdx.x == 0) deft_ce_record_bad(rec, r, tr, c);
            const T fill = Ty::from_f64(ignored ? 0.0 : (double)NAN);
            for (int l = threadIdx.x; l < cn; l += blockDim.x) o[r * c + l] = fill;
            continue;
        }
        const T *xr = x + r * c;
        const deft_ce_slots sl = deft_ce_slots_of(c);
        deft_ce_pack<T> pk[G];
        deft_ce_regs_load<T, G>(xr, sl, ((uintptr_t)xr & 15) == 0, pk);
        C m;
        double s, sx;
        deft_ce_regs_stats<T, G, false>(pk, sl, &m, &s, &sx);
        /* formed here, each row, so that they take registers only while the row is written (the loads' 16 bytes
         * and the stores' are chosen apart: the values do not depend on them) */
        T *orow = o + r * c;
        const bool wide = ((uintptr_t)orow & 15) == 0;
        const C inv = (C)(1.0 / s);
        const deft_ce_gk<C> gk = deft_ce_gk_of<C>(*(volatile double *)&k_scale, op.ls, c);
#pragma unroll
        for (int i = 0; i < G; i++) {
            if (i >= sl.k) continue;
            C v[DEFT_CE_GROUP];
            deft_ce_unpack(pk[i], v);
            deft_ce_grad_store(orow, deft_ce_slot_class(i), v, deft_ce_slot_len(sl, i), m, inv, tr, gk, wide);
        }
    }
}

/* The groups a thread holds in the register kernels for rows of c classes of T: 0 where the plain kernels run (the
 * CE_REFERENCE debug knob, f64, rows past the largest G). At most 64 registers a thread (1024 threads a block): 4
 * groups of f32 or 8 of halves leave room for the rest without spilling (nvcc -Xptxas -v, sm_90). */
template <class T> static int deft_ce_regs_groups(int64_t c) {
    if (c < DEFT_CE_ROW_MIN || sizeof(T) > 4 || deft_debug(DEFT_DEBUG_CE_REFERENCE)) return 0;
    const int64_t ng = (c + DEFT_CE_GROUP - 1) / DEFT_CE_GROUP, threads = deft_ce_row_threads(c);
    const int64_t per = (ng + threads - 1) / threads;
    if (per <= 4) return 4;
    return sizeof(T) == 2 && per <= 8 ? 8 : 0;
}

int deft_cuda_ce_regs_groups(deft_dtype dt, int64_t c) {
    switch (dt) {
    case DEFT_F32: return deft_ce_regs_groups<float>(c);
    case DEFT_F16: return deft_ce_regs_groups<__half>(c);
    case DEFT_BF16: return deft_ce_regs_groups<__nv_bfloat16>(c);
    default: return 0;
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

template <class T, int G>
static void deft_ce_rows_regs_launch(const T *x, const int32_t *t, int64_t rows, int64_t c, int blocks, int threads,
                                     deft_device_errors *rec, const deft_ce_opts &o, cudaStream_t st) {
    if (o.ls != 0.0)
        deft_k_ce_rows_regs<T, G, true><<<blocks, threads, 0, st>>>(x, t, rows, c, rec, o);
    else
        deft_k_ce_rows_regs<T, G, false><<<blocks, threads, 0, st>>>(x, t, rows, c, rec, o);
}

/* The loss's first kernel: a warp per row below DEFT_CE_ROW_MIN classes, else a block per row, holding the row in
 * registers where it fits (deft_ce_regs_groups; only f32 and halves are instantiated so). */
template <class T>
static void deft_ce_rows_launch(const T *x, const int32_t *t, int64_t rows, int64_t c, int blocks,
                                deft_device_errors *rec, const deft_ce_opts &o, cudaStream_t st) {
    if (c < DEFT_CE_ROW_MIN) {
        deft_k_cross_entropy_rows<T><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(x, t, rows, c, rec, o);
        return;
    }
    const int threads = deft_ce_row_threads(c);
    if constexpr (sizeof(T) <= 4) {
        const int groups = deft_ce_regs_groups<T>(c);
        if (groups == 4) return deft_ce_rows_regs_launch<T, 4>(x, t, rows, c, blocks, threads, rec, o, st);
        if constexpr (sizeof(T) == 2)
            if (groups == 8) return deft_ce_rows_regs_launch<T, 8>(x, t, rows, c, blocks, threads, rec, o, st);
    }
    deft_k_ce_rows_block<T><<<blocks, threads, 0, st>>>(x, t, rows, c, rec, o);
}

/* The current device's addresses of the loss's partials and counts and of the gradient's count, for the streaming
 * kernels in their own file; false (and the error cleared) where the runtime will not say. */
static bool deft_ce_symbols(double **partial, long long **count, long long **grad_count) {
    cudaError_t e = cudaSuccess;
    if (partial) e = cudaGetSymbolAddress((void **)partial, deft_ce_partial);
    if (e == cudaSuccess && count) e = cudaGetSymbolAddress((void **)count, deft_ce_count);
    if (e == cudaSuccess && grad_count) e = cudaGetSymbolAddress((void **)grad_count, deft_ce_grad_count);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e == cudaSuccess;
}

static deft_status deft_ce_loss_check(const deft_tensor *n, deft_ce_opts *o) {
    const deft_tensor *lg = n->src[0];
    deft_status s = deft_ce_check(n, lg, n->src[1], o);
    if (s != DEFT_OK) return s;
    const bool float_logits =
        lg->dtype == DEFT_F32 || lg->dtype == DEFT_F64 || lg->dtype == DEFT_F16 || lg->dtype == DEFT_BF16;
    if (!float_logits || (n->dtype != lg->dtype && n->dtype != DEFT_F32))
        return deft_set_error(DEFT_ERR_DTYPE, "cross_entropy: a %s loss of %s logits (the logits' dtype or f32)",
                              deft_dtype_name(n->dtype), deft_dtype_name(lg->dtype));
    return DEFT_OK;
}

/* The loss's blocks: its partials and counts, summed by deft_ce_loss_reduce. */
static int deft_ce_loss_blocks(int64_t rows, int64_t c) {
    const int64_t per_block = c >= DEFT_CE_ROW_MIN ? 1 : DEFT_CE_ROWS_PER_BLOCK, want = (rows + per_block - 1) / per_block;
    return (int)(want < 1 ? 1 : want > DEFT_CE_MAX_BLOCKS ? DEFT_CE_MAX_BLOCKS : want);
}

static deft_status deft_ce_loss_reduce(const deft_tensor *n, void *out, int blocks, const deft_ce_opts &o,
                                       cudaStream_t st) {
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        deft_k_cross_entropy_reduce<T><<<1, 32, 0, st>>>((T *)out, blocks, o.sum);
        return deft_cuda_check_launch(n, "cross_entropy reduce");
    });
}

deft_status deft_cuda_cross_entropy(const deft_tensor *n, void *out, const void *logits, const void *targets,
                                    cudaStream_t st) {
    deft_ce_opts o;
    const deft_tensor *lg = n->src[0];
    deft_status s = deft_ce_loss_check(n, &o);
    if (s != DEFT_OK) return s;
    const int64_t rows = lg->shape[0], c = lg->shape[1];
    deft_device_errors *rec = NULL;
    s = deft_device_errors_get(n->device.index, st, &rec);
    if (s != DEFT_OK) return s;
    const bool by_block = c >= DEFT_CE_ROW_MIN;
    const int blocks = deft_ce_loss_blocks(rows, c);
    double *partial = NULL;
    long long *count = NULL;
    if (by_block && deft_ce_symbols(&partial, &count, NULL) &&
        deft_cuda_ce_stream_loss(lg->dtype, logits, (const int32_t *)targets, rows, c, blocks, rec, o, partial, count,
                                 st))
        s = deft_cuda_check_launch(n, "cross_entropy rows (streamed)");
    else
        s = deft_with_float_dtype(lg, [&](auto tag) -> deft_status {
            typedef typename decltype(tag)::type T;
            deft_ce_rows_launch<T>((const T *)logits, (const int32_t *)targets, rows, c, blocks, rec, o, st);
            return deft_cuda_check_launch(n, "cross_entropy rows");
        });
    if (s != DEFT_OK) return s;
    return deft_ce_loss_reduce(n, out, blocks, o, st);
}

template <class T, class D>
static deft_status deft_ce_grad_launch(const deft_tensor *n, void *out, const void *dloss, const void *logits,
                                       const void *targets, int64_t rows, int64_t c, deft_device_errors *rec,
                                       const deft_ce_opts &o, cudaStream_t st) {
    T *y = (T *)out;
    const D *dl = (const D *)dloss;
    const T *x = (const T *)logits;
    const int32_t *t = (const int32_t *)targets;
    if (c < DEFT_CE_ROW_MIN) {
        deft_k_cross_entropy_grad<T, D><<<deft_cuda_blocks(rows * 32, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            y, dl, x, t, rows, c, rec, o);
        return deft_cuda_check_launch(n, "cross_entropy_grad");
    }
    const unsigned blocks = (unsigned)(rows < 1 ? 1 : rows > DEFT_CUDA_MAX_BLOCKS ? DEFT_CUDA_MAX_BLOCKS : rows);
    const int threads = deft_ce_row_threads(c);
    int groups = 0;
    if constexpr (sizeof(T) <= 4) groups = deft_ce_regs_groups<T>(c);
    if constexpr (sizeof(T) <= 4)
        if (groups == 4) deft_k_ce_grad_regs<T, D, 4><<<blocks, threads, 0, st>>>(y, dl, x, t, rows, c, rec, o);
    if constexpr (sizeof(T) == 2)
        if (groups == 8) deft_k_ce_grad_regs<T, D, 8><<<blocks, threads, 0, st>>>(y, dl, x, t, rows, c, rec, o);
    if (groups == 0) deft_k_ce_grad_block<T, D><<<blocks, threads, 0, st>>>(y, dl, x, t, rows, c, rec, o);
    return deft_cuda_check_launch(n, "cross_entropy_grad");
}

static deft_status deft_ce_grad_check(const deft_tensor *n, deft_ce_opts *o) {
    deft_status s = deft_ce_check(n, n->src[1], n->src[2], o);
    if (s != DEFT_OK) return s;
    if (deft_shape_numel(n->src[0]->ndim, n->src[0]->shape) != 1 || !deft_ce_same_shape(n, n->src[1]))
        return deft_set_error(DEFT_ERR_SHAPE, "cross_entropy_grad: wants a one-element loss gradient and an output "
                                              "of the logits' shape");
    const deft_dtype dd = n->src[0]->dtype;
    if (n->src[1]->dtype != n->dtype || (dd != n->dtype && dd != DEFT_F32))
        return deft_set_error(DEFT_ERR_DTYPE, "cross_entropy_grad: a %s gradient of %s logits with a %s dloss",
                              deft_dtype_name(n->dtype), deft_dtype_name(n->src[1]->dtype), deft_dtype_name(dd));
    return DEFT_OK;
}

/* A mean under an ignore index scales the gradient by the rows not ignored, counted first. */
static deft_status deft_ce_count_rows(const deft_tensor *n, const void *targets, int64_t rows, const deft_ce_opts &o,
                                      cudaStream_t st) {
    if (!o.has_ignore || o.sum) return DEFT_OK;
    deft_k_ce_count<<<1, DEFT_CUDA_THREADS, 0, st>>>((const int32_t *)targets, rows, o);
    return deft_cuda_check_launch(n, "cross_entropy_grad count");
}

deft_status deft_cuda_cross_entropy_grad(const deft_tensor *n, void *out, const void *dloss, const void *logits,
                                         const void *targets, cudaStream_t st) {
    deft_ce_opts o;
    deft_status s = deft_ce_grad_check(n, &o);
    if (s != DEFT_OK) return s;
    const deft_dtype dd = n->src[0]->dtype;
    const int64_t rows = n->src[1]->shape[0], c = n->src[1]->shape[1];
    deft_device_errors *rec = NULL;
    s = deft_device_errors_get(n->device.index, st, &rec);
    if (s == DEFT_OK) s = deft_ce_count_rows(n, targets, rows, o, st);
    if (s != DEFT_OK) return s;
    long long *grad_count = NULL;
    if (c >= DEFT_CE_ROW_MIN && deft_ce_symbols(NULL, NULL, &grad_count) &&
        deft_cuda_ce_stream_grad(n->dtype, dd != n->dtype, out, dloss, logits, (const int32_t *)targets, rows, c, rec,
                                 o, grad_count, st))
        return deft_cuda_check_launch(n, "cross_entropy_grad (streamed)");
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        if (dd == n->dtype) return deft_ce_grad_launch<T, T>(n, out, dloss, logits, targets, rows, c, rec, o, st);
        return deft_ce_grad_launch<T, float>(n, out, dloss, logits, targets, rows, c, rec, o, st);
    });
}

/* The loss and the gradient of the same logits and targets (a pair: passes/fusion_pairs.c): one kernel that reads
 * each row once where the rows stream, giving the loss's partials in the loss kernel's order and the gradient's
 * values, so both the unfused bits; else the two launches in turn, the loss first (the gradient may overwrite the
 * logits). */
extern "C" deft_status deft_cuda_cross_entropy_pair(const deft_tensor *loss, const deft_tensor *grad,
                                                    void *loss_out, void *grad_out, const void *dloss,
                                                    const void *logits, const void *targets, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    deft_ce_opts o = {}, og = {};
    deft_status s = deft_ce_loss_check(loss, &o);
    if (s == DEFT_OK) s = deft_ce_grad_check(grad, &og);
    if (s != DEFT_OK) return s;
    if (grad->src[1] != loss->src[0] || grad->src[2] != loss->src[1] || o.has_ignore != og.has_ignore ||
        o.ignore_index != og.ignore_index || o.ls != og.ls || o.sum != og.sum)
        return deft_set_error(DEFT_ERR_INVALID, "cross_entropy pair: %s and %s read other logits, targets or options",
                              loss->name, grad->name);
    const int64_t rows = loss->src[0]->shape[0], c = loss->src[0]->shape[1];
    const int blocks = deft_ce_loss_blocks(rows, c);
    deft_device_errors *rec = NULL;
    double *partial = NULL;
    long long *count = NULL, *grad_count = NULL;
    s = deft_device_errors_get(loss->device.index, st, &rec);
    if (s != DEFT_OK) return s;
    if (c >= DEFT_CE_ROW_MIN && deft_cuda_ce_streams(loss->src[0]->dtype, c) &&
        deft_ce_symbols(&partial, &count, &grad_count)) {
        s = deft_ce_count_rows(grad, targets, rows, o, st);
        if (s != DEFT_OK) return s;
        if (deft_cuda_ce_stream_pair(grad->dtype, grad->src[0]->dtype != grad->dtype, grad_out, dloss, logits,
                                     (const int32_t *)targets, rows, c, blocks, rec, o, partial, count, grad_count,
                                     st)) {
            s = deft_cuda_check_launch(grad, "cross_entropy pair (streamed)");
            return s == DEFT_OK ? deft_ce_loss_reduce(loss, loss_out, blocks, o, st) : s;
        }
    }
    s = deft_cuda_cross_entropy(loss, loss_out, logits, targets, st);
    return s == DEFT_OK ? deft_cuda_cross_entropy_grad(grad, grad_out, dloss, logits, targets, st) : s;
}
