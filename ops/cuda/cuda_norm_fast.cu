/* Batch norm's fast kernels on CUDA. The plain ones (cuda_norm.cu) give each channel one block, which leaves most of
 * a GPU idle when there are few channels with many elements each (64 channels of 128 x 32 x 32 on a GPU of a hundred
 * or more SMs).
 *
 * The two per-channel reductions (the statistics: sums of x - K and (x - K)^2, shifted by the channel's first
 * element K so that the variance does not cancel; the gradient sums: of dy and dy (x - mean)) run over a grid of
 * column x chunk: each block sums its chunk (threads accumulate in the compute type, the block in double), writes a
 * partial per channel, and the last block of a column to finish (an atomic count) adds the partials in a fixed
 * order, in double, and writes the channels' results, so the result does not depend on which block ran last. NCHW
 * walks each channel's planes (a column is a channel; one thread adds the partials in chunk order). NHWC (and any
 * input whose channel is its innermost axis) walks rows: a column is 64 bytes of neighbouring channels, read 16
 * bytes per thread where the channels allow, the grid sized to fill the GPU, and every thread of the last block
 * takes part in the finish (a tree in shared memory), as ResNet's small NHWC tensors (128 to 8192 rows of 64 to 512
 * channels) need many blocks and so many partials. The elementwise passes (y, dx) read per-channel values and
 * compute in float (double for f64).
 *
 * The partials and counts live in the stream's workspace (cuda_workspace.cu), taken outside a capture; the last
 * block sets its count back to zero, so every launch is capturable and a replay starts clean. */
#include <initializer_list>

#include "cuda_block_reduce.cuh"
#include "cuda_norm.cuh"
#include "cuda_tuning.h"
#include "device_internal.h"

#define DEFT_BN_COUNTERS DEFT_NORM_COUNTERS        /* columns (channels, or 64 bytes of channels in the row walk) */
#define DEFT_BN_PARTIALS DEFT_NORM_PARTIALS        /* double2 partials: channels x chunks */
static_assert(sizeof(unsigned) == 4 && sizeof(double2) == 16, "DEFT_NORM_WORKSPACE_BYTES counts 4- and 16-byte items");
/* The launch shapes are cuda_tuning.h's: DEFT_BN_PLANE_CHUNK elements of a channel per block in the plane walk; the
 * row walk's block (channel groups x rows) of DEFT_BN_ROW_THREADS threads, or DEFT_BN_WIDE_THREADS from
 * DEFT_BN_WIDE_ROWS rows on (twice the loads in flight for the same number of partials), each taking
 * DEFT_BN_ROW_BYTES of a row (two 32-byte sectors); and the row walk's grid, DEFT_BN_ROW_BLOCKS_PER_SM blocks per SM:
 * more blocks read no faster, and leave more partials for the last block to add. */

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

template <class T, int V>
__device__ __forceinline__ void deft_bn_load(const T *p, typename deft_ty<T>::C (&out)[V]) {
    const deft_vec<T, V> v = *reinterpret_cast<const deft_vec<T, V> *>(p);
#pragma unroll
    for (int i = 0; i < V; i++) out[i] = deft_ty<T>::load(v.e[i]);
}

/* V elements of dy from i on, masked as deft_bn_dy masks each. */
template <class T, bool MASK, int V>
__device__ __forceinline__ void deft_bn_load_dy(const deft_bn_dy<T, MASK> &dy, int64_t i,
                                                typename deft_ty<T>::C (&out)[V]) {
    if (!MASK) return deft_bn_load<T, V>(dy.g + i, out);
    typename deft_ty<T>::C y[V];
    deft_bn_load<T, V>(dy.g + i, out);
    deft_bn_load<T, V>(dy.y + i, y);
#pragma unroll
    for (int k = 0; k < V; k++) out[k] = deft_ty<T>::load(deft_ty<T>::store(deft_ag_relu()(out[k], y[k])));
}

