/* Layer norm's weight and bias gradients on CUDA: the column sums over every row of dy * xhat and of dy ([2, C], x's
 * dtype; dy in the forward value's, f32 x beside bf16 or f16 dy included), computed in x's compute type. Both paths
 * cut the rows into at most DEFT_LAYER_NORM_PARTS blocks, sum each into a partial kept past the node's value
 * (graph_internal.h) in a fixed order, and add the partials up in a fixed order in a second kernel: the same bits
 * every run, without float atomics.
 *
 *   plain (the reference, debug knob LN_REFERENCE): a block takes 32 columns x 8 row lanes, each thread one element
 *        a row, so a warp reads 128 bytes of x and 64 of a bf16 dy a row, and each partial is added up by one thread
 *        over every row block. At GPT-2's x [8192, 768] f32 with bf16 dy this took ~37 us on an H200 where reading
 *        its inputs takes ~8 us.
 *   fast: a block takes a strip of 32 V columns (a warp's lanes side by side, V = 16 bytes of x each: 512 contiguous
 *        bytes of x a row) over its block of rows, its DEFT_LN_SUM_WARPS warps on interleaved rows, each lane summing
 *        its V columns in row order; the warps' sums are added in warp order through shared memory. The partials are
 *        added up by DEFT_LN_TOTAL_LANES lanes a column, each over every DEFT_LN_TOTAL_LANES-th row block in order,
 *        then lane by lane. No measurement of it is recorded yet. The fused dx kernel (cuda_layer_norm.cu, group
 *        ln_grad_sums) writes the same partials in the same order while it computes dx, and this stage adds them.
 * Each path's order is fixed, but the two differ, so they agree to rounding, not bit for bit (the cuda tests compare
 * them). */
#include "cuda_layer_norm.cuh"

#define DEFT_LN_COLS 32          /* plain: columns per block */
#define DEFT_LN_LANES 8          /* plain: row lanes per block */
#define DEFT_LN_TOTAL_LANES 8    /* fast: lanes per column adding the partials */

/* ---------------------------------------------------------------- plain */
/* Stage 1: block (x, p) sums columns [32 x, 32 x + 32) over block p of the rows into part[p] ([2, C]: dy xhat, then
 * dy), row lanes combined in a fixed order. */
template <class T, class TD> __global__ void __launch_bounds__(DEFT_LN_COLS * DEFT_LN_LANES)
deft_k_ln_sums_part(const TD *dy, const T *x, const typename deft_ty<T>::C *stats, typename deft_ty<T>::C *part,
                    int64_t rows, int64_t c, int64_t per) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C A;
    __shared__ A sw[DEFT_LN_LANES][DEFT_LN_COLS], sb[DEFT_LN_LANES][DEFT_LN_COLS];
    const int tx = threadIdx.x % DEFT_LN_COLS, ty = threadIdx.x / DEFT_LN_COLS;
    const int64_t j = (int64_t)blockIdx.x * DEFT_LN_COLS + tx, p = blockIdx.y;
    const int64_t r0 = p * per, r1 = r0 + per < rows ? r0 + per : rows;
    A dw = 0, db = 0;
    for (int64_t r = r0 + ty; j < c && r < r1; r += DEFT_LN_LANES) {
        const A d = deft_ty<TD>::load(dy[r * c + j]);
        const A xhat = deft_rn_mul(deft_rn_sub(Ty::load(x[r * c + j]), stats[r]), stats[rows + r]);
        dw = deft_rn_add(dw, deft_rn_mul(d, xhat));
        db = deft_rn_add(db, d);
    }
    sw[ty][tx] = dw;
    sb[ty][tx] = db;
    __syncthreads();
    if (ty != 0 || j >= c) return;
    for (int l = 1; l < DEFT_LN_LANES; l++) {
        dw = deft_rn_add(dw, sw[l][tx]);
        db = deft_rn_add(db, sb[l][tx]);
    }
    part[p * 2 * c + j] = dw;
    part[p * 2 * c + c + j] = db;
}

