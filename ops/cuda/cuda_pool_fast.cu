/* Pooling's fast kernels on CUDA, for tensors whose indices fit 32 bits (the plain kernels in cuda_pool.cu take the
 * rest, and every tensor under DEFT_DEBUG_POOL_REFERENCE). Same walks and the same order of additions as the plain ones
 * (so the same bits): forward one thread per output, backward one thread per input gathering from the windows that
 * cover it, no atomics. What makes them fast: index arithmetic in 32 bits (the plain kernels' 64-bit divisions and
 * window recomputations dominated); in NCHW, max pooling's backward no longer finds each covering window's maximum:
 * it asks whether this input is the one the window chose, which most inputs answer after a load or two (a window
 * chooses its first maximum in row-major order, or its last NaN, as the CPU does); in NHWC it takes 16 bytes of
 * channels per thread and finds each covering window's choice for all of them at once, every lane of a warp doing
 * the same loads (asking per channel let the slowest lane set the pace of the warp). */
#include "cuda_pool.cuh"
#include "cuda_tuning.h"

typedef deft_pool_span<int> deft_pool_win32;

struct deft_pool_geom32 {
    int N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw;
    int adaptive, max, include_pad, nhwc;
};

/* Calls f(oh, ow, wh, ww) for every window that covers input (ih, iw), rows then columns in increasing order: the
 * order of the plain kernels' additions. */
template <class F>
__device__ __forceinline__ void deft_pool32_each_covering(const deft_pool_geom32 &g, int ih, int iw, F f) {
    int oh0, oh1, ow0, ow1;
    deft_pool_covering<int>(g, 0, ih, &oh0, &oh1);
    deft_pool_covering<int>(g, 1, iw, &ow0, &ow1);
    for (int oh = oh0; oh <= oh1; oh++) {
        const deft_pool_win32 wh = deft_pool_window<int>(g, 0, oh);
        if (ih < wh.lo || ih >= wh.hi) continue;
        for (int ow = ow0; ow <= ow1; ow++) {
            const deft_pool_win32 ww = deft_pool_window<int>(g, 1, ow);
            if (iw >= ww.lo && iw < ww.hi) f(oh, ow, wh, ww);
        }
    }
}

/* Offset of element (n, c, h, w) of an [N, C, Hn, Wn] tensor in the layout. */
__device__ __forceinline__ unsigned deft_pool32_at(const deft_pool_geom32 &g, int n, int c, int h, int w, int Hn,
                                                   int Wn) {
    return g.nhwc ? (((unsigned)n * Hn + h) * Wn + w) * g.C + c : (((unsigned)n * g.C + c) * Hn + h) * Wn + w;
}

__device__ __forceinline__ void deft_pool32_coords(const deft_pool_geom32 &g, unsigned i, int Hn, int Wn, int *n,
                                                   int *c, int *h, int *w) {
    if (g.nhwc) {
        *c = i % g.C, i /= g.C;
        *w = i % Wn, i /= Wn;
        *h = i % Hn, *n = i / Hn;
    } else {
        *w = i % Wn, i /= Wn;
        *h = i % Hn, i /= Hn;
        *c = i % g.C, *n = i / g.C;
    }
}

template <class T>
__global__ void deft_pool_fast_forward_kernel(deft_pool_geom32 g, const T *x, T *y, unsigned total) {
    typedef typename deft_ty<T>::C C;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int n, c, oh, ow;
        deft_pool32_coords(g, i, g.OH, g.OW, &n, &c, &oh, &ow);
        const deft_pool_win32 wh = deft_pool_window<int>(g, 0, oh), ww = deft_pool_window<int>(g, 1, ow);
        C v = g.max ? -(C)INFINITY : (C)0;
        for (int ih = wh.lo; ih < wh.hi; ih++) {
            for (int iw = ww.lo; iw < ww.hi; iw++) {
                const C e = deft_ty<T>::load(x[deft_pool32_at(g, n, c, ih, iw, g.H, g.W)]);
                if (!g.max) v += e;
                else if (e > v || e != e) v = e;
            }
        }
        if (!g.max) v /= (C)(wh.count * ww.count);
        y[i] = deft_ty<T>::store(v);
    }
}