/* The statistics: sums of d = x - K and d^2, K the channel's first element. rm, rv NULL: no running update. */
template <class T, class P> struct deft_bn_stats_term {
    typedef T E;
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
    /* Row walk: V channels of one row at off. */
    template <int V> __device__ void add_vec(int64_t off, const A (&k)[V], A (&a)[V], A (&b)[V]) const {
        A v[V];
        deft_bn_load<T, V>(x + off, v);
#pragma unroll
        for (int i = 0; i < V; i++) {
            const A d = v[i] - k[i];
            a[i] += d;
            b[i] += d * d;
        }
    }
    bool aligned(size_t bytes) const { return deft_is_aligned(x, bytes); }
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
template <class T, class P, bool MASK> struct deft_bn_grad_term {
    typedef T E;
    typedef typename deft_ty<T>::C A;
    deft_bn_dy<T, MASK> dy;
    const T *x;
    const P *stats;
    P *sums;
    __device__ A context(const deft_bn_geom &, int64_t c) const { return (A)deft_ty<P>::load(stats[c]); }
    __device__ void add(int64_t off, A mean, A &a, A &b) const {
        const A d = deft_ty<T>::load(dy[off]);
        a += d;
        b += d * (deft_ty<T>::load(x[off]) - mean);
    }
    template <int V> __device__ void add_vec(int64_t off, const A (&mean)[V], A (&a)[V], A (&b)[V]) const {
        A d[V], v[V];
        deft_bn_load_dy<T, MASK, V>(dy, off, d);
        deft_bn_load<T, V>(x + off, v);
#pragma unroll
        for (int i = 0; i < V; i++) {
            a[i] += d[i];
            b[i] += d[i] * (v[i] - mean[i]);
        }
    }
    bool aligned(size_t bytes) const {
        return deft_is_aligned(dy.g, bytes) && (!MASK || deft_is_aligned(dy.y, bytes)) && deft_is_aligned(x, bytes);
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

/* The channel innermost (S == 1, sN = C): the row walk. Each block covers W = DEFT_BN_ROW_BYTES / sizeof(T)
 * neighbouring channels (a column; grid.y) over a chunk of `per` rows (grid.x). Its threads are BX = W / V groups of
 * V channels (one vector load each) by BY = THREADS / BX rows, so a warp reads 32 / BX rows of 64 bytes. The block
 * adds its threads' sums in double: shuffles over the rows a warp holds, then the warps in order. */
template <class Term, int V, int NT> struct deft_bn_row_shape {
    static constexpr int W = DEFT_BN_ROW_BYTES / (int)sizeof(typename Term::E);
    static constexpr int BX = W / V, BY = NT / BX, WARPS = NT / 32;
    static_assert(W % V == 0 && 32 % BX == 0 && WARPS * W <= NT, "the row walk's block shape");
};

/* The last block of a column adds the chunk partials of its W channels with all its threads: thread (s, j) adds
 * chunks s, s + S, ... of channel c0 + j in order, then a tree over s in shared memory, so the order is fixed. */
template <class Term, int W, int NT>
__device__ void deft_bn_row_finish(const deft_bn_geom &g, const Term &t, const double2 *part, unsigned chunks,
                                   int64_t c0, double (&sh)[2][NT]) {
    constexpr int S = NT / W;
    static_assert((S & (S - 1)) == 0, "the finish's tree halves S");
    const int tid = threadIdx.x, j = tid % W, s = tid / W;
    const int64_t c = c0 + j;
    double sa = 0.0, sb = 0.0;
    if (c < g.C) {
#pragma unroll 4
        for (unsigned k = s; k < chunks; k += S) {
            const double2 v = __ldcg(part + (int64_t)k * g.C + c);
            sa += v.x, sb += v.y;
        }
    }
    sh[0][tid] = sa, sh[1][tid] = sb;
    __syncthreads();
    for (int half = S / 2; half > 0; half >>= 1) {
        if (s < half) sh[0][tid] += sh[0][tid + half * W], sh[1][tid] += sh[1][tid + half * W];
        __syncthreads();
    }
    if (s == 0 && c < g.C) t.finish(g, c, sh[0][j], sh[1][j]);
}

/* part[chunk C + c]: the chunk's partial of channel c (the finish reads a chunk's channels side by side). */
template <class Term, int V, int NT>
__global__ void __launch_bounds__(NT)
    deft_bn_row_sums_kernel(deft_bn_geom g, Term t, int64_t per, double2 *part, unsigned *count) {
    typedef typename Term::A A;
    typedef deft_bn_row_shape<Term, V, NT> B;
    __shared__ double sh[2][NT];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, tx = tid % B::BX, ty = tid / B::BX;
    const int64_t c0 = (int64_t)blockIdx.y * B::W, c = c0 + (int64_t)tx * V, r0 = (int64_t)blockIdx.x * per;
    const int64_t r1 = r0 + per < g.N ? r0 + per : g.N;
    A a[V], b[V];
#pragma unroll
    for (int i = 0; i < V; i++) a[i] = 0, b[i] = 0;
    if (c < g.C) {   /* V > 1 only where V divides C: the whole group is in range */
        A k[V];
#pragma unroll
        for (int i = 0; i < V; i++) k[i] = t.context(g, c + i);
#pragma unroll 4
        for (int64_t r = r0 + ty; r < r1; r += B::BY) t.template add_vec<V>(r * g.sN + c, k, a, b);
    }
    double da[V], db[V];
#pragma unroll
    for (int i = 0; i < V; i++) {
        da[i] = (double)a[i], db[i] = (double)b[i];
        for (int off = 16; off >= B::BX; off >>= 1) {   /* lane and lane + off hold the same channels */
            da[i] += __shfl_down_sync(0xffffffffu, da[i], off);
            db[i] += __shfl_down_sync(0xffffffffu, db[i], off);
        }
        if (lane < B::BX) sh[0][warp * B::W + lane * V + i] = da[i], sh[1][warp * B::W + lane * V + i] = db[i];
    }
    __syncthreads();
    if (tid < B::W && c0 + tid < g.C) {
        double sa = 0.0, sb = 0.0;
        for (int w = 0; w < B::WARPS; w++) sa += sh[0][w * B::W + tid], sb += sh[1][w * B::W + tid];
        part[(int64_t)blockIdx.x * g.C + c0 + tid] = make_double2(sa, sb);
        __threadfence();
    }
    if (!deft_bn_last_of_column(count + blockIdx.y, gridDim.x)) return;
    deft_bn_row_finish<Term, B::W, NT>(g, t, part, gridDim.x, c0, sh);
}

static int64_t deft_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The workspace's arrival counts and partials; *have = false where there is none to be had (nothing may run). */
static deft_status deft_bn_scratch(const deft_tensor *n, cudaStream_t st, unsigned **count, double2 **part,
                                   bool *have) {
    void *ws = NULL;
    const deft_status s = deft_bn_workspace(n, st, &ws, have);
    if (s != DEFT_OK || !*have) return s;
    *count = (unsigned *)ws;
    *part = (double2 *)((char *)ws + (size_t)DEFT_BN_COUNTERS * sizeof(unsigned));
    return DEFT_OK;
}

/* NCHW with S > 1: one column per channel, chunks of DEFT_BN_PLANE_CHUNK elements. */
template <class Term> static deft_status deft_bn_plane_sums(const deft_tensor *n, const deft_bn_geom &g, Term t,
                                                            cudaStream_t st, bool *done) {
    const int64_t len = g.N * g.S;
    int64_t chunks = deft_ceil_div(len, DEFT_BN_PLANE_CHUNK);
    if (chunks > DEFT_BN_PARTIALS / g.C) chunks = DEFT_BN_PARTIALS / g.C;
    if (chunks < 1 || g.C > DEFT_BN_COUNTERS || g.C > DEFT_CUDA_MAX_BLOCKS) return DEFT_OK;
    const int64_t per = deft_ceil_div(len, chunks);
    chunks = deft_ceil_div(len, per);   /* no empty chunk */
    unsigned *count = NULL;
    double2 *part = NULL;
    bool have = false;
    const deft_status s = deft_bn_scratch(n, st, &count, &part, &have);
    if (s != DEFT_OK || !have) return s;
    deft_bn_plane_sums_kernel<Term><<<dim3((unsigned)chunks, (unsigned)g.C), deft_reduce_threads(per), 0, st>>>(
        g, t, per, part, count, deft_bn_small(g));
    *done = true;
    return deft_cuda_check_launch(n, "batch norm plane sums");
}

/* The current device's SMs (deft_cuda_sm_count): the row walk sizes its grid to fill them. */
static deft_status deft_bn_sm_count(const deft_tensor *n, int *sms) {
    int dev = 0;
    const cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) {
        *sms = deft_cuda_sm_count(dev);
        return DEFT_OK;
    }
    (void)cudaGetLastError();
    return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: batch norm: current device: %s", deft_op_name(n->op),
                          cudaGetErrorString(e));
}

/* The row walk with V channels per load. Chunks: as many as fill DEFT_BN_ROW_BLOCKS_PER_SM blocks per SM, but at
 * least one row per thread, and no more partials than the workspace holds. The same device and shape always get
 * the same chunks, so the sums are added in the same order on every run. */
template <class Term, int V, int NT> static deft_status deft_bn_row_launch(const deft_tensor *n, const deft_bn_geom &g,
                                                                   Term t, cudaStream_t st, bool *done) {
    typedef deft_bn_row_shape<Term, V, NT> B;
    const int64_t columns = deft_ceil_div(g.C, B::W);
    int sms = 0;
    deft_status s = deft_bn_sm_count(n, &sms);
    if (s != DEFT_OK) return s;
    int64_t chunks = deft_ceil_div((int64_t)sms * DEFT_BN_ROW_BLOCKS_PER_SM, columns);
    if (chunks > deft_ceil_div(g.N, B::BY)) chunks = deft_ceil_div(g.N, B::BY);
    if (chunks > DEFT_BN_PARTIALS / g.C) chunks = DEFT_BN_PARTIALS / g.C;
    if (chunks < 1 || columns > DEFT_BN_COUNTERS || columns > DEFT_CUDA_MAX_BLOCKS) return DEFT_OK;
    const int64_t per = deft_ceil_div(g.N, chunks);
    chunks = deft_ceil_div(g.N, per);   /* no empty chunk */
    unsigned *count = NULL;
    double2 *part = NULL;
    bool have = false;
    s = deft_bn_scratch(n, st, &count, &part, &have);
    if (s != DEFT_OK || !have) return s;
    deft_bn_row_sums_kernel<Term, V, NT><<<dim3((unsigned)chunks, (unsigned)columns), NT, 0, st>>>(
        g, t, per, part, count);
    *done = true;
    return deft_cuda_check_launch(n, "batch norm row sums");
}

/* Runs the sums of `t` over every channel and its finish; *done = false (nothing ran) where the workspace is not
 * to be had or the shape needs more partials or counts than it holds. The row walk loads 16 bytes of channels at a
 * time where the channels divide into them and the data is aligned, one element otherwise. */
template <class Term> static deft_status deft_bn_column_sums(const deft_tensor *n, const deft_bn_geom &g, Term t,
                                                             cudaStream_t st, bool *done) {
    constexpr int V = 16 / (int)sizeof(typename Term::E);
    *done = false;
    if (g.S != 1) return deft_bn_plane_sums(n, g, t, st, done);
    if (g.C % V == 0 && t.aligned(16)) {
        if (g.N >= DEFT_BN_WIDE_ROWS) return deft_bn_row_launch<Term, V, DEFT_BN_WIDE_THREADS>(n, g, t, st, done);
        return deft_bn_row_launch<Term, V, DEFT_BN_ROW_THREADS>(n, g, t, st, done);
    }
    return deft_bn_row_launch<Term, 1, DEFT_BN_ROW_THREADS>(n, g, t, st, done);
}

/* ---- the elementwise passes ---- */

/* y = (x - mean) invstd w + b, in the compute type; w and b may be NULL; then the epilogue (r NULL: no add). */
template <class T, class P>
__global__ void deft_bn_fast_forward_kernel(deft_bn_geom g, const T *x, const P *stats, const P *w, const P *b,
                                            const T *r, bool relu, T *y, int64_t total, bool small) {
    typedef typename deft_ty<T>::C A;
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        const int64_t c = deft_bn_channel_of(g, i, small);
        A scale = (A)deft_ty<P>::load(stats[g.C + c]);
        if (w) scale *= (A)deft_ty<P>::load(w[c]);
        A v = (deft_ty<T>::load(x[i]) - (A)deft_ty<P>::load(stats[c])) * scale;
        if (b) v += (A)deft_ty<P>::load(b[c]);
        y[i] = deft_bn_epilogue(deft_ty<T>::store(v), r, i, relu);
    }
}

