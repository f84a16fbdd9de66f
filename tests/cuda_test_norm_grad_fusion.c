/* A ReLU's gradient folded into the backward kernels of the batch norm under it (passes/fusion_norm_grad.c,
 * deft_cuda_batch_norm_grad_masked) on cuda:0: relu(bn(x)) alone, two of them stacked (the upper dx is the lower
 * ReLU's incoming gradient), without weight and bias (dx then the sums' only reader), and in evaluation; in f32, bf16
 * and f16 (f64 once), NHWC through the vector kernels (channels in whole 16-byte vectors) and the scalar ones (37
 * channels), and NCHW; gradients holding -0 and NaN and an input channel holding a NaN. Each program is compiled with
 * fusion and with no_fusion and run three times (eager, captured, replayed): every output and gradient must be the
 * same bytes, with the fast kernels and with the plain ones (debug knob BN_REFERENCE), and the folded ReLU gradients
 * must not be stored. Where the ReLU's gradient has another reader (an output, an op, a residual's gradient) it
 * must not fold, and the results must still match. A small ResNet (examples/resnet18.h) trained a few steps, as
 * CUDA Graph replays, in f32 (NCHW, NHWC) and under bf16 autocast, ends with the same loss, parameters and running
 * statistics, byte for byte, with its three foldable ReLU gradients folded and with no_relu_grad_fold.
 * Skips (exit 77) where no GPU works. */
#define _POSIX_C_SOURCE 200112L
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fusion_runs.h"
#include "deft_testing.h"
#include "ref.h"

#include "../examples/resnet18.h"

static deft_device GPU;
static uint64_t rng = 0x6e0f1d5b2c93a7ull;

enum { RUNS = 3, MAX_OUTS = 10 };
enum ng_kind { KIND_ONE, KIND_STACKED, KIND_NO_AFFINE, KIND_EVAL, KIND_GRAD_OUTPUT, KIND_GRAD_READ, KIND_RESIDUAL };
static const char *const KIND_NAMES[] = {"relu(bn)", "relu(bn(relu(bn)))", "relu(bn) without weight", "relu(bn) eval",
                                         "relu(bn), its gradient an output", "relu(bn), its gradient read by a mul",
                                         "relu(bn + r)"};

typedef struct ng_case {
    int ndim;
    int64_t shape[4];
    deft_layout layout;
    deft_dtype dt;
    enum ng_kind kind;
    int specials;   /* -0 and NaN in the incoming gradient, a NaN in x */
} ng_case;

typedef struct ng_run {
    void *bytes[MAX_OUTS];
    size_t size[MAX_OUTS];
    int n;
    int folded;   /* ReLU gradients computed inside a batch norm backward group and never stored */
} ng_run;

static deft_tensor *ng_param(deft_graph *g, const char *name, deft_dtype dt, int ndim, const int64_t *shape,
                             double lo, double hi, int grad, uint64_t seed, int specials) {
    deft_tensor *p = deft_param(g, name, dt, ndim, shape, GPU, DEFT_INIT_ZEROS);
    uint64_t r = seed;
    ref_tensor v = ref_random(&r, dt, ndim, shape, lo, hi);
    for (int64_t i = 0; specials && i < v.n; i++) {
        if (i % 17 == 3) ref_set(&v, i, -0.0);
        if (i % 53 == 7) ref_set(&v, i, (double)NAN);
    }
    CHECK_OK(deft_param_set(p, v.raw, (size_t)v.n * deft_dtype_size(dt)));
    if (!grad) CHECK_OK(deft_param_set_requires_grad(p, 0));
    ref_free(&v);
    return p;
}

/* x with one NaN (in the first channel of NHWC, or the second of NCHW): a whole channel's statistics, output and
 * mask become NaN. */
static deft_tensor *ng_input(deft_graph *g, const ng_case *k, uint64_t seed) {
    deft_tensor *x = ng_param(g, "x", k->dt, k->ndim, k->shape, -2, 3, 1, seed, 0);
    if (!k->specials) return x;
    uint64_t r = seed;
    ref_tensor v = ref_random(&r, k->dt, k->ndim, k->shape, -2, 3);
    ref_set(&v, k->layout == DEFT_NHWC ? 0 : k->shape[2] * k->shape[3], (double)NAN);
    CHECK_OK(deft_param_set(x, v.raw, (size_t)v.n * deft_dtype_size(k->dt)));
    ref_free(&v);
    return x;
}

