/* Layer norm on CUDA (ops/cpu/cpu_layer_norm.c is the reference): the forward (its value, and each row's mean and
 * 1 / sqrt(var + eps) past it), dx, and the weight and bias gradients, in f32, f64, f16 and bf16 (halves computed in
 * float, rounded once on the store).
 *
 * Launches: the row kernels give each row one warp (DEFT_LN_WARPS warps to a block, rows in a grid-stride loop):
 * GPT-2's rows are 768 to 1600 elements, 24 to 50 per lane, so a warp covers one with a few 16-byte loads per lane and
 * reduces with shuffles alone (no shared memory, no __syncthreads), and the B T rows (thousands) fill the GPU many
 * times over. Each lane walks its elements in 16-byte vectors when the row's length and every pointer allow (else
 * one element at a time); a row is read three times (sum, centred squares, normalise) and stays in L1 between them.
 * The weight and bias gradients are column sums over every row: blocks of 32 columns x 8 row lanes each sum one of
 * at most DEFT_LAYER_NORM_PARTS blocks of rows into a partial kept past the node's value (graph_internal.h), and a
 * second kernel adds the partials up in order: deterministic, without float atomics.
 *
 * The fused entry points (cuda_kernels.h) run the same kernels with the residual add folded in: the forward reads
 * x = a + b, rounds it as the add kernel would, stores it and normalises it; dx adds the residual gradient after
 * rounding dx as its own store would. Both give the unfused kernels' bits. */
#include "cuda_common.cuh"

#define DEFT_LN_WARPS 4   /* rows per block of the row kernels */
#define DEFT_LN_COLS 32   /* columns per block of the sums */
#define DEFT_LN_LANES 8   /* row lanes per block of the sums */

template <class A> __device__ __forceinline__ A deft_ln_warp_sum(A v) {
    /* A butterfly: every lane ends with the same sum, added in the same order whatever the lane. */
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

template <class T, int V> __device__ __forceinline__ deft_vec<T, V> deft_ln_ld(const T *p) {
    return *reinterpret_cast<const deft_vec<T, V> *>(p);
}
template <class T, int V> __device__ __forceinline__ void deft_ln_st(T *p, const deft_vec<T, V> &v) {
    *reinterpret_cast<deft_vec<T, V> *>(p) = v;
}

template <class T> struct deft_ln_fwd {
    typedef typename deft_ty<T>::C A;
    const T *a;        /* x, or the add's first operand */
    const void *b;     /* the add's second operand (TB), NULL when unfused */
    T *s;              /* the add's value, stored when fused and something else reads it (else NULL) */
    const T *w, *bias; /* NULL when the node has none */
    T *y;
    A *stats;          /* means [rows], then 1 / sqrt(var + eps) [rows] */
    int64_t rows, c;
    A eps;
};

/* V elements of x from element `at` on: a's, or when fused a + b rounded as the add kernel rounds it (every pass
 * adds again rather than reading s back: s may not be stored, and a and b are in L1 by then). */
template <class T, class TB, int V>
__device__ __forceinline__ deft_vec<T, V> deft_ln_x(const deft_ln_fwd<T> &k, int64_t at) {
    typedef deft_ty<T> Ty;
    deft_vec<T, V> x = deft_ln_ld<T, V>(k.a + at);
    if (!k.b) return x;
    const deft_vec<TB, V> bv = deft_ln_ld<TB, V>(static_cast<const TB *>(k.b) + at);
#pragma unroll
    for (int u = 0; u < V; u++)
        x.e[u] = Ty::store(Ty::load(x.e[u]) + (typename Ty::C)deft_ty<TB>::load(bv.e[u]));
    return x;
}

template <class T, class TB, int V> __global__ void __launch_bounds__(DEFT_LN_WARPS * 32)
deft_k_ln_forward(deft_ln_fwd<T> k) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C A;
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * DEFT_LN_WARPS;
    for (int64_t r = (int64_t)blockIdx.x * DEFT_LN_WARPS + (threadIdx.x >> 5); r < k.rows; r += step) {
        const int64_t base = r * k.c;
        A sum = 0;
        for (int64_t j = (int64_t)lane * V; j < k.c; j += 32 * V) {
            const deft_vec<T, V> v = deft_ln_x<T, TB, V>(k, base + j);
            if (k.s) deft_ln_st<T, V>(k.s + base + j, v);
#pragma unroll
            for (int u = 0; u < V; u++) sum += Ty::load(v.e[u]);
        }
        const A mean = deft_ln_warp_sum(sum) / (A)k.c;
        A sq = 0;
        for (int64_t j = (int64_t)lane * V; j < k.c; j += 32 * V) {
            const deft_vec<T, V> v = deft_ln_x<T, TB, V>(k, base + j);
#pragma unroll
            for (int u = 0; u < V; u++) {
                const A d = Ty::load(v.e[u]) - mean;
                sq += d * d;
            }
        }
        const A rstd = A(1) / deft_math_sqrt(deft_ln_warp_sum(sq) / (A)k.c + k.eps);
        if (lane == 0) {
            k.stats[r] = mean;
            k.stats[k.rows + r] = rstd;
        }
        for (int64_t j = (int64_t)lane * V; j < k.c; j += 32 * V) {
            const deft_vec<T, V> v = deft_ln_x<T, TB, V>(k, base + j);
            deft_vec<T, V> o;
#pragma unroll
            for (int u = 0; u < V; u++) {
                A t = (Ty::load(v.e[u]) - mean) * rstd;
                if (k.w) t = t * Ty::load(k.w[j + u]);
                if (k.bias) t = t + Ty::load(k.bias[j + u]);
                o.e[u] = Ty::store(t);
            }
            deft_ln_st<T, V>(k.y + base + j, o);
        }
    }
}

