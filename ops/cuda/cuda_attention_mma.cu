/* Attention on tensor cores: deft's own flash-style kernels (FlashAttention-2's schedule) for f16 and bf16 storage
 * with head sizes 32, 64, 96 and 128. The plain kernels of cuda_attention.cu are their reference (debug knob
 * ATTENTION_KERNEL picks either), and compute the same thing: products on mma.sync m16n8k16 with f32 accumulation,
 * the softmax and its statistics in f32, the probabilities (and their gradients) rounded to the storage type before
 * they enter the second product, as FlashAttention does.
 *
 *   forward   one block of 4 warps per (64 query rows, batch * head); each warp owns 16 rows, keeps its q fragments
 *             in registers and walks the key tiles of 64 in shared memory: s = q k^T, an online softmax in registers
 *             (base-2 exponents), and p v accumulated without p leaving registers (an accumulator fragment of s is
 *             laid out as the A operand of the next product). Writes out and each row's natural log-sum-exp.
 *   backward  delta = rowsum(dout * out), then two kernels without atomics (the same bits every run): dk and dv per
 *             64 keys (each warp 16 keys, k and v fragments in registers) over the query tiles that see them, and dq
 *             per 64 queries over their key tiles. Each recomputes p = exp(s - lse) from the saved statistics.
 * Blocks run the tiles with the most work first (the last query tiles under a causal mask, the first key tiles), all
 * heads of a tile together, so that the short ones fill the last wave. Operands a product reads transposed come
 * through ldmatrix.trans; shared rows are padded by 16 bytes so that the 8 rows of one ldmatrix or the 8 groups of a
 * fragment load fall in different banks. Tiles are copied with cp.async; up to a head size of 64 the next tiles' copies
 * run during this tile's products (two buffers each), larger heads keep one buffer within 48 KB of static shared
 * memory. Rows are found through element strides (graph_internal.h's deft_attention_layout_of): q, k, v apart or
 * packed in one [B, T, 3C] run the same code, each row 16-byte aligned (checked before it runs). */
#include <string.h>

#include <type_traits>

#include "cuda_common.cuh"

#define DEFT_MMA_TILE 64     /* query rows or keys a block owns, and the rows of each tile it walks */
#define DEFT_MMA_WARPS 4     /* 16 of the block's rows each */
#define DEFT_MMA_PAD 8       /* halves past each shared row */
#define DEFT_MMA_LOG2E 1.4426950408889634f
#define DEFT_MMA_LN2 0.6931471805599453f

typedef struct deft_mma_args {
    int64_t t;       /* sequence length */
    int64_t bh;      /* batch * heads */
    int64_t tiles;   /* tiles of 64 along t */
    float scale;     /* the scores' scale */
    float scale2;    /* scale * log2(e): scores in base-2 units */
    int causal;
    int64_t h;       /* heads */
    deft_attention_strides in, out;   /* q, k, v (dq, dk, dv) and the output (dout) */
} deft_mma_args;

/* The element offset of (batch * head) bh's first row in a tensor of strides s (h heads). */
__device__ __forceinline__ int64_t deft_mma_base(const deft_attention_strides &s, int64_t h, int64_t bh) {
    return bh / h * s.sb + bh % h * s.sh;
}

/* ---- fragments ---- */

/* One m16n8k16 product with f32 accumulation, and two floats rounded into one register of halves (the first in the
 * low half), for bf16 and f16 storage. */
template <class T> struct deft_mma_op {
    static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
        else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        uint32_t r;
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
            memcpy(&r, &v, sizeof r);
        } else {
            const __half2 v = __floats2half2_rn(lo, hi);
            memcpy(&r, &v, sizeof r);
        }
        return r;
    }
};

/* Two adjacent halves of shared memory as one register (the lower address in the low half). */
template <class T> __device__ __forceinline__ uint32_t deft_mma_ld32(const T *p) { return *(const uint32_t *)p; }

/* Four 8 x 8 blocks transposed: the B fragments (k 0-7, then 8-15) of the two 8-column tiles at col of a row-major
 * [k][n] tile whose k rows start at row (lane l gives the address of row l % 8 of block l / 8). */