/* Whether the window (wh, ww) chose input (ih, iw), whose value is v: with no NaN in the window, every element
 * before it is smaller and none after it larger; a NaN is chosen when no NaN follows it. */
template <class T>
__device__ __forceinline__ bool deft_pool32_chose(const deft_pool_geom32 &g, const T *x, int n, int c,
                                                  deft_pool_win32 wh, deft_pool_win32 ww, int ih, int iw,
                                                  typename deft_ty<T>::C v) {
    typedef typename deft_ty<T>::C C;
    const bool nan = v != v;
    for (int h = wh.lo; h < wh.hi; h++) {
        for (int w = ww.lo; w < ww.hi; w++) {
            const bool before = h < ih || (h == ih && w < iw);
            if (h == ih && w == iw) continue;
            if (nan && before) continue;
            const C e = deft_ty<T>::load(x[deft_pool32_at(g, n, c, h, w, g.H, g.W)]);
            if (nan ? e != e : (before ? !(e < v) : !(e <= v))) return false;
        }
    }
    return true;
}

template <class T>
__global__ void deft_pool_fast_backward_kernel(deft_pool_geom32 g, const T *dy, const T *x, T *dx, unsigned total) {
    typedef typename deft_ty<T>::C C;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int n, c, ih, iw;
        deft_pool32_coords(g, i, g.H, g.W, &n, &c, &ih, &iw);
        const C v = g.max ? deft_ty<T>::load(x[i]) : (C)0;
        C acc = 0;
        deft_pool32_each_covering(g, ih, iw, [&](int oh, int ow, deft_pool_win32 wh, deft_pool_win32 ww) {
            const C d = deft_ty<T>::load(dy[deft_pool32_at(g, n, c, oh, ow, g.OH, g.OW)]);
            if (!g.max) acc += d / (C)(wh.count * ww.count);
            else if (deft_pool32_chose(g, x, n, c, wh, ww, ih, iw, v)) acc += d;
        });
        dx[i] = deft_ty<T>::store(acc);
    }
}

/* The choice of window (wh, ww) of image n for channels [c, c + V), as the plain kernel makes it (the first maximum
 * in row-major order, or the last NaN), each as h W + w: every element is read, with no early exit, so a warp's lanes
 * stay together. */
template <class T, int V>
__device__ __forceinline__ void deft_pool_choose(const deft_pool_geom32 &g, const T *x, int n, int c,
                                                 deft_pool_win32 wh, deft_pool_win32 ww, int (&at)[V]) {
    typedef typename deft_ty<T>::C C;
    C best[V];
#pragma unroll
    for (int v = 0; v < V; v++) best[v] = -(C)INFINITY, at[v] = wh.lo * g.W + ww.lo;
    for (int h = wh.lo; h < wh.hi; h++) {
        for (int w = ww.lo; w < ww.hi; w++) {
            const unsigned at_x = deft_pool32_at(g, n, c, h, w, g.H, g.W);
            const deft_vec<T, V> e = *reinterpret_cast<const deft_vec<T, V> *>(x + at_x);
#pragma unroll
            for (int v = 0; v < V; v++) {
                const C ev = deft_ty<T>::load(e.e[v]);
                if (ev > best[v] || ev != ev) best[v] = ev, at[v] = h * g.W + w;
            }
        }
    }
}

/* dx of input (ih, iw) of image n, channels [c, c + V): the sum, over the windows covering it in the plain kernel's
 * order, of dy where the window's choice (choose(oh, ow, wh, ww, at)) is this input: the same additions in the same
 * order as the plain kernel, so the same bits. */
template <class T, int V, class Choose>
__device__ __forceinline__ void deft_pool_gather_nhwc(const deft_pool_geom32 &g, const T *dy, T *dx, int n, int c,
                                                      int ih, int iw, Choose choose) {
    typedef typename deft_ty<T>::C C;
    const int self = ih * g.W + iw;
    C acc[V];
#pragma unroll
    for (int v = 0; v < V; v++) acc[v] = 0;
    deft_pool32_each_covering(g, ih, iw, [&](int oh, int ow, deft_pool_win32 wh, deft_pool_win32 ww) {
        int at[V];
        choose(oh, ow, wh, ww, at);
        const deft_vec<T, V> d =
            *reinterpret_cast<const deft_vec<T, V> *>(dy + deft_pool32_at(g, n, c, oh, ow, g.OH, g.OW));
#pragma unroll
        for (int v = 0; v < V; v++)
            if (at[v] == self) acc[v] += deft_ty<T>::load(d.e[v]);
    });
    deft_vec<T, V> out;
#pragma unroll
    for (int v = 0; v < V; v++) out.e[v] = deft_ty<T>::store(acc[v]);
    *reinterpret_cast<deft_vec<T, V> *>(dx + deft_pool32_at(g, n, c, ih, iw, g.H, g.W)) = out;
}

