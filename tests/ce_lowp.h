/* Cross-entropy on f16 and bf16 logits read as they are, with an f32 loss (deft_cross_entropy_as, what autocast
 * builds), against the same logits cast to f32 first (the path autocast took before): on one device the loss must
 * have the same bits, and the logits' gradient (the cast path's f32 gradient rounded to the logits' dtype by the
 * cast's backward) the same bits, over an ignore index, label smoothing, mean and sum, and N-D logits. The shapes
 * take both of the GPU's kernels (a warp per row below 1024 classes, a block per row from there, with rows that
 * start on 16 bytes and rows that do not). Shared by test_ce_lowp.c (CPU) and cuda_test_ce_lowp.c. */
#ifndef DEFT_TEST_CE_LOWP_H
#define DEFT_TEST_CE_LOWP_H

#include "check.h"
#include "deft_testing.h"
#include "ref.h"

typedef struct ce_lowp_case {
    const char *name;
    int ndim;                       /* of the logits: [rows..., C] */
    int64_t shape[3];
    int use_opts;                   /* 0: deft_cross_entropy's plain mean (NULL options) */
    deft_cross_entropy_options o;
    int ignore_every;               /* every k-th row's target is the ignore index (0: none) */
} ce_lowp_case;

static const ce_lowp_case ce_lowp_cases[] = {
    {"2-D, 11 classes, plain mean", 2, {37, 11}, 0, {0}, 0},
    {"2-D, 11 classes, ignore -100 every 4th", 2, {37, 11}, 1, {.use_ignore_index = 1, .ignore_index = -100}, 4},
    {"2-D, 1027 classes (rows off 16 bytes), smoothing 0.1, sum", 2, {6, 1027}, 1,
     {.label_smoothing = 0.1, .reduction = DEFT_REDUCTION_SUM}, 0},
    {"2-D, 2048 classes, ignore 2 (a class), smoothing 0.2", 2, {5, 2048}, 1,
     {.use_ignore_index = 1, .ignore_index = 2, .label_smoothing = 0.2}, 2},
    {"3-D [2, 3, 1024], defaults (ignore -100) every 3rd", 3, {2, 3, 1024}, 1,
     {.use_ignore_index = 1, .ignore_index = -100}, 3},
    {"3-D [3, 4, 50], sum", 3, {3, 4, 50}, 1, {.reduction = DEFT_REDUCTION_SUM}, 0},
};

/* The loss (f32 bits) and the gradient of 0.75 * loss for the logits (raw, in the logits' dtype) on dev, the logits
 * read directly (direct) or cast to f32 first. */
static int ce_lowp_run(deft_device dev, const ce_lowp_case *c, const ref_tensor *x, const ref_tensor *t, int direct,
                       float *loss_out, void *grad_out) {
    deft_graph *g = deft_graph_new();
    deft_tensor *xp = deft_param(g, "logits", x->dt, x->ndim, x->shape, dev, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(xp, x->raw, (size_t)x->n * ref_esize(x->dt)));
    deft_tensor *tt = deft_constant(g, DEFT_I32, t->ndim, t->shape, dev, t->raw, (size_t)t->n * 4);
    const deft_cross_entropy_options *o = c->use_opts ? &c->o : NULL;
    deft_tensor *loss = direct ? deft_cross_entropy_as(xp, tt, o, DEFT_F32)
                               : deft_cross_entropy_ex(deft_cast(xp, DEFT_F32), tt, o);
    CHECK_MSG(loss && deft_tensor_dtype(loss) == DEFT_F32, "%s: build: %s", c->name, deft_graph_errmsg(g));
    int ok = 0;
    if (loss && deft_backward(deft_mul_scalar(loss, 0.75)) == DEFT_OK) {
        deft_tensor *outs[2] = {loss, deft_grad(xp)};
        deft_program *p = outs[1] ? deft_compile(g, outs, 2, NULL) : NULL;
        CHECK_MSG(p != NULL, "%s: compile: %s", c->name, deft_errmsg());
        if (p && deft_program_run(p) == DEFT_OK &&
            deft_program_read(p, loss, loss_out, sizeof *loss_out) == DEFT_OK &&
            deft_program_read(p, outs[1], grad_out, (size_t)x->n * ref_esize(x->dt)) == DEFT_OK)
            ok = 1;
        deft_program_free(p);
    }
    CHECK_MSG(ok, "%s: run: %s", c->name, deft_errmsg());
    deft_graph_free(g);
    return ok;
}

static void ce_lowp_inputs(const ce_lowp_case *c, deft_dtype dt, uint64_t *rng, ref_tensor *x, ref_tensor *t) {
    *x = ref_random(rng, dt, c->ndim, c->shape, -6, 6);
    const int64_t classes = c->shape[c->ndim - 1];
    *t = ref_alloc(DEFT_I32, c->ndim - 1, c->shape);
    for (int64_t r = 0; r < t->n; r++) {
        const int ignored = c->ignore_every > 0 && r % c->ignore_every == 0;
        ref_set(t, r, ignored ? (double)c->o.ignore_index : (double)(ref_next(rng) % (uint64_t)classes));
    }
}

/* Every case in bf16 and f16 on dev: the direct path's bits against the cast path's. */
static void ce_lowp_check_bits(deft_device dev, const char *devname) {
    static const deft_dtype dts[] = {DEFT_BF16, DEFT_F16};
    uint64_t rng = 0xce10a9ull;
    for (size_t ci = 0; ci < sizeof ce_lowp_cases / sizeof ce_lowp_cases[0]; ci++)
        for (int di = 0; di < 2; di++) {
            const ce_lowp_case *c = &ce_lowp_cases[ci];
            ref_tensor x, t;
            ce_lowp_inputs(c, dts[di], &rng, &x, &t);
            uint16_t *ga = calloc((size_t)x.n, 2), *gb = calloc((size_t)x.n, 2);
            float la = NAN, lb = NAN;
            if (ce_lowp_run(dev, c, &x, &t, 1, &la, ga) && ce_lowp_run(dev, c, &x, &t, 0, &lb, gb)) {
                uint32_t ba, bb;
                memcpy(&ba, &la, 4);
                memcpy(&bb, &lb, 4);
                CHECK_MSG(isfinite(la) && ba == bb, "%s %s %s: loss %.9g (0x%08x) direct, %.9g (0x%08x) cast", devname,
                          c->name, deft_dtype_name(x.dt), la, ba, lb, bb);
                int64_t differ = 0, nonzero = 0, first = -1;
                for (int64_t i = 0; i < x.n; i++) {
                    if (ga[i] != gb[i] && first < 0) first = i;
                    differ += ga[i] != gb[i];
                    nonzero += (ga[i] & 0x7fffu) != 0;
                }
                CHECK_MSG(differ == 0, "%s %s %s: %lld of %lld gradient elements differ (first %lld: 0x%04x, 0x%04x)",
                          devname, c->name, deft_dtype_name(x.dt), (long long)differ, (long long)x.n,
                          (long long)first, first >= 0 ? ga[first] : 0, first >= 0 ? gb[first] : 0);
                CHECK_MSG(nonzero > 0, "%s %s: the gradient is all zeros", devname, c->name);
            }
            free(ga), free(gb);
            ref_free(&x), ref_free(&t);
        }
}

#endif
