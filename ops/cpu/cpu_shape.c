/* Layout changes that need a copy: permute, strided slices and concat. They move elements without looking at them,
 * so they work by element size and serve every dtype. */
#include <string.h>

#include "cpu_internal.h"
#include "cpu_tuning.h"

/* Square tiles for gathers whose input stride is not 1: a transpose then reads and writes whole cache lines. Their
 * side is cpu_tuning.h's. */
#define TILE DEFT_CPU_TRANSPOSE_TILE

#define GATHER_TILE(T)                                                                                           \
    do {                                                                                                         \
        T *o = (T *)out + (ot * R + i0) * L + j0;                                                                \
        const T *a = (const T *)in + off + i0 * sr + j0 * sl;                                                    \
        for (int64_t i = 0; i < ni; i++)                                                                         \
            for (int64_t j = 0; j < nj; j++) o[i * L + j] = a[i * sr + j * sl];                                  \
    } while (0)

/* Copies the strided view (shape, istr in elements) of `in` into contiguous `out`. */
static void strided_copy(void *out, const void *in, size_t esz, int ndim, const int64_t *shape_in,
                         const int64_t *istr_in) {
    int64_t shape[DEFT_MAX_DIMS], strs[1][DEFT_MAX_DIMS];
    const int64_t total = deft_shape_numel(ndim, shape_in);
    if (total == 0) return;
    memcpy(shape, shape_in, sizeof(int64_t) * (size_t)ndim);
    memcpy(strs[0], istr_in, sizeof(int64_t) * (size_t)ndim);
    const int nd = deft_cpu_coalesce(ndim, shape, 1, strs);
    const int64_t *istr = strs[0];
    if (nd == 0) {
        memcpy(out, in, esz);
        return;
    }

    if (istr[nd - 1] == 1) {
        /* Contiguous rows: memcpy each, rows split into segments so one huge row still spreads over threads. */
        const int64_t len = shape[nd - 1], rows = total / len;
        const int64_t seg = DEFT_CPU_SEGMENT * 4, nseg = (len + seg - 1) / seg, tasks = rows * nseg;
        DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN && tasks > 1))
        for (int64_t t = 0; t < tasks; t++) {
            int64_t row = t / nseg, start = (t % nseg) * seg, cnt = len - start < seg ? len - start : seg;
            int64_t off = start, r = row;
            for (int d = nd - 2; d >= 0 && r > 0; d--) {
                off += (r % shape[d]) * istr[d];
                r /= shape[d];
            }
            memcpy((char *)out + (size_t)(row * len + start) * esz, (const char *)in + (size_t)off * esz,
                   (size_t)cnt * esz);
        }
        return;
    }

    /* A gather: tile the last two dims (a single dim is a one-row tile). */
    const int64_t L = shape[nd - 1], sl = istr[nd - 1];
    const int64_t R = nd >= 2 ? shape[nd - 2] : 1, sr = nd >= 2 ? istr[nd - 2] : 0;
    const int outer_nd = nd >= 2 ? nd - 2 : 0;
    const int64_t outer = total / (R * L), tr = (R + TILE - 1) / TILE, tl = (L + TILE - 1) / TILE;
    const int64_t tasks = outer * tr * tl;
    DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN && tasks > 1))
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t ot = t / (tr * tl), i0 = (t / tl) % tr * TILE, j0 = t % tl * TILE;
        const int64_t ni = R - i0 < TILE ? R - i0 : TILE, nj = L - j0 < TILE ? L - j0 : TILE;
        int64_t off = 0, r = ot;
        for (int d = outer_nd - 1; d >= 0 && r > 0; d--) {
            off += (r % shape[d]) * istr[d];
            r /= shape[d];
        }
        switch (esz) {
        case 2: GATHER_TILE(uint16_t); break;
        case 4: GATHER_TILE(uint32_t); break;
        default: GATHER_TILE(uint64_t); break;
        }
    }
}

deft_status deft_cpu_permute(const deft_tensor *n, void *out, const void *a) {
    const deft_tensor *src = n->src[0];
    if (src->ndim != n->ndim || src->dtype != n->dtype)
        return deft_set_error(DEFT_ERR_SHAPE, "permute: input rank %d / dtype %s against output rank %d / dtype %s",
                              src->ndim, deft_dtype_name(src->dtype), n->ndim, deft_dtype_name(n->dtype));
    int64_t s[DEFT_MAX_DIMS], istr[DEFT_MAX_DIMS];
    deft_shape_strides(src->ndim, src->shape, s);
    for (int i = 0; i < n->ndim; i++) {
        int p = n->p.perm[i];
        if (p < 0 || p >= src->ndim || src->shape[p] != n->shape[i])
            return deft_set_error(DEFT_ERR_SHAPE, "permute: perm[%d] = %d does not fit the input", i, p);
        istr[i] = s[p];
    }
    strided_copy(out, a, deft_dtype_size(n->dtype), n->ndim, n->shape, istr);
    return DEFT_OK;
}

