/* The fused elementwise kernel (ops/fused.h): one thread per element walks the chain's instructions over a small
 * register file. Each instruction applies the functor its op's one-op kernel uses (cuda_elementwise_fn.cuh), in
 * f32, so a fused chain stores exactly what the chain of one-op kernels would: fusion changes how often memory is
 * touched, never a value. */
#include "cuda_block_reduce.cuh"
#include "cuda_common.cuh"
#include "cuda_elementwise_fn.cuh"
#include "fused.h"

struct deft_fused_ptrs {
    const float *in[DEFT_FUSED_MAX_INPUTS];
    float *out[DEFT_FUSED_MAX_STORES + 1];   /* the reduction's, last */
};

template <template <class> class FN> __device__ __forceinline__ float deft_fused_map(float x, double y) {
    FN<float> f;
    f.y = (float)y;
    return f(x);
}

__device__ __forceinline__ float deft_fused_act_grad(int act, float dy, float x) {
    switch (act) {
    case DEFT_OP_RELU: return deft_ag_relu()(dy, x);
    case DEFT_OP_GELU: return deft_ag_gelu()(dy, x);
    case DEFT_OP_SILU: return deft_ag_silu()(dy, x);
    case DEFT_OP_TANH: return deft_ag_tanh()(dy, x);
    default: return deft_ag_sigmoid()(dy, x);
    }
}

__device__ float deft_fused_apply(const deft_fused_instr &in, float x, float y) {
    switch (in.op) {
    case DEFT_OP_ADD: return deft_f_add()(x, y);
    case DEFT_OP_SUB: return deft_f_sub()(x, y);
    case DEFT_OP_MUL: return deft_f_mul()(x, y);
    case DEFT_OP_DIV: return deft_f_div()(x, y);
    case DEFT_OP_MAXIMUM: return deft_f_maximum()(x, y);
    case DEFT_OP_EQ: return deft_f_eq()(x, y);
    case DEFT_OP_GT: return deft_f_gt()(x, y);
    case DEFT_OP_GE: return deft_f_ge()(x, y);
    case DEFT_OP_ADD_SCALAR: return deft_fused_map<deft_m_add_s>(x, in.scalar);
    case DEFT_OP_RSUB_SCALAR: return deft_fused_map<deft_m_rsub_s>(x, in.scalar);
    case DEFT_OP_MUL_SCALAR: return deft_fused_map<deft_m_mul_s>(x, in.scalar);
    case DEFT_OP_DIV_SCALAR: return deft_fused_map<deft_m_div_s>(x, in.scalar);
    case DEFT_OP_RDIV_SCALAR: return deft_fused_map<deft_m_rdiv_s>(x, in.scalar);
    case DEFT_OP_MAXIMUM_SCALAR: return deft_fused_map<deft_m_max_s>(x, in.scalar);
    case DEFT_OP_POW_SCALAR: return deft_fused_map<deft_m_pow_s>(x, in.scalar);
    case DEFT_OP_NEG: return deft_fused_map<deft_m_neg>(x, 0.0);
    case DEFT_OP_EXP: return deft_fused_map<deft_m_exp>(x, 0.0);
    case DEFT_OP_LOG: return deft_fused_map<deft_m_log>(x, 0.0);
    case DEFT_OP_SQRT: return deft_fused_map<deft_m_sqrt>(x, 0.0);
    case DEFT_OP_RSQRT: return deft_fused_map<deft_m_rsqrt>(x, 0.0);
    case DEFT_OP_TANH: return deft_fused_map<deft_m_tanh>(x, 0.0);
    case DEFT_OP_SIGMOID: return deft_fused_map<deft_m_sigmoid>(x, 0.0);
    case DEFT_OP_RELU: return deft_fused_map<deft_m_relu>(x, 0.0);
    case DEFT_OP_GELU: return deft_fused_map<deft_m_gelu>(x, 0.0);
    case DEFT_OP_SILU: return deft_fused_map<deft_m_silu>(x, 0.0);
    case DEFT_OP_ACT_GRAD: return deft_fused_act_grad(in.act, x, y);
    default: return x;   /* expand: the broadcast happened in the input's load */
    }
}

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
__device__ __forceinline__ void deft_fused_eval(const deft_fused_kernel &k, const deft_fused_ptrs &p, int64_t i,
                                                float *r) {
    for (int j = 0; j < k.n_inputs; j++) {
        const int kind = k.input_kind[j];
        r[j] = kind == DEFT_FUSED_IN_SAME  ? p.in[j][i]
               : kind == DEFT_FUSED_IN_ONE ? p.in[j][0]
                                            : p.in[j][deft_fused_offset(k, j, i)];
    }
    for (int o = 0; o < k.n_ops; o++) {
        const deft_fused_instr &in = k.ops[o];
        r[k.n_inputs + o] = deft_fused_apply(in, r[in.a], r[in.b]);
    }
}

