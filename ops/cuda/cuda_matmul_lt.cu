/* Matrix products through cuBLASLt: the plain products cuda_matmul.cu hands over, TF32 when the program allows it,
 * and the fused epilogues of cuda_matmul.h (bias, bias + ReLU, bias gradient).
 *
 * Row-major to column-major as in cuda_matmul.cu: out[M, N] = op(a) op(b) is computed as out^T = op(b)^T op(a)^T,
 * so cuBLASLt's A is our b, its B our a, and D (m = N rows, n = M columns, ld N) is our out. Hence:
 *   - our bias over the N output columns is a bias over D's rows: CUBLASLT_EPILOGUE_BIAS, whose vector has m = N
 *     elements, broadcast over D's columns;
 *   - our bias gradient, the sum over k of op(b)[k, n], is the sum over k of op(A)[n, k]: CUBLASLT_EPILOGUE_BGRADA,
 *     which cuBLASLt runs only with transa = N, i.e. only for an untransposed b (the dW = x^T dy of a linear layer).
 *
 * Each distinct problem (device, shape, dtype, transposes, epilogue, TF32, pointer alignments) runs the heuristic
 * once; its descriptors and algorithm are kept in a host cache for the life of the process, so the capture of a
 * step into a CUDA Graph (which follows eager runs of the same step) only looks them up. A problem met for the first
 * time inside a capture is not looked up in cuBLASLt at all: it takes the fallback (the reference product, plus the
 * small epilogue kernels below), whose calls are capturable. So are the problems cuBLASLt has no algorithm for.
 *
 * The heuristic is offered the stream's cap (cuda_workspace.h) and the stream's scratch then grows to what the
 * chosen algorithm asks for: outside a capture, so the eager run before a capture has grown it for every problem
 * of the step. Where the stream holds less than the choice asks (inside a capture, or a scratch a capture froze),
 * the heuristic's choice within what it holds is taken instead (a cached one only, inside a capture).
 *
 * With the compile option matmul_find (DEFT_CUDA_MATMUL_FIND, part of the key: a program without it never takes a
 * timed choice) the heuristic offers up to DEFT_LT_CANDIDATES algorithms, and the first call of the problem that may
 * be timed runs each of them on its own operands and stream (cuda_matmul_lt_find.cu) and keeps the fastest; until
 * then, the heuristic's first runs. A call may be timed outside a capture, when it writes its result whole: beta 0
 * (not accumulating), and no output overlapping an operand, so that every candidate's run writes the same values and
 * the call's own run after them writes them once more. A call that cannot be timed keeps the heuristic's first for
 * good. The candidates run in a block of their own from the caching allocator, given back once timed, so the
 * stream's scratch grows only to what the kept choice asks for, as without timing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <mutex>
#include <vector>

#include <cublasLt.h>

#include "caching_allocator.h"
#include "cuda_matmul.h"
#include "cuda_matmul_impl.cuh"
#include "cuda_matmul_lt_find.cuh"
#include "cuda_matmul_small.cuh"

/* ---- one cuBLASLt handle per device, until deft_memory_release_all (as the cuBLAS handles) ---- */
static cublasLtHandle_t deft_lt_handles[DEFT_CUBLAS_MAX_DEVICES];
/* Guards the handles and the cache; held across a whole call, since a cached descriptor's bias pointer is set
 * per call. */
static std::mutex deft_lt_lock;

static deft_status deft_lt_handle(int dev, cublasLtHandle_t *out) {
    if (!deft_lt_handles[dev]) {
        cublasStatus_t s = cublasLtCreate(&deft_lt_handles[dev]);
        if (s != CUBLAS_STATUS_SUCCESS) {
            deft_lt_handles[dev] = NULL;
            return deft_cublas_error("cublasLtCreate", s);
        }
    }
    *out = deft_lt_handles[dev];
    return DEFT_OK;
}

extern "C" deft_status deft_cuda_cublaslt_prepare(int dev) {
    if (dev < 0 || dev >= DEFT_CUBLAS_MAX_DEVICES) return DEFT_OK;   /* its products report it */
    std::lock_guard<std::mutex> guard(deft_lt_lock);
    cublasLtHandle_t h;
    return deft_lt_handle(dev, &h);
}

extern "C" void deft_cuda_cublaslt_release(int dev) {
    if (dev < 0 || dev >= DEFT_CUBLAS_MAX_DEVICES) return;
    std::lock_guard<std::mutex> guard(deft_lt_lock);
    if (deft_lt_handles[dev] && cublasLtDestroy(deft_lt_handles[dev]) != CUBLAS_STATUS_SUCCESS)
        (void)cudaGetLastError();
    deft_lt_handles[dev] = NULL;
}

