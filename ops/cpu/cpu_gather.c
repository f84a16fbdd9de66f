/* Gathers on the CPU: embedding and index_select (rows copied, any dtype), the order their gradients sum by (a
 * stable counting sort of the index), and the gradients (each row of the result a sum of dy's rows in that order,
 * so the bits never depend on the threads). An index outside its range fails the run, naming it. */
#include <string.h>

#include "cpu_internal.h"
#include "gather.h"

/* The first bad entry of idx[0..n) (its position), or -1. */
static int64_t gather_first_bad(const int32_t *idx, int64_t n, int64_t rows) {
    for (int64_t j = 0; j < n; j++)
        if (idx[j] < 0 || idx[j] >= rows) return j;
    return -1;
}

static deft_status gather_check_index(const int32_t *idx, int64_t n, int64_t rows, bool embedding) {
    const int64_t j = gather_first_bad(idx, n, rows);
    if (j < 0) return DEFT_OK;
    return deft_set_error(DEFT_ERR_INVALID, DEFT_GATHER_BAD_FMT, embedding ? "embedding" : "index_select",
                          deft_gather_index_word(embedding), (int)idx[j], (long long)j, (long long)rows);
}

/* out[o, j, :] = a[o, idx[j], :]: rows of inner elements, moved as bytes. */
deft_status deft_cpu_gather(const deft_tensor *n, void *out, const void *a, const void *index) {
    deft_gather_dims d;
    deft_status s = deft_gather_dims_of(n, &d);
    if (s != DEFT_OK) return s;
    const int32_t *idx = index;
    s = gather_check_index(idx, d.n, d.rows, n->op == DEFT_OP_EMBEDDING);
    if (s != DEFT_OK) return s;
    const size_t rowb = (size_t)d.inner * deft_dtype_size(n->dtype);
    const int64_t total = d.outer * d.n;
    DEFT_OMP(parallel for schedule(static) if (total * d.inner > DEFT_CPU_PAR_MIN && total > 1))
    for (int64_t r = 0; r < total; r++) {
        const int64_t o = r / d.n, j = r % d.n;
        memcpy((char *)out + (size_t)r * rowb, (const char *)a + (size_t)(o * d.rows + idx[j]) * rowb, rowb);
    }
    return DEFT_OK;
}

/* The keys (value << 32 | position) in ascending order, the padding after them, then each value's first slot: a
 * stable counting sort, filled from the last position down so that each value's slots end where the next begin. */
deft_status deft_cpu_index_order(const deft_tensor *n, void *out, const void *index) {
    const deft_tensor *ti = n->src[0];
    const int64_t cnt = deft_shape_numel(ti->ndim, ti->shape), rows = n->p.gather.rows;
    if (ti->dtype != DEFT_I32 || !deft_index_order_fits(n, cnt, rows))
        return deft_set_error(DEFT_ERR_SHAPE, "index_order: %lld indices into %lld rows do not fit its %lld words",
                              (long long)cnt, (long long)rows, (long long)n->shape[0]);
    const int32_t *idx = index;
    deft_status s = gather_check_index(idx, cnt, rows, n->p.gather.embedding != 0);
    if (s != DEFT_OK) return s;
    const int64_t pad = deft_index_order_pad(cnt);
    uint64_t *keys = out;
    int32_t *first = (int32_t *)(keys + pad);
    memset(first, 0, (size_t)(rows + 1) * sizeof *first);
    for (int64_t j = 0; j < cnt; j++) first[idx[j]]++;
    int32_t end = 0;   /* first[v] becomes the end of v's slots: the start of v + 1's */
    for (int64_t v = 0; v < rows; v++) {
        end += first[v];
        first[v] = end;
    }
    first[rows] = (int32_t)cnt;
    for (int64_t j = cnt - 1; j >= 0; j--) keys[--first[idx[j]]] = (uint64_t)(uint32_t)idx[j] << 32 | (uint64_t)j;
    for (int64_t i = cnt; i < pad; i++) keys[i] = UINT64_MAX;
    return DEFT_OK;
}

/* Row r = (o, v) of the result is the sum, in the order's slots first[v] .. first[v + 1] (positions ascending), of
 * dy's rows (o, position): in the compute type, a block of columns at a time, rounded once on the store. */
#define GRAD_BLOCK 64
#define GATHER_GRAD(T, C, LD, ST)                                                                                \
    do {                                                                                                         \
        T *o_ = out;                                                                                             \
        const T *g_ = dy;                                                                                        \
        DEFT_OMP(parallel for schedule(static) if (total * d.inner > DEFT_CPU_PAR_MIN && total > 1))             \
        for (int64_t r = 0; r < total; r++) {                                                                    \
            const int64_t o = r / d.rows, v = r % d.rows;                                                        \
            for (int64_t c0 = 0; c0 < d.inner; c0 += GRAD_BLOCK) {                                               \
                const int64_t w = d.inner - c0 < GRAD_BLOCK ? d.inner - c0 : GRAD_BLOCK;                         \
                C acc[GRAD_BLOCK];                                                                               \
                for (int64_t c = 0; c < w; c++) acc[c] = 0;                                                      \
                for (int32_t i = first[v]; i < first[v + 1]; i++) {                                              \
                    const T *src = g_ + ((o * d.n + (int64_t)(uint32_t)keys[i]) * d.inner + c0);                 \
                    for (int64_t c = 0; c < w; c++) acc[c] += LD(src[c]);                                        \
                }                                                                                                \
                for (int64_t c = 0; c < w; c++) o_[r * d.inner + c0 + c] = ST(acc[c]);                           \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)

#define LD_SAME(v) (v)

deft_status deft_cpu_gather_grad(const deft_tensor *n, void *out, const void *dy, const void *order) {
    deft_gather_dims d;
    const uint64_t *keys = NULL;
    const int32_t *first = NULL;
    deft_status s = deft_gather_grad_dims_of(n, order, &d, &keys, &first);
    if (s != DEFT_OK) return s;
    const int64_t total = d.outer * d.rows;
    switch (n->dtype) {
    case DEFT_F32: GATHER_GRAD(float, float, LD_SAME, LD_SAME); break;
    case DEFT_F64: GATHER_GRAD(double, double, LD_SAME, LD_SAME); break;
    case DEFT_F16: GATHER_GRAD(uint16_t, float, deft_half_unpack, deft_half_pack); break;
    case DEFT_BF16: GATHER_GRAD(uint16_t, float, deft_bf16_unpack, deft_bf16_pack); break;
    default: return deft_cpu_dtype_error(n, n->dtype);
    }
    return DEFT_OK;
}