template <class T> struct deft_ln_bwd {
    typedef typename deft_ty<T>::C A;
    const T *dy, *x, *w;   /* w NULL when the node has none */
    const A *stats;        /* the forward node's */
    const T *residual;     /* added to dx when fused, else NULL */
    T *dx;
    int64_t rows, c;
};

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w: the CPU's formula, in the compute type. */
template <class T, int V> __global__ void __launch_bounds__(DEFT_LN_WARPS * 32) deft_k_ln_backward(deft_ln_bwd<T> k) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C A;
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * DEFT_LN_WARPS;
    for (int64_t r = (int64_t)blockIdx.x * DEFT_LN_WARPS + (threadIdx.x >> 5); r < k.rows; r += step) {
        const int64_t base = r * k.c;
        const A mean = k.stats[r], rstd = k.stats[k.rows + r];
        A sg = 0, sgx = 0;
        for (int64_t j = (int64_t)lane * V; j < k.c; j += 32 * V) {
            const deft_vec<T, V> d = deft_ln_ld<T, V>(k.dy + base + j), x = deft_ln_ld<T, V>(k.x + base + j);
#pragma unroll
            for (int u = 0; u < V; u++) {
                const A g = k.w ? Ty::load(d.e[u]) * Ty::load(k.w[j + u]) : Ty::load(d.e[u]);
                sg += g;
                sgx += g * ((Ty::load(x.e[u]) - mean) * rstd);
            }
        }
        const A c1 = deft_ln_warp_sum(sg) / (A)k.c, c2 = deft_ln_warp_sum(sgx) / (A)k.c;
        for (int64_t j = (int64_t)lane * V; j < k.c; j += 32 * V) {
            const deft_vec<T, V> d = deft_ln_ld<T, V>(k.dy + base + j), x = deft_ln_ld<T, V>(k.x + base + j);
            deft_vec<T, V> o;
#pragma unroll
            for (int u = 0; u < V; u++) {
                const A g = k.w ? Ty::load(d.e[u]) * Ty::load(k.w[j + u]) : Ty::load(d.e[u]);
                const A xhat = (Ty::load(x.e[u]) - mean) * rstd;
                o.e[u] = Ty::store(rstd * (g - c1 - xhat * c2));
            }
            if (k.residual) {   /* the add kernel's sum of the residual and dx as stored */
                const deft_vec<T, V> res = deft_ln_ld<T, V>(k.residual + base + j);
#pragma unroll
                for (int u = 0; u < V; u++) o.e[u] = Ty::store(Ty::load(res.e[u]) + Ty::load(o.e[u]));
            }
            deft_ln_st<T, V>(k.dx + base + j, o);
        }
    }
}

/* Stage 1 of the weight and bias gradients: block (x, p) sums columns [32 x, 32 x + 32) over block p of the rows
 * into part[p] ([2, C]: dy xhat, then dy), row lanes combined in a fixed order. */
