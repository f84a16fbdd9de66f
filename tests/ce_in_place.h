/* Cross-entropy's gradient written over its logits (the planner's in place, passes/schedule.c): logits = x @ w,
 * viewed as [2, N / 2, C] the way a language model's are, a loss over them and its backward pass. Where the logits
 * die at the gradient, the gradient must take over their buffer (the two never live at once: the arena stays under
 * twice the logits' bytes); where they cannot (the logits are an output too) it must not. Both programs must give the
 * same bits for the loss, the logits' gradient and w's, and the logits' gradient must match softmax - onehot formed
 * on the host from the logits. Shared by test_ce_in_place.c (CPU) and cuda_test_ce_in_place.c. */
#ifndef DEFT_TEST_CE_IN_PLACE_H
#define DEFT_TEST_CE_IN_PLACE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft_testing.h"
#include "ref.h"

typedef struct ce_ip_case {
    const char *name;
    deft_dtype dt;      /* of x, w and the logits */
    int64_t n, d, c;    /* x [n, d], w [d, c]; n even */
    int use_opts;       /* 0: deft_cross_entropy's plain mean */
    deft_cross_entropy_options o;
    int ignore_every;   /* every k-th row's target is the ignore index (0: none) */
} ce_ip_case;

typedef struct ce_ip_run {
    float loss;
    void *dlogits, *dw, *logits;   /* raw, in the case's dtype */
    int shared;                    /* the logits' gradient lives in the logits' buffer */
    size_t arena;
} ce_ip_run;

static void ce_ip_free(ce_ip_run *r) {
    free(r->dlogits), free(r->dw), free(r->logits);
    memset(r, 0, sizeof *r);
}

/* One compile of the case on dev; keep: the logits are an output as well (so they live to the end). */
static int ce_ip_compile_run(deft_device dev, const ce_ip_case *c, const ref_tensor *xv, const ref_tensor *wv,
                             const ref_tensor *tv, int keep, ce_ip_run *out) {
    memset(out, 0, sizeof *out);
    const size_t es = ref_esize(c->dt), nlog = (size_t)(c->n * c->c) * es, nw = (size_t)(c->d * c->c) * es;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_param(g, "x", c->dt, 2, (int64_t[]){c->n, c->d}, dev, DEFT_INIT_ZEROS);
    deft_tensor *w = deft_param(g, "w", c->dt, 2, (int64_t[]){c->d, c->c}, dev, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(x, xv->raw, (size_t)xv->n * es));
    CHECK_OK(deft_param_set(w, wv->raw, (size_t)wv->n * es));
    CHECK_OK(deft_param_set_requires_grad(x, 0));
    deft_tensor *t = deft_constant(g, DEFT_I32, 2, (int64_t[]){2, c->n / 2}, dev, tv->raw, (size_t)tv->n * 4);
    deft_tensor *logits = deft_reshape(deft_matmul(x, w), 3, (int64_t[]){2, c->n / 2, c->c});
    const deft_cross_entropy_options *o = c->use_opts ? &c->o : NULL;
    deft_tensor *loss =
        c->dt == DEFT_F32 ? deft_cross_entropy_ex(logits, t, o) : deft_cross_entropy_as(logits, t, o, DEFT_F32);
    int ok = 0;
    if (loss && deft_backward(deft_mul_scalar(loss, 0.75)) == DEFT_OK) {
        deft_tensor *outs[4] = {loss, deft_grad(logits), deft_grad(w), logits};
        deft_program *p = outs[1] && outs[2] ? deft_compile(g, outs, keep ? 4 : 3, NULL) : NULL;
        CHECK_MSG(p != NULL, "%s: compile: %s", c->name, deft_errmsg());
        out->dlogits = calloc(1, nlog), out->dw = calloc(1, nw), out->logits = calloc(1, nlog);
        if (p && deft_program_run(p) == DEFT_OK && deft_program_read(p, loss, &out->loss, 4) == DEFT_OK &&
            deft_program_read(p, outs[1], out->dlogits, nlog) == DEFT_OK &&
            deft_program_read(p, outs[2], out->dw, nw) == DEFT_OK &&
            (!keep || deft_program_read(p, logits, out->logits, nlog) == DEFT_OK)) {
            deft_testing_node_plan pg, pl;
            deft_testing_program_node_plan(p, outs[1], &pg);
            deft_testing_program_node_plan(p, logits, &pl);
            CHECK_MSG(pl.buffer >= 0 && pg.buffer >= 0, "%s: the logits (%d) or their gradient (%d) have no buffer",
                      c->name, pl.buffer, pg.buffer);
            out->shared = pg.buffer == pl.buffer;
            deft_memory_report m;
            CHECK_OK(deft_program_memory(p, &m));
            out->arena = m.arena_bytes;
            ok = 1;
        }
        deft_program_free(p);
    }
    CHECK_MSG(ok, "%s (keep %d): run: %s", c->name, keep, deft_errmsg());
    deft_graph_free(g);
    return ok;
}