/* ---- the problem and its cache entry ---- */
typedef struct deft_lt_key {
    int dev, dtype, out_dtype, ta, tb, epilogue, tf32;   /* out_dtype: D's, f32 or dtype */
    int ptr_array;   /* 1: count products whose A, B and D are device arrays of pointers (the strides unused) */
    int find;        /* 1: chosen by timing the candidates (DEFT_CUDA_MATMUL_FIND) */
    int spare;       /* 0: keeps the key free of padding, which the bytewise compare would read */
    int64_t M, N, K, count, stride_a, stride_b;   /* count 1: one product; strides in elements, 0 repeats one */
    uint32_t align_a, align_b, align_out, align_bias;
    uint64_t ws_bytes;   /* the most the algorithm may ask for: the stream's cap (a side lane's is smaller), or
                          * inside a capture what the stream holds (cuda_workspace.h) */
} deft_lt_key;

static_assert(sizeof(deft_lt_key) == 10 * sizeof(int) + 6 * sizeof(int64_t) + 4 * sizeof(uint32_t) + sizeof(uint64_t),
              "the key has no padding");

/* The most algorithms the heuristic is asked for under matmul_find. */
#define DEFT_LT_CANDIDATES 8

typedef struct deft_lt_entry {
    deft_lt_key key;
    bool found;   /* false: cuBLASLt has no algorithm; the fallback runs */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;   /* cuBLASLt's A (our b), B (our a), C = D (our out) */
    cublasLtMatmulAlgo_t algo;
    size_t ws_need;   /* the workspace the algorithm asks for (the heuristic's workspaceSize) */
    bool pending;     /* key.find: the candidates below wait for a call that may time them */
    int n_cand;
    cublasLtMatmulAlgo_t cand[DEFT_LT_CANDIDATES];   /* the heuristic's, in its order; cand[0] is algo until timed */
    size_t cand_ws[DEFT_LT_CANDIDATES];
} deft_lt_entry;

/* Distinct problems kept; past this, new ones take the fallback rather than grow the cache without end. */
#define DEFT_LT_CACHE_MAX 4096
static std::vector<deft_lt_entry> deft_lt_cache;

/* The largest power of two dividing p, up to the 256 bytes cuBLASLt asks about. */
static uint32_t deft_lt_align(const void *p) {
    const uintptr_t v = (uintptr_t)p;
    const uintptr_t low = v & (~v + 1);
    return (low == 0 || low > 256) ? 256u : (uint32_t)low;
}

static deft_lt_entry *deft_lt_find(const deft_lt_key &k) {
    for (deft_lt_entry &e : deft_lt_cache)
        if (memcmp(&e.key, &k, sizeof k) == 0) return &e;
    return NULL;
}

static cudaDataType_t deft_lt_data_type(int dtype) {
    switch (dtype) {
    case DEFT_F16: return CUDA_R_16F;
    case DEFT_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

static void deft_lt_entry_free(deft_lt_entry *e) {
    if (e->desc) cublasLtMatmulDescDestroy(e->desc);
    if (e->la) cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) cublasLtMatrixLayoutDestroy(e->lb);
    if (e->ld) cublasLtMatrixLayoutDestroy(e->ld);
    e->desc = NULL;
    e->la = e->lb = e->ld = NULL;
}

/* A column-major rows x cols layout, with its batch when count > 1: strided, or an array of pointers. */
static cublasStatus_t deft_lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t dt, int64_t rows, int64_t cols,
                                     int64_t count, int64_t stride, int ptr_array) {
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, dt, (uint64_t)rows, (uint64_t)cols, rows);
    if (s != CUBLAS_STATUS_SUCCESS || count == 1) return s;
    const int32_t c = (int32_t)count;
    s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c, sizeof c);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (ptr_array) {
        const int32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
        return cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode);
    }
    return cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
}

static cublasStatus_t deft_lt_describe(const deft_lt_key &k, deft_lt_entry *e) {
    const cudaDataType_t dt = deft_lt_data_type(k.dtype);
    const cublasComputeType_t compute = k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasStatus_t s = cublasLtMatmulDescCreate(&e->desc, compute, CUDA_R_32F);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    const int32_t op_a = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint32_t epi = (uint32_t)k.epilogue;
    if ((s = cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a)) ||
        (s = cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b)) ||
        (s = cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)))
        return s;
    /* Stored shapes: b is [K, N] (column-major N x K) or, transposed, [N, K] (K x N); a likewise with M. */
    if ((s = deft_lt_layout(&e->la, dt, k.tb ? k.K : k.N, k.tb ? k.N : k.K, k.count, k.stride_b, k.ptr_array)) ||
        (s = deft_lt_layout(&e->lb, dt, k.ta ? k.M : k.K, k.ta ? k.K : k.M, k.count, k.stride_a, k.ptr_array)))
        return s;
    return deft_lt_layout(&e->ld, deft_lt_data_type(k.out_dtype), k.N, k.M, k.count, k.M * k.N, k.ptr_array);
}

/* The heuristic's first choice for the entry's problem (its candidates too, under matmul_find): e->found stays false
 * where there is none. Halves may only split K with partial sums kept in f32 (as the cuBLAS handle's
 * DISALLOW_REDUCED_PRECISION_REDUCTION). */
