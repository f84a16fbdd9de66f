/* The gathers and selection on a GPU against the CPU: embedding, index_select, where and masked_fill values (exact:
 * they move values), the embedding's gradient bit for bit against the CPU's and across runs (random ids, and one id
 * repeated thousands of times), the other gradients within the dtype's tolerance, an id out of range found by the
 * kernels and reported by the next read (eager and replayed as a CUDA Graph), and a GPT-style tied table under bf16
 * autocast. DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in for the GPU (then a bad id fails the run itself).
 * Skips (exit 77) where no GPU works. */
#include "cuda_compare.h"
#include "deft_testing.h"

static uint64_t rng = 0xe3bedd1ull;
static deft_device gpu;

/* ---------------------------------------------------------------- values against the CPU */
typedef struct gather_case {
    int op;     /* 0 embedding, 1 index_select, 2 where, 3 masked_fill */
    int axis;
} gather_case;

static deft_tensor *build_gather(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const gather_case *c = ctx;
    switch (c->op) {
    case 0: return deft_embedding(x[0], x[1]);
    case 1: return deft_index_select(x[0], c->axis, x[1]);
    case 2: return deft_where(x[0], x[1], x[2]);
    default: return deft_masked_fill(x[0], x[1], -1e4);
    }
}

/* One case built on the CPU and on `gpu` from the same host data; tol 0: the same values exactly. */
static void compare_on(const char *name, int nin, const ref_tensor *ins, build_fn f, const void *ctx, double tol) {
    deft_tensor *tc, *tg;
    deft_graph *gc, *gg;
    deft_status sc, sg;
    void *ref = build_and_realize(deft_cpu(), nin, ins, f, ctx, &tc, &gc, &sc);
    CHECK_MSG(ref != NULL, "%s on the CPU failed: %s: %s", name, deft_status_name(sc), deft_errmsg());
    void *got = build_and_realize(gpu, nin, ins, f, ctx, &tg, &gg, &sg);
    CHECK_MSG(got != NULL, "%s on the GPU failed: %s: %s", name, deft_status_name(sg), deft_errmsg());
    if (ref && got) {
        const deft_dtype dt = deft_tensor_dtype(tc);
        const int64_t n = deft_tensor_numel(tc);
        CHECK_MSG(deft_tensor_dtype(tg) == dt && deft_tensor_numel(tg) == n, "%s: the outputs differ in form", name);
        double *want = to_doubles(ref, dt, n), *have = to_doubles(got, dt, n);
        ref_close_tol(name, have, want, n, tol);
        free(want);
        free(have);
    }
    free(ref);
    free(got);
    deft_graph_free(gc);
    deft_graph_free(gg);
}

/* ids in [0, rows), one in eight the same value (repeats), as an i32 tensor of `shape` */
static ref_tensor random_ids(int ndim, const int64_t *shape, int64_t rows) {
    ref_tensor t = ref_alloc(DEFT_I32, ndim, shape);
    for (int64_t i = 0; i < t.n; i++) ref_set(&t, i, ref_next(&rng) % 8 == 0 ? 1 : (double)(ref_next(&rng) % rows));
    return t;
}

