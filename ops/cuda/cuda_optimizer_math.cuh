/* The optimizer's formulas on a GPU, shared by the general path (cuda_optimizer.cu: gather, norm, prepare, update),
 * the direct step (cuda_optimizer_direct.cu) and the one-launch step (cuda_optimizer_fused.cu): the hyperparameters, the per-run coefficients, SGD and AdamW on
 * one element, the fixed-shape block sum of the norm, and the close of an update. */
#ifndef DEFT_CUDA_OPTIMIZER_MATH_CUH
#define DEFT_CUDA_OPTIMIZER_MATH_CUH

#include "cuda_common.cuh"
#include "cuda_tuning.h"
#include "optimizer.h"

/* The hyperparameters, fixed when the optimizer is built: passed by value, so a captured graph keeps them. */
struct deft_opt_hyper {
    int kind;                 /* deft_optimizer_kind */
    int accumulate_steps;
    double max_grad_norm;
    double momentum, dampening, sgd_weight_decay;
    int nesterov;
    double beta1, beta2, eps, adamw_weight_decay;
    int loss_scaling;         /* dynamic loss scaling (ir/optimizer.h's deft_optimizer_scaler) */
    double growth, backoff;
    int interval;
    /* The parameters' low-precision copy (the compile option param_copies, ir/optimizer.h), indexed as the kernel's
     * parameters are; NULL: none. low_dtype is DEFT_BF16 or DEFT_F16. */
    void *low;
    int low_dtype;
};

/* An optimizer block's threads: DEFT_OPT_THREADS (cuda_tuning.h). */

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


/* The coefficients of this run, read once per thread from the device's counters: lr and wd (SGD's L2 term), step and
 * decay (AdamW's) are those of the optimizer's own options, or of a parameter group (deft_opt_coef_group); scale is
 * the factor on the gradients of a step whose norm was summed first (1/k times the clip factor), 1 in the one-launch
 * step. */
template <class T> struct deft_opt_coef {
    T lr, step, bc2_sqrt, decay, wd, scale;
    double bc1;               /* AdamW: 1 - beta1^t */
    bool first;
};

template <class T>
__device__ __forceinline__ deft_opt_coef<T> deft_opt_coef_of(const deft_optimizer_dev *dev, const deft_opt_hyper &h) {
    deft_opt_coef<T> c;
    c.lr = (T)dev->lr;
    c.step = (T)dev->step_size;
    c.bc2_sqrt = (T)dev->bc2_sqrt;
    c.decay = (T)dev->decay;
    c.wd = (T)h.sgd_weight_decay;
    c.scale = (T)dev->scale;
    c.bc1 = dev->bc1;
    c.first = dev->first != 0;
    return c;
}

/* The coefficients of parameter group gr (ir/optimizer.h), from this run's: runtime/optimizer_run.c's per-group
 * formulas, the group's rate lr * lr_scale formed in double. groups NULL (no group was made): c as it is. */
template <class T>
__device__ __forceinline__ deft_opt_coef<T> deft_opt_coef_group(deft_opt_coef<T> c, const deft_optimizer_dev *dev,
                                                                const deft_opt_hyper &h,
                                                                const deft_optimizer_group *groups, int param) {
    if (!groups) return c;
    const deft_optimizer_group gr = groups[param];
    const double lr = dev->lr * gr.lr_scale;
    c.lr = (T)lr;
    if (h.kind == DEFT_OPTIM_SGD) {
        c.wd = (T)gr.weight_decay;
    } else {
        c.step = (T)(lr / c.bc1);
        c.decay = (T)(1.0 - lr * gr.weight_decay);
    }
    return c;
}

/* Element j of an update also written to the parameters' low-precision copy, rounded by the cast kernel's own
 * conversion (deft_cast_one), so that a program reading the copy sees the bits a cast of the parameter would give. */
template <class T> __device__ __forceinline__ void deft_opt_store_low(const deft_opt_hyper &h, int64_t j, T v) {
    if constexpr (sizeof(T) == sizeof(float)) {
        if (!h.low) return;
        if (h.low_dtype == DEFT_BF16) ((__nv_bfloat16 *)h.low)[j] = deft_cast_one<float, __nv_bfloat16>(v);
        else ((__half *)h.low)[j] = deft_cast_one<float, __half>(v);
    }
}