/* Training: w invstd (dy - sum(dy) / m - xhat sum(dy xhat) / m); evaluation (x and sums NULL): dy invstd w. */
template <class T, class P, bool MASK>
__global__ void deft_bn_fast_input_grad_kernel(deft_bn_geom g, deft_bn_dy<T, MASK> dy, const T *x, const P *stats,
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

/* The same two passes over NHWC rows whose channels come in whole 16-byte vectors (V of them): one load moves V
 * channels of a row, and the per-channel values, computed once per block into shared memory (`per` arrays of C),
 * are read from there instead of from four or five arrays per element. The arithmetic is the scalar kernels', in the
 * same order, so both give the same values. */
#define DEFT_BN_VEC_SHARED_BYTES (40 * 1024)

template <class T, int V>
__device__ __forceinline__ void deft_bn_load_vec(const T *p, int64_t i, typename deft_ty<T>::C (&out)[V]) {
    deft_bn_load<T, V>(p + i * V, out);
}

template <class T, int V>
__device__ __forceinline__ void deft_bn_store_vec(T *p, int64_t i, const T (&v)[V]) {
    deft_vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; k++) o.e[k] = v[k];
    *reinterpret_cast<deft_vec<T, V> *>(p + i * V) = o;
}

/* The channel of vector i's first element: vectors never straddle rows, as V divides C. */
__device__ __forceinline__ int deft_bn_vec_channel(int64_t i, int64_t vecs_per_row, int V, bool small) {
    if (small) return (int)((uint32_t)i % (uint32_t)vecs_per_row) * V;
    return (int)(i % vecs_per_row) * V;
}

