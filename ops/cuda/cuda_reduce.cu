/* Sum, mean and max over any set of axes, and softmax / log-softmax along one axis.
 *
 * As on the CPU (ops/cpu/cpu_reduce.c, cpu_softmax.c): floating sums and means accumulate in double and i32 in
 * int64 (wrapping on the store); max propagates NaN; softmax subtracts the row maximum before exp and sums the
 * exponentials in double. Each output (or softmax row) is reduced either by one thread, when neighbouring outputs
 * sit next to each other in memory and there are many of them, or by one block with a shared-memory reduction, or,
 * when the outputs are few and their rows long (graph_internal.h's deft_reduce_split_parts), by several blocks each
 * (deft_k_reduce_split): one block summed a [16, 12, 1024, 64] tensor to a scalar in milliseconds. */
#include <string.h>

#include "cuda_block_reduce.cuh"
#include "cuda_common.cuh"
#include "cuda_tuning.h"
#include "fused.h"

/* A fused chain's reduction sums in one block's order and must give the unfused bits: no split at its lengths. */
static_assert(DEFT_REDUCE_SPLIT_MIN_LEN > DEFT_FUSED_MAX_REDUCE_NUMEL, "split reductions must be longer than fused");

/* ---- sum / mean / max ---- */
/* The input regrouped into kept runs and reduced runs (adjacent axes of one kind merge, size-1 axes vanish), each
 * with its input stride; output o is kept index o, in order, which is the output's layout with or without keepdim. */
typedef struct deft_red_plan {
    int nk, nr;
    int64_t ks[DEFT_MAX_DIMS], kst[DEFT_MAX_DIMS];
    int64_t rs[DEFT_MAX_DIMS], rst[DEFT_MAX_DIMS];
    int64_t nout, rtot;
    int inner_kept;   /* the innermost (stride 1) run is kept: neighbouring outputs are neighbours in memory */
} deft_red_plan;

static void deft_red_plan_make(deft_red_plan *p, int ndim, const int64_t *shape, uint32_t mask) {
    int64_t str[DEFT_MAX_DIMS], gs[DEFT_MAX_DIMS], gst[DEFT_MAX_DIMS];
    int gred[DEFT_MAX_DIMS], ng = 0;
    deft_shape_strides(ndim, shape, str);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        int red = (int)((mask >> d) & 1u);
        if (ng > 0 && gred[ng - 1] == red) {
            gs[ng - 1] *= shape[d];
            gst[ng - 1] = str[d];
        } else {
            gs[ng] = shape[d], gst[ng] = str[d], gred[ng] = red;
            ng++;
        }
    }
    memset(p, 0, sizeof *p);
    p->nout = p->rtot = 1;
    for (int g = 0; g < ng; g++) {
        if (gred[g]) {
            p->rs[p->nr] = gs[g], p->rst[p->nr] = gst[g], p->nr++;
            p->rtot *= gs[g];
        } else {
            p->ks[p->nk] = gs[g], p->kst[p->nk] = gst[g], p->nk++;
            p->nout *= gs[g];
        }
    }
    p->inner_kept = ng > 0 && !gred[ng - 1];
}

/* Input offset of index i over n runs of sizes sz and strides st. */
__device__ __forceinline__ int64_t deft_run_offset(const int64_t *sz, const int64_t *st, int n, int64_t i) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        off += (i % sz[d]) * st[d];
        i /= sz[d];
    }
    return off;
}

/* Accumulator: double for the floating dtypes, int64 for i32. */
template <class T> struct deft_red_acc {
    typedef double A;
    static __device__ __forceinline__ double lowest(void) { return -INFINITY; }
};
template <> struct deft_red_acc<int32_t> {
    typedef int64_t A;
    static __device__ __forceinline__ int64_t lowest(void) { return INT64_MIN; }
};

