/* Layout changes that need a copy: permute, strided slices and concat. They move elements without looking at them,
 * so they work by element size (2, 4 or 8 bytes) and serve every dtype.
 *
 * Two paths. The plain kernels walk one element per thread with 64-bit divisions (the reference, and what runs under
 * the SHAPE_REFERENCE debug knob). Where the innermost dim stays innermost (GPT-2's [B, T, H, D] -> [B, H, T, D]
 * moves rows of D elements whole), the row kernel moves rows in vectors of up to 16 bytes, finding a vector's row
 * and the row's input offset by multiply-high divisions (cuda_fastdiv.cuh). Where the innermost dim moves (a
 * transpose), a tiled kernel reads and writes through shared memory so that both sides stay coalesced. */
#include <string.h>

#include <type_traits>

#include "config.h"
#include "cuda_common.cuh"
#include "cuda_fastdiv.cuh"

/* ---- row copies: `rows` rows of W vectors; output row r at r * out_row + out_base, input row r at the sum of its
 * index over the outer dims times their strides (all in vectors) ---- */
typedef struct deft_rows_desc {
    int nouter;                          /* outer dims, outermost first; 0 or 1 of them is just the row */
    deft_fastdiv size[DEFT_MAX_DIMS];    /* their sizes (dim 0's is never divided by) */
    int64_t in_st[DEFT_MAX_DIMS];
    deft_fastdiv w;                      /* vectors per row */
    int64_t out_row, out_base;
    uint32_t total;                      /* rows * W */
} deft_rows_desc;

/* x + 0 in the add kernels' arithmetic (p.concat.add_zero): -0 becomes +0 and NaN comes out quiet, as in a sum of
 * zero-padded gradients; plain copies move bits. */
template <class T, bool Z> __device__ __forceinline__ T deft_rows_elem(T x) {
    if constexpr (Z) {
        typedef deft_ty<T> Ty;
        return Ty::store(Ty::load(x) + typename Ty::C(0));
    } else {
        return x;
    }
}

template <class T, int N, bool Z> __global__ void deft_k_rows(T *out, const T *in, deft_rows_desc d) {
    typedef deft_vec<T, N> V;
    for (int64_t i = deft_tid(); i < (int64_t)d.total; i += deft_nthreads()) {
        const uint32_t row = deft_fastdiv_div(d.w, (uint32_t)i), col = (uint32_t)i - row * d.w.d;
        int64_t off = col;
        uint32_t r = row;
        for (int k = d.nouter - 1; k > 0; k--) {
            const uint32_t q = deft_fastdiv_div(d.size[k], r);
            off += (int64_t)(r - q * d.size[k].d) * d.in_st[k];
            r = q;
        }
        if (d.nouter > 0) off += (int64_t)r * d.in_st[0];
        V v = reinterpret_cast<const V *>(in)[off];
#pragma unroll
        for (int u = 0; u < N; u++) v.e[u] = deft_rows_elem<T, Z>(v.e[u]);
        reinterpret_cast<V *>(out)[(int64_t)row * d.out_row + d.out_base + col] = v;
    }
}

/* Up to 16 bytes that divide the row, every stride and offset (bytes, in `spans`) and both pointers. */
static size_t deft_rows_vector(size_t esz, const int64_t *spans, int nspans, const void *a, const void *b) {
    for (size_t v = 16; v > esz; v /= 2) {
        bool ok = deft_is_aligned(a, v) && deft_is_aligned(b, v);
        for (int i = 0; ok && i < nspans; i++) ok = spans[i] % (int64_t)v == 0;
        if (ok) return v;
    }
    return esz;
}

template <class T, int N, bool Z>
static deft_status deft_rows_go(const deft_tensor *n, void *out, const void *in, const deft_rows_desc &d,
                                cudaStream_t st) {
    deft_k_rows<T, N, Z><<<deft_cuda_blocks(d.total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        (T *)out, (const T *)in, d);
    return deft_cuda_check_launch(n, "rows");
}