template <class T, class P, int V>
__global__ void deft_bn_vec_forward_kernel(deft_bn_geom g, const T *x, const P *stats, const P *w, const P *b,
                                           const T *r, bool relu, T *y, int64_t n_vec, bool small) {
    typedef typename deft_ty<T>::C A;
    extern __shared__ __align__(16) unsigned char deft_bn_shared[];
    A *mean = reinterpret_cast<A *>(deft_bn_shared), *scale = mean + g.C, *bias = scale + g.C;
    for (int64_t c = threadIdx.x; c < g.C; c += blockDim.x) {
        A s = (A)deft_ty<P>::load(stats[g.C + c]);
        if (w) s *= (A)deft_ty<P>::load(w[c]);
        mean[c] = (A)deft_ty<P>::load(stats[c]), scale[c] = s, bias[c] = b ? (A)deft_ty<P>::load(b[c]) : A(0);
    }
    __syncthreads();
    const int64_t per_row = g.C / V;
    for (int64_t i = deft_tid(); i < n_vec; i += deft_nthreads()) {
        const int c0 = deft_bn_vec_channel(i, per_row, V, small);
        A xv[V], rv[V];
        deft_bn_load_vec<T, V>(x, i, xv);
        if (r) deft_bn_load_vec<T, V>(r, i, rv);
        T out[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            A v = (xv[k] - mean[c0 + k]) * scale[c0 + k];
            if (b) v += bias[c0 + k];
            T o = deft_ty<T>::store(v);
            if (r) o = deft_ty<T>::store(deft_f_add()(deft_ty<T>::load(o), rv[k]));
            if (relu) o = deft_ty<T>::store(deft_m_relu<A>()(deft_ty<T>::load(o)));
            out[k] = o;
        }
        deft_bn_store_vec<T, V>(y, i, out);
    }
}

