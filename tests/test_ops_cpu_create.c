/* CPU kernels, creation: full and arange on every dtype, uniform and normal on the floating dtypes: reproducible
 * from the seed, value i a function of (seed, i) only (the contract the CUDA backend shares), in range, and with the
 * right mean, spread and shape of distribution over 100k samples. */
#include "ref.h"
#include "deft_testing.h"

static void test_full(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    const double values[] = {2.5, -2.5, -1.0 / 3.0, 1e5, 0.0, NAN};
    const int64_t shapes[][2] = {{1, 1}, {7, 33}, {1000, 40}};
    for (int di = 0; di < 5; di++)
        for (int vi = 0; vi < 6; vi++)
            for (int si = 0; si < 3; si++) {
                deft_graph *g = deft_graph_new();
                double *got = ref_realize(deft_full(g, dts[di], 2, shapes[si], deft_cpu(), values[vi]));
                const int64_t n = shapes[si][0] * shapes[si][1];
                if (got) {
                    double *want = malloc((size_t)n * sizeof(double));
                    for (int64_t i = 0; i < n; i++) want[i] = ref_round(dts[di], values[vi]);
                    char what[64];
                    snprintf(what, sizeof what, "full(%g) %s [%lld]", values[vi], deft_dtype_name(dts[di]),
                             (long long)n);
                    ref_close_tol(what, got, want, n, 0.0);
                    free(want);
                }
                free(got);
                deft_graph_free(g);
            }
    /* Spot values that do not depend on the reference's own conversions. */
    deft_graph *g = deft_graph_new();
    const int64_t one = 1;
    double *i1 = ref_realize(deft_full(g, DEFT_I32, 1, &one, deft_cpu(), -2.7));
    double *h1 = ref_realize(deft_full(g, DEFT_F16, 1, &one, deft_cpu(), 1e5));
    double *z = ref_realize(deft_zeros(g, DEFT_BF16, 1, &one, deft_cpu()));
    if (i1 && h1 && z) {
        CHECK_MSG(i1[0] == -2.0, "full(-2.7) in i32 = %g, want -2 (truncation)", i1[0]);
        CHECK_MSG(isinf(h1[0]) && h1[0] > 0, "full(1e5) in f16 = %g, want inf", h1[0]);
        CHECK_MSG(z[0] == 0.0, "zeros in bf16 = %g", z[0]);
    }
    free(i1), free(h1), free(z);
    deft_graph_free(g);
}

static void test_arange(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    static const struct { double start, stop, step; int integral; } cases[] = {
        {0, 10, 1, 1}, {10, 0, -3, 1}, {-3, 4.5, 0.5, 0}, {0, 100000, 1, 1}, {0.25, 7, 1.5, 0}, {5, 6, 1, 1},
        {-1000, 1000, 7, 1},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int di = 0; di < 5; di++) {
            if (dts[di] == DEFT_I32 && !cases[ci].integral) continue;
            const double a = cases[ci].start, b = cases[ci].stop, st = cases[ci].step;
            const int64_t n = (int64_t)ceil((b - a) / st);
            deft_graph *g = deft_graph_new();
            deft_tensor *t = deft_arange(g, dts[di], a, b, st, deft_cpu());
            char what[96];
            snprintf(what, sizeof what, "arange(%g, %g, %g) %s", a, b, st, deft_dtype_name(dts[di]));
            CHECK_MSG(t && deft_tensor_ndim(t) == 1 && deft_tensor_numel(t) == n, "%s: length %lld, want %lld", what,
                      t ? (long long)deft_tensor_numel(t) : -1LL, (long long)n);
            double *got = t && deft_tensor_numel(t) == n ? ref_realize(t) : NULL;
            if (got) {
                double *want = malloc((size_t)n * sizeof(double));
                for (int64_t i = 0; i < n; i++) want[i] = ref_round(dts[di], a + (double)i * st);
                ref_close_tol(what, got, want, n, 0.0);
                free(want);
            }
            free(got);
            deft_graph_free(g);
        }
    /* 0.1 steps in f64 are computed as start + i * step, not by repeated addition (which drifts). */
    deft_graph *g = deft_graph_new();
    double *got = ref_realize(deft_arange(g, DEFT_F64, 0.0, 100.0, 0.1, deft_cpu()));
    if (got) CHECK_MSG(got[999] == 999 * 0.1, "arange(0, 100, 0.1)[999] = %.17g", got[999]);
    free(got);
    deft_graph_free(g);
}

/* Realizes a random tensor in its own graph (a fresh program each time). */
static double *realize_random(int normal, deft_dtype dt, int nd, const int64_t *shape, double a, double b,
                              uint64_t seed) {
    deft_graph *g = deft_graph_new();
    deft_tensor *t = normal ? deft_normal(g, dt, nd, shape, deft_cpu(), a, b, seed)
                            : deft_uniform(g, dt, nd, shape, deft_cpu(), a, b, seed);
    double *v = ref_realize(t);
    deft_graph_free(g);
    return v;
}

