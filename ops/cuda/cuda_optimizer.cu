/* The optimizer's step on a GPU: SGD (momentum, dampening, Nesterov, weight decay) and AdamW over the flat storage
 * (graph/optimizer.h), with the formulas of the CPU path (runtime/optimizer_run.c, torch.optim's), line by line.
 *
 * Built so that a whole training step can be captured into one CUDA Graph and replayed: the per-run state (runs
 * since the last update, the update count, the learning rate, the last norm) lives on the device in
 * deft_optimizer_dev, and every decision that depends on it (copy or add the gradients, update or not, the clip
 * factor, the bias corrections) is taken by the kernels. Each run queues the same four kernels on the stream:
 *
 *   gather   flat_grads = (micro == 0 ? 0 : flat_grads) + this run's gradients: one launch over every parameter,
 *            through a device table of {source, offset, count} segments
 *   norm     on an update run, sums of squares of flat_grads per block (a fixed grid, so a fixed order)
 *   prepare  one block: on an update run, sums the partial sums in a fixed order, the norm (of the mean gradient)
 *            and the clip factor, the bias corrections from the device's update count; advances micro and updates;
 *            writes the last norm to the node's output. With loss scaling it divides by the scale, and a sum that is
 *            not finite (an inf or NaN gradient) cancels the update and lowers the scale; clean updates raise it
 *   update   on an update run, one pass over the flat storage: SGD or AdamW
 *
 * With one micro-batch per update, no clipping and no loss scaling (the common case) one kernel does all four (below):
 * a step that may be skipped must know the whole norm before it changes any parameter. Under the compile option
 * optimizer_in_backward the same step runs split (graph/optimizer_split.h): a piece kernel per group of parameters as
 * soon as their gradients exist, and a finisher; both paths sum the norm over the same blocks in the same order.
 *
 * The host compares this run's gradient addresses with those of the tables it built before (no synchronisation);
 * only a new set of addresses (a program's first run) builds a table, which must not happen inside a capture.
 *
 * Under autocast an f32 weight's gradient may come in bf16 or f16 (graph/autocast.h): each table row carries its
 * gradient's dtype and the kernels pick the load per segment (per norm block in the one-launch step), never per
 * element, so an f32 gradient is read exactly as before; widening is exact, so the results are bit for bit those of
 * the f32 gradients the cast back would have given. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "caching_allocator.h"
#include "device_internal.h"
#include "optimizer.h"

/* The hyperparameters, fixed when the optimizer is built: passed by value, so a captured graph keeps them. */
struct deft_opt_hyper {
    int kind;                 /* deft_optimizer_kind */
    int accumulate_steps;
    double max_grad_norm;
    double momentum, dampening, sgd_weight_decay;
    int nesterov;
    double beta1, beta2, eps, adamw_weight_decay;
    int loss_scaling;         /* dynamic loss scaling (graph/optimizer.h's deft_optimizer_scaler) */
    double growth, backoff;
    int interval;
};

#define DEFT_OPT_THREADS 256
/* Elements one gather block covers at least (it walks the segments that overlap its range). */
#define DEFT_OPT_GATHER_CHUNK 2048

/* ---------------------------------------------------------------- gradients in another dtype
 * A gradient element of type G as the parameters' type T: bf16 and f16 widen exactly (only f32 weights take them,
 * deft_optimizer_grad_dtype_ok); G == T is the plain load. */
template <class T, class G> __device__ __forceinline__ T deft_opt_widen(G x) { return (T)deft_ty<G>::load(x); }

/* Calls f.template run<G>() with G the C type of a segment's gradients: T itself, or bf16 / f16 for f32 weights. The
 * switch is taken once per segment or block; the call inside runs the loop over its elements. */
template <class T, class F> __device__ __forceinline__ auto deft_opt_by_dtype(int dtype, const F &f) {
    if constexpr (sizeof(T) == sizeof(float)) {
        if (dtype == DEFT_BF16) return f.template run<__nv_bfloat16>();
        if (dtype == DEFT_F16) return f.template run<__half>();
    }
    return f.template run<T>();
}

/* ---------------------------------------------------------------- gather */
/* Block b covers elements [b * per_block, (b + 1) * per_block) of the flat gradients: it finds the segment holding
 * its first element by bisection, then walks the segments that overlap its range. On the first micro-batch of an
 * update it copies, afterwards it adds (micro is read before the prepare kernel of this run advances it). */
template <class T> struct deft_opt_gather_run {
    T *flat;
    const void *src;
    int64_t off, s0, s1;
    bool add;
    template <class G> __device__ __forceinline__ int run() const {
        const G *g = (const G *)src;
        for (int64_t j = s0 + threadIdx.x; j < s1; j += blockDim.x) {
            const T x = deft_opt_widen<T, G>(g[j - off]);
            flat[j] = add ? flat[j] + x : x;
        }
        return 0;
    }
};

template <class T>
__global__ void deft_k_opt_gather(T *flat, const deft_optimizer_segment *seg, int nseg, int64_t total,
                                  int64_t per_block, const deft_optimizer_dev *dev) {
    const bool add = dev->micro != 0;
    const int64_t lo = (int64_t)blockIdx.x * per_block;
    const int64_t hi = lo + per_block < total ? lo + per_block : total;
    if (lo >= hi) return;
    int a = 0, b = nseg - 1;   /* the last segment starting at or before lo */
    while (a < b) {
        const int m = (a + b + 1) / 2;
        if (seg[m].offset <= lo) a = m;
        else b = m - 1;
    }
    for (int s = a; s < nseg && seg[s].offset < hi; s++) {
        const int64_t off = seg[s].offset, end = off + seg[s].count;
        deft_opt_gather_run<T> r = {flat, seg[s].src, off, lo > off ? lo : off, hi < end ? hi : end, add};
        deft_opt_by_dtype<T>(seg[s].dtype, r);
    }
}

