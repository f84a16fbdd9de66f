/* Layer norm on CUDA (ops/cpu/cpu_layer_norm.c is the reference): the forward (its value, and each row's mean and
 * 1 / sqrt(var + eps) past it) and dx, in f32, f64, f16 and bf16 (halves computed in float, rounded once on the
 * store); the weight and bias gradients are in cuda_layer_norm_sums.cu. A node may also write its value in bf16 or
 * f16 from f32 x (deft_layer_norm_as, autocast's): the same f32 computation rounded to the value's dtype on the store,
 * which is the cast's rounding of the f32 node's value; its dx reads dy in that dtype as it is (exact in f32).
 *
 * Launches: the row kernels give each row one warp (DEFT_LN_WARPS warps to a block, rows in a grid-stride loop):
 * GPT-2's rows are 768 to 1600 elements, 24 to 50 per lane, so a warp covers one with a few 16-byte loads per lane and
 * reduces with shuffles alone (no shared memory, no __syncthreads), and the B T rows (thousands) fill the GPU many
 * times over. Each lane walks its elements in 16-byte vectors of x when the row's length and every pointer allow
 * (else one element at a time). The forward reads a row once into registers when it fits (up to 16 vectors a lane:
 * 2048 f32 columns) and takes its three passes (sum, centred squares, normalise) from there, dx likewise its two over
 * dy and x (up to 8 vectors a lane: 1024 f32 columns); the plain kernels (longer rows, f64, the debug knob
 * LN_REFERENCE) read the row again each pass, from L1 or L2 at best (a block's rows of x and a bf16 operand are 18 KB
 * at C = 768, and an SM holds many blocks). Both add in the same order (lane l's elements l V, l V + 32 V, ..., then
 * the butterfly), so they give the same bits. The held kernels work in phases (every load of the row, then the sums,
 * then the outputs, then every store), so a warp has all its row's loads in flight at once; walking the row vector by
 * vector with a store between loads held the recomputed layer norms of GPT-2 at about half the memory's rate.
 *
 * The fused entry points (cuda_kernels.h) run the same kernels with the residual add folded in: the forward reads
 * x = a + b, rounds it as the add kernel would, stores it and normalises it; dx adds the residual gradient after
 * rounding dx as its own store would. Both give the unfused kernels' bits. */
#include "cuda_layer_norm.cuh"

#define DEFT_LN_HELD_MAX 16   /* vectors a lane holds at most in the forward's registers */

template <class T, class TY> struct deft_ln_fwd {
    typedef typename deft_ty<T>::C A;
    const T *a;        /* x, or the add's first operand */
    const void *b;     /* the add's second operand (TB), NULL when unfused */
    T *s;              /* the add's value, stored when fused and something else reads it (else NULL) */
    const T *w, *bias; /* NULL when the node has none */
    TY *y;
    A *stats;          /* means [rows], then 1 / sqrt(var + eps) [rows] */
    int64_t rows, c;
    A eps;
};

/* V elements of x from element `at` on: a's, or when fused a + b rounded as the add kernel rounds it. */
template <class T, class TY, class TB, int V>
__device__ __forceinline__ deft_vec<T, V> deft_ln_x(const deft_ln_fwd<T, TY> &k, int64_t at) {
    typedef deft_ty<T> Ty;
    deft_vec<T, V> x = deft_ln_ld<T, V>(k.a + at);
    if (!k.b) return x;
    const deft_vec<TB, V> bv = deft_ln_ld<TB, V>(static_cast<const TB *>(k.b) + at);
#pragma unroll
    for (int u = 0; u < V; u++)
        x.e[u] = Ty::store(deft_rn_add(Ty::load(x.e[u]), (typename Ty::C)deft_ty<TB>::load(bv.e[u])));
    return x;
}

/* Vector i of lane `lane`'s walk over a row: element (lane + 32 i) V. */
template <int V> __device__ __forceinline__ int64_t deft_ln_at(int lane, int i) { return (int64_t)(lane + 32 * i) * V; }