deft_status deft_cpu_slice(const deft_tensor *n, void *out, const void *a) {
    const deft_tensor *src = n->src[0];
    const int ax = n->p.slice.axis;
    const int64_t start = n->p.slice.start, step = n->p.slice.step;
    if (src->ndim != n->ndim || src->dtype != n->dtype || ax < 0 || ax >= n->ndim || start < 0 || step <= 0 ||
        (n->shape[ax] > 0 && start + (n->shape[ax] - 1) * step >= src->shape[ax]))
        return deft_set_error(DEFT_ERR_SHAPE, "slice: axis %d start %lld step %lld does not fit the input", ax,
                              (long long)start, (long long)step);
    int64_t istr[DEFT_MAX_DIMS];
    deft_shape_strides(src->ndim, src->shape, istr);
    const size_t esz = deft_dtype_size(n->dtype);
    const char *base = (const char *)a + (size_t)(start * istr[ax]) * esz;
    istr[ax] *= step;
    strided_copy(out, base, esz, n->ndim, n->shape, istr);
    return DEFT_OK;
}

/* x + 0 in place, in the arithmetic of the add kernels (cpu_binary.c): x itself but for -0, which becomes +0, and
 * NaN, which comes out quiet. A concat that stands for a sum of zero-padded gradients (p.concat.add_zero) ends so. */
static void deft_cpu_add_zero(void *out, deft_dtype dt, int64_t n) {
    switch (dt) {
    case DEFT_F32: {
        float *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = o[i] + 0.0f;
        break;
    }
    case DEFT_F64: {
        double *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = o[i] + 0.0;
        break;
    }
    case DEFT_F16: {
        uint16_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = deft_half_pack(deft_half_unpack(o[i]) + 0.0f);
        break;
    }
    case DEFT_BF16: {
        uint16_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = deft_bf16_pack(deft_bf16_unpack(o[i]) + 0.0f);
        break;
    }
    default: break;   /* integers: x + 0 is x */
    }
}

deft_status deft_cpu_concat(const deft_tensor *n, void *out, const void *const *in) {
    const int ax = n->p.axis;
    if (ax < 0 || ax >= n->ndim) return deft_set_error(DEFT_ERR_SHAPE, "concat: axis %d out of range", ax);
    const size_t esz = deft_dtype_size(n->dtype);
    const int64_t outer = deft_shape_numel(ax, n->shape);
    const int64_t inner = deft_shape_numel(n->ndim - ax - 1, n->shape + ax + 1);
    const int64_t orow = n->shape[ax] * inner;   /* one outer index's span in the output */
    int64_t acc = 0;
    for (int k = 0; k < n->nsrc; k++) {
        const deft_tensor *src = n->src[k];
        if (src->dtype != n->dtype || src->ndim != n->ndim)
            return deft_set_error(DEFT_ERR_SHAPE, "concat: input %d has rank %d / dtype %s against %d / %s", k,
                                  src->ndim, deft_dtype_name(src->dtype), n->ndim, deft_dtype_name(n->dtype));
        acc += src->shape[ax];
    }
    if (acc != n->shape[ax])
        return deft_set_error(DEFT_ERR_SHAPE, "concat: inputs sum to %lld along axis %d, output has %lld",
                              (long long)acc, ax, (long long)n->shape[ax]);
    const int64_t total = outer * orow;
    (void)total;   /* read only by OpenMP clauses */
    int64_t col = 0;
    for (int k = 0; k < n->nsrc; k++) {
        const int64_t irow = n->src[k]->shape[ax] * inner;
        const char *src = in[k];
        char *dst = (char *)out + (size_t)col * esz;
        DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN && outer > 1))
        for (int64_t o = 0; o < outer; o++)
            memcpy(dst + (size_t)(o * orow) * esz, src + (size_t)(o * irow) * esz, (size_t)irow * esz);
        col += irow;
    }
    if (n->p.concat.add_zero) deft_cpu_add_zero(out, n->dtype, total);
    return DEFT_OK;
}