/* Stage 2: out[i] (i < 2 C) the partials' sum in block order. */
template <class T>
__global__ void deft_k_ln_sums_total(const typename deft_ty<T>::C *part, T *out, int64_t parts, int64_t n) {
    typedef typename deft_ty<T>::C A;
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        A s = 0;
        for (int64_t p = 0; p < parts; p++) s = deft_rn_add(s, part[p * n + i]);
        out[i] = deft_ty<T>::store(s);
    }
}

/* ---------------------------------------------------------------- fast */
/* Stage 1: block (s, p) sums the strip of columns [32 V s, 32 V (s + 1)) over block p of the rows. C is a multiple
 * of V, and dy and x are aligned to V of their elements (deft_ln_sums_vec_ok). */
template <class T, class TD, int V> __global__ void __launch_bounds__(DEFT_LN_SUM_WARPS * 32)
deft_k_ln_sums_strip(const TD *dy, const T *x, const typename deft_ty<T>::C *stats, typename deft_ty<T>::C *part,
                     int64_t rows, int64_t c, int64_t per) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C A;
    __shared__ A sw[DEFT_LN_SUM_WARPS][32 * V], sb[DEFT_LN_SUM_WARPS][32 * V];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t strip = (int64_t)blockIdx.x * 32 * V, j = strip + (int64_t)lane * V, p = blockIdx.y;
    const int64_t r0 = p * per, r1 = r0 + per < rows ? r0 + per : rows;
    A dw[V], db[V];