static void test_values(void) {
    static const deft_dtype dts[] = {DEFT_F32, DEFT_F64, DEFT_F16, DEFT_BF16};
    char name[96];
    for (int k = 0; k < 4; k++) {
        ref_tensor in[3];
        /* embedding: ids [4, 37] into [1000, 96], and [5000] into [7, 3] */
        const int64_t t1[2] = {1000, 96}, i1[2] = {4, 37}, t2[2] = {7, 3}, i2[1] = {5000};
        in[0] = ref_random(&rng, dts[k], 2, t1, -3, 3);
        in[1] = random_ids(2, i1, 1000);
        snprintf(name, sizeof name, "embedding %s [1000, 96] by [4, 37]", deft_dtype_name(dts[k]));
        compare_on(name, 2, in, build_gather, &(gather_case){0, 0}, 0.0);
        ref_free(&in[0]), ref_free(&in[1]);
        in[0] = ref_random(&rng, dts[k], 2, t2, -3, 3);
        in[1] = random_ids(1, i2, 7);
        snprintf(name, sizeof name, "embedding %s [7, 3] by [5000]", deft_dtype_name(dts[k]));
        compare_on(name, 2, in, build_gather, &(gather_case){0, 0}, 0.0);
        ref_free(&in[0]), ref_free(&in[1]);
        /* index_select on every axis of [6, 50, 33] */
        const int64_t as[3] = {6, 50, 33}, n1[1] = {77};
        in[0] = ref_random(&rng, dts[k], 3, as, -3, 3);
        for (int axis = 0; axis < 3; axis++) {
            in[1] = random_ids(1, n1, as[axis]);
            snprintf(name, sizeof name, "index_select %s axis %d", deft_dtype_name(dts[k]), axis);
            compare_on(name, 2, in, build_gather, &(gather_case){1, axis}, 0.0);
            ref_free(&in[1]);
        }
        ref_free(&in[0]);
        /* where: an i32 condition [64, 1] against values [1, 300] and [64, 300]; masked_fill with a [300] mask */
        const int64_t cs[2] = {64, 1}, xs[2] = {1, 300}, ys[2] = {64, 300}, ms[1] = {300};
        in[0] = ref_random(&rng, DEFT_I32, 2, cs, -1, 1);
        in[1] = ref_random(&rng, dts[k], 2, xs, -3, 3);
        in[2] = ref_random(&rng, dts[k], 2, ys, -3, 3);
        snprintf(name, sizeof name, "where %s", deft_dtype_name(dts[k]));
        compare_on(name, 3, in, build_gather, &(gather_case){2, 0}, 0.0);
        ref_free(&in[0]), ref_free(&in[1]);
        in[0] = in[2];
        in[1] = ref_random(&rng, dts[k], 1, ms, -1, 1);   /* a float mask: nonzero almost everywhere */
        for (int64_t i = 0; i < 300; i += 3) ref_set(&in[1], i, 0.0);
        snprintf(name, sizeof name, "masked_fill %s", deft_dtype_name(dts[k]));
        compare_on(name, 2, in, build_gather, &(gather_case){3, 0}, 0.0);
        ref_free(&in[0]), ref_free(&in[1]);
    }
}

/* ---------------------------------------------------------------- the embedding's gradient */
typedef struct emb_net {
    deft_graph *g;
    deft_tensor *table, *ids, *loss, *grad;
    deft_program *p;
} emb_net;

/* loss = sum(embedding(table, ids) * w): the table's gradient is w's rows summed per id, in position order */
static int emb_net_build(emb_net *e, deft_device dev, deft_dtype dt, int64_t v, int64_t c, int64_t n,
                         const void *w) {
    e->g = deft_graph_new();
    e->table = deft_param(e->g, "wte", dt, 2, (int64_t[]){v, c}, dev, DEFT_INIT_NORMAL);
    e->ids = deft_input(e->g, "ids", DEFT_I32, 1, &n, dev);
    deft_tensor *wt = deft_constant(e->g, dt, 2, (int64_t[]){n, c}, dev, w, (size_t)(n * c) * deft_dtype_size(dt));
    e->loss = deft_sum(deft_mul(deft_embedding(e->table, e->ids), wt), 0, NULL, 0);
    CHECK_OK(deft_backward(e->loss));
    e->grad = deft_grad(e->table);
    e->p = e->grad ? deft_compile(e->g, &e->grad, 1, NULL) : NULL;
    CHECK_MSG(e->p != NULL, "compile: %s", deft_errmsg());
    return e->p != NULL;
}

static void emb_net_grad(emb_net *e, const int32_t *ids, size_t ids_bytes, void *out, size_t bytes) {
    CHECK_OK(deft_program_feed(e->p, e->ids, ids, ids_bytes));
    CHECK_OK(deft_program_run(e->p));
    CHECK_OK(deft_program_read(e->p, e->grad, out, bytes));
}