/* The logits' gradient from the logits, in double: (softmax - (1 - ls) onehot - ls / C) * 0.75 / count (mean) or
 * * 0.75 (sum), ignored rows 0. */
static double *ce_ip_want(const ce_ip_case *c, const void *logits, const ref_tensor *tv) {
    double *want = calloc((size_t)(c->n * c->c), sizeof *want);
    const double ls = c->use_opts ? c->o.label_smoothing : 0.0;
    const int sum = c->use_opts && c->o.reduction == DEFT_REDUCTION_SUM;
    int64_t count = 0;
    for (int64_t r = 0; r < c->n; r++) count += !(c->use_opts && c->o.use_ignore_index &&
                                                  (int32_t)ref_load(tv->raw, DEFT_I32, r) == c->o.ignore_index);
    const double scale = sum ? 0.75 : 0.75 / (double)count;
    for (int64_t r = 0; r < c->n; r++) {
        const int32_t tr = (int32_t)ref_load(tv->raw, DEFT_I32, r);
        if (c->use_opts && c->o.use_ignore_index && tr == c->o.ignore_index) continue;
        double m = -INFINITY, s = 0.0;
        for (int64_t l = 0; l < c->c; l++) m = fmax(m, ref_load(logits, c->dt, r * c->c + l));
        for (int64_t l = 0; l < c->c; l++) s += exp(ref_load(logits, c->dt, r * c->c + l) - m);
        for (int64_t l = 0; l < c->c; l++) {
            const double p = exp(ref_load(logits, c->dt, r * c->c + l) - m) / s;
            want[r * c->c + l] = (p - (l == tr ? 1.0 - ls : 0.0) - ls / (double)c->c) * scale;
        }
    }
    return want;
}

static void ce_ip_check(deft_device dev, const char *devname, const ce_ip_case *c) {
    uint64_t rng = 0x1a9ce5ull ^ (uint64_t)c->c;
    const size_t es = ref_esize(c->dt), nlog = (size_t)(c->n * c->c) * es, nw = (size_t)(c->d * c->c) * es;
    ref_tensor xv = ref_random(&rng, c->dt, 2, (int64_t[]){c->n, c->d}, -1, 1);
    ref_tensor wv = ref_random(&rng, c->dt, 2, (int64_t[]){c->d, c->c}, -1, 1);
    ref_tensor tv = ref_alloc(DEFT_I32, 1, (int64_t[]){c->n});
    for (int64_t r = 0; r < c->n; r++) {
        const int ignored = c->ignore_every > 0 && r % c->ignore_every == 0;
        ref_set(&tv, r, ignored ? (double)c->o.ignore_index : (double)(ref_next(&rng) % (uint64_t)c->c));
    }
    ce_ip_run a, b;
    if (ce_ip_compile_run(dev, c, &xv, &wv, &tv, 0, &a) && ce_ip_compile_run(dev, c, &xv, &wv, &tv, 1, &b)) {
        CHECK_MSG(a.shared, "%s %s: the logits' gradient did not take over the logits' buffer", devname, c->name);
        CHECK_MSG(!b.shared, "%s %s: the logits' gradient took over the buffer of logits that are an output",
                  devname, c->name);
        CHECK_MSG(a.arena < 2 * nlog && b.arena >= 2 * nlog, "%s %s: arenas %zu in place, %zu not (logits %zu bytes)",
                  devname, c->name, a.arena, b.arena, nlog);
        CHECK_MSG(memcmp(&a.loss, &b.loss, 4) == 0 && isfinite(a.loss), "%s %s: loss %.9g in place, %.9g not",
                  devname, c->name, a.loss, b.loss);
        CHECK_MSG(memcmp(a.dlogits, b.dlogits, nlog) == 0, "%s %s: the logits' gradients differ", devname, c->name);
        CHECK_MSG(memcmp(a.dw, b.dw, nw) == 0, "%s %s: w's gradients differ", devname, c->name);
        double *want = ce_ip_want(c, b.logits, &tv), *got = malloc((size_t)(c->n * c->c) * sizeof *got);
        for (int64_t i = 0; i < c->n * c->c; i++) got[i] = ref_load(a.dlogits, c->dt, i);
        char what[160];
        snprintf(what, sizeof what, "%s %s: the logits' gradient against the host's", devname, c->name);
        CHECK(ref_close(what, c->dt, got, want, c->n * c->c));
        free(want), free(got);
    }
    ce_ip_free(&a), ce_ip_free(&b);
    ref_free(&xv), ref_free(&wv), ref_free(&tv);
}

#endif
