/* CPU kernels, layout: permute (every permutation of a 4-D tensor, large transposes), slices with steps on every
 * axis (copies and views), and concat along every axis, on all five dtypes. These move values without arithmetic,
 * so the results must be bit-exact. */
#include "ref.h"

static uint64_t rng = 0x5eed0004ull;

/* Values whose storage is exact in every dtype (small integers and halves), so any misplaced element shows. */
static ref_tensor distinct(deft_dtype dt, int nd, const int64_t *shape) {
    ref_tensor t = ref_alloc(dt, nd, shape);
    for (int64_t i = 0; i < t.n; i++) ref_set(&t, i, (double)(i % 251) - 125.0 + (dt == DEFT_I32 ? 0 : 0.5));
    /* Then shuffle a little with the seeded generator so periodic layouts cannot hide a mistake. */
    for (int64_t i = t.n - 1; i > 0; i--) {
        int64_t j = (int64_t)(ref_next(&rng) % (uint64_t)(i + 1));
        double tmp = t.v[i];
        ref_set(&t, i, t.v[j]);
        ref_set(&t, j, tmp);
    }
    return t;
}

static void check_permute(deft_dtype dt, int nd, const int64_t *shape, const int *perm) {
    ref_tensor a = distinct(dt, nd, shape);
    int64_t oshape[DEFT_MAX_DIMS], idx[DEFT_MAX_DIMS], iidx[DEFT_MAX_DIMS];
    for (int i = 0; i < nd; i++) oshape[i] = shape[perm[i]];
    deft_graph *g = deft_graph_new();
    deft_tensor *p = deft_permute(ref_const(g, &a), perm);
    char what[160], sa[64];
    int used = snprintf(what, sizeof what, "permute %s %s (", deft_dtype_name(dt), ref_shape_str(nd, shape, sa, 64));
    for (int i = 0; i < nd; i++) used += snprintf(what + used, sizeof what - (size_t)used, i ? ",%d" : "%d", perm[i]);
    snprintf(what + used, sizeof what - (size_t)used, ")");
    CHECK_MSG(ref_shape_eq(p, nd, oshape), "%s: wrong shape", what);
    double *got = ref_realize(p);
    if (got) {
        double *want = malloc((size_t)a.n * sizeof(double));
        for (int64_t o = 0; o < a.n; o++) {
            ref_unravel(nd, oshape, o, idx);
            for (int i = 0; i < nd; i++) iidx[perm[i]] = idx[i];
            int64_t off = 0;
            for (int d = 0; d < nd; d++) off = off * shape[d] + iidx[d];
            want[o] = a.v[off];
        }
        ref_close_tol(what, got, want, a.n, 0.0);
        free(want);
    }
    free(got);
    deft_graph_free(g);
    ref_free(&a);
}

static int next_perm(int *p, int n) {
    int i = n - 2;
    while (i >= 0 && p[i] >= p[i + 1]) i--;
    if (i < 0) return 0;
    int j = n - 1;
    while (p[j] <= p[i]) j--;
    int t = p[i];
    p[i] = p[j], p[j] = t;
    for (int l = i + 1, r = n - 1; l < r; l++, r--) t = p[l], p[l] = p[r], p[r] = t;
    return 1;
}