/* The forward of one row, read again on each pass (the plain kernel: LN_REFERENCE, rows too long to hold, f64). */
template <class T, class TY, class TB, int V>
__device__ __forceinline__ void deft_ln_forward_row_plain(const deft_ln_fwd<T, TY> &k, int64_t r, int lane) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C A;
    const int64_t base = r * k.c;
    A sum = 0;
    for (int i = 0; deft_ln_at<V>(lane, i) < k.c; i++) {
        const int64_t j = deft_ln_at<V>(lane, i);
        const deft_vec<T, V> v = deft_ln_x<T, TY, TB, V>(k, base + j);
        if (k.s) deft_ln_st<T, V>(k.s + base + j, v);
#pragma unroll
        for (int u = 0; u < V; u++) sum = deft_rn_add(sum, Ty::load(v.e[u]));
    }
    const A mean = deft_ln_warp_sum(sum) / (A)k.c;
    A sq = 0;
    for (int i = 0; deft_ln_at<V>(lane, i) < k.c; i++) {
        const deft_vec<T, V> v = deft_ln_x<T, TY, TB, V>(k, base + deft_ln_at<V>(lane, i));
#pragma unroll
        for (int u = 0; u < V; u++) {
            const A d = deft_rn_sub(Ty::load(v.e[u]), mean);
            sq = deft_rn_add(sq, deft_rn_mul(d, d));
        }
    }
    const A rstd = A(1) / deft_math_sqrt(deft_rn_add(deft_ln_warp_sum(sq) / (A)k.c, k.eps));
    if (lane == 0) {
        k.stats[r] = mean;
        k.stats[k.rows + r] = rstd;
    }
    for (int i = 0; deft_ln_at<V>(lane, i) < k.c; i++) {
        const int64_t j = deft_ln_at<V>(lane, i);
        const deft_vec<T, V> v = deft_ln_x<T, TY, TB, V>(k, base + j);
        deft_vec<TY, V> o;
#pragma unroll
        for (int u = 0; u < V; u++) {
            A t = deft_rn_mul(deft_rn_sub(Ty::load(v.e[u]), mean), rstd);
            if (k.w) t = deft_rn_mul(t, Ty::load(k.w[j + u]));
            if (k.bias) t = deft_rn_add(t, Ty::load(k.bias[j + u]));
            o.e[u] = deft_ty<TY>::store(t);
        }
        deft_ln_st<TY, V>(k.y + base + j, o);
    }
}

/* The forward of one row held in registers (C <= 32 V H), read once, with the plain kernel's additions in its
 * order. Each phase is a loop of its own with a per-vector predicate, no early exit: every load of the row is issued
 * before the first value is used, and no store (s, y; which the compiler must assume may alias x, w and bias) sits
 * between two loads. A walk that loaded, stored s and added vector by vector waited a full trip to memory per
 * vector, which left the recomputed layer norms at about half the memory's rate. The weight and bias are read as
 * vectors (deft_ln_forward_launch checks their alignment), and y is formed for the whole row before it is stored. */
template <class T, class TY, class TB, int V, int H>
__device__ __forceinline__ void deft_ln_forward_row_held(const deft_ln_fwd<T, TY> &k, int64_t r, int lane) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C A;
    const int64_t base = r * k.c;
    deft_vec<T, V> held[H];
#pragma unroll
    for (int i = 0; i < H; i++) {
        const int64_t j = deft_ln_at<V>(lane, i);
        held[i] = j < k.c ? deft_ln_ld<T, V>(k.a + base + j) : deft_vec<T, V>{};
    }
    if (k.b) {   /* b's vectors after a's, each array loaded whole before the adds (deft_ln_x's rounding) */
        deft_vec<TB, V> hb[H];
        const TB *b = static_cast<const TB *>(k.b);
#pragma unroll
        for (int i = 0; i < H; i++) {
            const int64_t j = deft_ln_at<V>(lane, i);
            hb[i] = j < k.c ? deft_ln_ld<TB, V>(b + base + j) : deft_vec<TB, V>{};
        }
#pragma unroll
        for (int i = 0; i < H; i++)
#pragma unroll
            for (int u = 0; u < V; u++)
                held[i].e[u] = Ty::store(deft_rn_add(Ty::load(held[i].e[u]), (A)deft_ty<TB>::load(hb[i].e[u])));
    }
    if (k.s) {
#pragma unroll
        for (int i = 0; i < H; i++)
            if (deft_ln_at<V>(lane, i) < k.c) deft_ln_st<T, V>(k.s + base + deft_ln_at<V>(lane, i), held[i]);
    }
    A sum = 0;
#pragma unroll
    for (int i = 0; i < H; i++)
        if (deft_ln_at<V>(lane, i) < k.c) {
#pragma unroll
            for (int u = 0; u < V; u++) sum = deft_rn_add(sum, Ty::load(held[i].e[u]));
        }
    const A mean = deft_ln_warp_sum(sum) / (A)k.c;
    A sq = 0;
#pragma unroll
    for (int i = 0; i < H; i++)
        if (deft_ln_at<V>(lane, i) < k.c) {
#pragma unroll
            for (int u = 0; u < V; u++) {
                const A d = deft_rn_sub(Ty::load(held[i].e[u]), mean);
                sq = deft_rn_add(sq, deft_rn_mul(d, d));
            }
        }
    const A rstd = A(1) / deft_math_sqrt(deft_rn_add(deft_ln_warp_sum(sq) / (A)k.c, k.eps));
    if (lane == 0) {
        k.stats[r] = mean;
        k.stats[k.rows + r] = rstd;
    }
    /* Formed for every slot, past the row's end too (from zeros, with the weight and bias of column 0): a walk
     * without branches, whose weight and bias loads the compiler is free to issue together. */
    deft_vec<TY, V> out[H];
