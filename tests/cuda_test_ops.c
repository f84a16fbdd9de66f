/* The CUDA backend against the CPU backend: every op is built twice through the public API, once on the CPU and once
 * on cuda:0, from the same host data, and the results are compared with a tolerance by dtype relative to the largest
 * reference magnitude (f32 1e-5, matmul 1e-4; f64 1e-12; f16 2e-3; bf16 1e-2; i32 exact). Inputs are seeded random
 * tensors of awkward sizes (1, 7, 33, 1000, broadcast shapes), with NaN and infinities where an op must pass them
 * on. Skips (exit 77) where no GPU works. */
#include "cuda_compare.h"

static uint64_t rng = 0xc0da0001ull;
static int cases_run = 0, cases_skipped = 0;

/* The whole comparison of one case. The CPU result is the reference: where the CPU refuses a case (an op the
 * builder or the CPU kernel does not support for a dtype), the case is skipped rather than failed. */
static void run_case(const char *name, int nin, const ref_tensor *ins, build_fn f, const void *ctx, double tol) {
    if (compare_case(name, nin, ins, f, ctx, tol, 0)) cases_run++;
    else cases_skipped++;
}

/* Writes NaN, +inf and -inf at a few places of a floating tensor (the ops must pass them on alike). */
static void add_specials(ref_tensor *t) {
    if (t->dt == DEFT_I32 || t->n < 7) return;
    ref_set(t, 1, NAN);
    ref_set(t, t->n / 2, INFINITY);
    ref_set(t, t->n - 2, -INFINITY);
}

/* ---------------------------------------------------------------- binary */
typedef enum { B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_COUNT } bin_kind;
static const char *const bin_names[] = {"add", "sub", "mul", "div", "maximum"};

static deft_tensor *build_binary(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    switch (*(const bin_kind *)ctx) {
    case B_ADD: return deft_add(x[0], x[1]);
    case B_SUB: return deft_sub(x[0], x[1]);
    case B_MUL: return deft_mul(x[0], x[1]);
    case B_DIV: return deft_div(x[0], x[1]);
    default: return deft_maximum(x[0], x[1]);
    }
}

static const ref_bshape bshapes[] = {
    {1, {1}, 1, {1}},
    {1, {7}, 1, {7}},
    {1, {1000}, 1, {1000}},
    {2, {7, 33}, 1, {33}},
    {3, {7, 1, 33}, 2, {5, 1}},
    {1, {1}, 2, {33, 7}},
    {2, {33, 7}, 2, {33, 1}},
    {4, {2, 3, 1, 5}, 3, {3, 4, 1}},
    {2, {1000, 1}, 2, {1, 33}},
};

static void test_binary(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    for (size_t si = 0; si < sizeof bshapes / sizeof bshapes[0]; si++)
        for (int di = 0; di < 5; di++)
            for (bin_kind k = 0; k < B_COUNT; k++) {
                const deft_dtype dt = dts[di];
                if (k == B_DIV && dt == DEFT_I32) continue;   /* not an op deft has */
                /* i32 spans enough to overflow in mul: both backends must wrap alike. */
                ref_tensor in[2];
                const double lo0 = dt == DEFT_I32 ? -70000 : -3, lo1 = dt == DEFT_I32 ? -70000 : 0.5;
                const double hi = dt == DEFT_I32 ? 70000 : 3;
                in[0] = ref_random(&rng, dt, bshapes[si].na, bshapes[si].a, lo0, hi);
                in[1] = ref_random(&rng, dt, bshapes[si].nb, bshapes[si].b, lo1, hi);
                if (k == B_MAX) add_specials(&in[0]);
                char name[96];
                snprintf(name, sizeof name, "%s %s shapes#%zu", bin_names[k], dt_names[dt], si);
                run_case(name, 2, in, build_binary, &k, -1);
                ref_free(&in[0]);
                ref_free(&in[1]);
            }
}

