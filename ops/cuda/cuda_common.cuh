/* Shared by the CUDA kernel files (the .cu files of ops/cuda): element types, launch shapes, error checks, and the
 * entry point of each file, which cuda_dispatch.cu calls. Not installed.
 *
 * Semantics follow the CPU backend (ops/cpu) exactly: f16 and bf16 load into float, compute in float and round once
 * on the store (round to nearest even); f64 computes in double; i32 computes in int64 and wraps on the store, as
 * torch's integer arithmetic does. */
#ifndef DEFT_CUDA_COMMON_CUH
#define DEFT_CUDA_COMMON_CUH

#include <stdbool.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "graph_internal.h"
#include "cuda_fault.h"
#include "cuda_kernels.h"

/* ---- element types: storage T, compute type C (deft_ty<T>::C), load and store ---- */
template <class T> struct deft_ty;

/* Float to i32 truncates toward zero; out-of-range values saturate and NaN gives 0 (the bare conversion is
 * undefined for all three), as deft_store_from_f64 does. */
__device__ __forceinline__ int32_t deft_f64_to_i32(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return INT32_MAX;
    if (v <= -2147483648.0) return INT32_MIN;
    return (int32_t)v;
}

template <> struct deft_ty<float> {
    typedef float C;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
    static __device__ __forceinline__ float from_f64(double v) { return (float)v; }
};

template <> struct deft_ty<double> {
    typedef double C;
    static __device__ __forceinline__ double load(double v) { return v; }
    static __device__ __forceinline__ double store(double v) { return v; }
    static __device__ __forceinline__ double from_f64(double v) { return v; }
};

/* Halves from double round through float (double -> float -> half), as the CPU does, so both agree bit for bit. */
template <> struct deft_ty<__half> {
    typedef float C;
    static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
    static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
    static __device__ __forceinline__ __half from_f64(double v) { return __float2half_rn((float)v); }
};

template <> struct deft_ty<__nv_bfloat16> {
    typedef float C;
    static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
    static __device__ __forceinline__ __nv_bfloat16 from_f64(double v) { return __float2bfloat16_rn((float)v); }
};

/* int32 widened to int64 cannot overflow in +, - or *; the store keeps the low 32 bits (two's complement). */
template <> struct deft_ty<int32_t> {
    typedef int64_t C;
    static __device__ __forceinline__ int64_t load(int32_t v) { return (int64_t)v; }
    static __device__ __forceinline__ int32_t store(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }
    static __device__ __forceinline__ int32_t from_f64(double v) { return deft_f64_to_i32(v); }
};

/* A cast of one element, through double, which holds every value of every dtype exactly, so only the store rounds. */
template <class TI, class TO> __device__ __forceinline__ TO deft_cast_one(TI x) {
    return deft_ty<TO>::from_f64((double)deft_ty<TI>::load(x));
}

/* V neighbouring elements moved by one load or store of V sizeof(T) bytes (up to 16): the callers check that the
 * address is aligned to that. */
template <class T, int V> struct alignas(V * sizeof(T)) deft_vec {
    T e[V];
};

/* Elements [0, 4) of a cast in one load and one store (both aligned to four elements). */
template <class TI, class TO> __device__ __forceinline__ void deft_cast_four(const TI *a, TO *o) {
    const deft_vec<TI, 4> x = *reinterpret_cast<const deft_vec<TI, 4> *>(a);
    deft_vec<TO, 4> y;
#pragma unroll
    for (int u = 0; u < 4; u++) y.e[u] = deft_cast_one<TI, TO>(x.e[u]);
    *reinterpret_cast<deft_vec<TO, 4> *>(o) = y;
}

/* MAXIMUM and MAX propagate NaN from either side, as torch does (x != x is false for integers). */
template <class C> __device__ __forceinline__ C deft_max_nan(C x, C y) { return (x > y || x != x) ? x : y; }

/* ---- float / double overloads, so one functor serves f32, f16, bf16 (float) and f64 (double) ---- */
__device__ __forceinline__ float deft_math_exp(float x) { return expf(x); }
__device__ __forceinline__ double deft_math_exp(double x) { return exp(x); }
__device__ __forceinline__ float deft_math_log(float x) { return logf(x); }
__device__ __forceinline__ double deft_math_log(double x) { return log(x); }
__device__ __forceinline__ float deft_math_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double deft_math_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float deft_math_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double deft_math_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float deft_math_erfc(float x) { return erfcf(x); }
__device__ __forceinline__ double deft_math_erfc(double x) { return erfc(x); }
__device__ __forceinline__ float deft_math_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double deft_math_pow(double x, double y) { return pow(x, y); }

