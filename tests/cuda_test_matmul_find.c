/* The compile option matmul_find (ops/cuda/cuda_matmul_lt.cu, cuda_matmul_lt_find.cu): cuBLASLt's candidate
 * algorithms timed once per product shape and the fastest kept. Each case runs the same program compiled with
 * matmul_find = 1 and = 0, and on the CPU (the reference); the GPU results must equal the CPU's, and each other,
 * within the dtype's tolerance (timed algorithms may sum in another order, so not bit for bit):
 *   - plain products in f32, f16 and bf16: all four transposes, a batch folded into the rows, strided batches and a
 *     broadcast operand;
 *   - a linear layer on [B, T, C] trained one step, run three times (eager, then captured into a CUDA Graph and
 *     replayed): the product with its bias epilogue, the weight gradient with its bias-gradient epilogue (f32), the
 *     input gradient (a transposed b); f32 and bf16 autocast;
 *   - the weight gradient of a convolution run as products in chunks (conv_gemm), whose later chunks accumulate into
 *     the first's output (beta 1): such a problem must keep the heuristic's first, never be timed;
 *   - a pointer-array batch of products (deft_testing_matmul_batch), whose pointer table is staged for the timing;
 *   - a product whose output is its own operand a: kept untimed, and not timed afterwards either.
 * The library's counts of timed and kept problems (deft_testing_matmul_find_counts) show that timing happened with
 * the option, and never without it. Skips (exit 77) where no GPU works. */
#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdlib.h>

#include "cuda_compare.h"

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>

static uint64_t rng = 0xf1dca11ull;
static int64_t timed_total;   /* problems timed by the cases with matmul_find, all together */

static void counts(int64_t *timed, int64_t *kept) { deft_testing_matmul_find_counts(timed, kept); }

static double tol_of(deft_dtype dt) {
    return dt == DEFT_F32 ? 1e-5 : dt == DEFT_F16 ? 4e-3 : 2e-2;
}

