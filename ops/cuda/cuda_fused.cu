/* The fused elementwise kernel (ops/fused.h): each thread walks the chain's instructions over a small register file.
 * Each instruction applies the functor its op's one-op kernel uses (cuda_elementwise_fn.cuh), in f32, and rounds the
 * result to its node's dtype (float -> bf16 -> float), which is what the one-op kernel's store and the next one's
 * load do; so a fused chain stores exactly what the chain of one-op kernels would: fusion changes how often memory
 * is touched, never a value.
 *
 * Two choices are made once per launch, never per element: LOWP (some dtype is bf16 or f16; an all-f32 chain runs
 * plain float loads and stores and no rounding), and the vector kernel, where every input is the chain's shape or one
 * element and every pointer is 16-byte aligned: a thread then takes V consecutive elements (16 bytes of f32, or of
 * halves when LOWP) with 16-byte loads and stores, and decodes each instruction once for all V.
 * DEFT_DEBUG_FUSED_REFERENCE (base/config.h) runs the one-element kernel everywhere (its reference, and a way
 * to measure the other). */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cuda_block_reduce.cuh"
#include "cuda_common.cuh"
#include "cuda_elementwise_fn.cuh"
#include "fused.h"

struct deft_fused_ptrs {
    const void *in[DEFT_FUSED_MAX_INPUTS];
    void *out[DEFT_FUSED_MAX_STORES + 1];   /* the reduction's, last */
};