static cublasStatus_t deft_lt_choose(cublasLtHandle_t h, const deft_lt_key &k, const void *bias, deft_lt_entry *e) {
    if (bias) {
        cublasStatus_t s = cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                          sizeof bias);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    cublasLtMatmulPreference_t pref;
    cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    const uint64_t ws = k.ws_bytes;
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    const bool half = k.dtype == DEFT_F16 || k.dtype == DEFT_BF16;
    if (!(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
        !(s = half ? cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                                          sizeof mask)
                   : CUBLAS_STATUS_SUCCESS) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k.align_b,
                                                   sizeof k.align_b)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k.align_a,
                                                   sizeof k.align_a)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k.align_out,
                                                   sizeof k.align_out)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k.align_out,
                                                   sizeof k.align_out))) {
        cublasLtMatmulHeuristicResult_t r[DEFT_LT_CANDIDATES];
        int got = 0;
        memset(r, 0, sizeof r);
        /* Any refusal (no algorithm, or a shape this version rejects outright) means the fallback, not an error. */
        if (cublasLtMatmulAlgoGetHeuristic(h, e->desc, e->la, e->lb, e->ld, e->ld, pref,
                                           k.find ? DEFT_LT_CANDIDATES : 1, r, &got) == CUBLAS_STATUS_SUCCESS &&
            got > 0 && r[0].state == CUBLAS_STATUS_SUCCESS) {
            e->algo = r[0].algo;
            e->ws_need = r[0].workspaceSize;
            e->found = true;
            for (int i = 0; k.find && i < got && i < DEFT_LT_CANDIDATES; i++)
                if (r[i].state == CUBLAS_STATUS_SUCCESS) {
                    e->cand[e->n_cand] = r[i].algo;
                    e->cand_ws[e->n_cand++] = r[i].workspaceSize;
                }
            e->pending = e->n_cand > 1;   /* one candidate leaves nothing to time */
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return s;
}

/* The cached entry for k, made (descriptors and heuristic) on a miss; NULL with *s == DEFT_OK where the call must
 * take the fallback: a miss inside a stream capture, or a full cache. The caller holds deft_lt_lock. */
static deft_lt_entry *deft_lt_entry_for(cublasLtHandle_t h, const deft_lt_key &k, const void *bias, bool capturing,
                                        deft_status *s) {
    *s = DEFT_OK;
    deft_lt_entry *hit = deft_lt_find(k);
    if (hit || capturing || deft_lt_cache.size() >= DEFT_LT_CACHE_MAX) return hit;
    deft_lt_entry e;
    memset(&e, 0, sizeof e);
    e.key = k;
    cublasStatus_t cs = deft_lt_describe(k, &e);
    if (cs == CUBLAS_STATUS_SUCCESS) cs = deft_lt_choose(h, k, bias, &e);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        deft_lt_entry_free(&e);
        *s = deft_cublas_error("cuBLASLt descriptor setup", cs);
        return NULL;
    }
    if (!e.found) deft_lt_entry_free(&e);   /* only "no algorithm" is remembered */
    deft_lt_cache.push_back(e);
    return &deft_lt_cache.back();
}

/* Whether `st` is capturing into a CUDA Graph; a stream that cannot be asked counts as capturing. */
static bool deft_lt_capturing(cudaStream_t st) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* ---- one cuBLASLt call ---- */
/* A pointer-array batch's device arrays (A's pointers, then B's, then D's) live at the end of the stream's cuBLAS
 * scratch, which the call's algorithm is then not offered. A one-block kernel writes them just before the product:
 * stream order keeps them intact until the product has read them, and a CUDA Graph capture bakes the pointers into
 * the graph as it does every kernel's arguments. */
#define DEFT_LT_TABLE_BYTES ((size_t)1024)
typedef struct deft_lt_table {
    const void *ptr[3 * DEFT_MM_BATCH_MAX];
} deft_lt_table;
static_assert(sizeof(deft_lt_table) <= DEFT_LT_TABLE_BYTES, "the pointer table fits its reserve");

__global__ void deft_lt_table_kernel(const void **dst, deft_lt_table t, int n) {
    if ((int)threadIdx.x < n) dst[threadIdx.x] = t.ptr[threadIdx.x];
}

typedef struct deft_lt_call {
    deft_lt_key key;
    const void *a, *b, *bias;   /* bias: the epilogue's vector (bias or bias gradient), NULL for none */
    void *out;
    const deft_lt_table *table; /* a pointer-array batch of key.count products (a, b, out unset), NULL for none */
    bool accumulate;            /* out += product (beta 1) instead of out = product */
    bool dry;                   /* only make sure the problem would run: choose, launch nothing */
} deft_lt_call;

