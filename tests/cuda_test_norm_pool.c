/* The fast batch-norm and pooling kernels on cuda:0 (ops/cuda/cuda_norm_fast.cu, cuda_pool_fast.cu) against the
 * plain ones kept as their reference (debug knobs BN_REFERENCE, POOL_REFERENCE) and against the CPU, over the
 * sizes that stress their grids: channels not a multiple of 32, H W = 1, N = 1, many elements per channel (many
 * chunks, and a mean far from zero so that a variance from unshifted sums would cancel), many channels, a 2-d
 * input, both layouts. Batch norm runs three times per program (eager, captured, replayed), so the running
 * statistics are checked against the textbook update after three steps and a launch that left a count behind would
 * show; the GPU's outputs after the replay must equal those of the first (eager) run bit for bit. Halves run with
 * f32 statistics and parameters and are compared with the CPU's f32 result. ResNet-18's NHWC shapes (128 to 8192
 * rows of 64 to 512 channels, and its max pool's [128, 16, 16, 64]) run in f32, f16 and bf16, through the row
 * walk's vector loads (in its wider blocks from 8192 rows on) and its scalar path. Max pooling is checked exactly against the plain kernels, on inputs
 * full of ties (and a NaN). Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU in the
 * GPU's place. */
#define _POSIX_C_SOURCE 200112L
#include <stdlib.h>

#include "cuda_compare.h"

#define CPU deft_cpu()

static deft_device GPU;
static uint64_t rng = 0xb17fa57c0deull;

static int is_half(deft_dtype dt) { return dt == DEFT_F16 || dt == DEFT_BF16; }

/* The fast kernels (0) or the plain ones (1), for the runs that follow. */
static void use_reference(int on) {
    CHECK_OK(deft_testing_set_debug("BN_REFERENCE", on));
    CHECK_OK(deft_testing_set_debug("POOL_REFERENCE", on));
}

/* A parameter on dev holding the values v in dt. */
static deft_tensor *param_from(deft_graph *g, const char *name, const double *v, int ndim, const int64_t *shape,
                               deft_device dev, deft_dtype dt) {
    deft_tensor *p = deft_param(g, name, dt, ndim, shape, dev, DEFT_INIT_ZEROS);
    const int64_t n = ref_numel(ndim, shape);
    void *raw = calloc((size_t)n + 1, deft_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) ref_store(raw, dt, i, v[i]);
    CHECK_OK(deft_param_set(p, raw, (size_t)n * deft_dtype_size(dt)));
    free(raw);
    return p;
}

static double *raw_doubles(deft_status s, void *raw, deft_dtype dt, int64_t n) {
    CHECK_OK(s);
    double *v = to_doubles(raw, dt, n);
    free(raw);
    return v;
}

static double *read_out(deft_program *p, deft_tensor *t) {
    const deft_dtype dt = deft_tensor_dtype(t);
    const int64_t n = deft_tensor_numel(t);
    void *raw = calloc((size_t)n + 1, deft_dtype_size(dt));
    return raw_doubles(deft_program_read(p, t, raw, (size_t)n * deft_dtype_size(dt)), raw, dt, n);
}

static double *param_values(deft_tensor *t) {
    const deft_dtype dt = deft_tensor_dtype(t);
    const int64_t n = deft_tensor_numel(t);
    void *raw = calloc((size_t)n + 1, deft_dtype_size(dt));
    return raw_doubles(deft_param_get(t, raw, (size_t)n * deft_dtype_size(dt)), raw, dt, n);
}

static void compare(const char *name, const char *what, const double *got, const double *want, int64_t n,
                    double tol) {
    if (!got || !want) return;   /* the failed run is already a failed check */
    char label[400];
    snprintf(label, sizeof label, "%s: %s", name, what);
    ref_close_tol(label, got, want, n, tol);
}

/* ---------------------------------------------------------------- batch norm */
typedef struct bn_case {
    int ndim;
    int64_t shape[4];   /* as stored: [N, C, ...] in NCHW, [N, ..., C] in NHWC */
    deft_layout layout;
    deft_dtype dt;
    double lo, hi;      /* x is uniform in [lo, hi) */
    int eval;
} bn_case;

enum { BN_RUNS = 3 };

