/* A fused elementwise kernel as data: a chain of same-shape elementwise nodes that a compiled program runs as one
 * kernel, each thread computing every member's element i in registers and storing only the members read outside the
 * chain. Members and inputs are f32, bf16 or f16 (a chain may mix them through casts): registers hold f32, and each
 * instruction's result is rounded to its node's dtype, as the one-op kernel's store would round it. Built by the
 * program's fusion pass (passes/fusion.c), run by ops/cuda/cuda_fused.cu. Plain C. */
#ifndef DEFT_FUSED_H
#define DEFT_FUSED_H

#include <stdint.h>

#include "deft.h"

#define DEFT_FUSED_MAX_INPUTS 8
#define DEFT_FUSED_MAX_OPS 24
#define DEFT_FUSED_MAX_STORES 4
#define DEFT_FUSED_MAX_REGS (DEFT_FUSED_MAX_INPUTS + DEFT_FUSED_MAX_OPS)

/* Registers 0 .. n_inputs-1 hold the inputs' elements; instruction k writes register n_inputs + k. */
typedef struct deft_fused_instr {
    int32_t op;       /* a deft_op: binary, tensor-scalar, unary, act_grad, or expand or cast (a copy of a) */
    int32_t act;      /* act_grad: the activation (a deft_op) */
    int32_t a, b;     /* operand registers (b: binary ops and act_grad's x) */
    int32_t dtype;    /* the node's deft_dtype: the result is rounded to it */
    double scalar;    /* tensor-scalar ops */
} deft_fused_instr;

typedef enum deft_fused_input_kind {
    DEFT_FUSED_IN_STRIDED = 0,   /* broadcast: offset from the element's index through strides */
    DEFT_FUSED_IN_SAME,          /* the chain's own shape: element i */
    DEFT_FUSED_IN_ONE            /* a single element, read by every thread */
} deft_fused_input_kind;

typedef struct deft_fused_kernel {
    int32_t n_inputs, n_ops, n_stores, ndim;
    int64_t numel;
    int64_t shape[DEFT_MAX_DIMS];
    int64_t strides[DEFT_FUSED_MAX_INPUTS][DEFT_MAX_DIMS];   /* in elements; 0 on broadcast dims */
    int32_t input_kind[DEFT_FUSED_MAX_INPUTS];
    int32_t input_dtype[DEFT_FUSED_MAX_INPUTS];          /* deft_dtype of each input's storage */
    int32_t store_reg[DEFT_FUSED_MAX_STORES];
    int32_t store_dtype[DEFT_FUSED_MAX_STORES + 1];      /* the last slot: the reduction's output, when there is one */
    /* DEFT_OP_SUM or DEFT_OP_MEAN of register reduce_reg over every element, written to one more output after the
     * stores (a loss's mean ending its chain); 0 for none. The kernel then runs as one block, summing in the order
     * of the reduction kernel's one-block path, so the value is the unfused one bit for bit. */
    int32_t reduce_op, reduce_reg;
    deft_fused_instr ops[DEFT_FUSED_MAX_OPS];
} deft_fused_kernel;

/* Chains ending in a reduction run as one block: past this many elements they are not fused (the reduction kernel
 * itself runs one block per output too, but the chain's other stores would lose the whole GPU). */
#define DEFT_FUSED_MAX_REDUCE_NUMEL ((int64_t)1 << 16)

/* The dtypes a fused kernel loads, computes (in f32, rounded per instruction) and stores. */
static inline int deft_fused_dtype_ok(deft_dtype dt) { return dt == DEFT_F32 || dt == DEFT_BF16 || dt == DEFT_F16; }

/* Whether a fused kernel computes op (with activation act for act_grad; a cast between the dtypes above). */
static inline int deft_fused_supports(deft_op op) {
    switch (op) {
    case DEFT_OP_ADD: case DEFT_OP_SUB: case DEFT_OP_MUL: case DEFT_OP_DIV: case DEFT_OP_MAXIMUM:
    case DEFT_OP_EQ: case DEFT_OP_GT: case DEFT_OP_GE:
    case DEFT_OP_ADD_SCALAR: case DEFT_OP_RSUB_SCALAR: case DEFT_OP_MUL_SCALAR: case DEFT_OP_DIV_SCALAR:
    case DEFT_OP_RDIV_SCALAR: case DEFT_OP_MAXIMUM_SCALAR: case DEFT_OP_POW_SCALAR:
    case DEFT_OP_NEG: case DEFT_OP_EXP: case DEFT_OP_LOG: case DEFT_OP_SQRT: case DEFT_OP_RSQRT: case DEFT_OP_TANH:
    case DEFT_OP_SIGMOID: case DEFT_OP_RELU: case DEFT_OP_GELU: case DEFT_OP_SILU: case DEFT_OP_GELU_TANH:
    case DEFT_OP_ACT_GRAD: case DEFT_OP_EXPAND: case DEFT_OP_CAST:
        return 1;
    default:
        return 0;
    }
}

#ifdef __cplusplus
extern "C" {
#endif
/* Runs k on the current device, on `stream` (a cudaStream_t): in[j] is input j (of dtype input_dtype[j]), out[s]
 * receives register store_reg[s] (as store_dtype[s]), and out[n_stores] the reduction when k has one. An output may
 * share its storage with a same-shape input (each thread reads every input of its elements before writing them).
 * Where every input is the chain's shape or one element and every pointer is 16-byte aligned, each thread takes
 * 16 bytes of elements at a time. ops/cuda/cuda_fused.cu; defined only with CUDA. */
deft_status deft_cuda_fused_run(const deft_fused_kernel *k, void *const *out, const void *const *in, void *stream);
#ifdef __cplusplus
}
#endif
#endif