/* Many elements: the grid-stride loops wrap around (more than 65535 blocks of 256 threads' worth). */
static void test_large(void) {
    const int64_t shape[1] = {17000003};
    ref_tensor in[2];
    in[0] = ref_random(&rng, DEFT_F32, 1, shape, -1, 1);
    in[1] = ref_random(&rng, DEFT_F32, 1, shape, -1, 1);
    bin_kind k = B_MUL;
    run_case("mul f32 17000003 elements", 2, in, build_binary, &k, -1);
    ref_free(&in[0]);
    ref_free(&in[1]);
}

/* ---------------------------------------------------------------- scalar */
typedef enum { S_ADD, S_SUB, S_RSUB, S_MUL, S_DIV, S_RDIV, S_MAX, S_POW } scalar_kind;
static const char *const scalar_names[] = {"add_s", "sub_s",  "rsub_s",    "mul_s",
                                           "div_s", "rdiv_s", "maximum_s", "pow_s"};

typedef struct scalar_case {
    scalar_kind k;
    double s;
} scalar_case;

static deft_tensor *build_scalar(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const scalar_case *c = ctx;
    switch (c->k) {
    case S_ADD: return deft_add_scalar(x[0], c->s);
    case S_SUB: return deft_sub_scalar(x[0], c->s);
    case S_RSUB: return deft_rsub_scalar(x[0], c->s);
    case S_MUL: return deft_mul_scalar(x[0], c->s);
    case S_DIV: return deft_div_scalar(x[0], c->s);
    case S_RDIV: return deft_rdiv_scalar(x[0], c->s);
    case S_MAX: return deft_maximum_scalar(x[0], c->s);
    default: return deft_pow_scalar(x[0], c->s);
    }
}

static void test_scalar(void) {
    static const scalar_case fcases[] = {{S_ADD, 1.7},  {S_SUB, 0.3},  {S_RSUB, 2.5}, {S_MUL, -3.25},
                                         {S_DIV, 0.7},  {S_RDIV, 1.3}, {S_MAX, 0.1},  {S_POW, 2.0},
                                         {S_POW, 0.5},  {S_POW, 3.0},  {S_POW, -1.5}};
    static const scalar_case icases[] = {{S_ADD, 3},   {S_ADD, 1.7},  {S_SUB, 4},     {S_RSUB, 5}, {S_MUL, -3},
                                         {S_MUL, 2.5}, {S_MUL, 70001}, {S_MAX, 10},   {S_MAX, 2.5}};
    static const int64_t shapes[][2] = {{1, 1}, {7, 1}, {33, 7}, {1000, 3}};
    for (int si = 0; si < 4; si++)
        for (int dt = 0; dt < 5; dt++) {
            const scalar_case *cs = dt == DEFT_I32 ? icases : fcases;
            const size_t nc = dt == DEFT_I32 ? sizeof icases / sizeof icases[0] : sizeof fcases / sizeof fcases[0];
            for (size_t c = 0; c < nc; c++) {
                /* Division and fractional powers read positive inputs away from 0. */
                const int positive = cs[c].k == S_RDIV || cs[c].k == S_POW;
                const double lo = dt == DEFT_I32 ? -100000 : positive ? 0.2 : -4, hi = dt == DEFT_I32 ? 100000 : 4;
                ref_tensor in = ref_random(&rng, (deft_dtype)dt, 2, shapes[si], lo, hi);
                if (cs[c].k == S_MAX) add_specials(&in);
                char name[96];
                snprintf(name, sizeof name, "%s(%g) %s [%lld,%lld]", scalar_names[cs[c].k], cs[c].s, dt_names[dt],
                         (long long)shapes[si][0], (long long)shapes[si][1]);
                run_case(name, 1, &in, build_scalar, &cs[c], -1);
                ref_free(&in);
            }
        }
}

/* ---------------------------------------------------------------- unary */
typedef enum { U_NEG, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_TANH, U_SIGMOID, U_RELU, U_GELU, U_SILU, U_COUNT } unary_kind;
static const char *const unary_names[] = {"neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu",
                                          "silu"};