template <int LD, class T>
__device__ __forceinline__ void deft_mma_ldsm_t(uint32_t (&r)[4], const T *tile, int row, int col) {
    const int lane = threadIdx.x & 31;
    const T *p = tile + (row + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + col + (lane >> 4) * 8;
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* The A fragments of a warp's 16 rows (from row0 of a row-major [rows][d] shared tile), one per 16 columns. */
template <class T, int D, int LD>
__device__ __forceinline__ void deft_mma_rows(uint32_t (&f)[D / 16][4], const T *tile, int row0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = (lane & 3) * 2;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        f[kk][0] = deft_mma_ld32(tile + (row0 + g) * LD + kk * 16 + c);
        f[kk][1] = deft_mma_ld32(tile + (row0 + g + 8) * LD + kk * 16 + c);
        f[kk][2] = deft_mma_ld32(tile + (row0 + g) * LD + kk * 16 + 8 + c);
        f[kk][3] = deft_mma_ld32(tile + (row0 + g + 8) * LD + kk * 16 + 8 + c);
    }
}

/* acc[j] += rows . tile[j * 8 .. j * 8 + 7]^T for the 8 column tiles of a row-major [64][d] shared tile (the tile's
 * rows are the product's columns: keys for q k^T, queries for k q^T). */
template <class T, int D, int LD>
__device__ __forceinline__ void deft_mma_scores(float (&acc)[8][4], const uint32_t (&rows)[D / 16][4],
                                                const T *tile) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            deft_mma_op<T>::mma(acc[j], rows[kk], deft_mma_ld32(tile + (j * 8 + g) * LD + kk * 16 + c),
                                deft_mma_ld32(tile + (j * 8 + g) * LD + kk * 16 + 8 + c));
    }
}

/* acc += p . tile: p a [16][64] accumulator (rounded to T here), tile a row-major [64][d] shared tile. */
template <class T, int D, int LD>
__device__ __forceinline__ void deft_mma_times_tile(float (&acc)[D / 8][4], const float (&p)[8][4], const T *tile) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t a[4] = {deft_mma_op<T>::pack(p[2 * kk][0], p[2 * kk][1]),
                               deft_mma_op<T>::pack(p[2 * kk][2], p[2 * kk][3]),
                               deft_mma_op<T>::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               deft_mma_op<T>::pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < D / 16; np++) {
            uint32_t b[4];
            deft_mma_ldsm_t<LD>(b, tile, kk * 16, np * 16);
            deft_mma_op<T>::mma(acc[2 * np], a, b[0], b[1]);
            deft_mma_op<T>::mma(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

/* Rows [row0, row0 + 64) of a [t][d] matrix whose rows lie st elements apart into a shared tile, 16 bytes a load,
 * zeros past t. */
template <class T, int D, int LD>
__device__ __forceinline__ void deft_mma_load(T *tile, const T *m, int64_t st, int64_t row0, int64_t t) {
    constexpr int chunks = D / 8;
    for (int e = threadIdx.x; e < DEFT_MMA_TILE * chunks; e += blockDim.x) {
        const int r = e / chunks, c = (e % chunks) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row0 + r < t) v = *(const uint4 *)(m + (row0 + r) * st + c);
        *(uint4 *)(tile + r * LD + c) = v;
    }
}

/* deft_mma_load without the registers: 16-byte copies that run behind the block's work (cp.async), zeros past t
 * (a copy of 0 source bytes fills the 16 with zeros). The caller commits them as a group and waits for it. */
template <class T, int D, int LD>
__device__ __forceinline__ void deft_mma_load_async(T *tile, const T *m, int64_t st, int64_t row0, int64_t t) {
    constexpr int chunks = D / 8;
    for (int e = threadIdx.x; e < DEFT_MMA_TILE * chunks; e += blockDim.x) {
        const int r = e / chunks, c = (e % chunks) * 8;
        const bool in = row0 + r < t;
        const T *src = m + (in ? (row0 + r) * st + c : 0);
        const unsigned dst = (unsigned)__cvta_generic_to_shared(tile + r * LD + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0));
    }
}