/* The host values of one case: x and dy as stored (rounded to the case's dtype), the per-channel vectors. */
typedef struct bn_data {
    int64_t n, C, S;   /* S: elements of a channel between two of the next channel (1 in NHWC) */
    ref_tensor x, dy, w, b, rm, rv;
} bn_data;

typedef struct bn_out {
    double *y, *dx, *dw, *db, *rm, *rv;
} bn_out;

static bn_data bn_data_make(const bn_case *k) {
    bn_data d;
    const int c_axis = k->layout == DEFT_NHWC ? k->ndim - 1 : 1;
    const deft_dtype pdt = is_half(k->dt) ? DEFT_F32 : k->dt;
    d.C = k->shape[c_axis];
    d.S = k->layout == DEFT_NHWC ? 1 : ref_numel(k->ndim - 2, k->shape + 2);
    d.x = ref_random(&rng, k->dt, k->ndim, k->shape, k->lo, k->hi);
    d.dy = ref_random(&rng, k->dt, k->ndim, k->shape, -1.0, 1.0);
    d.n = d.x.n;
    d.w = ref_random(&rng, pdt, 1, &d.C, 0.5, 1.5), d.b = ref_random(&rng, pdt, 1, &d.C, -0.5, 0.5);
    d.rm = ref_random(&rng, pdt, 1, &d.C, -0.2, 0.2), d.rv = ref_random(&rng, pdt, 1, &d.C, 0.5, 2.0);
    return d;
}

static void bn_data_free(bn_data *d) {
    ref_free(&d->x), ref_free(&d->dy), ref_free(&d->w), ref_free(&d->b), ref_free(&d->rm), ref_free(&d->rv);
}

static void bn_out_free(bn_out *o) { free(o->y), free(o->dx), free(o->dw), free(o->db), free(o->rm), free(o->rv); }

/* The GPU's outputs of the replay against those of the first, eager, run: the sums are added in a fixed order. */
static void bn_check_replay(const char *name, deft_program *p, deft_tensor *const *outs, double *const *first) {
    static const char *const what[4] = {"y", "dx", "dweight", "dbias"};
    for (int i = 0; i < 4; i++) {
        double *last = read_out(p, outs[i]);
        char label[96];
        snprintf(label, sizeof label, "%s (replay vs eager, exactly)", what[i]);
        compare(name, label, last, first[i], deft_tensor_numel(outs[i]), 0.0);
        free(last);
    }
}

/* Trains (or evaluates) BN_RUNS times on dev; the CPU runs halves in f32. */
static bn_out bn_run(const char *name, deft_device dev, const bn_case *k, const bn_data *d) {
    bn_out r = {0};
    const deft_dtype dt = dev.type == DEFT_CPU && is_half(k->dt) ? DEFT_F32 : k->dt;
    const deft_dtype pdt = is_half(dt) ? DEFT_F32 : dt;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = param_from(g, "x", d->x.v, k->ndim, k->shape, dev, dt);
    deft_tensor *dy = param_from(g, "dy", d->dy.v, k->ndim, k->shape, dev, dt);
    deft_tensor *w = param_from(g, "w", d->w.v, 1, &d->C, dev, pdt), *b = param_from(g, "b", d->b.v, 1, &d->C, dev, pdt);
    deft_tensor *rm = param_from(g, "rm", d->rm.v, 1, &d->C, dev, pdt);
    deft_tensor *rv = param_from(g, "rv", d->rv.v, 1, &d->C, dev, pdt);
    CHECK_OK(deft_param_set_requires_grad(dy, 0));
    CHECK_OK(deft_param_set_requires_grad(rm, 0));
    CHECK_OK(deft_param_set_requires_grad(rv, 0));
    deft_batch_norm_options o = deft_batch_norm_defaults();
    o.eval = k->eval, o.momentum = 0.3, o.layout = k->layout;
    deft_tensor *y = deft_batch_norm(x, w, b, rm, rv, &o);
    CHECK_MSG(y != NULL, "batch_norm: %s", deft_errmsg());
    CHECK_OK(deft_backward(deft_sum(deft_mul(y, dy), 0, NULL, 0)));
    deft_tensor *outs[4] = {y, deft_grad(x), deft_grad(w), deft_grad(b)};
    deft_program *p = y ? deft_compile(g, outs, 4, NULL) : NULL;
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    int ok = p != NULL;
    double *first[4] = {0};
    for (int run = 0; ok && run < BN_RUNS; run++) {
        ok = deft_program_run(p) == DEFT_OK;
        CHECK_MSG(ok, "batch norm run %d failed: %s", run, deft_errmsg());
        for (int i = 0; ok && run == 0 && dev.type != DEFT_CPU && i < 4; i++) first[i] = read_out(p, outs[i]);
    }
    if (ok && dev.type != DEFT_CPU) bn_check_replay(name, p, outs, first);
    for (int i = 0; i < 4; i++) free(first[i]);
    if (ok) {
        r.y = read_out(p, y), r.dx = read_out(p, outs[1]), r.dw = read_out(p, outs[2]), r.db = read_out(p, outs[3]);
        r.rm = param_values(rm), r.rv = param_values(rv);
    }
    deft_graph_free(g);
    return r;
}

