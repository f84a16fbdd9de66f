/* Cross-entropy's loss and gradient kernels for long rows, streamed through shared memory (the plain and register
 * kernels, and what the numbers promise: cuda_cross_entropy.cu).
 *
 * Why: GPT-2's bf16 logits [8192, 50304] (824 MB) are far larger than L2. A block per row holding the row in
 * registers (the register kernels) reads it once, but 1024 threads holding 100 KB fill the SM's registers: one row
 * an SM, and while its block reduces and exponentiates nothing is read, so the loss ran at about 1.3 TB/s and the
 * gradient (which also writes 824 MB) at 1.4 TB/s. Here each block stays resident and walks its rows (persistent:
 * the grid fills the SMs once) with two row buffers in shared memory: while it folds row i out of one, the copy of
 * its next row into the other is in flight (cp.async, 16 bytes a thread at a time, past L1), so the memory never
 * waits for the arithmetic. Shared memory is read at several times the memory's rate, so each pass over the row
 * (max, sum, and the gradient's write) reads it from there.
 *
 * The same bits as the plain kernels: thread k of B = deft_ce_row_threads(C) takes groups k, k + B, ..., folds them
 * with the shared folds (cuda_cross_entropy.cuh) and the block reduces in the same tree. The loss's blocks must sum
 * the same rows in the same order into the same partials: the plain kernel's grid of nb blocks gives block b rows
 * b, b + nb, ...; here block p takes the plain blocks (virtual blocks) p, p + P, ... in turn, each one's rows in that
 * order, writing each virtual block's partial and count as the plain block would. The gradient's rows are
 * independent; block p takes rows p, p + P, ....
 *
 * Rows are taken where both buffers fit the device's shared memory (halves up to about 57 000 classes on an H100,
 * f32 half that), every row starts on 16 bytes (C sizeof(T) a multiple of 16, the buffers aligned), and the
 * CE_REFERENCE knob is off. A row is copied whole into a buffer before the gradient overwrites it, so the gradient
 * may still take over the logits' buffer.
 *
 * A pair (the loss and its gradient run as one group, passes/fusion_pairs.c) walks the rows as the loss does and,
 * once a row's maximum and sum are known, adds its loss and writes its gradient from the same buffer: the logits
 * cross the memory once instead of twice, and each row is folded once. */
#include <atomic>

#include "config.h"
#include "cuda_block_reduce.cuh"
#include "cuda_cross_entropy.cuh"
#include "cuda_kernels.h"

/* Where a block's walk stands: virtual block vb, row r. The loss: virtual blocks of nb apart rows (step nb); the
 * gradient: one row each (nvb = step = rows). */
struct deft_ce_walk {
    int64_t vb, r;
};

struct deft_ce_stream_args {
    const void *x;
    void *out;            /* the gradient, or NULL */
    const void *dloss;    /* the gradient's dloss (T or f32), or NULL */
    const int32_t *t;
    int64_t rows, c, nvb, step;
    deft_device_errors *rec;
    deft_ce_opts o;
    double *partial;      /* the loss's partials and counts, per virtual block */
    long long *count;
    const long long *grad_count;   /* the rows not ignored, for a mean's gradient under an ignore index */
};

__device__ __forceinline__ void deft_ce_walk_next(deft_ce_walk *w, const deft_ce_stream_args &a) {
    w->r += a.step;
    if (w->r >= a.rows) {
        w->vb += gridDim.x;
        w->r = w->vb;
    }
}

/* Whether row r needs its logits: its target is a class (not ignored, in range). */
__device__ __forceinline__ bool deft_ce_needs(const deft_ce_stream_args &a, int64_t r) {
    const int32_t tr = a.t[r];
    return !deft_ce_ignored(a.o, tr) && tr >= 0 && tr < a.c;
}

__device__ __forceinline__ void deft_ce_walk_to_data(deft_ce_walk *w, const deft_ce_stream_args &a) {
    while (w->vb < a.nvb && !deft_ce_needs(a, w->r)) deft_ce_walk_next(w, a);
}

/* The row's bytes into buf, 16 at a time, behind the block's work; one commit group per thread. */
__device__ __forceinline__ void deft_ce_copy_row(void *buf, const void *src, int chunks) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(buf);
    for (int i = threadIdx.x; i < chunks; i += blockDim.x)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + 16u * (unsigned)i),
                     "l"((const char *)src + 16 * (size_t)i));
    asm volatile("cp.async.commit_group;\n" ::);
}

/* What a launch computes: the loss's partials, the gradient (D dloss's dtype), or both from one read of each row
 * (cross-entropy's pair, passes/fusion_pairs.c), walking the rows as the loss does. */
enum { DEFT_CE_DO_LOSS = 1, DEFT_CE_DO_GRAD = 2, DEFT_CE_DO_BOTH = 3 };

