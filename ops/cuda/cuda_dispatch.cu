/* The CUDA backend's entry point: one switch over the op, and the helpers every kernel file shares. */
#include "cuda_common.cuh"
#include "cuda_image.cuh"

int deft_cuda_coalesce(deft_cuda_strides *s, int nops) {
    /* Walk from the innermost dim outwards, keeping the merged groups at the end of the scratch arrays. */
    int nd = 0;
    int64_t cs[DEFT_MAX_DIMS], cst[2][DEFT_MAX_DIMS];
    for (int d = s->ndim - 1; d >= 0; d--) {
        if (s->shape[d] == 1) continue;
        if (nd > 0) {
            int k = DEFT_MAX_DIMS - nd;   /* the group just inside d */
            bool merge = true;
            for (int o = 0; o < nops; o++)
                if (s->st[o][d] != cst[o][k] * cs[k]) merge = false;
            if (merge) {
                cs[k] *= s->shape[d];
                continue;
            }
        }
        nd++;
        cs[DEFT_MAX_DIMS - nd] = s->shape[d];
        for (int o = 0; o < nops; o++) cst[o][DEFT_MAX_DIMS - nd] = s->st[o][d];
    }
    for (int i = 0; i < nd; i++) {
        s->shape[i] = cs[DEFT_MAX_DIMS - nd + i];
        for (int o = 0; o < 2; o++) s->st[o][i] = o < nops ? cst[o][DEFT_MAX_DIMS - nd + i] : 0;
    }
    s->ndim = nd;
    return nd;
}

/* The dtype input i must have: the output's, except for casts (any), the class-index targets of cross-entropy
 * (i32), the gathers' indices (i32), where's and masked_fill's condition (any) and batch norm, whose x and
 * gradients may be f16 or bf16 beside f32 weight and statistics (the mixes ir/build_norm.c allows; its kernels
 * dispatch on both). Returns DEFT_DTYPE_COUNT for "any". */
static deft_dtype deft_cuda_input_dtype(const deft_tensor *n, int i) {
    if (n->op == DEFT_OP_CAST || n->op == DEFT_OP_BN_STATS || n->op == DEFT_OP_BATCH_NORM ||
        n->op == DEFT_OP_BATCH_NORM_GRAD || n->op == DEFT_OP_BATCH_NORM_WEIGHT_GRAD)
        return DEFT_DTYPE_COUNT;
    if ((n->op == DEFT_OP_CROSS_ENTROPY && i == 1) || (n->op == DEFT_OP_CROSS_ENTROPY_GRAD && i == 2))
        return DEFT_I32;
    /* an f32 loss of f16 or bf16 logits, and its f32 dloss (cuda_cross_entropy.cu checks the pairs) */
    if ((n->op == DEFT_OP_CROSS_ENTROPY || n->op == DEFT_OP_CROSS_ENTROPY_GRAD) && i == 0) return DEFT_DTYPE_COUNT;
    /* the gathers' index and order; where's condition and masked_fill's mask may have any dtype */
    if (((n->op == DEFT_OP_EMBEDDING || n->op == DEFT_OP_INDEX_SELECT) && i == 1) ||
        ((n->op == DEFT_OP_EMBEDDING_GRAD || n->op == DEFT_OP_INDEX_SELECT_GRAD) && i >= 1))
        return DEFT_I32;
    if ((n->op == DEFT_OP_WHERE && i == 0) || (n->op == DEFT_OP_MASKED_FILL && i == 1)) return DEFT_DTYPE_COUNT;
    /* layer norm's value may be bf16 or f16 beside f32 x, weight and bias (autocast's deft_layer_norm_as), and its
     * gradients read dy and the forward node in that dtype (cuda_layer_norm.cu checks the pairs) */
    if (n->op == DEFT_OP_LAYER_NORM) return n->src[0]->dtype;
    if ((n->op == DEFT_OP_LAYER_NORM_GRAD || n->op == DEFT_OP_LAYER_NORM_WEIGHT_GRAD) && (i == 0 || i == 2))
        return DEFT_DTYPE_COUNT;
    return n->dtype;
}

/* Every kernel here reads inputs of the dtypes above; a node that breaks this was built wrongly, and reading it as
 * the wrong type would give garbage rather than an error. */
static deft_status deft_cuda_check_dtypes(const deft_tensor *n) {
    for (int i = 0; i < n->nsrc; i++) {
        const deft_dtype want = deft_cuda_input_dtype(n, i);
        if (want != DEFT_DTYPE_COUNT && n->src[i]->dtype != want)
            return deft_set_error(DEFT_ERR_DTYPE, "cuda %s: input %d is %s but must be %s (the output is %s)",
                                  deft_op_name(n->op), i, deft_dtype_name(n->src[i]->dtype), deft_dtype_name(want),
                                  deft_dtype_name(n->dtype));
    }
    if ((unsigned)n->dtype >= (unsigned)DEFT_DTYPE_COUNT)
        return deft_set_error(DEFT_ERR_DTYPE, "cuda %s: unknown dtype %d", deft_op_name(n->op), (int)n->dtype);
    return DEFT_OK;
}

static deft_status deft_cuda_no_kernel(const deft_tensor *n) {
    /* Leaves, views and copies belong to the executor; reaching here means it routed a node wrongly. */
    if ((unsigned)n->op < (unsigned)DEFT_OP_COUNT)
        return deft_set_error(DEFT_ERR_INVALID, "cuda kernel: %s%s has no kernel (the executor handles it)",
                              deft_op_name(n->op), n->op == DEFT_OP_SLICE ? " (view)" : "");
    return deft_set_error(DEFT_ERR_INVALID, "cuda kernel: unknown op %d", (int)n->op);
}