/* torch's update, BN_RUNS times on the same batch (unbiased variance), in double on the stored values. */
static void bn_textbook(const bn_case *k, const bn_data *d, double *rm, double *rv) {
    const int64_t m = d->n / d->C;
    for (int64_t c = 0; c < d->C; c++) {
        double sum = 0.0, sq = 0.0;
        for (int64_t i = 0; i < d->n; i++)
            if ((i / d->S) % d->C == c) sum += d->x.v[i];
        const double mean = sum / (double)m;
        for (int64_t i = 0; i < d->n; i++)
            if ((i / d->S) % d->C == c) sq += (d->x.v[i] - mean) * (d->x.v[i] - mean);
        const double var = sq / (double)(m - 1);
        rm[c] = d->rm.v[c], rv[c] = d->rv.v[c];
        for (int run = 0; !k->eval && run < BN_RUNS; run++) {
            rm[c] = 0.7 * rm[c] + 0.3 * mean;
            rv[c] = 0.7 * rv[c] + 0.3 * var;
        }
    }
}

static double bn_tol(deft_dtype dt) {
    switch (dt) {
    case DEFT_F64: return 1e-10;
    case DEFT_F32: return 1e-4;   /* float elementwise math, sums in other orders */
    default: return ref_tol(dt);
    }
}

static void bn_check(const bn_case *k) {
    bn_data d = bn_data_make(k);
    char name[200], s[64];
    snprintf(name, sizeof name, "batch_norm %s %s %s x%s in [%g, %g)", k->eval ? "eval" : "train", dt_names[k->dt],
             k->layout == DEFT_NHWC ? "NHWC" : "NCHW", ref_shape_str(k->ndim, k->shape, s, sizeof s), k->lo, k->hi);
    bn_out cpu = bn_run(name, CPU, k, &d);
    use_reference(0);
    bn_out fast = bn_run(name, GPU, k, &d);
    use_reference(1);
    bn_out plain = bn_run(name, GPU, k, &d);
    use_reference(0);
    const double tol = bn_tol(k->dt), ptol = is_half(k->dt) ? 1e-5 : bn_tol(k->dt);
    const double *want[6] = {cpu.y, cpu.dx, cpu.dw, cpu.db, cpu.rm, cpu.rv};
    const double *got[6] = {fast.y, fast.dx, fast.dw, fast.db, fast.rm, fast.rv};
    const double *ref[6] = {plain.y, plain.dx, plain.dw, plain.db, plain.rm, plain.rv};
    static const char *const what[6] = {"y", "dx", "dweight", "dbias", "running_mean", "running_var"};
    for (int i = 0; i < 6; i++) {
        const int64_t n = i < 2 ? d.n : d.C;
        char label[96];
        snprintf(label, sizeof label, "%s (fast vs cpu)", what[i]);
        compare(name, label, got[i], want[i], n, tol);
        snprintf(label, sizeof label, "%s (fast vs plain)", what[i]);
        compare(name, label, got[i], ref[i], n, i < 2 ? tol : ptol);
    }
    double *rm = malloc((size_t)d.C * sizeof *rm), *rv = malloc((size_t)d.C * sizeof *rv);
    bn_textbook(k, &d, rm, rv);
    const double rtol = k->dt == DEFT_F64 ? 1e-12 : 1e-5;
    compare(name, "running_mean (fast vs textbook)", fast.rm, rm, d.C, rtol);
    compare(name, "running_var (fast vs textbook)", fast.rv, rv, d.C, rtol);
    free(rm), free(rv);
    bn_out_free(&cpu), bn_out_free(&fast), bn_out_free(&plain);
    bn_data_free(&d);
}