static deft_lt_key deft_lt_key_init(deft_dtype dtype, int ta, int tb, int64_t M, int64_t N, int64_t K,
                                    unsigned flags) {
    deft_lt_key k;
    memset(&k, 0, sizeof k);   /* the key is compared bytewise, padding included */
    k.dtype = (int)dtype;
    k.out_dtype = (int)dtype;
    k.ta = ta;
    k.tb = tb;
    k.epilogue = (int)CUBLASLT_EPILOGUE_DEFAULT;
    k.tf32 = dtype == DEFT_F32 && (flags & DEFT_CUDA_ALLOW_TF32) != 0;
    k.find = (flags & DEFT_CUDA_MATMUL_FIND) != 0;
    k.M = M;
    k.N = N;
    k.K = K;
    k.count = 1;
    return k;
}

static deft_lt_key deft_lt_key_make(const deft_tensor *n, int ta, int tb, int64_t M, int64_t N, int64_t K,
                                    unsigned flags) {
    return deft_lt_key_init(n->dtype, ta, tb, M, N, K, flags);
}

/* Queues the writing of c's pointer table at dst, and points c's operands at it. */
static deft_status deft_lt_stage_table(deft_lt_call &c, void *dst, cudaStream_t st) {
    const int n = (int)c.key.count;
    const void **arrays = (const void **)dst;
    deft_lt_table_kernel<<<1, 3 * n, 0, st>>>(arrays, *c.table, 3 * n);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return deft_set_error(DEFT_ERR_RUNTIME, "cuda matmul batch: %s", cudaGetErrorString(e));
    c.a = arrays;
    c.b = arrays + n;
    c.out = (void *)(arrays + 2 * n);
    return DEFT_OK;
}

/* The scratch kept for algorithms rounded to this, so that a pointer table after it stays aligned. */
#define DEFT_LT_WS_ALIGN ((size_t)256)

static size_t deft_lt_round(size_t v) {
    return (v + DEFT_LT_WS_ALIGN - 1) / DEFT_LT_WS_ALIGN * DEFT_LT_WS_ALIGN;
}

/* ---- matmul_find: a pending problem's candidates timed on the first call that may be ---- */
/* Problems chosen by timing, and problems that kept the heuristic's first because the call that met them could not
 * be timed (under deft_lt_lock): what the tests read. */
static int64_t deft_lt_timed_count, deft_lt_kept_count;

extern "C" void deft_cuda_matmul_find_counts(int64_t *timed, int64_t *kept) {
    std::lock_guard<std::mutex> guard(deft_lt_lock);
    *timed = deft_lt_timed_count;
    *kept = deft_lt_kept_count;
}

typedef struct deft_lt_span {
    uintptr_t lo, hi;   /* the bytes [lo, hi) */
} deft_lt_span;

/* The bytes that `count` matrices of `elems` elements, `stride` elements apart (0: one matrix read again), starting
 * at p take: false past the address space (the caller then takes them as overlapping). */
static bool deft_lt_span_of(const void *p, int64_t elems, int64_t count, int64_t stride, size_t esz,
                            deft_lt_span *out) {
    int64_t last = 0, n = 0;
    size_t bytes = 0;
    uintptr_t hi = 0;
    if (__builtin_mul_overflow(count - 1, stride, &last) || __builtin_add_overflow(last, elems, &n) ||
        __builtin_mul_overflow((size_t)n, esz, &bytes) || __builtin_add_overflow((uintptr_t)p, bytes, &hi))
        return false;
    *out = deft_lt_span{(uintptr_t)p, hi};
    return true;
}

/* Whether an output of c (D, and the bias gradient BGRADA writes) shares a byte with an operand it reads (A, B, the
 * bias BIAS adds) or with another output: then a candidate's run could change what the next one reads. */
static bool deft_lt_overlaps(const deft_lt_call &c) {
    const deft_lt_key &k = c.key;
    const size_t in_sz = deft_dtype_size((deft_dtype)k.dtype), out_sz = deft_dtype_size((deft_dtype)k.out_dtype);
    const int mats = c.table ? (int)k.count : 1;   /* a pointer-array batch: each pointer one matrix */
    const int64_t count = c.table ? 1 : k.count, stride_out = count > 1 ? k.M * k.N : 0;
    deft_lt_span in[2 * DEFT_MM_BATCH_MAX + 1], out[DEFT_MM_BATCH_MAX + 1];
    int n_in = 0, n_out = 0;
    bool ok = true;
    for (int i = 0; ok && i < mats; i++) {
        const void *a = c.table ? c.table->ptr[i] : c.a, *b = c.table ? c.table->ptr[mats + i] : c.b;
        const void *d = c.table ? c.table->ptr[2 * mats + i] : c.out;
        ok = deft_lt_span_of(a, k.M * k.K, count, k.stride_a, in_sz, &in[n_in++]) &&
             deft_lt_span_of(b, k.K * k.N, count, k.stride_b, in_sz, &in[n_in++]) &&
             deft_lt_span_of(d, k.M * k.N, count, stride_out, out_sz, &out[n_out++]);
    }
    if (ok && c.bias) {   /* N elements, in D's type or, for safety's sake, the larger of the two */
        deft_lt_span *v = k.epilogue == (int)CUBLASLT_EPILOGUE_BGRADA ? &out[n_out++] : &in[n_in++];
        ok = deft_lt_span_of(c.bias, k.N, 1, 0, std::max(in_sz, out_sz), v);
    }
    if (!ok) return true;
    for (int i = 0; i < n_out; i++) {
        for (int j = 0; j < n_in; j++)
            if (out[i].lo < in[j].hi && in[j].lo < out[i].hi) return true;
        for (int j = 0; j < i; j++)
            if (out[i].lo < out[j].hi && out[j].lo < out[i].hi) return true;
    }
    return false;
}

