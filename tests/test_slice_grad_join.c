/* The gradient of slices that cut one tensor along one axis: deft_backward joins their gradients into one concat
 * (zeros in the gaps) instead of adding zero-padded tensors. Each case checks the joined gradient against finite
 * differences, against the adds it replaces (the SLICE_GRAD_ADDS debug knob) bit for bit, -0.0 included, and that
 * the join happened exactly where it should. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "ref.h"
#include "grad_check.h"
#include "deft_testing.h"

#define CPU deft_cpu()
#define MAXS 4

typedef struct scase {
    const char *name;
    int ndim;
    int64_t shape[3];
    int axis;
    int n;                       /* slices */
    int64_t start[MAXS], end[MAXS], step[MAXS];
    int joined;                  /* whether the gradient must come out as one concat */
} scase;

/* f: each slice through its own function (so every slice's gradient differs), flattened and concatenated. */
static deft_tensor *slice_fn(deft_tensor *x, const scase *c, int k) {
    deft_tensor *s = deft_slice(x, c->axis, c->start[k], c->end[k], c->step[k]);
    switch (k % 4) {
    case 0: return deft_mul(s, s);
    case 1: return deft_exp(s);
    case 2: return deft_tanh(s);
    default: return deft_mul_scalar(s, -3.0);
    }
}

static deft_tensor *build_f(deft_tensor *x, const scase *c) {
    deft_tensor *parts[MAXS];
    for (int k = 0; k < c->n; k++) parts[k] = deft_reshape(slice_fn(x, c, k), 1, (int64_t[]){-1});
    return deft_concat(parts, c->n, 0);
}

static void check_finite_differences(const scase *c) {
    uint64_t seed = 7;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = grad_check_param(g, &seed, 0, c->ndim, c->shape, -1.0, 1.0);
    grad_check_case(c->name, g, &seed, build_f(x, c), &x, 1, NULL, NULL, 0, 1e-6);
    CHECK_MSG(deft_testing_is_op(deft_grad(x), "concat") == c->joined, "%s: gradient is a %s", c->name,
              deft_testing_op(deft_grad(x)));
    CHECK_MSG(deft_graph_error(g) == DEFT_OK, "%s: %s", c->name, deft_graph_errmsg(g));
    deft_graph_free(g);
}

/* x's gradient (dtype dt, read back as f32 bits or f64) for loss = sum(f * w), w holding -0.0 and +0.0 entries so
 * that some gradients of the slices are -0.0. low: the slices and functions run in bf16 (a cast of x). */
static void grad_bytes(const scase *c, deft_dtype dt, deft_dtype low, int adds, void *out, size_t bytes,
                       int *joined) {
    CHECK_OK(deft_testing_set_debug("SLICE_GRAD_ADDS", adds));
    uint64_t seed = 11;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_param(g, "x", dt, c->ndim, c->shape, CPU, DEFT_INIT_ZEROS);
    const int64_t nx = deft_tensor_numel(x);
    double *xv = malloc((size_t)nx * sizeof *xv);
    float *xf = malloc((size_t)nx * sizeof *xf);
    for (int64_t i = 0; i < nx; i++) xf[i] = (float)(xv[i] = ref_unif(&seed, -1.0, 1.0));
    CHECK_OK(deft_param_set(x, dt == DEFT_F64 ? (void *)xv : (void *)xf, (size_t)nx * deft_dtype_size(dt)));
    deft_tensor *xl = low == dt ? x : deft_cast(x, low);
    deft_tensor *f = build_f(xl, c);
    const int64_t nf = deft_tensor_numel(f);
    float *w = malloc((size_t)nf * sizeof *w);
    for (int64_t i = 0; i < nf; i++) w[i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 0.0f : (float)ref_unif(&seed, -1, 1);
    deft_tensor *wt = deft_constant(g, DEFT_F32, 1, (int64_t[]){nf}, CPU, w, (size_t)nf * sizeof *w);
    deft_tensor *loss = deft_sum(deft_mul(f, deft_cast(wt, low)), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *gx = deft_grad(x);
    *joined = deft_testing_is_op(gx, "concat");
    deft_program *p = deft_compile(g, (deft_tensor *[]){loss, gx}, 2, NULL);
    CHECK_MSG(p != NULL, "%s: compile: %s", c->name, deft_errmsg());
    if (p) {
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, gx, out, bytes));
    }
    free(w);
    free(xv);
    free(xf);
    deft_graph_free(g);
    CHECK_OK(deft_testing_set_debug("SLICE_GRAD_ADDS", 0));
}

static int64_t count_neg_zero(const void *v, deft_dtype dt, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (dt == DEFT_F64) {
            double d;
            memcpy(&d, (const char *)v + i * 8, 8);
            k += d == 0.0 && signbit(d);
        } else {
            float f;
            memcpy(&f, (const char *)v + i * 4, 4);
            k += f == 0.0f && signbit(f);
        }
    }
    return k;
}

