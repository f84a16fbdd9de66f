/* The optimizer on a GPU (ops/cuda/cuda_optimizer.cu) against the CPU and against the formulas:
 *  1. an MLP (linear, tanh, linear, cross-entropy on i32 labels, batch 32) trained 20 steps on the CPU and on cuda:0
 *     from the same seed and data: the per-step losses and norms and the final parameters agree (f32 within 1e-4
 *     relative; f64 within 1e-9), for SGD (momentum, Nesterov, weight decay) and AdamW, with and without gradient
 *     accumulation (2) and clipping (0.5);
 *  2. loss = sum(p * c) in f64 on cuda:0, whose gradient is c, so every update can be written out by hand (torch's
 *     formulas): one parameter of 3 elements, and 40 parameters of 1 to 32000 elements (more than the norm's grid
 *     covers in one pass) fed new gradients every run, with accumulation and clipping, within 1e-12; and in f32 the
 *     one-launch step over parameters on and off four-element vectors (its vector and scalar walks), within 2e-5;
 *     the direct step (one micro-batch with clipping) bit for bit against the plain kernels (the debug knob
 *     OPT_REFERENCE), f32 and f64, with and without parameter groups, and against the formulas;
 *  3. set_lr between runs, the update count, the step node's value (the norm; NaN before the first update), two
 *     programs compiled from one graph driving the same optimizer (their gradients sit at different addresses), and
 *     which steps keep flat gradients.
 * Skips (exit 77) where no GPU works. DEFT_TEST_GPU_AS_CPU=1 runs every part with the CPU standing in for cuda:0,
 * which checks the test itself on a machine without a GPU. */
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"
#include "ref.h"

static deft_device GPU;   /* cuda:0, or the CPU when the test checks itself */

/* |a - b| <= tol * max(|b|, 1e-6); NaN matches NaN only. */
static int rel_close(double a, double b, double tol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return fabs(a - b) <= tol * fmax(fabs(b), 1e-6);
}

/* ---------------------------------------------------------------- 1. an MLP on both devices */
#define MLP_B 32
#define MLP_IN 40
#define MLP_HID 200
#define MLP_CLS 5
#define MLP_STEPS 20

typedef struct train_cfg {
    const char *name;
    int adamw, accumulate;
    double max_norm;
    deft_dtype dt;
    double tol;
} train_cfg;

typedef struct mlp {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_optimizer *opt;
    deft_program *prog;
} mlp;

static const char *const MLP_PARAMS[4] = {"l1.weight", "l1.bias", "l2.weight", "l2.bias"};

static int mlp_build(mlp *m, deft_device dev, const train_cfg *c) {
    memset(m, 0, sizeof *m);
    m->g = deft_graph_new();
    deft_graph_set_seed(m->g, 20240607);   /* the same initial parameters on every device */
    m->x = deft_input(m->g, "x", c->dt, 2, (int64_t[]){MLP_B, MLP_IN}, dev);
    m->y = deft_input(m->g, "y", DEFT_I32, 1, (int64_t[]){MLP_B}, dev);
    deft_tensor *h = deft_tanh(deft_linear(m->x, MLP_HID, "l1", NULL));
    m->loss = deft_cross_entropy(deft_linear(h, MLP_CLS, "l2", NULL), m->y);
    CHECK_MSG(m->loss != NULL, "%s: building the MLP failed: %s", c->name, deft_errmsg());
    if (!m->loss) return 0;
    CHECK_OK(deft_backward(m->loss));
    deft_step_options so = {.accumulate_steps = c->accumulate, .max_grad_norm = c->max_norm};
    if (c->adamw) {
        deft_adamw_options o = deft_adamw_defaults();
        o.lr = 3e-3;
        o.weight_decay = 0.05;
        m->opt = deft_adamw(m->g, &o, &so);
    } else {
        deft_sgd_options o = {.lr = 0.05, .momentum = 0.9, .dampening = 0, .weight_decay = 1e-3, .nesterov = 1};
        m->opt = deft_sgd(m->g, &o, &so);
    }
    m->step = deft_optimizer_step(m->opt);
    CHECK_MSG(m->step != NULL, "%s: the optimizer failed: %s", c->name, deft_errmsg());
    if (!m->step) return 0;
    m->prog = deft_compile(m->g, (deft_tensor *[]){m->loss, m->step}, 2, NULL);
    CHECK_MSG(m->prog != NULL, "%s: compiling failed: %s", c->name, deft_errmsg());
    return m->prog != NULL;
}

/* Batch `step`: x uniform in [-1, 1), labels from a fixed random linear teacher (so the loss can fall). */
static void mlp_batch(int step, deft_dtype dt, void *x, int32_t *y) {
    uint64_t teacher = 99, s = 1000 + (uint64_t)step;
    static double w[MLP_IN * MLP_CLS];
    for (int i = 0; i < MLP_IN * MLP_CLS; i++) w[i] = ref_unif(&teacher, -1, 1);
    for (int r = 0; r < MLP_B; r++) {
        double xr[MLP_IN], best = -INFINITY;
        int arg = 0;
        for (int k = 0; k < MLP_IN; k++) {
            xr[k] = ref_unif(&s, -1, 1);
            ref_store(x, dt, (int64_t)r * MLP_IN + k, xr[k]);
        }
        for (int c = 0; c < MLP_CLS; c++) {
            double z = 0;
            for (int k = 0; k < MLP_IN; k++) z += xr[k] * w[k * MLP_CLS + c];
            if (z > best) best = z, arg = c;
        }
        y[r] = arg;
    }
}