/* Times e's candidates on c (whose outputs it writes, as c's own run will again) in a block of their own, and keeps
 * the fastest. */
static deft_status deft_lt_time(cublasLtHandle_t h, const deft_lt_call &c, cudaStream_t st, deft_lt_entry *e) {
    const size_t table = c.table ? DEFT_LT_TABLE_BYTES : 0;
    size_t room = 0;
    for (int i = 0; i < e->n_cand; i++) room = std::max(room, deft_lt_round(e->cand_ws[i]));
    void *block = NULL;
    deft_status s = deft_caching_alloc(deft_cuda(c.key.dev), room + table, st, "cublaslt.find", &block);
    if (s == DEFT_ERR_OOM) {   /* no room to time in: the heuristic's first, as without the option */
        deft_lt_kept_count++;
        e->pending = false;
        return DEFT_OK;
    }
    if (s != DEFT_OK) return s;
    deft_lt_call t = c;   /* staging a table points the copy's operands into the block */
    if (c.table) s = deft_lt_stage_table(t, (char *)block + room, st);
    cublasStatus_t cs = CUBLAS_STATUS_SUCCESS;
    if (s == DEFT_OK && c.bias)
        cs = cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias);
    if (s == DEFT_OK && cs != CUBLAS_STATUS_SUCCESS) s = deft_cublas_error("cuBLASLt bias pointer", cs);
    int best = -1;
    if (s == DEFT_OK) {
        const deft_lt_find_problem p = {h, e->desc, e->la, e->lb, e->ld, t.b, t.a, t.out, st};
        s = deft_lt_time_candidates(p, e->cand, e->cand_ws, e->n_cand, block, room, &best);
    }
    const deft_status freed = deft_caching_free(deft_cuda(c.key.dev), block);   /* stream-ordered: safe at once */
    if (s == DEFT_OK) s = freed;
    if (s != DEFT_OK) return s;
    if (best >= 0) {
        e->algo = e->cand[best];
        e->ws_need = e->cand_ws[best];
        deft_lt_timed_count++;
    } else {   /* none ran: the heuristic's first stays, and its own run reports what is wrong */
        deft_lt_kept_count++;
    }
    e->pending = false;
    return DEFT_OK;
}

/* A pending entry settled by c where c may settle it: timed where c writes its result whole, kept (never timed)
 * where it accumulates or overlaps. A dry call or one inside a capture leaves it pending, running the heuristic's
 * first meanwhile. */
static deft_status deft_lt_settle(cublasLtHandle_t h, const deft_lt_call &c, cudaStream_t st, bool capturing,
                                  deft_lt_entry *e) {
    if (!e->pending || capturing || c.dry) return DEFT_OK;
    if (c.accumulate || deft_lt_overlaps(c)) {
        deft_lt_kept_count++;
        e->pending = false;
        return DEFT_OK;
    }
    return deft_lt_time(h, c, st, e);
}

/* c's algorithm and the stream's scratch that holds its workspace (then its pointer table, if any): NULL with *s
 * DEFT_OK where the fallback must run. Chosen within the stream's cap (timed first, under matmul_find); where the
 * stream cannot hold that choice, chosen again within what it holds. The caller holds deft_lt_lock. */
static deft_lt_entry *deft_lt_prepare(cublasLtHandle_t h, deft_lt_call &c, cudaStream_t st, bool capturing, void **ws,
                                      size_t *ws_bytes, deft_status *s) {
    const size_t table = c.table ? DEFT_LT_TABLE_BYTES : 0;
    const size_t cap = deft_stream_workspace_cap(c.key.dev, st, DEFT_WORKSPACE_CUBLAS);
    *s = DEFT_OK;
    if (cap <= table) return NULL;
    c.key.ws_bytes = (cap - table) / DEFT_LT_WS_ALIGN * DEFT_LT_WS_ALIGN;
    deft_lt_entry *e = deft_lt_entry_for(h, c.key, c.bias, capturing, s);
    if (!e || !e->found || (*s = deft_lt_settle(h, c, st, capturing, e)) != DEFT_OK) return NULL;
    size_t held = 0;
    *s = deft_stream_workspace_reserve(c.key.dev, st, DEFT_WORKSPACE_CUBLAS, deft_lt_round(e->ws_need) + table, ws,
                                       &held);
    if (*s != DEFT_OK) return NULL;
    if (held < table) return NULL;   /* no room for the table (a stream first met in a capture holds nothing) */
    const size_t room = (held - table) / DEFT_LT_WS_ALIGN * DEFT_LT_WS_ALIGN;
    if (e->ws_need > room) {   /* held smaller: the choice within what is held */
        c.key.ws_bytes = room;
        e = deft_lt_entry_for(h, c.key, c.bias, capturing, s);
        if (!e || !e->found || (*s = deft_lt_settle(h, c, st, capturing, e)) != DEFT_OK || e->ws_need > room)
            return NULL;
    }
    *ws_bytes = room;
    return e;
}