__device__ __forceinline__ void deft_mma_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void deft_mma_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Two tiles' buffers per operand while the head is small enough for both stages in 48 KB of static shared memory:
 * the next tiles' copies run during this tile's products. */
template <int D> struct deft_mma_stages {
    static constexpr int n = D <= 64 ? 2 : 1;
};

/* The walk over tiles [first, end) of two operands a and b (rows of [t][d] matrices, sta and stb elements apart)
 * through shared buffers sa and sb of deft_mma_stages<D>::n tiles each: calls body(row0 of the tile, its a tile, its
 * b tile) with the tiles in shared memory, every warp past the block's barrier. */
template <class T, int D, int LD, class F>
__device__ __forceinline__ void deft_mma_walk(T *sa, T *sb, const T *a, int64_t sta, const T *b, int64_t stb,
                                              int64_t first, int64_t end, int64_t t, F body) {
    constexpr int stages = deft_mma_stages<D>::n, tile = DEFT_MMA_TILE * LD;
    if (stages == 2 && first < end) {
        deft_mma_load_async<T, D, LD>(sa, a, sta, first, t);
        deft_mma_load_async<T, D, LD>(sb, b, stb, first, t);
        deft_mma_commit();
    }
    int stage = 0;
    for (int64_t r0 = first; r0 < end; r0 += DEFT_MMA_TILE) {
        if (stages == 2) {
            if (r0 + DEFT_MMA_TILE < end) {
                deft_mma_load_async<T, D, LD>(sa + (stage ^ 1) * tile, a, sta, r0 + DEFT_MMA_TILE, t);
                deft_mma_load_async<T, D, LD>(sb + (stage ^ 1) * tile, b, stb, r0 + DEFT_MMA_TILE, t);
            }
            deft_mma_commit();
            deft_mma_wait<1>();
        } else {
            __syncthreads();   /* every warp is done with the last tiles */
            deft_mma_load_async<T, D, LD>(sa, a, sta, r0, t);
            deft_mma_load_async<T, D, LD>(sb, b, stb, r0, t);
            deft_mma_commit();
            deft_mma_wait<0>();
        }
        __syncthreads();
        body(r0, sa + stage * tile, sb + stage * tile);
        if (stages == 2) {
            __syncthreads();   /* the next copies reuse these buffers */
            stage ^= 1;
        }
    }
}

/* Stores a warp's [16][d] accumulator times mul into rows row0 (and row0 + 8) of a [t][d] matrix whose rows lie st
 * elements apart. */
template <class T, int D>
__device__ __forceinline__ void deft_mma_store(T *m, int64_t st, const float (&acc)[D / 8][4], int64_t row0,
                                               int64_t t, const float (&mul)[2]) {
    const int c = (threadIdx.x & 3) * 2;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t row = row0 + 8 * h;
        if (row >= t) continue;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
            *(uint32_t *)(m + row * st + nt * 8 + c) =
                deft_mma_op<T>::pack(acc[nt][2 * h] * mul[h], acc[nt][2 * h + 1] * mul[h]);
    }
}

/* The tile and (batch * head) block b works on: all heads of one tile side by side, the busiest tiles first. */
__device__ __forceinline__ void deft_mma_block(const deft_mma_args &a, bool late_first, int64_t *tile0,
                                               int64_t *bh) {
    const int64_t i = blockIdx.x / a.bh;
    *bh = blockIdx.x % a.bh;
    *tile0 = (late_first && a.causal ? a.tiles - 1 - i : i) * DEFT_MMA_TILE;
}

/* ---- forward ---- */