template <class T> __global__ void __launch_bounds__(DEFT_LN_COLS * DEFT_LN_LANES)
deft_k_ln_sums_part(const T *dy, const T *x, const typename deft_ty<T>::C *stats, typename deft_ty<T>::C *part,
                    int64_t rows, int64_t c, int64_t per) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C A;
    __shared__ A sw[DEFT_LN_LANES][DEFT_LN_COLS], sb[DEFT_LN_LANES][DEFT_LN_COLS];
    const int tx = threadIdx.x % DEFT_LN_COLS, ty = threadIdx.x / DEFT_LN_COLS;
    const int64_t j = (int64_t)blockIdx.x * DEFT_LN_COLS + tx, p = blockIdx.y;
    const int64_t r0 = p * per, r1 = r0 + per < rows ? r0 + per : rows;
    A dw = 0, db = 0;
    for (int64_t r = r0 + ty; j < c && r < r1; r += DEFT_LN_LANES) {
        const A d = Ty::load(dy[r * c + j]);
        dw += d * ((Ty::load(x[r * c + j]) - stats[r]) * stats[rows + r]);
        db += d;
    }
    sw[ty][tx] = dw;
    sb[ty][tx] = db;
    __syncthreads();
    if (ty != 0 || j >= c) return;
    for (int l = 1; l < DEFT_LN_LANES; l++) {
        dw += sw[l][tx];
        db += sb[l][tx];
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
        for (int64_t p = 0; p < parts; p++) s += part[p * n + i];
        out[i] = deft_ty<T>::store(s);
    }
}

/* ---------------------------------------------------------------- launches */
static unsigned deft_ln_row_blocks(int64_t rows) {
    const int64_t b = (rows + DEFT_LN_WARPS - 1) / DEFT_LN_WARPS, cap = (int64_t)1 << 20;
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* 16-byte vectors when every row starts on one (C a multiple of the vector) and every pointer is aligned. */
template <class T> static bool deft_ln_vec_ok(int64_t c, const void *const *ptrs, int n) {
    const int v = 16 / (int)sizeof(T);
    if (c % v != 0) return false;
    for (int i = 0; i < n; i++)
        if (ptrs[i] && !deft_is_aligned(ptrs[i], 16)) return false;
    return true;
}

template <class T, class TB> static void deft_ln_forward_launch(const deft_ln_fwd<T> &k, cudaStream_t st) {
    constexpr int V = 16 / sizeof(T) < 16 / sizeof(TB) ? 16 / sizeof(T) : 16 / sizeof(TB);
    const void *ptrs[6] = {k.a, k.b, k.s, k.w, k.bias, k.y};
    const unsigned blocks = deft_ln_row_blocks(k.rows);
    if (deft_ln_vec_ok<T>(k.c, ptrs, 6) && deft_ln_vec_ok<TB>(k.c, ptrs + 1, 1) && k.c % V == 0)
        deft_k_ln_forward<T, TB, V><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    else
        deft_k_ln_forward<T, TB, 1><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
}

template <class T> static deft_ln_fwd<T> deft_ln_fwd_of(const deft_tensor *n, void *out, const void *const *in) {
    typedef typename deft_ty<T>::C A;
    deft_ln_fwd<T> k;
    k.a = (const T *)in[0];
    k.b = NULL;
    k.s = NULL;
    k.w = n->p.ln.has_weight ? (const T *)in[1] : NULL;
    k.bias = n->p.ln.has_bias ? (const T *)in[1 + n->p.ln.has_weight] : NULL;
    k.y = (T *)out;
    k.stats = (A *)((char *)out + deft_node_extra_offset(n));
    k.rows = deft_layer_norm_rows(n);
    k.c = n->shape[n->ndim - 1];
    k.eps = (A)n->p.ln.eps;
    return k;
}

template <class T>
static deft_status deft_ln_grad_launch(const deft_tensor *n, void *out, const void *const *in, const void *residual,
                                       cudaStream_t st) {
    typedef typename deft_ty<T>::C A;
    deft_ln_bwd<T> k;
    k.dy = (const T *)in[0];
    k.x = (const T *)in[1];
    k.stats = (const A *)((const char *)in[2] + deft_node_extra_offset(n->src[2]));
    k.w = n->nsrc > 3 ? (const T *)in[3] : NULL;
    k.residual = (const T *)residual;
    k.dx = (T *)out;
    k.rows = deft_layer_norm_rows(n);
    k.c = n->shape[n->ndim - 1];
    const void *ptrs[5] = {k.dy, k.x, k.w, k.residual, k.dx};
    const unsigned blocks = deft_ln_row_blocks(k.rows);
    if (deft_ln_vec_ok<T>(k.c, ptrs, 5))
        deft_k_ln_backward<T, 16 / sizeof(T)><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    else
        deft_k_ln_backward<T, 1><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    return deft_cuda_check_launch(n, "layer_norm_grad");
}

template <class T>
static deft_status deft_ln_sums_launch(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    typedef typename deft_ty<T>::C A;
    const int64_t rows = deft_layer_norm_rows(n->src[0]), c = n->shape[1], parts = deft_layer_norm_parts(rows);
    const int64_t per = (rows + parts - 1) / parts;
    A *part = (A *)((char *)out + deft_node_extra_offset(n));
    const A *stats = (const A *)((const char *)in[2] + deft_node_extra_offset(n->src[2]));
    const dim3 grid((unsigned)((c + DEFT_LN_COLS - 1) / DEFT_LN_COLS), (unsigned)parts);
    deft_k_ln_sums_part<T><<<grid, DEFT_LN_COLS * DEFT_LN_LANES, 0, st>>>((const T *)in[0], (const T *)in[1], stats,
                                                                         part, rows, c, per);
    deft_status s = deft_cuda_check_launch(n, "layer_norm_weight_grad parts");
    if (s != DEFT_OK) return s;
    deft_k_ln_sums_total<T><<<deft_cuda_blocks(2 * c, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        part, (T *)out, parts, 2 * c);
    return deft_cuda_check_launch(n, "layer_norm_weight_grad");
}

/* grid.y holds the row blocks: at most DEFT_LAYER_NORM_PARTS, far below its limit; grid.x the column blocks. */
static deft_status deft_ln_check_grid(const deft_tensor *n) {
    const int64_t cols = (n->shape[n->ndim - 1] + DEFT_LN_COLS - 1) / DEFT_LN_COLS;
    if (cols <= INT32_MAX) return DEFT_OK;
    return deft_set_error(DEFT_ERR_SHAPE, "cuda %s: %lld columns are more than one launch takes", deft_op_name(n->op),
                          (long long)n->shape[n->ndim - 1]);
}

deft_status deft_cuda_layer_norm(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        switch (n->op) {
        case DEFT_OP_LAYER_NORM:
            deft_ln_forward_launch<T, T>(deft_ln_fwd_of<T>(n, out, in), st);
            return deft_cuda_check_launch(n, "layer_norm");
        case DEFT_OP_LAYER_NORM_GRAD: return deft_ln_grad_launch<T>(n, out, in, NULL, st);
        case DEFT_OP_LAYER_NORM_WEIGHT_GRAD: {
            const deft_status s = deft_ln_check_grid(n);
            return s != DEFT_OK ? s : deft_ln_sums_launch<T>(n, out, in, st);
        }
        default:
            return deft_set_error(DEFT_ERR_INVALID, "cuda layer_norm: %s is not a layer norm op", deft_op_name(n->op));
        }
    });
}