/* bn(x) with running statistics, and with a weight and bias unless `affine` is 0 (their gradients into outs). */
static deft_tensor *ng_norm(deft_graph *g, const ng_case *k, deft_tensor *x, int affine, uint64_t seed,
                            deft_tensor **w_b) {
    const deft_dtype pdt = k->dt == DEFT_F64 ? DEFT_F64 : DEFT_F32;
    const int64_t C = k->layout == DEFT_NHWC ? k->shape[k->ndim - 1] : k->shape[1];
    deft_tensor *w = affine ? ng_param(g, "w", pdt, 1, &C, 0.5, 1.5, 1, seed, 0) : NULL;
    deft_tensor *b = affine ? ng_param(g, "b", pdt, 1, &C, -0.5, 0.5, 1, seed + 1, 0) : NULL;
    deft_tensor *rm = ng_param(g, "rm", pdt, 1, &C, -0.2, 0.2, 0, seed + 2, 0);
    deft_tensor *rv = ng_param(g, "rv", pdt, 1, &C, 0.5, 2.0, 0, seed + 3, 0);
    w_b[0] = w, w_b[1] = b;
    deft_batch_norm_options o = deft_batch_norm_defaults();
    o.eval = k->kind == KIND_EVAL, o.layout = k->layout;
    return deft_batch_norm(x, w, b, rm, rv, &o);
}

/* How many ReLU gradients p computes inside a batch norm backward group without storing them. */
static int ng_folded(deft_program *p, const deft_graph *g) {
    int n = 0;
    for (int id = 0; id < deft_graph_node_count(g); id++) {
        const deft_tensor *t = deft_testing_node(g, id);
        if (!deft_testing_is_op(t, "act_grad") || strcmp(deft_testing_act(t), "relu") != 0) continue;
        deft_testing_node_plan np;
        deft_testing_program_node_plan(p, t, &np);
        n += np.place == DEFT_TESTING_PLACE_FUSED && np.group >= 0 && !strcmp(np.group_kind, "norm_grad");
    }
    return n;
}

/* Builds the case, compiles it with or without fusion, runs it RUNS times and keeps its outputs' bytes. */
static ng_run ng_build_run(const ng_case *k, int fusion, uint64_t seed) {
    ng_run out = {0};
    deft_graph *g = deft_graph_new();
    deft_tensor *x = ng_input(g, k, seed);
    deft_tensor *dy = ng_param(g, "dy", k->dt, k->ndim, k->shape, -1, 1, 0, seed + 10, k->specials);
    deft_tensor *wb[4] = {NULL, NULL, NULL, NULL}, *r = NULL;
    deft_tensor *bn = ng_norm(g, k, x, k->kind != KIND_NO_AFFINE, seed + 20, wb), *y;
    if (k->kind == KIND_RESIDUAL) {
        r = ng_param(g, "r", k->dt, k->ndim, k->shape, -1, 1, 1, seed + 30, 0);
        y = deft_relu(deft_add(bn, r));
    } else {
        y = deft_relu(bn);
    }
    if (k->kind == KIND_STACKED) y = deft_relu(ng_norm(g, k, y, 1, seed + 40, wb + 2));
    CHECK_OK(deft_backward(deft_sum(deft_mul(y, dy), 0, NULL, 0)));
    deft_tensor *outs[MAX_OUTS];
    int n = 0;
    outs[n++] = y, outs[n++] = deft_grad(x);
    for (int i = 0; i < 4; i++)
        if (wb[i]) outs[n++] = deft_grad(wb[i]);
    if (r) outs[n++] = deft_grad(r);
    if (k->kind == KIND_GRAD_OUTPUT) outs[n++] = deft_grad(bn);
    if (k->kind == KIND_GRAD_READ) outs[n++] = deft_mul(deft_grad(bn), dy);
    deft_program *p = fusion_run_read(g, outs, n, fusion, RUNS, out.bytes, out.size);
    out.n = p ? n : 0;
    if (p) out.folded = ng_folded(p, g);
    deft_program_free(p);
    deft_graph_free(g);
    return out;
}

static void ng_free(ng_run *r) {
    for (int i = 0; i < r->n; i++) free(r->bytes[i]);
}

static int ng_want_folded(enum ng_kind kind) {
    switch (kind) {
    case KIND_STACKED: return 2;
    case KIND_GRAD_OUTPUT: case KIND_GRAD_READ: case KIND_RESIDUAL: return 0;
    default: return 1;
    }
}