template <class T, class D, int DO>
__global__ void __launch_bounds__(DEFT_CE_ROW_MAX_THREADS) deft_k_ce_stream(deft_ce_stream_args a) {
    constexpr bool LOSS = (DO & DEFT_CE_DO_LOSS) != 0, GRAD = (DO & DEFT_CE_DO_GRAD) != 0;
    typedef deft_ty<T> Ty;
    typedef typename Ty::C C;
    extern __shared__ uint4 deft_ce_rows_smem[];
    const int chunks = (int)(a.c * (int64_t)sizeof(T) / 16);
    __shared__ double acc;        /* the virtual block's sum and count: thread 0's */
    __shared__ long long n;
    deft_ce_gk<C> gk = {};
    if (GRAD) {
        const long long count = a.o.has_ignore ? *a.grad_count : (long long)a.rows;
        gk = deft_ce_gk_of<C>(deft_ce_grad_scale(a.o, (double)deft_ty<D>::load(*(const D *)a.dloss), count), a.o.ls,
                              a.c);
    }
    const T *x = static_cast<const T *>(a.x);
    deft_ce_walk w = {blockIdx.x, blockIdx.x}, pf = w;
    deft_ce_walk_to_data(&pf, a);
    if (pf.vb < a.nvb) deft_ce_copy_row(deft_ce_rows_smem, x + pf.r * a.c, chunks);
    int stage = 0;
    int64_t vb = w.vb;
    if (threadIdx.x == 0) acc = 0.0, n = 0;
    for (; w.vb < a.nvb; deft_ce_walk_next(&w, a)) {
        if (LOSS && w.vb != vb && threadIdx.x == 0) {
            a.partial[vb] = acc, a.count[vb] = n;
            acc = 0.0, n = 0;
        }
        vb = w.vb;
        const int32_t tr = a.t[w.r];
        const bool ignored = deft_ce_ignored(a.o, tr);
        if (ignored || tr < 0 || tr >= a.c) {
            if (!ignored && threadIdx.x == 0) {
                deft_ce_record_bad(a.rec, w.r, tr, a.c);
                if (LOSS) n++, acc = NAN;
            }
            if (GRAD) {
                const T fill = Ty::from_f64(ignored ? 0.0 : (double)NAN);
                T *orow = static_cast<T *>(a.out) + w.r * a.c;
                for (int64_t l = threadIdx.x; l < a.c; l += blockDim.x) orow[l] = fill;
            }
            continue;
        }
        /* w.r == pf.r: this row is the copy in buffer `stage`; start the next row's, then wait for this one's */
        deft_ce_walk_next(&pf, a);
        deft_ce_walk_to_data(&pf, a);
        if (pf.vb < a.nvb) {
            deft_ce_copy_row(deft_ce_rows_smem + (stage ^ 1) * chunks, x + pf.r * a.c, chunks);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        const T *xs = reinterpret_cast<const T *>(deft_ce_rows_smem + stage * chunks);
        C m;
        double s, sx;
        deft_ce_block_stats(xs, a.c, true, LOSS && a.o.ls != 0.0, &m, &s, &sx);
        if (GRAD) {
            T *orow = static_cast<T *>(a.out) + w.r * a.c;
            const C inv = (C)(1.0 / s);
            const int64_t ng = (a.c + DEFT_CE_GROUP - 1) / DEFT_CE_GROUP;
            for (int64_t g = threadIdx.x; g < ng; g += blockDim.x) {
                C v[DEFT_CE_GROUP];
                const int k = deft_ce_group(xs, a.c, g, true, v);
                deft_ce_grad_store(orow, g * DEFT_CE_GROUP, v, k, m, inv, tr, gk, true);
            }
        }
        if (LOSS && threadIdx.x == 0) {
            n++;
            acc += deft_ce_row_nll((double)m, (double)Ty::load(xs[tr]), s, sx, a.c, a.o.ls);
        }
        __syncthreads();   /* every thread is done with this buffer before the next copy into it */
        stage ^= 1;
    }
    if (LOSS && threadIdx.x == 0 && vb < a.nvb) a.partial[vb] = acc, a.count[vb] = n;
}

/* ---- launches ---- */

/* The dynamic shared memory a kernel may take on device dev: raised once per device to the most the device allows
 * (cudaFuncSetAttribute is not stream-ordered, and is done before any capture's first launch on that device). */
template <class T, class D, int DO> static bool deft_ce_stream_smem(int dev, int *limit) {
    static std::atomic<unsigned long long> raised(0);   /* a bit per device, for this instantiation */
    const auto kernel = deft_k_ce_stream<T, D, DO>;
    int optin = 0;
    cudaFuncAttributes fa;
    if (dev < 0 || dev >= 64 || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
                                    cudaSuccess ||
        cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    *limit = optin - (int)fa.sharedSizeBytes;
    if (!(raised.load() & (1ull << dev))) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, *limit) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        raised.fetch_or(1ull << dev);
    }
    return true;
}

/* Launches the kernel over the grid that fills the SMs once (at most `most` blocks); false (nothing launched) where
 * the rows do not fit. */