/* ---------------------------------------------------------------- fused with the residual add */
template <class T>
static deft_status deft_ln_add_typed(const deft_tensor *n, void *out, void *s, const void *a, const void *b,
                                     deft_dtype b_dtype, const void *const *in, cudaStream_t st) {
    deft_ln_fwd<T> k = deft_ln_fwd_of<T>(n, out, in);
    k.a = (const T *)a;
    k.b = b;
    k.s = (T *)s;
    if (b_dtype == n->dtype) deft_ln_forward_launch<T, T>(k, st);
    else if (n->dtype == DEFT_F32 && b_dtype == DEFT_BF16) deft_ln_forward_launch<T, __nv_bfloat16>(k, st);
    else if (n->dtype == DEFT_F32 && b_dtype == DEFT_F16) deft_ln_forward_launch<T, __half>(k, st);
    else
        return deft_set_error(DEFT_ERR_DTYPE, "cuda layer_norm: a residual of %s added to %s", deft_dtype_name(b_dtype),
                              deft_dtype_name(n->dtype));
    return deft_cuda_check_launch(n, "layer_norm with its residual add");
}

extern "C" deft_status deft_cuda_layer_norm_add(const deft_tensor *n, void *out, void *s, const void *a,
                                                const void *b, deft_dtype b_dtype, const void *const *in,
                                                void *stream) {
    if (n->op != DEFT_OP_LAYER_NORM || deft_shape_numel(n->ndim, n->shape) == 0) return DEFT_OK;
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        return deft_ln_add_typed<T>(n, out, s, a, b, b_dtype, in, (cudaStream_t)stream);
    });
}

extern "C" deft_status deft_cuda_layer_norm_grad_add(const deft_tensor *n, void *out, const void *const *in,
                                                     const void *residual, void *stream) {
    if (n->op != DEFT_OP_LAYER_NORM_GRAD || deft_shape_numel(n->ndim, n->shape) == 0) return DEFT_OK;
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        return deft_ln_grad_launch<T>(n, out, in, residual, (cudaStream_t)stream);
    });
}