/* Rounded once to the output dtype (double -> float -> half as on the CPU); i32 sums wrap. */
template <class T> __device__ __forceinline__ T deft_red_store(double v) { return deft_ty<T>::from_f64(v); }
template <class T> __device__ __forceinline__ T deft_red_store(int64_t v) { return deft_ty<T>::store(v); }

enum { DEFT_RED_SUM, DEFT_RED_MEAN, DEFT_RED_MAX };

/* One output's partial over reduced indices r0, r0 + dr, ... */
template <class T, int OP>
__device__ typename deft_red_acc<T>::A deft_red_partial(const T *base, const deft_red_plan &p, int64_t r0,
                                                        int64_t dr) {
    typedef typename deft_red_acc<T>::A A;
    A acc = OP == DEFT_RED_MAX ? deft_red_acc<T>::lowest() : A(0);
    for (int64_t r = r0; r < p.rtot; r += dr) {
        A v = (A)deft_ty<T>::load(base[deft_run_offset(p.rs, p.rst, p.nr, r)]);
        acc = OP == DEFT_RED_MAX ? deft_max_nan(v, acc) : acc + v;
    }
    return acc;
}

template <class T, int OP, class A> __device__ __forceinline__ T deft_red_finish(A acc, int64_t rtot) {
    if (OP == DEFT_RED_MEAN) return deft_red_store<T>((double)acc / (double)rtot);
    return deft_red_store<T>(acc);
}

template <class T, int OP> __global__ void deft_k_reduce_thread(T *o, const T *x, deft_red_plan p) {
    for (int64_t i = deft_tid(); i < p.nout; i += deft_nthreads()) {
        const T *base = x + deft_run_offset(p.ks, p.kst, p.nk, i);
        o[i] = deft_red_finish<T, OP>(deft_red_partial<T, OP>(base, p, 0, 1), p.rtot);
    }
}

template <class T, int OP> __global__ void deft_k_reduce_block(T *o, const T *x, deft_red_plan p) {
    for (int64_t i = blockIdx.x; i < p.nout; i += gridDim.x) {
        const T *base = x + deft_run_offset(p.ks, p.kst, p.nk, i);
        typename deft_red_acc<T>::A acc = deft_red_partial<T, OP>(base, p, threadIdx.x, blockDim.x);
        if (OP == DEFT_RED_MAX) acc = deft_block_reduce(acc, deft_r_max());
        else acc = deft_block_reduce(acc, deft_r_sum());
        if (threadIdx.x == 0) o[i] = deft_red_finish<T, OP>(acc, p.rtot);
    }
}

/* ---- few outputs, long rows: two stages ----
 * Block b takes output b / parts and its part b % parts, the reduced indices [k chunk, (k + 1) chunk) of that output
 * (a run of neighbours in memory when the innermost reduced run is long), read by its threads in turn and combined
 * by deft_block_reduce into part[b]; then a block per output combines its parts (thread t parts t, t + B, ..., then
 * the block's tree) and rounds once. Both orders are fixed by the shape, so every run gives the same bits; they
 * differ from the one-block order, so a split sum may differ from an unsplit one in its last bits. The partials are
 * 8 bytes each, past the node's value (graph_internal.h's deft_node_extra_bytes): the kernels allocate nothing. */
template <class T, int OP>
__global__ void deft_k_reduce_split(typename deft_red_acc<T>::A *part, const T *x, deft_red_plan p, int64_t parts,
                                    int64_t chunk) {
    typedef typename deft_red_acc<T>::A A;
    for (int64_t b = blockIdx.x; b < p.nout * parts; b += gridDim.x) {
        const int64_t i = b / parts, lo = (b % parts) * chunk, hi = lo + chunk < p.rtot ? lo + chunk : p.rtot;
        const T *base = x + deft_run_offset(p.ks, p.kst, p.nk, i);
        A acc = OP == DEFT_RED_MAX ? deft_red_acc<T>::lowest() : A(0);
        for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
            const int64_t off = p.nr == 1 ? r * p.rst[0] : deft_run_offset(p.rs, p.rst, p.nr, r);
            const A v = (A)deft_ty<T>::load(base[off]);
            acc = OP == DEFT_RED_MAX ? deft_max_nan(v, acc) : acc + v;
        }
        if (OP == DEFT_RED_MAX) acc = deft_block_reduce(acc, deft_r_max());
        else acc = deft_block_reduce(acc, deft_r_sum());
        if (threadIdx.x == 0) part[b] = acc;
    }
}