/* Runs c through cuBLASLt: *done = false (nothing enqueued) where the fallback must run instead. */
static deft_status deft_lt_run(deft_lt_call &c, cudaStream_t st, bool *done) {
    *done = false;
    deft_status s = deft_matmul_device(&c.key.dev);
    if (s != DEFT_OK) return s;
    if (!c.table) {   /* a batch's alignments are its pointers' least, set by the caller */
        c.key.align_a = deft_lt_align(c.a);
        c.key.align_b = deft_lt_align(c.b);
        c.key.align_out = deft_lt_align(c.out);
    }
    c.key.align_bias = c.bias ? deft_lt_align(c.bias) : 0;
    const bool capturing = deft_lt_capturing(st);
    std::lock_guard<std::mutex> guard(deft_lt_lock);
    cublasLtHandle_t h = NULL;
    void *ws = NULL;
    size_t ws_bytes = 0;
    if (capturing && !deft_lt_handles[c.key.dev]) return DEFT_OK;   /* creating one is no capture's business */
    if ((s = deft_lt_handle(c.key.dev, &h)) != DEFT_OK) return s;
    deft_lt_entry *e = deft_lt_prepare(h, c, st, capturing, &ws, &ws_bytes, &s);
    if (!e) return s;
    if (c.dry) {
        *done = true;
        return DEFT_OK;
    }
    if (c.table && (s = deft_lt_stage_table(c, (char *)ws + ws_bytes, st)) != DEFT_OK) return s;
    cublasStatus_t cs = CUBLAS_STATUS_SUCCESS;
    if (c.bias)
        cs = cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias);
    const float one = 1.0f, zero = 0.0f;
    if (cs == CUBLAS_STATUS_SUCCESS)
        cs = cublasLtMatmul(h, e->desc, &one, c.b, e->la, c.a, e->lb, c.accumulate ? &one : &zero, c.out, e->ld,
                            c.out, e->ld, &e->algo, ws_bytes ? ws : NULL, ws_bytes, st);
    if (cs == CUBLAS_STATUS_NOT_SUPPORTED) {
        /* Refused before launching anything: remember it, and let the fallback run now and from here on. */
        e->found = false;
        deft_lt_entry_free(e);
        return DEFT_OK;
    }
    if (cs != CUBLAS_STATUS_SUCCESS) return deft_cublas_error("cublasLtMatmul", cs);
    *done = true;
    return DEFT_OK;
}

/* ---- the plain product ---- */
deft_status deft_cuda_matmul_lt_plain(const deft_tensor *n, const deft_mm &s, void *out, const void *a,
                                      const void *b, cudaStream_t st, unsigned flags, bool *done) {
    *done = false;
    if (n->dtype != DEFT_F32 && n->dtype != DEFT_F16 && n->dtype != DEFT_BF16) return DEFT_OK;
    deft_lt_call c;
    memset(&c, 0, sizeof c);
    c.a = a;
    c.b = b;
    c.out = out;
    /* b shared by every batch and a stacked plainly: one product with the batch folded into M (as the reference). */
    if (s.b_mats == 1 && !s.ta && s.a_mats == s.batch) {
        c.key = deft_lt_key_make(n, 0, s.tb, s.batch * s.M, s.N, s.K, flags);
        return deft_lt_run(c, st, done);
    }
    const bool a_uniform = s.a_mats == 1 || s.a_mats == s.batch, b_uniform = s.b_mats == 1 || s.b_mats == s.batch;
    if (!a_uniform || !b_uniform || s.batch > INT32_MAX) return DEFT_OK;
    c.key = deft_lt_key_make(n, s.ta, s.tb, s.M, s.N, s.K, flags);
    c.key.count = s.batch;
    if (s.batch > 1) {
        c.key.stride_a = s.a_mats == 1 ? 0 : s.M * s.K;
        c.key.stride_b = s.b_mats == 1 ? 0 : s.K * s.N;
    }
    return deft_lt_run(c, st, done);
}

