/* Sizes past what int64 counts or memory can hold: every builder, the planner, the batch search and the allocator's
 * messages refuse them with a status and a message naming the op, and never wrap into a small buffer. Nothing here
 * allocates what it asks for: each refusal comes before any memory. */
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"

#define CPU deft_cpu()
#define P31 ((int64_t)1 << 31)
#define P32 ((int64_t)1 << 32)
#define P60 ((int64_t)1 << 60)
#define P61 ((int64_t)1 << 61)
#define P62 ((int64_t)1 << 62)

/* expr must return NULL with `status` recorded in g, a message holding `needle`, and no node added to g. */
#define REFUSED(g, expr, status, needle)                                                                              \
    do {                                                                                                              \
        const int refused_n0_ = deft_graph_node_count(g);                                                             \
        CHECK_NULL_ERR(expr, needle);                                                                                 \
        CHECK_MSG(deft_graph_error(g) == (status), "%s: the graph holds %s", #expr,                                   \
                  deft_status_name(deft_graph_error(g)));                                                             \
        CHECK_MSG(deft_graph_node_count(g) == refused_n0_, "%s added %d nodes", #expr,                                \
                  deft_graph_node_count(g) - refused_n0_);                                                            \
    } while (0)

/* A fresh graph after every refusal still builds and runs: arange(-1, 3) -> relu -> [0, 0, 1, 2]. */
static void check_still_runs(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *y = deft_relu(deft_arange(g, DEFT_F32, -1, 3, 1, CPU));
    float v[4] = {0};
    CHECK_OK(deft_realize(y, v, sizeof v));
    CHECK(v[0] == 0 && v[1] == 0 && v[2] == 1 && v[3] == 2);
    deft_graph_free(g);
}

static void test_leaves(void) {
    const int64_t huge[1] = {P62};   /* 2^62 f32 are 2^64 bytes: wrapped, that was 0 */
    deft_graph *g = deft_graph_new();
    REFUSED(g, deft_param(g, "p", DEFT_F32, 1, huge, CPU, DEFT_INIT_UNIFORM), DEFT_ERR_SHAPE,
            "param p: shape [4611686018427387904] of f32 is too large");
    deft_graph_free(g);
    struct {
        const char *needle;
        int which;
    } cases[] = {{"full: shape [4611686018427387904] of f32 is too large", 0},
                 {"zeros: shape [4611686018427387904] of f32 is too large", 1},
                 {"uniform: shape [4611686018427387904] of f32 is too large", 2},
                 {"normal: shape [4611686018427387904] of f32 is too large", 3},
                 {"input: shape [4611686018427387904] of f32 is too large", 4},
                 {"arange: shape [4611686018427387904] of f32 is too large", 5}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g = deft_graph_new();
        switch (cases[i].which) {
        case 0: REFUSED(g, deft_full(g, DEFT_F32, 1, huge, CPU, 1.0), DEFT_ERR_SHAPE, cases[i].needle); break;
        case 1: REFUSED(g, deft_zeros(g, DEFT_F32, 1, huge, CPU), DEFT_ERR_SHAPE, cases[i].needle); break;
        case 2: REFUSED(g, deft_uniform(g, DEFT_F32, 1, huge, CPU, 0, 1, 7), DEFT_ERR_SHAPE, cases[i].needle); break;
        case 3: REFUSED(g, deft_normal(g, DEFT_F32, 1, huge, CPU, 0, 1, 7), DEFT_ERR_SHAPE, cases[i].needle); break;
        case 4: REFUSED(g, deft_input(g, "x", DEFT_F32, 1, huge, CPU), DEFT_ERR_SHAPE, cases[i].needle); break;
        default:
            REFUSED(g, deft_arange(g, DEFT_F32, 0, (double)P62, 1, CPU), DEFT_ERR_SHAPE, cases[i].needle);
            break;
        }
        deft_graph_free(g);
    }
    g = deft_graph_new();
    /* The element count itself past int64 (2^64), not only the bytes. */
    REFUSED(g, deft_input(g, "x", DEFT_F32, 3, (int64_t[]){P31, P31, 4}, CPU), DEFT_ERR_SHAPE,
            "input: shape [2147483648, 2147483648, 4] of f32 is too large");
    deft_graph_free(g);
    g = deft_graph_new();
    /* A count no int64 holds: converting the double was undefined (and read as empty). */
    REFUSED(g, deft_arange(g, DEFT_F32, 0, 1e300, 1, CPU), DEFT_ERR_SHAPE, "arange: [0, 1e+300) with step 1 has");
    CHECK(strstr(deft_errmsg(), "too large") != NULL);
    deft_graph_free(g);
    g = deft_graph_new();
    REFUSED(g, deft_arange(g, DEFT_F32, -1e308, 1e308, 1, CPU), DEFT_ERR_SHAPE, "has inf elements; too large");
    deft_graph_free(g);
    check_still_runs();
}