static deft_tensor *build_unary(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    static deft_tensor *(*const fns[])(deft_tensor *) = {deft_neg,  deft_exp,     deft_log,  deft_sqrt, deft_rsqrt,
                                                         deft_tanh, deft_sigmoid, deft_relu, deft_gelu, deft_silu};
    return fns[*(const unary_kind *)ctx](x[0]);
}

static void test_unary(void) {
    static const int64_t sizes[] = {1, 7, 33, 1000};
    for (int si = 0; si < 4; si++)
        for (int dt = 0; dt < 5; dt++)
            for (unary_kind k = 0; k < U_COUNT; k++) {
                if (dt == DEFT_I32 && k != U_NEG && k != U_RELU) continue;   /* float-only ops */
                const int positive = k == U_LOG || k == U_SQRT || k == U_RSQRT;
                double lo = positive ? 0.05 : k == U_EXP ? -10 : -12, hi = positive ? 5 : k == U_EXP ? 10 : 12;
                if (dt == DEFT_I32) lo = -100000, hi = 100000;
                ref_tensor in = ref_random(&rng, (deft_dtype)dt, 1, &sizes[si], lo, hi);
                if (k == U_RELU || k == U_NEG || k == U_TANH || k == U_SIGMOID) add_specials(&in);
                char name[96];
                snprintf(name, sizeof name, "%s %s [%lld]", unary_names[k], dt_names[dt], (long long)sizes[si]);
                run_case(name, 1, &in, build_unary, &k, -1);
                ref_free(&in);
            }
}

/* ---------------------------------------------------------------- cast */
static deft_tensor *build_cast(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    return deft_cast(x[0], *(const deft_dtype *)ctx);
}

static void test_cast(void) {
    const int64_t shape[2] = {33, 7};
    for (int from = 0; from < 5; from++)
        for (int to = 0; to < 5; to++) {
            if (from == to) continue;
            ref_tensor in = ref_random(&rng, (deft_dtype)from, 2, shape, -300, 300);
            if (from != DEFT_I32) {
                /* Specials, saturation past the i32 range, and truncation toward zero. */
                add_specials(&in);
                ref_set(&in, 3, 3e9);
                ref_set(&in, 4, -2.5);
                ref_set(&in, 5, 2.5);
                ref_set(&in, 6, -3e9);
            }
            deft_dtype target = (deft_dtype)to;
            char name[64];
            snprintf(name, sizeof name, "cast %s -> %s", dt_names[from], dt_names[to]);
            run_case(name, 1, &in, build_cast, &target, -1);
            ref_free(&in);
        }
}

/* ---------------------------------------------------------------- matmul */
typedef struct mm_case {
    int na;
    int64_t a[4];
    int nb;
    int64_t b[4];
    int ta, tb;
} mm_case;

static deft_tensor *build_matmul(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const mm_case *c = ctx;
    return deft_matmul_t(x[0], x[1], c->ta, c->tb);
}

