/* The op table: one row per op, in deft_op order. */
#include "graph_internal.h"

static const deft_op_info deft_ops[DEFT_OP_COUNT] = {
    [DEFT_OP_INPUT] = {"input", DEFT_KIND_LEAF},
    [DEFT_OP_PARAM] = {"param", DEFT_KIND_LEAF},
    [DEFT_OP_CONSTANT] = {"constant", DEFT_KIND_LEAF},
    [DEFT_OP_FULL] = {"full", DEFT_KIND_CREATE},
    [DEFT_OP_ARANGE] = {"arange", DEFT_KIND_CREATE},
    [DEFT_OP_UNIFORM] = {"uniform", DEFT_KIND_CREATE},
    [DEFT_OP_NORMAL] = {"normal", DEFT_KIND_CREATE},
    [DEFT_OP_ADD] = {"add", DEFT_KIND_BINARY},
    [DEFT_OP_SUB] = {"sub", DEFT_KIND_BINARY},
    [DEFT_OP_MUL] = {"mul", DEFT_KIND_BINARY},
    [DEFT_OP_DIV] = {"div", DEFT_KIND_BINARY, true},
    [DEFT_OP_MAXIMUM] = {"maximum", DEFT_KIND_BINARY},
    [DEFT_OP_ADD_SCALAR] = {"add_scalar", DEFT_KIND_SCALAR},
    [DEFT_OP_RSUB_SCALAR] = {"rsub_scalar", DEFT_KIND_SCALAR},
    [DEFT_OP_MUL_SCALAR] = {"mul_scalar", DEFT_KIND_SCALAR},
    [DEFT_OP_DIV_SCALAR] = {"div_scalar", DEFT_KIND_SCALAR, true},
    [DEFT_OP_RDIV_SCALAR] = {"rdiv_scalar", DEFT_KIND_SCALAR, true},
    [DEFT_OP_MAXIMUM_SCALAR] = {"maximum_scalar", DEFT_KIND_SCALAR},
    [DEFT_OP_POW_SCALAR] = {"pow_scalar", DEFT_KIND_SCALAR, true},
    [DEFT_OP_NEG] = {"neg", DEFT_KIND_UNARY},
    [DEFT_OP_EXP] = {"exp", DEFT_KIND_UNARY, true},
    [DEFT_OP_LOG] = {"log", DEFT_KIND_UNARY, true},
    [DEFT_OP_SQRT] = {"sqrt", DEFT_KIND_UNARY, true},
    [DEFT_OP_RSQRT] = {"rsqrt", DEFT_KIND_UNARY, true},
    [DEFT_OP_TANH] = {"tanh", DEFT_KIND_UNARY, true},
    [DEFT_OP_SIGMOID] = {"sigmoid", DEFT_KIND_UNARY, true},
    [DEFT_OP_RELU] = {"relu", DEFT_KIND_UNARY},
    [DEFT_OP_GELU] = {"gelu", DEFT_KIND_UNARY, true},
    [DEFT_OP_SILU] = {"silu", DEFT_KIND_UNARY, true},
    [DEFT_OP_CAST] = {"cast", DEFT_KIND_CAST},
    [DEFT_OP_COPY] = {"copy", DEFT_KIND_OTHER},
    [DEFT_OP_MATMUL] = {"matmul", DEFT_KIND_OTHER},
    [DEFT_OP_RESHAPE] = {"reshape", DEFT_KIND_OTHER},
    [DEFT_OP_PERMUTE] = {"permute", DEFT_KIND_OTHER},
    [DEFT_OP_SLICE] = {"slice", DEFT_KIND_OTHER},
    [DEFT_OP_CONCAT] = {"concat", DEFT_KIND_OTHER},
    [DEFT_OP_SUM] = {"sum", DEFT_KIND_OTHER},
    [DEFT_OP_MEAN] = {"mean", DEFT_KIND_OTHER},
    [DEFT_OP_MAX] = {"max", DEFT_KIND_OTHER},
    [DEFT_OP_SOFTMAX] = {"softmax", DEFT_KIND_OTHER},
    [DEFT_OP_LOG_SOFTMAX] = {"log_softmax", DEFT_KIND_OTHER},
    [DEFT_OP_EQ] = {"eq", DEFT_KIND_BINARY},
    [DEFT_OP_GT] = {"gt", DEFT_KIND_BINARY},
    [DEFT_OP_GE] = {"ge", DEFT_KIND_BINARY},
    [DEFT_OP_ACT_GRAD] = {"act_grad", DEFT_KIND_ELEMENTWISE},
    [DEFT_OP_EXPAND] = {"expand", DEFT_KIND_OTHER},
    [DEFT_OP_SLICE_GRAD] = {"slice_grad", DEFT_KIND_OTHER},
    [DEFT_OP_CROSS_ENTROPY] = {"cross_entropy", DEFT_KIND_OTHER},
    [DEFT_OP_CROSS_ENTROPY_GRAD] = {"cross_entropy_grad", DEFT_KIND_OTHER},
    [DEFT_OP_DROPOUT] = {"dropout", DEFT_KIND_ELEMENTWISE},
    [DEFT_OP_OPTIMIZER] = {"optimizer", DEFT_KIND_OTHER},
};

const deft_op_info *deft_op_info_of(deft_op op) {
    static const deft_op_info unknown = {"unknown", DEFT_KIND_OTHER, false};
    return ((int)op >= 0 && op < DEFT_OP_COUNT) ? &deft_ops[op] : &unknown;
}

const char *deft_op_name(deft_op op) { return deft_op_info_of(op)->name; }