static void test_shape_ops(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_input(g, "a", DEFT_F32, 1, (int64_t[]){4}, CPU);
    /* 2^32 x 2^32 wrapped to 0 and the -1 divided by it (SIGFPE). */
    REFUSED(g, deft_reshape(a, 3, (int64_t[]){P32, P32, -1}), DEFT_ERR_SHAPE,
            "reshape: [4] (4 elements) cannot become [4294967296, 4294967296, -1]");
    deft_graph_free(g);

    /* Four [2^61] f16 (2^62 bytes each, fine) add up to 2^63 along the axis, past int64. */
    g = deft_graph_new();
    deft_tensor *h[4];
    for (int i = 0; i < 4; i++) h[i] = deft_input(g, "h", DEFT_F16, 1, (int64_t[]){P61}, CPU);
    REFUSED(g, deft_concat(h, 4, 0), DEFT_ERR_SHAPE, "concat: the sizes along axis 0 add up past");
    deft_graph_free(g);
    /* Two [2^60] f32 count 2^61 elements, which fit, but 2^63 bytes, which do not. */
    g = deft_graph_new();
    deft_tensor *f[2] = {deft_input(g, "f", DEFT_F32, 1, (int64_t[]){P60}, CPU),
                         deft_input(g, "f", DEFT_F32, 1, (int64_t[]){P60}, CPU)};
    REFUSED(g, deft_concat(f, 2, 0), DEFT_ERR_SHAPE, "concat: shape [2305843009213693952] of f32 is too large");
    deft_graph_free(g);

    /* Broadcasting and products make shapes no input has. */
    g = deft_graph_new();
    deft_tensor *col = deft_input(g, "col", DEFT_F32, 2, (int64_t[]){P31, 1}, CPU);
    deft_tensor *row = deft_input(g, "row", DEFT_F32, 2, (int64_t[]){1, P31}, CPU);
    REFUSED(g, deft_add(col, row), DEFT_ERR_SHAPE, "add: shape [2147483648, 2147483648] of f32 is too large");
    deft_graph_free(g);
    g = deft_graph_new();
    deft_tensor *ma = deft_input(g, "ma", DEFT_F32, 2, (int64_t[]){P32, 1}, CPU);
    deft_tensor *mb = deft_input(g, "mb", DEFT_F32, 2, (int64_t[]){1, P32}, CPU);
    REFUSED(g, deft_matmul(ma, mb), DEFT_ERR_SHAPE, "matmul: shape [4294967296, 4294967296] of f32 is too large");
    deft_graph_free(g);
    /* A cast to a wider dtype: the count fits, the bytes (2^61 x 8) do not. */
    g = deft_graph_new();
    deft_tensor *half = deft_input(g, "half", DEFT_F16, 1, (int64_t[]){P61}, CPU);
    REFUSED(g, deft_cast(half, DEFT_F64), DEFT_ERR_SHAPE, "cast: shape [2305843009213693952] of f64 is too large");
    deft_graph_free(g);
}

/* A step past int64 counts one element, as in torch: the rounding up added the step and wrapped. */
static void test_slice_huge_step(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_arange(g, DEFT_F32, 0, 10, 1, CPU);
    deft_tensor *s = deft_slice(a, 0, 3, 10, INT64_MAX);
    deft_tensor *t = deft_slice(a, 0, -4, INT64_MAX, INT64_MAX - 5);
    CHECK_MSG(s && t, "slice refused a huge step: %s", deft_errmsg());
    if (s && t) {
        CHECK(deft_tensor_ndim(s) == 1 && deft_tensor_dim(s, 0) == 1 && deft_tensor_dim(t, 0) == 1);
        float vs = -1, vt = -1;
        CHECK_OK(deft_realize(s, &vs, sizeof vs));
        CHECK_OK(deft_realize(t, &vt, sizeof vt));
        CHECK(vs == 3.0f && vt == 6.0f);
    }
    deft_graph_free(g);
}

