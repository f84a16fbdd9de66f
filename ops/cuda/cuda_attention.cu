/* Attention on a GPU: deft's own flash-style kernels, plain first (the CPU's blocked reference, ops/cpu/
 * cpu_attention.c, is the specification). f32, f16 and bf16 storage; every product, softmax and sum in float
 * (CUDA cores, no tensor cores yet); the row statistics are f32.
 *
 *   forward   one block per (batch * head, 16 query rows): 4 warps of 4 rows; key tiles of 32 in shared memory,
 *             lane j scoring key j, an online softmax per row through warp shuffles, each lane accumulating output
 *             columns lane, lane + 32, ... in registers. Writes out and each row's log-sum-exp past it.
 *   backward  three kernels, no atomics, so deterministic: delta = rowsum(dout * out) (one warp per row, into the
 *             gradient node's statistics); dq per 8 query rows walking the key tiles; dk and dv per 8 keys walking
 *             the query chunks of 32 (lane i taking query i). Each recomputes p = exp(s - lse) from the saved
 *             statistics; no T x T value exists anywhere.
 * Shared memory stays under the 48 KB a block has without opting in; rows read by lane are padded by one column so
 * that 32 lanes reading 32 rows hit 32 banks. Rows are found through element strides (graph_internal.h's
 * deft_attention_layout_of), so q, k, v apart and packed in one [B, T, 3C] run the same code and the same sums. */
#include "config.h"
#include "cuda_common.cuh"

#define DEFT_ATT_DMAX 128
#define DEFT_ATT_COLS (DEFT_ATT_DMAX / 32)   /* output columns per lane */
#define DEFT_ATT_WARPS 4
#define DEFT_ATT_KTILE 32                    /* keys per tile: one per lane */
#define DEFT_ATT_FULL 0xffffffffu

static_assert(DEFT_ATT_DMAX == DEFT_ATTENTION_MAX_HEAD, "the kernels' head size is the builder's limit");

__device__ __forceinline__ float deft_att_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(DEFT_ATT_FULL, v, o));
    return v;
}

__device__ __forceinline__ float deft_att_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(DEFT_ATT_FULL, v, o);
    return v;
}

/* rows [row0, row0 + rows) of one (batch, head) whose rows lie st elements apart into tile (leading dimension LD),
 * zeros past `end`; times mul */
template <class T, int LD>
__device__ __forceinline__ void deft_att_load(float (*tile)[LD], const T *m, int64_t st, int64_t row0, int rows,
                                              int64_t end, int d, float mul) {
    for (int e = threadIdx.x; e < rows * d; e += blockDim.x) {
        const int r = e / d, c = e % d;
        tile[r][c] = row0 + r < end ? deft_ty<T>::load(m[(row0 + r) * st + c]) * mul : 0.0f;
    }
}

/* The element offset of (batch * head) bh's first row in a tensor of strides s (h heads). */
__device__ __forceinline__ int64_t deft_att_base(const deft_attention_strides &s, int64_t h, int64_t bh) {
    return bh / h * s.sb + bh % h * s.sh;
}

__device__ __forceinline__ float deft_att_dot(const float *x, const float *y, int d) {
    float s = 0.0f;
    for (int c = 0; c < d; c++) s = fmaf(x[c], y[c], s);
    return s;
}

typedef struct deft_att_args {
    int64_t t;         /* sequence length */
    int d;             /* head size */
    float scale;
    int causal;
    int64_t tiles;     /* query (or key) tiles per (batch, head) */
    int64_t h;         /* heads */
    deft_attention_strides in, out;   /* q, k, v (dq, dk, dv) and the output (dout) */
} deft_att_args;

/* ---- forward ---- */

#define DEFT_ATT_FWD_ROWS 4                                  /* query rows per warp */
#define DEFT_ATT_FWD_Q (DEFT_ATT_WARPS * DEFT_ATT_FWD_ROWS)  /* query rows per block */

