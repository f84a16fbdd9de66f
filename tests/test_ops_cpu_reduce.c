/* CPU kernels, reductions: sum, mean and max over every combination of axes with and without keepdim, long
 * reductions (blocked partial results) on both contiguous and strided layouts, NaN in max, and softmax /
 * log_softmax along every axis, with large logits and -inf, against a float64 reference. */
#include "ref.h"

static uint64_t rng = 0x5eed0003ull;

typedef enum { R_SUM, R_MEAN, R_MAX } red_kind;
static const char *const red_names[] = {"sum", "mean", "max"};

static deft_tensor *red_build(red_kind k, deft_tensor *a, int naxes, const int *axes, int keepdim) {
    switch (k) {
    case R_SUM: return deft_sum(a, naxes, axes, keepdim);
    case R_MEAN: return deft_mean(a, naxes, axes, keepdim);
    default: return deft_max(a, naxes, axes, keepdim);
    }
}

/* The reference: output index of each input element with the reduced axes dropped; sums in long double so the
 * reference is more precise than the kernel's double accumulator. */
static void red_ref(red_kind k, const ref_tensor *a, uint32_t mask, double *want, int64_t nout) {
    long double *acc = malloc((size_t)nout * sizeof(long double));
    int64_t *cnt = calloc((size_t)nout, sizeof(int64_t));
    for (int64_t o = 0; o < nout; o++) acc[o] = k == R_MAX ? -INFINITY : 0.0L;
    int64_t idx[DEFT_MAX_DIMS];
    for (int64_t i = 0; i < a->n; i++) {
        ref_unravel(a->ndim, a->shape, i, idx);
        int64_t o = 0;
        for (int d = 0; d < a->ndim; d++)
            if (!(mask & (1u << d))) o = o * a->shape[d] + idx[d];
        const double v = a->v[i];
        if (k == R_MAX) acc[o] = (isnan(v) || isnan((double)acc[o])) ? NAN : (v > acc[o] ? v : acc[o]);
        else acc[o] += v;
        cnt[o]++;
    }
    for (int64_t o = 0; o < nout; o++)
        want[o] = ref_round(a->dt, k == R_MEAN ? (double)(acc[o] / (long double)cnt[o]) : (double)acc[o]);
    free(acc);
    free(cnt);
}

static void check_reduce(const ref_tensor *a, red_kind k, uint32_t mask, int keepdim, int all_by_zero) {
    int axes[DEFT_MAX_DIMS], naxes = 0;
    for (int d = 0; d < a->ndim; d++)
        if (mask & (1u << d)) axes[naxes++] = d - ((d & 1) ? a->ndim : 0);   /* negative axes on odd dims */
    if (all_by_zero) naxes = 0;
    int64_t oshape[DEFT_MAX_DIMS];
    int ond = 0;
    for (int d = 0; d < a->ndim; d++) {
        if (!(mask & (1u << d))) oshape[ond++] = a->shape[d];
        else if (keepdim) oshape[ond++] = 1;
    }
    const int64_t nout = ref_numel(ond, oshape);
    char what[160], sa[64];
    snprintf(what, sizeof what, "%s %s %s mask 0x%x%s%s", red_names[k], deft_dtype_name(a->dt),
             ref_shape_str(a->ndim, a->shape, sa, sizeof sa), mask, keepdim ? " keepdim" : "",
             all_by_zero ? " (naxes 0)" : "");
    deft_graph *g = deft_graph_new();
    deft_tensor *r = red_build(k, ref_const(g, a), naxes, axes, keepdim);
    CHECK_MSG(ref_shape_eq(r, ond, oshape), "%s: wrong output shape", what);
    double *got = ref_realize(r);
    if (got && deft_tensor_numel(r) == nout) {
        double *want = malloc((size_t)nout * sizeof(double));
        red_ref(k, a, mask, want, nout);
        ref_close(what, a->dt, got, want, nout);
        free(want);
    }
    free(got);
    deft_graph_free(g);
}