static void test_conv(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){1, 1, 4, 4}, CPU);
    deft_tensor *w5 = deft_input(g, "w5", DEFT_F32, 4, (int64_t[]){1, 1, 5, 5}, CPU);
    /* The span 2^62 x 4 + 1 wrapped to 1 and the output came out [1, 1, 4, 4]. */
    deft_conv2d_options dil = {{1, 1}, {0, 0}, {P62, P62}, 1, DEFT_NCHW};
    REFUSED(g, deft_conv2d(x, w5, NULL, &dil), DEFT_ERR_SHAPE,
            "conv2d: along H, the input of 4 with padding 0 and a kernel of 5 dilated 4611686018427387904 spans more");
    deft_graph_free(g);
    g = deft_graph_new();
    x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){1, 1, 4, 4}, CPU);
    deft_tensor *w3 = deft_input(g, "w3", DEFT_F32, 4, (int64_t[]){1, 1, 3, 3}, CPU);
    deft_conv2d_options pad = {{1, 1}, {P62, P62}, {1, 1}, 1, DEFT_NCHW};
    REFUSED(g, deft_conv2d(x, w3, NULL, &pad), DEFT_ERR_SHAPE, "padding 4611686018427387904 and a kernel of 3");
    deft_graph_free(g);
    /* The weight [2^62, 4, 1, 1] wrapped to 0 bytes and its bias to a 0-byte buffer filled with 2^62 floats. */
    g = deft_graph_new();
    deft_tensor *xc = deft_input(g, "xc", DEFT_F32, 4, (int64_t[]){1, 4, 2, 2}, CPU);
    REFUSED(g, deft_conv2d_layer(xc, P62, 1, 1, "conv", NULL, 0), DEFT_ERR_SHAPE,
            "conv2d_layer conv.weight: shape [4611686018427387904, 4, 1, 1] of f32 is too large");
    deft_graph_free(g);
}

static void test_pool(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){1, 1, 4, 4}, CPU);
    /* 2 x 2^62 wrapped negative and passed "at most half the kernel". */
    deft_pool2d_options over = {{P62, P62}, {0, 0}, {P62, P62}, 0, DEFT_NCHW};
    REFUSED(g, deft_max_pool2d(x, &over), DEFT_ERR_INVALID,
            "max_pool2d: padding[0] is 4611686018427387904; it must be at most half the kernel");
    deft_graph_free(g);
    g = deft_graph_new();
    x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){1, 1, 4, 4}, CPU);
    deft_pool2d_options wide = {{INT64_MAX, INT64_MAX}, {0, 0}, {INT64_MAX / 2, INT64_MAX / 2}, 0, DEFT_NCHW};
    REFUSED(g, deft_avg_pool2d(x, &wide), DEFT_ERR_SHAPE, "avg_pool2d: along H, the input of 4 with padding");
    deft_graph_free(g);
    g = deft_graph_new();
    x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){1, 1, P31, 1}, CPU);
    REFUSED(g, deft_adaptive_avg_pool2d(x, (int64_t)1 << 33, 1, DEFT_NCHW), DEFT_ERR_SHAPE,
            "adaptive_avg_pool2d: the output size 8589934592 x 1 is too large");
    deft_graph_free(g);
    /* A legal window of 2^62 x 2^62 (padding included in the divisor): the divisor's int64 product wrapped to 0 and
     * the average came out inf. It is 16 / 2^124 = 2^-120. */
    g = deft_graph_new();
    deft_tensor *ones = deft_full(g, DEFT_F32, 4, (int64_t[]){1, 1, 4, 4}, CPU, 1.0);
    deft_pool2d_options big = {{P62, P62}, {0, 0}, {P62 / 2, P62 / 2}, 0, DEFT_NCHW};
    deft_tensor *y = deft_avg_pool2d(ones, &big);
    CHECK_MSG(y != NULL, "avg_pool2d: %s", deft_errmsg());
    float v = -1;
    if (y) CHECK_OK(deft_realize(y, &v, sizeof v));
    CHECK_MSG(v == ldexpf(1.0f, -120), "avg of a 2^62 window = %g, want 2^-120", (double)v);
    deft_graph_free(g);
}

static void test_linear(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){2, 4}, CPU);
    REFUSED(g, deft_linear(x, P62, "fc", NULL), DEFT_ERR_SHAPE,
            "linear fc.weight: shape [4, 4611686018427387904] of f32 is too large");
    deft_graph_free(g);
}

/* x[batch, 64] @ w[64, 32] -> relu. */
static deft_status build_mlp(deft_graph *g, int64_t batch, void *ctx, deft_tensor **outs, int *n) {
    (void)ctx;
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){batch, 64}, CPU);
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){64, 32}, CPU, DEFT_INIT_KAIMING);
    outs[0] = deft_relu(deft_matmul(x, w));
    *n = 1;
    return outs[0] ? DEFT_OK : deft_graph_error(g);
}

static size_t need_of(int64_t batch) {
    deft_graph *g = deft_graph_new();
    deft_tensor *outs[1];
    int n;
    build_mlp(g, batch, NULL, outs, &n);
    deft_memory_report r = {0};
    CHECK_OK(deft_plan_memory(g, outs, n, NULL, &r));
    deft_graph_free(g);
    return r.arena_bytes + r.persistent_bytes;
}