/* ---------------------------------------------------------------- norm */
/* Sums in double, as the CPU does, in a tree of fixed shape: the same gradients give the same norm bit for bit. */
__device__ __forceinline__ double deft_opt_block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = DEFT_OPT_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    return sh[0];
}

__device__ __forceinline__ bool deft_opt_update_run(const deft_optimizer_dev *dev, int k) {
    return dev->micro + 1 >= k;
}

template <class T>
__global__ void deft_k_opt_norm(const T *g, int64_t total, deft_optimizer_dev *dev, int k) {
    __shared__ double sh[DEFT_OPT_THREADS];
    if (!deft_opt_update_run(dev, k)) return;   /* the whole grid takes the same branch */
    double sum = 0.0;
    for (int64_t j = deft_tid(); j < total; j += deft_nthreads()) {
        const double v = (double)g[j];
        sum += v * v;
    }
    sum = deft_opt_block_sum(sum, sh);
    if (threadIdx.x == 0) dev->partial[blockIdx.x] = sum;
}

/* ---------------------------------------------------------------- prepare: the per-run decisions, on the device */
/* GradScaler's update (runtime/optimizer_run.c's deft_scaler_after). */
static __device__ void deft_opt_scaler_after(deft_optimizer_dev *dev, const deft_opt_hyper &h, bool skipped) {
    if (skipped) {
        dev->loss_scale = (float)(dev->loss_scale * h.backoff);
        dev->growth_tracker = 0;
        dev->skipped++;
    } else if (++dev->growth_tracker == h.interval) {
        dev->loss_scale = (float)(dev->loss_scale * h.growth);
        dev->growth_tracker = 0;
    }
}

/* Thread 0 of the prepare kernel on an update run, given the sum of squares of the accumulated gradients: whether
 * the update goes ahead. runtime/optimizer_run.c's deft_update and deft_clip_factor (torch's clip_grad_norm_). */
static __device__ bool deft_opt_decide(deft_optimizer_dev *dev, const deft_opt_hyper &h, double sum) {
    double mean = 1.0 / (double)h.accumulate_steps;
    if (h.loss_scaling) mean /= (double)dev->loss_scale;
    const double norm = sqrt(sum) * mean;
    dev->last_norm = (float)norm;
    dev->micro = 0;
    if (h.loss_scaling && !isfinite(norm)) {
        deft_opt_scaler_after(dev, h, true);
        return false;
    }
    double clip = 1.0;
    if (h.max_grad_norm > 0.0) {
        const double c = h.max_grad_norm / (norm + 1e-6);
        clip = c < 1.0 ? c : 1.0;
    }
    dev->scale = mean * clip;
    dev->first = dev->updates == 0;
    if (h.kind == DEFT_OPTIM_ADAMW) {
        const double t = (double)(dev->updates + 1);
        dev->step_size = dev->lr / (1.0 - pow(h.beta1, t));
        dev->bc2_sqrt = sqrt(1.0 - pow(h.beta2, t));
        dev->decay = 1.0 - dev->lr * h.adamw_weight_decay;
    }
    dev->updates++;
    if (h.loss_scaling) deft_opt_scaler_after(dev, h, false);
    return true;
}

__global__ void deft_k_opt_prepare(deft_optimizer_dev *dev, int nblocks, deft_opt_hyper h, float *out) {
    __shared__ double sh[DEFT_OPT_THREADS];
    const bool update = deft_opt_update_run(dev, h.accumulate_steps);
    __syncthreads();   /* every thread has read micro before thread 0 advances it: all take the same branch */
    bool apply = false;
    if (update) {
        double v = 0.0;
        for (int b = (int)threadIdx.x; b < nblocks; b += (int)blockDim.x) v += dev->partial[b];
        const double sum = deft_opt_block_sum(v, sh);
        if (threadIdx.x == 0) apply = deft_opt_decide(dev, h, sum);
    } else if (threadIdx.x == 0) {
        dev->micro++;
    }
    if (threadIdx.x == 0) {
        dev->update_now = apply ? 1 : 0;
        if (out) *out = dev->last_norm;
    }
}

/* ---------------------------------------------------------------- update */
/* The coefficients of this run, read once per thread from the device's counters. */
template <class T> struct deft_opt_coef {
    T lr, step, bc2_sqrt, decay;
    bool first;
};

template <class T> __device__ __forceinline__ deft_opt_coef<T> deft_opt_coef_of(const deft_optimizer_dev *dev) {
    deft_opt_coef<T> c;
    c.lr = (T)dev->lr;
    c.step = (T)dev->step_size;
    c.bc2_sqrt = (T)dev->bc2_sqrt;
    c.decay = (T)dev->decay;
    c.first = dev->first != 0;
    return c;
}

/* runtime/optimizer_run.c's DEFT_SGD on one element held in registers (pj the parameter, bj its momentum buffer,
 * read only when momentum is on and this is not the first update) with the scaled gradient d: weight decay added
 * to d, the momentum buffer starting as d on the first update. */
template <class T>
__device__ __forceinline__ void deft_opt_sgd_reg(T &pj, T &bj, T d, const deft_opt_hyper &h,
                                                 const deft_opt_coef<T> &c) {
    const T mom = (T)h.momentum, damp = (T)(1.0 - h.dampening), wd = (T)h.sgd_weight_decay;
    if (wd != T(0)) d += wd * pj;
    if (mom != T(0)) {
        const T b = c.first ? d : mom * bj + damp * d;
        bj = b;
        d = h.nesterov ? d + mom * b : b;
    }
    pj -= c.lr * d;
}