/* runtime/optimizer_run.c's DEFT_SGD on one element held in registers (pj the parameter, bj its momentum buffer,
 * read only when momentum is on and this is not the first update) with the scaled gradient d: weight decay added
 * to d, the momentum buffer starting as d on the first update. */
template <class T>
__device__ __forceinline__ void deft_opt_sgd_reg(T &pj, T &bj, T d, const deft_opt_hyper &h,
                                                 const deft_opt_coef<T> &c) {
    const T mom = (T)h.momentum, damp = (T)(1.0 - h.dampening), wd = c.wd;
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
    deft_opt_store_low<T>(h, j, pj);
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
    deft_opt_store_low<T>(h, j, pj);
}

/* The coefficients of a one-launch step (no prepare kernel ran): from the device's counters. */
template <class T>
__device__ __forceinline__ deft_opt_coef<T> deft_opt_coef_now(const deft_optimizer_dev *dev, const deft_opt_hyper &h) {
    deft_opt_coef<T> c;
    c.first = dev->updates == 0;
    c.lr = (T)dev->lr;
    c.wd = (T)h.sgd_weight_decay;
    c.scale = T(1);
    c.step = c.bc2_sqrt = c.decay = T(0);
    c.bc1 = 1.0;
    if (h.kind != DEFT_OPTIM_SGD) {   /* double pow in every thread is a good part of a small SGD step */
        const double t = (double)(dev->updates + 1);
        c.bc1 = 1.0 - pow(h.beta1, t);
        c.step = (T)(dev->lr / c.bc1);
        c.bc2_sqrt = (T)sqrt(1.0 - pow(h.beta2, t));
        c.decay = (T)(1.0 - dev->lr * h.adamw_weight_decay);
    }
    return c;
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

/* The one-launch step (every update of a run in one kernel, cuda_optimizer_fused.cu): o's parameters, its state and
 * its norm blocks, the gradients through `table`; the norm to out (may be NULL). */
template <class T>
deft_status deft_opt_fused_launch(const deft_optimizer *o, const deft_optimizer_segment *table, const deft_opt_hyper &h,
                                  float *out, cudaStream_t st);
/* A piece of a split step (part o of whole w): its blocks' sums of squares to sums. */
template <class T>
deft_status deft_opt_piece_launch(const deft_optimizer *o, const deft_optimizer_segment *table,
                                  const deft_opt_hyper &h, double *sums, cudaStream_t st);
/* The finisher of a split step: the pieces' sums (through table) into the norm, and the counters advanced. */
deft_status deft_opt_finish_launch(const deft_optimizer *o, const deft_optimizer_segment *table, float *out,
                                   cudaStream_t st);

/* The grid of the norm's first stage over `total` elements (the plain norm kernel's and the direct one's: the same grid
 * gives the same order): a block per DEFT_OPT_THREADS * 4 elements, at most DEFT_OPTIMIZER_NORM_BLOCKS. */
static inline unsigned deft_opt_norm_blocks(int64_t total) {
    const unsigned b = deft_cuda_blocks(total, DEFT_OPT_THREADS * 4);
    return b > DEFT_OPTIMIZER_NORM_BLOCKS ? DEFT_OPTIMIZER_NORM_BLOCKS : b;
}

/* The direct step (cuda_optimizer_direct.cu: one micro-batch per update, with clipping or loss scaling, no flat
 * gradients): the norm's partial sums from the gradients where they lie, in the plain norm kernel's order; and, after
 * the prepare kernel, the update of every norm block with this run's scale. */
template <class T>
deft_status deft_opt_direct_norm_launch(const deft_optimizer *o, const deft_optimizer_segment *table, unsigned blocks,
                                        cudaStream_t st);
template <class T>
deft_status deft_opt_direct_update_launch(const deft_optimizer *o, const deft_optimizer_segment *table,
                                          const deft_opt_hyper &h, cudaStream_t st);

#endif