/* N = vbytes / sizeof(T) elements a vector; widths past 16 bytes never come, and map to 1 so as not to build. */
template <class T, bool Z>
static deft_status deft_rows_width(const deft_tensor *n, void *out, const void *in, const deft_rows_desc &d,
                                   size_t vbytes, cudaStream_t st) {
    constexpr int c2 = 2 * sizeof(T) <= 16 ? 2 : 1, c4 = 4 * sizeof(T) <= 16 ? 4 : 1, c8 = 8 * sizeof(T) <= 16 ? 8 : 1;
    switch (vbytes / sizeof(T)) {
    case 2: return deft_rows_go<T, c2, Z>(n, out, in, d, st);
    case 4: return deft_rows_go<T, c4, Z>(n, out, in, d, st);
    case 8: return deft_rows_go<T, c8, Z>(n, out, in, d, st);
    default: return deft_rows_go<T, 1, Z>(n, out, in, d, st);
    }
}

/* Whether `rows` rows of w vectors fit the 32-bit indices of the row kernel. */
static bool deft_rows_fit(int64_t rows, int64_t w) { return w > 0 && rows > 0 && rows <= (int64_t)UINT32_MAX / w; }

/* Launches the row kernel over d (sizes and strides in elements, converted here to vectors of vbytes). */
static deft_status deft_rows_launch(const deft_tensor *n, void *out, const void *in, deft_rows_desc d,
                                    size_t vbytes, bool add_zero, cudaStream_t st) {
    const size_t esz = deft_dtype_size(n->dtype);
    const int64_t per = (int64_t)(vbytes / esz);
    for (int k = 0; k < d.nouter; k++) d.in_st[k] /= per;
    d.out_row /= per;
    d.out_base /= per;
    if (add_zero && n->dtype != DEFT_I32)   /* integers: x + 0 is x */
        return deft_cuda_with_dtype(n->dtype, [&](auto tag) -> deft_status {
            return deft_rows_width<typename decltype(tag)::type, true>(n, out, in, d, vbytes, st);
        });
    return deft_with_elem_size(esz, [&](auto tag) -> deft_status {
        return deft_rows_width<typename decltype(tag)::type, false>(n, out, in, d, vbytes, st);
    });
}

/* The row kernel's description of the strided view s (coalesced, innermost stride 1) copied into contiguous out:
 * false when the sizes pass its 32-bit indices (the caller then takes the plain kernel). */
static bool deft_rows_plan_strided(size_t esz, void *out, const void *in, const deft_cuda_strides &s,
                                   deft_rows_desc *d, size_t *vb) {
    const int last = s.ndim - 1;
    int64_t spans[DEFT_MAX_DIMS];
    spans[0] = s.shape[last] * (int64_t)esz;
    for (int k = 0; k < last; k++) spans[k + 1] = s.st[0][k] * (int64_t)esz;
    *vb = deft_rows_vector(esz, spans, s.ndim, out, in);
    const int64_t w = spans[0] / (int64_t)*vb, rows = deft_shape_numel(last, s.shape);
    if (!deft_rows_fit(rows, w)) return false;
    memset(d, 0, sizeof *d);
    d->nouter = last;
    for (int k = 0; k < last; k++) {
        d->size[k] = deft_fastdiv_make((uint32_t)s.shape[k]);
        d->in_st[k] = s.st[0][k];
    }
    d->w = deft_fastdiv_make((uint32_t)w);
    d->out_row = s.shape[last];
    d->total = (uint32_t)(rows * w);
    return true;
}

/* ---- transposes: the innermost output dim walks input stride sl != 1 while input dim j is the contiguous one.
 * A block moves a 32 x 32 tile of (j, last) through shared memory: it reads along j and writes along last, both
 * coalesced. The other dims are a batch, walked by blockIdx.z. ---- */
#define DEFT_TILE 32
#define DEFT_TILE_ROWS 8

typedef struct deft_tile_desc {
    int nbatch;
    deft_fastdiv size[DEFT_MAX_DIMS];    /* the batch dims, outermost first */
    int64_t in_st[DEFT_MAX_DIMS], out_st[DEFT_MAX_DIMS];
    uint32_t batch, a, l;                /* batch count, dim j's size, the last dim's size */
    int64_t in_l, out_a;                 /* input stride of the last dim, output stride of dim j */
} deft_tile_desc;