/* Every subset of axes of two small shapes (one with a size-1 axis), each dtype, with and without keepdim. */
static void test_all_axis_combos(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    static const int64_t s4[4] = {3, 1, 4, 5}, s5[5] = {2, 3, 1, 4, 7};
    const int64_t *shapes[2] = {s4, s5};
    const int nds[2] = {4, 5};
    for (int si = 0; si < 2; si++)
        for (int di = 0; di < 5; di++) {
            ref_tensor a = ref_random(&rng, dts[di], nds[si], shapes[si], -1000, 1000);
            for (uint32_t mask = 1; mask < (1u << nds[si]); mask++)
                for (int k = 0; k < 3; k++) {
                    if (k == R_MEAN && dts[di] == DEFT_I32) continue;
                    for (int keep = 0; keep < 2; keep++) check_reduce(&a, (red_kind)k, mask, keep, 0);
                }
            for (int k = 0; k < 3; k++)
                if (!(k == R_MEAN && dts[di] == DEFT_I32))
                    for (int keep = 0; keep < 2; keep++)
                        check_reduce(&a, (red_kind)k, (1u << nds[si]) - 1, keep, 1);
            ref_free(&a);
        }
}

/* Sizes past one block of the kernel (8192) in every layout: trailing, leading, middle and full reductions. */
static void test_long_reductions(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    static const struct { int nd; int64_t s[3]; uint32_t mask; } cases[] = {
        {1, {100003}, 1},        {2, {3, 40000}, 2},     {2, {20000, 7}, 1},  {3, {5, 20001, 3}, 2},
        {2, {1000, 33}, 1},      {2, {33, 1000}, 2},     {2, {1000, 300}, 1}, {3, {40, 1000, 3}, 5},
        {3, {7, 1, 33}, 4},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int di = 0; di < 5; di++) {
            ref_tensor a = dts[di] == DEFT_I32 ? ref_random(&rng, DEFT_I32, cases[ci].nd, cases[ci].s, -1000, 1000)
                                               : ref_random(&rng, dts[di], cases[ci].nd, cases[ci].s, -1.0, 1.0);
            for (int k = 0; k < 3; k++) {
                if (k == R_MEAN && dts[di] == DEFT_I32) continue;
                check_reduce(&a, (red_kind)k, cases[ci].mask, ci & 1, 0);
            }
            ref_free(&a);
        }
}

/* An f32 sum of many values accumulates in double: 2^24 + 1 ones, well past what a float accumulator can count. */
static void test_sum_precision(void) {
    const int64_t n = (1 << 24) + 5;
    deft_graph *g = deft_graph_new();
    double *got = ref_realize(deft_sum(deft_full(g, DEFT_F32, 1, &n, deft_cpu(), 1.0), 0, NULL, 0));
    if (got) CHECK_MSG(got[0] == (double)(float)n, "sum of %lld ones in f32 = %.1f", (long long)n, got[0]);
    free(got);
    deft_graph_free(g);
}

static void test_max_nan(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    const int64_t shape[2] = {4, 5};
    for (int di = 0; di < 4; di++) {
        ref_tensor a = ref_random(&rng, dts[di], 2, shape, -1, 1);
        ref_set(&a, 1 * 5 + 2, NAN);
        for (int j = 0; j < 5; j++) ref_set(&a, 3 * 5 + j, -INFINITY);
        deft_graph *g = deft_graph_new();
        deft_tensor *ta = ref_const(g, &a);
        const int ax0 = 0, ax1 = 1;
        double *rows = ref_realize(deft_max(ta, 1, &ax1, 0)), *cols = ref_realize(deft_max(ta, 1, &ax0, 0));
        double *all = ref_realize(deft_max(ta, 0, NULL, 0));
        if (rows && cols && all) {
            CHECK_MSG(isnan(rows[1]) && !isnan(rows[0]) && !isnan(rows[2]), "max rows: %g %g %g", rows[0], rows[1],
                      rows[2]);
            CHECK_MSG(rows[3] == -INFINITY, "max of an all -inf row = %g", rows[3]);
            CHECK_MSG(isnan(cols[2]) && !isnan(cols[0]) && !isnan(cols[4]), "max cols: %g %g %g", cols[0], cols[2],
                      cols[4]);
            CHECK_MSG(isnan(all[0]), "max of all = %g, want NaN", all[0]);
        }
        free(rows), free(cols), free(all);
        deft_graph_free(g);
        ref_free(&a);
    }
}