static void test_batch_norm(void) {
    const deft_layout NCHW = DEFT_NCHW, NHWC = DEFT_NHWC;
    const bn_case cases[] = {
        {4, {2, 37, 5, 3}, NCHW, DEFT_F32, -2, 3, 0},        /* C not a multiple of 32 */
        {4, {2, 5, 3, 37}, NHWC, DEFT_F32, -2, 3, 0},
        {4, {64, 37, 1, 1}, NCHW, DEFT_F32, -2, 3, 0},       /* H W = 1: the row walk in NCHW */
        {4, {64, 1, 1, 70}, NHWC, DEFT_F32, -2, 3, 0},
        {4, {1, 8, 33, 33}, NCHW, DEFT_F32, -2, 3, 0},       /* N = 1 */
        {4, {1, 33, 33, 8}, NHWC, DEFT_F32, -2, 3, 0},
        {4, {4, 3, 160, 160}, NCHW, DEFT_F32, 100, 101, 0},  /* many chunks; a variance of 1/12 around 100.5 */
        {4, {4, 160, 160, 3}, NHWC, DEFT_F32, 100, 101, 0},
        {4, {2, 2100, 2, 2}, NCHW, DEFT_F32, -2, 3, 0},      /* many channels */
        {2, {300, 70, 0, 0}, NCHW, DEFT_F32, -2, 3, 0},      /* 2-d: channels innermost */
        {4, {8, 64, 16, 16}, NCHW, DEFT_F32, -2, 3, 1},      /* evaluation */
        {4, {8, 16, 16, 64}, NHWC, DEFT_F32, -2, 3, 1},
        {4, {3, 7, 9, 11}, NCHW, DEFT_F64, -2, 3, 0},
        {4, {3, 9, 11, 7}, NHWC, DEFT_F64, -2, 3, 0},
        {4, {16, 64, 8, 8}, NCHW, DEFT_BF16, -2, 3, 0},      /* halves with f32 statistics */
        {4, {16, 8, 8, 64}, NHWC, DEFT_BF16, -2, 3, 0},
        {4, {5, 37, 6, 6}, NCHW, DEFT_F16, -2, 3, 0},
        {4, {5, 6, 6, 37}, NHWC, DEFT_F16, -2, 3, 1},
        {4, {32, 4, 4, 72}, NHWC, DEFT_F32, -2, 3, 0},       /* vector loads, the last column part empty */
        {4, {32, 4, 4, 70}, NHWC, DEFT_F64, -2, 3, 0},       /* f64 in pairs */
        {4, {128, 8, 8, 36}, NHWC, DEFT_BF16, -2, 3, 0},     /* 36 halves: the scalar path, many rows */
        {4, {128, 8, 8, 64}, NHWC, DEFT_F32, 100, 101, 0},   /* many chunks, a mean far from zero */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) bn_check(&cases[i]);
    /* ResNet-18's batch norms in NHWC at batch 128 (CIFAR): 8192 rows of 64 channels to 128 rows of 512 */
    static const int64_t resnet[4][4] = {{128, 8, 8, 64}, {128, 4, 4, 128}, {128, 2, 2, 256}, {128, 1, 1, 512}};
    static const deft_dtype dts[3] = {DEFT_F32, DEFT_F16, DEFT_BF16};
    for (int d = 0; d < 3; d++) {
        for (int i = 0; i < 4; i++) {
            const bn_case k = {4, {resnet[i][0], resnet[i][1], resnet[i][2], resnet[i][3]}, NHWC, dts[d], -2, 3, 0};
            bn_check(&k);
        }
    }
}

/* ---------------------------------------------------------------- pooling */
typedef struct pool_case {
    int kind;   /* 0: max, 1: avg, 2: adaptive avg */
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;   /* adaptive: kh, kw are the output size */
    int nhwc, ties;   /* ties 0: random; 1: every value equal; 2: three values, -inf among them, and a NaN */
    deft_dtype dt;    /* the GPU's; the CPU runs halves in f32 */
} pool_case;