static void test_matmul(void) {
    static const mm_case cases[] = {
        {2, {7, 33}, 2, {33, 5}, 0, 0},
        {2, {1, 1}, 2, {1, 1}, 0, 0},
        {2, {33, 7}, 2, {33, 5}, 1, 0},
        {2, {7, 33}, 2, {5, 33}, 0, 1},
        {2, {33, 7}, 2, {5, 33}, 1, 1},
        {3, {3, 7, 33}, 2, {33, 5}, 0, 0},            /* b shared: folds into one product */
        {3, {3, 7, 33}, 3, {3, 33, 5}, 0, 0},         /* strided batched */
        {4, {2, 1, 7, 9}, 4, {1, 4, 9, 6}, 0, 0},     /* general broadcast: one product per batch */
        {2, {7, 9}, 3, {4, 9, 6}, 0, 0},              /* a shared */
        {3, {3, 33, 7}, 2, {5, 33}, 1, 1},            /* transposed a, shared b: strided, not folded */
        {4, {4, 1, 7, 9}, 2, {9, 6}, 0, 0},
        {2, {1000, 33}, 2, {33, 7}, 0, 0},
        {2, {7, 1000}, 2, {1000, 9}, 0, 0},           /* long K */
        {4, {2, 3, 64, 128}, 4, {2, 3, 96, 128}, 0, 1},
    };
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int di = 0; di < 4; di++) {
            const mm_case *c = &cases[ci];
            ref_tensor in[2];
            in[0] = ref_random(&rng, dts[di], c->na, c->a, -1, 1);
            in[1] = ref_random(&rng, dts[di], c->nb, c->b, -1, 1);
            char name[96];
            snprintf(name, sizeof name, "matmul %s case#%zu (ta %d, tb %d)", dt_names[dts[di]], ci, c->ta, c->tb);
            run_case(name, 2, in, build_matmul, c, dts[di] == DEFT_F32 ? 1e-4 : -1);
            ref_free(&in[0]);
            ref_free(&in[1]);
        }
}

/* ---------------------------------------------------------------- permute, slice, concat */
typedef struct perm_case {
    int ndim;
    int64_t shape[4];
    int perm[4];
} perm_case;

static deft_tensor *build_permute(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    return deft_permute(x[0], ((const perm_case *)ctx)->perm);
}

typedef struct slice_case {
    int ndim;
    int64_t shape[3];
    int axis;
    int64_t start, end, step;
} slice_case;

static deft_tensor *build_slice(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const slice_case *c = ctx;
    /* The +0 keeps a view slice (not a kernel) from being the realized node itself. */
    return deft_add_scalar(deft_slice(x[0], c->axis, c->start, c->end, c->step), 0.0);
}

typedef struct concat_case {
    int n, ndim, axis;
    int64_t shapes[3][3];
} concat_case;

static deft_tensor *build_concat(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const concat_case *c = ctx;
    return deft_concat(x, c->n, c->axis);
}

static void test_shape_ops(void) {
    static const perm_case perms[] = {
        {4, {2, 3, 4, 5}, {3, 1, 0, 2}},
        {2, {7, 33}, {1, 0}},
        {4, {1, 7, 1, 33}, {3, 2, 1, 0}},
        {3, {33, 7, 5}, {0, 2, 1}},
    };
    static const slice_case slices[] = {
        {2, {7, 33}, 1, 1, 30, 3}, {2, {7, 33}, 0, 2, 7, 2}, {3, {5, 6, 7}, 2, -3, 7, 1},
        {1, {33}, 0, 3, 20, 1},    {2, {1, 40}, 1, 5, 39, 1}, {3, {4, 5, 6}, 1, 1, 5, 2},
    };
    static const concat_case concats[] = {
        {3, 2, 1, {{7, 5}, {7, 1}, {7, 33}}},
        {3, 2, 0, {{2, 7}, {3, 7}, {1, 7}}},
        {2, 3, -2, {{2, 3, 4}, {2, 1, 4}}},
        {2, 1, 0, {{1000}, {33}}},
    };
    for (int dt = 0; dt < 5; dt++) {
        char name[96];
        for (size_t i = 0; i < sizeof perms / sizeof perms[0]; i++) {
            ref_tensor in = ref_random(&rng, (deft_dtype)dt, perms[i].ndim, perms[i].shape, -100, 100);
            snprintf(name, sizeof name, "permute %s case#%zu", dt_names[dt], i);
            run_case(name, 1, &in, build_permute, &perms[i], -1);
            ref_free(&in);
        }
        for (size_t i = 0; i < sizeof slices / sizeof slices[0]; i++) {
            ref_tensor in = ref_random(&rng, (deft_dtype)dt, slices[i].ndim, slices[i].shape, -100, 100);
            snprintf(name, sizeof name, "slice %s case#%zu", dt_names[dt], i);
            run_case(name, 1, &in, build_slice, &slices[i], -1);
            ref_free(&in);
        }
        for (size_t i = 0; i < sizeof concats / sizeof concats[0]; i++) {
            ref_tensor in[3];
            for (int k = 0; k < concats[i].n; k++)
                in[k] = ref_random(&rng, (deft_dtype)dt, concats[i].ndim, concats[i].shapes[k], -100, 100);
            snprintf(name, sizeof name, "concat %s case#%zu", dt_names[dt], i);
            run_case(name, concats[i].n, in, build_concat, &concats[i], -1);
            for (int k = 0; k < concats[i].n; k++) ref_free(&in[k]);
        }
    }
}

