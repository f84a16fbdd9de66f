/* The operation graphs of attention that cuDNN fuses into one flash-attention engine (its "SDPA" patterns), built
 * as cudnn_frontend 1.x lowers its SDPA nodes for cuDNN 9.x before 9.21 (the composite form; cuDNN 9.19's dedicated
 * CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR have no causal mask, only a block mask, so they cannot say
 * deft's element-wise causal mask). cuDNN recognises these graphs by their shape, so each tensor's dtype, rank and
 * strides and the order of the operations follow the frontend's exactly:
 *
 * forward (q, k, v -> o, stats):
 *   s = q k^T (k described as [B, H, D, T]); s *= scale; [causal mask]; m = max_j s; e = exp(s - m);
 *   z = sum_j e; stats = m + log z; p = e / z (stored as the io dtype); o = p v
 * backward (q, k, v, o, dO, stats -> dq, dk, dv):
 *   delta = sum_d (dO * o) * 1 (non-virtual f32, in the node's scratch); s = scale q k^T - stats; [causal mask];
 *   p = exp(s); dv = p^T dO; dP = dO v^T; dS = (dP - delta) * p * scale; dk = dS^T q;
 *   dq = dS k (deterministic), or dq_accum = dS k in f32 then dq = identity(dq_accum)
 * causal mask (top left, key j > query i masked): row = index(axis 2), col = index(axis 3) (int32, computed in f32);
 *   keep = row >= col (boolean); s = keep ? s : -inf.
 * (Graph form 1, tried when cuDNN refuses form 0, computes the indices in int32 and views k in the io dtype.)
 * Scalars are by-value f32 tensors of dims [1, 1, 1, 1]; virtual intermediates are f32 unless said otherwise.
 * q, k, v, o and their gradients are described with the strides they have in memory: row-major [B, H, T, D], or
 * packed (q, k, v the thirds of one [B, T, 3C], o and dO [B, T, H, D]: strides B T 3C, D, 3C, 1 and B T C, D, C, 1),
 * as torch hands its strided tensors to the frontend; k's view for dq keeps k's strides, as the frontend's does. */
#ifdef DEFT_HAVE_CUDNN

#include <math.h>

#include "cuda_attention_cudnn.cuh"

typedef struct deft_catt_builder {
    deft_cg *g;
    const deft_catt_shape *s;
    int64_t next_uid;
    cudnnBackendDescriptor_t scale, neg_inf, one;
} deft_catt_builder;

/* The layouts of the graph's 4-d tensors. */
typedef enum {
    DEFT_CATT_BHTD,     /* [B, H, T, D] row-major: intermediates, the dq accumulator */
    DEFT_CATT_QKV,      /* [B, H, T, D] as q, k, v and their gradients lie in memory */
    DEFT_CATT_QKV_T,    /* [B, H, D, T] over those: k^T, v^T */
    DEFT_CATT_OUT,      /* [B, H, T, D] as o and dO lie in memory */
    DEFT_CATT_BHTT,     /* [B, H, T, T] row-major: the scores */
    DEFT_CATT_BHTT_T,   /* [B, H, T, T] read transposed: p^T, dS^T */
    DEFT_CATT_BHT1,     /* [B, H, T, 1]: row statistics */
    DEFT_CATT_SCALAR    /* [1, 1, 1, 1] */
} deft_catt_layout;

/* The B, H and T strides of a [B, H, T, D] tensor in memory (D's is 1): row-major, or packed with rows `row` apart. */
static void deft_catt_io_strides(const deft_catt_shape *s, deft_catt_layout l, int64_t *st) {
    const int64_t h = s->h, t = s->t, d = s->d, c = h * d;
    if (!s->packed || l == DEFT_CATT_BHTD) {
        st[0] = h * t * d, st[1] = t * d, st[2] = d;
        return;
    }
    const int64_t row = l == DEFT_CATT_OUT ? c : 3 * c;
    st[0] = t * row, st[1] = d, st[2] = row;
}

static void deft_catt_dims(const deft_catt_shape *s, deft_catt_layout l, int64_t *dim, int64_t *st) {
    const int64_t b = s->b, h = s->h, t = s->t, d = s->d;
    int64_t io[3];
    deft_catt_io_strides(s, l, io);
    switch (l) {
    case DEFT_CATT_BHTD:
    case DEFT_CATT_QKV:
    case DEFT_CATT_OUT:
        dim[0] = b, dim[1] = h, dim[2] = t, dim[3] = d;
        st[0] = io[0], st[1] = io[1], st[2] = io[2], st[3] = 1;
        break;
    case DEFT_CATT_QKV_T:
        dim[0] = b, dim[1] = h, dim[2] = d, dim[3] = t;
        st[0] = io[0], st[1] = io[1], st[2] = 1, st[3] = io[2];
        break;
    case DEFT_CATT_BHTT:
        dim[0] = b, dim[1] = h, dim[2] = t, dim[3] = t;
        st[0] = h * t * t, st[1] = t * t, st[2] = t, st[3] = 1;
        break;
    case DEFT_CATT_BHTT_T:
        dim[0] = b, dim[1] = h, dim[2] = t, dim[3] = t;
        st[0] = h * t * t, st[1] = t * t, st[2] = 1, st[3] = t;
        break;
    case DEFT_CATT_BHT1:
        dim[0] = b, dim[1] = h, dim[2] = t, dim[3] = 1;
        st[0] = h * t, st[1] = t, st[2] = 1, st[3] = 1;
        break;
    default:
        for (int i = 0; i < 4; i++) dim[i] = st[i] = 1;
        break;
    }
}