typedef struct pool_out {
    double *y, *dx;
} pool_out;

static pool_out pool_run(deft_device dev, const pool_case *k, const ref_tensor *x, const ref_tensor *dy) {
    pool_out r = {0};
    const deft_layout layout = k->nhwc ? DEFT_NHWC : DEFT_NCHW;
    const deft_dtype dt = dev.type == DEFT_CPU ? DEFT_F32 : k->dt;
    deft_graph *g = deft_graph_new();
    deft_tensor *xp = param_from(g, "x", x->v, 4, x->shape, dev, dt);
    deft_tensor *dyp = param_from(g, "dy", dy->v, 4, dy->shape, dev, dt);
    CHECK_OK(deft_param_set_requires_grad(dyp, 0));
    const deft_pool2d_options o = {.kernel = {k->kh, k->kw}, .stride = {k->sh, k->sw}, .padding = {k->ph, k->pw},
                                   .layout = layout};
    deft_tensor *y = k->kind == 0   ? deft_max_pool2d(xp, &o)
                     : k->kind == 1 ? deft_avg_pool2d(xp, &o)
                                    : deft_adaptive_avg_pool2d(xp, k->kh, k->kw, layout);
    CHECK_MSG(y != NULL, "pool: %s", deft_errmsg());
    CHECK_OK(deft_backward(deft_sum(deft_mul(y, dyp), 0, NULL, 0)));
    deft_tensor *outs[2] = {y, deft_grad(xp)};
    deft_program *p = y ? deft_compile(g, outs, 2, NULL) : NULL;
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p && deft_program_run(p) == DEFT_OK) {
        r.y = read_out(p, y), r.dx = read_out(p, outs[1]);
    } else {
        CHECK_MSG(0, "pool run failed: %s", deft_errmsg());
    }
    deft_graph_free(g);
    return r;
}