template <class T>
__device__ __forceinline__ void deft_opt_sgd_one(T *p, T *buf, int64_t j, T d, const deft_opt_hyper &h,
                                                 const deft_opt_coef<T> &c) {
    T pj = p[j], bj = h.momentum != 0.0 && !c.first ? buf[j] : T(0);
    deft_opt_sgd_reg<T>(pj, bj, d, h, c);
    if (h.momentum != 0.0) buf[j] = bj;
    p[j] = pj;
}

/* runtime/optimizer_run.c's DEFT_ADAMW: the moments start at zero on the first update (the CPU clears them there).
 * The last line mirrors C's promotions on the CPU: for f32, sqrt(v) and the division are in double. */
template <class T>
__device__ __forceinline__ void deft_opt_adamw_reg(T &pj, T &mj, T &vj, T d, const deft_opt_hyper &h,
                                                   const deft_opt_coef<T> &c) {
    const T b1 = (T)h.beta1, b2 = (T)h.beta2, eps = (T)h.eps;
    const T pd = pj * c.decay;
    if (c.first) mj = vj = T(0);
    mj = b1 * mj + (T(1) - b1) * d;
    vj = b2 * vj + (T(1) - b2) * d * d;
    pj = (T)((double)pd - (double)(c.step * mj) / (sqrt((double)vj) / (double)c.bc2_sqrt + (double)eps));
}

template <class T>
__device__ __forceinline__ void deft_opt_adamw_one(T *p, T *m, T *v, int64_t j, T d, const deft_opt_hyper &h,
                                                   const deft_opt_coef<T> &c) {
    T pj = p[j], mj = c.first ? T(0) : m[j], vj = c.first ? T(0) : v[j];
    deft_opt_adamw_reg<T>(pj, mj, vj, d, h, c);
    m[j] = mj;
    v[j] = vj;
    p[j] = pj;
}

template <class T>
__global__ void deft_k_opt_update(T *p, const T *g, T *s0, T *s1, int64_t total, const deft_optimizer_dev *dev,
                                  deft_opt_hyper h) {
    if (!dev->update_now) return;
    const T scale = (T)dev->scale;
    const deft_opt_coef<T> c = deft_opt_coef_of<T>(dev);
    for (int64_t j = deft_tid(); j < total; j += deft_nthreads()) {
        if (h.kind == DEFT_OPTIM_SGD) deft_opt_sgd_one<T>(p, s0, j, g[j] * scale, h, c);
        else deft_opt_adamw_one<T>(p, s0, s1, j, g[j] * scale, h, c);
    }
}

/* The one-launch step over flat elements [lo, hi) whose gradients are g[lo..hi) (g indexed like the flat storage):
 * thread t takes lo + t, lo + t + blockDim.x, ... in that order, U at a time, every load of a group issued before
 * any store (the restrict qualifiers let the compiler keep them together), which keeps enough reads in flight to
 * run at the memory's rate; one element at a time the step ran at half of it. Returns the thread's running sum of
 * squares: acc, then this range's squares added in element order, as the one-at-a-time loop added them. */
#define DEFT_OPT_UNROLL 4
template <class T, class G>
__device__ double deft_opt_fused_range(T *__restrict__ p, T *__restrict__ s0, T *__restrict__ s1,
                                       const G *__restrict__ g, int64_t lo, int64_t hi, const deft_opt_hyper &h,
                                       const deft_opt_coef<T> &c, double acc) {
    const int64_t bd = blockDim.x;
    const bool sgd = h.kind == DEFT_OPTIM_SGD, moments = sgd ? h.momentum != 0.0 : true;
    double sum = acc;
    int64_t j = lo + threadIdx.x;
    for (; j + (DEFT_OPT_UNROLL - 1) * bd < hi; j += DEFT_OPT_UNROLL * bd) {
        T gv[DEFT_OPT_UNROLL], pv[DEFT_OPT_UNROLL], av[DEFT_OPT_UNROLL], bv[DEFT_OPT_UNROLL];
#pragma unroll
        for (int u = 0; u < DEFT_OPT_UNROLL; u++) {
            const int64_t k = j + u * bd;
            gv[u] = deft_opt_widen<T, G>(g[k]);
            pv[u] = p[k];
            av[u] = moments && !c.first ? s0[k] : T(0);
            bv[u] = !sgd && !c.first ? s1[k] : T(0);
        }
#pragma unroll
        for (int u = 0; u < DEFT_OPT_UNROLL; u++) {
            sum += (double)gv[u] * (double)gv[u];
            if (sgd) deft_opt_sgd_reg<T>(pv[u], av[u], gv[u], h, c);
            else deft_opt_adamw_reg<T>(pv[u], av[u], bv[u], gv[u], h, c);
        }
#pragma unroll
        for (int u = 0; u < DEFT_OPT_UNROLL; u++) {
            const int64_t k = j + u * bd;
            p[k] = pv[u];
            if (moments) s0[k] = av[u];
            if (!sgd) s1[k] = bv[u];
        }
    }
    for (; j < hi; j += bd) {
        const T gj = deft_opt_widen<T, G>(g[j]);
        sum += (double)gj * (double)gj;
        if (sgd) deft_opt_sgd_one<T>(p, s0, j, gj, h, c);
        else deft_opt_adamw_one<T>(p, s0, s1, j, gj, h, c);
    }
    return sum;
}

/* ---------------------------------------------------------------- one launch: the common step
 * With one micro-batch per update and no clipping, nothing in an update waits on the norm, so a single kernel does
 * the whole step: block b takes the norm's block b (graph/optimizer.h: a run of one parameter's elements), reads its
 * gradients through the gather table (there are no flat gradients: deft_optimizer_keeps_grads), updates them with the
 * coefficients of this run (from the device's counters, which no block changes before every block has read them),
 * and writes the block's sum of squares; the last block to finish (a ticket after a fence) adds the sums in block
 * order, writes the norm and advances the counters. The formulas are the update kernels' above with scale 1, so both
 * paths give the same parameters; the pieces of a split step (below) give the same parameters and the same norm. */