#pragma unroll
    for (int i = 0; i < H; i++) {
        const int64_t j = deft_ln_at<V>(lane, i) < k.c ? deft_ln_at<V>(lane, i) : 0;
        deft_vec<T, V> wv, bv;
        if (k.w) wv = deft_ln_ld<T, V>(k.w + j);
        if (k.bias) bv = deft_ln_ld<T, V>(k.bias + j);
#pragma unroll
        for (int u = 0; u < V; u++) {
            A t = deft_rn_mul(deft_rn_sub(Ty::load(held[i].e[u]), mean), rstd);
            if (k.w) t = deft_rn_mul(t, Ty::load(wv.e[u]));
            if (k.bias) t = deft_rn_add(t, Ty::load(bv.e[u]));
            out[i].e[u] = deft_ty<TY>::store(t);
        }
    }
#pragma unroll
    for (int i = 0; i < H; i++)
        if (deft_ln_at<V>(lane, i) < k.c) deft_ln_st<TY, V>(k.y + base + deft_ln_at<V>(lane, i), out[i]);
}

/* H > 0: the row held in registers; H == 0: the plain kernel. The same bits either way. */
template <class T, class TY, class TB, int V, int H>
__device__ __forceinline__ void deft_ln_forward_row(const deft_ln_fwd<T, TY> &k, int64_t r, int lane) {
    if constexpr (H > 0) deft_ln_forward_row_held<T, TY, TB, V, H>(k, r, lane);
    else deft_ln_forward_row_plain<T, TY, TB, V>(k, r, lane);
}

template <class T, class TY, class TB, int V, int H> __global__ void __launch_bounds__(DEFT_LN_WARPS * 32)
deft_k_ln_forward(deft_ln_fwd<T, TY> k) {
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * DEFT_LN_WARPS;
    for (int64_t r = (int64_t)blockIdx.x * DEFT_LN_WARPS + (threadIdx.x >> 5); r < k.rows; r += step)
        deft_ln_forward_row<T, TY, TB, V, H>(k, r, lane);
}

template <class T, class TD> struct deft_ln_bwd {
    typedef typename deft_ty<T>::C A;
    const TD *dy;          /* in the forward value's dtype */
    const T *x, *w;        /* w NULL when the node has none */
    const A *stats;        /* the forward node's */
    const T *residual;     /* added to dx when fused, else NULL */
    T *dx;
    int64_t rows, c;
};

/* g = dy w, in the compute type. */
template <class T, class TD>
__device__ __forceinline__ typename deft_ty<T>::C deft_ln_g(const deft_ln_bwd<T, TD> &k, TD d, int64_t j) {
    const typename deft_ty<T>::C v = deft_ty<TD>::load(d);
    return k.w ? deft_rn_mul(v, deft_ty<T>::load(k.w[j])) : v;
}

/* dx of one row: rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, the CPU's formula in the compute type; read
 * again on the second pass (the plain kernel). */
template <class T, class TD, int V>
__device__ __forceinline__ void deft_ln_backward_row_plain(const deft_ln_bwd<T, TD> &k, int64_t r, int lane) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C A;
    const int64_t base = r * k.c;
    const A mean = k.stats[r], rstd = k.stats[k.rows + r];
    A sg = 0, sgx = 0;
    for (int i = 0; deft_ln_at<V>(lane, i) < k.c; i++) {
        const int64_t j = deft_ln_at<V>(lane, i);
        const deft_vec<TD, V> d = deft_ln_ld<TD, V>(k.dy + base + j);
        const deft_vec<T, V> x = deft_ln_ld<T, V>(k.x + base + j);
#pragma unroll
        for (int u = 0; u < V; u++) {
            const A g = deft_ln_g(k, d.e[u], j + u);
            sg = deft_rn_add(sg, g);
            sgx = deft_rn_add(sgx, deft_rn_mul(g, deft_rn_mul(deft_rn_sub(Ty::load(x.e[u]), mean), rstd)));
        }
    }
    const A c1 = deft_ln_warp_sum(sg) / (A)k.c, c2 = deft_ln_warp_sum(sgx) / (A)k.c;
    for (int i = 0; deft_ln_at<V>(lane, i) < k.c; i++) {
        const int64_t j = deft_ln_at<V>(lane, i);
        const deft_vec<TD, V> d = deft_ln_ld<TD, V>(k.dy + base + j);
        const deft_vec<T, V> x = deft_ln_ld<T, V>(k.x + base + j);
        deft_vec<T, V> o;
#pragma unroll
        for (int u = 0; u < V; u++) {
            const A g = deft_ln_g(k, d.e[u], j + u);
            const A xhat = deft_rn_mul(deft_rn_sub(Ty::load(x.e[u]), mean), rstd);
            o.e[u] = Ty::store(deft_rn_mul(rstd, deft_rn_sub(deft_rn_sub(g, c1), deft_rn_mul(xhat, c2))));
        }
        if (k.residual) {   /* the add kernel's sum of the residual and dx as stored */
            const deft_vec<T, V> res = deft_ln_ld<T, V>(k.residual + base + j);
#pragma unroll
            for (int u = 0; u < V; u++) o.e[u] = Ty::store(deft_rn_add(Ty::load(res.e[u]), Ty::load(o.e[u])));
        }
        deft_ln_st<T, V>(k.dx + base + j, o);
    }
}