template <class E> __global__ void deft_k_transpose_tile(E *out, const E *in, deft_tile_desc d) {
    __shared__ E tile[DEFT_TILE][DEFT_TILE + 1];
    const uint32_t a0 = blockIdx.y * DEFT_TILE, l0 = blockIdx.x * DEFT_TILE;
    for (uint32_t b = blockIdx.z; b < d.batch; b += gridDim.z) {
        int64_t ib = 0, ob = 0;
        uint32_t r = b;
        for (int k = d.nbatch - 1; k >= 0; k--) {
            const uint32_t q = k > 0 ? deft_fastdiv_div(d.size[k], r) : 0, idx = r - q * d.size[k].d;
            ib += (int64_t)idx * d.in_st[k];
            ob += (int64_t)idx * d.out_st[k];
            r = q;
        }
        const uint32_t a = a0 + threadIdx.x;
        for (uint32_t y = threadIdx.y; y < DEFT_TILE; y += DEFT_TILE_ROWS)
            if (a < d.a && l0 + y < d.l) tile[y][threadIdx.x] = in[ib + a + (int64_t)(l0 + y) * d.in_l];
        __syncthreads();
        const uint32_t l = l0 + threadIdx.x;
        for (uint32_t y = threadIdx.y; y < DEFT_TILE; y += DEFT_TILE_ROWS)
            if (l < d.l && a0 + y < d.a) out[ob + (int64_t)(a0 + y) * d.out_a + l] = tile[threadIdx.x][y];
        __syncthreads();
    }
}

/* The tile kernel's description of the coalesced view s: false when it does not pay (no contiguous input dim, or
 * short sides) or the sizes pass its 32-bit indices. */
static bool deft_tile_plan(const deft_cuda_strides &s, deft_tile_desc *d) {
    const int last = s.ndim - 1;
    int j = -1;
    for (int k = 0; k < last; k++)
        if (s.st[0][k] == 1) j = k;
    if (j < 0 || s.shape[j] < 16 || s.shape[last] < 16) return false;
    int64_t ostr[DEFT_MAX_DIMS];
    deft_shape_strides(s.ndim, s.shape, ostr);
    const int64_t batch = deft_shape_numel(s.ndim, s.shape) / (s.shape[j] * s.shape[last]);
    if (batch > (int64_t)UINT32_MAX || s.shape[last] > (int64_t)UINT32_MAX - DEFT_TILE ||
        (s.shape[j] + DEFT_TILE - 1) / DEFT_TILE > 65535)
        return false;
    memset(d, 0, sizeof *d);
    for (int k = 0; k < last; k++) {
        if (k == j) continue;
        d->size[d->nbatch] = deft_fastdiv_make((uint32_t)s.shape[k]);
        d->in_st[d->nbatch] = s.st[0][k];
        d->out_st[d->nbatch++] = ostr[k];
    }
    d->batch = (uint32_t)batch;
    d->a = (uint32_t)s.shape[j];
    d->l = (uint32_t)s.shape[last];
    d->in_l = s.st[0][last];
    d->out_a = ostr[j];
    return true;
}

static deft_status deft_tile_launch(const deft_tensor *n, void *out, const void *in, const deft_tile_desc &d,
                                    cudaStream_t st) {
    const dim3 grid((d.l + DEFT_TILE - 1) / DEFT_TILE, (d.a + DEFT_TILE - 1) / DEFT_TILE,
                    d.batch < 65535 ? d.batch : 65535);
    return deft_with_elem_size(deft_dtype_size(n->dtype), [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type E;
        deft_k_transpose_tile<E><<<grid, dim3(DEFT_TILE, DEFT_TILE_ROWS), 0, st>>>((E *)out, (const E *)in, d);
        return deft_cuda_check_launch(n, "transpose tile");
    });
}

