/* Batch norm's fast kernels on CUDA. The plain ones (cuda_norm.cu) give each channel one block, which leaves most of
 * a GPU idle when there are few channels with many elements each (64 channels of 128 x 32 x 32 on 132 SMs).
 *
 * The two per-channel reductions (the statistics: sums of x - K and (x - K)^2, shifted by the channel's first
 * element K so that the variance does not cancel; the gradient sums: of dy and dy (x - mean)) run over a grid of
 * channel x chunk: each block sums its chunk (threads accumulate in the compute type, the block in double), writes a
 * partial, and the last block of a channel to finish (an atomic count) adds the partials in chunk order, in double,
 * and writes the channel's results, so the result does not depend on which block ran last. NCHW walks each
 * channel's planes; NHWC (and any input whose channel is its innermost axis) walks whole rows, a warp over 32
 * neighbouring channels, so every load is coalesced. The elementwise passes (y, dx) read per-channel values and
 * compute in float (double for f64).
 *
 * The partials and counts live in the stream's workspace (cuda_workspace.cu), taken outside a capture; the last
 * block sets its count back to zero, so every launch is capturable and a replay starts clean. */
#include "cuda_block_reduce.cuh"
#include "cuda_norm.cuh"

#define DEFT_BN_COUNTERS DEFT_NORM_COUNTERS        /* columns (channels, or groups of 32 in the row walk) */
#define DEFT_BN_PARTIALS DEFT_NORM_PARTIALS        /* double2 partials: channels x chunks */
static_assert(sizeof(unsigned) == 4 && sizeof(double2) == 16, "DEFT_NORM_WORKSPACE_BYTES counts 4- and 16-byte items");
#define DEFT_BN_PLANE_CHUNK 4096                   /* elements of a channel per block in the plane walk */
#define DEFT_BN_ROW_CHUNK 256                      /* rows per block in the row walk */
#define DEFT_BN_ROW_WARPS 8                        /* the row walk's block: 32 channels x 8 rows */

/* The stream's workspace (cuda_workspace.cu: its counts zeroed when first taken); *have = false (nothing allocated)
 * when the stream has none yet and is capturing, where allocating and zeroing are not allowed, or when memory is
 * short: the plain kernels need no scratch. */
static deft_status deft_bn_workspace(const deft_tensor *n, cudaStream_t st, void **ws, bool *have) {
    *have = false;
    int dev = 0;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaStreamIsCapturing(st, &cs);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: batch norm workspace: %s", deft_op_name(n->op),
                              cudaGetErrorString(e));
    }
    if (cs != cudaStreamCaptureStatusNone) {
        *ws = deft_stream_workspace_existing(dev, st, DEFT_WORKSPACE_NORM);
        *have = *ws != NULL;
        return DEFT_OK;
    }
    const deft_status s = deft_stream_workspace(dev, st, DEFT_WORKSPACE_NORM, ws);
    if (s == DEFT_ERR_OOM) return DEFT_OK;
    *have = s == DEFT_OK;
    return s;
}

/* ---- what is summed per channel, and what the last block does with the sums ---- */

/* The statistics: sums of d = x - K and d^2, K the channel's first element. rm, rv NULL: no running update. */
template <class T, class P> struct deft_bn_stats_term {
    typedef typename deft_ty<T>::C A;
    const T *x;
    P *stats, *rm, *rv;
    double eps, mom;
    __device__ A context(const deft_bn_geom &g, int64_t c) const { return deft_ty<T>::load(x[c * g.sC]); }
    __device__ void add(int64_t off, A k, A &a, A &b) const {
        const A d = deft_ty<T>::load(x[off]) - k;
        a += d;
        b += d * d;
    }
    __device__ void finish(const deft_bn_geom &g, int64_t c, double sa, double sb) const {
        const double m = (double)(g.N * g.S), shifted = sa / m;
        double var = sb / m - shifted * shifted;
        if (var < 0.0) var = 0.0;
        const double mean = (double)context(g, c) + shifted;
        stats[c] = deft_ty<P>::from_f64(mean);
        stats[g.C + c] = deft_ty<P>::from_f64(1.0 / sqrt(var + eps));
        if (!rm) return;
        rm[c] = deft_ty<P>::from_f64((1.0 - mom) * (double)deft_ty<P>::load(rm[c]) + mom * mean);
        rv[c] = deft_ty<P>::from_f64((1.0 - mom) * (double)deft_ty<P>::load(rv[c]) + mom * var * m / (m - 1.0));
    }
};

