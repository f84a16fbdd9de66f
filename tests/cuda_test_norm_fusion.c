/* Batch norm and the add and ReLU after it as one kernel (passes/fusion_norm.c, deft_cuda_batch_norm_epilogue) on
 * cuda:0: relu(bn(x)), relu(bn(x) + r), and bn(x) + r whose sum is read twice, in training (the backward pass
 * through the group) and evaluation, NHWC through the vector kernels (channels in whole 16-byte vectors) and the
 * scalar ones (37 channels, NCHW), in f32, f16, bf16 and f64. Each program is compiled with fusion and with
 * no_fusion and run three times (eager, captured, replayed): every output and gradient must be the same bytes,
 * with the fast kernels and with the plain ones (debug knob BN_REFERENCE), and the values between the members must not
 * be stored. A batch norm whose value is read twice is left alone. Skips (exit 77) where no GPU works. */
#define _POSIX_C_SOURCE 200112L
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fusion_runs.h"
#include "deft_testing.h"
#include "ref.h"

static deft_device GPU;
static uint64_t rng = 0x5eedb47c40f05eull;

enum { RUNS = 3, MAX_OUTS = 6 };
enum nf_tail { TAIL_RELU, TAIL_ADD_RELU, TAIL_ADD_READ_TWICE, TAIL_BN_READ_TWICE };

typedef struct nf_case {
    int ndim;
    int64_t shape[4];
    deft_layout layout;
    deft_dtype dt;
    enum nf_tail tail;
    int eval;
} nf_case;

typedef struct nf_run {
    void *bytes[MAX_OUTS];
    size_t size[MAX_OUTS];
    int n;
    int inner_fused;   /* the values between the members were not stored */
} nf_run;

static deft_tensor *nf_param(deft_graph *g, const char *name, deft_dtype dt, int ndim, const int64_t *shape,
                             double lo, double hi, int grad, uint64_t seed) {
    deft_tensor *p = deft_param(g, name, dt, ndim, shape, GPU, DEFT_INIT_ZEROS);
    uint64_t r = seed;
    ref_tensor v = ref_random(&r, dt, ndim, shape, lo, hi);
    CHECK_OK(deft_param_set(p, v.raw, (size_t)v.n * deft_dtype_size(dt)));
    if (!grad) CHECK_OK(deft_param_set_requires_grad(p, 0));
    ref_free(&v);
    return p;
}

static int nf_stored(deft_program *p, const deft_tensor *t) {
    deft_testing_node_plan np;
    deft_testing_program_node_plan(p, t, &np);
    return np.place != DEFT_TESTING_PLACE_FUSED;
}

/* Builds the case, compiles it with or without fusion, runs it RUNS times and keeps its outputs' bytes. */
static nf_run nf_build_run(const nf_case *k, int fusion, uint64_t seed) {
    nf_run out = {0};
    const deft_dtype pdt = k->dt == DEFT_F64 ? DEFT_F64 : DEFT_F32;
    const int64_t C = k->layout == DEFT_NHWC ? k->shape[k->ndim - 1] : k->shape[1];
    deft_graph *g = deft_graph_new();
    deft_tensor *x = nf_param(g, "x", k->dt, k->ndim, k->shape, -2, 3, 1, seed);
    deft_tensor *r = nf_param(g, "r", k->dt, k->ndim, k->shape, -1, 1, 1, seed + 1);
    deft_tensor *dy = nf_param(g, "dy", k->dt, k->ndim, k->shape, -1, 1, 0, seed + 2);
    deft_tensor *w = nf_param(g, "w", pdt, 1, &C, 0.5, 1.5, 1, seed + 3);
    deft_tensor *b = nf_param(g, "b", pdt, 1, &C, -0.5, 0.5, 1, seed + 4);
    deft_tensor *rm = nf_param(g, "rm", pdt, 1, &C, -0.2, 0.2, 0, seed + 5);
    deft_tensor *rv = nf_param(g, "rv", pdt, 1, &C, 0.5, 2.0, 0, seed + 6);
    deft_batch_norm_options o = deft_batch_norm_defaults();
    o.eval = k->eval, o.layout = k->layout;
    deft_tensor *bn = deft_batch_norm(x, w, b, rm, rv, &o), *inner = NULL, *y = NULL;
    deft_tensor *outs[MAX_OUTS];
    int n = 0;
    switch (k->tail) {
    case TAIL_RELU: y = deft_relu(bn); break;
    case TAIL_ADD_RELU: y = deft_relu((inner = deft_add(r, bn))); break;
    case TAIL_ADD_READ_TWICE: outs[n++] = deft_add(bn, r), y = deft_mul(outs[0], deft_relu(outs[0])); break;
    default: y = deft_add(bn, deft_relu(bn)); outs[n++] = bn; break;
    }
    CHECK_OK(deft_backward(deft_sum(deft_mul(y, dy), 0, NULL, 0)));
    outs[n++] = y, outs[n++] = deft_grad(x), outs[n++] = deft_grad(w), outs[n++] = deft_grad(b);
    if (k->tail == TAIL_ADD_RELU || k->tail == TAIL_ADD_READ_TWICE) outs[n++] = deft_grad(r);
    deft_program *p = fusion_run_read(g, outs, n, fusion, RUNS, out.bytes, out.size);
    out.n = p ? n : 0;
    if (p) out.inner_fused = !nf_stored(p, bn) && (!inner || !nf_stored(p, inner));
    deft_program_free(p);
    deft_graph_free(g);
    return out;
}

