/* A deep MLP for the optimizer-in-backward tests: x -> (linear -> relu) x depth -> linear -> cross-entropy with y,
 * its backward pass and SGD (momentum, weight decay) or AdamW. Two nets built with the same spec start from the same
 * parameters and see the same batches, so a program compiled with optimizer_in_backward can be compared, bit for
 * bit, with one compiled without it. The flat storage and the optimizer's state are read through deft_testing.h. */
#ifndef DEFT_TEST_OBWD_NET_H
#define DEFT_TEST_OBWD_NET_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft_testing.h"
#include "xorshift.h"

typedef struct obwd_spec {
    int depth;
    int64_t batch, width, classes;
    int adamw;
    deft_device device;
} obwd_spec;

typedef struct obwd_net {
    obwd_spec spec;
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_optimizer *opt;
    float *hx;
    int32_t *hy;
} obwd_net;

static inline int obwd_build(obwd_net *n, const obwd_spec *s) {
    *n = (obwd_net){.spec = *s};
    n->g = deft_graph_new();
    deft_graph_set_seed(n->g, 77);
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){s->batch, s->width}, s->device);
    n->y = deft_input(n->g, "y", DEFT_I32, 1, (int64_t[]){s->batch}, s->device);
    deft_tensor *h = n->x;
    char name[32];
    for (int l = 0; l < s->depth; l++) {
        snprintf(name, sizeof name, "fc%d", l);
        h = deft_relu(deft_linear(h, s->width, name, NULL));
    }
    n->loss = deft_set_name(deft_cross_entropy(deft_linear(h, s->classes, "head", NULL), n->y), "loss");
    CHECK_OK(deft_backward(n->loss));
    if (s->adamw)
        n->opt = deft_adamw(n->g, &(deft_adamw_options){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                                         .weight_decay = 0.01}, NULL);
    else
        n->opt = deft_sgd(n->g, &(deft_sgd_options){.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3}, NULL);
    n->step = deft_optimizer_step(n->opt);
    n->hx = malloc((size_t)(s->batch * s->width) * sizeof *n->hx);
    n->hy = malloc((size_t)s->batch * sizeof *n->hy);
    const int ok = n->step && n->hx && n->hy && deft_graph_error(n->g) == DEFT_OK;
    CHECK_MSG(ok, "building the net: %s", deft_graph_errmsg(n->g));
    return ok;
}

static inline void obwd_free(obwd_net *n) {
    deft_graph_free(n->g);
    free(n->hx);
    free(n->hy);
    *n = (obwd_net){0};
}

static inline deft_program *obwd_compile(obwd_net *n, const deft_compile_options *o) {
    return deft_compile(n->g, (deft_tensor *[]){n->loss, n->step}, 2, o);
}

/* The GPU optimisations obwd_compile_without can turn off on top of the options given. */
enum { OBWD_ALL_ON = 0, OBWD_NO_SIDE_LANE, OBWD_NO_PRODUCT_BATCHES };

/* obwd_compile with o and the optimisation `off` (OBWD_NO_SIDE_LANE: the compile option no_side_lane;
 * OBWD_NO_PRODUCT_BATCHES: no_product_batches; OBWD_ALL_ON: none) turned off; a failed compile is a failed check. */
static inline deft_program *obwd_compile_without(obwd_net *n, const deft_compile_options *o, int off) {
    deft_compile_options with = o ? *o : (deft_compile_options){0};
    if (off == OBWD_NO_SIDE_LANE) with.no_side_lane = 1;
    if (off == OBWD_NO_PRODUCT_BATCHES) with.no_product_batches = 1;
    deft_program *p = obwd_compile(n, &with);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    return p;
}