static int cuda_ok(cudaError_t e, const char *what) {
    CHECK_MSG(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* The CPU computes in f32: its halves are cast up for the op and the result cast back, as a GPU stores it. */
static deft_tensor *up(deft_device dev, deft_tensor *t) {
    return dev.type == DEFT_CPU && deft_tensor_dtype(t) != DEFT_F32 ? deft_to(t, dev, DEFT_F32) : t;
}

static deft_tensor *down(deft_device dev, deft_tensor *t, deft_dtype dt) {
    return t && dev.type == DEFT_CPU && dt != DEFT_F32 ? deft_to(t, dev, dt) : t;
}

/* One case three ways: the CPU's result, and cuda:0's with matmul_find off and on; each GPU result against the CPU's
 * and against the other. The find = 0 program must not change the library's counts; *timed and *kept get what the
 * find = 1 program added to them. */
static void three_ways(const char *name, int nin, const ref_tensor *ins, build_fn f, const void *ctx, double tol,
                       int64_t *timed, int64_t *kept) {
    deft_tensor *t[3];
    deft_graph *g[3] = {NULL, NULL, NULL};
    deft_status st[3];
    const deft_compile_options off = {.matmul_find = 0}, on = {.matmul_find = 1};
    int64_t t0, k0, t1, k1, t2, k2;
    void *cpu = build_and_realize(deft_cpu(), nin, ins, f, ctx, &t[0], &g[0], &st[0]);
    counts(&t0, &k0);
    void *plain = build_and_realize_with(deft_cuda(0), nin, ins, f, ctx, &off, &t[1], &g[1], &st[1]);
    counts(&t1, &k1);
    void *found = build_and_realize_with(deft_cuda(0), nin, ins, f, ctx, &on, &t[2], &g[2], &st[2]);
    counts(&t2, &k2);
    const char *ways[3] = {"cpu", "cuda", "cuda matmul_find"};
    void *got[3] = {cpu, plain, found};
    for (int i = 0; i < 3; i++)
        CHECK_MSG(got[i] != NULL, "%s (%s): %s: %s", name, ways[i], deft_status_name(st[i]), deft_errmsg());
    CHECK_MSG(t1 == t0 && k1 == k0, "%s: without matmul_find %lld problems were timed and %lld kept", name,
              (long long)(t1 - t0), (long long)(k1 - k0));
    *timed = t2 - t1;
    *kept = k2 - k1;
    if (cpu && plain && found) {
        const deft_dtype dt = deft_tensor_dtype(t[0]);
        const int64_t n = deft_tensor_numel(t[0]);
        double *want = to_doubles(cpu, dt, n), *p = to_doubles(plain, dt, n), *q = to_doubles(found, dt, n);
        char what[200];
        snprintf(what, sizeof what, "%s: heuristic against cpu", name);
        ref_close_tol(what, p, want, n, tol);
        snprintf(what, sizeof what, "%s: timed against cpu", name);
        ref_close_tol(what, q, want, n, tol);
        snprintf(what, sizeof what, "%s: timed against heuristic", name);
        ref_close_tol(what, q, p, n, tol);
        free(want);
        free(p);
        free(q);
    }
    for (int i = 0; i < 3; i++) {
        free(got[i]);
        deft_graph_free(g[i]);
    }
}

/* ---- plain products ---- */
typedef struct prod_case {
    int na, nb;
    int64_t as[3], bs[3];   /* as stored: a transposed is [.., K, M] */
    int ta, tb;
} prod_case;

static deft_tensor *build_product(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g;
    const prod_case *c = ctx;
    const deft_dtype dt = deft_tensor_dtype(x[0]);
    return down(dev, deft_matmul_t(up(dev, x[0]), up(dev, x[1]), c->ta, c->tb), dt);
}

static void test_products(void) {
    static const prod_case cases[] = {
        {2, 2, {96, 72}, {72, 80}, 0, 0},          {2, 2, {72, 96}, {72, 80}, 1, 0},
        {2, 2, {96, 72}, {80, 72}, 0, 1},          {2, 2, {72, 96}, {80, 72}, 1, 1},
        {2, 2, {257, 130}, {130, 191}, 0, 0},      /* odd sizes: narrower alignments */
        {3, 2, {3, 64, 48}, {48, 112}, 0, 0},      /* a's rows stacked: one product of 192 rows */
        {3, 3, {3, 64, 48}, {3, 48, 112}, 0, 0},   /* strided batch */
        {3, 3, {3, 48, 64}, {3, 112, 48}, 1, 1},   /* strided batch, both transposed */
        {2, 3, {64, 48}, {3, 48, 112}, 0, 0},      /* a read for every matrix of b */
    };
    static const deft_dtype dts[] = {DEFT_F32, DEFT_F16, DEFT_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 3; d++) {
            const prod_case *c = &cases[i];
            ref_tensor in[2] = {ref_random(&rng, dts[d], c->na, c->as, -1, 1),
                                ref_random(&rng, dts[d], c->nb, c->bs, -1, 1)};
            char name[120];
            snprintf(name, sizeof name, "product #%zu %s ta=%d tb=%d", i, dt_names[dts[d]], c->ta, c->tb);
            int64_t timed = 0, kept = 0;
            three_ways(name, 2, in, build_product, c, tol_of(dts[d]), &timed, &kept);
            CHECK_MSG(kept == 0, "%s: %lld problems kept untimed, though the product writes its output whole",
                      name, (long long)kept);
            timed_total += timed;
            ref_free(&in[0]);
            ref_free(&in[1]);
        }
}

/* ---- a linear layer trained one step ---- */
#define LIN_B 4
#define LIN_T 48
#define LIN_C 96
#define LIN_N 160

typedef struct linear {
    deft_graph *g;
    deft_tensor *x, *w, *b, *outs[4];   /* outs: y, and the gradients of w, b and x */
    deft_program *p;
} linear;

/* y = x w + b and loss = sum(y * dy) for a fixed dy (so dy is y's gradient), x a parameter so that it has one. */
static int linear_build(linear *l, deft_device dev, deft_dtype autocast, int find, const ref_tensor *data) {
    memset(l, 0, sizeof *l);
    l->g = deft_graph_new();
    l->x = deft_param(l->g, "x", DEFT_F32, 3, (int64_t[]){LIN_B, LIN_T, LIN_C}, dev, DEFT_INIT_ZEROS);
    deft_tensor *y = deft_linear(l->x, LIN_N, "fc", NULL);
    deft_tensor *dy = deft_constant(l->g, DEFT_F32, 3, data[3].shape, dev, data[3].raw,
                                    (size_t)data[3].n * sizeof(float));
    CHECK_OK(deft_backward(deft_sum(deft_mul(y, dy), 0, NULL, 0)));
    l->w = deft_graph_find(l->g, "fc.weight");
    l->b = deft_graph_find(l->g, "fc.bias");
    deft_tensor *outs[4] = {y, deft_grad(l->w), deft_grad(l->b), deft_grad(l->x)};
    memcpy(l->outs, outs, sizeof outs);
    l->p = deft_compile(l->g, l->outs, 4, &(deft_compile_options){.autocast = autocast, .matmul_find = find});
    CHECK_MSG(l->p != NULL, "linear compile: %s", deft_errmsg());
    if (!l->p) return 0;
    deft_tensor *params[3] = {l->x, l->w, l->b};
    for (int i = 0; i < 3; i++) CHECK_OK(deft_param_set(params[i], data[i].raw, (size_t)data[i].n * sizeof(float)));
    for (int run = 0; run < 3; run++) CHECK_OK(deft_program_run(l->p));
    return 1;
}

static double *linear_read(const linear *l, int i) {
    const int64_t n = deft_tensor_numel(l->outs[i]);
    float *raw = calloc((size_t)n + 1, sizeof(float));
    double *v = calloc((size_t)n + 1, sizeof(double));
    CHECK_OK(deft_program_read(l->p, l->outs[i], raw, (size_t)n * sizeof(float)));
    for (int64_t k = 0; k < n; k++) v[k] = raw[k];
    free(raw);
    return v;
}

static void linear_free(linear *l) {
    deft_program_free(l->p);
    deft_graph_free(l->g);
}

static void test_linear(deft_dtype autocast) {
    const int64_t xs[3] = {LIN_B, LIN_T, LIN_C}, ws[2] = {LIN_C, LIN_N}, bs[1] = {LIN_N}, ys[3] = {LIN_B, LIN_T, LIN_N};
    ref_tensor data[4] = {ref_random(&rng, DEFT_F32, 3, xs, -1, 1), ref_random(&rng, DEFT_F32, 2, ws, -0.2, 0.2),
                          ref_random(&rng, DEFT_F32, 1, bs, -1, 1), ref_random(&rng, DEFT_F32, 3, ys, -1, 1)};
    static const char *const names[4] = {"y", "dW", "db", "dx"};
    const double tol = autocast == DEFT_BF16 ? 3e-2 : 1e-5;   /* bf16 against the CPU's f32 */
    int64_t t0, k0, t1, k1, t2, k2;
    linear cpu, plain, found;
    linear_build(&cpu, deft_cpu(), DEFT_F32, 0, data);
    counts(&t0, &k0);
    linear_build(&plain, deft_cuda(0), autocast, 0, data);
    counts(&t1, &k1);
    linear_build(&found, deft_cuda(0), autocast, 1, data);
    counts(&t2, &k2);
    const char *ac = autocast == DEFT_BF16 ? "bf16" : "f32";
    CHECK_MSG(t1 == t0 && k1 == k0, "linear %s without matmul_find: %lld timed, %lld kept", ac, (long long)(t1 - t0),
              (long long)(k1 - k0));
    CHECK_MSG(k2 == k1, "linear %s: %lld problems kept untimed, though every product writes its output whole", ac,
              (long long)(k2 - k1));
    timed_total += t2 - t1;
    for (int i = 0; cpu.p && plain.p && found.p && i < 4; i++) {
        const int64_t n = deft_tensor_numel(cpu.outs[i]);
        double *want = linear_read(&cpu, i), *p = linear_read(&plain, i), *q = linear_read(&found, i);
        char what[120];
        snprintf(what, sizeof what, "linear %s %s: heuristic against cpu", ac, names[i]);
        ref_close_tol(what, p, want, n, tol);
        snprintf(what, sizeof what, "linear %s %s: timed against cpu", ac, names[i]);
        ref_close_tol(what, q, want, n, tol);
        snprintf(what, sizeof what, "linear %s %s: timed against heuristic", ac, names[i]);
        ref_close_tol(what, q, p, n, tol);
        free(want);
        free(p);
        free(q);
    }
    linear_free(&cpu);
    linear_free(&plain);
    linear_free(&found);
    for (int i = 0; i < 4; i++) ref_free(&data[i]);
}

/* ---- a convolution's weight gradient as chunked products: the later chunks accumulate ---- */
static deft_tensor *build_conv_dw(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)ctx;
    const deft_dtype dt = deft_tensor_dtype(x[0]);
    const deft_conv2d_options o = {.stride = {2, 2}, .padding = {3, 3}, .dilation = {1, 1}, .layout = DEFT_NHWC};
    deft_tensor *y = deft_conv2d(up(dev, x[0]), up(dev, x[1]), NULL, &o);
    return down(dev, y ? deft_conv2d_weight_grad(up(dev, x[2]), y) : NULL, dt);
}

static void test_conv_accumulate(deft_dtype dt) {
    /* a ResNet stem: 675 rows, in chunks of 256, 256 and 163; the last chunk's problem is first met accumulating */
    const int64_t xs[4] = {3, 30, 30, 3}, ws[4] = {16, 7, 7, 3}, ys[4] = {3, 15, 15, 16};
    ref_tensor in[3] = {ref_random(&rng, dt, 4, xs, -1, 1), ref_random(&rng, dt, 4, ws, -1, 1),
                        ref_random(&rng, dt, 4, ys, -1, 1)};
    CHECK_OK(deft_testing_set_debug("CONV_GEMM_ROWS", 256));
    char name[80];
    snprintf(name, sizeof name, "conv2d dw as chunked products %s", dt_names[dt]);
    int64_t timed = 0, kept = 0;
    three_ways(name, 3, in, build_conv_dw, NULL, tol_of(dt) * 2, &timed, &kept);
    CHECK_MSG(kept >= 1, "%s: the accumulating chunk's problem was not kept untimed (%lld kept, %lld timed; 0 and 0 "
              "would mean cuBLASLt offered one algorithm only)", name, (long long)kept, (long long)timed);
    timed_total += timed;
    CHECK_OK(deft_testing_set_debug("CONV_GEMM_ROWS", 0));
    for (int i = 0; i < 3; i++) ref_free(&in[i]);
}

/* ---- node-level: a pointer-array batch, and a product written over its own operand ---- */
static void *upload(const ref_tensor *t) {
    void *d = NULL;
    if (!cuda_ok(cudaMalloc(&d, (size_t)t->n * deft_dtype_size(t->dt)), "cudaMalloc")) return NULL;
    cuda_ok(cudaMemcpy(d, t->raw, (size_t)t->n * deft_dtype_size(t->dt), cudaMemcpyHostToDevice), "upload");
    return d;
}

static double *download(const void *d, int64_t n, deft_dtype dt) {
    unsigned char *raw = malloc((size_t)n * deft_dtype_size(dt) + 8);
    double *v = malloc((size_t)n * sizeof(double) + 8);
    cuda_ok(cudaMemcpy(raw, d, (size_t)n * deft_dtype_size(dt), cudaMemcpyDeviceToHost), "download");
    for (int64_t i = 0; i < n; i++) v[i] = ref_load(raw, dt, i);
    free(raw);
    return v;
}

/* a [M, K] b [K, N] in float64. */
static double *product_of(const ref_tensor *a, const ref_tensor *b, int64_t M, int64_t N, int64_t K) {
    double *out = calloc((size_t)(M * N), sizeof(double));
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < N; j++) out[m * N + j] += a->v[m * K + k] * b->v[k * N + j];
    return out;
}

