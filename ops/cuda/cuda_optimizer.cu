/* The optimizer's step on a GPU: SGD (momentum, dampening, Nesterov, weight decay) and AdamW over the flat storage
 * (ir/optimizer.h), with the formulas of the CPU path (runtime/optimizer_run.c, torch.optim's), line by line.
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
 * With one micro-batch per update, no clipping and no loss scaling (the common case) one kernel does all four
 * (cuda_optimizer_fused.cu); a step that may be skipped must know the whole norm before it changes any parameter.
 * With one micro-batch and clipping or loss scaling there is nothing to sum across runs, so no flat gradients either:
 * the direct step (cuda_optimizer_direct.cu) runs norm, prepare and update reading the gradients where they lie, with
 * the same values. The four kernels below are the reference path, taken for several micro-batches per update, and
 * by an optimizer built while the debug knob OPT_REFERENCE was on (base/config.h), which tests compare against.
 * Under the compile option optimizer_in_backward the same step runs split (passes/optimizer_split.h): a piece kernel
 * per group of parameters as soon as their gradients exist, and a finisher; both paths sum the norm over the same
 * blocks in the same order.
 *
 * Under ZeRO-1 (the compile option zero_stage, dist/dist_zero.c) the plain path runs over this rank's slice. The
 * replica reduced every gradient's pieces to their owners during the backward pass (dist/dist_program.c), so the
 * slice's averaged gradients are in the slice-sized flat gradients already; then the norm of the slice and an
 * all-reduce of its sum, prepare, the update of the slice and an all-gather of the parameters (the collectives through
 * the optimizer's zero.ops). A world of one gathers the gradients from where the backward pass left them, as the
 * unsharded plain path does.
 *
 * The host compares this run's gradient addresses with those of the tables it built before (no synchronisation);
 * only a new set of addresses (a program's first run) builds a table, which must not happen inside a capture.
 *
 * Under autocast an f32 weight's gradient may come in bf16 or f16 (ir/autocast.h): each table row carries its
 * gradient's dtype and the kernels pick the load per segment (per norm block in the one-launch step), never per
 * element, so an f32 gradient is read exactly as before; widening is exact, so the results are bit for bit those of
 * the f32 gradients the cast back would have given. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_optimizer_math.cuh"
#include "cuda_tuning.h"

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
        dev->bc1 = 1.0 - pow(h.beta1, t);
        dev->step_size = dev->lr / dev->bc1;
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
template <class T>
__global__ void deft_k_opt_update(T *p, const T *g, T *s0, T *s1, int64_t total, const deft_optimizer_dev *dev,
                                  deft_opt_hyper h) {
    if (!dev->update_now) return;
    const T scale = (T)dev->scale;
    const deft_opt_coef<T> c = deft_opt_coef_of<T>(dev, h);
    for (int64_t j = deft_tid(); j < total; j += deft_nthreads()) {
        if (h.kind == DEFT_OPTIM_SGD) deft_opt_sgd_one<T>(p, s0, j, g[j] * scale, h, c);
        else deft_opt_adamw_one<T>(p, s0, s1, j, g[j] * scale, h, c);
    }
}

/* The same under parameter groups: block b takes the norm's block b (a run of one parameter's elements, ir/optimizer.h)
 * with that parameter's group's coefficients. Elementwise, so the values are the one-pass kernel's for each group. */
template <class T>
__global__ void deft_k_opt_update_groups(T *p, const T *g, T *s0, T *s1, const deft_optimizer_block *blocks,
                                         const deft_optimizer_group *groups, const deft_optimizer_dev *dev,
                                         deft_opt_hyper h) {
    if (!dev->update_now) return;
    const T scale = (T)dev->scale;
    const deft_optimizer_block bk = blocks[blockIdx.x];
    const deft_opt_coef<T> c = deft_opt_coef_group<T>(deft_opt_coef_of<T>(dev, h), dev, h, groups, bk.param);
    for (int64_t j = bk.lo + threadIdx.x; j < bk.hi; j += blockDim.x) {
        if (h.kind == DEFT_OPTIM_SGD) deft_opt_sgd_one<T>(p, s0, j, g[j] * scale, h, c);
        else deft_opt_adamw_one<T>(p, s0, s1, j, g[j] * scale, h, c);
    }
}