/* The branch keeps exp's argument non-positive, so neither side overflows for large |x|. */
template <class C> __device__ __forceinline__ C deft_math_sigmoid(C x) {
    if (x >= C(0)) return C(1) / (C(1) + deft_math_exp(-x));
    C e = deft_math_exp(x);
    return e / (C(1) + e);
}

/* ---- dtype dispatch: f(deft_tag<T>()) with T the storage type of dt ---- */
template <class T> struct deft_tag {
    typedef T type;
};

/* The unsigned integer of one element's size: moving bits, never converting them. */
template <class F> static inline deft_status deft_with_elem_size(size_t esz, F f) {
    switch (esz) {
    case 2: return f(deft_tag<uint16_t>());
    case 4: return f(deft_tag<uint32_t>());
    case 8: return f(deft_tag<uint64_t>());
    default: return deft_set_error(DEFT_ERR_DTYPE, "cuda: element size %zu", esz);
    }
}

template <class F> static inline deft_status deft_cuda_with_dtype(deft_dtype dt, F f) {
    switch (dt) {
    case DEFT_F32: return f(deft_tag<float>());
    case DEFT_F64: return f(deft_tag<double>());
    case DEFT_F16: return f(deft_tag<__half>());
    case DEFT_BF16: return f(deft_tag<__nv_bfloat16>());
    case DEFT_I32: return f(deft_tag<int32_t>());
    default: return deft_set_error(DEFT_ERR_DTYPE, "cuda: unknown dtype %d", (int)dt);
    }
}

/* Only the floating dtypes: the functors below use float math that has no integer form. */
template <class F> static inline deft_status deft_with_float_dtype(const deft_tensor *n, F f) {
    switch (n->dtype) {
    case DEFT_F32: return f(deft_tag<float>());
    case DEFT_F64: return f(deft_tag<double>());
    case DEFT_F16: return f(deft_tag<__half>());
    case DEFT_BF16: return f(deft_tag<__nv_bfloat16>());
    default:
        return deft_set_error(DEFT_ERR_DTYPE, "%s: dtype %s is not supported on CUDA", deft_op_name(n->op),
                              deft_dtype_name(n->dtype));
    }
}

/* ---- launch shapes ---- */
#define DEFT_CUDA_THREADS 256
/* Grid-stride loops cover any size; more blocks than this only add scheduling work. */
#define DEFT_CUDA_MAX_BLOCKS 65535

static inline unsigned deft_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b > DEFT_CUDA_MAX_BLOCKS ? DEFT_CUDA_MAX_BLOCKS : b);
}

/* Whether p starts on a multiple of `bytes` (a power of two): the vector paths' test, on the host or the device. */
__host__ __device__ __forceinline__ bool deft_is_aligned(const void *p, size_t bytes) {
    return (uintptr_t)p % bytes == 0;
}

/* Index of this thread in a 1-D grid-stride loop, in 64 bits: tensors may pass 2^31 elements. */
__device__ __forceinline__ int64_t deft_tid(void) { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t deft_nthreads(void) { return (int64_t)gridDim.x * blockDim.x; }

/* The error of the launch just made: the runtime's, or one a test injected (cuda_fault.h). Clears the runtime's, so
 * that it does not surface again from an unrelated later call. Every launch is checked through this. */
static inline cudaError_t deft_cuda_launch_error(void) {
    cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? e : (cudaError_t)deft_cuda_take_injected_launch_error();
}

/* Launch errors (bad configuration, no kernel image for this GPU) show at once; faults in the kernel show at the
 * next synchronisation, where the runtime reports them. */
static inline deft_status deft_cuda_check_launch(const deft_tensor *n, const char *kernel) {
    cudaError_t e = deft_cuda_launch_error();
    if (e == cudaSuccess) return DEFT_OK;
    return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s (%s kernel, %s): %s", deft_op_name(n->op), kernel,
                          deft_dtype_name(n->dtype), cudaGetErrorString(e));
}

