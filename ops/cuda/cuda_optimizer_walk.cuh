/* The walk of one norm block (ir/optimizer.h: a run of one parameter's elements) that the block-wise step kernels
 * share: the one-launch step, the pieces of a split step (cuda_optimizer_fused.cu) and the direct step's update
 * (cuda_optimizer_direct.cu). Each element is read, updated with the formulas of cuda_optimizer_math.cuh and written
 * back once, four neighbouring elements a load where the block starts on such a vector in every array.
 *
 * What a walk does with a gradient is its MODE: DEFT_OPT_WALK_NORM (the one-launch step and the pieces) takes it as it
 * is and sums its square for the norm; DEFT_OPT_WALK_SCALED (the direct step, whose norm was summed before by its own
 * kernel) multiplies it by the run's factor c.scale (1/k times the clip factor, and 1/loss scale) in the parameters'
 * type, as the plain update kernel does (g[j] * scale), and sums nothing: such a walk returns 0. */
#ifndef DEFT_CUDA_OPTIMIZER_WALK_CUH
#define DEFT_CUDA_OPTIMIZER_WALK_CUH

#include "cuda_optimizer_math.cuh"
#include "cuda_tuning.h"

enum { DEFT_OPT_WALK_NORM = 0, DEFT_OPT_WALK_SCALED = 1 };

/* The gradient the formulas take, and its square added to the thread's sum (in element order), by MODE. */
template <class T, int MODE>
__device__ __forceinline__ T deft_opt_walk_grad(T g, double &sum, const deft_opt_coef<T> &c) {
    if constexpr (MODE == DEFT_OPT_WALK_SCALED) {
        (void)sum;
        return g * c.scale;
    } else {
        sum += (double)g * (double)g;
        return g;
    }
}

/* A block's elements [lo, hi), one element at a time: thread t takes lo + t, lo + t + blockDim.x, ... in that order,
 * U (DEFT_OPT_UNROLL, cuda_tuning.h) at a time, every load of a group issued before any store (the restrict
 * qualifiers let the compiler keep them together). Returns the thread's sum of squares of its gradients, added in
 * element order. */
template <class T, class G, int KIND, int MODE>
__device__ double deft_opt_range_scalar(T *__restrict__ p, T *__restrict__ s0, T *__restrict__ s1,
                                        const G *__restrict__ g, int64_t lo, int64_t hi, const deft_opt_hyper &h,
                                        const deft_opt_coef<T> &c) {
    constexpr bool sgd = KIND == DEFT_OPTIM_SGD;
    const int64_t bd = blockDim.x;
    const bool moments = sgd ? h.momentum != 0.0 : true;
    double sum = 0.0;
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
            const T d = deft_opt_walk_grad<T, MODE>(gv[u], sum, c);
            if constexpr (sgd) deft_opt_sgd_reg<T>(pv[u], av[u], d, h, c);
            else deft_opt_adamw_reg<T>(pv[u], av[u], bv[u], d, h, c);
        }
#pragma unroll
        for (int u = 0; u < DEFT_OPT_UNROLL; u++) {
            const int64_t k = j + u * bd;
            p[k] = pv[u];
            deft_opt_store_low<T>(h, k, pv[u]);
            if (moments) s0[k] = av[u];
            if (!sgd) s1[k] = bv[u];
        }
    }
    for (; j < hi; j += bd) {
        const T gj = deft_opt_walk_grad<T, MODE>(deft_opt_widen<T, G>(g[j]), sum, c);
        if constexpr (sgd) deft_opt_sgd_one<T>(p, s0, j, gj, h, c);
        else deft_opt_adamw_one<T>(p, s0, s1, j, gj, h, c);
    }
    return sum;
}

/* V elements of the low-precision copy in one store (the block walk checked its alignment). */
template <class T>
__device__ __forceinline__ void deft_opt_store_low_vec(const deft_opt_hyper &h, int64_t k, const T (&v)[DEFT_OPT_VEC]) {
    if constexpr (sizeof(T) == sizeof(float)) {
        if (!h.low) return;
        if (h.low_dtype == DEFT_BF16) {
            deft_vec<__nv_bfloat16, DEFT_OPT_VEC> o;
#pragma unroll
            for (int e = 0; e < DEFT_OPT_VEC; e++) o.e[e] = deft_cast_one<float, __nv_bfloat16>(v[e]);
            *reinterpret_cast<deft_vec<__nv_bfloat16, DEFT_OPT_VEC> *>((__nv_bfloat16 *)h.low + k) = o;
        } else {
            deft_vec<__half, DEFT_OPT_VEC> o;
#pragma unroll
            for (int e = 0; e < DEFT_OPT_VEC; e++) o.e[e] = deft_cast_one<float, __half>(v[e]);
            *reinterpret_cast<deft_vec<__half, DEFT_OPT_VEC> *>((__half *)h.low + k) = o;
        }
    }
}

/* The same with four neighbouring elements per load (16 bytes of f32 parameters and state, 8 or 16 of gradients),
 * where [lo, hi) starts on such a vector in every array: thread t takes vectors t, t + blockDim.x, ... two at a time,
 * then the last hi - lo mod 4 elements go one to a thread (0, 1, 2). Its sum adds its vectors' squares in element
 * order, then its tail element. One element at a time moved 4 bytes per load, and the step ran well under the
 * memory's rate. The arithmetic per element is the scalar walk's. The four is DEFT_OPT_VEC and the two
 * DEFT_OPT_VEC_UNROLL (cuda_tuning.h). */