static cudnnBackendDescriptor_t deft_catt_tensor(deft_catt_builder *bl, int64_t uid, cudnnDataType_t type,
                                                 deft_catt_layout l, unsigned flags, const char *name) {
    int64_t dim[4], st[4];
    deft_catt_dims(bl->s, l, dim, st);
    return deft_cg_tensor(bl->g, uid, type, 4, dim, st, flags, name);
}

/* A virtual intermediate with the next free id. */
static cudnnBackendDescriptor_t deft_catt_virtual(deft_catt_builder *bl, cudnnDataType_t type, deft_catt_layout l,
                                                  const char *name) {
    return deft_catt_tensor(bl, bl->next_uid++, type, l, DEFT_CG_VIRTUAL, name);
}

static cudnnBackendDescriptor_t deft_catt_scalar(deft_catt_builder *bl, int64_t uid, const char *name) {
    return deft_catt_tensor(bl, uid, CUDNN_DATA_FLOAT, DEFT_CATT_SCALAR, DEFT_CG_BY_VALUE, name);
}

/* y = op(x[, b]) in f32, y a new virtual f32 tensor of layout l. */
static cudnnBackendDescriptor_t deft_catt_pw(deft_catt_builder *bl, cudnnPointwiseMode_t mode,
                                             cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                             deft_catt_layout l, const char *name) {
    cudnnBackendDescriptor_t y = deft_catt_virtual(bl, CUDNN_DATA_FLOAT, l, name);
    deft_cg_pointwise(bl->g, mode, CUDNN_DATA_FLOAT, x, b, NULL, y, -1, name);
    return y;
}

/* The causal mask of the scores x: key j > query i becomes -inf. */
static cudnnBackendDescriptor_t deft_catt_causal(deft_catt_builder *bl, cudnnBackendDescriptor_t x) {
    const cudnnDataType_t index_prec = bl->s->variant == 0 ? CUDNN_DATA_FLOAT : CUDNN_DATA_INT32;
    cudnnBackendDescriptor_t row = deft_catt_virtual(bl, CUDNN_DATA_INT32, DEFT_CATT_BHTT, "row_index");
    deft_cg_pointwise(bl->g, CUDNN_POINTWISE_GEN_INDEX, index_prec, x, NULL, NULL, row, 2, "gen_row_index");
    cudnnBackendDescriptor_t col = deft_catt_virtual(bl, CUDNN_DATA_INT32, DEFT_CATT_BHTT, "col_index");
    deft_cg_pointwise(bl->g, CUDNN_POINTWISE_GEN_INDEX, index_prec, x, NULL, NULL, col, 3, "gen_col_index");
    cudnnBackendDescriptor_t keep = deft_catt_virtual(bl, CUDNN_DATA_BOOLEAN, DEFT_CATT_BHTT, "row_ge_col");
    deft_cg_pointwise(bl->g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1, "row_ge_col");
    cudnnBackendDescriptor_t y = deft_catt_virtual(bl, CUDNN_DATA_FLOAT, DEFT_CATT_BHTT, "masked");
    deft_cg_pointwise(bl->g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, bl->neg_inf, keep, y, -1,
                      "causal_select");
    return y;
}