/* Max pooling's backward in NHWC, V channels per thread (C / V threads per input position, neighbours in c, so a warp
 * reads whole rows of channels): each covering window's choice is found for each input it covers. */
template <class T, int V>
__global__ void deft_pool_fast_max_backward_nhwc_kernel(deft_pool_geom32 g, const T *dy, const T *x, T *dx,
                                                        unsigned total) {
    const unsigned groups = (unsigned)(g.C / V);
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const unsigned r = i / groups, rh = r / g.W;
        const int c = (int)(i - r * groups) * V, iw = (int)(r - rh * g.W), ih = (int)(rh % g.H), n = (int)(rh / g.H);
        deft_pool_gather_nhwc<T, V>(g, dy, dx, n, c, ih, iw,
                                    [&](int, int, deft_pool_win32 wh, deft_pool_win32 ww, int (&at)[V]) {
                                        deft_pool_choose<T, V>(g, x, n, c, wh, ww, at);
                                    });
    }
}

/* ---- Max pooling's backward in NHWC by tiles of windows ----
 * The kernel above finds each covering window's choice once per input it covers: with ResNet's 3x3 windows at
 * stride 2, nine loads four times over for most inputs. Here a block takes the inputs of a tile of DEFT_POOL_TILE x
 * DEFT_POOL_TILE windows of one image (the rows and columns from its first window's start to the next tile's; the
 * first and last tiles reach the edges, so the tiles share out every input), first finds the choice of every window
 * that covers any of them (deft_pool_choose once per window and channel, kept in shared memory), then gathers each
 * input's dx from them (deft_pool_gather_nhwc): the kernel above's search and additions, so the same bits.
 * DEFT_POOL_TILE is cuda_tuning.h's. */
#define DEFT_POOL_TILE_SHARED (40 * 1024)   /* bytes of choices a block may keep */

struct deft_pool_tile {
    int ih0, ih1, iw0, iw1;   /* the inputs [ih0, ih1) x [iw0, iw1) */
    int oh0, oh1, ow0, ow1;   /* the windows covering them, [oh0, oh1] x [ow0, ow1] (empty when oh1 < oh0) */
};

/* deft_pool32_covering for fixed windows, on the host too. */
__host__ __device__ inline void deft_pool_cover(int i, int k, int s, int p, int out_len, int *first, int *last) {
    const int num = i + p - k + 1;
    const int a = num <= 0 ? 0 : (num + s - 1) / s, b = (i + p) / s;
    *first = a < 0 ? 0 : a;
    *last = b > out_len - 1 ? out_len - 1 : b;
}

/* Inputs [*i0, *i1) of tile t of `tiles` along an axis, and the windows [*o0, *o1] covering them. */
__host__ __device__ inline void deft_pool_tile_axis(int t, int tiles, int in_len, int out_len, int k, int s, int p,
                                                    int *i0, int *i1, int *o0, int *o1) {
    int a = t == 0 ? 0 : t * DEFT_POOL_TILE * s - p, b = t == tiles - 1 ? in_len : (t + 1) * DEFT_POOL_TILE * s - p;
    a = a < 0 ? 0 : a > in_len ? in_len : a;
    b = b < a ? a : b > in_len ? in_len : b;
    *i0 = a, *i1 = b;
    *o0 = 0, *o1 = -1;
    if (a >= b) return;
    int unused;
    deft_pool_cover(a, k, s, p, out_len, o0, &unused);
    deft_pool_cover(b - 1, k, s, p, out_len, &unused, o1);
}