static int mlp_step(mlp *m, deft_dtype dt, const void *x, const int32_t *y, double *loss, float *norm) {
    const size_t esz = deft_dtype_size(dt);
    unsigned char lraw[8];
    deft_status s = deft_program_feed(m->prog, m->x, x, (size_t)MLP_B * MLP_IN * esz);
    if (s == DEFT_OK) s = deft_program_feed(m->prog, m->y, y, (size_t)MLP_B * sizeof *y);
    if (s == DEFT_OK) s = deft_program_run(m->prog);
    if (s == DEFT_OK) s = deft_program_read(m->prog, m->loss, lraw, esz);
    if (s == DEFT_OK) s = deft_program_read(m->prog, m->step, norm, sizeof *norm);
    CHECK_MSG(s == DEFT_OK, "a training step failed: %s: %s", deft_status_name(s), deft_errmsg());
    if (s != DEFT_OK) return 0;
    *loss = ref_load(lraw, dt, 0);
    return 1;
}

static double *param_values(deft_graph *g, const char *name, int64_t *n) {
    deft_tensor *t = deft_graph_find(g, name);
    CHECK_MSG(t != NULL, "no parameter %s", name);
    if (!t) return NULL;
    *n = deft_tensor_numel(t);
    const deft_dtype dt = deft_tensor_dtype(t);
    void *raw = malloc(deft_tensor_nbytes(t) + 8);
    double *v = malloc((size_t)*n * sizeof(double) + 8);
    CHECK_OK(deft_param_get(t, raw, deft_tensor_nbytes(t)));
    for (int64_t i = 0; i < *n; i++) v[i] = ref_load(raw, dt, i);
    free(raw);
    return v;
}

static void test_mlp(const train_cfg *c) {
    mlp cpu, gpu;
    int ok = mlp_build(&cpu, deft_cpu(), c);
    ok = mlp_build(&gpu, GPU, c) && ok;
    if (ok) {
        void *x = malloc((size_t)MLP_B * MLP_IN * 8);
        int32_t y[MLP_B];
        double first_loss = NAN, last_loss = NAN;
        for (int step = 0; step < MLP_STEPS; step++) {
            mlp_batch(step, c->dt, x, y);
            double lc, lg;
            float nc, ng;
            if (!mlp_step(&cpu, c->dt, x, y, &lc, &nc) || !mlp_step(&gpu, c->dt, x, y, &lg, &ng)) break;
            CHECK_MSG(rel_close(lg, lc, c->tol), "%s, step %d: loss %.9g on %s, %.9g on the cpu", c->name, step, lg,
                      deft_device_str(GPU, (char[32]){0}, 32), lc);
            CHECK_MSG(rel_close(ng, nc, c->tol), "%s, step %d: norm %.9g on the gpu, %.9g on the cpu", c->name, step,
                      (double)ng, (double)nc);
            /* The norm is NaN until the first update (the k-th run), a number from then on. */
            CHECK_MSG(isnan(ng) == (step + 1 < c->accumulate), "%s, step %d: norm %g", c->name, step, (double)ng);
            if (step == 0) first_loss = lc;
            last_loss = lc;
        }
        free(x);
        CHECK_MSG(last_loss < first_loss, "%s: the loss did not fall (%g to %g)", c->name, first_loss, last_loss);
        const int64_t want = MLP_STEPS / (c->accumulate > 0 ? c->accumulate : 1);
        CHECK_MSG(deft_optimizer_updates(cpu.opt) == want && deft_optimizer_updates(gpu.opt) == want,
                  "%s: %lld updates on the cpu, %lld on the gpu, %lld wanted", c->name,
                  (long long)deft_optimizer_updates(cpu.opt), (long long)deft_optimizer_updates(gpu.opt),
                  (long long)want);
        for (int i = 0; i < 4; i++) {
            int64_t nc = 0, ng = 0;
            double *vc = param_values(cpu.g, MLP_PARAMS[i], &nc), *vg = param_values(gpu.g, MLP_PARAMS[i], &ng);
            CHECK(nc == ng);
            if (vc && vg && nc == ng) {
                char what[160];
                snprintf(what, sizeof what, "%s: %s after %d steps", c->name, MLP_PARAMS[i], MLP_STEPS);
                ref_close_tol(what, vg, vc, nc, c->tol);
            }
            free(vc);
            free(vg);
        }
        printf("%s: loss %.6f -> %.6f; gpu program: %s (%lld replays)\n", c->name, first_loss, last_loss,
               deft_program_graph_status(gpu.prog), (long long)deft_program_graph_replays(gpu.prog));
    }
    deft_graph_free(cpu.g);
    deft_graph_free(gpu.g);
}

/* ---------------------------------------------------------------- 2. the formulas, written out */
/* torch.optim.SGD and AdamW over a flat vector, with torch's gradient accumulation (the mean of k runs) and
 * clip_grad_norm_ (max / (norm + 1e-6), at most 1) in front. */