/* The joined gradient equals the adds' bit for bit: both give +0.0 where a slice's gradient is -0.0 (x + 0). */
static void check_bits(const scase *c, deft_dtype dt, deft_dtype low) {
    const int64_t n = c->shape[0] * c->shape[1] * (c->ndim > 2 ? c->shape[2] : 1);
    const size_t bytes = (size_t)n * deft_dtype_size(dt);
    void *joined = malloc(bytes), *added = malloc(bytes);
    memset(joined, 0xAB, bytes);
    memset(added, 0xCD, bytes);
    int j1 = -1, j0 = -1;
    grad_bytes(c, dt, low, 0, joined, bytes, &j1);
    grad_bytes(c, dt, low, 1, added, bytes, &j0);
    CHECK_MSG(!j0, "%s: the knob still joined", c->name);
    if (low == dt) CHECK_MSG(j1 == c->joined, "%s (%s): joined %d, expected %d", c->name, deft_dtype_name(dt), j1,
                             c->joined);
    CHECK_MSG(memcmp(joined, added, bytes) == 0, "%s (%s via %s): joined gradient differs from the adds", c->name,
              deft_dtype_name(dt), deft_dtype_name(low));
    /* Where disjoint slices (two or more) meet, each element is some slice's gradient plus zeros: never -0.0. */
    if (c->joined) CHECK_MSG(count_neg_zero(added, dt, n) == 0, "%s: the adds left -0.0", c->name);
    free(joined);
    free(added);
}

static const scase cases[] = {
    /* full covers, in and out of order */
    {"2d axis1 full", 2, {6, 5}, 1, 2, {0, 2}, {2, 5}, {1, 1}, 1},
    {"2d axis0 full", 2, {7, 3}, 0, 3, {4, 0, 2}, {7, 2, 4}, {1, 1, 1}, 1},
    {"3d axis0 full", 3, {4, 3, 5}, 0, 3, {2, 0, 1}, {4, 1, 2}, {1, 1, 1}, 1},
    {"3d axis2 full qkv", 3, {2, 3, 12}, 2, 3, {0, 4, 8}, {4, 8, 12}, {1, 1, 1}, 1},
    /* partial covers: zeros at the start, between and at the end */
    {"3d axis1 partial", 3, {3, 8, 4}, 1, 2, {1, 4}, {3, 8}, {1, 1}, 1},
    {"3d axis2 gap", 3, {2, 2, 7}, 2, 3, {5, 0, 3}, {6, 2, 5}, {1, 1, 1}, 1},
    {"2d axis0 ends", 2, {9, 2}, 0, 2, {2, 5}, {4, 7}, {1, 1}, 1},
    /* kept as adds: overlapping ranges, a strided slice, one slice alone */
    {"overlap", 2, {4, 6}, 1, 2, {0, 2}, {4, 6}, {1, 1}, 0},
    {"same range twice", 2, {4, 6}, 1, 2, {1, 1}, {3, 3}, {1, 1}, 0},
    {"strided", 2, {4, 6}, 1, 2, {0, 1}, {6, 6}, {2, 2}, 0},
    {"one slice", 2, {4, 6}, 0, 1, {1}, {3}, {1}, 0},
};

/* Slices along two different axes of one tensor stay adds. */
static void check_mixed_axes(void) {
    uint64_t seed = 3;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = grad_check_param(g, &seed, 0, 2, (int64_t[]){4, 4}, -1.0, 1.0);
    deft_tensor *a = deft_reshape(deft_exp(deft_slice(x, 0, 0, 2, 1)), 1, (int64_t[]){-1});
    deft_tensor *b = deft_reshape(deft_tanh(deft_slice(x, 1, 2, 4, 1)), 1, (int64_t[]){-1});
    grad_check_case("mixed axes", g, &seed, deft_concat((deft_tensor *[]){a, b}, 2, 0), &x, 1, NULL, NULL, 0, 1e-6);
    CHECK(!deft_testing_is_op(deft_grad(x), "concat"));
    deft_graph_free(g);
}

/* A slice beside a direct use of the tensor stays adds (the direct use's gradient is no slice's). */
static void check_direct_use(void) {
    uint64_t seed = 5;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = grad_check_param(g, &seed, 0, 2, (int64_t[]){3, 4}, -1.0, 1.0);
    deft_tensor *a = deft_reshape(deft_exp(deft_slice(x, 1, 0, 2, 1)), 1, (int64_t[]){-1});
    deft_tensor *b = deft_reshape(deft_tanh(deft_slice(x, 1, 2, 4, 1)), 1, (int64_t[]){-1});
    deft_tensor *d = deft_reshape(deft_mul(x, x), 1, (int64_t[]){-1});
    grad_check_case("direct use", g, &seed, deft_concat((deft_tensor *[]){a, b, d}, 3, 0), &x, 1, NULL, NULL, 0,
                    1e-6);
    CHECK(!deft_testing_is_op(deft_grad(x), "concat"));
    deft_graph_free(g);
}

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_finite_differences(&cases[i]);
        check_bits(&cases[i], DEFT_F64, DEFT_F64);
        check_bits(&cases[i], DEFT_F32, DEFT_F32);
        check_bits(&cases[i], DEFT_F32, DEFT_BF16);
        check_bits(&cases[i], DEFT_F32, DEFT_F16);
    }
    check_mixed_axes();
    check_direct_use();
    return deft_check_finish();
}