/* ---------------------------------------------------------------- the host side */
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
    /* Every path indexes the copy as it indexes flat_params: a sharded update from its slice's first element. */
    h.low = o->flat_low && deft_optimizer_sharded(o)
                ? (char *)o->flat_low + (size_t)o->zero.lo * deft_dtype_size(o->low_dtype)
                : o->flat_low;
    h.low_dtype = (int)o->low_dtype;
    return h;
}

/* ---------------------------------------------------------------- ZeRO-1 (ir/optimizer.h's deft_optimizer_zero)
 * The norm's first-stage sums of this rank's slice added in the prepare kernel's order into partial[0], the one value
 * all-reduced across the ranks (a non-finite gradient on any rank makes every rank's sum non-finite: under loss
 * scaling every rank then skips the update together). */
__global__ void deft_k_opt_zero_collapse(deft_optimizer_dev *dev, int nblocks) {
    __shared__ double sh[DEFT_OPT_THREADS];
    double v = 0.0;
    for (int b = (int)threadIdx.x; b < nblocks; b += (int)blockDim.x) v += dev->partial[b];
    const double sum = deft_opt_block_sum(v, sh);   /* every partial was read before its last barrier */
    if (threadIdx.x == 0) dev->partial[0] = sum;
}

template <class T>
static deft_status deft_opt_gather_launch(const deft_optimizer *o, const deft_optimizer_segment *table,
                                          cudaStream_t st);

/* A sharded step (ir/optimizer.h's deft_optimizer_zero): in a world of one the gradients gathered into the flat
 * gradients from the backward pass's buffers (several ranks reduced theirs there during the backward pass), the norm
 * of the slice and its all-reduce, the prepare kernel, the update of the slice (the state and the flat gradients
 * indexed from 0 at lo), and the all-gather of the parameters in place (with copies, of the copies, and the f32
 * parameters the replica reads broadcast from their owners). The collectives come from dist/ through
 * zero.ops; a world of one rank calls none. */
template <class T>
static deft_status deft_opt_zero_update_launch(const deft_optimizer *o, const deft_opt_hyper &h, cudaStream_t st) {
    const deft_optimizer_zero *z = &o->zero;
    const int64_t lo = z->lo, shard = z->hi - z->lo;
    T *p = (T *)o->flat_params + lo, *g = (T *)o->flat_grads, *s0 = (T *)o->state0, *s1 = (T *)o->state1;
    if (o->dev_groups) {
        if (z->n_blocks == 0) return DEFT_OK;   /* a slice of padding only */
        deft_k_opt_update_groups<T><<<(unsigned)z->n_blocks, DEFT_OPT_THREADS, 0, st>>>(p, g, s0, s1, z->dev_blocks,
                                                                                      o->dev_groups, o->dev, h);
    } else {
        deft_k_opt_update<T><<<deft_cuda_blocks(shard, DEFT_OPT_THREADS), DEFT_OPT_THREADS, 0, st>>>(p, g, s0, s1,
                                                                                                     shard, o->dev, h);
    }
    return deft_cuda_check_launch(o->step_node, o->kind == DEFT_OPTIM_SGD ? "optimizer sgd" : "optimizer adamw");
}