static void emb_grad_case(const char *what, deft_dtype dt, int64_t v, int64_t c, int64_t n, const int32_t *ids) {
    const size_t es = deft_dtype_size(dt), gbytes = (size_t)(v * c) * es;
    ref_tensor w = ref_random(&rng, dt, 2, (int64_t[]){n, c}, -1, 1);
    unsigned char *cpu = malloc(gbytes), *g1 = malloc(gbytes), *g2 = malloc(gbytes);
    emb_net ec, eg;
    const int okc = emb_net_build(&ec, deft_cpu(), dt, v, c, n, w.raw);
    const int okg = emb_net_build(&eg, gpu, dt, v, c, n, w.raw);
    if (okc && okg) {
        emb_net_grad(&ec, ids, (size_t)n * sizeof *ids, cpu, gbytes);
        emb_net_grad(&eg, ids, (size_t)n * sizeof *ids, g1, gbytes);
        for (int r = 0; r < 3; r++) {   /* eager, then captured, then replayed */
            emb_net_grad(&eg, ids, (size_t)n * sizeof *ids, g2, gbytes);
            CHECK_MSG(memcmp(g1, g2, gbytes) == 0, "%s %s: run %d of the gradient gave other bits", what,
                      deft_dtype_name(dt), r + 2);
        }
        double worst = 0.0;
        for (int64_t i = 0; i < v * c; i++) worst = fmax(worst, fabs(ref_load(g1, dt, i) - ref_load(cpu, dt, i)));
        /* both sum each row's contributions in position order in the compute type */
        CHECK_MSG(memcmp(g1, cpu, gbytes) == 0, "%s %s: the GPU's gradient differs from the CPU's (at most %g)", what,
                  deft_dtype_name(dt), worst);
    }
    deft_graph_free(ec.g), deft_graph_free(eg.g);
    free(cpu), free(g1), free(g2);
    ref_free(&w);
}

static void test_embedding_grad(void) {
    enum { N = 20000 };
    int32_t *ids = malloc(N * sizeof *ids);
    static const deft_dtype dts[] = {DEFT_F32, DEFT_BF16, DEFT_F64};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N; i++) ids[i] = (int32_t)(ref_next(&rng) % 3000);
        emb_grad_case("random ids", dts[k], 5000, 48, N, ids);   /* rows 3000.. never selected */
        for (int i = 0; i < N; i++) ids[i] = i % 50 == 0 ? (int32_t)(i % 7) : 7;
        emb_grad_case("one id repeated", dts[k], 11, 200, N, ids);
    }
    /* sizes around the sort's tiles: 1, 2, 2047, 2048, 2049 and 4097 positions */
    static const int64_t ns[] = {1, 2, 2047, 2048, 2049, 4097};
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
        for (int64_t i = 0; i < ns[j]; i++) ids[i] = (int32_t)(ref_next(&rng) % 9);
        emb_grad_case("tile sizes", DEFT_F32, 9, 5, ns[j], ids);
    }
    free(ids);
}

/* ---------------------------------------------------------------- other gradients against the CPU */
typedef struct sel_net {
    deft_graph *g;
    deft_tensor *a, *b, *loss, *grads[2];
} sel_net;

/* index_select on axis 1, where on a comparison, masked_fill: their gradients into a and b */
static void sel_build(sel_net *s, deft_device dev, const float *av, const float *bv) {
    s->g = deft_graph_new();
    s->a = deft_param(s->g, "a", DEFT_F32, 3, (int64_t[]){4, 30, 16}, dev, DEFT_INIT_ZEROS);
    s->b = deft_param(s->g, "b", DEFT_F32, 2, (int64_t[]){50, 16}, dev, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(s->a, av, 4 * 30 * 16 * sizeof *av));
    CHECK_OK(deft_param_set(s->b, bv, 50 * 16 * sizeof *bv));
    int32_t idx[50];
    for (int i = 0; i < 50; i++) idx[i] = (i * 7) % 29;   /* entry 29 never selected */
    deft_tensor *ix = deft_constant(s->g, DEFT_I32, 1, (int64_t[]){50}, dev, idx, sizeof idx);
    deft_tensor *sel = deft_index_select(s->a, 1, ix);                            /* [4, 50, 16] */
    deft_tensor *w = deft_where(deft_gt(sel, s->b), deft_tanh(sel), s->b);       /* b broadcast */
    int32_t mask[16];
    for (int i = 0; i < 16; i++) mask[i] = i % 3 == 0;
    deft_tensor *mt = deft_constant(s->g, DEFT_I32, 1, (int64_t[]){16}, dev, mask, sizeof mask);
    deft_tensor *m = deft_masked_fill(w, mt, 2.0);
    s->loss = deft_mean(deft_mul(m, m), 0, NULL, 0);
    CHECK_OK(deft_backward(s->loss));
    s->grads[0] = deft_grad(s->a);
    s->grads[1] = deft_grad(s->b);
}