template <class T, int D>
__global__ void __launch_bounds__(DEFT_MMA_WARPS * 32)
    deft_mma_forward(const T *q, const T *k, const T *v, T *out, float *lse, deft_mma_args a) {
    constexpr int LD = D + DEFT_MMA_PAD;
    __shared__ __align__(16) T ks[deft_mma_stages<D>::n * DEFT_MMA_TILE * LD];
    __shared__ __align__(16) T vs[deft_mma_stages<D>::n * DEFT_MMA_TILE * LD];
    int64_t m0, bh;
    deft_mma_block(a, true, &m0, &bh);
    const int64_t base = deft_mma_base(a.in, a.h, bh), obase = deft_mma_base(a.out, a.h, bh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = (lane & 3) * 2;
    deft_mma_load<T, D, LD>(ks, q + base, a.in.st, m0, a.t);   /* q passes through the key tile to registers */
    __syncthreads();
    uint32_t qf[D / 16][4];
    deft_mma_rows<T, D, LD>(qf, ks, warp * 16);
    __syncthreads();
    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
    const int64_t row = m0 + warp * 16 + g;   /* and row + 8 */
    const int64_t kend = a.causal && m0 + DEFT_MMA_TILE < a.t ? m0 + DEFT_MMA_TILE : a.t;
    deft_mma_walk<T, D, LD>(ks, vs, k + base, a.in.st, v + base, a.in.st, 0, kend, a.t,
                            [&](int64_t n0, const T *kt, const T *vt) {
        float s[8][4];
        deft_mma_scores<T, D, LD>(s, qf, kt);
        float tmax[2] = {mx[0], mx[1]};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t key = n0 + j * 8 + c + (e & 1), r = row + 8 * (e >> 1);
                const bool seen = key < a.t && !(a.causal && key > r);
                s[j][e] = seen ? s[j][e] * a.scale2 : -INFINITY;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], s[j][e]);
            }
        float corr[2], from[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 1));
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 2));
            from[h] = tmax[h] == -INFINITY ? 0.0f : tmax[h];   /* a row that has seen no key yet stays at 0 */
            corr[h] = exp2f(mx[h] - from[h]);
            mx[h] = tmax[h];
            sum[h] *= corr[h];
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j][e] = exp2f(s[j][e] - from[e >> 1]);
                sum[e >> 1] += s[j][e];
            }
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[nt][e] *= corr[e >> 1];
        deft_mma_times_tile<T, D, LD>(o, s, vt);
    });
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
        inv[h] = 1.0f / sum[h];
        if ((lane & 3) == 0 && row + 8 * h < a.t)
            lse[bh * a.t + row + 8 * h] = (mx[h] + log2f(sum[h])) * DEFT_MMA_LN2;
    }
    deft_mma_store<T, D>(out + obase, a.out.st, o, row, a.t, inv);
}

/* ---- backward ---- */

/* delta[row] = dout[row] . out[row]: 8 lanes a row, 16 bytes a load; a grid-stride walk (whole warps stay in it
 * together, for the shuffles). */
template <class T, int D>
__global__ void deft_mma_delta(const T *dout, const T *out, float *delta, int64_t rows, deft_mma_args a) {
    const int sub = threadIdx.x & 7, lane_row = (threadIdx.x & 31) >> 3;
    const int64_t step = ((int64_t)gridDim.x * blockDim.x) >> 3;
    for (int64_t first = ((int64_t)blockIdx.x * blockDim.x + (threadIdx.x & ~31)) >> 3; first < rows;
         first += step) {
        const int64_t row = first + lane_row;
        float s = 0.0f;
        const int64_t at = row < rows ? deft_mma_base(a.out, a.h, row / a.t) + row % a.t * a.out.st : 0;
        if (row < rows)
            for (int cc = sub * 8; cc < D; cc += 64) {
                const uint4 x = *(const uint4 *)(dout + at + cc), y = *(const uint4 *)(out + at + cc);
                const T *xs = (const T *)&x, *ys = (const T *)&y;
#pragma unroll
                for (int e = 0; e < 8; e++) s = fmaf(deft_ty<T>::load(xs[e]), deft_ty<T>::load(ys[e]), s);
            }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        if (row < rows && sub == 0) delta[row] = s;
    }
}