/* The gradient sums: of dy, and of dy (x - mean), which times invstd is the sum of dy xhat. */
template <class T, class P> struct deft_bn_grad_term {
    typedef typename deft_ty<T>::C A;
    const T *dy, *x;
    const P *stats;
    P *sums;
    __device__ A context(const deft_bn_geom &, int64_t c) const { return (A)deft_ty<P>::load(stats[c]); }
    __device__ void add(int64_t off, A mean, A &a, A &b) const {
        const A d = deft_ty<T>::load(dy[off]);
        a += d;
        b += d * (deft_ty<T>::load(x[off]) - mean);
    }
    __device__ void finish(const deft_bn_geom &g, int64_t c, double sa, double sb) const {
        sums[c] = deft_ty<P>::from_f64(sa);
        sums[g.C + c] = deft_ty<P>::from_f64(sb * (double)deft_ty<P>::load(stats[g.C + c]));
    }
};

/* Called by every thread after its block's partials are stored (each storing thread fenced first): whether this
 * block is the last of its column to finish. The count goes back to zero for the next launch. */
__device__ __forceinline__ bool deft_bn_last_of_column(unsigned *count, unsigned chunks) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        last = atomicAdd(count, 1u) == chunks - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    if (last) __threadfence();   /* the other blocks' partials are visible past this point */
    return last;
}

/* The partials of channel c, added in chunk order. */
__device__ __forceinline__ double2 deft_bn_gather(const double2 *part, int64_t c, unsigned chunks) {
    double2 s = make_double2(0.0, 0.0);
    for (unsigned k = 0; k < chunks; k++) {
        const double2 v = __ldcg(part + c * chunks + k);
        s.x += v.x, s.y += v.y;
    }
    return s;
}

/* NCHW with S > 1: grid (chunks, C), 1-D blocks; block (chunk, c) sums elements [chunk per, chunk per + per) of
 * channel c, in the order n S + s. */
template <class Term>
__global__ void deft_bn_plane_sums_kernel(deft_bn_geom g, Term t, int64_t per, double2 *part, unsigned *count,
                                          bool small) {
    typedef typename Term::A A;
    const int64_t c = blockIdx.y, m = g.N * g.S, j0 = (int64_t)blockIdx.x * per;
    const int64_t j1 = j0 + per < m ? j0 + per : m;
    const A k = t.context(g, c);
    A a = 0, b = 0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        int64_t n, s;
        if (small) n = (uint32_t)j / (uint32_t)g.S, s = (uint32_t)j % (uint32_t)g.S;
        else n = j / g.S, s = j % g.S;
        t.add(n * g.sN + c * g.sC + s, k, a, b);
    }
    const double sa = deft_block_reduce((double)a, deft_r_sum()), sb = deft_block_reduce((double)b, deft_r_sum());
    if (threadIdx.x == 0) {
        part[c * gridDim.x + blockIdx.x] = make_double2(sa, sb);
        __threadfence();
    }
    if (!deft_bn_last_of_column(count + c, gridDim.x) || threadIdx.x != 0) return;
    const double2 s = deft_bn_gather(part, c, gridDim.x);
    t.finish(g, c, s.x, s.y);
}

/* The channel innermost (S == 1, sN = C): grid (chunks, ceil(C / 32)), blocks 32 x DEFT_BN_ROW_WARPS; thread
 * (tx, ty) sums channel 32 blockIdx.y + tx over rows ty, ty + 8, ... of the block's chunk of `per` rows. */
template <class Term>
__global__ void deft_bn_row_sums_kernel(deft_bn_geom g, Term t, int64_t per, double2 *part, unsigned *count) {
    typedef typename Term::A A;
    __shared__ double sh[2][DEFT_BN_ROW_WARPS][33];
    const int64_t c = (int64_t)blockIdx.y * 32 + threadIdx.x, r0 = (int64_t)blockIdx.x * per;
    const int64_t r1 = r0 + per < g.N ? r0 + per : g.N;
    A a = 0, b = 0;
    if (c < g.C) {
        const A k = t.context(g, c);
        for (int64_t r = r0 + threadIdx.y; r < r1; r += DEFT_BN_ROW_WARPS) t.add(r * g.sN + c, k, a, b);
    }
    sh[0][threadIdx.y][threadIdx.x] = (double)a;
    sh[1][threadIdx.y][threadIdx.x] = (double)b;
    __syncthreads();
    if (threadIdx.y == 0 && c < g.C) {
        double sa = 0.0, sb = 0.0;
        for (int w = 0; w < DEFT_BN_ROW_WARPS; w++) sa += sh[0][w][threadIdx.x], sb += sh[1][w][threadIdx.x];
        part[c * gridDim.x + blockIdx.x] = make_double2(sa, sb);
        __threadfence();
    }
    if (!deft_bn_last_of_column(count + blockIdx.y, gridDim.x) || threadIdx.y != 0 || c >= g.C) return;
    const double2 s = deft_bn_gather(part, c, gridDim.x);
    t.finish(g, c, s.x, s.y);
}