static void sel_grads(sel_net *s, float *out) {
    deft_program *p = deft_compile(s->g, s->grads, 2, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) return;
    CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_read(p, s->grads[0], out, 4 * 30 * 16 * sizeof *out));
    CHECK_OK(deft_program_read(p, s->grads[1], out + 4 * 30 * 16, 50 * 16 * sizeof *out));
}

static void test_other_grads(void) {
    enum { NA = 4 * 30 * 16, NB = 50 * 16 };
    float *av = malloc(NA * sizeof *av), *bv = malloc(NB * sizeof *bv), *cpu = calloc(NA + NB, sizeof *cpu),
          *got = calloc(NA + NB, sizeof *got);
    for (int i = 0; i < NA; i++) av[i] = (float)ref_unif(&rng, -1, 1);
    for (int i = 0; i < NB; i++) bv[i] = (float)ref_unif(&rng, -1, 1);
    sel_net sc, sg;
    sel_build(&sc, deft_cpu(), av, bv);
    sel_build(&sg, gpu, av, bv);
    sel_grads(&sc, cpu);
    sel_grads(&sg, got);
    double want[NA + NB], have[NA + NB];
    for (int i = 0; i < NA + NB; i++) want[i] = cpu[i], have[i] = got[i];
    ref_close("index_select, where and masked_fill gradients", DEFT_F32, have, want, NA + NB);
    double zero_row = 0.0;   /* a's entry 29 along axis 1 is never selected */
    for (int o = 0; o < 4; o++)
        for (int c = 0; c < 16; c++) zero_row += fabs(got[(o * 30 + 29) * 16 + c]);
    CHECK(zero_row == 0.0);
    deft_graph_free(sc.g), deft_graph_free(sg.g);
    free(av), free(bv), free(cpu), free(got);
}

/* ---------------------------------------------------------------- ids out of range */
/* A training step reading the embedding of ids [300] into a [10, 8] table: a bad id is found without a host wait and
 * reported by the next read, with the CPU's message; the selected rows are NaN; a good batch afterwards reads clean.
 * With `graphs`, the bad batch comes in a replay of the captured step. */