typedef struct ref_opt {
    int adamw, k;
    deft_sgd_options sgd;
    deft_adamw_options aw;
    double max_norm, lr, last_norm;
    int64_t total, t;
    int micro;
    double *p, *acc, *buf, *m, *v;
} ref_opt;

static void ref_opt_init(ref_opt *r, int adamw, const void *opts, int k, double max_norm, int64_t total,
                         const double *p0) {
    memset(r, 0, sizeof *r);
    r->adamw = adamw;
    if (adamw) r->aw = *(const deft_adamw_options *)opts, r->lr = r->aw.lr;
    else r->sgd = *(const deft_sgd_options *)opts, r->lr = r->sgd.lr;
    r->k = k > 0 ? k : 1;
    r->max_norm = max_norm;
    r->last_norm = NAN;
    r->total = total;
    r->p = malloc((size_t)total * sizeof(double));
    r->acc = calloc((size_t)total, sizeof(double));
    r->buf = calloc((size_t)total, sizeof(double));
    r->m = calloc((size_t)total, sizeof(double));
    r->v = calloc((size_t)total, sizeof(double));
    memcpy(r->p, p0, (size_t)total * sizeof(double));
}

static void ref_opt_free(ref_opt *r) {
    free(r->p);
    free(r->acc);
    free(r->buf);
    free(r->m);
    free(r->v);
}

static void ref_opt_run(ref_opt *r, const double *g) {
    for (int64_t j = 0; j < r->total; j++) r->acc[j] = r->micro == 0 ? g[j] : r->acc[j] + g[j];
    if (++r->micro < r->k) return;
    r->micro = 0;
    double sq = 0;
    for (int64_t j = 0; j < r->total; j++) sq += (r->acc[j] / r->k) * (r->acc[j] / r->k);
    const double norm = sqrt(sq);
    const double clip = r->max_norm > 0 ? fmin(1.0, r->max_norm / (norm + 1e-6)) : 1.0;
    r->last_norm = norm;
    r->t++;
    for (int64_t j = 0; j < r->total; j++) {
        double d = r->acc[j] / r->k * clip;
        if (!r->adamw) {
            const deft_sgd_options *o = &r->sgd;
            d += o->weight_decay * r->p[j];
            if (o->momentum != 0) {
                r->buf[j] = r->t == 1 ? d : o->momentum * r->buf[j] + (1 - o->dampening) * d;
                d = o->nesterov ? d + o->momentum * r->buf[j] : r->buf[j];
            }
            r->p[j] -= r->lr * d;
        } else {
            const deft_adamw_options *o = &r->aw;
            r->p[j] -= r->lr * o->weight_decay * r->p[j];
            r->m[j] = o->beta1 * r->m[j] + (1 - o->beta1) * d;
            r->v[j] = o->beta2 * r->v[j] + (1 - o->beta2) * d * d;
            const double mhat = r->m[j] / (1 - pow(o->beta1, (double)r->t));
            const double vhat = r->v[j] / (1 - pow(o->beta2, (double)r->t));
            r->p[j] -= r->lr * mhat / (sqrt(vhat) + o->eps);
        }
    }
}

/* loss = sum_i sum(p_i * c_i) in f64 on the GPU, c_i an input fed every run: the gradient of p_i is c_i. */
typedef struct lin {
    deft_graph *g;
    deft_dtype dt;   /* of the parameters and inputs: f64, or f32 for the fast step's vector and scalar walks */
    int n;
    int64_t *size, total;
    deft_tensor **p, **c, *loss, *step;
    deft_optimizer *opt;
    deft_program *prog;
} lin;

static void lin_free(lin *l) {
    deft_graph_free(l->g);
    free(l->size);
    free(l->p);
    free(l->c);
}

/* n values of dtype dt from / to doubles. */
static void *lin_values(deft_dtype dt, const double *v, int64_t n) {
    void *out = malloc((size_t)n * (dt == DEFT_F32 ? sizeof(float) : sizeof(double)));
    for (int64_t j = 0; j < n; j++) {
        if (dt == DEFT_F32) ((float *)out)[j] = (float)v[j];
        else ((double *)out)[j] = v[j];
    }
    return out;
}

/* Builds the graph and the optimizer in dtype dt; set_lr_early >= 0 sets that learning rate before the step node
 * exists; groups: the odd parameters form a group without weight decay at half the rate. */