/* ---------------------------------------------------------------- softmax */
static void softmax_ref(const ref_tensor *a, int axis, int logsm, double *want) {
    int64_t outer = 1, inner = 1, len = a->shape[axis];
    for (int d = 0; d < axis; d++) outer *= a->shape[d];
    for (int d = axis + 1; d < a->ndim; d++) inner *= a->shape[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *x = a->v + o * len * inner + j;
            double m = -INFINITY, s = 0.0;
            int nan = 0;
            for (int64_t l = 0; l < len; l++) {
                nan |= isnan(x[l * inner]);
                if (x[l * inner] > m) m = x[l * inner];
            }
            for (int64_t l = 0; l < len; l++) s += exp(x[l * inner] - m);
            for (int64_t l = 0; l < len; l++) {
                double v = logsm ? x[l * inner] - m - log(s) : exp(x[l * inner] - m) / s;
                want[o * len * inner + l * inner + j] = nan ? NAN : ref_round(a->dt, v);
            }
        }
}

static void check_softmax(const ref_tensor *a, int axis, int logsm, const char *tag) {
    char what[160], sa[64];
    snprintf(what, sizeof what, "%s %s %s axis %d%s", logsm ? "log_softmax" : "softmax", deft_dtype_name(a->dt),
             ref_shape_str(a->ndim, a->shape, sa, sizeof sa), axis, tag);
    deft_graph *g = deft_graph_new();
    deft_tensor *ta = ref_const(g, a);
    /* Negative axes address from the end. */
    const int arg = axis == a->ndim - 1 ? -1 : axis;
    double *got = ref_realize(logsm ? deft_log_softmax(ta, arg) : deft_softmax(ta, arg));
    if (got) {
        double *want = malloc((size_t)a->n * sizeof(double));
        softmax_ref(a, axis, logsm, want);
        ref_close(what, a->dt, got, want, a->n);
        free(want);
    }
    free(got);
    deft_graph_free(g);
}

static void test_softmax(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    static const struct { int nd; int64_t s[3]; } shapes[] = {
        {1, {1}}, {2, {1, 7}}, {3, {7, 33, 5}}, {2, {33, 1000}}, {2, {1000, 33}}, {3, {3, 300, 300}},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int di = 0; di < 4; di++) {
            ref_tensor a = ref_random(&rng, dts[di], shapes[si].nd, shapes[si].s, -5.0, 5.0);
            for (int ax = 0; ax < shapes[si].nd; ax++)
                for (int lg = 0; lg < 2; lg++) check_softmax(&a, ax, lg, "");
            /* Logits of size 1e4: exp overflows without the max subtracted. */
            for (int64_t i = 0; i < a.n; i++) ref_set(&a, i, a.v[i] * 1e4);
            for (int ax = 0; ax < shapes[si].nd; ax++)
                for (int lg = 0; lg < 2; lg++) check_softmax(&a, ax, lg, " (x1e4)");
            ref_free(&a);
        }
}

/* Masked logits (-inf) get probability 0 and log-probability -inf; a NaN poisons its row only. Rows of large
 * logits still sum to 1. */
static void test_softmax_special(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    const int64_t shape[2] = {3, 4};
    const double v[12] = {0.0, -INFINITY, 1.0, -INFINITY, 1.0, NAN, 2.0, 3.0, 3e4, -3e4, 3e4, 1e4};
    for (int di = 0; di < 4; di++) {
        ref_tensor a = ref_alloc(dts[di], 2, shape);
        for (int i = 0; i < 12; i++) ref_set(&a, i, v[i]);
        check_softmax(&a, 1, 0, " (special)");
        check_softmax(&a, 1, 1, " (special)");
        deft_graph *g = deft_graph_new();
        double *p = ref_realize(deft_softmax(ref_const(g, &a), -1));
        if (p) {
            CHECK_MSG(p[1] == 0.0 && p[3] == 0.0, "softmax of -inf = %g, %g", p[1], p[3]);
            for (int j = 0; j < 4; j++) CHECK_MSG(isnan(p[4 + j]), "softmax row with NaN: [%d] = %g", j, p[4 + j]);
            CHECK_NEAR(p[8] + p[9] + p[10] + p[11], 1.0, 2 * ref_tol(dts[di]) + 1e-15);
            CHECK_NEAR(p[8], 0.5, ref_tol(dts[di]));
        }
        free(p);
        deft_graph_free(g);
        ref_free(&a);
    }
}

int main(void) {
    test_all_axis_combos();
    test_long_reductions();
    test_sum_precision();
    test_max_nan();
    test_softmax();
    test_softmax_special();
    return deft_check_finish();
}