#define BATCH_PARTS 3
static void test_batch(deft_dtype dt, cudaStream_t st) {
    const int64_t M = 96, N = 136, K = 88, as[2] = {M, K}, bs[2] = {K, N};
    deft_graph *g = deft_graph_new();
    ref_tensor a[BATCH_PARTS], b[BATCH_PARTS];
    deft_testing_mm_part parts[BATCH_PARTS];
    double *want[BATCH_PARTS];
    memset(parts, 0, sizeof parts);
    int ok = 1;
    for (int i = 0; i < BATCH_PARTS; i++) {
        a[i] = ref_random(&rng, dt, 2, as, -1, 1);
        b[i] = ref_random(&rng, dt, 2, bs, -1, 1);
        want[i] = product_of(&a[i], &b[i], M, N, K);
        parts[i].mm = deft_matmul(deft_input(g, "a", dt, 2, as, deft_cuda(0)), deft_input(g, "b", dt, 2, bs,
                                                                                         deft_cuda(0)));
        parts[i].a = upload(&a[i]);
        parts[i].b = upload(&b[i]);
        ok &= parts[i].mm && parts[i].a && parts[i].b &&
              cuda_ok(cudaMalloc(&parts[i].out, (size_t)(M * N) * deft_dtype_size(dt)), "cudaMalloc");
    }
    double *got[2][BATCH_PARTS];
    memset(got, 0, sizeof got);
    for (int find = 0; ok && find < 2; find++) {
        int64_t t0, k0, t1, k1;
        for (int i = 0; i < BATCH_PARTS; i++)
            cuda_ok(cudaMemset(parts[i].out, 0xff, (size_t)(M * N) * deft_dtype_size(dt)), "poison");
        counts(&t0, &k0);
        CHECK_OK(deft_testing_matmul_batch(parts, BATCH_PARTS, st, find ? DEFT_CUDA_MATMUL_FIND : 0));
        cuda_ok(cudaStreamSynchronize(st), "batch");
        counts(&t1, &k1);
        CHECK_MSG(k1 == k0 && (find || t1 == t0), "batch %s find %d: %lld timed, %lld kept", dt_names[dt], find,
                  (long long)(t1 - t0), (long long)(k1 - k0));
        timed_total += find ? t1 - t0 : 0;
        for (int i = 0; i < BATCH_PARTS; i++) {
            got[find][i] = download(parts[i].out, M * N, dt);
            char what[80];
            snprintf(what, sizeof what, "batch %s find %d part %d against float64", dt_names[dt], find, i);
            ref_close_tol(what, got[find][i], want[i], M * N, tol_of(dt));
        }
    }
    for (int i = 0; i < BATCH_PARTS; i++) {
        if (got[0][i] && got[1][i]) ref_close_tol("batch: timed against heuristic", got[1][i], got[0][i], M * N,
                                                  tol_of(dt));
        free(got[0][i]);
        free(got[1][i]);
        free(want[i]);
        cudaFree((void *)parts[i].a);
        cudaFree((void *)parts[i].b);
        cudaFree(parts[i].out);
        ref_free(&a[i]);
        ref_free(&b[i]);
    }
    deft_graph_free(g);
}