static void pool_check(const pool_case *k) {
    const int64_t oh = k->kind == 2 ? k->kh : (k->h + 2 * k->ph - k->kh) / k->sh + 1;
    const int64_t ow = k->kind == 2 ? k->kw : (k->w + 2 * k->pw - k->kw) / k->sw + 1;
    const int64_t xs[4] = {k->n, k->nhwc ? k->h : k->c, k->nhwc ? k->w : k->h, k->nhwc ? k->c : k->w};
    const int64_t ys[4] = {k->n, k->nhwc ? oh : k->c, k->nhwc ? ow : oh, k->nhwc ? k->c : ow};
    ref_tensor x = ref_random(&rng, k->dt, 4, xs, -1.0, 1.0), dy = ref_random(&rng, k->dt, 4, ys, -1.0, 1.0);
    for (int64_t i = 0; k->ties && i < x.n; i++) {
        const double v = k->ties == 1 ? 0.25 : (double)(ref_next(&rng) % 3) - 1.0;
        ref_set(&x, i, k->ties == 2 && v < 0 ? -INFINITY : v);
    }
    if (k->ties == 2) ref_set(&x, x.n / 2, NAN);
    static const char *const kinds[] = {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"};
    char name[200];
    snprintf(name, sizeof name, "%s %s %s x[%lld,%lld,%lld,%lld] k%lldx%lld s%lld p%lld ties %d", kinds[k->kind],
             dt_names[k->dt], k->nhwc ? "NHWC" : "NCHW", (long long)k->n, (long long)k->c, (long long)k->h,
             (long long)k->w, (long long)k->kh, (long long)k->kw, (long long)k->sh, (long long)k->ph, k->ties);
    pool_out cpu = pool_run(CPU, k, &x, &dy);
    use_reference(0);
    pool_out fast = pool_run(GPU, k, &x, &dy);
    use_reference(1);
    pool_out plain = pool_run(GPU, k, &x, &dy);
    use_reference(0);
    /* max pooling picks values and adds in the CPU's order; halves round the sums the CPU keeps in f32 */
    const double tol = is_half(k->dt) ? ref_tol(k->dt) : k->kind == 0 ? 0.0 : 1e-6;
    compare(name, "y (fast vs cpu)", fast.y, cpu.y, dy.n, k->kind == 0 ? 0.0 : tol);
    compare(name, "dx (fast vs cpu)", fast.dx, cpu.dx, x.n, tol);
    compare(name, "y (fast vs plain)", fast.y, plain.y, dy.n, 0.0);
    compare(name, "dx (fast vs plain)", fast.dx, plain.dx, x.n, 0.0);
    free(cpu.y), free(cpu.dx), free(fast.y), free(fast.dx), free(plain.y), free(plain.dx);
    ref_free(&x), ref_free(&dy);
}

static void test_pool(void) {
    const pool_case cases[] = {
        {0, 4, 64, 16, 16, 3, 3, 2, 2, 1, 1, 0, 0, DEFT_F32},   /* ResNet's max pool */
        {0, 4, 64, 16, 16, 3, 3, 2, 2, 1, 1, 1, 0, DEFT_F32},
        {0, 2, 5, 16, 16, 3, 3, 2, 2, 1, 1, 0, 1, DEFT_F32},    /* all equal: each window's first element */
        {0, 2, 5, 16, 16, 3, 3, 2, 2, 1, 1, 1, 1, DEFT_F32},
        {0, 3, 7, 13, 11, 3, 3, 2, 2, 1, 1, 0, 2, DEFT_F32},    /* -inf, ties and a NaN */
        {0, 3, 7, 13, 11, 3, 3, 2, 2, 1, 1, 1, 2, DEFT_F32},
        {0, 2, 3, 9, 8, 2, 2, 2, 2, 0, 0, 0, 2, DEFT_F32},
        {0, 1, 4, 7, 9, 3, 2, 1, 1, 1, 0, 1, 2, DEFT_F32},      /* stride 1: every input in many windows */
        {1, 2, 6, 11, 9, 3, 3, 1, 1, 1, 1, 0, 0, DEFT_F32},
        {1, 2, 6, 11, 9, 3, 3, 2, 2, 1, 1, 1, 0, DEFT_F32},
        {2, 8, 512, 4, 4, 1, 1, 0, 0, 0, 0, 0, 0, DEFT_F32},    /* ResNet's global average, CIFAR's size */
        {2, 8, 512, 4, 4, 1, 1, 0, 0, 0, 0, 1, 0, DEFT_F32},
        {2, 2, 5, 7, 7, 3, 3, 0, 0, 0, 0, 0, 0, DEFT_F32},      /* uneven windows */
        {2, 2, 5, 3, 3, 4, 5, 0, 0, 0, 0, 1, 0, DEFT_F32},      /* more outputs than inputs */
        {0, 2, 6, 9, 8, 3, 3, 2, 2, 1, 1, 1, 2, DEFT_F32},      /* NHWC, C not a multiple of 4 */
        {0, 2, 12, 9, 8, 3, 3, 2, 2, 1, 1, 1, 2, DEFT_F16},   /* 12 halves: one channel per thread */
        {0, 1, 8, 7, 9, 3, 2, 1, 1, 1, 0, 1, 2, DEFT_BF16},   /* stride 1, 8 halves per thread */
        /* NHWC by tiles of 4 x 4 windows: partial last tiles, k = s, k > 2 s, s > k (inputs in no window) */
        {0, 3, 8, 37, 29, 3, 3, 2, 2, 1, 1, 1, 2, DEFT_F32},
        {0, 2, 16, 13, 11, 2, 2, 2, 2, 0, 0, 1, 0, DEFT_BF16},
        {0, 2, 8, 20, 23, 5, 5, 3, 3, 2, 2, 1, 1, DEFT_F16},
        {0, 2, 8, 10, 11, 2, 2, 3, 3, 0, 0, 1, 2, DEFT_F32},
        {0, 2, 8, 3, 2, 3, 3, 2, 2, 1, 1, 1, 2, DEFT_BF16},    /* one tile smaller than a window */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) pool_check(&cases[i]);
    /* ResNet-18's max pool at batch 128 (CIFAR, NHWC): [128, 16, 16, 64] to [128, 8, 8, 64] */
    static const deft_dtype dts[3] = {DEFT_F32, DEFT_F16, DEFT_BF16};
    for (int d = 0; d < 3; d++) {
        for (int ties = 0; ties < 3; ties++) {
            const pool_case k = {0, 128, 64, 16, 16, 3, 3, 2, 2, 1, 1, 1, ties, dts[d]};
            pool_check(&k);
        }
    }
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    test_batch_norm();
    test_pool();
    return deft_check_finish();
}