static int64_t deft_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Runs the sums of `t` over every channel and its finish; *done = false (nothing ran) where the workspace is not
 * to be had or the shape needs more partials or counts than it holds. */
template <class Term> static deft_status deft_bn_column_sums(const deft_tensor *n, const deft_bn_geom &g, Term t,
                                                             cudaStream_t st, bool *done) {
    *done = false;
    const bool rows = g.S == 1;
    const int64_t columns = rows ? deft_ceil_div(g.C, 32) : g.C, len = rows ? g.N : g.N * g.S;
    int64_t chunks = deft_ceil_div(len, rows ? DEFT_BN_ROW_CHUNK : DEFT_BN_PLANE_CHUNK);
    if (chunks > DEFT_BN_PARTIALS / g.C) chunks = DEFT_BN_PARTIALS / g.C;
    if (chunks < 1 || columns > DEFT_BN_COUNTERS || columns > DEFT_CUDA_MAX_BLOCKS) return DEFT_OK;
    const int64_t per = deft_ceil_div(len, chunks);
    chunks = deft_ceil_div(len, per);   /* no empty chunk */
    void *ws = NULL;
    bool have = false;
    const deft_status s = deft_bn_workspace(n, st, &ws, &have);
    if (s != DEFT_OK || !have) return s;
    unsigned *count = (unsigned *)ws;
    double2 *part = (double2 *)((char *)ws + (size_t)DEFT_BN_COUNTERS * sizeof(unsigned));
    const dim3 grid((unsigned)chunks, (unsigned)columns);
    if (rows) {
        deft_bn_row_sums_kernel<Term><<<grid, dim3(32, DEFT_BN_ROW_WARPS), 0, st>>>(g, t, per, part, count);
    } else {
        deft_bn_plane_sums_kernel<Term><<<grid, deft_reduce_threads(per), 0, st>>>(g, t, per, part, count,
                                                                                   deft_bn_small(g));
    }
    *done = true;
    return deft_cuda_check_launch(n, rows ? "batch norm row sums" : "batch norm plane sums");
}

/* ---- the elementwise passes ---- */

/* y = (x - mean) invstd w + b, in the compute type; w and b may be NULL. */
template <class T, class P>
__global__ void deft_bn_fast_forward_kernel(deft_bn_geom g, const T *x, const P *stats, const P *w, const P *b,
                                            T *y, int64_t total, bool small) {
    typedef typename deft_ty<T>::C A;
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        const int64_t c = deft_bn_channel_of(g, i, small);
        A scale = (A)deft_ty<P>::load(stats[g.C + c]);
        if (w) scale *= (A)deft_ty<P>::load(w[c]);
        A v = (deft_ty<T>::load(x[i]) - (A)deft_ty<P>::load(stats[c])) * scale;
        if (b) v += (A)deft_ty<P>::load(b[c]);
        y[i] = deft_ty<T>::store(v);
    }
}

/* Training: w invstd (dy - sum(dy) / m - xhat sum(dy xhat) / m); evaluation (x and sums NULL): dy invstd w. */
template <class T, class P>
__global__ void deft_bn_fast_input_grad_kernel(deft_bn_geom g, const T *dy, const T *x, const P *stats,
                                               const P *sums, const P *w, T *dx, int64_t total, bool small) {
    typedef typename deft_ty<T>::C A;
    const A inv_m = (A)(1.0 / (double)(g.N * g.S));
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        const int64_t c = deft_bn_channel_of(g, i, small);
        const A invstd = (A)deft_ty<P>::load(stats[g.C + c]);
        const A scale = w ? invstd * (A)deft_ty<P>::load(w[c]) : invstd;
        A v = deft_ty<T>::load(dy[i]);
        if (x) {
            const A xhat = (deft_ty<T>::load(x[i]) - (A)deft_ty<P>::load(stats[c])) * invstd;
            v -= (A)deft_ty<P>::load(sums[c]) * inv_m + xhat * ((A)deft_ty<P>::load(sums[g.C + c]) * inv_m);
        }
        dx[i] = deft_ty<T>::store(v * scale);
    }
}