static void ng_check(const ng_case *k, int reference) {
    CHECK_OK(deft_testing_set_debug("BN_REFERENCE", reference));
    char s[64];
    const uint64_t seed = ref_next(&rng);
    ng_run fused = ng_build_run(k, 1, seed), plain = ng_build_run(k, 0, seed);
    const char *name = KIND_NAMES[k->kind];
    const char *shape = ref_shape_str(k->ndim, k->shape, s, sizeof s);
    const char *how = reference ? " (plain kernels)" : "";
    const char *layout = k->layout == DEFT_NHWC ? "NHWC" : "NCHW";
    CHECK_MSG(fused.n == plain.n && fused.n > 0, "%s %s: %d outputs fused, %d not", name, shape, fused.n, plain.n);
    for (int i = 0; i < fused.n && i < plain.n; i++)
        CHECK_MSG(fused.size[i] == plain.size[i] && !memcmp(fused.bytes[i], plain.bytes[i], fused.size[i]),
                  "%s %s %s %s%s%s: output %d differs fused / unfused", name, deft_dtype_name(k->dt), layout, shape,
                  k->specials ? " with NaN and -0" : "", how, i);
    CHECK_MSG(fused.folded == ng_want_folded(k->kind), "%s %s %s %s%s: %d ReLU gradients folded, want %d", name,
              deft_dtype_name(k->dt), layout, shape, how, fused.folded, ng_want_folded(k->kind));
    CHECK_MSG(plain.folded == 0, "%s %s: no_fusion folded %d ReLU gradients", name, shape, plain.folded);
    ng_free(&fused);
    ng_free(&plain);
}

/* ---- a small ResNet, folding against the compile option no_relu_grad_fold ---- */
enum { RN_IMAGE = 8, RN_CLASSES = 4, RN_BATCH = 16, RN_STEPS = 4 };

typedef struct rn_run {
    float loss[RN_STEPS];
    deft_graph *g;
    int folded;
} rn_run;

static void rn_batch(uint64_t seed, float *x, int32_t *y) {
    uint64_t r = seed;
    for (int i = 0; i < RN_BATCH * 3 * RN_IMAGE * RN_IMAGE; i++) x[i] = (float)ref_unif(&r, -1.0, 1.0);
    for (int i = 0; i < RN_BATCH; i++) y[i] = (int32_t)(ref_next(&r) % RN_CLASSES);
}

/* Trains the small net RN_STEPS steps on cuda:0 (the graph kept in out->g for the parameters). */
static void rn_train(deft_layout layout, deft_dtype autocast, int fold, rn_run *out) {
    const resnet_config c = {RN_CLASSES, 8, 2, {1, 1}, 0, layout};
    const deft_sgd_options sgd = {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4};
    resnet_train t = {0};
    memset(out, 0, sizeof *out);
    deft_status s = resnet_train_build(&t, &c, RN_BATCH, 0, RN_IMAGE, GPU, &sgd, 11);
    out->g = t.g;
    CHECK_MSG(s == DEFT_OK, "resnet build: %s", deft_errmsg());
    if (s != DEFT_OK) return;
    deft_compile_options co = {0};
    co.no_relu_grad_fold = !fold;
    co.autocast = autocast;
    /* cuDNN's default weight-gradient algorithms in NCHW f32 sum with atomics: two runs of one program differ in
     * the last bits, so byte equality is only a claim about the fold once the convolutions are deterministic. */
    co.deterministic = 1;
    deft_program *p = deft_compile(t.g, (deft_tensor *[]){t.loss, t.step}, 2, &co);
    CHECK_MSG(p != NULL, "resnet compile: %s", deft_errmsg());
    if (!p) return;
    float x[RN_BATCH * 3 * RN_IMAGE * RN_IMAGE];
    int32_t y[RN_BATCH];
    for (int step = 0; step < RN_STEPS; step++) {
        rn_batch(500 + (uint64_t)step, x, y);
        CHECK_OK(deft_program_feed(p, t.x, x, sizeof x));
        CHECK_OK(deft_program_feed(p, t.y, y, sizeof y));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, t.loss, &out->loss[step], sizeof out->loss[step]));
    }
    CHECK_MSG(deft_program_graph_replays(p) >= RN_STEPS - 2, "%lld replays in %d steps: %s",
              (long long)deft_program_graph_replays(p), RN_STEPS, deft_program_graph_status(p));
    out->folded = ng_folded(p, t.g);
}

