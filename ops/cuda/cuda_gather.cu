/* Gathers on a GPU: embedding and index_select (rows copied as bits), the order their gradients sum by, and the
 * gradients, which never add with float atomics so that every run gives the same bits (and the CPU's: both sum each
 * row's contributions in position order, in the compute type).
 *
 * The order (DEFT_OP_INDEX_ORDER) is a planned buffer like any value, so nothing here allocates: the keys
 * (index << 32 | position) are unique, so any correct sort gives one result; a bitonic network sorts them in place
 * (tiles of DEFT_SORT_TILE in shared memory, the wider steps one launch each); a binary search per index value then
 * finds its first slot. Each element of the gradient sums its slots' rows of dy in order.
 *
 * An index outside [0, rows) is data, known only when the kernel runs: the kernel records the lowest such position
 * in the device's error record (mem/device_errors.h), as cross-entropy does with its targets, and carries on: the
 * rows it selects are NaN (0 for i32), the gradient adds nothing for it; the host reports it at the next read. */
#include <string.h>

#include "cuda_common.cuh"
#include "device_errors.h"
#include "gather.h"

#define DEFT_SORT_TILE 2048

__device__ __forceinline__ void deft_gather_record_bad(deft_device_errors *rec, int64_t pos, int32_t v, int64_t rows,
                                                       int op) {
    const unsigned long long p = (unsigned long long)(pos < 0xfffffffell ? pos : 0xfffffffell);
    const unsigned long long key = (p << 32) | (unsigned long long)(uint32_t)v;
    /* Only a kernel that lowered the key writes the rest; within one kernel every writer writes the same. */
    if (key < atomicMin(&rec->gather_bad, key)) {
        rec->gather_rows = (long long)rows;
        rec->gather_op = op;
    }
}

static int deft_gather_err_op(bool embedding) {
    return embedding ? DEFT_GATHER_ERR_EMBEDDING : DEFT_GATHER_ERR_INDEX_SELECT;
}

/* ---------------------------------------------------------------- the gather */
/* out[o, j, c] = a[o, idx[j], c]; `bad` (NaN's bits, or 0) where idx[j] is out of range. */
template <class E>
__global__ void deft_k_gather(E *out, const E *a, const int32_t *idx, deft_gather_dims d, E bad,
                              deft_device_errors *rec, int op) {
    const int64_t total = d.outer * d.n * d.inner;
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        const int64_t c = i % d.inner, r = i / d.inner, j = r % d.n, o = r / d.n;
        const int32_t v = idx[j];
        if (v < 0 || v >= d.rows) {
            if (c == 0 && o == 0) deft_gather_record_bad(rec, j, v, d.rows, op);
            out[i] = bad;
            continue;
        }
        out[i] = a[(o * d.rows + v) * d.inner + c];
    }
}

/* The bits a selected row gets for a bad index: NaN in float dtypes, 0 in i32. */
static uint64_t deft_gather_bad_bits(deft_dtype dt) {
    switch (dt) {
    case DEFT_F32: return 0x7fc00000u;
    case DEFT_F64: return 0x7ff8000000000000ull;
    case DEFT_F16: return 0x7e00u;
    case DEFT_BF16: return 0x7fc0u;
    default: return 0;
    }
}

deft_status deft_cuda_gather(const deft_tensor *n, void *out, const void *a, const void *index, cudaStream_t st) {
    deft_gather_dims d;
    deft_status s = deft_gather_dims_of(n, &d);
    if (s != DEFT_OK) return s;
    deft_device_errors *rec = NULL;
    s = deft_device_errors_get(n->device.index, st, &rec);
    if (s != DEFT_OK) return s;
    const uint64_t bad = deft_gather_bad_bits(n->dtype);
    const int op = deft_gather_err_op(n->op == DEFT_OP_EMBEDDING);
    return deft_with_elem_size(deft_dtype_size(n->dtype), [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type E;
        deft_k_gather<E><<<deft_cuda_blocks(d.outer * d.n * d.inner, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (E *)out, (const E *)a, (const int32_t *)index, d, (E)bad, rec, op);
        return deft_cuda_check_launch(n, "gather");
    });
}