static void test_overlap(cudaStream_t st) {
    const int64_t S = 120, shape[2] = {S, S};   /* a shape no other case uses: its problem is met here first */
    deft_graph *g = deft_graph_new();
    deft_tensor *mm = deft_matmul(deft_input(g, "a", DEFT_F32, 2, shape, deft_cuda(0)),
                                  deft_input(g, "b", DEFT_F32, 2, shape, deft_cuda(0)));
    ref_tensor a = ref_random(&rng, DEFT_F32, 2, shape, -1, 1), b = ref_random(&rng, DEFT_F32, 2, shape, -1, 1);
    void *da = upload(&a), *db = upload(&b), *out = NULL;
    if (mm && da && db && cuda_ok(cudaMalloc(&out, (size_t)(S * S) * sizeof(float)), "cudaMalloc")) {
        int64_t t0, k0, t1, k1, t2, k2;
        counts(&t0, &k0);
        const void *in[2] = {da, db};
        CHECK_OK(deft_cuda_run_node(mm, da, in, st, DEFT_CUDA_MATMUL_FIND));   /* out over a: values unchecked */
        cuda_ok(cudaStreamSynchronize(st), "overlapping product");
        counts(&t1, &k1);
        CHECK_MSG(t1 == t0 && k1 == k0 + 1, "a product over its own operand: %lld timed, %lld kept (want 0, 1)",
                  (long long)(t1 - t0), (long long)(k1 - k0));
        cuda_ok(cudaMemcpy(da, a.raw, (size_t)(S * S) * sizeof(float), cudaMemcpyHostToDevice), "upload");
        CHECK_OK(deft_cuda_run_node(mm, out, in, st, DEFT_CUDA_MATMUL_FIND));
        cuda_ok(cudaStreamSynchronize(st), "product");
        counts(&t2, &k2);
        CHECK_MSG(t2 == t1 && k2 == k1, "the kept problem again: %lld timed, %lld kept (want 0, 0)",
                  (long long)(t2 - t1), (long long)(k2 - k1));
        double *want = product_of(&a, &b, S, S, S), *got = download(out, S * S, DEFT_F32);
        ref_close_tol("the kept problem's product against float64", got, want, S * S, tol_of(DEFT_F32));
        free(want);
        free(got);
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(out);
    ref_free(&a);
    ref_free(&b);
    deft_graph_free(g);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    cudaStream_t st = NULL;
    if (!cuda_ok(cudaSetDevice(0), "cudaSetDevice") || !cuda_ok(cudaStreamCreate(&st), "cudaStreamCreate"))
        return deft_check_finish();
    test_products();
    test_linear(DEFT_F32);
    test_linear(DEFT_BF16);
    test_conv_accumulate(DEFT_BF16);
    test_batch(DEFT_F32, st);
    test_batch(DEFT_BF16, st);
    test_overlap(st);
    /* cuBLASLt offers several algorithms for most of these shapes: some problem must have been timed */
    CHECK_MSG(timed_total > 0, "no product problem was timed under matmul_find");
    printf("%lld problems timed\n", (long long)timed_total);
    deft_stream_workspaces_release(0, st);
    cudaStreamDestroy(st);
    return deft_check_finish();
}

#else

DEFT_CHECK_MAIN_WITHOUT_CUDA

#endif
