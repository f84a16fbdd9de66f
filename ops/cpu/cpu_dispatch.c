/* The CPU backend's entry point: one switch over the op, and the helpers every kernel file shares. */
#include "cpu_internal.h"

deft_status deft_cpu_dtype_error(const deft_tensor *n, deft_dtype dt) {
    return deft_set_error(DEFT_ERR_DTYPE, "%s: dtype %s is not supported on the CPU", deft_op_name(n->op),
                          deft_dtype_name(dt));
}

int deft_cpu_coalesce(int ndim, int64_t *shape, int nops, int64_t (*strs)[DEFT_MAX_DIMS]) {
    /* Walk from the innermost dim outwards, so that `nd` counts the kept dims stored at the end of the arrays. */
    int nd = 0;
    int64_t cs[DEFT_MAX_DIMS], cst[4][DEFT_MAX_DIMS];
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] == 1) continue;
        if (nd > 0) {
            int k = DEFT_MAX_DIMS - nd;   /* the group just inside d */
            int merge = 1;
            for (int o = 0; o < nops; o++)
                if (strs[o][d] != cst[o][k] * cs[k]) merge = 0;
            if (merge) {
                cs[k] *= shape[d];
                continue;
            }
        }
        nd++;
        cs[DEFT_MAX_DIMS - nd] = shape[d];
        for (int o = 0; o < nops; o++) cst[o][DEFT_MAX_DIMS - nd] = strs[o][d];
    }
    for (int i = 0; i < nd; i++) {
        shape[i] = cs[DEFT_MAX_DIMS - nd + i];
        for (int o = 0; o < nops; o++) strs[o][i] = cst[o][DEFT_MAX_DIMS - nd + i];
    }
    return nd;
}

int deft_has_blas(void) {
#ifdef DEFT_HAVE_BLAS
    return 1;
#else
    return 0;
#endif
}

deft_status deft_cpu_run_node(const deft_tensor *n, void *out, const void *const *in) {
    if (!n) return deft_set_error(DEFT_ERR_INVALID, "cpu kernel: no node");
    switch (deft_op_info_of(n->op)->kind) {
    case DEFT_KIND_CREATE: return deft_cpu_create(n, out);
    case DEFT_KIND_BINARY: return deft_cpu_binary(n, out, in[0], in[1]);
    case DEFT_KIND_SCALAR: return deft_cpu_scalar(n, out, in[0]);
    case DEFT_KIND_UNARY: return deft_cpu_unary(n, out, in[0]);
    case DEFT_KIND_CAST: return deft_cpu_cast(n, out, in[0]);
    default: break;
    }
    switch (n->op) {
    case DEFT_OP_MATMUL:
        return deft_cpu_matmul(n, out, in[0], in[1]);
    case DEFT_OP_PERMUTE:
        return deft_cpu_permute(n, out, in[0]);
    case DEFT_OP_SLICE:
        if (n->p.slice.is_view) break;
        return deft_cpu_slice(n, out, in[0]);
    case DEFT_OP_CONCAT:
        return deft_cpu_concat(n, out, in);
    case DEFT_OP_SUM:
    case DEFT_OP_MEAN:
    case DEFT_OP_MAX:
        return deft_cpu_reduce(n, out, in[0]);
    case DEFT_OP_SOFTMAX:
    case DEFT_OP_LOG_SOFTMAX:
        return deft_cpu_softmax(n, out, in[0]);
    case DEFT_OP_ACT_GRAD:
        return deft_cpu_act_grad(n, out, in[0], in[1]);
    case DEFT_OP_EXPAND:
        return deft_cpu_expand(n, out, in[0]);
    case DEFT_OP_SLICE_GRAD:
        return deft_cpu_slice_grad(n, out, in[0]);
    case DEFT_OP_CROSS_ENTROPY:
        return deft_cpu_cross_entropy(n, out, in[0], in[1]);
    case DEFT_OP_CROSS_ENTROPY_GRAD:
        return deft_cpu_cross_entropy_grad(n, out, in[0], in[1], in[2]);
    case DEFT_OP_DROPOUT:
        return deft_cpu_dropout(n, out, in[0]);
    case DEFT_OP_CONV2D:
    case DEFT_OP_CONV2D_INPUT_GRAD:
    case DEFT_OP_CONV2D_WEIGHT_GRAD:
        return deft_cpu_conv2d(n, out, in);
    case DEFT_OP_MAX_POOL2D:
    case DEFT_OP_MAX_POOL2D_GRAD:
    case DEFT_OP_AVG_POOL2D:
    case DEFT_OP_AVG_POOL2D_GRAD:
    case DEFT_OP_ADAPTIVE_AVG_POOL2D:
    case DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD:
        return deft_cpu_pool2d(n, out, in);
    case DEFT_OP_BN_STATS:
    case DEFT_OP_BATCH_NORM:
    case DEFT_OP_BATCH_NORM_GRAD:
    case DEFT_OP_BATCH_NORM_WEIGHT_GRAD:
        return deft_cpu_batch_norm(n, out, in);
    case DEFT_OP_EMBEDDING:
    case DEFT_OP_INDEX_SELECT:
        return deft_cpu_gather(n, out, in[0], in[1]);
    case DEFT_OP_INDEX_ORDER:
        return deft_cpu_index_order(n, out, in[0]);
    case DEFT_OP_EMBEDDING_GRAD:
    case DEFT_OP_INDEX_SELECT_GRAD:
        return deft_cpu_gather_grad(n, out, in[0], in[2]);
    case DEFT_OP_WHERE:
    case DEFT_OP_MASKED_FILL:
        return deft_cpu_where(n, out, in);
    case DEFT_OP_ATTENTION:
    case DEFT_OP_ATTENTION_GRAD:
        return deft_cpu_attention(n, out, in);
    case DEFT_OP_LAYER_NORM:
    case DEFT_OP_LAYER_NORM_GRAD:
    case DEFT_OP_LAYER_NORM_WEIGHT_GRAD:
        return deft_cpu_layer_norm(n, out, in);
    default:
        break;
    }
    /* Leaves, views and copies belong to the executor; reaching here means it routed a node wrongly. */
    if ((unsigned)n->op < (unsigned)DEFT_OP_COUNT)
        return deft_set_error(DEFT_ERR_INVALID, "cpu kernel: %s%s has no kernel (the executor handles it)",
                              deft_op_name(n->op), n->op == DEFT_OP_SLICE ? " (view)" : "");
    return deft_set_error(DEFT_ERR_INVALID, "cpu kernel: unknown op %d", (int)n->op);
}