static int lin_build_dt(lin *l, deft_dtype dt, int n, const int64_t *sizes, const double *p0, int adamw,
                        const void *opts, int k, double max_norm, double set_lr_early, int groups) {
    memset(l, 0, sizeof *l);
    l->g = deft_graph_new();
    l->dt = dt;
    l->n = n;
    l->size = malloc((size_t)n * sizeof *l->size);
    l->p = malloc((size_t)n * sizeof *l->p);
    l->c = malloc((size_t)n * sizeof *l->c);
    deft_tensor *loss = NULL;
    for (int i = 0; i < n; i++) {
        char name[32];
        l->size[i] = sizes[i];
        snprintf(name, sizeof name, "p%d", i);
        l->p[i] = deft_param(l->g, name, dt, 1, &sizes[i], GPU, DEFT_INIT_ZEROS);
        void *v = lin_values(dt, p0 + l->total, sizes[i]);
        if (l->p[i]) CHECK_OK(deft_param_set(l->p[i], v, (size_t)sizes[i] * deft_dtype_size(dt)));
        free(v);
        snprintf(name, sizeof name, "c%d", i);
        l->c[i] = deft_input(l->g, name, dt, 1, &sizes[i], GPU);
        deft_tensor *term = deft_sum(deft_mul(l->p[i], l->c[i]), 0, NULL, 0);
        loss = i == 0 ? term : deft_add(loss, term);
        l->total += sizes[i];
    }
    l->loss = loss;
    CHECK_MSG(loss != NULL, "building sum(p * c) failed: %s", deft_errmsg());
    if (!loss) return 0;
    CHECK_OK(deft_backward(loss));
    deft_step_options so = {.accumulate_steps = k, .max_grad_norm = max_norm};
    l->opt = adamw ? deft_adamw(l->g, opts, &so) : deft_sgd(l->g, opts, &so);
    CHECK_MSG(l->opt != NULL, "the optimizer failed: %s", deft_errmsg());
    if (!l->opt) return 0;
    if (set_lr_early >= 0) CHECK_OK(deft_optimizer_set_lr(l->opt, set_lr_early));
    for (int i = 1; groups && i < n; i += 2)
        CHECK_OK(deft_optimizer_param_group(l->opt, &l->p[i], 1,
                                            &(deft_param_group_options){.weight_decay = 0, .lr_scale = 0.5}));
    l->step = deft_optimizer_step(l->opt);
    CHECK_MSG(l->step != NULL, "the step node failed: %s", deft_errmsg());
    if (!l->step) return 0;
    l->prog = deft_compile(l->g, (deft_tensor *[]){l->loss, l->step}, 2, NULL);
    CHECK_MSG(l->prog != NULL, "compiling failed: %s", deft_errmsg());
    return l->prog != NULL;
}

static int lin_build(lin *l, int n, const int64_t *sizes, const double *p0, int adamw, const void *opts, int k,
                     double max_norm, double set_lr_early) {
    return lin_build_dt(l, DEFT_F64, n, sizes, p0, adamw, opts, k, max_norm, set_lr_early, 0);
}

static int lin_run(lin *l, deft_program *prog, const double *c, float *norm) {
    deft_status s = DEFT_OK;
    void *cv = lin_values(l->dt, c, l->total);
    const size_t es = deft_dtype_size(l->dt);
    for (int i = 0, off = 0; s == DEFT_OK && i < l->n; off += (int)l->size[i], i++)
        s = deft_program_feed(prog, l->c[i], (char *)cv + (size_t)off * es, (size_t)l->size[i] * es);
    free(cv);
    if (s == DEFT_OK) s = deft_program_run(prog);
    if (s == DEFT_OK && norm) s = deft_program_read(prog, l->step, norm, sizeof *norm);
    CHECK_MSG(s == DEFT_OK, "a run failed: %s: %s", deft_status_name(s), deft_errmsg());
    return s == DEFT_OK;
}

/* The parameters against the reference, within tol (absolute: every value is of order 1). */
static void lin_compare(lin *l, const ref_opt *r, double tol, const char *what, int run) {
    double *got = malloc((size_t)l->total * sizeof(double));
    float *got32 = l->dt == DEFT_F32 ? malloc((size_t)l->total * sizeof(float)) : NULL;
    for (int i = 0, off = 0; i < l->n; off += (int)l->size[i], i++) {
        if (got32) CHECK_OK(deft_param_get(l->p[i], got32 + off, (size_t)l->size[i] * sizeof(float)));
        else CHECK_OK(deft_param_get(l->p[i], got + off, (size_t)l->size[i] * sizeof(double)));
    }
    for (int64_t j = 0; got32 && j < l->total; j++) got[j] = got32[j];
    free(got32);
    int64_t worst = 0;
    double err = 0;
    for (int64_t j = 0; j < l->total; j++)
        if (!(fabs(got[j] - r->p[j]) <= err)) err = fabs(got[j] - r->p[j]), worst = j;
    CHECK_MSG(err <= tol, "%s, run %d: parameter element %lld is %.17g, the formula gives %.17g", what, run,
              (long long)worst, got[worst], r->p[worst]);
    free(got);
}

/* `runs` runs of l, each fed new random gradients c (values of l's dtype), against the reference r: the parameters
 * within tol, the step's value (the norm) within norm_tol relative, and the update count. */
static void lin_check_runs(lin *l, ref_opt *r, int runs, uint64_t *rng, double *c, double tol, double norm_tol,
                           const char *name) {
    for (int run = 0; run < runs; run++) {
        for (int64_t j = 0; j < l->total; j++) {
            c[j] = ref_unif(rng, -1, 1);
            if (l->dt == DEFT_F32) c[j] = (float)c[j];
        }
        float norm = 0;
        if (!lin_run(l, l->prog, c, &norm)) break;
        ref_opt_run(r, c);
        lin_compare(l, r, tol, name, run);
        CHECK_MSG(rel_close(norm, r->last_norm, norm_tol), "%s, run %d: the step's value is %.9g, the norm %.9g", name,
                  run, (double)norm, r->last_norm);
        CHECK_MSG(deft_optimizer_updates(l->opt) == r->t, "%s, run %d: %lld updates, %lld wanted", name, run,
                  (long long)deft_optimizer_updates(l->opt), (long long)r->t);
    }
}

static const double C3[3] = {0.5, -2.0, 4.0};
static const double P3[3] = {1.0, -1.0, 0.25};

