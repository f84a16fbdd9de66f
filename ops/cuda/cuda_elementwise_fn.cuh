/* The formulas of the elementwise ops on CUDA, one functor each, shared by the one-op kernels
 * (cuda_elementwise.cu, cuda_train.cu) and the fused kernel (cuda_fused.cu), so that a fused chain computes what the
 * same ops would one kernel at a time, bit for bit. The formulas are the CPU backend's (ops/cpu/). */
#ifndef DEFT_CUDA_ELEMENTWISE_FN_CUH
#define DEFT_CUDA_ELEMENTWISE_FN_CUH

#include "cuda_common.cuh"

#define DEFT_SQRT1_2 0.70710678118654752440
#define DEFT_INV_SQRT_2PI 0.39894228040143267794

/* ---- binary ---- */
struct deft_f_add { template <class C> __device__ C operator()(C x, C y) const { return x + y; } };
struct deft_f_sub { template <class C> __device__ C operator()(C x, C y) const { return x - y; } };
struct deft_f_mul { template <class C> __device__ C operator()(C x, C y) const { return x * y; } };
struct deft_f_div { template <class C> __device__ C operator()(C x, C y) const { return x / y; } };
struct deft_f_maximum { template <class C> __device__ C operator()(C x, C y) const { return deft_max_nan(x, y); } };
/* Comparisons: 1 or 0 in the operands' dtype; any comparison with NaN is false, as in torch. */
struct deft_f_eq { template <class C> __device__ C operator()(C x, C y) const { return x == y ? C(1) : C(0); } };
struct deft_f_gt { template <class C> __device__ C operator()(C x, C y) const { return x > y ? C(1) : C(0); } };
struct deft_f_ge { template <class C> __device__ C operator()(C x, C y) const { return x >= y ? C(1) : C(0); } };

/* ---- tensor-scalar and unary ops: FN<C> is a functor of the compute type; `y` is the op's scalar rounded to C
 * (torch computes a float tensor with a python scalar in the tensor's precision, and so does the CPU backend) ---- */
#define DEFT_MAP_FN(name, EXPR)                                                                                      \
    template <class C> struct name {                                                                                 \
        C y;                                                                                                         \
        __device__ C operator()(C x) const { return EXPR; }                                                          \
    };

DEFT_MAP_FN(deft_m_add_s, x + y)
DEFT_MAP_FN(deft_m_rsub_s, y - x)
DEFT_MAP_FN(deft_m_mul_s, x * y)
DEFT_MAP_FN(deft_m_div_s, x / y)
DEFT_MAP_FN(deft_m_rdiv_s, y / x)
DEFT_MAP_FN(deft_m_max_s, deft_max_nan(x, y))
/* pow(x, 2) as x * x, as the CPU does: exact-rounded and the common case (squares in losses and norms). */
DEFT_MAP_FN(deft_m_pow_s, y == C(2) ? x * x : deft_math_pow(x, y))
DEFT_MAP_FN(deft_m_neg, -x)
DEFT_MAP_FN(deft_m_exp, deft_math_exp(x))
DEFT_MAP_FN(deft_m_log, deft_math_log(x))
DEFT_MAP_FN(deft_m_sqrt, deft_math_sqrt(x))
DEFT_MAP_FN(deft_m_rsqrt, C(1) / deft_math_sqrt(x))
DEFT_MAP_FN(deft_m_tanh, deft_math_tanh(x))
DEFT_MAP_FN(deft_m_sigmoid, deft_math_sigmoid(x))
/* x < 0 ? 0 : x rather than x > 0 ? x : 0, so that NaN passes through as in torch. */
DEFT_MAP_FN(deft_m_relu, x < C(0) ? C(0) : x)
/* The exact (erf) form, torch's default, written with erfc (1 + erf(t) = erfc(-t)) to keep its precision where
 * erf(t) nears -1; 1/sqrt(2) rounded to C first, as the CPU does. */
DEFT_MAP_FN(deft_m_gelu, C(0.5) * x * deft_math_erfc(-x * C(0.70710678118654752440)))
DEFT_MAP_FN(deft_m_silu, x * deft_math_sigmoid(x))
/* torch's approximate='tanh', in the CPU's order of operations; the constants rounded to C first. */
#define DEFT_SQRT_2_PI 0.79788456080286535588
#define DEFT_GELU_KAPPA 0.044715
DEFT_MAP_FN(deft_m_gelu_tanh,
            C(0.5) * x * (C(1) + deft_math_tanh(C(DEFT_SQRT_2_PI) * (x + C(DEFT_GELU_KAPPA) * (x * x * x)))))

/* ---- activation gradients: out = dy * act'(x) ---- */
/* relu'(0) = 0, and x <= 0 rather than x > 0 so that a NaN input passes dy on, as torch's threshold_backward. */
struct deft_ag_relu {
    template <class C> __device__ C operator()(C dy, C x) const { return x <= C(0) ? C(0) : dy; }
};
/* The exact (erf) gelu: Phi(x) + x * phi(x), with Phi written through erfc as the forward is. */
struct deft_ag_gelu {
    template <class C> __device__ C operator()(C dy, C x) const {
        const C d = C(0.5) * deft_math_erfc(-x * C(DEFT_SQRT1_2)) +
                    x * C(DEFT_INV_SQRT_2PI) * deft_math_exp(C(-0.5) * x * x);
        return dy * d;
    }
};
/* torch's gelu_backward(approximate='tanh'), as the CPU writes it. */
struct deft_ag_gelu_tanh {
    template <class C> __device__ C operator()(C dy, C x) const {
        const C x2 = x * x, t = deft_math_tanh(C(DEFT_SQRT_2_PI) * (x + C(DEFT_GELU_KAPPA) * x2 * x));
        return dy * (C(0.5) * (C(1) + t) +
                     C(0.5) * x * (C(1) - t * t) * (C(DEFT_SQRT_2_PI) * (C(1) + C(3) * C(DEFT_GELU_KAPPA) * x2)));
    }
};
struct deft_ag_silu {
    template <class C> __device__ C operator()(C dy, C x) const {
        const C s = deft_math_sigmoid(x);
        return dy * (s + x * s * (C(1) - s));
    }
};
struct deft_ag_tanh {
    template <class C> __device__ C operator()(C dy, C x) const {
        const C t = deft_math_tanh(x);
        return dy * (C(1) - t * t);
    }
};
struct deft_ag_sigmoid {
    template <class C> __device__ C operator()(C dy, C x) const {
        const C s = deft_math_sigmoid(x);
        return dy * (s * (C(1) - s));
    }
};

#endif