template <class T, class P, bool MASK, int V>
__global__ void deft_bn_vec_input_grad_kernel(deft_bn_geom g, deft_bn_dy<T, MASK> dy, const T *x, const P *stats,
                                              const P *sums, const P *w, T *dx, int64_t n_vec, bool small) {
    typedef typename deft_ty<T>::C A;
    extern __shared__ __align__(16) unsigned char deft_bn_shared[];
    A *mean = reinterpret_cast<A *>(deft_bn_shared), *invstd = mean + g.C, *scale = invstd + g.C;
    A *sum_dy = scale + g.C, *sum_dy_xhat = sum_dy + g.C;
    const A inv_m = (A)(1.0 / (double)(g.N * g.S));
    for (int64_t c = threadIdx.x; c < g.C; c += blockDim.x) {
        const A is = (A)deft_ty<P>::load(stats[g.C + c]);
        mean[c] = (A)deft_ty<P>::load(stats[c]), invstd[c] = is;
        scale[c] = w ? is * (A)deft_ty<P>::load(w[c]) : is;
        sum_dy[c] = x ? (A)deft_ty<P>::load(sums[c]) * inv_m : A(0);
        sum_dy_xhat[c] = x ? (A)deft_ty<P>::load(sums[g.C + c]) * inv_m : A(0);
    }
    __syncthreads();
    const int64_t per_row = g.C / V;
    for (int64_t i = deft_tid(); i < n_vec; i += deft_nthreads()) {
        const int c0 = deft_bn_vec_channel(i, per_row, V, small);
        A dv[V], xv[V];
        deft_bn_load_dy<T, MASK, V>(dy, i * V, dv);
        if (x) deft_bn_load_vec<T, V>(x, i, xv);
        T out[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int c = c0 + k;
            A v = dv[k];
            if (x) {
                const A xhat = (xv[k] - mean[c]) * invstd[c];
                v -= sum_dy[c] + xhat * sum_dy_xhat[c];
            }
            out[k] = deft_ty<T>::store(v * scale[c]);
        }
        deft_bn_store_vec<T, V>(dx, i, out);
    }
}