/* dv = sum_i p_ij dout_i and dk = scale * sum_i ds_ij q_i, ds = p (dout . v - delta): per 64 keys. */
template <class T, int D>
__global__ void __launch_bounds__(DEFT_MMA_WARPS * 32)
    deft_mma_dkv(const T *dout, const T *q, const T *k, const T *v, const float *lse, const float *delta, T *dk,
                 T *dv, deft_mma_args a) {
    constexpr int LD = D + DEFT_MMA_PAD;
    __shared__ __align__(16) T qs[deft_mma_stages<D>::n * DEFT_MMA_TILE * LD];
    __shared__ __align__(16) T dos[deft_mma_stages<D>::n * DEFT_MMA_TILE * LD];
    int64_t n0, bh;
    deft_mma_block(a, false, &n0, &bh);
    const int64_t base = deft_mma_base(a.in, a.h, bh), obase = deft_mma_base(a.out, a.h, bh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = (lane & 3) * 2;
    deft_mma_load<T, D, LD>(qs, k + base, a.in.st, n0, a.t);    /* k and v pass through the query tiles */
    deft_mma_load<T, D, LD>(dos, v + base, a.in.st, n0, a.t);
    __syncthreads();
    uint32_t kf[D / 16][4], vf[D / 16][4];
    deft_mma_rows<T, D, LD>(kf, qs, warp * 16);
    deft_mma_rows<T, D, LD>(vf, dos, warp * 16);
    __syncthreads();
    float gk[D / 8][4], gv[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) gk[nt][e] = gv[nt][e] = 0.0f;
    const int64_t key = n0 + warp * 16 + g;   /* and key + 8 */
    const float *rl = lse + bh * a.t, *rd = delta + bh * a.t;
    deft_mma_walk<T, D, LD>(qs, dos, q + base, a.in.st, dout + obase, a.out.st, a.causal ? n0 : 0, a.t, a.t,
                            [&](int64_t m0, const T *qt, const T *dot) {
        float p[8][4], dp[8][4];
        deft_mma_scores<T, D, LD>(p, kf, qt);    /* s^T: keys by queries */
        deft_mma_scores<T, D, LD>(dp, vf, dot);  /* (dout v^T)^T */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                const int64_t query = m0 + j * 8 + c + e2;
                const bool live = query < a.t;
                const float l = live ? rl[query] * DEFT_MMA_LOG2E : 0.0f, dl = live ? rd[query] : 0.0f;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int e = 2 * h + e2;
                    const int64_t kk = key + 8 * h;
                    const bool seen = live && kk < a.t && !(a.causal && kk > query);
                    p[j][e] = seen ? exp2f(p[j][e] * a.scale2 - l) : 0.0f;
                    dp[j][e] = p[j][e] * (dp[j][e] - dl);
                }
            }
        deft_mma_times_tile<T, D, LD>(gv, p, dot);
        deft_mma_times_tile<T, D, LD>(gk, dp, qt);
    });
    const float one[2] = {1.0f, 1.0f}, scale[2] = {a.scale, a.scale};
    deft_mma_store<T, D>(dv + base, a.in.st, gv, key, a.t, one);
    deft_mma_store<T, D>(dk + base, a.in.st, gk, key, a.t, scale);
}