/* ---- strided walks: out is contiguous over shape; input offsets are sums of index * stride ---- */
typedef struct deft_cuda_strides {
    int ndim;
    int64_t shape[DEFT_MAX_DIMS];
    int64_t st[2][DEFT_MAX_DIMS];   /* up to two operands, in elements */
} deft_cuda_strides;

/* Offsets of linear output index i in both operands (the second is 0 when nops == 1). */
__device__ __forceinline__ void deft_cuda_offsets(const deft_cuda_strides &s, int64_t i, int64_t *o0, int64_t *o1) {
    int64_t a = 0, b = 0;
    for (int d = s.ndim - 1; d >= 0; d--) {
        int64_t idx = i % s.shape[d];
        i /= s.shape[d];
        a += idx * s.st[0][d];
        b += idx * s.st[1][d];
    }
    *o0 = a;
    *o1 = b;
}

/* Drops size-1 dims and merges neighbours contiguous in every operand, so most walks need one or two divisions
 * per element instead of one per dim. Returns the new rank (0 for one element). */
int deft_cuda_coalesce(deft_cuda_strides *s, int nops);

/* ---- one entry per file ---- */
deft_status deft_cuda_binary(const deft_tensor *n, void *out, const void *a, const void *b, cudaStream_t st);
deft_status deft_cuda_scalar(const deft_tensor *n, void *out, const void *a, cudaStream_t st);
deft_status deft_cuda_unary(const deft_tensor *n, void *out, const void *a, cudaStream_t st);
deft_status deft_cuda_cast(const deft_tensor *n, void *out, const void *a, cudaStream_t st);
deft_status deft_cuda_reduce(const deft_tensor *n, void *out, const void *a, cudaStream_t st);
deft_status deft_cuda_softmax(const deft_tensor *n, void *out, const void *a, cudaStream_t st);
deft_status deft_cuda_permute(const deft_tensor *n, void *out, const void *a, cudaStream_t st);
deft_status deft_cuda_slice(const deft_tensor *n, void *out, const void *a, cudaStream_t st);
deft_status deft_cuda_concat(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st);
deft_status deft_cuda_create(const deft_tensor *n, void *out, cudaStream_t st);
deft_status deft_cuda_matmul(const deft_tensor *n, void *out, const void *a, const void *b, cudaStream_t st,
                             unsigned flags);
/* cuda_train.cu: the ops of training */
deft_status deft_cuda_act_grad(const deft_tensor *n, void *out, const void *dy, const void *x, cudaStream_t st);
deft_status deft_cuda_expand(const deft_tensor *n, void *out, const void *a, cudaStream_t st);
deft_status deft_cuda_slice_grad(const deft_tensor *n, void *out, const void *dy, cudaStream_t st);
deft_status deft_cuda_cross_entropy(const deft_tensor *n, void *out, const void *logits, const void *targets,
                                    cudaStream_t st);
deft_status deft_cuda_cross_entropy_grad(const deft_tensor *n, void *out, const void *dloss, const void *logits,
                                         const void *targets, cudaStream_t st);
deft_status deft_cuda_dropout(const deft_tensor *n, void *out, const void *x, cudaStream_t st);
/* cuda_attention.cu: DEFT_OP_ATTENTION (in: q, k, v; packed: qkv) and DEFT_OP_ATTENTION_GRAD (in: dout, q, k, v,
 * out; packed: dout, qkv, out) */
deft_status deft_cuda_attention_prepare(const deft_tensor *n, cudaStream_t st, unsigned flags);
deft_status deft_cuda_attention(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st,
                                unsigned flags);
deft_status deft_cuda_attention_mma(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st);
/* cuda_layer_norm.cu: layer norm (in: x[, weight][, bias]), its dx (dy, x, ln[, weight]) and its weight and bias
 * gradients (dy, x, ln) */
deft_status deft_cuda_layer_norm(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st);
/* cuda_gather.cu: embedding and index_select (in: a, index), the order their gradients sum by (in: index), the
 * gradients (dy, index, order); cuda_where.cu: where and masked_fill (in: the node's sources) */
deft_status deft_cuda_gather(const deft_tensor *n, void *out, const void *a, const void *index, cudaStream_t st);
deft_status deft_cuda_index_order(const deft_tensor *n, void *out, const void *index, cudaStream_t st);
deft_status deft_cuda_gather_grad(const deft_tensor *n, void *out, const void *dy, const void *order, cudaStream_t st);
deft_status deft_cuda_where(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st);

#endif
