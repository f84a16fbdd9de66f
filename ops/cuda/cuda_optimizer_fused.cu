/* The optimizer's one-launch step on a GPU, and the pieces and finisher of a split step (optimizer in backward, data
 * parallel pieces): every update of a run in one kernel over the norm's blocks (ir/optimizer.h). The general path
 * (gather, norm, prepare, update) and the host side are in cuda_optimizer.cu; the formulas are shared
 * (cuda_optimizer_math.cuh), and so is the walk of a block (cuda_optimizer_walk.cuh).
 *
 * With one micro-batch per update and no clipping, nothing in an update waits on the norm, so a single kernel does
 * the whole step: block b takes the norm's block b (ir/optimizer.h: a run of one parameter's elements), reads its
 * gradients through the gather table (there are no flat gradients: deft_optimizer_keeps_grads), updates them with the
 * coefficients of this run (from the device's counters, which no block changes before every block has read them),
 * and writes the block's sum of squares; the last block to finish (a ticket after a fence) adds the sums in block
 * order, writes the norm and advances the counters. The formulas are the update kernels' with scale 1, so both paths
 * give the same parameters; the pieces of a split step give the same parameters and the same norm, as they walk the
 * same blocks with the same code.
 *
 * The kernels are specialised by optimizer kind: SGD's step needs far fewer registers than AdamW's, and with the kind
 * chosen at run time too few blocks fitted an SM to keep enough loads in flight for the memory's rate
 * (bench/RESULTS.md, "Seventh round"). */
#include "cuda_optimizer_math.cuh"
#include "cuda_optimizer_walk.cuh"
#include "cuda_tuning.h"