/* What the held dx row adds to the weight and bias gradients' sums as it goes: nothing (dx alone), or each of the
 * lane's columns' dy xhat and dy, added in row order (deft_ln_acc: the fused kernel's, below). */
struct deft_ln_no_acc {
    template <class A> __device__ __forceinline__ void add(int, int, A, A) {}
};

/* dx of one row with its dy and x held in registers (C <= 32 V H), read once: the plain kernel's arithmetic in its
 * order, in phases as deft_ln_forward_row_held has them (every load of the row before the first use, dx formed for
 * the row before the first store, so no store stands between two loads). acc sees each element's dy and xhat, the
 * very values dx's sums use; what it does with them never touches dx's arithmetic. */
template <class T, class TD, int V, int H, class S>
__device__ __forceinline__ void deft_ln_backward_row_held(const deft_ln_bwd<T, TD> &k, int64_t r, int lane, S &acc) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C A;
    const int64_t base = r * k.c;
    const A mean = k.stats[r], rstd = k.stats[k.rows + r];
    deft_vec<TD, V> hd[H];
    deft_vec<T, V> hx[H];
#pragma unroll
    for (int i = 0; i < H; i++) {
        const int64_t j = deft_ln_at<V>(lane, i);
        if (j < k.c) hd[i] = deft_ln_ld<TD, V>(k.dy + base + j), hx[i] = deft_ln_ld<T, V>(k.x + base + j);
    }
    A sg = 0, sgx = 0;
#pragma unroll
    for (int i = 0; i < H; i++) {
        const int64_t j = deft_ln_at<V>(lane, i);
        if (j >= k.c) continue;
#pragma unroll
        for (int u = 0; u < V; u++) {
            const A g = deft_ln_g(k, hd[i].e[u], j + u);
            sg = deft_rn_add(sg, g);
            const A xhat = deft_rn_mul(deft_rn_sub(Ty::load(hx[i].e[u]), mean), rstd);
            sgx = deft_rn_add(sgx, deft_rn_mul(g, xhat));
            acc.add(i, u, (A)deft_ty<TD>::load(hd[i].e[u]), xhat);
        }
    }
    const A c1 = deft_ln_warp_sum(sg) / (A)k.c, c2 = deft_ln_warp_sum(sgx) / (A)k.c;
#pragma unroll
    for (int i = 0; i < H; i++) {   /* dx into hx, vector by vector */
        const int64_t j = deft_ln_at<V>(lane, i);
        if (j >= k.c) continue;
#pragma unroll
        for (int u = 0; u < V; u++) {
            const A g = deft_ln_g(k, hd[i].e[u], j + u);
            const A xhat = deft_rn_mul(deft_rn_sub(Ty::load(hx[i].e[u]), mean), rstd);
            hx[i].e[u] = Ty::store(deft_rn_mul(rstd, deft_rn_sub(deft_rn_sub(g, c1), deft_rn_mul(xhat, c2))));
        }
    }
    if (k.residual) {   /* the add kernel's sum of the residual and dx as stored */
#pragma unroll
        for (int i = 0; i < H; i++) {
            const int64_t j = deft_ln_at<V>(lane, i);
            if (j >= k.c) continue;
            const deft_vec<T, V> res = deft_ln_ld<T, V>(k.residual + base + j);
#pragma unroll
            for (int u = 0; u < V; u++)
                hx[i].e[u] = Ty::store(deft_rn_add(Ty::load(res.e[u]), Ty::load(hx[i].e[u])));
        }
    }
#pragma unroll
    for (int i = 0; i < H; i++)
        if (deft_ln_at<V>(lane, i) < k.c) deft_ln_st<T, V>(k.dx + base + deft_ln_at<V>(lane, i), hx[i]);
}