template <class T>
static deft_status deft_opt_zero_launch(deft_optimizer *o, const deft_optimizer_segment *table,
                                        const deft_opt_hyper &h, float *out, cudaStream_t st) {
    const deft_optimizer_zero *z = &o->zero;
    const bool collective = z->world > 1;
    const int64_t shard = z->hi - z->lo;
    const unsigned norm_blocks = deft_opt_norm_blocks(shard);
    const deft_tensor *n = o->step_node;
    deft_status s = collective ? DEFT_OK : deft_opt_gather_launch<T>(o, table, st);
    if (s != DEFT_OK) return s;
    deft_k_opt_norm<T><<<norm_blocks, DEFT_OPT_THREADS, 0, st>>>((const T *)o->flat_grads, shard, o->dev,
                                                                 o->accumulate_steps);
    if ((s = deft_cuda_check_launch(n, "optimizer norm")) != DEFT_OK) return s;
    deft_k_opt_zero_collapse<<<1, DEFT_OPT_THREADS, 0, st>>>(o->dev, (int)norm_blocks);
    if ((s = deft_cuda_check_launch(n, "optimizer norm (slice)")) != DEFT_OK) return s;
    if (collective) s = z->ops->all_reduce_sum(z->ctx, z->local, &o->dev->partial[0], st);
    if (s != DEFT_OK) return s;
    deft_k_opt_prepare<<<1, DEFT_OPT_THREADS, 0, st>>>(o->dev, 1, h, out);
    if ((s = deft_cuda_check_launch(n, "optimizer prepare")) != DEFT_OK) return s;
    s = deft_opt_zero_update_launch<T>(o, h, st);
    if (s != DEFT_OK || !collective) return s;
    if (!deft_optimizer_gathers_low(o))
        return z->ops->all_gather(z->ctx, z->local, o->flat_params, shard, o->dtype, st);
    /* The replica reads the copies, and the f32 values of f32_pieces' parameters only (ir/optimizer.h). */
    s = z->ops->all_gather(z->ctx, z->local, o->flat_low, shard, o->low_dtype, st);
    if (s == DEFT_OK && z->n_f32_pieces > 0)
        s = z->ops->broadcast_pieces(z->ctx, z->local, o->flat_params, z->f32_pieces, z->n_f32_pieces, o->dtype, st);
    return s;
}

/* The direct step (cuda_optimizer_direct.cu): the norm from the gradients where they lie, the prepare kernel, the
 * update. */
template <class T>
static deft_status deft_opt_direct_launch(const deft_optimizer *o, const deft_optimizer_segment *table,
                                          const deft_opt_hyper &h, float *out, cudaStream_t st) {
    const unsigned norm_blocks = deft_opt_norm_blocks(o->total);
    deft_status s = deft_opt_direct_norm_launch<T>(o, table, norm_blocks, st);
    if (s != DEFT_OK) return s;
    deft_k_opt_prepare<<<1, DEFT_OPT_THREADS, 0, st>>>(o->dev, (int)norm_blocks, h, out);
    if ((s = deft_cuda_check_launch(o->step_node, "optimizer prepare")) != DEFT_OK) return s;
    return deft_opt_direct_update_launch<T>(o, table, h, st);
}

/* The gather of this run's gradients into the flat gradients. Every grid here and below depends only on the flat
 * storage's size, so the launches (and the norm's summation order) are the same on every run. A gather block covers at
 * least DEFT_OPT_GATHER_CHUNK elements (cuda_tuning.h): it walks the segments that overlap its range. */
template <class T>
static deft_status deft_opt_gather_launch(const deft_optimizer *o, const deft_optimizer_segment *table,
                                          cudaStream_t st) {
    const int64_t total = o->total;
    int64_t per_block = (total + DEFT_CUDA_MAX_BLOCKS - 1) / DEFT_CUDA_MAX_BLOCKS;
    if (per_block < DEFT_OPT_GATHER_CHUNK) per_block = DEFT_OPT_GATHER_CHUNK;
    const int64_t gather_blocks64 = (total + per_block - 1) / per_block;
    const unsigned gather_blocks = (unsigned)(gather_blocks64 > 0 ? gather_blocks64 : 1);
    deft_k_opt_gather<T><<<gather_blocks, DEFT_OPT_THREADS, 0, st>>>((T *)o->flat_grads, table, o->n_params, total,
                                                                     per_block, o->dev);
    return deft_cuda_check_launch(o->step_node, "optimizer gather");
}