static void deft_catt_forward(deft_catt_builder *bl) {
    deft_cg *g = bl->g;
    const cudnnDataType_t io = bl->s->io;
    cudnnBackendDescriptor_t q = deft_catt_tensor(bl, DEFT_CATT_UID_Q, io, DEFT_CATT_QKV, 0, "q");
    cudnnBackendDescriptor_t kt = deft_catt_tensor(bl, DEFT_CATT_UID_K, io, DEFT_CATT_QKV_T, 0, "k^T");
    cudnnBackendDescriptor_t v = deft_catt_tensor(bl, DEFT_CATT_UID_V, io, DEFT_CATT_QKV, 0, "v");
    cudnnBackendDescriptor_t o = deft_catt_tensor(bl, DEFT_CATT_UID_O, io, DEFT_CATT_OUT, 0, "o");
    cudnnBackendDescriptor_t stats =
        deft_catt_tensor(bl, DEFT_CATT_UID_STATS, CUDNN_DATA_FLOAT, DEFT_CATT_BHT1, 0, "stats");
    bl->scale = deft_catt_scalar(bl, DEFT_CATT_UID_SCALE, "attn_scale");
    if (bl->s->causal) bl->neg_inf = deft_catt_scalar(bl, DEFT_CATT_UID_NEG_INF, "negative_infinity");

    cudnnBackendDescriptor_t s = deft_catt_virtual(bl, CUDNN_DATA_FLOAT, DEFT_CATT_BHTT, "bmm1");
    deft_cg_matmul(g, q, kt, s, "bmm1 (q k^T)");
    s = deft_catt_pw(bl, CUDNN_POINTWISE_MUL, s, bl->scale, DEFT_CATT_BHTT, "attn_scale");
    if (bl->s->causal) s = deft_catt_causal(bl, s);
    cudnnBackendDescriptor_t m = deft_catt_virtual(bl, CUDNN_DATA_FLOAT, DEFT_CATT_BHT1, "max");
    deft_cg_reduce(g, CUDNN_REDUCE_TENSOR_MAX, s, m, "max");
    cudnnBackendDescriptor_t e = deft_catt_pw(bl, CUDNN_POINTWISE_SUB, s, m, DEFT_CATT_BHTT, "sub_max");
    e = deft_catt_pw(bl, CUDNN_POINTWISE_EXP, e, NULL, DEFT_CATT_BHTT, "exp");
    cudnnBackendDescriptor_t z = deft_catt_virtual(bl, CUDNN_DATA_FLOAT, DEFT_CATT_BHT1, "sum_exp");
    deft_cg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z, "sum_exp");
    cudnnBackendDescriptor_t logz = deft_catt_pw(bl, CUDNN_POINTWISE_LOG, z, NULL, DEFT_CATT_BHT1, "log");
    deft_cg_pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, m, logz, NULL, stats, -1, "stats (max + log)");
    /* the probabilities enter the second product in the io dtype, as the frontend's bmm2 requires */
    cudnnBackendDescriptor_t p = deft_catt_virtual(bl, io, DEFT_CATT_BHTT, "softmax");
    deft_cg_pointwise(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, z, NULL, p, -1, "div");
    deft_cg_matmul(g, p, v, o, "bmm2 (p v)");
}

/* delta = rowsum(dO * o), stored (the frontend's softmax_sum) */
static cudnnBackendDescriptor_t deft_catt_delta(deft_catt_builder *bl, cudnnBackendDescriptor_t dout,
                                                cudnnBackendDescriptor_t o) {
    cudnnBackendDescriptor_t prod = deft_catt_pw(bl, CUDNN_POINTWISE_MUL, dout, o, DEFT_CATT_BHTD, "mul_dO_O");
    cudnnBackendDescriptor_t sum = deft_catt_virtual(bl, CUDNN_DATA_FLOAT, DEFT_CATT_BHT1, "reduce_dO_O");
    deft_cg_reduce(bl->g, CUDNN_REDUCE_TENSOR_ADD, prod, sum, "reduce_dO_O");
    cudnnBackendDescriptor_t delta =
        deft_catt_tensor(bl, DEFT_CATT_UID_DELTA, CUDNN_DATA_FLOAT, DEFT_CATT_BHT1, 0, "softmax_sum");
    deft_cg_pointwise(bl->g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, sum, bl->one, NULL, delta, -1,
                      "scale_dropout_inv");
    return delta;
}