/* ---------------------------------------------------------------- one element's loads, rounding and stores */
template <bool LOWP> __device__ __forceinline__ float deft_fused_load(const void *p, int dt, int64_t i) {
    if (LOWP && dt == DEFT_BF16) return deft_ty<__nv_bfloat16>::load(((const __nv_bfloat16 *)p)[i]);
    if (LOWP && dt == DEFT_F16) return deft_ty<__half>::load(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

template <bool LOWP> __device__ __forceinline__ void deft_fused_store(void *p, int dt, int64_t i, float v) {
    if (LOWP && dt == DEFT_BF16) ((__nv_bfloat16 *)p)[i] = deft_ty<__nv_bfloat16>::store(v);
    else if (LOWP && dt == DEFT_F16) ((__half *)p)[i] = deft_ty<__half>::store(v);
    else ((float *)p)[i] = v;
}

/* ---------------------------------------------------------------- instructions over V lanes */
struct deft_fused_copy {
    __device__ float operator()(float x) const { return x; }
};

template <int V, class F> __device__ __forceinline__ void deft_lanes1(float *d, const float *x, F f) {
#pragma unroll
    for (int v = 0; v < V; v++) d[v] = f(x[v]);
}

template <int V, class F> __device__ __forceinline__ void deft_lanes2(float *d, const float *x, const float *y, F f) {
#pragma unroll
    for (int v = 0; v < V; v++) d[v] = f(x[v], y[v]);
}

/* The scalar rounded to float, as the one-op kernels of f32, f16 and bf16 all compute in float. */
template <int V, template <class> class FN>
__device__ __forceinline__ void deft_lanes_map(float *d, const float *x, double y) {
    FN<float> f;
    f.y = (float)y;
    deft_lanes1<V>(d, x, f);
}

template <int V> __device__ __forceinline__ void deft_fused_act_grad(int act, float *d, const float *dy, const float *x) {
    switch (act) {
    case DEFT_OP_RELU: deft_lanes2<V>(d, dy, x, deft_ag_relu()); return;
    case DEFT_OP_GELU: deft_lanes2<V>(d, dy, x, deft_ag_gelu()); return;
    case DEFT_OP_GELU_TANH: deft_lanes2<V>(d, dy, x, deft_ag_gelu_tanh()); return;
    case DEFT_OP_SILU: deft_lanes2<V>(d, dy, x, deft_ag_silu()); return;
    case DEFT_OP_TANH: deft_lanes2<V>(d, dy, x, deft_ag_tanh()); return;
    default: deft_lanes2<V>(d, dy, x, deft_ag_sigmoid()); return;
    }
}

template <int V> __device__ void deft_fused_apply(const deft_fused_instr &in, float *d, const float *x, const float *y) {
    switch (in.op) {
    case DEFT_OP_ADD: deft_lanes2<V>(d, x, y, deft_f_add()); return;
    case DEFT_OP_SUB: deft_lanes2<V>(d, x, y, deft_f_sub()); return;
    case DEFT_OP_MUL: deft_lanes2<V>(d, x, y, deft_f_mul()); return;
    case DEFT_OP_DIV: deft_lanes2<V>(d, x, y, deft_f_div()); return;
    case DEFT_OP_MAXIMUM: deft_lanes2<V>(d, x, y, deft_f_maximum()); return;
    case DEFT_OP_EQ: deft_lanes2<V>(d, x, y, deft_f_eq()); return;
    case DEFT_OP_GT: deft_lanes2<V>(d, x, y, deft_f_gt()); return;
    case DEFT_OP_GE: deft_lanes2<V>(d, x, y, deft_f_ge()); return;
    case DEFT_OP_ADD_SCALAR: deft_lanes_map<V, deft_m_add_s>(d, x, in.scalar); return;
    case DEFT_OP_RSUB_SCALAR: deft_lanes_map<V, deft_m_rsub_s>(d, x, in.scalar); return;
    case DEFT_OP_MUL_SCALAR: deft_lanes_map<V, deft_m_mul_s>(d, x, in.scalar); return;
    case DEFT_OP_DIV_SCALAR: deft_lanes_map<V, deft_m_div_s>(d, x, in.scalar); return;
    case DEFT_OP_RDIV_SCALAR: deft_lanes_map<V, deft_m_rdiv_s>(d, x, in.scalar); return;
    case DEFT_OP_MAXIMUM_SCALAR: deft_lanes_map<V, deft_m_max_s>(d, x, in.scalar); return;
    case DEFT_OP_POW_SCALAR: deft_lanes_map<V, deft_m_pow_s>(d, x, in.scalar); return;
    case DEFT_OP_NEG: deft_lanes_map<V, deft_m_neg>(d, x, 0.0); return;
    case DEFT_OP_EXP: deft_lanes_map<V, deft_m_exp>(d, x, 0.0); return;
    case DEFT_OP_LOG: deft_lanes_map<V, deft_m_log>(d, x, 0.0); return;
    case DEFT_OP_SQRT: deft_lanes_map<V, deft_m_sqrt>(d, x, 0.0); return;
    case DEFT_OP_RSQRT: deft_lanes_map<V, deft_m_rsqrt>(d, x, 0.0); return;
    case DEFT_OP_TANH: deft_lanes_map<V, deft_m_tanh>(d, x, 0.0); return;
    case DEFT_OP_SIGMOID: deft_lanes_map<V, deft_m_sigmoid>(d, x, 0.0); return;
    case DEFT_OP_RELU: deft_lanes_map<V, deft_m_relu>(d, x, 0.0); return;
    case DEFT_OP_GELU: deft_lanes_map<V, deft_m_gelu>(d, x, 0.0); return;
    case DEFT_OP_GELU_TANH: deft_lanes_map<V, deft_m_gelu_tanh>(d, x, 0.0); return;
    case DEFT_OP_SILU: deft_lanes_map<V, deft_m_silu>(d, x, 0.0); return;
    case DEFT_OP_ACT_GRAD: deft_fused_act_grad<V>(in.act, d, x, y); return;
    /* expand: the broadcast happened in the input's load; cast: the rounding to its dtype that follows */
    default: deft_lanes1<V>(d, x, deft_fused_copy()); return;
    }
}

/* What storing as dt and loading back gives: the one-op kernels' round trip between two ops of the chain. */
template <int V> __device__ __forceinline__ void deft_fused_round(int dt, float *d) {
    if (dt == DEFT_BF16) {
#pragma unroll
        for (int v = 0; v < V; v++) d[v] = __bfloat162float(__float2bfloat16_rn(d[v]));
    } else if (dt == DEFT_F16) {
#pragma unroll
        for (int v = 0; v < V; v++) d[v] = __half2float(__float2half_rn(d[v]));
    }
}

/* Every instruction over the inputs already in r[0 .. n_inputs). */
template <bool LOWP, int V> __device__ __forceinline__ void deft_fused_ops(const deft_fused_kernel &k, float (*r)[V]) {
    for (int o = 0; o < k.n_ops; o++) {
        const deft_fused_instr &in = k.ops[o];
        float *d = r[k.n_inputs + o];
        deft_fused_apply<V>(in, d, r[in.a], r[in.b]);
        if (LOWP) deft_fused_round<V>(in.dtype, d);
    }
}

/* ---------------------------------------------------------------- one element per step */
__device__ __forceinline__ int64_t deft_fused_offset(const deft_fused_kernel &k, int j, int64_t i) {
    int64_t off = 0;
    for (int d = k.ndim - 1; d >= 0; d--) {
        const int64_t idx = i % k.shape[d];
        i /= k.shape[d];
        off += idx * k.strides[j][d];
    }
    return off;
}

/* Element i's registers: the inputs loaded, then every instruction applied. */
template <bool LOWP>
__device__ __forceinline__ void deft_fused_eval(const deft_fused_kernel &k, const deft_fused_ptrs &p, int64_t i,
                                                float (*r)[1]) {
    for (int j = 0; j < k.n_inputs; j++) {
        const int kind = k.input_kind[j];
        const int64_t at = kind == DEFT_FUSED_IN_SAME ? i : kind == DEFT_FUSED_IN_ONE ? 0 : deft_fused_offset(k, j, i);
        r[j][0] = deft_fused_load<LOWP>(p.in[j], k.input_dtype[j], at);
    }
    deft_fused_ops<LOWP, 1>(k, r);
}

template <bool LOWP>
__device__ __forceinline__ void deft_fused_store_element(const deft_fused_kernel &k, const deft_fused_ptrs &p,
                                                         int64_t i, float (*r)[1]) {
    for (int s = 0; s < k.n_stores; s++) deft_fused_store<LOWP>(p.out[s], k.store_dtype[s], i, r[k.store_reg[s]][0]);
}

/* Every input of element i is read before any output of element i is written (outputs may alias inputs). */
template <bool LOWP> __global__ void deft_k_fused(const deft_fused_kernel k, const deft_fused_ptrs p) {
    float r[DEFT_FUSED_MAX_REGS][1];
    for (int64_t i = deft_tid(); i < k.numel; i += deft_nthreads()) {
        deft_fused_eval<LOWP>(k, p, i, r);
        deft_fused_store_element<LOWP>(k, p, i, r);
    }
}

/* One block: the chain as above, and its reduction summed in double as cuda_reduce.cu's one-block path does
 * (thread t takes elements t, t + blockDim.x, ..., then the block's tree), rounded once to the reduction's dtype. */
template <bool LOWP> __global__ void deft_k_fused_reduce(const deft_fused_kernel k, const deft_fused_ptrs p) {
    float r[DEFT_FUSED_MAX_REGS][1];
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < k.numel; i += blockDim.x) {
        deft_fused_eval<LOWP>(k, p, i, r);
        deft_fused_store_element<LOWP>(k, p, i, r);
        acc += (double)r[k.reduce_reg][0];
    }
    acc = deft_block_reduce(acc, deft_r_sum());
    if (threadIdx.x == 0) {
        const float v = deft_ty<float>::from_f64(k.reduce_op == DEFT_OP_MEAN ? acc / (double)k.numel : acc);
        deft_fused_store<LOWP>(p.out[k.n_stores], k.store_dtype[k.n_stores], 0, v);
    }
}

/* ---------------------------------------------------------------- V elements per step, 16 bytes at a time */
template <bool LOWP> struct deft_fused_width {
    static const int V = LOWP ? 8 : 4;   /* 16 bytes of the narrowest dtype the chain may hold */
};

/* Elements c*V .. c*V + V-1 of p, as T, in one or more 16-byte loads. */
template <class T, int V> __device__ __forceinline__ void deft_vec_load_as(const void *p, int64_t c, float *r) {
    constexpr int N = 16 / sizeof(T);
    static_assert(V % N == 0, "a vector step is whole 16-byte packs");
    const deft_vec<T, N> *q = (const deft_vec<T, N> *)p + c * (V / N);
#pragma unroll
    for (int u = 0; u < V / N; u++) {
        const deft_vec<T, N> pk = q[u];
#pragma unroll
        for (int e = 0; e < N; e++) r[u * N + e] = deft_ty<T>::load(pk.e[e]);
    }
}

/* Registers already hold values of dtype T, so the conversion is exact. */
template <class T, int V> __device__ __forceinline__ void deft_vec_store_as(void *p, int64_t c, const float *r) {
    constexpr int N = 16 / sizeof(T);
    deft_vec<T, N> *q = (deft_vec<T, N> *)p + c * (V / N);
#pragma unroll
    for (int u = 0; u < V / N; u++) {
        deft_vec<T, N> pk;
#pragma unroll
        for (int e = 0; e < N; e++) pk.e[e] = deft_ty<T>::store(r[u * N + e]);
        q[u] = pk;
    }
}

template <bool LOWP, int V> __device__ __forceinline__ void deft_vec_load(const void *p, int dt, int64_t c, float *r) {
    if constexpr (LOWP) {
        if (dt == DEFT_BF16) return deft_vec_load_as<__nv_bfloat16, V>(p, c, r);
        if (dt == DEFT_F16) return deft_vec_load_as<__half, V>(p, c, r);
    }
    deft_vec_load_as<float, V>(p, c, r);
}

template <bool LOWP, int V> __device__ __forceinline__ void deft_vec_store(void *p, int dt, int64_t c, const float *r) {
    if constexpr (LOWP) {
        if (dt == DEFT_BF16) return deft_vec_store_as<__nv_bfloat16, V>(p, c, r);
        if (dt == DEFT_F16) return deft_vec_store_as<__half, V>(p, c, r);
    }
    deft_vec_store_as<float, V>(p, c, r);
}

/* Inputs of the chain's shape or of one element only; the last numel % V elements go one by one. */
template <bool LOWP> __global__ void deft_k_fused_vec(const deft_fused_kernel k, const deft_fused_ptrs p) {
    constexpr int V = deft_fused_width<LOWP>::V;
    float r[DEFT_FUSED_MAX_REGS][V];
    const int64_t steps = k.numel / V;
    for (int64_t c = deft_tid(); c < steps; c += deft_nthreads()) {
        for (int j = 0; j < k.n_inputs; j++) {
            if (k.input_kind[j] == DEFT_FUSED_IN_SAME) {
                deft_vec_load<LOWP, V>(p.in[j], k.input_dtype[j], c, r[j]);
            } else {
                const float x = deft_fused_load<LOWP>(p.in[j], k.input_dtype[j], 0);
#pragma unroll
                for (int v = 0; v < V; v++) r[j][v] = x;
            }
        }
        deft_fused_ops<LOWP, V>(k, r);
        for (int s = 0; s < k.n_stores; s++) deft_vec_store<LOWP, V>(p.out[s], k.store_dtype[s], c, r[k.store_reg[s]]);
    }
    float r1[DEFT_FUSED_MAX_REGS][1];
    for (int64_t i = steps * V + deft_tid(); i < k.numel; i += deft_nthreads()) {
        deft_fused_eval<LOWP>(k, p, i, r1);
        deft_fused_store_element<LOWP>(k, p, i, r1);
    }
}

/* ---------------------------------------------------------------- the launch */
static bool deft_fused_dtypes_ok(const deft_fused_kernel *k, bool reduce, bool *lowp) {
    bool ok = true;
    *lowp = false;
    for (int j = 0; j < k->n_inputs; j++) {
        ok &= deft_fused_dtype_ok((deft_dtype)k->input_dtype[j]) != 0;
        *lowp |= k->input_dtype[j] != DEFT_F32;
    }
    for (int o = 0; o < k->n_ops; o++) {
        ok &= deft_fused_dtype_ok((deft_dtype)k->ops[o].dtype) != 0;
        *lowp |= k->ops[o].dtype != DEFT_F32;
    }
    for (int s = 0; s < k->n_stores + (reduce ? 1 : 0); s++) {
        ok &= deft_fused_dtype_ok((deft_dtype)k->store_dtype[s]) != 0;
        *lowp |= k->store_dtype[s] != DEFT_F32;
    }
    return ok;
}

static bool deft_fused_malformed(const deft_fused_kernel *k, bool reduce) {
    if (k->n_inputs < 0 || k->n_inputs > DEFT_FUSED_MAX_INPUTS || k->n_ops > DEFT_FUSED_MAX_OPS || k->n_ops < 1 ||
        k->n_stores > DEFT_FUSED_MAX_STORES || k->n_stores < (reduce ? 0 : 1) || (k->reduce_op != 0 && !reduce))
        return true;
    return reduce && (k->reduce_reg < 0 || k->reduce_reg >= k->n_inputs + k->n_ops || k->numel < 1 ||
                      k->numel > DEFT_FUSED_MAX_REDUCE_NUMEL);
}

/* Whether V elements at a time fit: no strided input, every pointer read or written in packs 16-byte aligned. */
static bool deft_fused_vectorisable(const deft_fused_kernel *k, const deft_fused_ptrs &p, int width) {
    if (k->numel < width) return false;
    for (int j = 0; j < k->n_inputs; j++) {
        if (k->input_kind[j] == DEFT_FUSED_IN_STRIDED) return false;
        if (k->input_kind[j] == DEFT_FUSED_IN_SAME && (uintptr_t)p.in[j] % 16 != 0) return false;
    }
    for (int s = 0; s < k->n_stores; s++)
        if ((uintptr_t)p.out[s] % 16 != 0) return false;
    return true;
}

static bool deft_fused_reference_requested(void) {
    return deft_debug(DEFT_DEBUG_FUSED_REFERENCE) != 0;
}

template <bool LOWP> static void deft_fused_launch(const deft_fused_kernel *k, const deft_fused_ptrs &p, bool reduce,
                                                  cudaStream_t st) {
    const int width = deft_fused_width<LOWP>::V;
    if (reduce)
        deft_k_fused_reduce<LOWP><<<1, deft_reduce_threads(k->numel), 0, st>>>(*k, p);
    else if (deft_fused_vectorisable(k, p, width) && !deft_fused_reference_requested())
        deft_k_fused_vec<LOWP><<<deft_cuda_blocks(k->numel / width, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(*k, p);
    else
        deft_k_fused<LOWP><<<deft_cuda_blocks(k->numel, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(*k, p);
}

extern "C" deft_status deft_cuda_fused_run(const deft_fused_kernel *k, void *const *out, const void *const *in,
                                           void *stream) {
    const bool reduce = k && (k->reduce_op == DEFT_OP_SUM || k->reduce_op == DEFT_OP_MEAN);
    bool lowp = false;
    if (!k || deft_fused_malformed(k, reduce))
        return deft_set_error(DEFT_ERR_INVALID, "cuda fused kernel: malformed chain");
    if (!deft_fused_dtypes_ok(k, reduce, &lowp))
        return deft_set_error(DEFT_ERR_DTYPE, "cuda fused kernel: a dtype other than f32, bf16 or f16");
    if (k->numel == 0) return DEFT_OK;
    deft_fused_ptrs p = {};
    for (int j = 0; j < k->n_inputs; j++) p.in[j] = in[j];
    for (int s = 0; s < k->n_stores + (reduce ? 1 : 0); s++) p.out[s] = out[s];
    if (lowp) deft_fused_launch<true>(k, p, reduce, (cudaStream_t)stream);
    else deft_fused_launch<false>(k, p, reduce, (cudaStream_t)stream);
    cudaError_t e = deft_cuda_launch_error();
    if (e == cudaSuccess) return DEFT_OK;
    return deft_set_error(DEFT_ERR_RUNTIME, "cuda fused kernel (%d ops): %s", k->n_ops, cudaGetErrorString(e));
}