deft_status deft_cuda_gemm_lt(const deft_lt_gemm &g, cudaStream_t st, unsigned flags, bool dry, bool *done) {
    *done = false;
    if (g.M <= 0 || g.N <= 0 || g.K <= 0 || g.M > INT32_MAX || g.N > INT32_MAX || g.K > INT32_MAX ||
        (g.dtype != DEFT_F32 && g.dtype != DEFT_F16 && g.dtype != DEFT_BF16) ||
        (g.out_dtype != g.dtype && g.out_dtype != DEFT_F32))
        return DEFT_OK;
    deft_lt_call c;
    memset(&c, 0, sizeof c);
    c.key = deft_lt_key_init(g.dtype, g.ta, g.tb, g.M, g.N, g.K, flags);
    c.key.out_dtype = (int)g.out_dtype;
    c.a = g.a;
    c.b = g.b;
    c.out = g.out;
    c.accumulate = g.accumulate;
    c.dry = dry;
    return deft_lt_run(c, st, done);
}

deft_status deft_cuda_gemm_lt_batch(const deft_lt_gemm &g, const void *const *a, const void *const *b,
                                    void *const *out, int count, cudaStream_t st, unsigned flags, bool *done) {
    *done = false;
    if (count < 2 || count > DEFT_MM_BATCH_MAX || g.M <= 0 || g.N <= 0 || g.K <= 0 || g.M > INT32_MAX ||
        g.N > INT32_MAX || g.K > INT32_MAX || (g.dtype != DEFT_F32 && g.dtype != DEFT_F16 && g.dtype != DEFT_BF16))
        return DEFT_OK;
    deft_lt_table t;
    memset(&t, 0, sizeof t);
    deft_lt_call c;
    memset(&c, 0, sizeof c);
    c.key = deft_lt_key_init(g.dtype, g.ta, g.tb, g.M, g.N, g.K, flags);
    c.key.count = count;
    c.key.ptr_array = 1;
    c.key.align_a = c.key.align_b = c.key.align_out = 256;
    for (int i = 0; i < count; i++) {
        t.ptr[i] = a[i];
        t.ptr[count + i] = b[i];
        t.ptr[2 * count + i] = out[i];
        c.key.align_a = std::min(c.key.align_a, deft_lt_align(a[i]));
        c.key.align_b = std::min(c.key.align_b, deft_lt_align(b[i]));
        c.key.align_out = std::min(c.key.align_out, deft_lt_align(out[i]));
    }
    c.table = &t;
    return deft_lt_run(c, st, done);
}

/* ---- the fallback's epilogues: the same results in separate kernels, after the plain product ---- */
template <class T>
__global__ void deft_bias_kernel(T *out, const T *bias, int64_t total, int64_t N, bool relu) {
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        float v = deft_ty<T>::load(out[i]) + deft_ty<T>::load(bias[i % N]);
        out[i] = deft_ty<T>::store(relu && v < 0.0f ? 0.0f : v);   /* NaN stays NaN, as relu does */
    }
}

/* bias_grad[n] = sum over k of op(b)[k, n]; b is [K, N], or [N, K] when transposed. */
template <class T>
__global__ void deft_bias_grad_kernel(T *grad, const T *b, int64_t K, int64_t N, bool tb) {
    for (int64_t n = deft_tid(); n < N; n += deft_nthreads()) {
        float sum = 0.0f;
        for (int64_t k = 0; k < K; k++) sum += deft_ty<T>::load(b[tb ? n * K + k : k * N + n]);
        grad[n] = deft_ty<T>::store(sum);
    }
}

template <class T>
static deft_status deft_epilogue_kernels(const deft_tensor *mm, const deft_mm &s, void *out, const void *b,
                                         const deft_mm_epilogue *ep, cudaStream_t st) {
    if (ep->kind == DEFT_MM_EPI_BGRAD_B) {
        if (s.N == 0) return DEFT_OK;
        deft_bias_grad_kernel<T><<<deft_cuda_blocks(s.N, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (T *)ep->bias_grad, (const T *)b, s.K, s.N, s.tb != 0);
        return deft_cuda_check_launch(mm, "bias_grad");
    }
    const int64_t total = s.M * s.N;
    if (total == 0) return DEFT_OK;
    deft_bias_kernel<T><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        (T *)out, (const T *)ep->bias, total, s.N, ep->kind == DEFT_MM_EPI_BIAS_RELU);
    return deft_cuda_check_launch(mm, "bias");
}

static deft_status deft_matmul_fallback(const deft_tensor *mm, const deft_mm &s, void *out, const void *a,
                                        const void *b, const deft_mm_epilogue *ep, cudaStream_t st,
                                        unsigned flags) {
    deft_status r = s.M * s.N == 0 ? DEFT_OK : deft_cuda_matmul(mm, out, a, b, st, flags);
    if (r != DEFT_OK) return r;
    switch (mm->dtype) {
    case DEFT_F32: return deft_epilogue_kernels<float>(mm, s, out, b, ep, st);
    case DEFT_F16: return deft_epilogue_kernels<__half>(mm, s, out, b, ep, st);
    default: return deft_epilogue_kernels<__nv_bfloat16>(mm, s, out, b, ep, st);
    }
}