__host__ __device__ inline deft_pool_tile deft_pool_tile_of(const deft_pool_geom32 &g, int ty, int tx, int tiles_h,
                                                            int tiles_w) {
    deft_pool_tile t;
    deft_pool_tile_axis(ty, tiles_h, g.H, g.OH, g.kh, g.sh, g.ph, &t.ih0, &t.ih1, &t.oh0, &t.oh1);
    deft_pool_tile_axis(tx, tiles_w, g.W, g.OW, g.kw, g.sw, g.pw, &t.iw0, &t.iw1, &t.ow0, &t.ow1);
    return t;
}

/* Grid (tiles_h tiles_w, N); dynamic shared memory: an int per channel of every window of the largest tile. */
template <class T, int V>
__global__ void deft_pool_tiled_max_backward_nhwc_kernel(deft_pool_geom32 g, const T *dy, const T *x, T *dx,
                                                         int tiles_h, int tiles_w) {
    extern __shared__ int deft_pool_choice[];
    const int n = (int)blockIdx.y, groups = g.C / V;
    const deft_pool_tile t = deft_pool_tile_of(g, (int)blockIdx.x / tiles_w, (int)blockIdx.x % tiles_w, tiles_h,
                                               tiles_w);
    const int nh = t.oh1 - t.oh0 + 1, nw = t.ow1 - t.ow0 + 1;
    for (int k = (int)threadIdx.x; nh > 0 && nw > 0 && k < nh * nw * groups; k += (int)blockDim.x) {
        const int c = (k % groups) * V, win = k / groups, oh = t.oh0 + win / nw, ow = t.ow0 + win % nw;
        int at[V];
        deft_pool_choose<T, V>(g, x, n, c, deft_pool_window<int>(g, 0, oh), deft_pool_window<int>(g, 1, ow), at);
#pragma unroll
        for (int v = 0; v < V; v++) deft_pool_choice[win * g.C + c + v] = at[v];
    }
    __syncthreads();
    const int cols = t.iw1 - t.iw0, inputs = (t.ih1 - t.ih0) * cols;
    for (int k = (int)threadIdx.x; k < inputs * groups; k += (int)blockDim.x) {
        const int c = (k % groups) * V, at = k / groups;
        deft_pool_gather_nhwc<T, V>(g, dy, dx, n, c, t.ih0 + at / cols, t.iw0 + at % cols,
                                    [&](int oh, int ow, deft_pool_win32, deft_pool_win32, int (&chosen)[V]) {
                                        const int *s = deft_pool_choice + ((oh - t.oh0) * nw + (ow - t.ow0)) * g.C + c;
#pragma unroll
                                        for (int v = 0; v < V; v++) chosen[v] = s[v];
                                    });
    }
}

/* The shared bytes the tiled kernel needs (0 when it does not take the geometry: adaptive windows, no window,
 * more images than a grid's second axis, or more choices than DEFT_POOL_TILE_SHARED). */
static size_t deft_pool_tiled_shared(const deft_pool_geom32 &g, int *tiles_h, int *tiles_w) {
    if (g.adaptive || g.OH < 1 || g.OW < 1 || g.N > 65535) return 0;
    *tiles_h = (g.OH + DEFT_POOL_TILE - 1) / DEFT_POOL_TILE, *tiles_w = (g.OW + DEFT_POOL_TILE - 1) / DEFT_POOL_TILE;
    if ((int64_t)*tiles_h * *tiles_w > INT32_MAX) return 0;
    int most_h = 0, most_w = 0;
    for (int ty = 0; ty < *tiles_h; ty++) {
        const deft_pool_tile t = deft_pool_tile_of(g, ty, 0, *tiles_h, 1);
        if (t.oh1 - t.oh0 + 1 > most_h) most_h = t.oh1 - t.oh0 + 1;
    }
    for (int tx = 0; tx < *tiles_w; tx++) {
        const deft_pool_tile t = deft_pool_tile_of(g, 0, tx, 1, *tiles_w);
        if (t.ow1 - t.ow0 + 1 > most_w) most_w = t.ow1 - t.ow0 + 1;
    }
    const size_t bytes = (size_t)most_h * (size_t)most_w * (size_t)g.C * sizeof(int);   /* > 0: OH, OW, C >= 1 */
    return bytes <= DEFT_POOL_TILE_SHARED ? bytes : 0;
}