template <class T, int OP>
__global__ void deft_k_reduce_join(T *o, const typename deft_red_acc<T>::A *part, int64_t nout, int64_t parts,
                                   int64_t rtot) {
    typedef typename deft_red_acc<T>::A A;
    for (int64_t i = blockIdx.x; i < nout; i += gridDim.x) {
        A acc = OP == DEFT_RED_MAX ? deft_red_acc<T>::lowest() : A(0);
        for (int64_t k = threadIdx.x; k < parts; k += blockDim.x)
            acc = OP == DEFT_RED_MAX ? deft_max_nan(part[i * parts + k], acc) : acc + part[i * parts + k];
        if (OP == DEFT_RED_MAX) acc = deft_block_reduce(acc, deft_r_max());
        else acc = deft_block_reduce(acc, deft_r_sum());
        if (threadIdx.x == 0) o[i] = deft_red_finish<T, OP>(acc, rtot);
    }
}

template <class T, int OP>
static deft_status deft_reduce_split_launch(const deft_tensor *n, T *o, const T *x, const deft_red_plan &p,
                                            int64_t parts, cudaStream_t st) {
    typedef typename deft_red_acc<T>::A A;
    A *part = (A *)((char *)o + deft_node_extra_offset(n));
    const int64_t chunk = (p.rtot + parts - 1) / parts, blocks = p.nout * parts;
    deft_k_reduce_split<T, OP><<<(unsigned)(blocks < DEFT_CUDA_MAX_BLOCKS ? blocks : DEFT_CUDA_MAX_BLOCKS),
                                 DEFT_CUDA_THREADS, 0, st>>>(part, x, p, parts, chunk);
    deft_status s = deft_cuda_check_launch(n, "reduce split");
    if (s != DEFT_OK) return s;
    deft_k_reduce_join<T, OP><<<(unsigned)p.nout, deft_reduce_threads(parts), 0, st>>>(o, part, p.nout, parts, p.rtot);
    return deft_cuda_check_launch(n, "reduce join");
}

/* Sums over the rows of a row-major [R, C] (a bias gradient: the sum of dy over the batch): block b takes columns
 * 32b .. 32b+31, thread (x, y) rows y, y + 32, ... of column 32b + x, so each warp reads 32 neighbouring columns of
 * one row at a time; the 32 partials of a column are then added in row-block order. The one-block-per-column path
 * strided down each column alone, well under the memory's rate on a wide gradient (bench/RESULTS.md, "Figures
 * formerly in code comments"). */
#define DEFT_COLS_TILE 32
template <class T, int OP> __global__ void deft_k_reduce_cols(T *o, const T *x, int64_t R, int64_t C) {
    typedef typename deft_red_acc<T>::A A;
    __shared__ A part[DEFT_COLS_TILE][DEFT_COLS_TILE + 1];
    const int64_t col = (int64_t)blockIdx.x * DEFT_COLS_TILE + threadIdx.x;
    A acc = OP == DEFT_RED_MAX ? deft_red_acc<T>::lowest() : A(0);
    if (col < C)
        for (int64_t r = threadIdx.y; r < R; r += DEFT_COLS_TILE) {
            const A v = (A)deft_ty<T>::load(x[r * C + col]);
            acc = OP == DEFT_RED_MAX ? deft_max_nan(v, acc) : acc + v;
        }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < C) {
        A total = part[0][threadIdx.x];
        for (int k = 1; k < DEFT_COLS_TILE; k++)
            total = OP == DEFT_RED_MAX ? deft_max_nan(part[k][threadIdx.x], total) : total + part[k][threadIdx.x];
        o[col] = deft_red_finish<T, OP>(total, R);
    }
}