/* Folds the key tile into row r's running maximum m, sum l and accumulator acc (s: this lane's key's score). */
__device__ __forceinline__ void deft_att_fold(float s, float &m, float &l, float *acc, const float (*vs)[DEFT_ATT_DMAX],
                                              int d) {
    const int lane = threadIdx.x & 31;
    const float mn = fmaxf(m, deft_att_warp_max(s));
    const float p = s == -INFINITY ? 0.0f : expf(s - mn);
    const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
    l = l * corr + deft_att_warp_sum(p);
    m = mn;
#pragma unroll
    for (int cc = 0; cc < DEFT_ATT_COLS; cc++) acc[cc] *= corr;
    for (int j = 0; j < DEFT_ATT_KTILE; j++) {
        const float pj = __shfl_sync(DEFT_ATT_FULL, p, j);
#pragma unroll
        for (int cc = 0; cc < DEFT_ATT_COLS; cc++)
            if (lane + 32 * cc < d) acc[cc] = fmaf(pj, vs[j][lane + 32 * cc], acc[cc]);
    }
}

template <class T>
__global__ void __launch_bounds__(DEFT_ATT_WARPS * 32)
    deft_att_forward(const T *q, const T *k, const T *v, T *out, float *lse, deft_att_args a) {
    __shared__ float qs[DEFT_ATT_FWD_Q][DEFT_ATT_DMAX];
    __shared__ float ks[DEFT_ATT_KTILE][DEFT_ATT_DMAX + 1];
    __shared__ float vs[DEFT_ATT_KTILE][DEFT_ATT_DMAX];
    const int64_t bh = blockIdx.x / a.tiles, q0 = (blockIdx.x % a.tiles) * DEFT_ATT_FWD_Q;
    const int64_t base = deft_att_base(a.in, a.h, bh), obase = deft_att_base(a.out, a.h, bh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    deft_att_load<T, DEFT_ATT_DMAX>(qs, q + base, a.in.st, q0, DEFT_ATT_FWD_Q, a.t, a.d, a.scale);
    float m[DEFT_ATT_FWD_ROWS], l[DEFT_ATT_FWD_ROWS], acc[DEFT_ATT_FWD_ROWS][DEFT_ATT_COLS];
#pragma unroll
    for (int i = 0; i < DEFT_ATT_FWD_ROWS; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int cc = 0; cc < DEFT_ATT_COLS; cc++) acc[i][cc] = 0.0f;
    }
    const int64_t kend = a.causal && q0 + DEFT_ATT_FWD_Q < a.t ? q0 + DEFT_ATT_FWD_Q : a.t;
    for (int64_t k0 = 0; k0 < kend; k0 += DEFT_ATT_KTILE) {
        __syncthreads();   /* the last tile's readers are done */
        deft_att_load<T, DEFT_ATT_DMAX + 1>(ks, k + base, a.in.st, k0, DEFT_ATT_KTILE, kend, a.d, 1.0f);
        deft_att_load<T, DEFT_ATT_DMAX>(vs, v + base, a.in.st, k0, DEFT_ATT_KTILE, kend, a.d, 1.0f);
        __syncthreads();
        const int64_t key = k0 + lane;
#pragma unroll
        for (int i = 0; i < DEFT_ATT_FWD_ROWS; i++) {
            const int r = warp * DEFT_ATT_FWD_ROWS + i;
            const int64_t row = q0 + r;
            const bool seen = row < a.t && key < kend && !(a.causal && key > row);
            const float s = seen ? deft_att_dot(qs[r], ks[lane], a.d) : -INFINITY;
            deft_att_fold(s, m[i], l[i], acc[i], vs, a.d);
        }
    }
#pragma unroll
    for (int i = 0; i < DEFT_ATT_FWD_ROWS; i++) {
        const int64_t row = q0 + warp * DEFT_ATT_FWD_ROWS + i;
        if (row >= a.t) continue;
#pragma unroll
        for (int cc = 0; cc < DEFT_ATT_COLS; cc++)
            if (lane + 32 * cc < a.d)
                out[obase + row * a.out.st + lane + 32 * cc] = deft_ty<T>::store(acc[i][cc] / l[i]);
        if (lane == 0) lse[bh * a.t + row] = m[i] + logf(l[i]);
    }
}

/* ---- backward ---- */

/* delta[row] = dout[row] . out[row]: one warp per row (row = bh * T + i) */
template <class T>
__global__ void deft_att_delta(const T *dout, const T *out, float *delta, int64_t rows, deft_att_args a) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
        const int64_t at = deft_att_base(a.out, a.h, row / a.t) + row % a.t * a.out.st;
        float s = 0.0f;
        for (int c = lane; c < a.d; c += 32)
            s = fmaf(deft_ty<T>::load(dout[at + c]), deft_ty<T>::load(out[at + c]), s);
        s = deft_att_warp_sum(s);
        if (lane == 0) delta[row] = s;
    }
}