static void nf_free(nf_run *r) {
    for (int i = 0; i < r->n; i++) free(r->bytes[i]);
}

static void nf_check(const nf_case *k, int reference) {
    CHECK_OK(deft_testing_set_debug("BN_REFERENCE", reference));
    static const char *const tails[] = {"relu(bn)", "relu(bn + r)", "bn + r read twice", "bn read twice"};
    char s[64];
    const uint64_t seed = ref_next(&rng);
    nf_run fused = nf_build_run(k, 1, seed), plain = nf_build_run(k, 0, seed);
    const char *name = tails[k->tail];
    const char *shape = ref_shape_str(k->ndim, k->shape, s, sizeof s);
    CHECK_MSG(fused.n == plain.n && fused.n > 0, "%s %s: %d outputs fused, %d not", name, shape, fused.n, plain.n);
    for (int i = 0; i < fused.n && i < plain.n; i++)
        CHECK_MSG(fused.size[i] == plain.size[i] && !memcmp(fused.bytes[i], plain.bytes[i], fused.size[i]),
                  "%s %s %s %s%s: output %d differs fused / unfused", name, deft_dtype_name(k->dt),
                  k->layout == DEFT_NHWC ? "NHWC" : "NCHW", shape, reference ? " (plain kernels)" : "", i);
    const int want_fused = k->tail != TAIL_BN_READ_TWICE;
    CHECK_MSG(fused.inner_fused == want_fused, "%s %s: the group %s", name, shape,
              want_fused ? "did not form" : "formed where the normalised value is read twice");
    CHECK_MSG(!plain.inner_fused, "%s %s: no_fusion fused", name, shape);
    nf_free(&fused);
    nf_free(&plain);
}

int main(void) {
    if (!fusion_gpu(&GPU)) return DEFT_CHECK_SKIP;
    const deft_layout NCHW = DEFT_NCHW, NHWC = DEFT_NHWC;
    const nf_case cases[] = {
        {4, {16, 8, 8, 64}, NHWC, DEFT_BF16, TAIL_ADD_RELU, 0},   /* vectors of 8 halves */
        {4, {16, 8, 8, 64}, NHWC, DEFT_BF16, TAIL_RELU, 0},
        {4, {16, 8, 8, 64}, NHWC, DEFT_F16, TAIL_ADD_READ_TWICE, 0},
        {4, {8, 4, 4, 72}, NHWC, DEFT_F32, TAIL_ADD_RELU, 0},     /* vectors of 4 floats */
        {4, {8, 4, 4, 72}, NHWC, DEFT_F32, TAIL_RELU, 1},         /* evaluation */
        {4, {5, 6, 6, 37}, NHWC, DEFT_F16, TAIL_ADD_RELU, 0},     /* 37 channels: the scalar kernels */
        {4, {5, 6, 6, 37}, NHWC, DEFT_BF16, TAIL_RELU, 0},
        {4, {4, 16, 5, 5}, NCHW, DEFT_F32, TAIL_ADD_RELU, 0},
        {4, {4, 16, 5, 5}, NCHW, DEFT_BF16, TAIL_ADD_READ_TWICE, 0},
        {4, {3, 5, 5, 6}, NHWC, DEFT_F64, TAIL_ADD_RELU, 0},      /* vectors of 2 doubles */
        {4, {16, 8, 8, 64}, NHWC, DEFT_BF16, TAIL_BN_READ_TWICE, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nf_check(&cases[i], 0);
        nf_check(&cases[i], 1);
    }
    return deft_check_finish();
}