template <class T, class D, int DO> static bool deft_ce_stream_launch(deft_ce_stream_args &a, int64_t most,
                                                                        cudaStream_t st) {
    const size_t bytes = 2 * (size_t)a.c * sizeof(T);
    int dev = 0, sms = 0, limit = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    if (!deft_ce_stream_smem<T, D, DO>(dev, &limit) || bytes > (size_t)limit) return false;
    const int threads = deft_ce_row_threads(a.c);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, deft_k_ce_stream<T, D, DO>, threads, bytes) !=
            cudaSuccess ||
        per_sm < 1) {
        (void)cudaGetLastError();
        return false;
    }
    const int64_t want = (int64_t)sms * per_sm, blocks = want < most ? want : most;
    deft_k_ce_stream<T, D, DO><<<(unsigned)(blocks < 1 ? 1 : blocks), threads, bytes, st>>>(a);
    return true;
}

/* Whether rows of c classes of T, at these addresses, may stream (before the device's shared memory is asked). */
template <class T> static bool deft_ce_stream_shape(int64_t c, const void *x, const void *out) {
    return c >= DEFT_CE_ROW_MIN && (c * (int64_t)sizeof(T)) % 16 == 0 && c * (int64_t)sizeof(T) <= (1 << 20) &&
           deft_is_aligned(x, 16) && (!out || deft_is_aligned(out, 16)) && !deft_debug(DEFT_DEBUG_CE_REFERENCE);
}

template <class F> static bool deft_ce_stream_typed(deft_dtype dt, F f) {
    switch (dt) {
    case DEFT_F32: return f(deft_tag<float>());
    case DEFT_F16: return f(deft_tag<__half>());
    case DEFT_BF16: return f(deft_tag<__nv_bfloat16>());
    default: return false;
    }
}

bool deft_cuda_ce_stream_loss(deft_dtype dt, const void *x, const int32_t *t, int64_t rows, int64_t c, int nb,
                              deft_device_errors *rec, const deft_ce_opts &o, double *partial, long long *count,
                              cudaStream_t st) {
    return deft_ce_stream_typed(dt, [&](auto tag) -> bool {
        typedef typename decltype(tag)::type T;
        if (!deft_ce_stream_shape<T>(c, x, NULL)) return false;
        deft_ce_stream_args a = {x, NULL, NULL, t, rows, c, nb, nb, rec, o, partial, count, NULL};
        return deft_ce_stream_launch<T, T, DEFT_CE_DO_LOSS>(a, nb, st);
    });
}

/* The launches that write a gradient (DO_GRAD or DO_BOTH), over `most` blocks at most: dloss f32 or the logits'. */
template <int DO>
static bool deft_ce_stream_grad_run(deft_dtype dt, bool f32_dloss, deft_ce_stream_args a, int64_t most,
                                    cudaStream_t st) {
    return deft_ce_stream_typed(dt, [&](auto tag) -> bool {
        typedef typename decltype(tag)::type T;
        if (!deft_ce_stream_shape<T>(a.c, a.x, a.out)) return false;
        if (f32_dloss) return deft_ce_stream_launch<T, float, DO>(a, most, st);
        return deft_ce_stream_launch<T, T, DO>(a, most, st);
    });
}

bool deft_cuda_ce_stream_grad(deft_dtype dt, bool f32_dloss, void *out, const void *dloss, const void *x,
                              const int32_t *t, int64_t rows, int64_t c, deft_device_errors *rec,
                              const deft_ce_opts &o, const long long *grad_count, cudaStream_t st) {
    const deft_ce_stream_args a = {x, out, dloss, t, rows, c, rows, rows, rec, o, NULL, NULL, grad_count};
    return deft_ce_stream_grad_run<DEFT_CE_DO_GRAD>(dt, f32_dloss, a, rows, st);
}

bool deft_cuda_ce_stream_pair(deft_dtype dt, bool f32_dloss, void *out, const void *dloss, const void *x,
                              const int32_t *t, int64_t rows, int64_t c, int nb, deft_device_errors *rec,
                              const deft_ce_opts &o, double *partial, long long *count, const long long *grad_count,
                              cudaStream_t st) {
    const deft_ce_stream_args a = {x, out, dloss, t, rows, c, nb, nb, rec, o, partial, count, grad_count};
    return deft_ce_stream_grad_run<DEFT_CE_DO_BOTH>(dt, f32_dloss, a, nb, st);
}

int deft_cuda_ce_streams(deft_dtype dt, int64_t c) {
    return deft_ce_stream_typed(dt, [&](auto tag) -> bool {
        typedef typename decltype(tag)::type T;
        int dev = 0, limit = 0;
        if (!deft_ce_stream_shape<T>(c, NULL, NULL) || cudaGetDevice(&dev) != cudaSuccess) return false;
        return deft_ce_stream_smem<T, T, DEFT_CE_DO_LOSS>(dev, &limit) &&
               2 * (size_t)c * sizeof(T) <= (size_t)limit;
    }) ? 1 : 0;
}
