/* where and masked_fill on a GPU, as on the CPU (ops/cpu/cpu_where.c): elements chosen as bits of their size, the
 * condition nonzero in its own dtype (NaN holds, -0 does not). The output may be a same-shape input's buffer: each
 * element is read before it is written. */
#include <string.h>

#include "cuda_common.cuh"

/* Up to three operands broadcast into the output: the condition, the value where it holds (none for masked_fill,
 * whose fill is a scalar), the value elsewhere. */
struct deft_where_walk {
    int ndim;
    int64_t shape[DEFT_MAX_DIMS];
    int64_t st[3][DEFT_MAX_DIMS];
};

/* K: the condition's bits; `holds` masks out the sign of a float condition. */
template <class E, class K>
__global__ void deft_k_where(E *o, const K *cond, const E *x, const E *y, int64_t total, deft_where_walk w, K holds,
                             E fill) {
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        int64_t rest = i, oc = 0, ox = 0, oy = 0;
        for (int d = w.ndim - 1; d >= 0; d--) {
            const int64_t k = rest % w.shape[d];
            rest /= w.shape[d];
            oc += k * w.st[0][d];
            ox += k * w.st[1][d];
            oy += k * w.st[2][d];
        }
        o[i] = (cond[oc] & holds) != 0 ? (x ? x[ox] : fill) : y[oy];
    }
}

/* The bits of `holds` for a condition of dtype dt: all but the sign for floats. */
static uint64_t deft_where_holds(deft_dtype dt) {
    switch (dt) {
    case DEFT_F32: return 0x7fffffffu;
    case DEFT_F64: return 0x7fffffffffffffffull;
    case DEFT_F16:
    case DEFT_BF16: return 0x7fffu;
    default: return 0xffffffffu;
    }
}

/* v stored as dt, as the CPU's deft_store_from_f64 stores it (halves through float). */
static uint64_t deft_where_fill_bits(deft_dtype dt, double v) {
    uint64_t bits = 0;
    switch (dt) {
    case DEFT_F32: {
        const float f = (float)v;
        memcpy(&bits, &f, sizeof f);
        break;
    }
    case DEFT_F64: memcpy(&bits, &v, sizeof v); break;
    case DEFT_F16: bits = deft_f32_to_f16((float)v); break;
    case DEFT_BF16: bits = deft_f32_to_bf16((float)v); break;
    default: {
        const int32_t i = v != v ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
        memcpy(&bits, &i, sizeof i);
        break;
    }
    }
    return bits;
}

deft_status deft_cuda_where(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    const bool fill_mode = n->op == DEFT_OP_MASKED_FILL;
    /* operands in the walk's order: condition, where-true (none for masked_fill), where-false */
    const deft_tensor *ops[3] = {fill_mode ? n->src[1] : n->src[0], fill_mode ? NULL : n->src[1],
                                 fill_mode ? n->src[0] : n->src[2]};
    const void *ptr[3] = {fill_mode ? in[1] : in[0], fill_mode ? NULL : in[1], fill_mode ? in[0] : in[2]};
    deft_where_walk w;
    memset(&w, 0, sizeof w);
    w.ndim = n->ndim;
    memcpy(w.shape, n->shape, sizeof w.shape);
    for (int k = 0; k < 3; k++) {
        if (!ops[k]) continue;
        deft_status s = deft_check_expand_shape(ops[k], n);
        if (s != DEFT_OK) return deft_set_error(s, "%s: %s", deft_op_name(n->op), deft_errmsg());
        deft_broadcast_strides(ops[k]->ndim, ops[k]->shape, n->ndim, n->shape, w.st[k]);
    }
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    const uint64_t holds = deft_where_holds(ops[0]->dtype), fill = deft_where_fill_bits(n->dtype, n->p.scalar);
    return deft_with_elem_size(deft_dtype_size(n->dtype), [&](auto etag) -> deft_status {
        typedef typename decltype(etag)::type E;
        return deft_with_elem_size(deft_dtype_size(ops[0]->dtype), [&](auto ktag) -> deft_status {
            typedef typename decltype(ktag)::type K;
            deft_k_where<E, K><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
                (E *)out, (const K *)ptr[0], (const E *)ptr[1], (const E *)ptr[2], total, w, (K)holds, (E)fill);
            return deft_cuda_check_launch(n, fill_mode ? "masked_fill" : "where");
        });
    });
}