static void test_bad_ids(int graphs) {
    const int on_cpu = gpu.type == DEFT_CPU;
    deft_graph *g = deft_graph_new();
    deft_tensor *table = deft_param(g, "wte", DEFT_F32, 2, (int64_t[]){10, 8}, gpu, DEFT_INIT_NORMAL);
    deft_tensor *ids = deft_input(g, "ids", DEFT_I32, 1, (int64_t[]){300}, gpu);
    deft_tensor *x = deft_embedding(table, ids);
    deft_tensor *loss = deft_mean(deft_mul(x, x), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[3] = {loss, deft_grad(table), x};
    deft_program *p = deft_compile(g, outs, 3, &(deft_compile_options){.no_cuda_graphs = !graphs});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    int32_t v[300];
    float l = 0.0f, *rows = malloc(300 * 8 * sizeof *rows);
    for (int rep = 0; p && rep < 4; rep++) {
        for (int i = 0; i < 300; i++) v[i] = i % 10;
        const int bad = rep == 2;
        if (bad) v[250] = 12, v[201] = -3;
        CHECK_OK(deft_program_feed(p, ids, v, sizeof v));
        if (bad && on_cpu) {
            CHECK_ERR(deft_program_run(p), DEFT_ERR_INVALID,
                      "embedding: token id -3 at position 201 is outside [0, 10)");
            continue;
        }
        CHECK_OK(deft_program_run(p));
        if (bad) {
            CHECK_ERR(deft_program_read(p, loss, &l, sizeof l), DEFT_ERR_INVALID,
                      "embedding: token id -3 at position 201 is outside [0, 10)");
            printf("%s: %s\n", graphs ? "replayed" : "eager", deft_errmsg());
            CHECK(isnan(l));
            /* reported once: the selected rows read NaN, the others are the table's */
            CHECK_OK(deft_program_read(p, x, rows, 300 * 8 * sizeof *rows));
            CHECK(isnan(rows[201 * 8]) && isnan(rows[250 * 8 + 7]) && !isnan(rows[200 * 8]));
        } else {
            CHECK_OK(deft_program_read(p, loss, &l, sizeof l));
            CHECK_MSG(isfinite(l) && l > 0.0f, "loss %g", l);
        }
    }
    if (p && graphs && !on_cpu) CHECK_MSG(deft_program_graph_replays(p) > 0, "the step was never replayed");
    free(rows);
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- tied weights under bf16 autocast */
/* ids -> embedding (f32 table) -> LM head reading the table transposed (bf16 under autocast) -> cross-entropy: the
 * loss and the table's gradient against the CPU's autocast program, and the GPU's gradient the same every run. */
static void tied_run(deft_device dev, const float *tv, const int32_t *ids, const int32_t *tg, float *loss_out,
                     float *grad_out, int runs) {
    enum { V = 97, C = 32, N = 256 };
    deft_graph *g = deft_graph_new();
    deft_tensor *table = deft_param(g, "wte", DEFT_F32, 2, (int64_t[]){V, C}, dev, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(table, tv, V * C * sizeof *tv));
    deft_tensor *ti = deft_input(g, "ids", DEFT_I32, 1, (int64_t[]){N}, dev);
    deft_tensor *tt = deft_input(g, "targets", DEFT_I32, 1, (int64_t[]){N}, dev);
    deft_tensor *x = deft_embedding(table, ti);
    deft_tensor *loss = deft_cross_entropy(deft_matmul_t(deft_tanh(x), table, 0, 1), tt);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[2] = {loss, deft_grad(table)};
    deft_program *p = deft_compile(g, outs, 2, &(deft_compile_options){.autocast = DEFT_BF16});
    CHECK_MSG(p != NULL, "compile under autocast: %s", deft_errmsg());
    float *again = malloc(V * C * sizeof *again);
    for (int r = 0; p && r < runs; r++) {
        CHECK_OK(deft_program_feed(p, ti, ids, N * sizeof *ids));
        CHECK_OK(deft_program_feed(p, tt, tg, N * sizeof *tg));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, loss, loss_out, sizeof *loss_out));
        CHECK_OK(deft_program_read(p, outs[1], r ? again : grad_out, V * C * sizeof *again));
        if (r) CHECK_MSG(memcmp(again, grad_out, V * C * sizeof *again) == 0, "tied: run %d gave other bits", r + 1);
    }
    free(again);
    deft_graph_free(g);
}

static void test_tied_autocast(void) {
    enum { V = 97, C = 32, N = 256 };
    float tv[V * C], lc = NAN, lg = NAN, gc[V * C], gg[V * C];
    int32_t ids[N], tg[N];
    for (int i = 0; i < V * C; i++) tv[i] = (float)ref_unif(&rng, -0.5, 0.5);
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(ref_next(&rng) % V), tg[i] = (int32_t)(ref_next(&rng) % V);
    tied_run(deft_cpu(), tv, ids, tg, &lc, gc, 1);
    tied_run(gpu, tv, ids, tg, &lg, gg, 3);
    CHECK_MSG(fabs(lc - lg) <= 1e-2 * fabs(lc), "tied bf16 loss: cpu %g, gpu %g", lc, lg);
    double want[V * C], have[V * C];
    for (int i = 0; i < V * C; i++) want[i] = gc[i], have[i] = gg[i];
    ref_close("tied bf16 table gradient", DEFT_BF16, have, want, V * C);
}

int main(void) {
    if (!deft_test_gpu(&gpu)) return DEFT_CHECK_SKIP;
    test_values();
    test_embedding_grad();
    test_other_grads();
    test_bad_ids(0);
    test_bad_ids(1);
    test_tied_autocast();
    return deft_check_finish();
}