/* dq = scale * sum_j ds_ij k_j: per 64 queries. */
template <class T, int D>
__global__ void __launch_bounds__(DEFT_MMA_WARPS * 32)
    deft_mma_dq(const T *dout, const T *q, const T *k, const T *v, const float *lse, const float *delta, T *dq,
                deft_mma_args a) {
    constexpr int LD = D + DEFT_MMA_PAD;
    __shared__ __align__(16) T ks[deft_mma_stages<D>::n * DEFT_MMA_TILE * LD];
    __shared__ __align__(16) T vs[deft_mma_stages<D>::n * DEFT_MMA_TILE * LD];
    int64_t m0, bh;
    deft_mma_block(a, true, &m0, &bh);
    const int64_t base = deft_mma_base(a.in, a.h, bh), obase = deft_mma_base(a.out, a.h, bh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = (lane & 3) * 2;
    deft_mma_load<T, D, LD>(ks, q + base, a.in.st, m0, a.t);
    deft_mma_load<T, D, LD>(vs, dout + obase, a.out.st, m0, a.t);
    __syncthreads();
    uint32_t qf[D / 16][4], df[D / 16][4];
    deft_mma_rows<T, D, LD>(qf, ks, warp * 16);
    deft_mma_rows<T, D, LD>(df, vs, warp * 16);
    __syncthreads();
    const int64_t row = m0 + warp * 16 + g;
    float rl[2], rd[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        rl[h] = row + 8 * h < a.t ? lse[bh * a.t + row + 8 * h] * DEFT_MMA_LOG2E : 0.0f;
        rd[h] = row + 8 * h < a.t ? delta[bh * a.t + row + 8 * h] : 0.0f;
    }
    float gq[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) gq[nt][0] = gq[nt][1] = gq[nt][2] = gq[nt][3] = 0.0f;
    const int64_t kend = a.causal && m0 + DEFT_MMA_TILE < a.t ? m0 + DEFT_MMA_TILE : a.t;
    deft_mma_walk<T, D, LD>(ks, vs, k + base, a.in.st, v + base, a.in.st, 0, kend, a.t,
                            [&](int64_t n0, const T *kt, const T *vt) {
        float p[8][4], dp[8][4];
        deft_mma_scores<T, D, LD>(p, qf, kt);
        deft_mma_scores<T, D, LD>(dp, df, vt);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t kk = n0 + j * 8 + c + (e & 1), r = row + 8 * (e >> 1);
                const bool seen = r < a.t && kk < a.t && !(a.causal && kk > r);
                p[j][e] = seen ? exp2f(p[j][e] * a.scale2 - rl[e >> 1]) : 0.0f;
                dp[j][e] = p[j][e] * (dp[j][e] - rd[e >> 1]);
            }
        deft_mma_times_tile<T, D, LD>(gq, dp, kt);
    });
    const float scale[2] = {a.scale, a.scale};
    deft_mma_store<T, D>(dq + base, a.in.st, gq, row, a.t, scale);
}

/* ---- launches ---- */

/* q, k and v (in the gradient: in + 1): three buffers, or the thirds of one (packed) */
template <class T> static void deft_mma_qkv(const deft_tensor *n, const void *const *in, const T **qkv) {
    const int64_t part = deft_attention_layout_of(n).part;
    for (int i = 0; i < 3; i++) qkv[i] = n->p.attn.heads > 0 ? (const T *)in[0] + i * part : (const T *)in[i];
}

static deft_status deft_mma_args_of(const deft_tensor *n, deft_mma_args *a, unsigned *blocks) {
    const deft_attention_dims d = deft_attention_dims_of(n);
    const deft_attention_layout l = deft_attention_layout_of(n);
    const int64_t t = d.t, bh = d.b * d.h, tiles = (t + 63) / DEFT_MMA_TILE;
    *a = deft_mma_args{t, bh, tiles, (float)n->p.attn.scale, (float)n->p.attn.scale * DEFT_MMA_LOG2E,
                       n->p.attn.causal, d.h, l.qkv, l.out};
    if (bh * tiles <= 0x7fffffff) {
        *blocks = (unsigned)(bh * tiles);
        return DEFT_OK;
    }
    return deft_set_error(DEFT_ERR_SHAPE, "cuda %s: %lld blocks (batch * heads * tiles) are past the grid's %d",
                          deft_op_name(n->op), (long long)(bh * tiles), 0x7fffffff);
}

template <class T, int D>
static deft_status deft_mma_forward_run(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    deft_mma_args a;
    unsigned blocks = 0;
    deft_status s = deft_mma_args_of(n, &a, &blocks);
    if (s != DEFT_OK) return s;
    float *lse = (float *)((char *)out + deft_node_extra_offset(n));
    const T *qkv[3];
    deft_mma_qkv<T>(n, in, qkv);
    deft_mma_forward<T, D><<<blocks, DEFT_MMA_WARPS * 32, 0, st>>>(qkv[0], qkv[1], qkv[2], (T *)out, lse, a);
    return deft_cuda_check_launch(n, "attention forward (tensor cores)");
}