/* out (contiguous over s.shape) [i] = in[base + sum of index * s.st[0]]. */
template <class E> __global__ void deft_k_gather(E *o, const E *in, int64_t n, deft_cuda_strides s) {
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        int64_t oi, unused;
        deft_cuda_offsets(s, i, &oi, &unused);
        o[i] = in[oi];
    }
}

/* Copies the strided view (shape, strides in elements) of `in` into contiguous `out`. */
static deft_status deft_strided_copy(const deft_tensor *n, void *out, const void *in, int ndim, const int64_t *shape,
                                     const int64_t *strides, cudaStream_t st) {
    const int64_t total = deft_shape_numel(ndim, shape);
    if (total == 0) return DEFT_OK;
    deft_cuda_strides s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    memcpy(s.shape, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(s.st[0], strides, sizeof(int64_t) * (size_t)ndim);
    deft_cuda_coalesce(&s, 1);
    const size_t esz = deft_dtype_size(n->dtype);
    if (s.ndim == 0 || (s.ndim == 1 && s.st[0][0] == 1)) {
        /* The view is one contiguous run after all. */
        cudaError_t e = cudaMemcpyAsync(out, in, (size_t)total * esz, cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess) return DEFT_OK;
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: copy failed: %s", deft_op_name(n->op),
                              cudaGetErrorString(e));
    }
    if (!deft_debug(DEFT_DEBUG_SHAPE_REFERENCE)) {
        deft_rows_desc rd;
        deft_tile_desc td;
        size_t vb;
        if (s.st[0][s.ndim - 1] == 1 && deft_rows_plan_strided(esz, out, in, s, &rd, &vb))
            return deft_rows_launch(n, out, in, rd, vb, false, st);
        if (s.st[0][s.ndim - 1] != 1 && deft_tile_plan(s, &td)) return deft_tile_launch(n, out, in, td, st);
    }
    return deft_with_elem_size(esz, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type E;
        deft_k_gather<E><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (E *)out, (const E *)in, total, s);
        return deft_cuda_check_launch(n, "gather");
    });
}

deft_status deft_cuda_permute(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    const deft_tensor *src = n->src[0];
    if (src->ndim != n->ndim)
        return deft_set_error(DEFT_ERR_SHAPE, "permute: input rank %d against output rank %d", src->ndim, n->ndim);
    int64_t s[DEFT_MAX_DIMS], istr[DEFT_MAX_DIMS];
    deft_shape_strides(src->ndim, src->shape, s);
    /* Output dim i walks input dim perm[i]. */
    for (int i = 0; i < n->ndim; i++) {
        const int p = n->p.perm[i];
        if (p < 0 || p >= src->ndim)
            return deft_set_error(DEFT_ERR_SHAPE, "permute: perm[%d] = %d out of range for rank %d", i, p, src->ndim);
        istr[i] = s[p];
    }
    return deft_strided_copy(n, out, a, n->ndim, n->shape, istr, st);
}

deft_status deft_cuda_slice(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    const deft_tensor *src = n->src[0];
    const int ax = n->p.slice.axis;
    if (src->ndim != n->ndim || ax < 0 || ax >= n->ndim || n->p.slice.step <= 0 || n->p.slice.start < 0)
        return deft_set_error(DEFT_ERR_SHAPE, "slice: axis %d, start %lld, step %lld do not fit rank %d",
                              ax, (long long)n->p.slice.start, (long long)n->p.slice.step, src->ndim);
    int64_t istr[DEFT_MAX_DIMS];
    deft_shape_strides(src->ndim, src->shape, istr);
    const int64_t base = n->p.slice.start * istr[ax];
    istr[ax] *= n->p.slice.step;
    const char *from = (const char *)a + (size_t)base * deft_dtype_size(n->dtype);
    return deft_strided_copy(n, out, from, n->ndim, n->shape, istr, st);
}

/* One input of a concat: [outer, len, inner] written into the output's [outer, total_len, inner] at column
 * `at` (units of inner blocks). */
template <class E, bool Z>
__global__ void deft_k_concat_part(E *o, const E *in, int64_t n, int64_t len_inner, int64_t total_inner,
                                   int64_t at_inner) {
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        const int64_t row = i / len_inner, col = i - row * len_inner;
        o[row * total_inner + at_inner + col] = deft_rows_elem<E, Z>(in[i]);
    }
}