/* One parameter of 3 elements, the gradient C3 every run (tests/test_training.c's case, on the GPU). */
static void test_formulas_small(void) {
    deft_sgd_options variants[] = {{0.1, 0, 0, 0, 0}, {0.1, 0.9, 0, 0, 0}, {0.1, 0.9, 0, 0.01, 1},
                                   {0.05, 0.8, 0.3, 0.1, 0}};
    for (int v = 0; v < 4; v++) {
        lin l;
        ref_opt r;
        ref_opt_init(&r, 0, &variants[v], 1, 0, 3, P3);
        if (lin_build(&l, 1, (int64_t[]){3}, P3, 0, &variants[v], 1, 0, -1)) {
            for (int run = 0; run < 4; run++) {
                if (!lin_run(&l, l.prog, C3, NULL)) break;
                ref_opt_run(&r, C3);
                lin_compare(&l, &r, 1e-14, "sgd, 3 elements", run);
            }
            CHECK(deft_optimizer_updates(l.opt) == 4);
        }
        lin_free(&l);
        ref_opt_free(&r);
    }
    /* AdamW, with the learning rate changed between runs: the bias corrections and the decay follow it. */
    deft_adamw_options o = {0.01, 0.9, 0.999, 1e-8, 0.1};
    lin l;
    ref_opt r;
    ref_opt_init(&r, 1, &o, 1, 0, 3, P3);
    if (lin_build(&l, 1, (int64_t[]){3}, P3, 1, &o, 1, 0, -1)) {
        for (int run = 0; run < 6; run++) {
            if (run == 3) {
                CHECK_OK(deft_optimizer_set_lr(l.opt, 0.02));
                r.lr = 0.02;
            }
            if (!lin_run(&l, l.prog, C3, NULL)) break;
            ref_opt_run(&r, C3);
            lin_compare(&l, &r, 1e-12, "adamw, 3 elements", run);
        }
        CHECK(deft_optimizer_updates(l.opt) == 6);
        CHECK(deft_optimizer_lr(l.opt) == 0.02);
    }
    lin_free(&l);
    ref_opt_free(&r);
}

/* 40 parameters (one of a single element) holding ~600k elements, new random gradients every run. */
static void test_formulas_many(void) {
    enum { N = 40 };
    int64_t sizes[N], total = 0;
    for (int i = 0; i < N; i++) {
        sizes[i] = i == 7 ? 1 : 1 + (int64_t)((i * 7919 + 13) % 32000);
        total += sizes[i];
    }
    double *p0 = malloc((size_t)total * sizeof(double)), *c = malloc((size_t)total * sizeof(double));
    uint64_t rng = 4242;
    for (int64_t j = 0; j < total; j++) p0[j] = ref_unif(&rng, -1, 1);

    deft_sgd_options sgd = {.lr = 0.1, .momentum = 0.9, .dampening = 0, .weight_decay = 0.01, .nesterov = 1};
    deft_sgd_options sgd_damp = {.lr = 0.05, .momentum = 0.5, .dampening = 0.25, .weight_decay = 0};
    deft_adamw_options aw = {0.01, 0.9, 0.999, 1e-8, 0.1};
    struct {
        const char *name;
        int adamw;
        const void *opts;
        int k;
        double max_norm;
        int runs;
    } cases[] = {
        {"sgd nesterov, accumulate 3, clip 1", 0, &sgd, 3, 1.0, 9},
        {"sgd dampening, no clip", 0, &sgd_damp, 1, 0, 3},
        {"adamw, accumulate 2", 1, &aw, 2, 0, 6},
        {"adamw, clip 0.5", 1, &aw, 1, 0.5, 3},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        lin l;
        ref_opt r;
        ref_opt_init(&r, cases[ci].adamw, cases[ci].opts, cases[ci].k, cases[ci].max_norm, total, p0);
        if (lin_build(&l, N, sizes, p0, cases[ci].adamw, cases[ci].opts, cases[ci].k, cases[ci].max_norm, -1)) {
            lin_check_runs(&l, &r, cases[ci].runs, &rng, c, 1e-12, 1e-6, cases[ci].name);
        }
        lin_free(&l);
        ref_opt_free(&r);
    }
    free(p0);
    free(c);
}

/* The one-launch step in f32 (one micro-batch, no clipping) over parameters whose offsets in the flat storage fall
 * on four-element vectors and off them: the vector walk (with its tails of 1 to 3 elements) and the scalar walk, in
 * the many-block kernel (~600k elements) and in the one-block kernel (~40k), for SGD with and without momentum and
 * for AdamW, against the formulas in double. */