template <class T>
__device__ __forceinline__ deft_opt_coef<T> deft_opt_coef_now(const deft_optimizer_dev *dev, const deft_opt_hyper &h) {
    deft_opt_coef<T> c;
    c.first = dev->updates == 0;
    c.lr = (T)dev->lr;
    c.step = c.bc2_sqrt = c.decay = T(0);
    if (h.kind != DEFT_OPTIM_SGD) {   /* double pow in every thread is a good part of a small SGD step */
        const double t = (double)(dev->updates + 1);
        c.step = (T)(dev->lr / (1.0 - pow(h.beta1, t)));
        c.bc2_sqrt = (T)sqrt(1.0 - pow(h.beta2, t));
        c.decay = (T)(1.0 - dev->lr * h.adamw_weight_decay);
    }
    return c;
}

/* Updates the elements of one norm block and returns this thread's sum of squares of their gradients (read in the
 * segment's dtype: one choice per block). */
template <class T> struct deft_opt_block_run {
    T *p, *s0, *s1;
    const deft_optimizer_block &bk;
    const deft_optimizer_segment &seg;
    const deft_opt_hyper &h;
    const deft_opt_coef<T> &c;
    template <class G> __device__ __forceinline__ double run() const {
        return deft_opt_fused_range<T, G>(p, s0, s1, (const G *)seg.src - seg.offset, bk.lo, bk.hi, h, c, 0.0);
    }
};

template <class T>
__device__ __forceinline__ double deft_opt_block_step(T *p, T *s0, T *s1, const deft_optimizer_block &bk,
                                                      const deft_optimizer_segment &seg, const deft_opt_hyper &h,
                                                      const deft_opt_coef<T> &c) {
    deft_opt_block_run<T> r = {p, s0, s1, bk, seg, h, c};
    return deft_opt_by_dtype<T>(seg.dtype, r);
}

/* Thread 0 closes an update whose gradients' sum of squares is total_sq. */
__device__ __forceinline__ void deft_opt_close(deft_optimizer_dev *dev, double total_sq, bool first, float *out) {
    const double norm = sqrt(total_sq);
    dev->last_norm = (float)norm;
    dev->scale = 1.0;
    dev->first = first;
    dev->updates++;
    dev->micro = 0;
    dev->update_now = 1;
    dev->blocks_done = 0;
    if (out) *out = (float)norm;
}