/* f(tag, zero): the dtype's own type when the concat adds zero (p.concat.add_zero, float dtypes), else the unsigned
 * type of its size. */
template <class F> static deft_status deft_concat_types(const deft_tensor *n, F f) {
    if (n->p.concat.add_zero && n->dtype != DEFT_I32)
        return deft_cuda_with_dtype(n->dtype, [&](auto tag) { return f(tag, std::true_type()); });
    return deft_with_elem_size(deft_dtype_size(n->dtype), [&](auto tag) { return f(tag, std::false_type()); });
}

/* One input as rows of its `len_inner` elements into the output's rows of `total_inner`: false when the sizes pass
 * the row kernel's 32-bit indices. */
static bool deft_concat_rows(const deft_tensor *n, void *out, const void *in, int64_t outer, int64_t len_inner,
                             int64_t total_inner, int64_t at_inner, cudaStream_t st, deft_status *s) {
    const int64_t esz = (int64_t)deft_dtype_size(n->dtype);
    const int64_t spans[3] = {len_inner * esz, total_inner * esz, at_inner * esz};
    const size_t vb = deft_rows_vector((size_t)esz, spans, 3, out, in);
    const int64_t w = spans[0] / (int64_t)vb;
    if (!deft_rows_fit(outer, w)) return false;
    deft_rows_desc d;
    memset(&d, 0, sizeof d);
    d.nouter = 1;
    d.size[0] = deft_fastdiv_make((uint32_t)outer);
    d.in_st[0] = len_inner;
    d.w = deft_fastdiv_make((uint32_t)w);
    d.out_row = total_inner;
    d.out_base = at_inner;
    d.total = (uint32_t)(outer * w);
    *s = deft_rows_launch(n, out, in, d, vb, n->p.concat.add_zero != 0, st);
    return true;
}

static deft_status deft_concat_plain(const deft_tensor *n, void *out, const void *in, int64_t cnt, int64_t len_inner,
                                     int64_t total_inner, int64_t at_inner, cudaStream_t st) {
    return deft_concat_types(n, [&](auto tag, auto zero) -> deft_status {
        typedef typename decltype(tag)::type E;
        deft_k_concat_part<E, decltype(zero)::value><<<deft_cuda_blocks(cnt, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS,
                                                       0, st>>>((E *)out, (const E *)in, cnt, len_inner,
                                                                total_inner, at_inner);
        return deft_cuda_check_launch(n, "concat");
    });
}

deft_status deft_cuda_concat(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    const int ax = n->p.axis;
    if (ax < 0 || ax >= n->ndim)
        return deft_set_error(DEFT_ERR_SHAPE, "concat: axis %d out of range for rank %d", ax, n->ndim);
    const int64_t inner = deft_shape_numel(n->ndim - ax - 1, n->shape + ax + 1);
    const int64_t total_inner = n->shape[ax] * inner, outer = deft_shape_numel(ax, n->shape);
    const bool plain = deft_debug(DEFT_DEBUG_SHAPE_REFERENCE) != 0;
    int64_t at = 0;
    /* One launch per input, all on the same stream: inputs are few, and each launch reads contiguously. */
    for (int k = 0; k < n->nsrc; k++) {
        const deft_tensor *src = n->src[k];
        const int64_t cnt = deft_shape_numel(src->ndim, src->shape);
        if (src->ndim != n->ndim || at + src->shape[ax] > n->shape[ax])
            return deft_set_error(DEFT_ERR_SHAPE, "concat: input %d does not fit the output", k);
        if (cnt > 0) {
            const int64_t len_inner = src->shape[ax] * inner;
            deft_status s = DEFT_OK;
            if (plain || !deft_concat_rows(n, out, in[k], outer, len_inner, total_inner, at * inner, st, &s))
                s = deft_concat_plain(n, out, in[k], cnt, len_inner, total_inner, at * inner, st);
            if (s != DEFT_OK) return s;
        }
        at += src->shape[ax];
    }
    return DEFT_OK;
}
