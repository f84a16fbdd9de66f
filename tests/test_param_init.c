/* deft_param_init_normal (GPT-2's N(0, 0.02) and its scaled residual projections):
 *  1. the moments: the mean and standard deviation of a large parameter within a few standard errors of what was
 *     asked, for std 0.02 and 0.02 / sqrt(2 n_layer), in f32 and bf16 (a std 10 % off fails);
 *  2. determinism: seed 0 follows the graph's seed (same seed, same values; another seed, other values) and leaves
 *     other parameters' values alone; a non-zero seed gives deft_normal's values exactly;
 *  3. after compiling, the program reads the new values;
 *  4. refusals: NULL, not a parameter, an i32 parameter, a negative or non-finite std or mean. */
#include "check.h"
#include "ref.h"

enum { R = 384, C = 512 };

static void moments(const float *v, int64_t n, double *mean, double *sd) {
    double s = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = sqrt(s2 / (double)(n - 1));
}

static float *values_of(deft_tensor *p) {
    const int64_t n = deft_tensor_numel(p);
    float *v = malloc((size_t)n * sizeof *v);
    if (deft_tensor_dtype(p) == DEFT_F32) {
        CHECK_OK(deft_param_get(p, v, (size_t)n * sizeof *v));
        return v;
    }
    uint16_t *h = malloc((size_t)n * sizeof *h);
    CHECK_OK(deft_param_get(p, h, (size_t)n * sizeof *h));
    for (int64_t i = 0; i < n; i++) v[i] = deft_bf16_to_f32(h[i]);
    free(h);
    return v;
}

static void test_moments(void) {
    const double stds[2] = {0.02, 0.02 / sqrt(2.0 * 12)};
    for (int dt = 0; dt < 2; dt++)
        for (int k = 0; k < 2; k++) {
            deft_graph *g = deft_graph_new();
            deft_tensor *p = deft_param(g, "w", dt ? DEFT_BF16 : DEFT_F32, 2, (const int64_t[]){R, C}, deft_cpu(),
                                        DEFT_INIT_KAIMING);
            CHECK_OK(deft_param_init_normal(p, 0.0, stds[k], 0));
            float *v = values_of(p);
            double mean, sd;
            moments(v, (int64_t)R * C, &mean, &sd);
            /* Standard errors: std / sqrt(n) for the mean (about 1e-4 std here) and std / sqrt(2n) for the std. */
            CHECK_MSG(fabs(mean) < 5.0 * stds[k] / sqrt((double)R * C), "mean %g for std %g", mean, stds[k]);
            CHECK_MSG(fabs(sd / stds[k] - 1.0) < 0.01, "std %g, asked %g (%s)", sd, stds[k], dt ? "bf16" : "f32");
            /* With a mean too. */
            CHECK_OK(deft_param_init_normal(p, 1.5, stds[k], 0));
            free(v);
            v = values_of(p);
            moments(v, (int64_t)R * C, &mean, &sd);
            CHECK_MSG(fabs(mean - 1.5) < 5.0 * stds[k] / sqrt((double)R * C) + (dt ? 4e-3 : 0.0), "mean %g, asked 1.5",
                      mean);
            free(v);
            deft_graph_free(g);
        }
}

/* The values of parameter "b" (second of two) in a graph of seed `seed`, "a" re-initialised first when reinit. */
static float *graph_values(uint64_t seed, int reinit, float **other) {
    deft_graph *g = deft_graph_new();
    deft_graph_set_seed(g, seed);
    deft_tensor *a = deft_param(g, "a", DEFT_F32, 2, (const int64_t[]){16, 8}, deft_cpu(), DEFT_INIT_KAIMING);
    if (reinit) CHECK_OK(deft_param_init_normal(a, 0.0, 0.02, 0));
    deft_tensor *b = deft_param(g, "b", DEFT_F32, 2, (const int64_t[]){16, 8}, deft_cpu(), DEFT_INIT_KAIMING);
    CHECK_OK(deft_param_init_normal(b, 0.0, 0.02, 0));
    float *v = values_of(b);
    if (other) *other = values_of(a);
    deft_graph_free(g);
    return v;
}