template <class T, class G> __device__ __forceinline__ void deft_opt_load_vec(const G *g, T (&out)[DEFT_OPT_VEC]) {
    const deft_vec<G, DEFT_OPT_VEC> v = *reinterpret_cast<const deft_vec<G, DEFT_OPT_VEC> *>(g);
#pragma unroll
    for (int e = 0; e < DEFT_OPT_VEC; e++) out[e] = deft_opt_widen<T, G>(v.e[e]);
}

template <class T> __device__ __forceinline__ void deft_opt_store_vec(T *p, const T (&v)[DEFT_OPT_VEC]) {
    deft_vec<T, DEFT_OPT_VEC> o;
#pragma unroll
    for (int e = 0; e < DEFT_OPT_VEC; e++) o.e[e] = v[e];
    *reinterpret_cast<deft_vec<T, DEFT_OPT_VEC> *>(p) = o;
}

template <class T, class G, int KIND, int MODE>
__device__ double deft_opt_range_vec(T *__restrict__ p, T *__restrict__ s0, T *__restrict__ s1,
                                     const G *__restrict__ g, int64_t lo, int64_t hi, const deft_opt_hyper &h,
                                     const deft_opt_coef<T> &c) {
    constexpr bool sgd = KIND == DEFT_OPTIM_SGD;
    constexpr int V = DEFT_OPT_VEC, U = DEFT_OPT_VEC_UNROLL;
    const int64_t bd = blockDim.x, nvec = (hi - lo) / V;
    const bool moments = sgd ? h.momentum != 0.0 : true;
    double sum = 0.0;
    int64_t i = threadIdx.x;
    for (; i < nvec; i += U * bd) {
        T gv[U][V], pv[U][V], av[U][V], bv[U][V];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t k = lo + (i + u * bd) * V;
            if (i + u * bd >= nvec) continue;
            deft_opt_load_vec<T, G>(g + k, gv[u]);
            deft_opt_load_vec<T, T>(p + k, pv[u]);
#pragma unroll
            for (int e = 0; e < V; e++) av[u][e] = bv[u][e] = T(0);
            if (moments && !c.first) deft_opt_load_vec<T, T>(s0 + k, av[u]);
            if (!sgd && !c.first) deft_opt_load_vec<T, T>(s1 + k, bv[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (i + u * bd >= nvec) continue;
#pragma unroll
            for (int e = 0; e < V; e++) {
                const T d = deft_opt_walk_grad<T, MODE>(gv[u][e], sum, c);
                if constexpr (sgd) deft_opt_sgd_reg<T>(pv[u][e], av[u][e], d, h, c);
                else deft_opt_adamw_reg<T>(pv[u][e], av[u][e], bv[u][e], d, h, c);
            }
            const int64_t k = lo + (i + u * bd) * V;
            deft_opt_store_vec<T>(p + k, pv[u]);
            deft_opt_store_low_vec<T>(h, k, pv[u]);
            if (moments) deft_opt_store_vec<T>(s0 + k, av[u]);
            if (!sgd) deft_opt_store_vec<T>(s1 + k, bv[u]);
        }
    }
    const int64_t j = lo + nvec * V + threadIdx.x;
    if (j < hi) {
        const T gj = deft_opt_walk_grad<T, MODE>(deft_opt_widen<T, G>(g[j]), sum, c);
        if constexpr (sgd) deft_opt_sgd_one<T>(p, s0, j, gj, h, c);
        else deft_opt_adamw_one<T>(p, s0, s1, j, gj, h, c);
    }
    return sum;
}

/* Updates the elements of one norm block and returns this thread's sum of squares of their gradients (read in the
 * segment's dtype: one choice per block; 0 for a scaled walk). The vector walk is taken for f32 weights wherever every
 * array starts the block on a whole vector: the choice depends only on the addresses, the same on every run of a
 * program. */
template <class T, int KIND, int MODE> struct deft_opt_block_run {
    T *p, *s0, *s1;
    const deft_optimizer_block &bk;
    const deft_optimizer_segment &seg;
    const deft_opt_hyper &h;
    const deft_opt_coef<T> &c;
    template <class G> __device__ __forceinline__ double run() const {
        const G *g = (const G *)seg.src - seg.offset;
        if constexpr (sizeof(T) == sizeof(float)) {
            constexpr size_t VB = DEFT_OPT_VEC * sizeof(T);
            if (deft_is_aligned(p + bk.lo, VB) && (!s0 || deft_is_aligned(s0 + bk.lo, VB)) &&
                (!s1 || deft_is_aligned(s1 + bk.lo, VB)) &&
                (!h.low || deft_is_aligned((const char *)h.low + bk.lo * 2, DEFT_OPT_VEC * 2)) &&
                deft_is_aligned(g + bk.lo, DEFT_OPT_VEC * sizeof(G)))
                return deft_opt_range_vec<T, G, KIND, MODE>(p, s0, s1, g, bk.lo, bk.hi, h, c);
        }
        return deft_opt_range_scalar<T, G, KIND, MODE>(p, s0, s1, g, bk.lo, bk.hi, h, c);
    }
};

template <class T, int KIND, int MODE = DEFT_OPT_WALK_NORM>
__device__ __forceinline__ double deft_opt_block_step(T *p, T *s0, T *s1, const deft_optimizer_block &bk,
                                                      const deft_optimizer_segment &seg, const deft_opt_hyper &h,
                                                      const deft_opt_coef<T> &c) {
    deft_opt_block_run<T, KIND, MODE> r = {p, s0, s1, bk, seg, h, c};
    return deft_opt_by_dtype<T>(seg.dtype, r);
}

#endif