template <class T, class TD, int V, int H>
__device__ __forceinline__ void deft_ln_backward_row(const deft_ln_bwd<T, TD> &k, int64_t r, int lane) {
    deft_ln_no_acc none;
    if constexpr (H > 0) deft_ln_backward_row_held<T, TD, V, H>(k, r, lane, none);
    else deft_ln_backward_row_plain<T, TD, V>(k, r, lane);
}

template <class T, class TD, int V, int H> __global__ void __launch_bounds__(DEFT_LN_WARPS * 32)
deft_k_ln_backward(deft_ln_bwd<T, TD> k) {
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * DEFT_LN_WARPS;
    for (int64_t r = (int64_t)blockIdx.x * DEFT_LN_WARPS + (threadIdx.x >> 5); r < k.rows; r += step)
        deft_ln_backward_row<T, TD, V, H>(k, r, lane);
}

/* ---------------------------------------------------------------- launches */
static unsigned deft_ln_row_blocks(int64_t rows) {
    const int64_t b = (rows + DEFT_LN_WARPS - 1) / DEFT_LN_WARPS, cap = (int64_t)1 << 20;
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* The held kernel for vectors of V: the fewest of 2, 4, 8, 16 vectors a lane that cover the row. */
template <class T, class TY, class TB, int V>
static void deft_ln_forward_vec(const deft_ln_fwd<T, TY> &k, unsigned blocks, cudaStream_t st) {
    const int64_t per_lane = (k.c + 32 * V - 1) / (32 * V);
    if (deft_debug(DEFT_DEBUG_LN_REFERENCE) || per_lane > DEFT_LN_HELD_MAX)
        deft_k_ln_forward<T, TY, TB, V, 0><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    else if (per_lane <= 2)
        deft_k_ln_forward<T, TY, TB, V, 2><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    else if (per_lane <= 4)
        deft_k_ln_forward<T, TY, TB, V, 4><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    else if (per_lane <= 8)
        deft_k_ln_forward<T, TY, TB, V, 8><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    else
        deft_k_ln_forward<T, TY, TB, V, DEFT_LN_HELD_MAX><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
}

/* Vectors of x's 16 bytes (fewer when b is wider than x) where every pointer allows; f64 rows are never held. */
template <class T, class TY, class TB>
static void deft_ln_forward_launch(const deft_ln_fwd<T, TY> &k, cudaStream_t st) {
    constexpr int V = 16 / sizeof(T) < 16 / sizeof(TB) ? 16 / sizeof(T) : 16 / sizeof(TB);
    const void *pt[4] = {k.a, k.s, k.w, k.bias}, *pb[1] = {k.b}, *py[1] = {k.y};
    const unsigned blocks = deft_ln_row_blocks(k.rows);
    if (deft_ln_vec_ok(k.c, V, pt, 4, V * sizeof(T)) && deft_ln_vec_ok(k.c, V, pb, 1, V * sizeof(TB)) &&
        deft_ln_vec_ok(k.c, V, py, 1, V * sizeof(TY))) {
        if constexpr (std::is_same<T, double>::value)
            deft_k_ln_forward<T, TY, TB, V, 0><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
        else
            deft_ln_forward_vec<T, TY, TB, V>(k, blocks, st);
    } else {
        deft_k_ln_forward<T, TY, TB, 1, 0><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    }
}

template <class T, class TY>
static deft_ln_fwd<T, TY> deft_ln_fwd_of(const deft_tensor *n, void *out, const void *const *in) {
    typedef typename deft_ty<T>::C A;
    deft_ln_fwd<T, TY> k;
    k.a = (const T *)in[0];
    k.b = NULL;
    k.s = NULL;
    k.w = n->p.ln.has_weight ? (const T *)in[1] : NULL;
    k.bias = n->p.ln.has_bias ? (const T *)in[1 + n->p.ln.has_weight] : NULL;
    k.y = (TY *)out;
    k.stats = (A *)((char *)out + deft_node_extra_offset(n));
    k.rows = deft_layer_norm_rows(n);
    k.c = n->shape[n->ndim - 1];
    k.eps = (A)n->p.ln.eps;
    return k;
}

/* dx's kernel arguments for node n (T x's dtype, TD dy's); residual added when fused. */
template <class T, class TD>
static deft_ln_bwd<T, TD> deft_ln_bwd_of(const deft_tensor *n, void *out, const void *const *in, const void *residual) {
    typedef typename deft_ty<T>::C A;
    deft_ln_bwd<T, TD> k;
    k.dy = (const TD *)in[0];
    k.x = (const T *)in[1];
    k.stats = (const A *)((const char *)in[2] + deft_node_extra_offset(n->src[2]));
    k.w = n->nsrc > 3 ? (const T *)in[3] : NULL;
    k.residual = (const T *)residual;
    k.dx = (T *)out;
    k.rows = deft_layer_norm_rows(n);
    k.c = n->shape[n->ndim - 1];
    return k;
}

/* Whether dx's kernel may take its rows in 16-byte vectors of x. */
template <class T, class TD> static bool deft_ln_bwd_vec(const deft_ln_bwd<T, TD> &k) {
    constexpr int V = 16 / sizeof(T);
    const void *pt[4] = {k.x, k.w, k.residual, k.dx}, *pd[1] = {k.dy};
    return deft_ln_vec_ok(k.c, V, pt, 4, V * sizeof(T)) && deft_ln_vec_ok(k.c, V, pd, 1, V * sizeof(TD));
}

/* dx of node n (T x's dtype, TD dy's); residual added when fused. */
template <class T, class TD>
static deft_status deft_ln_grad_launch(const deft_tensor *n, void *out, const void *const *in, const void *residual,
                                       cudaStream_t st) {
    constexpr int V = 16 / sizeof(T);
    const deft_ln_bwd<T, TD> k = deft_ln_bwd_of<T, TD>(n, out, in, residual);
    const unsigned blocks = deft_ln_row_blocks(k.rows);
    const int64_t per_lane = (k.c + 32 * V - 1) / (32 * V);
    const bool vec = deft_ln_bwd_vec(k);
    if (!vec) {
        deft_k_ln_backward<T, TD, 1, 0><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    } else if constexpr (std::is_same<T, double>::value) {
        deft_k_ln_backward<T, TD, V, 0><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    } else {
        if (deft_debug(DEFT_DEBUG_LN_REFERENCE) || per_lane > 8)
            deft_k_ln_backward<T, TD, V, 0><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
        else if (per_lane <= 4)
            deft_k_ln_backward<T, TD, V, 4><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
        else
            deft_k_ln_backward<T, TD, V, 8><<<blocks, DEFT_LN_WARPS * 32, 0, st>>>(k);
    }
    return deft_cuda_check_launch(n, "layer_norm_grad");
}

deft_status deft_cuda_layer_norm(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    switch (n->op) {
    case DEFT_OP_LAYER_NORM:
        return deft_ln_with_pair(n, n->src[0]->dtype, n->dtype, [&](auto tx, auto ty) -> deft_status {
            typedef typename decltype(tx)::type T;
            typedef typename decltype(ty)::type TY;
            deft_ln_forward_launch<T, TY, T>(deft_ln_fwd_of<T, TY>(n, out, in), st);
            return deft_cuda_check_launch(n, "layer_norm");
        });
    case DEFT_OP_LAYER_NORM_GRAD:
        return deft_ln_with_pair(n, n->dtype, n->src[0]->dtype, [&](auto tx, auto td) -> deft_status {
            return deft_ln_grad_launch<typename decltype(tx)::type, typename decltype(td)::type>(n, out, in, NULL, st);
        });
    case DEFT_OP_LAYER_NORM_WEIGHT_GRAD: return deft_cuda_layer_norm_sums(n, out, in, st);
    default:
        return deft_set_error(DEFT_ERR_INVALID, "cuda layer_norm: %s is not a layer norm op", deft_op_name(n->op));
    }
}

/* ---------------------------------------------------------------- fused with the residual add */
template <class T, class TY>
static deft_status deft_ln_add_typed(const deft_tensor *n, void *out, void *s, const void *a, const void *b,
                                     deft_dtype b_dtype, const void *const *in, cudaStream_t st) {
    deft_ln_fwd<T, TY> k = deft_ln_fwd_of<T, TY>(n, out, in);
    k.a = (const T *)a;
    k.b = b;
    k.s = (T *)s;
    const deft_dtype x_dtype = n->src[0]->dtype;
    if (b_dtype == x_dtype) {
        deft_ln_forward_launch<T, TY, T>(k, st);
    } else if constexpr (std::is_same<T, float>::value) {
        if (b_dtype == DEFT_BF16) deft_ln_forward_launch<T, TY, __nv_bfloat16>(k, st);
        else if (b_dtype == DEFT_F16) deft_ln_forward_launch<T, TY, __half>(k, st);
        else
            return deft_set_error(DEFT_ERR_DTYPE, "cuda layer_norm: a residual of %s added to %s",
                                  deft_dtype_name(b_dtype), deft_dtype_name(x_dtype));
    } else {
        return deft_set_error(DEFT_ERR_DTYPE, "cuda layer_norm: a residual of %s added to %s", deft_dtype_name(b_dtype),
                              deft_dtype_name(x_dtype));
    }
    return deft_cuda_check_launch(n, "layer_norm with its residual add");
}

extern "C" deft_status deft_cuda_layer_norm_add(const deft_tensor *n, void *out, void *s, const void *a,
                                                const void *b, deft_dtype b_dtype, const void *const *in,
                                                void *stream) {
    if (n->op != DEFT_OP_LAYER_NORM || deft_shape_numel(n->ndim, n->shape) == 0) return DEFT_OK;
    return deft_ln_with_pair(n, n->src[0]->dtype, n->dtype, [&](auto tx, auto ty) -> deft_status {
        return deft_ln_add_typed<typename decltype(tx)::type, typename decltype(ty)::type>(n, out, s, a, b, b_dtype,
                                                                                           in, (cudaStream_t)stream);
    });
}

extern "C" deft_status deft_cuda_layer_norm_grad_add(const deft_tensor *n, void *out, const void *const *in,
                                                     const void *residual, void *stream) {
    if (n->op != DEFT_OP_LAYER_NORM_GRAD || deft_shape_numel(n->ndim, n->shape) == 0) return DEFT_OK;
    return deft_ln_with_pair(n, n->dtype, n->src[0]->dtype, [&](auto tx, auto td) -> deft_status {
        return deft_ln_grad_launch<typename decltype(tx)::type, typename decltype(td)::type>(n, out, in, residual,
                                                                                             (cudaStream_t)stream);
    });
}

/* ---------------------------------------------------------------- dx with the weight gradient's partials */
/* The fused group ln_grad_sums (passes/fusion_layer_norm.c): dx (plus the residual gradient when the add is fused)
 * and the weight gradient node's partials in one pass over the rows, which dx's held kernel reads once anyway; the
 * weight gradient's second stage (cuda_layer_norm_sums.cu) then adds the partials. Block p of the grid owns row
 * block p of the weight gradient's deft_layer_norm_parts (DEFT_LAYER_NORM_PARTS at most: bounded, so the second stage
 * stays cheap); its DEFT_LN_SUM_WARPS warps take the block's rows interleaved (warp w rows r0 + w, r0 + w + 8, ...),
 * each a row at a time as dx's kernel does (lane l its 16-byte vectors l, l + 32, ...). Each lane adds its columns'
 * dy xhat and dy in registers in row order; at the end the warps' sums are added in warp order (((w0 + w1) + w2)
 * ...) through shared memory and block p writes partial p once. That is the strip kernel's order element for
 * element (the same rows per block, the same warp a row, the same adds), so the weight and bias gradients have the
 * unfused fast path's bits, and dx its own (the held kernel's arithmetic, untouched). Where the held kernel does not
 * apply (rows longer than 8 vectors a lane, unaligned or odd C, f64, LN_REFERENCE) the group runs the two kernels. */
template <class A, int V, int H> struct deft_ln_acc {
    A w[H][V], b[H][V];
    __device__ __forceinline__ void add(int i, int u, A d, A xhat) {
        w[i][u] = deft_rn_add(w[i][u], deft_rn_mul(d, xhat));
        b[i][u] = deft_rn_add(b[i][u], d);
    }
};

/* Two blocks an SM where a lane's sums are 48 registers at most (GPT-2's f32 rows of 768: 6 vectors of 4): the held
 * row, its sums and addresses fit in 128 (ptxas: no spills); more (8 vectors of f32, 4 and more of halves) run one
 * block an SM. */
template <class T, class TD, int V, int H>
__global__ void __launch_bounds__(DEFT_LN_SUM_WARPS * 32, 2 * H * V <= 48 ? 2 : 1)
deft_k_ln_backward_sums(deft_ln_bwd<T, TD> k, typename deft_ty<T>::C *part, int64_t per) {
    typedef typename deft_ty<T>::C A;
    __shared__ A sw[32 * V * H], sb[32 * V * H];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t p = blockIdx.x, r0 = p * per, r1 = r0 + per < k.rows ? r0 + per : k.rows;
    deft_ln_acc<A, V, H> acc;
#pragma unroll
    for (int i = 0; i < H; i++)
#pragma unroll
        for (int u = 0; u < V; u++) acc.w[i][u] = acc.b[i][u] = 0;
    for (int64_t r = r0 + warp; r < r1; r += DEFT_LN_SUM_WARPS)
        deft_ln_backward_row_held<T, TD, V, H>(k, r, lane, acc);
    /* Warp w adds its sums to those of warps 0 .. w - 1 (each lane to its own columns); the last writes partial p. */
    for (int w = 0; w < DEFT_LN_SUM_WARPS; w++) {
        if (warp == w) {
#pragma unroll
            for (int i = 0; i < H; i++) {
                const int64_t j0 = deft_ln_at<V>(lane, i);
                if (j0 >= k.c) continue;
#pragma unroll
                for (int u = 0; u < V; u++) {
                    const int64_t j = j0 + u;
                    const A dw = w == 0 ? acc.w[i][u] : deft_rn_add(sw[j], acc.w[i][u]);
                    const A db = w == 0 ? acc.b[i][u] : deft_rn_add(sb[j], acc.b[i][u]);
                    if (w + 1 < DEFT_LN_SUM_WARPS) {
                        sw[j] = dw;
                        sb[j] = db;
                    } else {
                        part[p * 2 * k.c + j] = dw;
                        part[p * 2 * k.c + k.c + j] = db;
                    }
                }
            }
        }
        if (w + 1 < DEFT_LN_SUM_WARPS) __syncthreads();
    }
}

/* The fused kernel for the fewest of 2, 4, 6, 8 vectors a lane that cover the row. */
template <class T, class TD, int V>
static void deft_ln_grad_sums_vec(const deft_ln_bwd<T, TD> &k, typename deft_ty<T>::C *part, int64_t parts,
                                  int64_t per, int64_t per_lane, cudaStream_t st) {
    const unsigned blocks = (unsigned)parts, threads = DEFT_LN_SUM_WARPS * 32;
    if (per_lane <= 2) deft_k_ln_backward_sums<T, TD, V, 2><<<blocks, threads, 0, st>>>(k, part, per);
    else if (per_lane <= 4) deft_k_ln_backward_sums<T, TD, V, 4><<<blocks, threads, 0, st>>>(k, part, per);
    else if (per_lane <= 6) deft_k_ln_backward_sums<T, TD, V, 6><<<blocks, threads, 0, st>>>(k, part, per);
    else deft_k_ln_backward_sums<T, TD, V, 8><<<blocks, threads, 0, st>>>(k, part, per);
}

template <class T, class TD>
static deft_status deft_ln_grad_sums_typed(const deft_tensor *n, void *out, const void *const *in,
                                           const void *residual, const deft_tensor *wg, void *wg_out,
                                           cudaStream_t st) {
    typedef typename deft_ty<T>::C A;
    constexpr int V = 16 / sizeof(T);
    const deft_ln_bwd<T, TD> k = deft_ln_bwd_of<T, TD>(n, out, in, residual);
    const int64_t per_lane = (k.c + 32 * V - 1) / (32 * V), parts = deft_layer_norm_parts(k.rows);
    bool fused = !deft_debug(DEFT_DEBUG_LN_REFERENCE) && per_lane <= 8 && deft_ln_bwd_vec(k);
    if constexpr (std::is_same<T, double>::value) fused = false;
    /* The two kernels, the sums first: the add's value may take over the residual's buffer (passes/schedule.c), and
     * the residual may be dy itself (h = s + layer_norm(s)), which dx's kernel overwrites row by row after reading
     * it; the fused kernel reads a row whole before it stores any of it. */
    if (!fused) {
        const deft_status s = deft_cuda_layer_norm_sums(wg, wg_out, in, st);
        return s == DEFT_OK ? deft_ln_grad_launch<T, TD>(n, out, in, residual, st) : s;
    }
    if constexpr (!std::is_same<T, double>::value) {
        A *part = (A *)((char *)wg_out + deft_node_extra_offset(wg));
        deft_ln_grad_sums_vec<T, TD, V>(k, part, parts, (k.rows + parts - 1) / parts, per_lane, st);
        const deft_status s = deft_cuda_check_launch(n, "layer_norm_grad with its weight gradient");
        if (s != DEFT_OK) return s;
    }
    return deft_cuda_layer_norm_sums_total(wg, wg_out, st);
}

extern "C" deft_status deft_cuda_layer_norm_grad_sums(const deft_tensor *n, void *out, const void *const *in,
                                                      const void *residual, const deft_tensor *wg, void *wg_out,
                                                      void *stream) {
    if (n->op != DEFT_OP_LAYER_NORM_GRAD || wg->op != DEFT_OP_LAYER_NORM_WEIGHT_GRAD || wg->nsrc < 3 ||
        n->nsrc < 3 || wg->src[0] != n->src[0] || wg->src[1] != n->src[1] || wg->src[2] != n->src[2])
        return deft_set_error(DEFT_ERR_INVALID, "cuda layer_norm_grad with its weight gradient: %s (%s) and %s (%s) "
                              "do not read the same dy, x and statistics", n->name, deft_op_name(n->op), wg->name,
                              deft_op_name(wg->op));
    if (deft_shape_numel(n->ndim, n->shape) == 0) {   /* no rows: the weight gradient's zeros alone */
        if (deft_shape_numel(wg->ndim, wg->shape) == 0) return DEFT_OK;
        return deft_cuda_layer_norm_sums(wg, wg_out, in, (cudaStream_t)stream);
    }
    return deft_ln_with_pair(n, n->dtype, n->src[0]->dtype, [&](auto tx, auto td) -> deft_status {
        return deft_ln_grad_sums_typed<typename decltype(tx)::type, typename decltype(td)::type>(
            n, out, in, residual, wg, wg_out, (cudaStream_t)stream);
    });
}