static bool deft_pool_fits32(const deft_pool_geom &g) {
    const int64_t lim = INT32_MAX;
    /* The window's options are the user's int64s: each must narrow alone, and bounding them first keeps the sums and
     * products below far from int64's limit. */
    if (g.kh >= lim || g.kw >= lim || g.ph >= lim || g.pw >= lim || g.sh >= lim || g.sw >= lim) return false;
    const int64_t xs = g.N * g.C * g.H * g.W, ys = g.N * g.C * g.OH * g.OW;
    const int64_t pads = (g.H + g.W + 2 * (g.ph + g.pw + g.kh + g.kw)) * (g.OH + g.OW + 1);
    return xs < lim && ys < lim && pads < lim && g.kh * g.kw < lim;
}

static deft_pool_geom32 deft_pool_narrow(const deft_pool_geom &g) {
    deft_pool_geom32 s;
    s.N = (int)g.N, s.C = (int)g.C, s.H = (int)g.H, s.W = (int)g.W, s.OH = (int)g.OH, s.OW = (int)g.OW;
    s.kh = (int)g.kh, s.kw = (int)g.kw, s.sh = (int)g.sh, s.sw = (int)g.sw, s.ph = (int)g.ph, s.pw = (int)g.pw;
    s.adaptive = g.adaptive, s.max = g.max, s.include_pad = g.include_pad, s.nhwc = g.nhwc;
    return s;
}

/* Max pooling's backward in NHWC: by tiles (above) where its choices fit shared memory, else 16 bytes of channels
 * per thread where C divides into them and the tensors are aligned, one channel otherwise. */
template <class T>
static deft_status deft_pool_max_backward_nhwc(const deft_tensor *n, const deft_pool_geom32 &s, const T *dy,
                                               const T *x, T *dx, cudaStream_t st) {
    constexpr int V = 16 / (int)sizeof(T);
    const bool vec = s.C % V == 0 && deft_is_aligned(dy, 16) && deft_is_aligned(x, 16) && deft_is_aligned(dx, 16);
    const unsigned total = (unsigned)((int64_t)s.N * s.H * s.W * s.C / (vec ? V : 1));
    const unsigned blocks = deft_cuda_blocks(total, DEFT_CUDA_THREADS);
    int tiles_h = 0, tiles_w = 0;
    const size_t shared = vec ? deft_pool_tiled_shared(s, &tiles_h, &tiles_w) : 0;
    if (shared) {
        deft_pool_tiled_max_backward_nhwc_kernel<T, V>
            <<<dim3((unsigned)(tiles_h * tiles_w), (unsigned)s.N), DEFT_CUDA_THREADS, shared, st>>>(s, dy, x, dx,
                                                                                                 tiles_h, tiles_w);
    } else if (vec) {
        deft_pool_fast_max_backward_nhwc_kernel<T, V><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(s, dy, x, dx, total);
    } else {
        deft_pool_fast_max_backward_nhwc_kernel<T, 1><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(s, dy, x, dx, total);
    }
    return deft_cuda_check_launch(n, "max pool2d backward (fast, NHWC)");
}

deft_status deft_cuda_pool2d_fast(const deft_tensor *n, const deft_pool_geom &g, bool grad, void *out,
                                  const void *const *in, cudaStream_t st, bool *done) {
    *done = false;
    if (!deft_pool_fits32(g)) return DEFT_OK;
    const deft_pool_geom32 s = deft_pool_narrow(g);
    const unsigned total = (unsigned)deft_shape_numel(n->ndim, n->shape);
    *done = true;
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        const unsigned blocks = deft_cuda_blocks(total, DEFT_CUDA_THREADS);
        if (!grad) {
            deft_pool_fast_forward_kernel<T><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(s, (const T *)in[0], (T *)out,
                                                                                  total);
            return deft_cuda_check_launch(n, "pool2d forward (fast)");
        }
        const T *x = g.max ? (const T *)in[1] : NULL;
        if (g.max && g.nhwc) return deft_pool_max_backward_nhwc<T>(n, s, (const T *)in[0], x, (T *)out, st);
        deft_pool_fast_backward_kernel<T><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(s, (const T *)in[0], x, (T *)out,
                                                                               total);
        return deft_cuda_check_launch(n, "pool2d backward (fast)");
    });
}
