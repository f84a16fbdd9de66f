/* Elementwise builders: broadcasting binary ops, scalar forms, unary ops, casts and device moves. */
#include "device_internal.h"
#include "node.h"

static deft_tensor *deft_binary(deft_op op, deft_tensor *a, deft_tensor *b) {
    const char *name = deft_op_name(op);
    deft_tensor *srcs[2] = {a, b};
    deft_graph *g = deft_srcs_graph(name, 2, srcs);
    if (!g) return NULL;
    if (a->dtype != b->dtype) {
        deft_graph_fail(g, DEFT_ERR_DTYPE, "%s: dtypes %s and %s differ; cast one with deft_cast first", name,
                        deft_dtype_name(a->dtype), deft_dtype_name(b->dtype));
        return NULL;
    }
    if (deft_op_info_of(op)->float_only && !deft_require_float(g, name, a->dtype)) return NULL;
    int ndim;
    int64_t shape[DEFT_MAX_DIMS];
    deft_status s = deft_shape_broadcast(a->ndim, a->shape, b->ndim, b->shape, &ndim, shape);
    if (s != DEFT_OK) {
        deft_graph_fail(g, s, "%s: %s", name, deft_errmsg());
        return NULL;
    }
    return deft_node_new(g, op, a->dtype, a->device, ndim, shape, 2, srcs);
}

deft_tensor *deft_add(deft_tensor *a, deft_tensor *b) { return deft_binary(DEFT_OP_ADD, a, b); }
deft_tensor *deft_sub(deft_tensor *a, deft_tensor *b) { return deft_binary(DEFT_OP_SUB, a, b); }
deft_tensor *deft_mul(deft_tensor *a, deft_tensor *b) { return deft_binary(DEFT_OP_MUL, a, b); }
deft_tensor *deft_div(deft_tensor *a, deft_tensor *b) { return deft_binary(DEFT_OP_DIV, a, b); }
deft_tensor *deft_maximum(deft_tensor *a, deft_tensor *b) { return deft_binary(DEFT_OP_MAXIMUM, a, b); }
deft_tensor *deft_eq(deft_tensor *a, deft_tensor *b) { return deft_binary(DEFT_OP_EQ, a, b); }
deft_tensor *deft_gt(deft_tensor *a, deft_tensor *b) { return deft_binary(DEFT_OP_GT, a, b); }
deft_tensor *deft_ge(deft_tensor *a, deft_tensor *b) { return deft_binary(DEFT_OP_GE, a, b); }

/* Unary and scalar ops keep their input's shape, dtype and device. */
static deft_tensor *deft_unary(deft_op op, deft_tensor *a, double scalar) {
    deft_graph *g = deft_srcs_graph(deft_op_name(op), 1, &a);
    if (!g) return NULL;
    if (deft_op_info_of(op)->float_only && !deft_require_float(g, deft_op_name(op), a->dtype)) return NULL;
    deft_tensor *t = deft_node_new(g, op, a->dtype, a->device, a->ndim, a->shape, 1, &a);
    if (t) t->p.scalar = scalar;
    return t;
}

deft_tensor *deft_add_scalar(deft_tensor *a, double s) { return deft_unary(DEFT_OP_ADD_SCALAR, a, s); }
deft_tensor *deft_sub_scalar(deft_tensor *a, double s) { return deft_unary(DEFT_OP_ADD_SCALAR, a, -s); }
deft_tensor *deft_rsub_scalar(deft_tensor *a, double s) { return deft_unary(DEFT_OP_RSUB_SCALAR, a, s); }
deft_tensor *deft_mul_scalar(deft_tensor *a, double s) { return deft_unary(DEFT_OP_MUL_SCALAR, a, s); }
deft_tensor *deft_div_scalar(deft_tensor *a, double s) { return deft_unary(DEFT_OP_DIV_SCALAR, a, s); }
deft_tensor *deft_rdiv_scalar(deft_tensor *a, double s) { return deft_unary(DEFT_OP_RDIV_SCALAR, a, s); }
deft_tensor *deft_maximum_scalar(deft_tensor *a, double s) { return deft_unary(DEFT_OP_MAXIMUM_SCALAR, a, s); }
deft_tensor *deft_pow_scalar(deft_tensor *a, double s) { return deft_unary(DEFT_OP_POW_SCALAR, a, s); }

deft_tensor *deft_neg(deft_tensor *a) { return deft_unary(DEFT_OP_NEG, a, 0.0); }
deft_tensor *deft_exp(deft_tensor *a) { return deft_unary(DEFT_OP_EXP, a, 0.0); }
deft_tensor *deft_log(deft_tensor *a) { return deft_unary(DEFT_OP_LOG, a, 0.0); }
deft_tensor *deft_sqrt(deft_tensor *a) { return deft_unary(DEFT_OP_SQRT, a, 0.0); }
deft_tensor *deft_rsqrt(deft_tensor *a) { return deft_unary(DEFT_OP_RSQRT, a, 0.0); }
deft_tensor *deft_tanh(deft_tensor *a) { return deft_unary(DEFT_OP_TANH, a, 0.0); }
deft_tensor *deft_sigmoid(deft_tensor *a) { return deft_unary(DEFT_OP_SIGMOID, a, 0.0); }
deft_tensor *deft_relu(deft_tensor *a) { return deft_unary(DEFT_OP_RELU, a, 0.0); }
deft_tensor *deft_gelu(deft_tensor *a) { return deft_unary(DEFT_OP_GELU, a, 0.0); }
deft_tensor *deft_silu(deft_tensor *a) { return deft_unary(DEFT_OP_SILU, a, 0.0); }
deft_tensor *deft_gelu_tanh(deft_tensor *a) { return deft_unary(DEFT_OP_GELU_TANH, a, 0.0); }

static bool deft_check_target_dtype(deft_graph *g, const char *op, deft_dtype dt) {
    if ((int)dt >= 0 && dt < DEFT_DTYPE_COUNT) return true;
    deft_graph_fail(g, DEFT_ERR_DTYPE, "%s: unsupported dtype %d (deft has f32, f64, f16, bf16, i32)", op, (int)dt);
    return false;
}

deft_tensor *deft_cast(deft_tensor *a, deft_dtype dt) {
    deft_graph *g = deft_srcs_graph("cast", 1, &a);
    if (!g || !deft_check_target_dtype(g, "cast", dt)) return NULL;
    if (a->dtype == dt) return a;
    return deft_node_new(g, DEFT_OP_CAST, dt, a->device, a->ndim, a->shape, 1, &a);
}

/* A move to another device, the dtype unchanged. */
static deft_tensor *deft_copy_to(deft_graph *g, deft_tensor *a, deft_device dev) {
    deft_status s = deft_device_check(dev);
    if (s != DEFT_OK) {
        deft_graph_fail(g, s, "to: %s", deft_errmsg());
        return NULL;
    }
    return deft_node_new(g, DEFT_OP_COPY, a->dtype, dev, a->ndim, a->shape, 1, &a);
}

deft_tensor *deft_to(deft_tensor *a, deft_device dev, deft_dtype dt) {
    deft_graph *g = deft_srcs_graph("to", 1, &a);
    if (!g || !deft_check_target_dtype(g, "to", dt)) return NULL;
    if (deft_device_equal(a->device, dev)) return deft_cast(a, dt);
    /* Cast on whichever side moves fewer bytes across. */
    if (deft_dtype_size(dt) < deft_dtype_size(a->dtype)) return deft_copy_to(g, deft_cast(a, dt), dev);
    deft_tensor *moved = deft_copy_to(g, a, dev);
    return moved ? deft_cast(moved, dt) : NULL;
}