template <class T, int D>
static deft_status deft_mma_backward_run(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    deft_mma_args a;
    unsigned blocks = 0;
    deft_status s = deft_mma_args_of(n, &a, &blocks);
    if (s != DEFT_OK) return s;
    const int64_t rows = deft_attention_rows(n), part = deft_attention_layout_of(n).part;
    const int last = n->nsrc - 1;   /* the forward node: its value, then its statistics */
    const T *qkv[3];
    deft_mma_qkv<T>(n, in + 1, qkv);
    const T *dout = (const T *)in[0], *q = qkv[0], *k = qkv[1], *v = qkv[2];
    const float *lse = (const float *)((const char *)in[last] + deft_node_extra_offset(n->src[last]));
    float *delta = (float *)((char *)out + deft_node_extra_offset(n));
    T *dq = (T *)out, *dk = dq + part, *dv = dk + part;
    deft_mma_delta<T, D><<<deft_cuda_blocks(rows * 8, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        dout, (const T *)in[last], delta, rows, a);
    if ((s = deft_cuda_check_launch(n, "attention delta (tensor cores)")) != DEFT_OK) return s;
    deft_mma_dkv<T, D><<<blocks, DEFT_MMA_WARPS * 32, 0, st>>>(dout, q, k, v, lse, delta, dk, dv, a);
    if ((s = deft_cuda_check_launch(n, "attention dk, dv (tensor cores)")) != DEFT_OK) return s;
    deft_mma_dq<T, D><<<blocks, DEFT_MMA_WARPS * 32, 0, st>>>(dout, q, k, v, lse, delta, dq, a);
    return deft_cuda_check_launch(n, "attention dq (tensor cores)");
}

template <class T, int D>
static deft_status deft_mma_run(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    return n->op == DEFT_OP_ATTENTION ? deft_mma_forward_run<T, D>(n, out, in, st)
                                      : deft_mma_backward_run<T, D>(n, out, in, st);
}

template <class T>
static deft_status deft_mma_by_head(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    switch (deft_attention_dims_of(n).d) {
    case 32: return deft_mma_run<T, 32>(n, out, in, st);
    case 64: return deft_mma_run<T, 64>(n, out, in, st);
    case 96: return deft_mma_run<T, 96>(n, out, in, st);
    default: return deft_mma_run<T, 128>(n, out, in, st);
    }
}

static bool deft_mma_aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Every row of a tensor of strides s starts 16 bytes apart from its base's alignment (halves: 8 elements). */
static bool deft_mma_strides_aligned(const deft_attention_strides &s) {
    return s.sb % 8 == 0 && s.sh % 8 == 0 && s.st % 8 == 0;
}

extern "C" bool deft_cuda_attention_mma_usable(const deft_tensor *n, void *out, const void *const *in) {
    const int64_t d = deft_attention_dims_of(n).d;
    if (n->dtype != DEFT_F16 && n->dtype != DEFT_BF16) return false;
    if (d != 32 && d != 64 && d != 96 && d != 128) return false;
    const deft_attention_layout l = deft_attention_layout_of(n);
    if (!deft_mma_strides_aligned(l.qkv) || !deft_mma_strides_aligned(l.out) || l.part % 8 != 0) return false;
    for (int i = 0; i < n->nsrc; i++)   /* k and v (dk, dv) lie part elements on: aligned with their base */
        if (!deft_mma_aligned(in[i])) return false;
    return deft_mma_aligned(out);
}

deft_status deft_cuda_attention_mma(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    if (!deft_cuda_attention_mma_usable(n, out, in))
        return deft_set_error(DEFT_ERR_DTYPE, "cuda %s: the tensor-core kernels take f16 and bf16 with a head size "
                              "of 32, 64, 96 or 128 and 16-byte aligned buffers and rows (got %s, %lld)",
                              deft_op_name(n->op), deft_dtype_name(n->dtype), (long long)deft_attention_dims_of(n).d);
    return n->dtype == DEFT_F16 ? deft_mma_by_head<__half>(n, out, in, st)
                                : deft_mma_by_head<__nv_bfloat16>(n, out, in, st);
}