/* ---- per op ---- */

template <class T, class P> static deft_status deft_bn_fast_stats(const deft_tensor *n, void *out,
                                                                  const void *const *in, cudaStream_t st,
                                                                  bool *done) {
    const deft_bn_geom g = deft_bn_geometry(n->src[0], n->p.bn.layout);
    deft_bn_stats_term<T, P> t;
    t.x = (const T *)in[0], t.stats = (P *)out;
    t.rm = n->p.bn.update ? (P *)in[1] : NULL, t.rv = n->p.bn.update ? (P *)in[2] : NULL;
    t.eps = n->p.bn.eps, t.mom = n->p.bn.momentum;
    return deft_bn_column_sums(n, g, t, st, done);
}

template <class T, class P> static deft_status deft_bn_fast_grad_sums(const deft_tensor *n, void *out,
                                                                      const void *const *in, cudaStream_t st,
                                                                      bool *done) {
    const deft_bn_geom g = deft_bn_geometry(n->src[0], n->p.bn.layout);
    deft_bn_grad_term<T, P> t;
    t.dy = (const T *)in[0], t.x = (const T *)in[1], t.stats = (const P *)in[2], t.sums = (P *)out;
    return deft_bn_column_sums(n, g, t, st, done);
}

template <class T, class P> static deft_status deft_bn_fast_forward(const deft_tensor *n, void *out,
                                                                    const void *const *in, cudaStream_t st) {
    const deft_bn_geom g = deft_bn_geometry(n, n->p.bn.layout);
    const P *w = n->p.bn.has_weight ? (const P *)in[2] : NULL;
    const P *b = n->p.bn.has_bias ? (const P *)in[2 + n->p.bn.has_weight] : NULL;
    const int64_t total = g.N * g.C * g.S;
    deft_bn_fast_forward_kernel<T, P><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        g, (const T *)in[0], (const P *)in[1], w, b, (T *)out, total, deft_bn_small(g));
    return deft_cuda_check_launch(n, "batch norm (fast)");
}

/* Training: src (dy, x, stats, sums[, w]); evaluation: src (dy, stats[, w]). */
template <class T, class P> static deft_status deft_bn_fast_input_grad(const deft_tensor *n, void *out,
                                                                       const void *const *in, cudaStream_t st) {
    const deft_bn_geom g = deft_bn_geometry(n, n->p.bn.layout);
    const int batch = n->p.bn.batch;
    const T *x = batch ? (const T *)in[1] : NULL;
    const P *stats = (const P *)in[1 + batch], *sums = batch ? (const P *)in[3] : NULL;
    const P *w = n->p.bn.has_weight ? (const P *)in[batch ? 4 : 2] : NULL;
    const int64_t total = g.N * g.C * g.S;
    deft_bn_fast_input_grad_kernel<T, P><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        g, (const T *)in[0], x, stats, sums, w, (T *)out, total, deft_bn_small(g));
    return deft_cuda_check_launch(n, "batch norm grad (fast)");
}

deft_status deft_cuda_batch_norm_fast(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st,
                                      bool *done) {
    *done = false;
    if (n->op == DEFT_OP_BN_STATS && !n->p.bn.batch) return DEFT_OK;   /* a copy of C values: the plain kernel */
    return deft_bn_with_dtypes(n, [&](auto data, auto param) -> deft_status {
        typedef typename decltype(data)::type T;
        typedef typename decltype(param)::type P;
        switch (n->op) {
        case DEFT_OP_BN_STATS: return deft_bn_fast_stats<T, P>(n, out, in, st, done);
        case DEFT_OP_BATCH_NORM_WEIGHT_GRAD: return deft_bn_fast_grad_sums<T, P>(n, out, in, st, done);
        case DEFT_OP_BATCH_NORM: *done = true; return deft_bn_fast_forward<T, P>(n, out, in, st);
        default: *done = true; return deft_bn_fast_input_grad<T, P>(n, out, in, st);
        }
    });
}