/* The plan is a row-major [R, C] reduced over R into C outputs, with enough rows to be worth the tiles. */
static bool deft_red_is_cols(const deft_red_plan &p) {
    return p.nk == 1 && p.nr == 1 && p.kst[0] == 1 && p.rst[0] == p.ks[0] && p.nout >= DEFT_COLS_TILE &&
           p.rtot >= 2 * DEFT_COLS_TILE;
}

template <class T, int OP>
static deft_status deft_reduce_launch(const deft_tensor *n, T *o, const T *x, const deft_red_plan &p,
                                      cudaStream_t st) {
    /* Split where the planner left room for the partials and the innermost reduced run is contiguous (the column
     * tiles take the other layout). */
    const int64_t parts = deft_reduce_split_parts(n);
    if (parts > 1 && p.nout <= DEFT_REDUCE_SPLIT_MAX_OUTPUTS && !p.inner_kept && p.nr >= 1)
        return deft_reduce_split_launch<T, OP>(n, o, x, p, parts, st);
    if (deft_red_is_cols(p)) {
        const unsigned blocks = (unsigned)((p.nout + DEFT_COLS_TILE - 1) / DEFT_COLS_TILE);
        deft_k_reduce_cols<T, OP><<<blocks, dim3(DEFT_COLS_TILE, DEFT_COLS_TILE), 0, st>>>(o, x, p.rtot, p.nout);
        return deft_cuda_check_launch(n, "reduce");
    }
    /* One thread per output when there are enough outputs to fill the GPU and each is short, or when outputs are
     * neighbours in memory; otherwise a block per output, whose threads read consecutive reduced elements. A
     * thread walking a few outputs' elements alone waits on each load in turn: the mean of a 32-element loss that
     * way took longer than the rest of a small training step. The bounds are cuda_tuning.h's. */
    if ((p.rtot <= DEFT_REDUCE_THREAD_MAX_LEN && p.nout >= DEFT_REDUCE_THREAD_MIN_OUTPUTS) ||
        (p.inner_kept && p.nout >= DEFT_REDUCE_KEPT_MIN_OUTPUTS)) {
        deft_k_reduce_thread<T, OP><<<deft_cuda_blocks(p.nout, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(o, x, p);
    } else {
        unsigned blocks = (unsigned)(p.nout < DEFT_CUDA_MAX_BLOCKS ? p.nout : DEFT_CUDA_MAX_BLOCKS);
        deft_k_reduce_block<T, OP><<<blocks, deft_reduce_threads(p.rtot), 0, st>>>(o, x, p);
    }
    return deft_cuda_check_launch(n, "reduce");
}

deft_status deft_cuda_reduce(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    const deft_tensor *src = n->src[0];
    if (n->op == DEFT_OP_MEAN && n->dtype == DEFT_I32)
        return deft_set_error(DEFT_ERR_DTYPE, "%s: dtype i32 is not supported on CUDA", deft_op_name(n->op));
    if (src->ndim < 32 && (n->p.reduce.mask >> src->ndim) != 0)
        return deft_set_error(DEFT_ERR_SHAPE, "%s: reduce mask 0x%x names axes past rank %d", deft_op_name(n->op),
                              (unsigned)n->p.reduce.mask, src->ndim);
    deft_red_plan p;
    deft_red_plan_make(&p, src->ndim, src->shape, n->p.reduce.mask);
    return deft_cuda_with_dtype(n->dtype, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        switch (n->op) {
        case DEFT_OP_SUM: return deft_reduce_launch<T, DEFT_RED_SUM>(n, (T *)out, (const T *)a, p, st);
        case DEFT_OP_MEAN: return deft_reduce_launch<T, DEFT_RED_MEAN>(n, (T *)out, (const T *)a, p, st);
        default: return deft_reduce_launch<T, DEFT_RED_MAX>(n, (T *)out, (const T *)a, p, st);
        }
    });
}