/* ---------------------------------------------------------------- reductions and softmax */
typedef enum { R_SUM, R_MEAN, R_MAX } reduce_kind;
static const char *const reduce_names[] = {"sum", "mean", "max"};

typedef struct reduce_case {
    reduce_kind k;
    int naxes, axes[3], keepdim;
} reduce_case;

static deft_tensor *build_reduce(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const reduce_case *c = ctx;
    switch (c->k) {
    case R_SUM: return deft_sum(x[0], c->naxes, c->axes, c->keepdim);
    case R_MEAN: return deft_mean(x[0], c->naxes, c->axes, c->keepdim);
    default: return deft_max(x[0], c->naxes, c->axes, c->keepdim);
    }
}

typedef struct rshape {
    int ndim;
    int64_t shape[3];
    int naxes, axes[3];
} rshape;

static void test_reduce(void) {
    static const rshape shapes[] = {
        {3, {7, 33, 5}, 1, {1}}, {3, {7, 33, 5}, 2, {0, 2}}, {3, {7, 33, 5}, 1, {-1}}, {3, {7, 33, 5}, 1, {0}},
        {3, {7, 33, 5}, 0, {0}}, {1, {1000}, 0, {0}},        {2, {33, 1000}, 1, {1}},  {2, {1000, 33}, 1, {0}},
        {2, {5000, 3}, 1, {0}},  {2, {3, 5000}, 1, {1}},     {1, {1}, 0, {0}},         {2, {20000, 2}, 1, {1}},
        /* over the rows of a wide matrix (a bias gradient): the column-tile kernel, partial last tile included */
        {2, {130, 257}, 1, {0}}, {3, {64, 3, 70}, 1, {0}},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int dt = 0; dt < 5; dt++)
            for (int k = 0; k < 3; k++)
                for (int keep = 0; keep < 2; keep++) {
                    if (k == R_MEAN && dt == DEFT_I32) continue;   /* mean is floating only */
                    const rshape *rs = &shapes[si];
                    /* i32 sums of large values overflow: both backends wrap alike. */
                    const double lim = dt == DEFT_I32 ? 1073741823.0 : 2;
                    ref_tensor in = ref_random(&rng, (deft_dtype)dt, rs->ndim, rs->shape, -lim, lim);
                    if (k == R_MAX && si % 3 == 0) add_specials(&in);
                    reduce_case c = {(reduce_kind)k, rs->naxes, {rs->axes[0], rs->axes[1], rs->axes[2]}, keep};
                    char name[96];
                    snprintf(name, sizeof name, "%s %s shape#%zu keepdim %d", reduce_names[k], dt_names[dt], si,
                             keep);
                    run_case(name, 1, &in, build_reduce, &c, -1);
                    ref_free(&in);
                }
}

typedef struct softmax_case {
    int ndim;
    int64_t shape[3];
    int axis;
    double scale;   /* logits span [-scale, scale] */
} softmax_case;

static int softmax_log;

static deft_tensor *build_softmax(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const softmax_case *c = ctx;
    return softmax_log ? deft_log_softmax(x[0], c->axis) : deft_softmax(x[0], c->axis);
}