/* Whether the vector kernels take an elementwise pass over g with these tensors: NHWC, V dividing C, 16-byte
 * aligned data, and `arrays` per-channel arrays of the compute type fitting the shared memory set aside. */
template <class T>
static bool deft_bn_vec_fits(const deft_bn_geom &g, int arrays, std::initializer_list<const void *> data) {
    constexpr int V = 16 / (int)sizeof(T);
    if (g.S != 1 || g.C % V != 0 || (size_t)arrays * (size_t)g.C * sizeof(typename deft_ty<T>::C) >
                                        DEFT_BN_VEC_SHARED_BYTES)
        return false;
    for (const void *p : data)
        if (p && !deft_is_aligned(p, 16)) return false;
    return true;
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

/* src (dy, x, stats); dy masked by `mask` with MASK. */
template <class T, class P, bool MASK>
static deft_status deft_bn_fast_grad_sums(const deft_tensor *n, void *out, const void *const *in, const void *mask,
                                          cudaStream_t st, bool *done) {
    const deft_bn_geom g = deft_bn_geometry(n->src[0], n->p.bn.layout);
    deft_bn_grad_term<T, P, MASK> t;
    t.dy = deft_bn_dy<T, MASK>{(const T *)in[0], (const T *)mask};
    t.x = (const T *)in[1], t.stats = (const P *)in[2], t.sums = (P *)out;
    return deft_bn_column_sums(n, g, t, st, done);
}

template <class T, class P> static deft_status deft_bn_fast_forward(const deft_tensor *n, void *out,
                                                                    const void *const *in, const void *residual,
                                                                    bool relu, cudaStream_t st) {
    const deft_bn_geom g = deft_bn_geometry(n, n->p.bn.layout);
    const deft_bn_pass_inputs<T, P> a = deft_bn_forward_inputs<T, P>(n, in);
    const T *r = (const T *)residual;
    const int64_t total = g.N * g.C * g.S;
    constexpr int V = 16 / (int)sizeof(T);
    if (deft_bn_vec_fits<T>(g, 3, {a.x, r, out})) {
        const int64_t n_vec = total / V;
        deft_bn_vec_forward_kernel<T, P, V>
            <<<deft_cuda_blocks(n_vec, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 3 * g.C * sizeof(typename deft_ty<T>::C),
               st>>>(g, a.x, a.stats, a.w, a.b, r, relu, (T *)out, n_vec, n_vec < ((int64_t)1 << 32));
        return deft_cuda_check_launch(n, "batch norm (vector)");
    }
    deft_bn_fast_forward_kernel<T, P><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        g, a.x, a.stats, a.w, a.b, r, relu, (T *)out, total, deft_bn_small(g));
    return deft_cuda_check_launch(n, "batch norm (fast)");
}

/* Training: src (dy, x, stats, sums[, w]); evaluation: src (dy, stats[, w]). dy masked by `mask` with MASK. */
template <class T, class P, bool MASK>
static deft_status deft_bn_fast_input_grad(const deft_tensor *n, void *out, const void *const *in, const void *mask,
                                           cudaStream_t st) {
    const deft_bn_geom g = deft_bn_geometry(n, n->p.bn.layout);
    const deft_bn_pass_inputs<T, P> a = deft_bn_input_grad_inputs<T, P>(n, in);
    const deft_bn_dy<T, MASK> dy{a.dy, (const T *)mask};
    const int64_t total = g.N * g.C * g.S;
    constexpr int V = 16 / (int)sizeof(T);
    if (deft_bn_vec_fits<T>(g, 5, {a.dy, mask, a.x, out})) {
        const int64_t n_vec = total / V;
        deft_bn_vec_input_grad_kernel<T, P, MASK, V>
            <<<deft_cuda_blocks(n_vec, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 5 * g.C * sizeof(typename deft_ty<T>::C),
               st>>>(g, dy, a.x, a.stats, a.sums, a.w, (T *)out, n_vec, n_vec < ((int64_t)1 << 32));
        return deft_cuda_check_launch(n, "batch norm grad (vector)");
    }
    deft_bn_fast_input_grad_kernel<T, P, MASK>
        <<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            g, dy, a.x, a.stats, a.sums, a.w, (T *)out, total, deft_bn_small(g));
    return deft_cuda_check_launch(n, "batch norm grad (fast)");
}

deft_status deft_cuda_batch_norm_fast(const deft_tensor *n, void *out, const void *const *in, const void *mask,
                                      cudaStream_t st, bool *done) {
    *done = false;
    if (n->op == DEFT_OP_BN_STATS && !n->p.bn.batch) return DEFT_OK;   /* a copy of C values: the plain kernel */
    return deft_bn_with_dtypes(n, [&](auto data, auto param) -> deft_status {
        typedef typename decltype(data)::type T;
        typedef typename decltype(param)::type P;
        switch (n->op) {
        case DEFT_OP_BN_STATS: return deft_bn_fast_stats<T, P>(n, out, in, st, done);
        case DEFT_OP_BATCH_NORM: *done = true; return deft_bn_fast_forward<T, P>(n, out, in, NULL, false, st);
        default: break;
        }
        return deft_bn_with_mask(mask, [&](auto masked) -> deft_status {
            constexpr bool MASK = decltype(masked)::value;
            if (n->op == DEFT_OP_BATCH_NORM_WEIGHT_GRAD)
                return deft_bn_fast_grad_sums<T, P, MASK>(n, out, in, mask, st, done);
            *done = true;
            return deft_bn_fast_input_grad<T, P, MASK>(n, out, in, mask, st);
        });
    });
}

deft_status deft_cuda_batch_norm_fast_epilogue(const deft_tensor *n, void *out, const void *const *in,
                                               const void *residual, bool relu, cudaStream_t st) {
    return deft_bn_with_dtypes(n, [&](auto data, auto param) -> deft_status {
        typedef typename decltype(data)::type T;
        typedef typename decltype(param)::type P;
        return deft_bn_fast_forward<T, P>(n, out, in, residual, relu, st);
    });
}
