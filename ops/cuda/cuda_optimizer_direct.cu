/* The direct step on a GPU: one micro-batch per update with clipping or loss scaling (GPT-2's AdamW with
 * max_grad_norm), where the whole norm must be known before any parameter changes, and so two passes over the
 * gradients are needed; but no more. The plain path (cuda_optimizer.cu) gathers the gradients into flat storage
 * first, then reads that copy twice: for 124M f32 parameters a 0.5 GB write and two 0.5 GB reads beyond the reads of
 * the gradients themselves. Here both passes read each gradient where the backward pass left it, through the gather
 * table, in its own dtype (bf16 under autocast, widened exactly):
 *
 *   norm     deft_k_opt_norm_direct: the norm's partial sums, in exactly the plain norm kernel's order
 *   prepare  the plain path's kernel (cuda_optimizer.cu), unchanged: the norm, the clip factor, the counters
 *   update   deft_k_opt_update_direct: one thread block per norm block (ir/optimizer.h), the one-launch step's walk
 *            (cuda_optimizer_walk.cuh: four elements a load where aligned) with each gradient times this run's scale
 *
 * The values are those of the plain path bit for bit: the norm's sums add the same squares in the same order, and the
 * update applies the plain update kernel's formulas (g * scale, then SGD or AdamW) to each element. Nothing here
 * allocates or waits: a captured step replays it as it is. */
#include "cuda_optimizer_math.cuh"
#include "cuda_optimizer_walk.cuh"
#include "cuda_tuning.h"

/* ---------------------------------------------------------------- norm */
/* The segment holding flat element j, searched in [a, n): the last whose offset is at most j. The segments tile
 * [0, total) in order (ir/optimizer.c lays the parameters end to end), so for j < total it holds j. */
__device__ __forceinline__ int deft_opt_segment_at(const deft_optimizer_segment *seg, int a, int n, int64_t j) {
    int b = n - 1;
    while (a < b) {
        const int m = (a + b + 1) / 2;
        if (seg[m].offset <= j) a = m;
        else b = m - 1;
    }
    return a;
}

/* A thread's position in its walk of the flat elements: the next element j, and its sum of squares so far. */
struct deft_opt_norm_at {
    int64_t j;
    double sum;
};

/* A thread's n elements j, j + stride, ... below `end` in segment (src, off), in that order. DEFT_OPT_NORM_UNROLL
 * loads (twice as many of 2-byte gradients) go out before any is added. Past the thread's last element a load reads
 * that element again (no predicate held across the loads: with one per load, ptxas kept only a few in flight) and
 * adds 0, which leaves a sum of squares (+0 or more, or NaN) exactly as it was. The adds are fma(v, v, sum), the
 * contraction nvcc makes of the plain kernel's sum += v * v (fma.rn.f64 in its PTX): the same rounding. */
template <class T> struct deft_opt_norm_walk {
    const void *src;
    int64_t off, end, stride;
    deft_opt_norm_at at;
    template <class G> __device__ __forceinline__ deft_opt_norm_at run() const {
        constexpr int U = sizeof(G) < 4 ? 2 * DEFT_OPT_NORM_UNROLL : DEFT_OPT_NORM_UNROLL;
        const G *__restrict__ g = (const G *)src - off;
        const int64_t n = (end - at.j + stride - 1) / stride, last = at.j + (n - 1) * stride;
        double sum = at.sum;
        for (int64_t i = 0; i < n; i += U) {
            T v[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t e = at.j + (i + u) * stride;
                v[u] = deft_opt_widen<T, G>(g[e < last ? e : last]);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const T x = i + u < n ? v[u] : T(0);
                sum = fma((double)x, (double)x, sum);
            }
        }
        return deft_opt_norm_at{last + stride, sum};
    }
};

/* Thread t of the grid (N threads in all) sums the squares of flat elements t, t + N, t + 2N, ... in that order, and
 * each block's tree of those sums goes to partial[block]: deft_k_opt_norm's work over flat gradients, read instead
 * from the segments that hold them. One micro-batch per update: every run is an update run. */