static deft_status deft_cuda_route(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st,
                                   unsigned flags) {
    switch (deft_op_info_of(n->op)->kind) {
    case DEFT_KIND_CREATE: return deft_cuda_create(n, out, st);
    case DEFT_KIND_BINARY: return deft_cuda_binary(n, out, in[0], in[1], st);
    case DEFT_KIND_SCALAR: return deft_cuda_scalar(n, out, in[0], st);
    case DEFT_KIND_UNARY: return deft_cuda_unary(n, out, in[0], st);
    case DEFT_KIND_CAST: return deft_cuda_cast(n, out, in[0], st);
    default: break;
    }
    switch (n->op) {
    case DEFT_OP_MATMUL:
        return deft_cuda_matmul(n, out, in[0], in[1], st, flags);
    case DEFT_OP_PERMUTE:
        return deft_cuda_permute(n, out, in[0], st);
    case DEFT_OP_SLICE:
        if (n->p.slice.is_view) break;
        return deft_cuda_slice(n, out, in[0], st);
    case DEFT_OP_CONCAT:
        return deft_cuda_concat(n, out, in, st);
    case DEFT_OP_SUM:
    case DEFT_OP_MEAN:
    case DEFT_OP_MAX:
        return deft_cuda_reduce(n, out, in[0], st);
    case DEFT_OP_SOFTMAX:
    case DEFT_OP_LOG_SOFTMAX:
        return deft_cuda_softmax(n, out, in[0], st);
    case DEFT_OP_ACT_GRAD:
        return deft_cuda_act_grad(n, out, in[0], in[1], st);
    case DEFT_OP_EXPAND:
        return deft_cuda_expand(n, out, in[0], st);
    case DEFT_OP_SLICE_GRAD:
        return deft_cuda_slice_grad(n, out, in[0], st);
    case DEFT_OP_CROSS_ENTROPY:
        return deft_cuda_cross_entropy(n, out, in[0], in[1], st);
    case DEFT_OP_CROSS_ENTROPY_GRAD:
        return deft_cuda_cross_entropy_grad(n, out, in[0], in[1], in[2], st);
    case DEFT_OP_DROPOUT:
        return deft_cuda_dropout(n, out, in[0], st);
    case DEFT_OP_CONV2D:
    case DEFT_OP_CONV2D_INPUT_GRAD:
    case DEFT_OP_CONV2D_WEIGHT_GRAD:
        return deft_cuda_conv2d(n, out, in, st, flags);
    case DEFT_OP_MAX_POOL2D:
    case DEFT_OP_MAX_POOL2D_GRAD:
    case DEFT_OP_AVG_POOL2D:
    case DEFT_OP_AVG_POOL2D_GRAD:
    case DEFT_OP_ADAPTIVE_AVG_POOL2D:
    case DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD:
        return deft_cuda_pool2d(n, out, in, st);
    case DEFT_OP_BN_STATS:
    case DEFT_OP_BATCH_NORM:
    case DEFT_OP_BATCH_NORM_GRAD:
    case DEFT_OP_BATCH_NORM_WEIGHT_GRAD:
        return deft_cuda_batch_norm(n, out, in, st);
    case DEFT_OP_ATTENTION:
    case DEFT_OP_ATTENTION_GRAD:
        return deft_cuda_attention(n, out, in, st, flags);
    case DEFT_OP_LAYER_NORM:
    case DEFT_OP_LAYER_NORM_GRAD:
    case DEFT_OP_LAYER_NORM_WEIGHT_GRAD:
        return deft_cuda_layer_norm(n, out, in, st);
    case DEFT_OP_EMBEDDING:
    case DEFT_OP_INDEX_SELECT:
        return deft_cuda_gather(n, out, in[0], in[1], st);
    case DEFT_OP_INDEX_ORDER:
        return deft_cuda_index_order(n, out, in[0], st);
    case DEFT_OP_EMBEDDING_GRAD:
    case DEFT_OP_INDEX_SELECT_GRAD:
        return deft_cuda_gather_grad(n, out, in[0], in[2], st);
    case DEFT_OP_WHERE:
    case DEFT_OP_MASKED_FILL:
        return deft_cuda_where(n, out, in, st);
    default:
        break;
    }
    return deft_cuda_no_kernel(n);
}

extern "C" deft_status deft_cuda_prepare_node(const deft_tensor *n, void *stream, unsigned flags) {
    if (!n || (n->op != DEFT_OP_ATTENTION && n->op != DEFT_OP_ATTENTION_GRAD) ||
        deft_shape_numel(n->ndim, n->shape) == 0 || deft_cuda_check_dtypes(n) != DEFT_OK)
        return DEFT_OK;   /* nothing to build; a bad node is reported by its run */
    return deft_cuda_attention_prepare(n, (cudaStream_t)stream, flags);
}

extern "C" deft_status deft_cuda_run_node(const deft_tensor *n, void *out, const void *const *in, void *stream,
                                         unsigned flags) {
    if (!n) return deft_set_error(DEFT_ERR_INVALID, "cuda kernel: no node");
    if ((unsigned)n->op >= (unsigned)DEFT_OP_COUNT || deft_op_is_leaf(n->op) || n->op == DEFT_OP_COPY ||
        n->op == DEFT_OP_RESHAPE || (n->op == DEFT_OP_SLICE && n->p.slice.is_view))
        return deft_cuda_no_kernel(n);
    deft_status s = deft_cuda_check_dtypes(n);
    if (s != DEFT_OK) return s;
    /* A launch with no blocks is an error in CUDA; an empty tensor simply has nothing to compute. */
    if (deft_shape_numel(n->ndim, n->shape) == 0) return DEFT_OK;
    return deft_cuda_route(n, out, in, (cudaStream_t)stream, flags);
}