template <class T, int KIND>
__global__ void __launch_bounds__(DEFT_OPT_THREADS)
    deft_k_opt_fused(T *p, T *s0, T *s1, const deft_optimizer_segment *seg, const deft_optimizer_block *blocks,
                     const deft_optimizer_group *groups, double *block_sums, deft_optimizer_dev *dev,
                     deft_opt_hyper h, float *out) {
    __shared__ double sh[DEFT_OPT_THREADS];
    __shared__ bool last;
    const deft_optimizer_block bk = blocks[blockIdx.x];
    const deft_opt_coef<T> c = deft_opt_coef_group<T>(deft_opt_coef_now<T>(dev, h), dev, h, groups, bk.param);
    double sum = deft_opt_block_sum(deft_opt_block_step<T, KIND>(p, s0, s1, bk, seg[bk.param], h, c), sh);
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
 * through the same tree: the last block of deft_k_opt_fused adds the sums in exactly this order. Models of up to
 * DEFT_OPT_ONE_BLOCK_MAX elements (cuda_tuning.h). */
template <class T, int KIND>
__global__ void deft_k_opt_fused_one(T *p, T *s0, T *s1, const deft_optimizer_segment *seg,
                                     const deft_optimizer_block *blocks, const deft_optimizer_group *groups,
                                     int n_blocks, deft_optimizer_dev *dev, deft_opt_hyper h, float *out) {
    __shared__ double sh[DEFT_OPT_THREADS];
    const deft_opt_coef<T> c = deft_opt_coef_now<T>(dev, h);
    double v = 0.0;
    for (int b = 0; b < n_blocks; b++) {
        const deft_optimizer_block bk = blocks[b];
        const deft_opt_coef<T> cg = deft_opt_coef_group<T>(c, dev, h, groups, bk.param);
        const double sum = deft_opt_block_sum(deft_opt_block_step<T, KIND>(p, s0, s1, bk, seg[bk.param], h, cg), sh);
        if ((int)threadIdx.x == b % (int)blockDim.x) v += sum;
        __syncthreads();   /* every thread has read sh[0] before the next sum writes it */
    }
    const double total_sq = deft_opt_block_sum(v, sh);
    if (threadIdx.x == 0) deft_opt_close(dev, total_sq, c.first, out);
}

/* The step of a model whose parameters all have at most 32 elements (and are at most 32), in one warp and without a
 * barrier: lane t takes element t of each parameter. The block trees of the kernels above add, for such a block,
 * zeros in their rounds over 128, 64 and 32 (exact) and then pair lanes as the shuffles below do, so the norm is the
 * same bit for bit; so is the final tree over the blocks' sums. (Such blocks have fewer than four elements per thread
 * and so are summed one element per thread by the vector walk too.) */
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
                                      const deft_optimizer_block *blocks, const deft_optimizer_group *groups,
                                      int n_blocks, deft_optimizer_dev *dev, deft_opt_hyper h, float *out) {
    const int lane = (int)threadIdx.x;
    const deft_opt_coef<T> c = deft_opt_coef_now<T>(dev, h);
    double v = 0.0;
    for (int b = 0; b < n_blocks; b++) {
        const deft_optimizer_block bk = blocks[b];
        const int64_t j = bk.lo + lane;
        double sum = 0.0;
        if (j < bk.hi) {
            const deft_opt_coef<T> cg = deft_opt_coef_group<T>(c, dev, h, groups, bk.param);
            const T g = deft_opt_grad_at<T>(seg[bk.param], j - seg[bk.param].offset);
            sum += (double)g * (double)g;
            if (h.kind == DEFT_OPTIM_SGD) deft_opt_sgd_one<T>(p, s0, j, g, h, cg);
            else deft_opt_adamw_one<T>(p, s0, s1, j, g, h, cg);
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
template <class T, int KIND>
__global__ void __launch_bounds__(DEFT_OPT_THREADS)
    deft_k_opt_piece(T *p, T *s0, T *s1, const deft_optimizer_segment *seg, int first_param,
                     const deft_optimizer_block *blocks, const deft_optimizer_group *groups, int first_block,
                     const deft_optimizer_dev *dev, deft_opt_hyper h, double *sums) {
    __shared__ double sh[DEFT_OPT_THREADS];
    const deft_optimizer_block bk = blocks[first_block + (int)blockIdx.x];
    const deft_opt_coef<T> c = deft_opt_coef_group<T>(deft_opt_coef_now<T>(dev, h), dev, h, groups, bk.param);
    const double sum =
        deft_opt_block_sum(deft_opt_block_step<T, KIND>(p, s0, s1, bk, seg[bk.param - first_param], h, c), sh);
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

/* ---------------------------------------------------------------- launches */
template <class T, int KIND>
static void deft_opt_fused_queue(const deft_optimizer *o, const deft_optimizer_segment *table,
                                 const deft_opt_hyper &h, float *out, cudaStream_t st) {
    T *p = (T *)o->flat_params, *s0 = (T *)o->state0, *s1 = (T *)o->state1;
    if (deft_opt_fits_warp(o))
        deft_k_opt_fused_warp<T><<<1, DEFT_OPT_WARP, 0, st>>>(p, s0, s1, table, o->dev_blocks, o->dev_groups,
                                                              o->n_blocks, o->dev, h, out);
    else if (o->total <= DEFT_OPT_ONE_BLOCK_MAX && o->n_blocks > 1)
        deft_k_opt_fused_one<T, KIND><<<1, DEFT_OPT_THREADS, 0, st>>>(p, s0, s1, table, o->dev_blocks, o->dev_groups,
                                                                      o->n_blocks, o->dev, h, out);
    else
        deft_k_opt_fused<T, KIND><<<(unsigned)o->n_blocks, DEFT_OPT_THREADS, 0, st>>>(
            p, s0, s1, table, o->dev_blocks, o->dev_groups, o->dev_block_sums, o->dev, h, out);
}

template <class T>
deft_status deft_opt_fused_launch(const deft_optimizer *o, const deft_optimizer_segment *table, const deft_opt_hyper &h,
                                  float *out, cudaStream_t st) {
    if (h.kind == DEFT_OPTIM_SGD) deft_opt_fused_queue<T, DEFT_OPTIM_SGD>(o, table, h, out, st);
    else deft_opt_fused_queue<T, DEFT_OPTIM_ADAMW>(o, table, h, out, st);
    return deft_cuda_check_launch(o->step_node, "optimizer step");
}

template <class T>
deft_status deft_opt_piece_launch(const deft_optimizer *o, const deft_optimizer_segment *table,
                                  const deft_opt_hyper &h, double *sums, cudaStream_t st) {
    const deft_optimizer *w = o->part->whole;
    const dim3 grid((unsigned)o->part->n_blocks);
    T *p = (T *)w->flat_params, *s0 = (T *)w->state0, *s1 = (T *)w->state1;
    if (h.kind == DEFT_OPTIM_SGD)
        deft_k_opt_piece<T, DEFT_OPTIM_SGD><<<grid, DEFT_OPT_THREADS, 0, st>>>(
            p, s0, s1, table, o->part->first_param, w->dev_blocks, w->dev_groups, o->part->first_block, w->dev, h,
            sums);
    else
        deft_k_opt_piece<T, DEFT_OPTIM_ADAMW><<<grid, DEFT_OPT_THREADS, 0, st>>>(
            p, s0, s1, table, o->part->first_param, w->dev_blocks, w->dev_groups, o->part->first_block, w->dev, h,
            sums);
    return deft_cuda_check_launch(w->step_node, "optimizer piece");
}

deft_status deft_opt_finish_launch(const deft_optimizer *o, const deft_optimizer_segment *table, float *out,
                                   cudaStream_t st) {
    const deft_optimizer *w = o->part->whole;
    deft_k_opt_finish<<<1, DEFT_OPT_THREADS, 0, st>>>(table, o->part->n_pieces, w->n_blocks, w->dev, out);
    return deft_cuda_check_launch(w->step_node, "optimizer finish");
}

template deft_status deft_opt_fused_launch<float>(const deft_optimizer *, const deft_optimizer_segment *,
                                                  const deft_opt_hyper &, float *, cudaStream_t);
template deft_status deft_opt_fused_launch<double>(const deft_optimizer *, const deft_optimizer_segment *,
                                                   const deft_opt_hyper &, float *, cudaStream_t);
template deft_status deft_opt_piece_launch<float>(const deft_optimizer *, const deft_optimizer_segment *,
                                                  const deft_opt_hyper &, double *, cudaStream_t);
template deft_status deft_opt_piece_launch<double>(const deft_optimizer *, const deft_optimizer_segment *,
                                                   const deft_opt_hyper &, double *, cudaStream_t);