static void test_softmax(void) {
    static const softmax_case cases[] = {
        {2, {7, 33}, -1, 3},     {2, {7, 33}, 0, 3},   {2, {3, 1000}, 1, 1000}, {2, {5, 1}, 1, 3},
        {3, {4, 50, 40}, 1, 10}, {3, {2, 40, 3}, 1, 10}, {1, {1000}, 0, 50},   {2, {1, 70}, 1, 5},
    };
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    for (softmax_log = 0; softmax_log < 2; softmax_log++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (int di = 0; di < 4; di++) {
                const softmax_case *c = &cases[ci];
                ref_tensor in = ref_random(&rng, dts[di], c->ndim, c->shape, -c->scale, c->scale);
                char name[96];
                snprintf(name, sizeof name, "%s %s case#%zu", softmax_log ? "log_softmax" : "softmax",
                         dt_names[dts[di]], ci);
                run_case(name, 1, &in, build_softmax, c, -1);
                ref_free(&in);
            }
}

/* ---------------------------------------------------------------- creation */
typedef enum { C_FULL, C_ARANGE, C_UNIFORM, C_NORMAL } create_kind;

typedef struct create_case {
    create_kind k;
    deft_dtype dt;
    int ndim;
    int64_t shape[2];
    double a, b, c;
    uint64_t seed;
} create_case;

static deft_tensor *build_create(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)x;
    const create_case *c = ctx;
    switch (c->k) {
    case C_FULL: return deft_full(g, c->dt, c->ndim, c->shape, dev, c->a);
    case C_ARANGE: return deft_arange(g, c->dt, c->a, c->b, c->c, dev);
    case C_UNIFORM: return deft_uniform(g, c->dt, c->ndim, c->shape, dev, c->a, c->b, c->seed);
    default: return deft_normal(g, c->dt, c->ndim, c->shape, dev, c->a, c->b, c->seed);
    }
}

static void test_create(void) {
    for (int dt = 0; dt < 5; dt++) {
        const create_case cases[] = {
            {C_FULL, (deft_dtype)dt, 2, {33, 7}, 3.7, 0, 0, 0},
            {C_FULL, (deft_dtype)dt, 1, {1}, -2.5, 0, 0, 0},
            {C_ARANGE, (deft_dtype)dt, 0, {0}, 0, 10, 0.5, 0},
            {C_ARANGE, (deft_dtype)dt, 0, {0}, -3, 1000, 7, 0},
            {C_ARANGE, (deft_dtype)dt, 0, {0}, 0, 1, 0.001, 0},
            {C_UNIFORM, (deft_dtype)dt, 1, {1000}, -2, 3, 0, 42},
            {C_UNIFORM, (deft_dtype)dt, 2, {33, 7}, 0, 1, 0, 7},
            {C_NORMAL, (deft_dtype)dt, 1, {1000}, 1, 2, 0, 42},
            {C_NORMAL, (deft_dtype)dt, 2, {33, 7}, 0, 1, 0, 99},
        };
        static const char *const names[] = {"full", "arange", "uniform", "normal"};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if (dt == DEFT_I32 && (cases[i].k == C_UNIFORM || cases[i].k == C_NORMAL)) continue;
            char name[96];
            snprintf(name, sizeof name, "%s %s case#%zu", names[cases[i].k], dt_names[dt], i);
            /* Same seed, same values on every device: up to the last bit of the double, hence float rounding. */
            run_case(name, 0, NULL, build_create, &cases[i], -1);
        }
    }
}

/* ---------------------------------------------------------------- whole programs */
/* A small network compiled once per device, fed twice with different data through compile/feed/run/read, and a
 * graph that moves data cpu -> cuda -> cpu with deft_to. */