static void test_permute(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    const int64_t s4[4] = {2, 3, 4, 5}, s1[3] = {7, 1, 33}, big[2] = {33, 1000}, big2[2] = {1000, 33};
    const int64_t s3[3] = {100, 33, 20};
    for (int di = 0; di < 5; di++) {
        int p[4] = {0, 1, 2, 3};
        while (next_perm(p, 4)) check_permute(dts[di], 4, s4, p);   /* the 23 non-identity permutations */
        const int q[3] = {2, 1, 0}, r[3] = {1, 2, 0}, t2[2] = {1, 0};
        check_permute(dts[di], 3, s1, q);
        check_permute(dts[di], 3, s1, r);
        check_permute(dts[di], 2, big, t2);
        check_permute(dts[di], 2, big2, t2);
        check_permute(dts[di], 3, s3, r);
        check_permute(dts[di], 3, s3, q);
    }
    /* transpose() is a permute of two axes. */
    ref_tensor a = distinct(DEFT_F32, 3, s3);
    deft_graph *g = deft_graph_new();
    double *got = ref_realize(deft_transpose(ref_const(g, &a), -1, 0));
    if (got) {
        int ok = 1;
        for (int64_t i = 0; i < 100 && ok; i++)
            for (int64_t j = 0; j < 33 && ok; j++)
                for (int64_t k = 0; k < 20 && ok; k++) ok = got[(k * 33 + j) * 100 + i] == a.v[(i * 33 + j) * 20 + k];
        CHECK_MSG(ok, "transpose(-1, 0) of [100,33,20] misplaces elements");
    }
    free(got);
    deft_graph_free(g);
    ref_free(&a);
}

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

static void check_slice(const ref_tensor *a, int axis, int64_t start, int64_t end, int64_t step) {
    const int nd = a->ndim;
    const int64_t dim = a->shape[axis];
    const int64_t s = clamp64(start < 0 ? start + dim : start, 0, dim), e = clamp64(end < 0 ? end + dim : end, 0, dim);
    const int64_t count = e > s ? (e - s + step - 1) / step : 0;
    if (count == 0) return;
    int64_t oshape[DEFT_MAX_DIMS], idx[DEFT_MAX_DIMS];
    memcpy(oshape, a->shape, sizeof(int64_t) * (size_t)nd);
    oshape[axis] = count;
    char what[160], sa[64];
    snprintf(what, sizeof what, "slice %s %s axis %d [%lld:%lld:%lld]", deft_dtype_name(a->dt),
             ref_shape_str(nd, a->shape, sa, 64), axis, (long long)start, (long long)end, (long long)step);
    deft_graph *g = deft_graph_new();
    deft_tensor *sl = deft_slice(ref_const(g, a), axis, start, end, step);
    CHECK_MSG(ref_shape_eq(sl, nd, oshape), "%s: wrong shape", what);
    double *got = ref_realize(sl);
    /* The same slice feeding an op, so that a view slice is also read by a kernel, not only copied out. */
    double *neg = ref_realize(deft_neg(sl));
    const int64_t n = ref_numel(nd, oshape);
    if (got && neg) {
        double *want = malloc((size_t)n * sizeof(double)), *wneg = malloc((size_t)n * sizeof(double));
        for (int64_t o = 0; o < n; o++) {
            ref_unravel(nd, oshape, o, idx);
            idx[axis] = s + idx[axis] * step;
            int64_t off = 0;
            for (int d = 0; d < nd; d++) off = off * a->shape[d] + idx[d];
            want[o] = a->v[off];
            wneg[o] = -want[o];
        }
        ref_close_tol(what, got, want, n, 0.0);
        ref_close_tol("neg of that slice", neg, wneg, n, 0.0);
        free(want);
        free(wneg);
    }
    free(got);
    free(neg);
    deft_graph_free(g);
}