template <class T>
__global__ void __launch_bounds__(DEFT_OPT_THREADS)
    deft_k_opt_norm_direct(const deft_optimizer_segment *__restrict__ seg, int nseg, int64_t total,
                           deft_optimizer_dev *dev) {
    __shared__ double sh[DEFT_OPT_THREADS];
    const int64_t stride = deft_nthreads();
    deft_opt_norm_at at = {deft_tid(), 0.0};
    int s = at.j < total ? deft_opt_segment_at(seg, 0, nseg, at.j) : nseg;
    while (s < nseg) {
        const int64_t off = seg[s].offset;
        const deft_opt_norm_walk<T> w = {seg[s].src, off, off + seg[s].count, stride, at};
        at = deft_opt_by_dtype<T>(seg[s].dtype, w);
        if (at.j >= total) break;
        /* the next segment holds it when the stride is shorter than that segment (the common case) */
        s = s + 1 < nseg && at.j < seg[s + 1].offset + seg[s + 1].count ? s + 1
                                                                         : deft_opt_segment_at(seg, s + 1, nseg, at.j);
    }
    const double sum = deft_opt_block_sum(at.sum, sh);
    if (threadIdx.x == 0) dev->partial[blockIdx.x] = sum;
}

/* ---------------------------------------------------------------- update */
/* Block b updates norm block b with the coefficients the prepare kernel left (deft_opt_coef_of, and its parameter's
 * group): the plain update kernels' (deft_k_opt_update, deft_k_opt_update_groups) element by element. */
template <class T, int KIND>
__global__ void __launch_bounds__(DEFT_OPT_THREADS)
    deft_k_opt_update_direct(T *p, T *s0, T *s1, const deft_optimizer_segment *seg,
                             const deft_optimizer_block *blocks, const deft_optimizer_group *groups,
                             const deft_optimizer_dev *dev, deft_opt_hyper h) {
    if (!dev->update_now) return;   /* a step the loss scaler skipped: the whole grid returns */
    const deft_optimizer_block bk = blocks[blockIdx.x];
    const deft_opt_coef<T> c = deft_opt_coef_group<T>(deft_opt_coef_of<T>(dev, h), dev, h, groups, bk.param);
    (void)deft_opt_block_step<T, KIND, DEFT_OPT_WALK_SCALED>(p, s0, s1, bk, seg[bk.param], h, c);
}

/* ---------------------------------------------------------------- launches */
template <class T>
deft_status deft_opt_direct_norm_launch(const deft_optimizer *o, const deft_optimizer_segment *table, unsigned blocks,
                                        cudaStream_t st) {
    deft_k_opt_norm_direct<T><<<blocks, DEFT_OPT_THREADS, 0, st>>>(table, o->n_params, o->total, o->dev);
    return deft_cuda_check_launch(o->step_node, "optimizer norm");
}

template <class T>
deft_status deft_opt_direct_update_launch(const deft_optimizer *o, const deft_optimizer_segment *table,
                                          const deft_opt_hyper &h, cudaStream_t st) {
    T *p = (T *)o->flat_params, *s0 = (T *)o->state0, *s1 = (T *)o->state1;
    const dim3 grid((unsigned)o->n_blocks);
    if (h.kind == DEFT_OPTIM_SGD)
        deft_k_opt_update_direct<T, DEFT_OPTIM_SGD><<<grid, DEFT_OPT_THREADS, 0, st>>>(
            p, s0, s1, table, o->dev_blocks, o->dev_groups, o->dev, h);
    else
        deft_k_opt_update_direct<T, DEFT_OPTIM_ADAMW><<<grid, DEFT_OPT_THREADS, 0, st>>>(
            p, s0, s1, table, o->dev_blocks, o->dev_groups, o->dev, h);
    return deft_cuda_check_launch(o->step_node, o->kind == DEFT_OPTIM_SGD ? "optimizer sgd" : "optimizer adamw");
}

template deft_status deft_opt_direct_norm_launch<float>(const deft_optimizer *, const deft_optimizer_segment *,
                                                        unsigned, cudaStream_t);
template deft_status deft_opt_direct_norm_launch<double>(const deft_optimizer *, const deft_optimizer_segment *,
                                                         unsigned, cudaStream_t);
template deft_status deft_opt_direct_update_launch<float>(const deft_optimizer *, const deft_optimizer_segment *,
                                                          const deft_opt_hyper &, cudaStream_t);
template deft_status deft_opt_direct_update_launch<double>(const deft_optimizer *, const deft_optimizer_segment *,
                                                           const deft_opt_hyper &, cudaStream_t);