static void test_largest_batch(void) {
    int64_t best = -7;
    /* Every size fits a budget of SIZE_MAX until the shapes themselves overflow: said, not answered INT64_MAX. */
    CHECK_ERR(deft_largest_batch(build_mlp, NULL, SIZE_MAX, INT64_MAX, NULL, &best), DEFT_ERR_SHAPE,
              "largest_batch: building batch");
    CHECK(strstr(deft_errmsg(), "too large") != NULL);
    CHECK(best == -7);
    /* A real budget with no real bound on the batch: the answer, found without probing absurd batches. */
    const size_t budget = need_of(1000) + 100;
    CHECK_OK(deft_largest_batch(build_mlp, NULL, budget, INT64_MAX, NULL, &best));
    CHECK_MSG(best >= 1000 && best < 2000 && need_of(best) <= budget && need_of(best + 1) > budget, "best %lld",
              (long long)best);
}

static void test_planner(void) {
    deft_testing_plan_stats st;
    /* SIZE_MAX rounded up to the alignment wrapped to 0. */
    deft_testing_plan_buffer one[1] = {{SIZE_MAX, 0, 0, 0}};
    CHECK_ERR(deft_testing_plan(one, 1, 0, &st), DEFT_ERR_SHAPE, "planner: buffer 0 of 18446744073709551615 bytes");
    /* Four of 2^62 bytes each: their sum (the arena without reuse) wrapped to 0. */
    deft_testing_plan_buffer four[4];
    for (int i = 0; i < 4; i++) four[i] = (deft_testing_plan_buffer){(size_t)1 << 62, i, i, 0};
    CHECK_ERR(deft_testing_plan(four, 4, 1, &st), DEFT_ERR_SHAPE, "too large");
    /* Two live together need 2^63 bytes, one more than an arena may have. */
    deft_testing_plan_buffer two[2] = {{(size_t)1 << 62, 0, 1, 0}, {(size_t)1 << 62, 1, 2, 0}};
    CHECK_ERR(deft_testing_plan(two, 2, 0, &st), DEFT_ERR_SHAPE, "planner: buffer 1");
    /* The planner still plans. */
    deft_testing_plan_buffer ok[2] = {{100, 0, 1, 0}, {100, 1, 2, 0}};
    CHECK_OK(deft_testing_plan(ok, 2, 0, &st));
    CHECK(st.arena_bytes == 512 && ok[0].offset != ok[1].offset);
}

/* Four inputs of 2^62 bytes each: the persistent bytes wrapped to 0 and the plan said the program needs a few KiB. */
static void test_program_total(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *outs[4];
    for (int i = 0; i < 4; i++) outs[i] = deft_sum(deft_input(g, "x", DEFT_F32, 1, (int64_t[]){P60}, CPU), 0, NULL, 0);
    deft_memory_report r;
    CHECK_ERR(deft_plan_memory(g, outs, 4, NULL, &r), DEFT_ERR_SHAPE, "compile: the program needs more than");
    CHECK(strstr(deft_errmsg(), "too large") != NULL);
    /* The graph is as it was: a small program of it compiles and runs. */
    CHECK(deft_graph_error(g) == DEFT_OK);
    deft_tensor *y = deft_relu(deft_arange(g, DEFT_F32, -1, 3, 1, CPU));
    float v[4] = {0};
    CHECK_OK(deft_realize(y, v, sizeof v));
    CHECK(v[0] == 0 && v[1] == 0 && v[2] == 1 && v[3] == 2);
    deft_graph_free(g);
}

/* An allocator's messages print sizes unsigned: SIZE_MAX read as int64 was "-1 bytes". */
static void test_oom_message(void) {
    void *p = NULL;
    CHECK_OK(deft_memory_set_limit(CPU, SIZE_MAX));
    CHECK_ERR(deft_caching_alloc(CPU, SIZE_MAX, NULL, "huge", &p), DEFT_ERR_OOM, "tried to allocate 16.00 EiB");
    CHECK(strstr(deft_errmsg(), "the limit set with deft_memory_set_limit is 16.00 EiB") != NULL);
    CHECK_MSG(strstr(deft_errmsg(), "-1 bytes") == NULL, "%s", deft_errmsg());
    CHECK_OK(deft_memory_set_limit(CPU, 0));
    CHECK(p == NULL);
}

int main(void) {
    test_leaves();
    test_shape_ops();
    test_slice_huge_step();
    test_conv();
    test_pool();
    test_linear();
    test_largest_batch();
    test_planner();
    test_program_total();
    test_oom_message();
    check_still_runs();
    return deft_check_finish();
}