/* Every parameter (running statistics included) of a and b, built alike, byte for byte. */
static void rn_same_params(const deft_graph *a, const deft_graph *b, const char *what, const char *how) {
    for (int id = 0; id < deft_graph_node_count(a) && id < deft_graph_node_count(b); id++) {
        const deft_tensor *u = deft_testing_node(a, id), *v = deft_testing_node(b, id);
        if (!deft_testing_is_op(u, "param")) continue;
        const size_t n = deft_tensor_nbytes(u);
        void *x = malloc(n), *y = malloc(n);
        CHECK(x && y && deft_testing_is_op(v, "param") && deft_tensor_nbytes(v) == n);
        if (x && y && deft_testing_is_op(v, "param") && deft_tensor_nbytes(v) == n) {
            CHECK_OK(deft_param_get(u, x, n));
            CHECK_OK(deft_param_get(v, y, n));
            CHECK_MSG(!memcmp(x, y, n), "%s: parameter %s differs %s", what, deft_tensor_name(u), how);
        }
        free(x);
        free(y);
    }
}

static void rn_check(deft_layout layout, deft_dtype autocast) {
    char what[64];
    snprintf(what, sizeof what, "resnet %s %s", layout == DEFT_NHWC ? "NHWC" : "NCHW",
             autocast ? deft_dtype_name(autocast) : "f32");
    rn_run folded, kept, again;
    rn_train(layout, autocast, 1, &folded);
    rn_train(layout, autocast, 0, &kept);
    rn_train(layout, autocast, 0, &again);   /* the `deterministic` option: the same program twice, the same bytes */
    /* The stem's ReLU and each block's first: the blocks' last ReLUs also feed the shortcut's gradient. */
    CHECK_MSG(folded.folded == 3, "%s: %d ReLU gradients folded, want 3", what, folded.folded);
    CHECK_MSG(kept.folded == 0, "%s: no_relu_grad_fold folded %d", what, kept.folded);
    for (int s = 0; s < RN_STEPS; s++) {
        CHECK_MSG(!memcmp(&folded.loss[s], &kept.loss[s], sizeof(float)), "%s: step %d loss %.9g folded, %.9g not",
                  what, s, folded.loss[s], kept.loss[s]);
        CHECK_MSG(!memcmp(&again.loss[s], &kept.loss[s], sizeof(float)), "%s: step %d loss %.9g, %.9g run again",
                  what, s, kept.loss[s], again.loss[s]);
    }
    if (folded.g && kept.g) rn_same_params(folded.g, kept.g, what, "folded / not folded");
    if (again.g && kept.g) rn_same_params(again.g, kept.g, what, "run again (deterministic)");
    deft_graph_free(folded.g);
    deft_graph_free(kept.g);
    deft_graph_free(again.g);
}

int main(void) {
    if (!fusion_gpu(&GPU)) return DEFT_CHECK_SKIP;
    const deft_layout NCHW = DEFT_NCHW, NHWC = DEFT_NHWC;
    const deft_dtype dts[] = {DEFT_F32, DEFT_BF16, DEFT_F16};
    const ng_case shapes[] = {
        {4, {16, 8, 8, 64}, NHWC, DEFT_F32, KIND_ONE, 0},   /* whole 16-byte vectors of channels */
        {4, {5, 6, 6, 37}, NHWC, DEFT_F32, KIND_ONE, 0},    /* 37 channels: the scalar kernels */
        {4, {4, 16, 5, 5}, NCHW, DEFT_F32, KIND_ONE, 0},    /* the plane walk */
    };
    const enum ng_kind kinds[] = {KIND_ONE, KIND_STACKED, KIND_NO_AFFINE, KIND_EVAL, KIND_GRAD_OUTPUT, KIND_GRAD_READ,
                                  KIND_RESIDUAL};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
                for (int specials = 0; specials < 2; specials++) {
                    if (specials && kinds[i] != KIND_ONE && kinds[i] != KIND_STACKED) continue;
                    ng_case k = shapes[s];
                    k.dt = dts[d], k.kind = kinds[i], k.specials = specials;
                    ng_check(&k, 0);
                    ng_check(&k, 1);
                }
    const ng_case extra[] = {
        {4, {64, 8, 8, 64}, NHWC, DEFT_BF16, KIND_STACKED, 0},   /* 4096 rows: many chunks per column */
        {4, {3, 5, 5, 6}, NHWC, DEFT_F64, KIND_STACKED, 1},      /* vectors of 2 doubles */
    };
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        ng_check(&extra[i], 0);
        ng_check(&extra[i], 1);
    }
    CHECK_OK(deft_testing_set_debug("BN_REFERENCE", 0));
    rn_check(DEFT_NCHW, DEFT_F32);
    rn_check(DEFT_NHWC, DEFT_F32);
    rn_check(DEFT_NHWC, DEFT_BF16);
    return deft_check_finish();
}