#define DEFT_ATT_DQ_ROWS 2                                 /* query rows per warp */
#define DEFT_ATT_DQ_Q (DEFT_ATT_WARPS * DEFT_ATT_DQ_ROWS)  /* query rows per block */

/* dq = scale * sum_j ds_ij k_j with ds = p * (dout . v - delta): per query tile, over its key tiles */
template <class T>
__global__ void __launch_bounds__(DEFT_ATT_WARPS * 32)
    deft_att_dq(const T *dout, const T *q, const T *k, const T *v, const float *lse, const float *delta, T *dq,
                deft_att_args a) {
    __shared__ float qs[DEFT_ATT_DQ_Q][DEFT_ATT_DMAX], dos[DEFT_ATT_DQ_Q][DEFT_ATT_DMAX];
    __shared__ float ks[DEFT_ATT_KTILE][DEFT_ATT_DMAX + 1], vs[DEFT_ATT_KTILE][DEFT_ATT_DMAX + 1];
    const int64_t bh = blockIdx.x / a.tiles, q0 = (blockIdx.x % a.tiles) * DEFT_ATT_DQ_Q;
    const int64_t base = deft_att_base(a.in, a.h, bh), obase = deft_att_base(a.out, a.h, bh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    deft_att_load<T, DEFT_ATT_DMAX>(qs, q + base, a.in.st, q0, DEFT_ATT_DQ_Q, a.t, a.d, a.scale);
    deft_att_load<T, DEFT_ATT_DMAX>(dos, dout + obase, a.out.st, q0, DEFT_ATT_DQ_Q, a.t, a.d, 1.0f);
    float acc[DEFT_ATT_DQ_ROWS][DEFT_ATT_COLS], rl[DEFT_ATT_DQ_ROWS], rd[DEFT_ATT_DQ_ROWS];
#pragma unroll
    for (int i = 0; i < DEFT_ATT_DQ_ROWS; i++) {
        const int64_t row = q0 + warp * DEFT_ATT_DQ_ROWS + i;
        rl[i] = row < a.t ? lse[bh * a.t + row] : 0.0f;
        rd[i] = row < a.t ? delta[bh * a.t + row] : 0.0f;
#pragma unroll
        for (int cc = 0; cc < DEFT_ATT_COLS; cc++) acc[i][cc] = 0.0f;
    }
    const int64_t kend = a.causal && q0 + DEFT_ATT_DQ_Q < a.t ? q0 + DEFT_ATT_DQ_Q : a.t;
    for (int64_t k0 = 0; k0 < kend; k0 += DEFT_ATT_KTILE) {
        __syncthreads();
        deft_att_load<T, DEFT_ATT_DMAX + 1>(ks, k + base, a.in.st, k0, DEFT_ATT_KTILE, kend, a.d, 1.0f);
        deft_att_load<T, DEFT_ATT_DMAX + 1>(vs, v + base, a.in.st, k0, DEFT_ATT_KTILE, kend, a.d, 1.0f);
        __syncthreads();
        const int64_t key = k0 + lane;
#pragma unroll
        for (int i = 0; i < DEFT_ATT_DQ_ROWS; i++) {
            const int r = warp * DEFT_ATT_DQ_ROWS + i;
            const int64_t row = q0 + r;
            const bool seen = row < a.t && key < kend && !(a.causal && key > row);
            const float p = seen ? expf(deft_att_dot(qs[r], ks[lane], a.d) - rl[i]) : 0.0f;
            const float ds = seen ? p * (deft_att_dot(dos[r], vs[lane], a.d) - rd[i]) : 0.0f;
            for (int j = 0; j < DEFT_ATT_KTILE; j++) {
                const float dsj = __shfl_sync(DEFT_ATT_FULL, ds, j);
#pragma unroll
                for (int cc = 0; cc < DEFT_ATT_COLS; cc++)
                    if (lane + 32 * cc < a.d) acc[i][cc] = fmaf(dsj, ks[j][lane + 32 * cc], acc[i][cc]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < DEFT_ATT_DQ_ROWS; i++) {
        const int64_t row = q0 + warp * DEFT_ATT_DQ_ROWS + i;
        if (row >= a.t) continue;
#pragma unroll
        for (int cc = 0; cc < DEFT_ATT_COLS; cc++)
            if (lane + 32 * cc < a.d)
                dq[base + row * a.in.st + lane + 32 * cc] = deft_ty<T>::store(acc[i][cc] * a.scale);
    }
}

#define DEFT_ATT_KV_KEYS 2                                  /* keys per warp */
#define DEFT_ATT_KV_K (DEFT_ATT_WARPS * DEFT_ATT_KV_KEYS)   /* keys per block */
#define DEFT_ATT_KV_Q 32                                    /* queries per chunk: one per lane */

/* The chunk's queries, output gradients and statistics (zeros past T). */
template <class T>
__device__ __forceinline__ void deft_att_load_chunk(float (*qs)[DEFT_ATT_DMAX + 1], float (*dos)[DEFT_ATT_DMAX + 1],
                                                    float *ls, float *ds, const T *q, const T *dout, const float *lse,
                                                    const float *delta, int64_t q0, const deft_att_args &a) {
    deft_att_load<T, DEFT_ATT_DMAX + 1>(qs, q, a.in.st, q0, DEFT_ATT_KV_Q, a.t, a.d, 1.0f);
    deft_att_load<T, DEFT_ATT_DMAX + 1>(dos, dout, a.out.st, q0, DEFT_ATT_KV_Q, a.t, a.d, 1.0f);
    for (int i = threadIdx.x; i < DEFT_ATT_KV_Q; i += blockDim.x) {
        ls[i] = q0 + i < a.t ? lse[q0 + i] : 0.0f;
        ds[i] = q0 + i < a.t ? delta[q0 + i] : 0.0f;
    }
}

/* dv = sum_i p_ij dout_i and dk = scale * sum_i ds_ij q_i: per key tile, over the query chunks that see it */
template <class T>
__global__ void __launch_bounds__(DEFT_ATT_WARPS * 32)
    deft_att_dkv(const T *dout, const T *q, const T *k, const T *v, const float *lse, const float *delta, T *dk,
                 T *dv, deft_att_args a) {
    __shared__ float ks[DEFT_ATT_KV_K][DEFT_ATT_DMAX], vs[DEFT_ATT_KV_K][DEFT_ATT_DMAX];
    __shared__ float qs[DEFT_ATT_KV_Q][DEFT_ATT_DMAX + 1], dos[DEFT_ATT_KV_Q][DEFT_ATT_DMAX + 1];
    __shared__ float ls[DEFT_ATT_KV_Q], dls[DEFT_ATT_KV_Q];
    const int64_t bh = blockIdx.x / a.tiles, k0 = (blockIdx.x % a.tiles) * DEFT_ATT_KV_K;
    const int64_t base = deft_att_base(a.in, a.h, bh), obase = deft_att_base(a.out, a.h, bh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    deft_att_load<T, DEFT_ATT_DMAX>(ks, k + base, a.in.st, k0, DEFT_ATT_KV_K, a.t, a.d, a.scale);
    deft_att_load<T, DEFT_ATT_DMAX>(vs, v + base, a.in.st, k0, DEFT_ATT_KV_K, a.t, a.d, 1.0f);
    float gk[DEFT_ATT_KV_KEYS][DEFT_ATT_COLS], gv[DEFT_ATT_KV_KEYS][DEFT_ATT_COLS];
#pragma unroll
    for (int jj = 0; jj < DEFT_ATT_KV_KEYS; jj++)
#pragma unroll
        for (int cc = 0; cc < DEFT_ATT_COLS; cc++) gk[jj][cc] = gv[jj][cc] = 0.0f;
    /* Causal: queries before k0 see none of these keys. */
    for (int64_t q0 = a.causal ? k0 / DEFT_ATT_KV_Q * DEFT_ATT_KV_Q : 0; q0 < a.t; q0 += DEFT_ATT_KV_Q) {
        __syncthreads();
        deft_att_load_chunk<T>(qs, dos, ls, dls, q + base, dout + obase, lse + bh * a.t, delta + bh * a.t, q0, a);
        __syncthreads();
        const int64_t query = q0 + lane;
#pragma unroll
        for (int jj = 0; jj < DEFT_ATT_KV_KEYS; jj++) {
            const int j = warp * DEFT_ATT_KV_KEYS + jj;
            const int64_t key = k0 + j;
            const bool seen = query < a.t && key < a.t && !(a.causal && key > query);
            /* ks holds scale * k, so the dot is the score */
            const float p = seen ? expf(deft_att_dot(qs[lane], ks[j], a.d) - ls[lane]) : 0.0f;
            const float ds = seen ? p * (deft_att_dot(dos[lane], vs[j], a.d) - dls[lane]) : 0.0f;
            for (int i = 0; i < DEFT_ATT_KV_Q; i++) {
                const float pi = __shfl_sync(DEFT_ATT_FULL, p, i), dsi = __shfl_sync(DEFT_ATT_FULL, ds, i);
#pragma unroll
                for (int cc = 0; cc < DEFT_ATT_COLS; cc++) {
                    const int c = lane + 32 * cc;
                    if (c >= a.d) continue;
                    gv[jj][cc] = fmaf(pi, dos[i][c], gv[jj][cc]);
                    gk[jj][cc] = fmaf(dsi, qs[i][c], gk[jj][cc]);
                }
            }
        }
    }
#pragma unroll
    for (int jj = 0; jj < DEFT_ATT_KV_KEYS; jj++) {
        const int64_t key = k0 + warp * DEFT_ATT_KV_KEYS + jj;
        if (key >= a.t) continue;
#pragma unroll
        for (int cc = 0; cc < DEFT_ATT_COLS; cc++) {
            const int c = lane + 32 * cc;
            if (c >= a.d) continue;
            dk[base + key * a.in.st + c] = deft_ty<T>::store(gk[jj][cc] * a.scale);
            dv[base + key * a.in.st + c] = deft_ty<T>::store(gv[jj][cc]);
        }
    }
}

/* ---- launches ---- */

static deft_att_args deft_att_args_of(const deft_tensor *n, int per_block) {
    const deft_attention_dims d = deft_attention_dims_of(n);
    const deft_attention_layout l = deft_attention_layout_of(n);
    return deft_att_args{d.t, (int)d.d, (float)n->p.attn.scale, n->p.attn.causal, (d.t + per_block - 1) / per_block,
                         d.h, l.qkv, l.out};
}

/* q, k and v (in the gradient: in + 1): three buffers, or the thirds of one (packed) */
template <class T> static void deft_att_qkv(const deft_tensor *n, const void *const *in, const T **qkv) {
    const int64_t part = deft_attention_layout_of(n).part;
    for (int i = 0; i < 3; i++) qkv[i] = n->p.attn.heads > 0 ? (const T *)in[0] + i * part : (const T *)in[i];
}

/* One block per (batch * head, tile): the count must fit the grid's x. */
static deft_status deft_att_grid(const deft_tensor *n, const deft_att_args &a, unsigned *blocks) {
    const int64_t bh = deft_attention_rows(n) / a.t, want = bh * a.tiles;
    if (want <= 0x7fffffff) {
        *blocks = (unsigned)want;
        return DEFT_OK;
    }
    return deft_set_error(DEFT_ERR_SHAPE, "cuda %s: %lld blocks (batch * heads * tiles) are past the grid's %d",
                          deft_op_name(n->op), (long long)want, 0x7fffffff);
}

template <class T> static deft_status deft_att_forward_run(const deft_tensor *n, void *out, const void *const *in,
                                                           cudaStream_t st) {
    const deft_att_args a = deft_att_args_of(n, DEFT_ATT_FWD_Q);
    unsigned blocks = 0;
    deft_status s = deft_att_grid(n, a, &blocks);
    if (s != DEFT_OK) return s;
    float *lse = (float *)((char *)out + deft_node_extra_offset(n));
    const T *qkv[3];
    deft_att_qkv<T>(n, in, qkv);
    deft_att_forward<T><<<blocks, DEFT_ATT_WARPS * 32, 0, st>>>(qkv[0], qkv[1], qkv[2], (T *)out, lse, a);
    return deft_cuda_check_launch(n, "attention forward");
}

template <class T> static deft_status deft_att_backward_run(const deft_tensor *n, void *out, const void *const *in,
                                                            cudaStream_t st) {
    const int64_t rows = deft_attention_rows(n), part = deft_attention_layout_of(n).part;
    const int last = n->nsrc - 1;   /* the forward node: its value, then its statistics */
    const T *qkv[3];
    deft_att_qkv<T>(n, in + 1, qkv);
    const T *dout = (const T *)in[0], *q = qkv[0], *k = qkv[1], *v = qkv[2], *o = (const T *)in[last];
    const float *lse = (const float *)((const char *)in[last] + deft_node_extra_offset(n->src[last]));
    float *delta = (float *)((char *)out + deft_node_extra_offset(n));
    T *dq = (T *)out, *dk = dq + part, *dv = dk + part;
    const deft_att_args aq = deft_att_args_of(n, DEFT_ATT_DQ_Q), akv = deft_att_args_of(n, DEFT_ATT_KV_K);
    unsigned bq = 0, bkv = 0;
    deft_status s = deft_att_grid(n, aq, &bq);
    if (s == DEFT_OK) s = deft_att_grid(n, akv, &bkv);
    if (s != DEFT_OK) return s;
    deft_att_delta<T><<<deft_cuda_blocks(rows * 32, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        dout, o, delta, rows, aq);
    s = deft_cuda_check_launch(n, "attention delta");
    if (s != DEFT_OK) return s;
    deft_att_dq<T><<<bq, DEFT_ATT_WARPS * 32, 0, st>>>(dout, q, k, v, lse, delta, dq, aq);
    s = deft_cuda_check_launch(n, "attention dq");
    if (s != DEFT_OK) return s;
    deft_att_dkv<T><<<bkv, DEFT_ATT_WARPS * 32, 0, st>>>(dout, q, k, v, lse, delta, dk, dv, akv);
    return deft_cuda_check_launch(n, "attention dk, dv");
}

extern "C" bool deft_cuda_attention_supported(const deft_tensor *n, char *why, size_t cap) {
    const int64_t d = deft_attention_dims_of(n).d;
    if (n->dtype != DEFT_F64 && d <= DEFT_ATT_DMAX) return true;
    if (why)
        snprintf(why, cap, "the attention kernels run f32, f16 and bf16 with a head size up to %d (got %s, %lld)",
                 DEFT_ATT_DMAX, deft_dtype_name(n->dtype), (long long)d);
    return false;
}

/* deft's own kernels: the tensor-core ones where they take the node (unless the knob asks for the plain ones), else
 * the plain ones. */
extern "C" deft_status deft_cuda_attention_own(const deft_tensor *n, void *out, const void *const *in,
                                               cudaStream_t st) {
    char why[160];
    if (!deft_cuda_attention_supported(n, why, sizeof why))
        return deft_set_error(DEFT_ERR_DTYPE, "cuda %s: %s", deft_op_name(n->op), why);
    if (deft_debug(DEFT_DEBUG_ATTENTION_KERNEL) != 1 && deft_cuda_attention_mma_usable(n, out, in))
        return deft_cuda_attention_mma(n, out, in, st);
    const bool fwd = n->op == DEFT_OP_ATTENTION;
    switch (n->dtype) {
    case DEFT_F32:
        return fwd ? deft_att_forward_run<float>(n, out, in, st) : deft_att_backward_run<float>(n, out, in, st);
    case DEFT_F16:
        return fwd ? deft_att_forward_run<__half>(n, out, in, st) : deft_att_backward_run<__half>(n, out, in, st);
    default:
        return fwd ? deft_att_forward_run<__nv_bfloat16>(n, out, in, st)
                   : deft_att_backward_run<__nv_bfloat16>(n, out, in, st);
    }
}

/* cuDNN's fused attention first where it takes the node (the fastest measured: bench/RESULTS.md, eighteenth round),
 * else deft's own kernels. Its backward is deterministic only under the compile option `deterministic` (flags); a
 * problem cuDNN refuses (its graph, or more workspace than the stream's cuDNN scratch) runs on deft's kernels. */
/* The cuDNN plan deft_cuda_attention would first build in a run, built now (deft_cuda_prepare_node). */
deft_status deft_cuda_attention_prepare(const deft_tensor *n, cudaStream_t st, unsigned flags) {
    const int64_t pick = deft_debug(DEFT_DEBUG_ATTENTION_KERNEL);
    if ((pick == 0 || pick == 3) && deft_cudnn_attention_usable(n)) return deft_cudnn_attention_prepare(n, st, flags);
    return DEFT_OK;
}

deft_status deft_cuda_attention(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st,
                                unsigned flags) {
    const int64_t pick = deft_debug(DEFT_DEBUG_ATTENTION_KERNEL);
    if ((pick == 0 || pick == 3) && deft_cudnn_attention_usable(n)) {
        const deft_status s = deft_cudnn_attention_flags(n, out, in, st, flags);
        if (s != DEFT_CUDNN_ATTENTION_REFUSED) return s;
    }
    return deft_cuda_attention_own(n, out, in, st);
}