/* ---- softmax / log-softmax: the input viewed as [outer, len, inner] around the axis ---- */
/* One row of len elements `stride` apart, walked by this thread alone or by the whole block (BLOCK). */
template <class T, bool BLOCK>
__device__ void deft_softmax_row(const T *x, T *y, int64_t len, int64_t stride, bool logsm) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C C;
    const int64_t l0 = BLOCK ? threadIdx.x : 0, dl = BLOCK ? blockDim.x : 1;
    C mx = -INFINITY;
    /* NaN wins, so a row holding NaN comes out all NaN as in torch. */
    for (int64_t l = l0; l < len; l += dl) mx = deft_max_nan(Ty::load(x[l * stride]), mx);
    if (BLOCK) mx = deft_block_reduce(mx, deft_r_max());
    double sum = 0.0;
    for (int64_t l = l0; l < len; l += dl) sum += (double)deft_math_exp(Ty::load(x[l * stride]) - mx);
    if (BLOCK) sum = deft_block_reduce(sum, deft_r_sum());
    if (logsm) {
        const C lse = (C)log(sum);
        for (int64_t l = l0; l < len; l += dl) y[l * stride] = Ty::store(Ty::load(x[l * stride]) - mx - lse);
    } else {
        const C inv = (C)(1.0 / sum);
        for (int64_t l = l0; l < len; l += dl)
            y[l * stride] = Ty::store(deft_math_exp(Ty::load(x[l * stride]) - mx) * inv);
    }
}

template <class T>
__global__ void deft_k_softmax_thread(const T *x, T *y, int64_t rows, int64_t len, int64_t inner, bool logsm) {
    for (int64_t r = deft_tid(); r < rows; r += deft_nthreads()) {
        const int64_t base = r / inner * len * inner + r % inner;
        deft_softmax_row<T, false>(x + base, y + base, len, inner, logsm);
    }
}

template <class T>
__global__ void deft_k_softmax_block(const T *x, T *y, int64_t rows, int64_t len, int64_t inner, bool logsm) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t base = r / inner * len * inner + r % inner;
        deft_softmax_row<T, true>(x + base, y + base, len, inner, logsm);
    }
}

deft_status deft_cuda_softmax(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    const deft_tensor *src = n->src[0];
    const int ax = n->p.axis;
    if (ax < 0 || ax >= src->ndim)
        return deft_set_error(DEFT_ERR_SHAPE, "%s: axis %d out of range for rank %d", deft_op_name(n->op), ax,
                              src->ndim);
    const int64_t outer = deft_shape_numel(ax, src->shape), len = src->shape[ax];
    const int64_t inner = deft_shape_numel(src->ndim - ax - 1, src->shape + ax + 1), rows = outer * inner;
    const bool logsm = n->op == DEFT_OP_LOG_SOFTMAX;
    /* Rows along an inner axis: neighbouring threads take neighbouring columns, so their reads coalesce. */
    const bool per_thread = inner >= 32 || len <= 32;
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        if (per_thread) {
            deft_k_softmax_thread<T><<<deft_cuda_blocks(rows, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
                (const T *)a, (T *)out, rows, len, inner, logsm);
        } else {
            unsigned blocks = (unsigned)(rows < DEFT_CUDA_MAX_BLOCKS ? rows : DEFT_CUDA_MAX_BLOCKS);
            deft_k_softmax_block<T><<<blocks, deft_reduce_threads(len), 0, st>>>((const T *)a, (T *)out, rows, len,
                                                                                 inner, logsm);
        }
        return deft_cuda_check_launch(n, "softmax");
    });
}