#pragma unroll
    for (int u = 0; u < V; u++) dw[u] = db[u] = 0;
    if (j < c) {
#pragma unroll 4
        for (int64_t r = r0 + warp; r < r1; r += DEFT_LN_SUM_WARPS) {
            const A mean = stats[r], rstd = stats[rows + r];
            const deft_vec<TD, V> d = deft_ln_ld<TD, V>(dy + r * c + j);
            const deft_vec<T, V> xv = deft_ln_ld<T, V>(x + r * c + j);
#pragma unroll
            for (int u = 0; u < V; u++) {
                const A dd = deft_ty<TD>::load(d.e[u]);
                dw[u] = deft_rn_add(dw[u], deft_rn_mul(dd, deft_rn_mul(deft_rn_sub(Ty::load(xv.e[u]), mean), rstd)));
                db[u] = deft_rn_add(db[u], dd);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < V; u++) {
        sw[warp][lane * V + u] = dw[u];
        sb[warp][lane * V + u] = db[u];
    }
    __syncthreads();
    for (int t = threadIdx.x; t < 32 * V; t += blockDim.x) {
        if (strip + t >= c) break;
        A w = sw[0][t], b = sb[0][t];
        for (int l = 1; l < DEFT_LN_SUM_WARPS; l++) {
            w = deft_rn_add(w, sw[l][t]);
            b = deft_rn_add(b, sb[l][t]);
        }
        part[p * 2 * c + strip + t] = w;
        part[p * 2 * c + c + strip + t] = b;
    }
}

/* Stage 2: block i takes outputs [32 i, 32 i + 32) of the 2 C; lane l of a column adds partials l, l + L, ... in
 * order (L = DEFT_LN_TOTAL_LANES), then lane 0 adds the lanes' sums in lane order. */
template <class T> __global__ void __launch_bounds__(32 * DEFT_LN_TOTAL_LANES)
deft_k_ln_sums_total_lanes(const typename deft_ty<T>::C *part, T *out, int64_t parts, int64_t n) {
    typedef typename deft_ty<T>::C A;
    __shared__ A acc[DEFT_LN_TOTAL_LANES][32];
    const int tx = threadIdx.x & 31, l = threadIdx.x >> 5;
    const int64_t i = (int64_t)blockIdx.x * 32 + tx;
    A s = 0;
    for (int64_t p = l; i < n && p < parts; p += DEFT_LN_TOTAL_LANES) s = deft_rn_add(s, part[p * n + i]);
    acc[l][tx] = s;
    __syncthreads();
    if (l != 0 || i >= n) return;
    for (int k = 1; k < DEFT_LN_TOTAL_LANES; k++) s = deft_rn_add(s, acc[k][tx]);
    out[i] = deft_ty<T>::store(s);
}

/* ---------------------------------------------------------------- launches */
/* grid.y holds the row blocks: at most DEFT_LAYER_NORM_PARTS, far below its limit; grid.x the column blocks, the
 * most of them the 2 C outputs of the last stage. */
static deft_status deft_ln_check_grid(const deft_tensor *n) {
    const int64_t cols = (2 * n->shape[n->ndim - 1] + DEFT_LN_COLS - 1) / DEFT_LN_COLS;
    if (cols <= INT32_MAX) return DEFT_OK;
    return deft_set_error(DEFT_ERR_SHAPE, "cuda %s: %lld columns are more than one launch takes", deft_op_name(n->op),
                          (long long)n->shape[n->ndim - 1]);
}

template <class T, class TD>
static deft_status deft_ln_sums_typed(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    typedef typename deft_ty<T>::C A;
    constexpr int V = 16 / sizeof(T);
    const int64_t rows = deft_layer_norm_rows(n->src[0]), c = n->shape[1], parts = deft_layer_norm_parts(rows);
    const int64_t per = (rows + parts - 1) / parts;
    A *part = (A *)((char *)out + deft_node_extra_offset(n));
    const A *stats = (const A *)((const char *)in[2] + deft_node_extra_offset(n->src[2]));
    const TD *dy = (const TD *)in[0];
    const T *x = (const T *)in[1];
    const void *xp[1] = {x}, *dp[1] = {dy};
    const bool fast = !deft_debug(DEFT_DEBUG_LN_REFERENCE) && deft_ln_vec_ok(c, V, xp, 1, V * sizeof(T)) &&
                      deft_ln_vec_ok(c, V, dp, 1, V * sizeof(TD));
    if (fast) {
        const dim3 grid((unsigned)((c + 32 * V - 1) / (32 * V)), (unsigned)parts);
        deft_k_ln_sums_strip<T, TD, V><<<grid, DEFT_LN_SUM_WARPS * 32, 0, st>>>(dy, x, stats, part, rows, c, per);
    } else {
        const dim3 grid((unsigned)((c + DEFT_LN_COLS - 1) / DEFT_LN_COLS), (unsigned)parts);
        deft_k_ln_sums_part<T, TD><<<grid, DEFT_LN_COLS * DEFT_LN_LANES, 0, st>>>(dy, x, stats, part, rows, c, per);
    }
    deft_status s = deft_cuda_check_launch(n, "layer_norm_weight_grad parts");
    if (s != DEFT_OK) return s;
    if (fast)
        deft_k_ln_sums_total_lanes<T><<<(unsigned)((2 * c + 31) / 32), 32 * DEFT_LN_TOTAL_LANES, 0, st>>>(
            part, (T *)out, parts, 2 * c);
    else
        deft_k_ln_sums_total<T><<<deft_cuda_blocks(2 * c, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            part, (T *)out, parts, 2 * c);
    return deft_cuda_check_launch(n, "layer_norm_weight_grad");
}

deft_status deft_cuda_layer_norm_sums_total(const deft_tensor *n, void *out, cudaStream_t st) {
    const deft_status s = deft_ln_check_grid(n);
    if (s != DEFT_OK) return s;
    return deft_ln_with_pair(n, n->dtype, n->src[0]->dtype, [&](auto tx, auto) -> deft_status {
        typedef typename decltype(tx)::type T;
        typedef typename deft_ty<T>::C A;
        const int64_t c = n->shape[1], parts = deft_layer_norm_parts(deft_layer_norm_rows(n->src[0]));
        const A *part = (const A *)((const char *)out + deft_node_extra_offset(n));
        deft_k_ln_sums_total_lanes<T><<<(unsigned)((2 * c + 31) / 32), 32 * DEFT_LN_TOTAL_LANES, 0, st>>>(
            part, (T *)out, parts, 2 * c);
        return deft_cuda_check_launch(n, "layer_norm_weight_grad");
    });
}

deft_status deft_cuda_layer_norm_sums(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    const deft_status s = deft_ln_check_grid(n);
    if (s != DEFT_OK) return s;
    return deft_ln_with_pair(n, n->dtype, n->src[0]->dtype, [&](auto tx, auto td) -> deft_status {
        return deft_ln_sums_typed<typename decltype(tx)::type, typename decltype(td)::type>(n, out, in, st);
    });
}