/* ---- the fused entry points (cuda_matmul.h) ---- */
extern "C" int deft_cuda_matmul_fusable(const deft_tensor *mm, deft_mm_epilogue_kind kind, unsigned flags) {
    (void)flags;   /* TF32 or not, cuBLASLt offers the same epilogues */
    if (!mm || mm->op != DEFT_OP_MATMUL || mm->nsrc != 2 || mm->device.type != DEFT_CUDA) return 0;
    const deft_tensor *a = mm->src[0], *b = mm->src[1];
    /* An untransposed a of more dims against a 2-d b is, in memory, one 2-d product with a's rows stacked (a linear
     * layer on [B, T, C]): its rows fold into M, and a bias over the last dim is one over D's rows as before. */
    const bool folded = a->ndim > 2 && !mm->p.matmul.trans_a && kind != DEFT_MM_EPI_BGRAD_B;
    if (b->ndim != 2 || mm->ndim != a->ndim || (a->ndim != 2 && !folded)) return 0;
    if (mm->dtype != DEFT_F32 && mm->dtype != DEFT_F16 && mm->dtype != DEFT_BF16) return 0;
    if (a->dtype != mm->dtype || b->dtype != mm->dtype) return 0;
    if (deft_shape_numel(a->ndim - 1, a->shape) > INT32_MAX || a->shape[a->ndim - 1] > INT32_MAX) return 0;
    for (int i = 0; i < 2; i++)
        if (b->shape[i] > INT32_MAX) return 0;
    switch (kind) {
    case DEFT_MM_EPI_NONE:
    case DEFT_MM_EPI_BIAS:
    case DEFT_MM_EPI_BIAS_RELU: return 1;
    case DEFT_MM_EPI_BGRAD_B: return mm->p.matmul.trans_b == 0;   /* BGRADA needs transa = N */
    default: return 0;
    }
}

static const char *deft_epilogue_name(deft_mm_epilogue_kind k) {
    switch (k) {
    case DEFT_MM_EPI_NONE: return "none";
    case DEFT_MM_EPI_BIAS: return "bias";
    case DEFT_MM_EPI_BIAS_RELU: return "bias+relu";
    case DEFT_MM_EPI_BGRAD_B: return "bias gradient";
    default: return "unknown";
    }
}

static cublasLtEpilogue_t deft_lt_epilogue(deft_mm_epilogue_kind k) {
    switch (k) {
    case DEFT_MM_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case DEFT_MM_EPI_BIAS_RELU: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case DEFT_MM_EPI_BGRAD_B: return CUBLASLT_EPILOGUE_BGRADA;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

extern "C" deft_status deft_cuda_matmul_fused(const deft_tensor *mm, void *out, const void *a, const void *b,
                                              const deft_mm_epilogue *ep, void *stream, unsigned flags) {
    if (!ep) return deft_set_error(DEFT_ERR_INVALID, "cuda matmul: no epilogue given");
    if (!deft_cuda_matmul_fusable(mm, ep->kind, flags))
        return deft_set_error(DEFT_ERR_INVALID, "cuda matmul: the %s epilogue cannot be fused into %s",
                              deft_epilogue_name(ep->kind), mm ? mm->name : "(no node)");
    cudaStream_t st = (cudaStream_t)stream;
    if (ep->kind == DEFT_MM_EPI_NONE) return deft_cuda_matmul(mm, out, a, b, st, flags);
    const void *vec = ep->kind == DEFT_MM_EPI_BGRAD_B ? (const void *)ep->bias_grad : ep->bias;
    if (!vec) return deft_set_error(DEFT_ERR_INVALID, "cuda matmul: the %s epilogue has no vector",
                                    deft_epilogue_name(ep->kind));
    deft_mm s;
    deft_status r = deft_mm_make(mm, &s);
    if (r != DEFT_OK) return r;
    if (s.nbatch > 0) {   /* a's stacked rows against one b (fusable said so): one product of batch * M rows */
        s.M *= s.batch;
        s.nbatch = 0;
        s.batch = s.a_mats = s.b_mats = 1;
    }
    /* Empty products (cuBLASLt wants every dimension positive) and the debug knob DEFT_DEBUG_MATMUL_REFERENCE take
     * the fallback. */
    if (s.M > 0 && s.N > 0 && s.K > 0 && !deft_matmul_reference_requested()) {
        if (deft_matmul_small_fits(mm, s)) return deft_cuda_matmul_small(mm, s, out, a, b, ep, st);
        deft_lt_call c;
        memset(&c, 0, sizeof c);
        c.key = deft_lt_key_make(mm, s.ta, s.tb, s.M, s.N, s.K, flags);
        c.key.epilogue = (int)deft_lt_epilogue(ep->kind);
        c.a = a;
        c.b = b;
        c.bias = vec;
        c.out = out;
        bool done = false;
        r = deft_lt_run(c, st, &done);
        if (r != DEFT_OK || done) return r;
    }
    return deft_matmul_fallback(mm, s, out, a, b, ep, st, flags);
}