template <class T>
__global__ void deft_k_opt_fused(T *p, T *s0, T *s1, const deft_optimizer_segment *seg,
                                 const deft_optimizer_block *blocks, double *block_sums, deft_optimizer_dev *dev,
                                 deft_opt_hyper h, float *out) {
    __shared__ double sh[DEFT_OPT_THREADS];
    __shared__ bool last;
    const deft_opt_coef<T> c = deft_opt_coef_now<T>(dev, h);
    const deft_optimizer_block bk = blocks[blockIdx.x];
    double sum = deft_opt_block_sum(deft_opt_block_step<T>(p, s0, s1, bk, seg[bk.param], h, c), sh);
    double total_sq = sum;
    if (gridDim.x > 1) {   /* one block (a small model) has the whole sum already: no ticket, no fences */
        if (threadIdx.x == 0) {
            block_sums[blockIdx.x] = sum;
            __threadfence();
            last = atomicAdd(&dev->blocks_done, 1u) == gridDim.x - 1;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        double v = 0.0;
        for (int i = (int)threadIdx.x; i < (int)gridDim.x; i += (int)blockDim.x)
            v += ((volatile double *)block_sums)[i];
        total_sq = deft_opt_block_sum(v, sh);
    }
    if (threadIdx.x == 0) deft_opt_close(dev, total_sq, c.first, out);
}

/* The one-launch step of a small model as one thread block: the norm blocks one after the other (a model of a few
 * parameters has one per parameter, and a launch of several blocks pays the ticket and its fences, a good part of
 * such a step). Block b's sum is added by thread b % blockDim.x, in increasing b, and the threads' values then go
 * through the same tree: the last block of deft_k_opt_fused adds the sums in exactly this order. */
#define DEFT_OPT_ONE_BLOCK_MAX ((int64_t)1 << 16)
template <class T>
__global__ void deft_k_opt_fused_one(T *p, T *s0, T *s1, const deft_optimizer_segment *seg,
                                     const deft_optimizer_block *blocks, int n_blocks, deft_optimizer_dev *dev,
                                     deft_opt_hyper h, float *out) {
    __shared__ double sh[DEFT_OPT_THREADS];
    const deft_opt_coef<T> c = deft_opt_coef_now<T>(dev, h);
    double v = 0.0;
    for (int b = 0; b < n_blocks; b++) {
        const deft_optimizer_block bk = blocks[b];
        const double sum = deft_opt_block_sum(deft_opt_block_step<T>(p, s0, s1, bk, seg[bk.param], h, c), sh);
        if ((int)threadIdx.x == b % (int)blockDim.x) v += sum;
        __syncthreads();   /* every thread has read sh[0] before the next sum writes it */
    }
    const double total_sq = deft_opt_block_sum(v, sh);
    if (threadIdx.x == 0) deft_opt_close(dev, total_sq, c.first, out);
}

/* The step of a model whose parameters all have at most 32 elements (and are at most 32), in one warp and without a
 * barrier: lane t takes element t of each parameter. The block trees of the kernels above add, for such a block,
 * zeros in their rounds over 128, 64 and 32 (exact) and then pair lanes as the shuffles below do, so the norm is the
 * same bit for bit; so is the final tree over the blocks' sums. */
#define DEFT_OPT_WARP 32
/* Element i of a segment's gradients as T (one element per lane here, so the dtype is looked at per element; the
 * branch is the same in every lane). */
template <class T> __device__ __forceinline__ T deft_opt_grad_at(const deft_optimizer_segment &s, int64_t i) {
    if constexpr (sizeof(T) == sizeof(float)) {
        if (s.dtype == DEFT_BF16) return deft_opt_widen<T, __nv_bfloat16>(((const __nv_bfloat16 *)s.src)[i]);
        if (s.dtype == DEFT_F16) return deft_opt_widen<T, __half>(((const __half *)s.src)[i]);
    }
    return ((const T *)s.src)[i];
}

template <class T>
__global__ void deft_k_opt_fused_warp(T *p, T *s0, T *s1, const deft_optimizer_segment *seg,
                                      const deft_optimizer_block *blocks, int n_blocks, deft_optimizer_dev *dev,
                                      deft_opt_hyper h, float *out) {
    const int lane = (int)threadIdx.x;
    const deft_opt_coef<T> c = deft_opt_coef_now<T>(dev, h);
    double v = 0.0;
    for (int b = 0; b < n_blocks; b++) {
        const deft_optimizer_block bk = blocks[b];
        const int64_t j = bk.lo + lane;
        double sum = 0.0;
        if (j < bk.hi) {
            const T g = deft_opt_grad_at<T>(seg[bk.param], j - seg[bk.param].offset);
            sum += (double)g * (double)g;
            if (h.kind == DEFT_OPTIM_SGD) deft_opt_sgd_one<T>(p, s0, j, g, h, c);
            else deft_opt_adamw_one<T>(p, s0, s1, j, g, h, c);
        }
        for (int w = DEFT_OPT_WARP / 2; w > 0; w >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, w);
        sum = __shfl_sync(0xffffffffu, sum, 0);
        if (lane == b) v += sum;
    }
    for (int w = DEFT_OPT_WARP / 2; w > 0; w >>= 1) v += __shfl_down_sync(0xffffffffu, v, w);
    if (lane == 0) deft_opt_close(dev, v, c.first, out);
}

/* Whether every parameter of o fits one lane per element (deft_k_opt_fused_warp). */
static bool deft_opt_fits_warp(const deft_optimizer *o) {
    if (o->n_params > DEFT_OPT_WARP || o->n_blocks != o->n_params) return false;
    for (int i = 0; i < o->n_params; i++)
        if (deft_shape_numel(o->params[i]->ndim, o->params[i]->shape) > DEFT_OPT_WARP) return false;
    return true;
}

/* ---------------------------------------------------------------- optimizer in backward: a split step
 * A piece takes the norm blocks of its parameters (first_block on) as the one-launch step does, and writes each
 * block's sum of squares to its node's value. The finisher, one block of threads, adds the pieces' sums in block order
 * exactly as the one-launch step's last block adds its own, and closes the update: the counters it advances are those
 * every piece of this run read before. */
template <class T>
__global__ void deft_k_opt_piece(T *p, T *s0, T *s1, const deft_optimizer_segment *seg, int first_param,
                                 const deft_optimizer_block *blocks, int first_block, const deft_optimizer_dev *dev,
                                 deft_opt_hyper h, double *sums) {
    __shared__ double sh[DEFT_OPT_THREADS];
    const deft_opt_coef<T> c = deft_opt_coef_now<T>(dev, h);
    const deft_optimizer_block bk = blocks[first_block + (int)blockIdx.x];
    const double sum = deft_opt_block_sum(deft_opt_block_step<T>(p, s0, s1, bk, seg[bk.param - first_param], h, c), sh);
    if (threadIdx.x == 0) sums[blockIdx.x] = sum;
}

/* pieces[k]: piece k's sums at src, its first block at offset, count blocks. */
__global__ void deft_k_opt_finish(const deft_optimizer_segment *pieces, int n_pieces, int n_blocks,
                                  deft_optimizer_dev *dev, float *out) {
    __shared__ double sh[DEFT_OPT_THREADS];
    double v = 0.0;
    for (int i = (int)threadIdx.x; i < n_blocks; i += (int)blockDim.x) {
        int a = 0, b = n_pieces - 1;   /* the last piece starting at or before block i */
        while (a < b) {
            const int m = (a + b + 1) / 2;
            if (pieces[m].offset <= i) a = m;
            else b = m - 1;
        }
        v += ((const double *)pieces[a].src)[i - pieces[a].offset];
    }
    const double total_sq = deft_opt_block_sum(v, sh);
    if (threadIdx.x == 0) deft_opt_close(dev, total_sq, dev->updates == 0, out);
}

/* ---------------------------------------------------------------- the host side */
static deft_status deft_opt_cuda_fail(cudaError_t e, const char *what) {
    (void)cudaGetLastError();
    return deft_set_error(DEFT_ERR_RUNTIME, "optimizer: %s failed: %s", what, cudaGetErrorString(e));
}

/* True when `st` is capturing, or when the runtime cannot say (then building a table would break the capture). */
static bool deft_opt_capturing(cudaStream_t st) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(st, &cs);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* The sources a node of `o` reads: its parameters' gradients, or for a finisher the pieces' sums. */
static int deft_opt_entries(const deft_optimizer *o) {
    return o->part && o->part->finisher ? o->part->n_pieces : o->n_params;
}

/* Row i of o's gather table for source address src, holding dtype dt. */
static deft_optimizer_segment deft_opt_row(const deft_optimizer *o, int i, const void *src, deft_dtype dt) {
    deft_optimizer_segment r;
    r.src = src;
    r.dtype = (int32_t)dt;
    r.pad = 0;
    if (o->part && o->part->finisher) {
        const deft_optimizer *w = o->part->whole;
        const int first = o->part->piece_first_param[i];
        r.offset = w->block_first[first];
        r.count = w->block_first[first + o->part->piece_n_params[i]] - r.offset;
    } else {
        r.offset = o->offsets[i];
        r.count = deft_shape_numel(o->params[i]->ndim, o->params[i]->shape);
    }
    return r;
}

/* The table built before for these gradient addresses and dtypes (a compare on the host, no device call), or NULL. */
static const deft_optimizer_segment *deft_opt_known_table(deft_optimizer *o, const void *const *grads,
                                                          const deft_dtype *dts) {
    const size_t ptr_bytes = (size_t)deft_opt_entries(o) * sizeof *grads;
    const size_t dt_bytes = (size_t)deft_opt_entries(o) * sizeof *dts;
    for (int i = 0; i < o->n_gathers; i++) {
        deft_optimizer_gather *e = &o->gathers[i];
        if (memcmp(e->grads, grads, ptr_bytes) == 0 && memcmp(e->dtypes, dts, dt_bytes) == 0) {
            e->last_used = ++o->gather_clock;
            return e->table;
        }
    }
    return NULL;
}

/* Copies the table for `grads` into e->table and waits for the copy (the host rows are freed at once). */
static deft_status deft_opt_fill_table(deft_optimizer *o, deft_optimizer_gather *e, const void *const *grads,
                                       const deft_dtype *dts, cudaStream_t st) {
    const size_t table_bytes = (size_t)deft_opt_entries(o) * sizeof(deft_optimizer_segment);
    deft_optimizer_segment *host = (deft_optimizer_segment *)malloc(table_bytes ? table_bytes : 1);
    if (!host) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    for (int i = 0; i < deft_opt_entries(o); i++) host[i] = deft_opt_row(o, i, grads[i], dts[i]);
    cudaError_t ce = cudaMemcpyAsync(e->table, host, table_bytes, cudaMemcpyHostToDevice, st);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(st);
    free(host);
    return ce == cudaSuccess ? DEFT_OK : deft_opt_cuda_fail(ce, "copying the gather table");
}

/* A new entry: registered only once its table is on the device, so that a failure (out of memory under a limit,
 * say) leaves the cache as it was and the next run simply tries again. */
static deft_status deft_opt_new_table(deft_optimizer *o, const void *const *grads, const deft_dtype *dts,
                                      cudaStream_t st, const deft_optimizer_segment **out) {
    const size_t ptr_bytes = (size_t)deft_opt_entries(o) * sizeof *grads;
    const size_t dt_bytes = (size_t)deft_opt_entries(o) * sizeof *dts;
    deft_optimizer_gather e;
    memset(&e, 0, sizeof e);
    e.grads = (const void **)malloc(ptr_bytes ? ptr_bytes : 1);
    e.dtypes = (deft_dtype *)malloc(dt_bytes ? dt_bytes : 1);
    if (!e.grads || !e.dtypes) {
        free(e.grads);
        free(e.dtypes);
        return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    }
    void *table = NULL;
    deft_status s = deft_caching_alloc(o->device, (size_t)deft_opt_entries(o) * sizeof(deft_optimizer_segment), st,
                                       "optimizer.gather", &table);
    e.table = (deft_optimizer_segment *)table;
    if (s == DEFT_OK) s = deft_opt_fill_table(o, &e, grads, dts, st);
    if (s != DEFT_OK) {
        (void)deft_caching_free(o->device, table);
        free(e.grads);
        free(e.dtypes);
        return s;
    }
    memcpy(e.grads, grads, ptr_bytes);
    memcpy(e.dtypes, dts, dt_bytes);
    e.last_used = ++o->gather_clock;
    o->gathers[o->n_gathers++] = e;
    *out = e.table;
    return DEFT_OK;
}

/* Refills the least recently used table; another program's queued step may still read it, hence the device wait.
 * Until the copy is done the entry matches no addresses, so a failure leaves nothing half built. */
static deft_status deft_opt_reuse_table(deft_optimizer *o, const void *const *grads, const deft_dtype *dts,
                                        cudaStream_t st, const deft_optimizer_segment **out) {
    deft_optimizer_gather *e = &o->gathers[0];
    for (int i = 1; i < o->n_gathers; i++)
        if (o->gathers[i].last_used < e->last_used) e = &o->gathers[i];
    deft_status s = deft_device_synchronize(o->device);
    if (s != DEFT_OK) return s;
    const size_t ptr_bytes = (size_t)deft_opt_entries(o) * sizeof *grads;
    memset(e->grads, 0, ptr_bytes);
    s = deft_opt_fill_table(o, e, grads, dts, st);
    if (s != DEFT_OK) return s;
    memcpy(e->grads, grads, ptr_bytes);
    memcpy(e->dtypes, dts, (size_t)deft_opt_entries(o) * sizeof *dts);
    e->last_used = ++o->gather_clock;
    *out = e->table;
    return DEFT_OK;
}

/* The device gather table for these gradient addresses: one built before, or a new one. Building waits for the
 * stream: it happens on a program's first run, never during a capture. */
static deft_status deft_opt_gather_table(deft_optimizer *o, const void *const *grads, const deft_dtype *dts,
                                         cudaStream_t st, const deft_optimizer_segment **out) {
    *out = deft_opt_known_table(o, grads, dts);
    if (*out) return DEFT_OK;
    if (deft_opt_capturing(st))
        return deft_set_error(DEFT_ERR_STATE, "optimizer: the gradients sit at addresses this optimizer has not seen "
                              "while its stream is capturing a CUDA Graph; run the step once eagerly first");
    deft_status s = o->n_gathers < DEFT_OPTIMIZER_GATHER_CACHE ? deft_opt_new_table(o, grads, dts, st, out)
                                                                : deft_opt_reuse_table(o, grads, dts, st, out);
    if (s == DEFT_OK) return DEFT_OK;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", deft_errmsg());
    return deft_set_error(s, "optimizer %s: building its gather table: %s", o->step_node->name, msg);
}

/* The hyperparameters, by value: a captured graph keeps them. */
static deft_opt_hyper deft_opt_hyper_of(const deft_optimizer *o) {
    deft_opt_hyper h;
    h.kind = (int)o->kind;
    h.accumulate_steps = o->accumulate_steps;
    h.max_grad_norm = o->max_grad_norm;
    h.momentum = o->sgd.momentum;
    h.dampening = o->sgd.dampening;
    h.sgd_weight_decay = o->sgd.weight_decay;
    h.nesterov = o->sgd.nesterov;
    h.beta1 = o->adamw.beta1;
    h.beta2 = o->adamw.beta2;
    h.eps = o->adamw.eps;
    h.adamw_weight_decay = o->adamw.weight_decay;
    h.loss_scaling = o->scaler.on;
    h.growth = o->scaler.growth;
    h.backoff = o->scaler.backoff;
    h.interval = o->scaler.interval;
    return h;
}

template <class T>
static deft_status deft_opt_launch(deft_optimizer *o, const deft_optimizer_segment *table, float *out,
                                   cudaStream_t st) {
    const int64_t total = o->total;
    const deft_opt_hyper h = deft_opt_hyper_of(o);

    /* Every grid below depends only on the flat storage's size, so the launches (and the norm's summation order)
     * are the same on every run. */
    int64_t per_block = (total + DEFT_CUDA_MAX_BLOCKS - 1) / DEFT_CUDA_MAX_BLOCKS;
    if (per_block < DEFT_OPT_GATHER_CHUNK) per_block = DEFT_OPT_GATHER_CHUNK;
    const int64_t gather_blocks64 = (total + per_block - 1) / per_block;
    const unsigned gather_blocks = (unsigned)(gather_blocks64 > 0 ? gather_blocks64 : 1);
    unsigned norm_blocks = deft_cuda_blocks(total, DEFT_OPT_THREADS * 4);
    if (norm_blocks > DEFT_OPTIMIZER_NORM_BLOCKS) norm_blocks = DEFT_OPTIMIZER_NORM_BLOCKS;
    const unsigned update_blocks = deft_cuda_blocks(total, DEFT_OPT_THREADS);

    T *p = (T *)o->flat_params, *g = (T *)o->flat_grads, *s0 = (T *)o->state0, *s1 = (T *)o->state1;
    deft_optimizer_dev *dev = o->dev;
    const deft_tensor *n = o->step_node;

    if (!deft_optimizer_keeps_grads(o)) {
        if (deft_opt_fits_warp(o))
            deft_k_opt_fused_warp<T><<<1, DEFT_OPT_WARP, 0, st>>>(p, s0, s1, table, o->dev_blocks, o->n_blocks, dev,
                                                                  h, out);
        else if (total <= DEFT_OPT_ONE_BLOCK_MAX && o->n_blocks > 1)
            deft_k_opt_fused_one<T><<<1, DEFT_OPT_THREADS, 0, st>>>(p, s0, s1, table, o->dev_blocks, o->n_blocks, dev,
                                                                    h, out);
        else
            deft_k_opt_fused<T><<<(unsigned)o->n_blocks, DEFT_OPT_THREADS, 0, st>>>(p, s0, s1, table, o->dev_blocks,
                                                                                    o->dev_block_sums, dev, h, out);
        return deft_cuda_check_launch(n, "optimizer step");
    }
    deft_k_opt_gather<T><<<gather_blocks, DEFT_OPT_THREADS, 0, st>>>(g, table, o->n_params, total, per_block, dev);
    deft_status s = deft_cuda_check_launch(n, "optimizer gather");
    if (s != DEFT_OK) return s;
    deft_k_opt_norm<T><<<norm_blocks, DEFT_OPT_THREADS, 0, st>>>(g, total, dev, o->accumulate_steps);
    if ((s = deft_cuda_check_launch(n, "optimizer norm")) != DEFT_OK) return s;
    deft_k_opt_prepare<<<1, DEFT_OPT_THREADS, 0, st>>>(dev, (int)norm_blocks, h, out);
    if ((s = deft_cuda_check_launch(n, "optimizer prepare")) != DEFT_OK) return s;
    deft_k_opt_update<T><<<update_blocks, DEFT_OPT_THREADS, 0, st>>>(p, g, s0, s1, total, dev, h);
    return deft_cuda_check_launch(n, o->kind == DEFT_OPTIM_SGD ? "optimizer sgd" : "optimizer adamw");
}

/* The dtypes of a node's sources (n of them), for the gather table's rows: a finisher's are the pieces' f64 sums. Small
 * steps use `small`; *out is to be freed when it is not `small`. */
#define DEFT_OPT_SMALL 64
static deft_status deft_opt_src_dtypes(deft_tensor *const *srcs, int n, deft_dtype *small, deft_dtype **out) {
    *out = n <= DEFT_OPT_SMALL ? small : (deft_dtype *)malloc((size_t)n * sizeof **out);
    if (!*out) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    for (int i = 0; i < n; i++) (*out)[i] = srcs[i]->dtype;
    return DEFT_OK;
}

/* The gather table for this run's gradients, at grads in their sources' dtypes. */
static deft_status deft_opt_table_for(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads,
                                      cudaStream_t st, const deft_optimizer_segment **table) {
    deft_dtype small[DEFT_OPT_SMALL], *dts = NULL;
    deft_status s = deft_opt_src_dtypes(srcs, deft_opt_entries(o), small, &dts);
    if (s == DEFT_OK) s = deft_opt_gather_table(o, grads, dts, st, table);
    if (dts != small) free(dts);
    return s;
}

extern "C" deft_status deft_cuda_optimizer_run(struct deft_optimizer *o, deft_tensor *const *srcs,
                                               const void *const *grads, void *out, void *stream) {
    if (!o || !o->step_node)
        return deft_set_error(DEFT_ERR_STATE, "optimizer: run before its step node was built");
    if (!o->dev)
        return deft_set_error(DEFT_ERR_STATE, "optimizer %s: no device state on the GPU", o->step_node->name);
    if (o->total <= 0 || o->n_params <= 0)
        return deft_set_error(DEFT_ERR_STATE, "optimizer %s: no parameters", o->step_node->name);
    for (int i = 0; i < o->n_params; i++)
        if (!grads[i] && deft_shape_numel(o->params[i]->ndim, o->params[i]->shape) > 0)
            return deft_set_error(DEFT_ERR_INVALID, "optimizer %s: the gradient of %s has no storage",
                                  o->step_node->name, o->params[i]->name);
    deft_status s = deft_cuda_set_device(o->device.index);
    if (s != DEFT_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    const deft_optimizer_segment *table = NULL;
    s = deft_opt_table_for(o, srcs, grads, st, &table);
    if (s != DEFT_OK) return s;
    switch (o->dtype) {
    case DEFT_F32: return deft_opt_launch<float>(o, table, (float *)out, st);
    case DEFT_F64: return deft_opt_launch<double>(o, table, (float *)out, st);
    default:
        return deft_set_error(DEFT_ERR_DTYPE, "optimizer %s: parameters are %s; the optimizer keeps f32 or f64 weights",
                              o->step_node->name, deft_dtype_name(o->dtype));
    }
}

/* ---------------------------------------------------------------- the host side of a split step */
extern "C" deft_status deft_cuda_optimizer_blocks_new(struct deft_optimizer *o) {
    const size_t n = (size_t)(o->n_blocks > 0 ? o->n_blocks : 1);
    deft_optimizer_block *host = (deft_optimizer_block *)calloc(n, sizeof *host);
    if (!host) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    for (int i = 0; i < o->n_params; i++)
        for (int b = o->block_first[i]; b < o->block_first[i + 1]; b++) {
            deft_optimizer_block_range(o, i, b, &host[b].lo, &host[b].hi);
            host[b].param = i;
        }
    void *blocks = NULL, *sums = NULL;
    deft_status s = deft_mem_alloc_tagged(o->device, n * sizeof *host, "optimizer.blocks", &blocks);
    if (s == DEFT_OK) s = deft_mem_copy(o->device, blocks, deft_cpu(), host, n * sizeof *host);
    if (s == DEFT_OK) s = deft_mem_alloc_tagged(o->device, n * sizeof(double), "optimizer.blocks", &sums);
    free(host);
    if (s != DEFT_OK) {
        deft_mem_free(o->device, blocks);
        deft_mem_free(o->device, sums);
        return s;
    }
    o->dev_blocks = (deft_optimizer_block *)blocks;
    o->dev_block_sums = (double *)sums;
    return DEFT_OK;
}

template <class T>
static deft_status deft_opt_piece_launch(deft_optimizer *o, const deft_optimizer_segment *table, double *sums,
                                         cudaStream_t st) {
    deft_optimizer *w = o->part->whole;
    deft_k_opt_piece<T><<<(unsigned)o->part->n_blocks, DEFT_OPT_THREADS, 0, st>>>(
        (T *)w->flat_params, (T *)w->state0, (T *)w->state1, table, o->part->first_param, w->dev_blocks,
        o->part->first_block, w->dev, deft_opt_hyper_of(w), sums);
    return deft_cuda_check_launch(w->step_node, "optimizer piece");
}

extern "C" deft_status deft_cuda_optimizer_part_run(struct deft_optimizer *o, deft_tensor *const *srcs,
                                                    const void *const *grads, void *out, void *stream) {
    deft_optimizer *w = o->part->whole;
    if (!w->dev || !w->dev_blocks || !w->step_node)
        return deft_set_error(DEFT_ERR_STATE, "optimizer: a part of a step run before the step's device state");
    const int n = deft_opt_entries(o);
    for (int i = 0; i < n; i++)
        if (!grads[i])
            return deft_set_error(DEFT_ERR_INVALID, "optimizer %s: source %d of a part of the step has no storage",
                                  w->step_node->name, i);
    deft_status s = deft_cuda_set_device(o->device.index);
    if (s != DEFT_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    const deft_optimizer_segment *table = NULL;
    s = deft_opt_table_for(o, srcs, grads, st, &table);
    if (s != DEFT_OK) return s;
    if (o->part->finisher) {
        deft_k_opt_finish<<<1, DEFT_OPT_THREADS, 0, st>>>(table, o->part->n_pieces, w->n_blocks, w->dev, (float *)out);
        return deft_cuda_check_launch(w->step_node, "optimizer finish");
    }
    switch (o->dtype) {
    case DEFT_F32: return deft_opt_piece_launch<float>(o, table, (double *)out, st);
    case DEFT_F64: return deft_opt_piece_launch<double>(o, table, (double *)out, st);
    default:
        return deft_set_error(DEFT_ERR_DTYPE, "optimizer %s: parameters are %s; the optimizer keeps f32 or f64 weights",
                              w->step_node->name, deft_dtype_name(o->dtype));
    }
}