template <class T>
static deft_status deft_opt_launch(deft_optimizer *o, const deft_optimizer_segment *table, float *out,
                                   cudaStream_t st) {
    const deft_opt_hyper h = deft_opt_hyper_of(o);
    if (deft_optimizer_sharded(o)) return deft_opt_zero_launch<T>(o, table, h, out, st);
    if (!deft_optimizer_keeps_grads(o)) {
        if (o->max_grad_norm > 0.0 || o->scaler.on) return deft_opt_direct_launch<T>(o, table, h, out, st);
        return deft_opt_fused_launch<T>(o, table, h, out, st);
    }
    const int64_t total = o->total;
    const unsigned norm_blocks = deft_opt_norm_blocks(total);
    const unsigned update_blocks = deft_cuda_blocks(total, DEFT_OPT_THREADS);

    T *p = (T *)o->flat_params, *g = (T *)o->flat_grads, *s0 = (T *)o->state0, *s1 = (T *)o->state1;
    deft_optimizer_dev *dev = o->dev;
    const deft_tensor *n = o->step_node;

    deft_status s = deft_opt_gather_launch<T>(o, table, st);
    if (s != DEFT_OK) return s;
    deft_k_opt_norm<T><<<norm_blocks, DEFT_OPT_THREADS, 0, st>>>(g, total, dev, o->accumulate_steps);
    if ((s = deft_cuda_check_launch(n, "optimizer norm")) != DEFT_OK) return s;
    deft_k_opt_prepare<<<1, DEFT_OPT_THREADS, 0, st>>>(dev, (int)norm_blocks, h, out);
    if ((s = deft_cuda_check_launch(n, "optimizer prepare")) != DEFT_OK) return s;
    if (o->dev_groups)
        deft_k_opt_update_groups<T><<<(unsigned)o->n_blocks, DEFT_OPT_THREADS, 0, st>>>(p, g, s0, s1, o->dev_blocks,
                                                                                       o->dev_groups, dev, h);
    else
        deft_k_opt_update<T><<<update_blocks, DEFT_OPT_THREADS, 0, st>>>(p, g, s0, s1, total, dev, h);
    return deft_cuda_check_launch(n, o->kind == DEFT_OPTIM_SGD ? "optimizer sgd" : "optimizer adamw");
}

extern "C" deft_status deft_cuda_optimizer_run(struct deft_optimizer *o, const deft_optimizer_segment *table, void *out,
                                               void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    switch (o->dtype) {
    case DEFT_F32: return deft_opt_launch<float>(o, table, (float *)out, st);
    case DEFT_F64: return deft_opt_launch<double>(o, table, (float *)out, st);
    default:
        return deft_set_error(DEFT_ERR_DTYPE, "optimizer %s: parameters are %s; the optimizer keeps f32 or f64 weights",
                              o->step_node->name, deft_dtype_name(o->dtype));
    }
}

/* ---------------------------------------------------------------- the low-precision copy, written whole
 * After the parameters were written outside a step (ir/optimizer.h's low_stale): the cast kernel's conversion. */
template <class L> __global__ void deft_k_opt_copy_refresh(const float *__restrict__ p, L *__restrict__ low, int64_t n) {
    for (int64_t j = deft_tid(); j < n; j += deft_nthreads()) low[j] = deft_cast_one<float, L>(p[j]);
}

extern "C" deft_status deft_cuda_optimizer_copy_refresh(struct deft_optimizer *o, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t n = deft_optimizer_flat_count(o);   /* a sharded copy's padding too: its all-gather sends it */
    if (!o->flat_low || n == 0) return DEFT_OK;
    const unsigned blocks = deft_cuda_blocks(n, DEFT_CUDA_THREADS);
    if (o->low_dtype == DEFT_BF16)
        deft_k_opt_copy_refresh<<<blocks, DEFT_CUDA_THREADS, 0, st>>>((const float *)o->flat_params,
                                                                      (__nv_bfloat16 *)o->flat_low, n);
    else
        deft_k_opt_copy_refresh<<<blocks, DEFT_CUDA_THREADS, 0, st>>>((const float *)o->flat_params,
                                                                      (__half *)o->flat_low, n);
    return deft_cuda_check_launch(o->step_node, "optimizer parameter copies");
}

/* ---------------------------------------------------------------- the host side of a split step */
extern "C" deft_status deft_cuda_optimizer_part_run(struct deft_optimizer *o, const deft_optimizer_segment *table,
                                                    void *out, void *stream) {
    deft_optimizer *w = o->part->whole;
    cudaStream_t st = (cudaStream_t)stream;
    if (o->part->finisher) return deft_opt_finish_launch(o, table, (float *)out, st);
    switch (o->dtype) {
    case DEFT_F32: return deft_opt_piece_launch<float>(o, table, deft_opt_hyper_of(w), (double *)out, st);
    case DEFT_F64: return deft_opt_piece_launch<double>(o, table, deft_opt_hyper_of(w), (double *)out, st);
    default:
        return deft_set_error(DEFT_ERR_DTYPE, "optimizer %s: parameters are %s; the optimizer keeps f32 or f64 weights",
                              w->step_node->name, deft_dtype_name(o->dtype));
    }
}