/* The batch of run r (the same for every net of a spec). */
static inline void obwd_batch(obwd_net *n, int r) {
    uint64_t rng = 0x9e3779b97f4a7c15ull + (uint64_t)r;
    for (int64_t i = 0; i < n->spec.batch * n->spec.width; i++)
        n->hx[i] = (float)((double)(xorshift64(&rng) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    for (int64_t i = 0; i < n->spec.batch; i++) n->hy[i] = (int32_t)xorshift64_below(&rng, (int)n->spec.classes);
}

/* One run: the loss and the step's value. */
static inline int obwd_run(obwd_net *n, deft_program *p, int r, float *loss, float *norm) {
    obwd_batch(n, r);
    deft_status s = deft_program_feed(p, n->x, n->hx, (size_t)(n->spec.batch * n->spec.width) * sizeof *n->hx);
    if (s == DEFT_OK) s = deft_program_feed(p, n->y, n->hy, (size_t)n->spec.batch * sizeof *n->hy);
    if (s == DEFT_OK) s = deft_program_run(p);
    if (s == DEFT_OK) s = deft_program_read(p, n->loss, loss, sizeof *loss);
    if (s == DEFT_OK) s = deft_program_read(p, n->step, norm, sizeof *norm);
    CHECK_MSG(s == DEFT_OK, "run %d: %s", r, deft_errmsg());
    return s == DEFT_OK;
}

/* The flat parameters and the optimizer's state, copied to the host (malloc'd; NULL on failure). */
static inline unsigned char *obwd_state(const obwd_net *n, size_t *bytes) {
    const deft_optimizer *o = n->opt;
    const size_t one = deft_testing_optimizer_array_bytes(o);
    const int n_parts = deft_testing_optimizer_arrays(o);
    unsigned char *h = malloc(one * 3);
    if (!h) return NULL;
    deft_status s = DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < n_parts; i++) s = deft_testing_optimizer_read(o, i, h + i * one, one);
    CHECK_MSG(s == DEFT_OK, "reading the optimizer's state: %s", deft_errmsg());
    *bytes = one * (size_t)n_parts;
    if (s != DEFT_OK) {
        free(h);
        return NULL;
    }
    return h;
}

/* Runs two nets of spec s side by side for `runs` runs, the first compiled with oa, the second with ob and, when
 * one_stream_b, no_side_lane (every step on one stream): losses, norms, parameters and state must agree bit
 * for bit after every run, and the update counts too. Returns the number of runs that agreed. */
static inline int obwd_compare_programs(const obwd_spec *s, const deft_compile_options *oa,
                                        const deft_compile_options *ob, int one_stream_b, int runs, const char *what) {
    obwd_net a, b;
    int agreed = 0;
    if (!obwd_build(&a, s) || !obwd_build(&b, s)) {
        obwd_free(&a);
        obwd_free(&b);
        return 0;
    }
    deft_program *pa = obwd_compile(&a, oa);
    CHECK_MSG(pa != NULL, "%s: compile: %s", what, deft_errmsg());
    deft_program *pb = pa ? obwd_compile_without(&b, ob, one_stream_b ? OBWD_NO_SIDE_LANE : OBWD_ALL_ON) : NULL;
    for (int r = 0; pa && pb && r < runs; r++) {
        float la, lb, na, nb;
        if (!obwd_run(&a, pa, r, &la, &na) || !obwd_run(&b, pb, r, &lb, &nb)) break;
        size_t ba = 0, bb = 0;
        unsigned char *sa = obwd_state(&a, &ba), *sb = obwd_state(&b, &bb);
        const int same_state = sa && sb && ba == bb && memcmp(sa, sb, ba) == 0;
        free(sa);
        free(sb);
        CHECK_MSG(memcmp(&la, &lb, sizeof la) == 0, "%s, run %d: loss %.9g and %.9g", what, r, (double)la, (double)lb);
        CHECK_MSG(memcmp(&na, &nb, sizeof na) == 0, "%s, run %d: norm %.9g and %.9g", what, r, (double)na, (double)nb);
        CHECK_MSG(same_state, "%s, run %d: parameters or optimizer state differ", what, r);
        CHECK_MSG(deft_optimizer_updates(a.opt) == r + 1 && deft_optimizer_updates(b.opt) == r + 1,
                  "%s, run %d: %lld and %lld updates", what, r, (long long)deft_optimizer_updates(a.opt),
                  (long long)deft_optimizer_updates(b.opt));
        if (memcmp(&la, &lb, sizeof la) != 0 || memcmp(&na, &nb, sizeof na) != 0 || !same_state || isnan(na)) break;
        agreed++;
    }
    obwd_free(&a);
    obwd_free(&b);
    return agreed;
}

/* A net compiled without and one compiled with optimizer_in_backward (both with `extra` options), compared. */
static inline int obwd_compare(const obwd_spec *s, const deft_compile_options *extra, int runs, const char *what) {
    deft_compile_options oa = extra ? *extra : (deft_compile_options){0}, ob = oa;
    ob.optimizer_in_backward = 1;
    return obwd_compare_programs(s, &oa, &ob, 0, runs, what);
}

#endif