/* Every input of element i is read before any output of element i is written (outputs may alias inputs). */
__global__ void deft_k_fused(const deft_fused_kernel k, const deft_fused_ptrs p) {
    float r[DEFT_FUSED_MAX_REGS];
    for (int64_t i = deft_tid(); i < k.numel; i += deft_nthreads()) {
        deft_fused_eval(k, p, i, r);
        for (int s = 0; s < k.n_stores; s++) p.out[s][i] = r[k.store_reg[s]];
    }
}

/* One block: the chain as above, and its reduction summed in double as cuda_reduce.cu's one-block path does
 * (thread t takes elements t, t + blockDim.x, ..., then the block's tree), rounded once. */
__global__ void deft_k_fused_reduce(const deft_fused_kernel k, const deft_fused_ptrs p) {
    float r[DEFT_FUSED_MAX_REGS];
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < k.numel; i += blockDim.x) {
        deft_fused_eval(k, p, i, r);
        for (int s = 0; s < k.n_stores; s++) p.out[s][i] = r[k.store_reg[s]];
        acc += (double)r[k.reduce_reg];
    }
    acc = deft_block_reduce(acc, deft_r_sum());
    if (threadIdx.x == 0)
        p.out[k.n_stores][0] = deft_ty<float>::from_f64(k.reduce_op == DEFT_OP_MEAN ? acc / (double)k.numel : acc);
}

extern "C" deft_status deft_cuda_fused_run(const deft_fused_kernel *k, float *const *out, const float *const *in,
                                           void *stream) {
    const bool reduce = k && (k->reduce_op == DEFT_OP_SUM || k->reduce_op == DEFT_OP_MEAN);
    if (!k || k->n_inputs > DEFT_FUSED_MAX_INPUTS || k->n_ops > DEFT_FUSED_MAX_OPS || k->n_ops < 1 ||
        k->n_stores > DEFT_FUSED_MAX_STORES || k->n_stores < (reduce ? 0 : 1) || (k->reduce_op != 0 && !reduce) ||
        (reduce && (k->reduce_reg < 0 || k->reduce_reg >= k->n_inputs + k->n_ops || k->numel < 1 ||
                    k->numel > DEFT_FUSED_MAX_REDUCE_NUMEL)))
        return deft_set_error(DEFT_ERR_INVALID, "cuda fused kernel: malformed chain");
    if (k->numel == 0) return DEFT_OK;
    deft_fused_ptrs p = {};
    for (int j = 0; j < k->n_inputs; j++) p.in[j] = in[j];
    for (int s = 0; s < k->n_stores + (reduce ? 1 : 0); s++) p.out[s] = out[s];
    if (reduce)
        deft_k_fused_reduce<<<1, deft_reduce_threads(k->numel), 0, (cudaStream_t)stream>>>(*k, p);
    else
        deft_k_fused<<<deft_cuda_blocks(k->numel, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, (cudaStream_t)stream>>>(*k, p);
    cudaError_t e = deft_cuda_launch_error();
    if (e == cudaSuccess) return DEFT_OK;
    return deft_set_error(DEFT_ERR_RUNTIME, "cuda fused kernel (%d ops): %s", k->n_ops, cudaGetErrorString(e));
}