static void test_determinism(void) {
    const size_t bytes = 16 * 8 * sizeof(float);
    float *a1 = graph_values(5, 1, NULL), *a2 = graph_values(5, 1, NULL), *b = graph_values(6, 1, NULL);
    float *c = graph_values(5, 0, NULL);
    CHECK_MSG(memcmp(a1, a2, bytes) == 0, "the same graph seed gave other values");
    CHECK_MSG(memcmp(a1, b, bytes) != 0, "another graph seed gave the same values");
    CHECK_MSG(memcmp(a1, c, bytes) == 0, "re-initialising another parameter moved this one's values");
    free(a1), free(a2), free(b), free(c);
    /* a's Kaiming values from deft_param and its normal ones differ, and b (re-initialised) differs from a. */
    float *other = NULL, *bv = graph_values(5, 1, &other);
    CHECK(memcmp(bv, other, bytes) != 0);
    free(bv), free(other);

    /* A given seed draws deft_normal's values. */
    deft_graph *g = deft_graph_new();
    const int64_t shape[2] = {33, 7};
    deft_tensor *p = deft_param(g, "p", DEFT_F32, 2, shape, deft_cpu(), DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_init_normal(p, 0.25, 0.5, 1234));
    float have[33 * 7], want[33 * 7];
    CHECK_OK(deft_param_get(p, have, sizeof have));
    CHECK_OK(deft_realize(deft_normal(g, DEFT_F32, 2, shape, deft_cpu(), 0.25, 0.5, 1234), want, sizeof want));
    CHECK(memcmp(have, want, sizeof have) == 0);
    deft_graph_free(g);
}

/* A program compiled before the call reads the new values. */
static void test_after_compile(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *p = deft_param(g, "p", DEFT_F32, 1, (const int64_t[]){1000}, deft_cpu(), DEFT_INIT_ZEROS);
    deft_tensor *s = deft_sum(deft_mul(p, p), 0, NULL, 0);
    deft_program *prog = deft_compile(g, &s, 1, NULL);
    CHECK_MSG(prog != NULL, "compile: %s", deft_errmsg());
    if (prog) {
        float v = -1.0f;
        CHECK_OK(deft_program_run(prog));
        CHECK_OK(deft_program_read(prog, s, &v, sizeof v));
        CHECK(v == 0.0f);
        CHECK_OK(deft_param_init_normal(p, 0.0, 0.1, 0));
        CHECK_OK(deft_program_run(prog));
        CHECK_OK(deft_program_read(prog, s, &v, sizeof v));
        /* sum of 1000 squares of N(0, 0.01): 10 give or take 0.45 */
        CHECK_MSG(fabs(v - 10.0) < 2.5, "sum of squares %g after init, want about 10", v);
    }
    deft_program_free(prog);
    deft_graph_free(g);
}

static void test_refusals(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *p = deft_param(g, "p", DEFT_F32, 1, (const int64_t[]){4}, deft_cpu(), DEFT_INIT_ONES);
    deft_tensor *ip = deft_param(g, "ip", DEFT_I32, 1, (const int64_t[]){4}, deft_cpu(), DEFT_INIT_ZEROS);
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 1, (const int64_t[]){4}, deft_cpu());
    CHECK_ERR(deft_param_init_normal(NULL, 0, 1, 0), DEFT_ERR_INVALID, "NULL");
    CHECK_ERR(deft_param_init_normal(x, 0, 1, 0), DEFT_ERR_STATE, "x is not a parameter");
    CHECK_ERR(deft_param_init_normal(ip, 0, 1, 0), DEFT_ERR_DTYPE, "ip is i32");
    CHECK_ERR(deft_param_init_normal(p, 0, -0.5, 0), DEFT_ERR_INVALID, "std -0.5");
    CHECK_ERR(deft_param_init_normal(p, NAN, 1, 0), DEFT_ERR_INVALID, "must be finite");
    CHECK_ERR(deft_param_init_normal(p, 0, INFINITY, 0), DEFT_ERR_INVALID, "must be finite");
    float v[4];
    CHECK_OK(deft_param_get(p, v, sizeof v));
    CHECK_MSG(v[0] == 1.0f && v[3] == 1.0f, "a refused call changed the values");
    deft_graph_free(g);
}

int main(void) {
    test_moments();
    test_determinism();
    test_after_compile();
    test_refusals();
    return deft_check_finish();
}