static void test_slice(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    static const struct { int64_t start, end, step; } cuts[] = {
        {0, INT64_MAX, 2}, {1, 6, 3}, {-3, INT64_MAX, 1}, {2, 3, 1}, {1, -1, 1}, {0, 5, 1}, {-100, 100, 4}, {5, 0, 1},
    };
    const int64_t s3[3] = {7, 33, 5}, s2[2] = {40, 1000}, s1[2] = {1, 70000};
    for (int di = 0; di < 5; di++) {
        ref_tensor a = distinct(dts[di], 3, s3), b = distinct(dts[di], 2, s2), c = distinct(dts[di], 2, s1);
        for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
            for (int ax = 0; ax < 3; ax++) check_slice(&a, ax, cuts[k].start, cuts[k].end, cuts[k].step);
            for (int ax = 0; ax < 2; ax++) check_slice(&b, ax, cuts[k].start, cuts[k].end, cuts[k].step);
            check_slice(&c, 1, cuts[k].start, cuts[k].end, cuts[k].step);
        }
        check_slice(&b, 1, 3, 997, 7);
        check_slice(&c, 1, 1, 69999, 3);
        ref_free(&a), ref_free(&b), ref_free(&c);
    }
    /* A slice of a slice: offsets and steps compose. */
    ref_tensor a = distinct(DEFT_F64, 2, s2);
    deft_graph *g = deft_graph_new();
    double *got = ref_realize(deft_slice(deft_slice(ref_const(g, &a), 1, 10, 900, 3), 0, 5, 35, 2));
    if (got) {
        int ok = 1;
        for (int64_t i = 0; i < 15 && ok; i++)
            for (int64_t j = 0; j < 297 && ok; j++) ok = got[i * 297 + j] == a.v[(5 + 2 * i) * 1000 + 10 + 3 * j];
        CHECK_MSG(ok, "slice of a slice misplaces elements");
    }
    free(got);
    deft_graph_free(g);
    ref_free(&a);
}

static void test_concat(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    const int64_t base[3] = {4, 6, 5};
    const int64_t sizes[3] = {3, 1, 7};
    for (int di = 0; di < 5; di++)
        for (int ax = 0; ax < 3; ax++)
            for (int nin = 2; nin <= 3; nin++) {
                ref_tensor in[3];
                deft_graph *g = deft_graph_new();
                deft_tensor *ts[3];
                int64_t total = 0;
                for (int k = 0; k < nin; k++) {
                    int64_t sh[3] = {base[0], base[1], base[2]};
                    sh[ax] = sizes[k];
                    total += sizes[k];
                    in[k] = distinct(dts[di], 3, sh);
                    ts[k] = ref_const(g, &in[k]);
                }
                int64_t oshape[3] = {base[0], base[1], base[2]}, idx[3];
                oshape[ax] = total;
                char what[96];
                snprintf(what, sizeof what, "concat %s of %d along %d", deft_dtype_name(dts[di]), nin, ax);
                deft_tensor *c = deft_concat(ts, nin, ax == 2 ? -1 : ax);
                CHECK_MSG(ref_shape_eq(c, 3, oshape), "%s: wrong shape", what);
                double *got = ref_realize(c);
                if (got) {
                    const int64_t n = ref_numel(3, oshape);
                    double *want = malloc((size_t)n * sizeof(double));
                    for (int64_t o = 0; o < n; o++) {
                        ref_unravel(3, oshape, o, idx);
                        int k = 0;
                        while (idx[ax] >= sizes[k]) idx[ax] -= sizes[k++];
                        want[o] = in[k].v[ref_bcast_offset(3, in[k].shape, 3, idx)];
                    }
                    ref_close_tol(what, got, want, n, 0.0);
                    free(want);
                }
                free(got);
                deft_graph_free(g);
                for (int k = 0; k < nin; k++) ref_free(&in[k]);
            }
    /* A large concat that runs in parallel. */
    const int64_t sa[2] = {1000, 40}, sb[2] = {1000, 33};
    ref_tensor a = distinct(DEFT_F32, 2, sa), b = distinct(DEFT_F32, 2, sb);
    deft_graph *g = deft_graph_new();
    deft_tensor *ts[2] = {ref_const(g, &a), ref_const(g, &b)};
    double *got = ref_realize(deft_concat(ts, 2, 1));
    if (got) {
        int ok = 1;
        for (int64_t i = 0; i < 1000 && ok; i++)
            for (int64_t j = 0; j < 73 && ok; j++) ok = got[i * 73 + j] == (j < 40 ? a.v[i * 40 + j] : b.v[i * 33 + j - 40]);
        CHECK_MSG(ok, "concat [1000,40] + [1000,33] along 1 misplaces elements");
    }
    free(got);
    deft_graph_free(g);
    ref_free(&a), ref_free(&b);
}

int main(void) {
    test_permute();
    test_slice();
    test_concat();
    return deft_check_finish();
}