/* ---------------------------------------------------------------- the order */
/* keys[i] = index << 32 | i for the n positions (a bad index sorts after every good one), all ones for the padding. */
__global__ void deft_k_order_keys(uint64_t *keys, const int32_t *idx, int64_t n, int64_t pad, int64_t rows,
                                  deft_device_errors *rec, int op) {
    for (int64_t i = deft_tid(); i < pad; i += deft_nthreads()) {
        if (i >= n) {
            keys[i] = ~0ull;
            continue;
        }
        const int32_t v = idx[i];
        const bool ok = v >= 0 && v < rows;
        if (!ok) deft_gather_record_bad(rec, i, v, rows, op);
        keys[i] = (uint64_t)(ok ? (uint32_t)v : 0xffffffffu) << 32 | (uint64_t)i;
    }
}

/* One compare-exchange of the network: the pair (lo, lo + j) ascending where bit k of lo's global index is 0. */
__device__ __forceinline__ void deft_bitonic_pair(uint64_t *s, int64_t lo, int64_t hi, bool up) {
    const uint64_t x = s[lo], y = s[hi];
    if ((x > y) == up) {
        s[lo] = y;
        s[hi] = x;
    }
}

/* Each tile of `tile` keys in shared memory: sorted whole (k_outer 0: every stage k = 2 .. tile), or the steps j <
 * tile of the stage k_outer > tile (its wider steps ran before, one launch each). */
__global__ void deft_k_bitonic_tile(uint64_t *keys, int64_t pad, int tile, int64_t k_outer) {
    __shared__ uint64_t s[DEFT_SORT_TILE];
    const int half = tile / 2;
    for (int64_t t0 = (int64_t)blockIdx.x * tile; t0 < pad; t0 += (int64_t)gridDim.x * tile) {
        for (int e = threadIdx.x; e < tile; e += blockDim.x) s[e] = keys[t0 + e];
        __syncthreads();
        for (int64_t k = k_outer ? k_outer : 2; k <= (k_outer ? k_outer : tile); k <<= 1) {
            for (int64_t j = k_outer ? half : k / 2; j > 0; j >>= 1) {
                for (int t = threadIdx.x; t < half; t += blockDim.x) {
                    const int64_t lo = (t / j) * 2 * j + (t % j);
                    deft_bitonic_pair(s, lo, lo + j, ((t0 + lo) & k) == 0);
                }
                __syncthreads();
            }
        }
        for (int e = threadIdx.x; e < tile; e += blockDim.x) keys[t0 + e] = s[e];
        __syncthreads();
    }
}

/* One step (k, j >= the tile) over the whole array. */
__global__ void deft_k_bitonic_step(uint64_t *keys, int64_t pad, int64_t k, int64_t j) {
    for (int64_t t = deft_tid(); t < pad / 2; t += deft_nthreads()) {
        const int64_t lo = (t / j) * 2 * j + (t % j);
        deft_bitonic_pair(keys, lo, lo + j, (lo & k) == 0);
    }
}

/* first[v] = the first slot whose key is at least v << 32, for v = 0 .. rows (first[rows]: the good keys' count). */
__global__ void deft_k_order_first(int32_t *first, const uint64_t *keys, int64_t pad, int64_t rows) {
    for (int64_t v = deft_tid(); v <= rows; v += deft_nthreads()) {
        const uint64_t want = (uint64_t)v << 32;
        int64_t lo = 0, hi = pad;
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (keys[mid] < want) lo = mid + 1;
            else hi = mid;
        }
        first[v] = (int32_t)lo;
    }
}

static deft_status deft_bitonic_sort(const deft_tensor *n, uint64_t *keys, int64_t pad, cudaStream_t st) {
    if (pad < 2) return DEFT_OK;
    const int tile = (int)(pad < DEFT_SORT_TILE ? pad : DEFT_SORT_TILE);
    const int threads = tile / 2 < DEFT_CUDA_THREADS * 4 ? tile / 2 : DEFT_CUDA_THREADS * 4;
    const int64_t tiles = pad / tile;
    const unsigned tile_blocks = (unsigned)(tiles < DEFT_CUDA_MAX_BLOCKS ? tiles : DEFT_CUDA_MAX_BLOCKS);
    deft_k_bitonic_tile<<<tile_blocks, threads, 0, st>>>(keys, pad, tile, 0);
    deft_status s = deft_cuda_check_launch(n, "index_order tiles");
    for (int64_t k = 2 * (int64_t)tile; s == DEFT_OK && k <= pad; k <<= 1) {
        for (int64_t j = k / 2; s == DEFT_OK && j >= tile; j >>= 1) {
            const unsigned blocks = deft_cuda_blocks(pad / 2, DEFT_CUDA_THREADS);
            deft_k_bitonic_step<<<blocks, DEFT_CUDA_THREADS, 0, st>>>(keys, pad, k, j);
            s = deft_cuda_check_launch(n, "index_order step");
        }
        if (s != DEFT_OK) break;
        deft_k_bitonic_tile<<<tile_blocks, threads, 0, st>>>(keys, pad, tile, k);
        s = deft_cuda_check_launch(n, "index_order merge");
    }
    return s;
}