static void test_formulas_f32(void) {
    enum { N = 24 };
    int64_t sizes[N], total = 0, small_sizes[N], small_total = 0;
    for (int i = 0; i < N; i++) {
        /* the first eight stay on vectors (multiples of 4), the rest are odd-sized and knock later offsets off them */
        sizes[i] = i < 8 ? 4 * (1 + (i * 1543 + 7) % 9000) : 1 + (int64_t)((i * 7919 + 13) % 32000);
        small_sizes[i] = i < 8 ? 4 * (1 + i * 37) : 1 + (int64_t)((i * 577 + 3) % 3000);
        total += sizes[i];
        small_total += small_sizes[i];
    }
    double *p0 = malloc((size_t)total * sizeof(double)), *c = malloc((size_t)total * sizeof(double));
    uint64_t rng = 777;
    for (int64_t j = 0; j < total; j++) p0[j] = ref_unif(&rng, -1, 1);
    deft_sgd_options sgd = {.lr = 0.1, .momentum = 0.9, .dampening = 0, .weight_decay = 0.01, .nesterov = 1};
    deft_sgd_options plain = {.lr = 0.05};
    deft_adamw_options aw = {0.01, 0.9, 0.999, 1e-8, 0.1};
    struct {
        const char *name;
        int adamw;
        const void *opts;
    } cases[] = {{"f32 sgd nesterov", 0, &sgd}, {"f32 sgd without momentum", 0, &plain}, {"f32 adamw", 1, &aw}};
    for (int big = 0; big < 2; big++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const int64_t n_total = big ? total : small_total;
            lin l;
            ref_opt r;
            ref_opt_init(&r, cases[ci].adamw, cases[ci].opts, 1, 0, n_total, p0);
            if (lin_build_dt(&l, DEFT_F32, N, big ? sizes : small_sizes, p0, cases[ci].adamw, cases[ci].opts, 1, 0,
                             -1, 0)) {
                /* the reference starts from the f32 values the parameters hold */
                for (int64_t j = 0; j < n_total; j++) r.p[j] = (float)p0[j];
                lin_check_runs(&l, &r, 3, &rng, c, 2e-5, 1e-5, cases[ci].name);
            }
            lin_free(&l);
            ref_opt_free(&r);
        }
    free(p0);
    free(c);
}

/* The first element where arrays x and y of n elements of `es` bytes differ, -1 where none does. */
static int64_t first_difference(const void *x, const void *y, int64_t n, size_t es) {
    for (int64_t j = 0; j < n; j++)
        if (memcmp((const char *)x + (size_t)j * es, (const char *)y + (size_t)j * es, es) != 0) return j;
    return -1;
}

/* Every flat array of a's optimizer (the parameters, then the state) equal bit for bit to b's. */
static void lin_same_bits(lin *a, lin *b, const char *what, int run) {
    const size_t bytes = deft_testing_optimizer_array_bytes(a->opt), es = deft_dtype_size(a->dt);
    void *x = malloc(bytes), *y = malloc(bytes);
    for (int arr = 0; x && y && arr < deft_testing_optimizer_arrays(a->opt); arr++) {
        CHECK_OK(deft_testing_optimizer_read(a->opt, arr, x, bytes));
        CHECK_OK(deft_testing_optimizer_read(b->opt, arr, y, bytes));
        const int64_t j = first_difference(x, y, a->total, es);
        const double u = j < 0 ? 0 : es == 4 ? ((float *)x)[j] : ((double *)x)[j];
        const double v = j < 0 ? 0 : es == 4 ? ((float *)y)[j] : ((double *)y)[j];
        CHECK_MSG(j < 0, "%s, run %d: array %d (0 the parameters, then the state) element %lld is %.17g, the plain "
                  "kernels give %.17g", what, run, arr, (long long)j, u, v);
    }
    free(x);
    free(y);
}

/* The direct step (one micro-batch with clipping: no flat gradients, ops/cuda/cuda_optimizer_direct.cu) against the
 * plain kernels (gather, norm, prepare, update), which an optimizer built while the debug knob OPT_REFERENCE is on
 * takes: the same parameters, state and norm bit for bit after every run (replayed as CUDA Graphs), in f32 (parameters
 * on and off four-element vectors: the update's vector and scalar walks); a parameter of 1.2M elements runs the
 * norm's loads in flight in full, and the others cross its grid's stride; AdamW, a clip that acts and one that does
 * not, parameter groups. Without groups both follow the formulas in double too. On a GPU the reference keeps
 * flat gradients (a model's worth of persistent bytes more): it did take the other path. */