static void run_program(deft_device dev, const ref_tensor *x1, const ref_tensor *x2, const ref_tensor *w,
                        const ref_tensor *b, float *out_y, float *out_s) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, x1->ndim, x1->shape, dev);
    deft_tensor *wt = deft_constant(g, DEFT_F32, w->ndim, w->shape, dev, w->raw, (size_t)w->n * 4);
    deft_tensor *bt = deft_constant(g, DEFT_F32, b->ndim, b->shape, dev, b->raw, (size_t)b->n * 4);
    deft_tensor *h = deft_gelu(deft_add(deft_matmul(x, wt), bt));
    deft_tensor *y = deft_log_softmax(h, -1);
    deft_tensor *s = deft_sum(deft_mul(h, h), 0, NULL, 0);
    deft_tensor *outs[2] = {y, s};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK_MSG(p != NULL, "compile on %s failed: %s", dev.type == DEFT_CPU ? "cpu" : "cuda", deft_errmsg());
    if (p) {
        const size_t ybytes = deft_tensor_nbytes(y);
        const ref_tensor *feeds[2] = {x1, x2};
        for (int run = 0; run < 2; run++) {
            CHECK_OK(deft_program_feed(p, x, feeds[run]->raw, (size_t)feeds[run]->n * 4));
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, y, out_y + run * (ybytes / 4), ybytes));
            CHECK_OK(deft_program_read(p, s, out_s + run, sizeof(float)));
        }
    }
    deft_graph_free(g);
}

static void test_program(void) {
    const int64_t xs[2] = {33, 64}, ws[2] = {64, 10}, bs[1] = {10};
    ref_tensor x1 = ref_random(&rng, DEFT_F32, 2, xs, -1, 1), x2 = ref_random(&rng, DEFT_F32, 2, xs, -1, 1);
    ref_tensor w = ref_random(&rng, DEFT_F32, 2, ws, -0.5, 0.5), b = ref_random(&rng, DEFT_F32, 1, bs, -0.5, 0.5);
    float yc[2 * 330], yg[2 * 330], sc[2], sg[2];
    run_program(deft_cpu(), &x1, &x2, &w, &b, yc, sc);
    run_program(deft_cuda(0), &x1, &x2, &w, &b, yg, sg);
    double want[660], have[660];
    for (int i = 0; i < 660; i++) want[i] = yc[i], have[i] = yg[i];
    ref_close_tol("program log_softmax output, two runs", have, want, 660, 1e-4);
    CHECK(yc[0] != yc[330]);   /* the second feed changed the result */
    for (int r = 0; r < 2; r++) CHECK_NEAR(sg[r], sc[r], 1e-4 * fabs(sc[r]));
    ref_free(&x1);
    ref_free(&x2);
    ref_free(&w);
    ref_free(&b);
}

static void test_moves(void) {
    const int64_t shape[2] = {33, 7};
    ref_tensor in = ref_random(&rng, DEFT_F32, 2, shape, -2, 2);
    float want[231], have[231];
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_constant(g, DEFT_F32, 2, shape, deft_cpu(), in.raw, sizeof want);
    deft_tensor *on_cpu = deft_exp(x);
    /* cpu -> cuda:0, exp there, cast to bf16 there, back to the cpu as f32 (the move goes first, as bf16). */
    deft_tensor *on_gpu = deft_exp(deft_to(x, deft_cuda(0), DEFT_F32));
    deft_tensor *back = deft_to(deft_to(on_gpu, deft_cuda(0), DEFT_BF16), deft_cpu(), DEFT_F32);
    CHECK_OK(deft_realize(on_cpu, want, sizeof want));
    CHECK_OK(deft_realize(back, have, sizeof have));
    double w[231], h[231];
    for (int i = 0; i < 231; i++) w[i] = deft_bf16_to_f32(deft_f32_to_bf16(want[i])), h[i] = have[i];
    /* exp may differ in the last float bit between the devices, which can flip one bf16 rounding. */
    ref_close_tol("cpu -> cuda -> cpu through bf16", h, w, 231, 1e-2);
    deft_graph_free(g);
    ref_free(&in);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    test_binary();
    test_large();
    test_scalar();
    test_unary();
    test_cast();
    test_matmul();
    test_shape_ops();
    test_reduce();
    test_softmax();
    test_create();
    test_program();
    test_moves();
    printf("%d cases compared, %d skipped (the CPU refused them)\n", cases_run, cases_skipped);
    return deft_check_finish();
}