deft_status deft_cuda_index_order(const deft_tensor *n, void *out, const void *index, cudaStream_t st) {
    const deft_tensor *ti = n->src[0];
    const int64_t cnt = deft_shape_numel(ti->ndim, ti->shape), rows = n->p.gather.rows;
    if (!deft_index_order_fits(n, cnt, rows))
        return deft_set_error(DEFT_ERR_SHAPE, "index_order: %lld indices into %lld rows do not fit its %lld words",
                              (long long)cnt, (long long)rows, (long long)n->shape[0]);
    deft_device_errors *rec = NULL;
    deft_status s = deft_device_errors_get(n->device.index, st, &rec);
    if (s != DEFT_OK) return s;
    const int64_t pad = deft_index_order_pad(cnt);
    uint64_t *keys = (uint64_t *)out;
    deft_k_order_keys<<<deft_cuda_blocks(pad, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        keys, (const int32_t *)index, cnt, pad, rows, rec, deft_gather_err_op(n->p.gather.embedding != 0));
    s = deft_cuda_check_launch(n, "index_order keys");
    if (s == DEFT_OK) s = deft_bitonic_sort(n, keys, pad, st);
    if (s != DEFT_OK) return s;
    deft_k_order_first<<<deft_cuda_blocks(rows + 1, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        (int32_t *)(keys + pad), keys, pad, rows);
    return deft_cuda_check_launch(n, "index_order first");
}

/* ---------------------------------------------------------------- the gradients */
/* Element (o, v, c) of the result: dy's rows (o, position) over v's slots, in order, summed in the compute type.
 * The loads of DEFT_GATHER_GRAD_AHEAD slots are issued before their adds, which stay in slot order (the same bits):
 * a row that many positions hold (a frequent token: text's spaces and commas) is otherwise a chain of dependent
 * loads, one memory latency a slot, and such rows' threads held the whole kernel. */
#define DEFT_GATHER_GRAD_AHEAD 8
template <class T>
__global__ void deft_k_gather_grad(T *out, const T *dy, const uint64_t *keys, const int32_t *first,
                                   deft_gather_dims d) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C C;
    const int64_t total = d.outer * d.rows * d.inner;
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        const int64_t c = i % d.inner, r = i / d.inner, v = r % d.rows, o = r / d.rows;
        const T *col = dy + o * d.n * d.inner + c;
        const int32_t end = first[v + 1];
        int32_t k = first[v];
        C acc = 0;
        for (; k + DEFT_GATHER_GRAD_AHEAD <= end; k += DEFT_GATHER_GRAD_AHEAD) {
            C a[DEFT_GATHER_GRAD_AHEAD];
#pragma unroll
            for (int j = 0; j < DEFT_GATHER_GRAD_AHEAD; j++)
                a[j] = Ty::load(col[(int64_t)(uint32_t)keys[k + j] * d.inner]);
#pragma unroll
            for (int j = 0; j < DEFT_GATHER_GRAD_AHEAD; j++) acc += a[j];
        }
        for (; k < end; k++) acc += Ty::load(col[(int64_t)(uint32_t)keys[k] * d.inner]);
        out[i] = Ty::store(acc);
    }
}

deft_status deft_cuda_gather_grad(const deft_tensor *n, void *out, const void *dy, const void *order,
                                  cudaStream_t st) {
    deft_gather_dims d;
    const uint64_t *keys = NULL;
    const int32_t *first = NULL;
    deft_status s = deft_gather_grad_dims_of(n, order, &d, &keys, &first);
    if (s != DEFT_OK) return s;
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        deft_k_gather_grad<T><<<deft_cuda_blocks(d.outer * d.rows * d.inner, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0,
                                st>>>((T *)out, (const T *)dy, keys, first, d);
        return deft_cuda_check_launch(n, "gather_grad");
    });
}