static void test_direct_against_plain(void) {
    enum { N = 24 };
    int64_t sizes[N], total = 0;
    for (int i = 0; i < N; i++) {
        sizes[i] = i == 3 ? 1200000 : i < 8 ? 4 * (1 + (i * 1543 + 7) % 9000) : 1 + (int64_t)((i * 7919 + 13) % 32000);
        total += sizes[i];
    }
    double *p0 = malloc((size_t)total * sizeof(double)), *c = malloc((size_t)total * sizeof(double));
    uint64_t rng = 9191;
    for (int64_t j = 0; j < total; j++) p0[j] = ref_unif(&rng, -1, 1);
    /* Only AdamW over f32 parameters takes the direct step (ir/optimizer.h says why); SGD and f64 keep the plain
     * kernels, which the other tests here cover. */
    const deft_adamw_options aw = {0.01, 0.9, 0.95, 1e-8, 0.1};
    struct {
        const char *name;
        double max_norm;
        int groups;
    } cases[] = {
        {"adamw, clip 0.5", 0.5, 0},
        {"adamw, clip 1e9 (never acts)", 1e9, 0},
        {"adamw, groups, clip 1", 1.0, 1},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        char name[128];
        snprintf(name, sizeof name, "direct step, f32 %s", cases[ci].name);
        lin fast, plain;
        ref_opt r;
        ref_opt_init(&r, 1, &aw, 1, cases[ci].max_norm, total, p0);
        for (int64_t j = 0; j < total; j++) r.p[j] = (float)p0[j];
        CHECK_OK(deft_testing_set_debug("OPT_REFERENCE", 1));
        const int built_plain =
            lin_build_dt(&plain, DEFT_F32, N, sizes, p0, 1, &aw, 1, cases[ci].max_norm, -1, cases[ci].groups);
        CHECK_OK(deft_testing_set_debug("OPT_REFERENCE", 0));
        const int built_fast =
            lin_build_dt(&fast, DEFT_F32, N, sizes, p0, 1, &aw, 1, cases[ci].max_norm, -1, cases[ci].groups);
        if (built_plain && built_fast && GPU.type == DEFT_CUDA) {
            deft_memory_report mf, mp;
            CHECK_OK(deft_program_memory(fast.prog, &mf));
            CHECK_OK(deft_program_memory(plain.prog, &mp));
            CHECK_MSG(mp.persistent_bytes == mf.persistent_bytes + (size_t)total * sizeof(float),
                      "%s: persistent bytes %zu, the plain kernels' %zu: one of them kept the wrong arrays", name,
                      mf.persistent_bytes, mp.persistent_bytes);
        }
        for (int run = 0; built_plain && built_fast && run < 4; run++) {
            for (int64_t j = 0; j < total; j++) c[j] = (float)ref_unif(&rng, -1, 1);
            float nf = 0, np = 0;
            if (!lin_run(&fast, fast.prog, c, &nf) || !lin_run(&plain, plain.prog, c, &np)) break;
            ref_opt_run(&r, c);
            lin_same_bits(&fast, &plain, name, run);
            CHECK_MSG(memcmp(&nf, &np, sizeof nf) == 0, "%s, run %d: the norm is %.9g, the plain kernels' %.9g", name,
                      run, (double)nf, (double)np);
            CHECK_MSG(rel_close(nf, r.last_norm, 1e-5), "%s, run %d: the norm is %.9g, the formula's %.9g", name, run,
                      (double)nf, r.last_norm);
            if (!cases[ci].groups) lin_compare(&fast, &r, 2e-5, name, run);
            CHECK(deft_optimizer_updates(fast.opt) == run + 1 && deft_optimizer_updates(plain.opt) == run + 1);
        }
        if (GPU.type == DEFT_CUDA && built_fast) CHECK(deft_program_graph_replays(fast.prog) >= 2);
        lin_free(&fast);
        lin_free(&plain);
        ref_opt_free(&r);
    }
    free(p0);
    free(c);
}

/* ---------------------------------------------------------------- 3. set_lr, the update count, the norm */
static void test_lr_updates_norm(void) {
    const double full = sqrt(C3[0] * C3[0] + C3[1] * C3[1] + C3[2] * C3[2]);
    deft_sgd_options o = {.lr = 0.1};
    lin l;
    ref_opt r;
    /* A rate set before the step node exists is the one the first update uses. */
    ref_opt_init(&r, 0, &o, 1, 0, 3, P3);
    r.lr = 0.2;
    if (lin_build(&l, 1, (int64_t[]){3}, P3, 0, &o, 1, 0, 0.2)) {
        CHECK(deft_optimizer_lr(l.opt) == 0.2);
        CHECK(deft_optimizer_updates(l.opt) == 0);
        float norm = 0;
        if (lin_run(&l, l.prog, C3, &norm)) {
            ref_opt_run(&r, C3);
            lin_compare(&l, &r, 1e-14, "sgd, lr set before the step node", 0);
            CHECK_NEAR(norm, full, 1e-5);
        }
        /* Between runs, without recompiling (and after the program may have been captured). */
        CHECK_OK(deft_optimizer_set_lr(l.opt, 0.5));
        CHECK(deft_optimizer_lr(l.opt) == 0.5);
        r.lr = 0.5;
        for (int run = 1; run < 4; run++) {
            if (!lin_run(&l, l.prog, C3, &norm)) break;
            ref_opt_run(&r, C3);
            lin_compare(&l, &r, 1e-14, "sgd, lr 0.5", run);
        }
        CHECK_OK(deft_optimizer_set_lr(l.opt, 0.0));
        r.lr = 0.0;
        if (lin_run(&l, l.prog, C3, &norm)) {
            ref_opt_run(&r, C3);
            lin_compare(&l, &r, 0.0, "sgd, lr 0 (nothing moves)", 4);
        }
        CHECK(deft_optimizer_updates(l.opt) == 5);
        CHECK_ERR(deft_optimizer_set_lr(l.opt, NAN), DEFT_ERR_INVALID, "must be finite and >= 0");
        CHECK_ERR(deft_optimizer_set_lr(l.opt, -0.1), DEFT_ERR_INVALID, "must be finite and >= 0");
        CHECK(deft_optimizer_lr(l.opt) == 0.0);
    }
    lin_free(&l);
    ref_opt_free(&r);

    /* Accumulating 3 runs: the count and the value move on every third run; the value is NaN before the first
     * update and the norm of the mean gradient (here C3 each run, so |C3|, before clipping) from then on. */
    ref_opt_init(&r, 0, &o, 3, 1.0, 3, P3);
    if (lin_build(&l, 1, (int64_t[]){3}, P3, 0, &o, 3, 1.0, -1)) {
        const int64_t want_updates[7] = {0, 0, 1, 1, 1, 2, 2};
        for (int run = 0; run < 7; run++) {
            float norm = 0;
            if (!lin_run(&l, l.prog, C3, &norm)) break;
            ref_opt_run(&r, C3);
            lin_compare(&l, &r, 1e-14, "sgd, accumulate 3, clip 1", run);
            CHECK_MSG(deft_optimizer_updates(l.opt) == want_updates[run], "run %d: %lld updates, %lld wanted", run,
                      (long long)deft_optimizer_updates(l.opt), (long long)want_updates[run]);
            if (run < 2) CHECK_MSG(isnan(norm), "run %d: the value before the first update is %g, not NaN", run,
                                   (double)norm);
            else CHECK_MSG(fabs(norm - full) <= 1e-5, "run %d: the value is %.9g, the norm %.9g", run, (double)norm,
                           full);
        }
    }
    lin_free(&l);
    ref_opt_free(&r);
}