static void moments(const double *v, int64_t n, double *mean, double *sd) {
    long double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    const long double m = s / n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - m) * (v[i] - m);
    *mean = (double)m;
    *sd = (double)sqrtl(s2 / (n - 1));
}

static void test_random(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    const int64_t shape[2] = {400, 251};   /* 100400 samples */
    const int64_t n = shape[0] * shape[1];
    for (int di = 0; di < 4; di++) {
        const deft_dtype dt = dts[di];
        const char *dn = deft_dtype_name(dt);
        /* ---- uniform(-2, 3) ---- */
        double *u1 = realize_random(0, dt, 2, shape, -2.0, 3.0, 42);
        double *u2 = realize_random(0, dt, 2, shape, -2.0, 3.0, 42);
        double *u3 = realize_random(0, dt, 2, shape, -2.0, 3.0, 43);
        const int64_t small = 7;
        double *us = realize_random(0, dt, 1, &small, -2.0, 3.0, 42);
        if (u1 && u2 && u3 && us) {
            CHECK_MSG(memcmp(u1, u2, (size_t)n * sizeof(double)) == 0, "uniform %s: same seed, different values", dn);
            int64_t same = 0, out_of_range = 0;
            int64_t bins[10] = {0};
            for (int64_t i = 0; i < n; i++) {
                same += u1[i] == u3[i];
                /* Rounding to the dtype may land on the upper bound; f64 never does. */
                if (!(u1[i] >= -2.0 && (dt == DEFT_F64 ? u1[i] < 3.0 : u1[i] <= 3.0))) out_of_range++;
                int b = (int)floor((u1[i] + 2.0) / 0.5);
                bins[b < 0 ? 0 : b > 9 ? 9 : b]++;
            }
            CHECK_MSG(same < n / 50, "uniform %s: seeds 42 and 43 agree on %lld of %lld", dn, (long long)same,
                      (long long)n);
            CHECK_MSG(out_of_range == 0, "uniform %s: %lld values outside [-2, 3]", dn, (long long)out_of_range);
            for (int b = 0; b < 10; b++)
                CHECK_MSG(fabs((double)bins[b] / (double)n - 0.1) < 0.006, "uniform %s: bin %d holds %.4f", dn, b,
                          (double)bins[b] / (double)n);
            double m, sd;
            moments(u1, n, &m, &sd);
            CHECK_NEAR(m, 0.5, 0.03);
            CHECK_NEAR(sd, 5.0 / sqrt(12.0), 0.02);
            /* Value i depends on (seed, i) only: the generator's formula, rounded once, for any shape. */
            double *want = malloc((size_t)n * sizeof(double));
            for (int64_t i = 0; i < n; i++)
                want[i] = ref_round(dt, -2.0 + 5.0 * deft_testing_rng_uniform01(42, (uint64_t)i));
            char what[64];
            snprintf(what, sizeof what, "uniform %s against rng.h", dn);
            ref_close_tol(what, u1, want, n, 0.0);
            snprintf(what, sizeof what, "uniform %s, shape [7], same seed", dn);
            ref_close_tol(what, us, want, small, 0.0);
            free(want);
        }
        free(u1), free(u2), free(u3), free(us);

        /* ---- normal(1.5, 2) ---- */
        double *n1 = realize_random(1, dt, 2, shape, 1.5, 2.0, 7);
        double *n2 = realize_random(1, dt, 2, shape, 1.5, 2.0, 7);
        double *n3 = realize_random(1, dt, 2, shape, 1.5, 2.0, 8);
        if (n1 && n2 && n3) {
            CHECK_MSG(memcmp(n1, n2, (size_t)n * sizeof(double)) == 0, "normal %s: same seed, different values", dn);
            int64_t same = 0, within1 = 0, within2 = 0, bad = 0;
            for (int64_t i = 0; i < n; i++) {
                same += n1[i] == n3[i];
                within1 += fabs(n1[i] - 1.5) < 2.0;
                within2 += fabs(n1[i] - 1.5) < 4.0;
                bad += !isfinite(n1[i]);
            }
            CHECK_MSG(same < n / 50, "normal %s: seeds 7 and 8 agree on %lld of %lld", dn, (long long)same,
                      (long long)n);
            CHECK_MSG(bad == 0, "normal %s: %lld values not finite", dn, (long long)bad);
            CHECK_NEAR((double)within1 / (double)n, 0.6827, 0.01);
            CHECK_NEAR((double)within2 / (double)n, 0.9545, 0.006);
            double m, sd;
            moments(n1, n, &m, &sd);
            CHECK_NEAR(m, 1.5, 0.04);
            CHECK_NEAR(sd, 2.0, 0.03);
            double *want = malloc((size_t)n * sizeof(double));
            for (int64_t i = 0; i < n; i++)
                want[i] = ref_round(dt, 1.5 + 2.0 * deft_testing_rng_normal(7, (uint64_t)i));
            char what[64];
            snprintf(what, sizeof what, "normal %s against rng.h", dn);
            ref_close_tol(what, n1, want, n, 0.0);
            free(want);
        }
        free(n1), free(n2), free(n3);
    }
}

int main(void) {
    test_full();
    test_arange();
    test_random();
    return deft_check_finish();
}