static void deft_catt_backward(deft_catt_builder *bl) {
    deft_cg *g = bl->g;
    const cudnnDataType_t io = bl->s->io;
    cudnnBackendDescriptor_t q = deft_catt_tensor(bl, DEFT_CATT_UID_Q, io, DEFT_CATT_QKV, 0, "q");
    cudnnBackendDescriptor_t kt = deft_catt_tensor(bl, DEFT_CATT_UID_K, io, DEFT_CATT_QKV_T, 0, "k^T");
    cudnnBackendDescriptor_t vt = deft_catt_tensor(bl, DEFT_CATT_UID_V, io, DEFT_CATT_QKV_T, 0, "v^T");
    cudnnBackendDescriptor_t o = deft_catt_tensor(bl, DEFT_CATT_UID_O, io, DEFT_CATT_OUT, 0, "o");
    cudnnBackendDescriptor_t dout = deft_catt_tensor(bl, DEFT_CATT_UID_DO, io, DEFT_CATT_OUT, 0, "dO");
    cudnnBackendDescriptor_t stats =
        deft_catt_tensor(bl, DEFT_CATT_UID_STATS, CUDNN_DATA_FLOAT, DEFT_CATT_BHT1, 0, "stats");
    cudnnBackendDescriptor_t dq = deft_catt_tensor(bl, DEFT_CATT_UID_DQ, io, DEFT_CATT_QKV, 0, "dq");
    cudnnBackendDescriptor_t dk = deft_catt_tensor(bl, DEFT_CATT_UID_DK, io, DEFT_CATT_QKV, 0, "dk");
    cudnnBackendDescriptor_t dv = deft_catt_tensor(bl, DEFT_CATT_UID_DV, io, DEFT_CATT_QKV, 0, "dv");
    bl->scale = deft_catt_scalar(bl, DEFT_CATT_UID_SCALE, "attn_scale");
    bl->one = deft_catt_scalar(bl, DEFT_CATT_UID_ONE, "one");
    if (bl->s->causal) bl->neg_inf = deft_catt_scalar(bl, DEFT_CATT_UID_NEG_INF, "negative_infinity");

    cudnnBackendDescriptor_t delta = deft_catt_delta(bl, dout, o);
    /* p = exp(scale q k^T - stats), masked */
    cudnnBackendDescriptor_t s = deft_catt_virtual(bl, CUDNN_DATA_FLOAT, DEFT_CATT_BHTT, "matmul_Q_KT");
    deft_cg_matmul(g, q, kt, s, "matmul_Q_KT");
    s = deft_catt_pw(bl, CUDNN_POINTWISE_MUL, s, bl->scale, DEFT_CATT_BHTT, "mul_s_attn_scale");
    s = deft_catt_pw(bl, CUDNN_POINTWISE_SUB, s, stats, DEFT_CATT_BHTT, "sub_s_m");
    if (bl->s->causal) s = deft_catt_causal(bl, s);
    cudnnBackendDescriptor_t p = deft_catt_pw(bl, CUDNN_POINTWISE_EXP, s, NULL, DEFT_CATT_BHTT, "exp_s");
    /* dv = p^T dO */
    cudnnBackendDescriptor_t pt = deft_catt_virtual(bl, io, DEFT_CATT_BHTT_T, "reshape_p");
    deft_cg_reshape(g, p, pt, "reshape_p");
    deft_cg_matmul(g, pt, dout, dv, "matmul_pT_dO");
    /* dS = (dO v^T - delta) * p * scale */
    cudnnBackendDescriptor_t ds = deft_catt_virtual(bl, CUDNN_DATA_FLOAT, DEFT_CATT_BHTT, "matmul_dO_VT");
    deft_cg_matmul(g, dout, vt, ds, "matmul_dO_VT");
    ds = deft_catt_pw(bl, CUDNN_POINTWISE_SUB, ds, delta, DEFT_CATT_BHTT, "sub_dP_softmax_sum");
    ds = deft_catt_pw(bl, CUDNN_POINTWISE_MUL, ds, p, DEFT_CATT_BHTT, "mul_dP_exp_s");
    ds = deft_catt_pw(bl, CUDNN_POINTWISE_MUL, ds, bl->scale, DEFT_CATT_BHTT, "mul_dS_attn_scale");
    /* dk = dS^T q */
    cudnnBackendDescriptor_t dst = deft_catt_virtual(bl, io, DEFT_CATT_BHTT_T, "reshape_dS");
    deft_cg_reshape(g, ds, dst, "reshape_dS");
    deft_cg_matmul(g, dst, q, dk, "matmul_dST_Q");
    /* dq = dS k: k^T seen as [B, H, T, D] (a virtual view; f32 as the frontend's reshape infers it) */
    cudnnBackendDescriptor_t k =
        deft_catt_virtual(bl, bl->s->variant == 0 ? CUDNN_DATA_FLOAT : io, DEFT_CATT_QKV, "reshape_k");
    deft_cg_reshape(g, kt, k, "reshape_k");
    if (bl->s->deterministic) {
        deft_cg_matmul(g, ds, k, dq, "matmul_dS_K");
        return;
    }
    cudnnBackendDescriptor_t accum =
        deft_catt_tensor(bl, DEFT_CATT_UID_ACCUM, CUDNN_DATA_FLOAT, DEFT_CATT_BHTD, 0, "dQ_accum");
    deft_cg_matmul(g, ds, k, accum, "matmul_dS_K");
    deft_cg_pointwise(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, accum, NULL, NULL, dq, -1, "identity_dQ");
}

bool deft_catt_build_graph(deft_cg *g, cudnnHandle_t h, const deft_catt_shape *s) {
    deft_catt_builder bl = {g, s, DEFT_CATT_UID_VIRTUAL, NULL, NULL, NULL};
    if (s->forward) deft_catt_forward(&bl);
    else deft_catt_backward(&bl);
    deft_cg_finish(g, h);
    return deft_cg_ok(g);
}

#endif