/* Two programs from one graph run the same optimizer: each program's arena places the gradients elsewhere, so the
 * GPU side keeps a gather table for each; alternating them must give the same updates as one program. */
static void test_two_programs(void) {
    deft_sgd_options o = {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
    enum { N = 3 };
    const int64_t sizes[N] = {5, 1000, 3};
    double p0[1008], c[1008];
    uint64_t rng = 777;
    for (int j = 0; j < 1008; j++) p0[j] = ref_unif(&rng, -1, 1);
    lin l;
    ref_opt r;
    ref_opt_init(&r, 0, &o, 2, 0, 1008, p0);
    if (lin_build(&l, N, sizes, p0, 0, &o, 2, 0, -1)) {
        deft_program *only_step = deft_compile(l.g, (deft_tensor *[]){l.step}, 1, NULL);
        CHECK_MSG(only_step != NULL, "compiling the second program failed: %s", deft_errmsg());
        for (int run = 0; only_step && run < 8; run++) {
            for (int j = 0; j < 1008; j++) c[j] = ref_unif(&rng, -1, 1);
            if (!lin_run(&l, run % 3 == 1 ? only_step : l.prog, c, NULL)) break;
            ref_opt_run(&r, c);
            lin_compare(&l, &r, 1e-13, "two programs", run);
        }
        CHECK(deft_optimizer_updates(l.opt) == 4);
    }
    lin_free(&l);
    ref_opt_free(&r);
}

/* Only the staged GPU step (several micro-batches, or an optimizer built under the debug knob OPT_REFERENCE) and the
 * CPU keep flat gradients: the optimizer's persistent state on a GPU is otherwise one array per state (momentum), not
 * two, clipping or not. */
static void test_flat_gradients_only_when_needed(void) {
    const deft_step_options variants[3] = {{0}, {.accumulate_steps = 2}, {.max_grad_norm = 1.0}};
    for (int v = 0; v < 3; v++)
        for (int reference = 0; reference < 2; reference++) {
            deft_graph *g = deft_graph_new();
            deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){16, 8}, GPU);
            deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){16}, GPU);
            deft_tensor *loss = deft_cross_entropy(deft_linear(x, 4, "fc", NULL), y);
            CHECK_OK(deft_backward(loss));
            CHECK_OK(deft_testing_set_debug("OPT_REFERENCE", reference));
            deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.1, .momentum = 0.9}, &variants[v]);
            CHECK_OK(deft_testing_set_debug("OPT_REFERENCE", 0));
            deft_program *p = deft_compile(g, (deft_tensor *[]){loss, deft_optimizer_step(opt)}, 2, NULL);
            CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
            deft_memory_report r;
            CHECK_OK(deft_program_memory(p, &r));
            const size_t params = (8 * 4 + 4) * sizeof(float), inputs = 16 * 8 * sizeof(float) + 16 * sizeof(int32_t);
            /* SGD with clipping keeps them too: only AdamW over f32 parameters takes the direct step. */
            const int keeps = v == 1 || v == 2 || reference || GPU.type == DEFT_CPU;
            const size_t want = params + inputs + (keeps ? 2 : 1) * params + sizeof(float);
            CHECK_MSG(r.persistent_bytes == want, "variant %d, reference %d: persistent %zu, expected %zu", v,
                      reference, r.persistent_bytes, want);
            deft_graph_free(g);
        }
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    const train_cfg cfgs[] = {
        {"sgd nesterov f32", 0, 1, 0, DEFT_F32, 1e-4},
        {"adamw f32", 1, 1, 0, DEFT_F32, 1e-4},
        {"sgd nesterov f32, accumulate 2, clip 0.5", 0, 2, 0.5, DEFT_F32, 1e-4},
        {"adamw f32, accumulate 2, clip 0.5", 1, 2, 0.5, DEFT_F32, 1e-4},
        {"sgd nesterov f64, accumulate 2, clip 0.5", 0, 2, 0.5, DEFT_F64, 1e-9},
        {"adamw f64, accumulate 2, clip 0.5", 1, 2, 0.5, DEFT_F64, 1e-9},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) test_mlp(&cfgs[i]);
    test_formulas_small();
    test_formulas_many();
    test_formulas_f32();
    test_direct_against_plain();
    test_lr_updates_norm();
    test_two_programs();
    test_flat_gradients_only_when_needed();
    return deft_check_finish();
}
