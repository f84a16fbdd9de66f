/* The cuBLASLt matmul path (ops/cuda/cuda_matmul_lt.cu) against the cublasGemmEx reference path and a float64 CPU
 * product, node by node: plain products in f32 (with and without TF32), f16 and bf16 over odd shapes, all four
 * transposes and batched forms; every fused epilogue (bias, bias + ReLU, bias gradient) against the same work done
 * separately in float64 and by the fallback kernels; outputs poisoned with NaN before each run (and guarded past
 * their end), so an element left unwritten or one written too far fails; a fused product captured into a CUDA
 * Graph after an eager run and one first met inside a capture; and the nodes deft_cuda_matmul_fusable must refuse.
 * Inputs are fresh uniform values in [-1, 1) for every check. The error measure is the relative norm
 * ||got - want|| / ||want||. Skips (exit 77) where no GPU works. */
#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "ref.h"

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "deft_testing.h"

#define GUARD 8   /* poisoned elements kept past each output, which nothing may write */

static uint64_t rng = 0x11a7a11ull;
static cudaStream_t stream;

static const char *dt_name(deft_dtype dt) { return deft_dtype_name(dt); }

static double tol_of(deft_dtype dt, int tf32) {
    if (dt == DEFT_F32) return tf32 ? 5e-3 : 1e-5;
    return 2e-2;
}

static int cuda_ok(cudaError_t e, const char *what) {
    CHECK_MSG(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* ---- device buffers holding a ref_tensor's storage, or a poisoned output ---- */
static void *upload(const ref_tensor *t) {
    void *d = NULL;
    const size_t bytes = (size_t)(t->n > 0 ? t->n : 1) * deft_dtype_size(t->dt);
    if (!cuda_ok(cudaMalloc(&d, bytes), "cudaMalloc")) return NULL;
    cuda_ok(cudaMemcpy(d, t->raw, (size_t)t->n * deft_dtype_size(t->dt), cudaMemcpyHostToDevice), "upload");
    return d;
}

/* n elements plus GUARD, every byte 0xff: NaN in f32, f16 and bf16. */
static void *poisoned(int64_t n, deft_dtype dt) {
    void *d = NULL;
    const size_t bytes = (size_t)(n + GUARD) * deft_dtype_size(dt);
    if (!cuda_ok(cudaMalloc(&d, bytes), "cudaMalloc")) return NULL;
    cuda_ok(cudaMemset(d, 0xff, bytes), "poison");
    return d;
}

/* The n values of d as doubles (malloc'd); checks that the GUARD elements after them are still poison. */
static double *download(const void *d, int64_t n, deft_dtype dt, const char *name) {
    const size_t esz = deft_dtype_size(dt);
    unsigned char *raw = malloc((size_t)(n + GUARD) * esz);
    double *v = malloc((size_t)(n + 1) * sizeof(double));
    cuda_ok(cudaMemcpy(raw, d, (size_t)(n + GUARD) * esz, cudaMemcpyDeviceToHost), "download");
    for (int64_t i = 0; i < n; i++) v[i] = ref_load(raw, dt, i);
    int guard_ok = 1;
    for (size_t i = (size_t)n * esz; i < (size_t)(n + GUARD) * esz; i++) guard_ok &= raw[i] == 0xff;
    CHECK_MSG(guard_ok, "%s: written past its %lld elements", name, (long long)n);
    free(raw);
    return v;
}

/* ||got - want|| / ||want|| (the plain norm where want is zero); NaN anywhere gives NaN, which fails any bound. */
static double rel_err(const double *got, const double *want, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static void check_close(const char *name, const double *got, const double *want, int64_t n, double tol) {
    const double e = rel_err(got, want, n);
    CHECK_MSG(e <= tol, "%s: relative error %.3g over %.3g", name, e, tol);
}

/* ---- one matmul node and its float64 product ---- */
typedef struct mm_case {
    deft_graph *g;
    deft_tensor *node;
    ref_tensor a, b;
    void *da, *db;
    int64_t M, N, K, batch, n_out;
} mm_case;

/* The index of output batch i's matrix in src, whose batch dims broadcast against the output's. */
static int64_t src_matrix(const deft_tensor *src, const deft_tensor *out, int64_t i) {
    int64_t idx = 0, stride = 1;
    for (int d = deft_tensor_ndim(out) - 3, ds = deft_tensor_ndim(src) - 3; d >= 0; d--, ds--) {
        const int64_t c = i % deft_tensor_dim(out, d);
        i /= deft_tensor_dim(out, d);
        if (ds < 0) continue;
        if (deft_tensor_dim(src, ds) != 1) idx += c * stride;
        stride *= deft_tensor_dim(src, ds);
    }
    return idx;
}

static double *cpu_product(const mm_case *c) {
    const deft_tensor *n = c->node;
    const int ta = deft_testing_matmul_transposed(n, 0), tb = deft_testing_matmul_transposed(n, 1);
    const int64_t M = c->M, N = c->N, K = c->K;
    double *out = malloc((size_t)(c->n_out + 1) * sizeof(double));
    for (int64_t bi = 0; bi < c->batch; bi++) {
        const double *A = c->a.v + src_matrix(deft_testing_src(n, 0), n, bi) * M * K;
        const double *B = c->b.v + src_matrix(deft_testing_src(n, 1), n, bi) * K * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0.0;
                for (int64_t k = 0; k < K; k++)
                    s += (ta ? A[k * M + m] : A[m * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
                out[bi * M * N + m * N + j] = s;
            }
    }
    return out;
}

/* Builds a [..., M, K] x [..., K, N] node (shapes as stored, transposes applied by the node) with random inputs
 * uploaded; 0 when building failed. */
static int case_make(mm_case *c, deft_dtype dt, int na, const int64_t *as, int nb, const int64_t *bs, int ta, int tb) {
    memset(c, 0, sizeof *c);
    c->g = deft_graph_new();
    deft_tensor *a = deft_input(c->g, "a", dt, na, as, deft_cuda(0));
    deft_tensor *b = deft_input(c->g, "b", dt, nb, bs, deft_cuda(0));
    c->node = deft_matmul_t(a, b, ta, tb);
    CHECK_MSG(c->node != NULL, "building matmul: %s", deft_errmsg());
    if (!c->node) return 0;
    c->a = ref_random(&rng, dt, na, as, -1, 1);
    c->b = ref_random(&rng, dt, nb, bs, -1, 1);
    c->da = upload(&c->a);
    c->db = upload(&c->b);
    const deft_tensor *n = c->node;
    c->M = deft_tensor_dim(n, -2);
    c->N = deft_tensor_dim(n, -1);
    c->K = as[na - (ta ? 2 : 1)];
    c->n_out = deft_tensor_numel(n);
    c->batch = c->M * c->N > 0 ? c->n_out / (c->M * c->N) : 0;
    return c->da && c->db;
}

static void case_free(mm_case *c) {
    cudaFree(c->da);
    cudaFree(c->db);
    ref_free(&c->a);
    ref_free(&c->b);
    deft_graph_free(c->g);
}

/* Runs the node through deft_cuda_run_node (the reference path when `reference`), into a fresh poisoned buffer. */
static double *run_plain(const mm_case *c, unsigned flags, int reference, const char *name) {
    void *out = poisoned(c->n_out, deft_tensor_dtype(c->node));
    if (!out) return NULL;
    const void *in[2] = {c->da, c->db};
    if (reference) CHECK_OK(deft_testing_set_debug("MATMUL_REFERENCE", 1));
    CHECK_OK(deft_cuda_run_node(c->node, out, in, stream, flags));
    if (reference) CHECK_OK(deft_testing_set_debug("MATMUL_REFERENCE", 0));
    cuda_ok(cudaStreamSynchronize(stream), name);
    double *v = download(out, c->n_out, deft_tensor_dtype(c->node), name);
    cudaFree(out);
    return v;
}

/* ---- plain products ---- */
static void check_plain(const char *label, deft_dtype dt, int na, const int64_t *as, int nb, const int64_t *bs,
                        int ta, int tb) {
    for (int tf32 = 0; tf32 <= (dt == DEFT_F32); tf32++) {
        mm_case c;
        if (case_make(&c, dt, na, as, nb, bs, ta, tb)) {
            char name[160];
            snprintf(name, sizeof name, "%s %s ta=%d tb=%d%s", label, dt_name(dt), ta, tb, tf32 ? " tf32" : "");
            const unsigned flags = tf32 ? DEFT_CUDA_ALLOW_TF32 : 0;
            double *want = cpu_product(&c), *lt = run_plain(&c, flags, 0, name), *ref = run_plain(&c, flags, 1, name);
            if (lt && ref) {
                check_close(name, lt, want, c.n_out, tol_of(dt, tf32));
                check_close(name, ref, want, c.n_out, tol_of(dt, 0));
                check_close(name, lt, ref, c.n_out, tol_of(dt, tf32));
            }
            free(want);
            free(lt);
            free(ref);
        }
        case_free(&c);
    }
}

static const int64_t shapes[][3] = {{1, 1, 1},   {3, 7, 5},   {33, 17, 65},   {256, 128, 512}, {64, 1, 300},
                                    {1, 96, 40}, {96, 10, 72}, {130, 72, 10}}; /* the last two: thin halves */
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))
static const deft_dtype dtypes[] = {DEFT_F32, DEFT_F16, DEFT_BF16};

static void test_plain_2d(void) {
    for (int si = 0; si < N_SHAPES; si++)
        for (int di = 0; di < 3; di++)
            for (int t = 0; t < 4; t++) {
                const int ta = t & 1, tb = t >> 1;
                const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                const int64_t as[2] = {ta ? K : M, ta ? M : K}, bs[2] = {tb ? N : K, tb ? K : N};
                char label[64];
                snprintf(label, sizeof label, "plain %lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
                check_plain(label, dtypes[di], 2, as, 2, bs, ta, tb);
            }
}

/* Folded ([B, M, K] x [K, N]), strided ([B, ...] x [B, ...]), broadcast ([B, ...] x [1, ...], stride 0) and
 * irregular ([B1, 1, ...] x [1, B2, ...], the reference's one call per matrix) batches. */
static void test_plain_batched(void) {
    for (int di = 0; di < 3; di++)
        for (int t = 0; t < 4; t++) {
            const int ta = t & 1, tb = t >> 1;
            const int64_t M = 19, N = 24, K = 37;
            const int64_t a3[3] = {5, ta ? K : M, ta ? M : K}, b2[2] = {tb ? N : K, tb ? K : N};
            const int64_t b3[3] = {5, tb ? N : K, tb ? K : N}, b31[3] = {1, tb ? N : K, tb ? K : N};
            const int64_t a4[4] = {3, 1, ta ? K : M, ta ? M : K}, b4[4] = {1, 4, tb ? N : K, tb ? K : N};
            check_plain("batched [5]x2d", dtypes[di], 3, a3, 2, b2, ta, tb);
            check_plain("batched [5]x[5]", dtypes[di], 3, a3, 3, b3, ta, tb);
            check_plain("batched [5]x[1]", dtypes[di], 3, a3, 3, b31, ta, tb);
            check_plain("batched [3,1]x[1,4]", dtypes[di], 4, a4, 4, b4, ta, tb);
        }
}

/* TF32 really changes the f32 product of a large K (so the flag reaches cuBLASLt), but stays within its bound. */
static void test_tf32_engaged(void) {
    mm_case c;
    const int64_t as[2] = {256, 1024}, bs[2] = {1024, 256};
    if (case_make(&c, DEFT_F32, 2, as, 2, bs, 0, 0)) {
        double *want = cpu_product(&c);
        double *off = run_plain(&c, 0, 0, "tf32 off"), *on = run_plain(&c, DEFT_CUDA_ALLOW_TF32, 0, "tf32 on");
        if (off && on) {
            const double e_off = rel_err(off, want, c.n_out), e_on = rel_err(on, want, c.n_out);
            printf("256x256x1024 f32: relative error %.3g without TF32, %.3g with\n", e_off, e_on);
            CHECK_MSG(e_off <= 1e-5, "f32 without TF32: %.3g", e_off);
            CHECK_MSG(e_on <= 5e-3, "f32 with TF32: %.3g", e_on);
            CHECK_MSG(e_on > 10 * e_off, "TF32 on (%.3g) is no less precise than off (%.3g): not engaged?", e_on,
                      e_off);
        }
        free(want);
        free(off);
        free(on);
    }
    case_free(&c);
}

/* ---- fused epilogues ---- */
static const char *const epi_names[] = {"none", "bias", "bias+relu", "bgrad_b"};

/* The epilogue's float64 expectations: the output (with bias and ReLU applied) and, for BGRAD_B, the sums over k
 * of op(b). */
static void epilogue_want(const mm_case *c, int kind, const ref_tensor *bias, double *out,
                          double *grad) {
    const int64_t N = c->N, K = c->K;
    const int tb = deft_testing_matmul_transposed(c->node, 1);
    if (kind == DEFT_TESTING_MM_BIAS || kind == DEFT_TESTING_MM_BIAS_RELU)
        for (int64_t i = 0; i < c->n_out; i++) {   /* every output matrix of a batch, each row's bias by column */
            const double v = out[i] + bias->v[i % N];
            out[i] = kind == DEFT_TESTING_MM_BIAS_RELU && v < 0.0 ? 0.0 : v;
        }
    if (kind == DEFT_TESTING_MM_BGRAD_B)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) s += tb ? c->b.v[j * K + k] : c->b.v[k * N + j];
            grad[j] = s;
        }
}

/* One fused run into fresh poisoned buffers; the fallback kernels when `reference`. */
static void run_fused(const mm_case *c, int kind, const void *dbias, unsigned flags,
                      int reference, const char *name, double **out, double **grad) {
    const deft_dtype dt = deft_tensor_dtype(c->node);
    void *dout = poisoned(c->n_out, dt), *dgrad = poisoned(c->N, dt);
    deft_testing_mm_epilogue ep = {kind, dbias, kind == DEFT_TESTING_MM_BGRAD_B ? dgrad : NULL};
    if (reference) CHECK_OK(deft_testing_set_debug("MATMUL_REFERENCE", 1));
    CHECK_OK(deft_testing_matmul_fused(c->node, dout, c->da, c->db, &ep, stream, flags));
    if (reference) CHECK_OK(deft_testing_set_debug("MATMUL_REFERENCE", 0));
    cuda_ok(cudaStreamSynchronize(stream), name);
    *out = download(dout, c->n_out, dt, name);
    *grad = kind == DEFT_TESTING_MM_BGRAD_B ? download(dgrad, c->N, dt, name) : NULL;
    cudaFree(dout);
    cudaFree(dgrad);
}

/* c's node fused with the epilogue, through cuBLASLt (or the small-product kernels) and through the fallback. */
static void check_fused_node(mm_case *c, deft_dtype dt, int kind, int tf32, const char *name) {
    const int64_t N = c->N;
    const unsigned flags = tf32 ? DEFT_CUDA_ALLOW_TF32 : 0;
    CHECK_MSG(deft_testing_matmul_fusable(c->node, kind, flags), "%s: not fusable", name);
    /* A bias around the products' size, so ReLU clips about half the outputs. */
    ref_tensor bias = ref_random(&rng, dt, 1, &N, -1, 1);
    void *dbias = upload(&bias);
    double *want = cpu_product(c), *want_grad = malloc((size_t)(N + 1) * sizeof(double));
    epilogue_want(c, kind, &bias, want, want_grad);
    double *out, *grad, *fout, *fgrad;
    run_fused(c, kind, dbias, flags, 0, name, &out, &grad);
    run_fused(c, kind, dbias, flags, 1, name, &fout, &fgrad);
    const double tol = tol_of(dt, tf32);
    check_close(name, out, want, c->n_out, tol);
    check_close(name, fout, want, c->n_out, tol_of(dt, 0));
    if (kind == DEFT_TESTING_MM_BGRAD_B) {
        char gname[180];
        snprintf(gname, sizeof gname, "%s: bias gradient", name);
        check_close(gname, grad, want_grad, N, tol_of(dt, 0));
        check_close(gname, fgrad, want_grad, N, tol_of(dt, 0));
    }
    free(want);
    free(want_grad);
    free(out);
    free(grad);
    free(fout);
    free(fgrad);
    cudaFree(dbias);
    ref_free(&bias);
}

static void check_fused(deft_dtype dt, int64_t M, int64_t N, int64_t K, int ta, int tb, int kind,
                        int tf32) {
    mm_case c;
    const int64_t as[2] = {ta ? K : M, ta ? M : K}, bs[2] = {tb ? N : K, tb ? K : N};
    if (case_make(&c, dt, 2, as, 2, bs, ta, tb)) {
        char name[160];
        snprintf(name, sizeof name, "fused %s %s %lldx%lldx%lld ta=%d tb=%d%s", epi_names[kind], dt_name(dt),
                 (long long)M, (long long)N, (long long)K, ta, tb, tf32 ? " tf32" : "");
        check_fused_node(&c, dt, kind, tf32, name);
    }
    case_free(&c);
}

/* A linear layer on [B, T, K] (a 3-d a against a 2-d b): one product over the B * T stacked rows, the bias over N. */
static void check_fused_rows(deft_dtype dt, int64_t B, int64_t T, int64_t N, int64_t K, int tb, int kind) {
    mm_case c;
    const int64_t as[3] = {B, T, K}, bs[2] = {tb ? N : K, tb ? K : N};
    if (case_make(&c, dt, 3, as, 2, bs, 0, tb)) {
        char name[160];
        snprintf(name, sizeof name, "fused %s %s [%lld, %lld, %lld] x %lldx%lld tb=%d", epi_names[kind], dt_name(dt),
                 (long long)B, (long long)T, (long long)K, (long long)K, (long long)N, tb);
        check_fused_node(&c, dt, kind, 0, name);
    }
    case_free(&c);
}

static void test_fused(void) {
    for (int si = 0; si < N_SHAPES; si++)
        for (int di = 0; di < 3; di++)
            for (int t = 0; t < 4; t++)
                for (int k = DEFT_TESTING_MM_NONE; k <= DEFT_TESTING_MM_BGRAD_B; k++) {
                    const int ta = t & 1, tb = t >> 1;
                    if (k == DEFT_TESTING_MM_BGRAD_B && tb) continue;   /* refused: see test_refusals */
                    for (int tf32 = 0; tf32 <= (dtypes[di] == DEFT_F32); tf32++)
                        check_fused(dtypes[di], shapes[si][0], shapes[si][1], shapes[si][2], ta, tb,
                                    k, tf32);
                }
    /* The linear layer's shapes: forward x[B, in] w[in, out] + bias, and dW = x^T dy with db beside it. */
    check_fused(DEFT_F32, 512, 1024, 768, 0, 0, DEFT_TESTING_MM_BIAS_RELU, 0);
    check_fused(DEFT_BF16, 512, 1024, 768, 0, 0, DEFT_TESTING_MM_BIAS, 0);
    check_fused(DEFT_F32, 768, 1024, 512, 1, 0, DEFT_TESTING_MM_BGRAD_B, 0);
    /* A classifier's weight gradient (cuda_matmul_small.cu's thin kernel), with and without its bias gradient. */
    check_fused(DEFT_F32, 1024, 10, 256, 1, 0, DEFT_TESTING_MM_BGRAD_B, 0);
    check_fused(DEFT_F32, 1000, 16, 77, 1, 0, DEFT_TESTING_MM_NONE, 0);
    check_fused(DEFT_F32, 33, 3, 1100, 1, 0, DEFT_TESTING_MM_BGRAD_B, 1);
    check_fused(DEFT_F16, 768, 1024, 512, 1, 0, DEFT_TESTING_MM_BGRAD_B, 0);
    /* Linear layers on [B, T, C]: GPT-2's MLP shape scaled down, odd shapes, and the small-product kernels' rows. */
    for (int di = 0; di < 3; di++)
        for (int k = DEFT_TESTING_MM_BIAS; k <= DEFT_TESTING_MM_BIAS_RELU; k++) {
            check_fused_rows(dtypes[di], 4, 64, 384, 96, 0, k);
            check_fused_rows(dtypes[di], 3, 37, 29, 65, 1, k);
            check_fused_rows(dtypes[di], 2, 5, 40, 24, 0, k);
        }
}

/* ---- CUDA Graph capture ---- */
/* The fused product captured and replayed: `warm` runs it eagerly first (the algorithm then comes from the cache);
 * otherwise the capture is the first time this shape is seen, and the fallback must run in it. */
static void check_captured(int64_t M, int64_t N, int64_t K, int warm) {
    mm_case c;
    const int64_t as[2] = {M, K}, bs[2] = {K, N};
    if (!case_make(&c, DEFT_F32, 2, as, 2, bs, 0, 0)) {
        case_free(&c);
        return;
    }
    char name[96];
    snprintf(name, sizeof name, "captured bias+relu %lldx%lldx%lld%s", (long long)M, (long long)N, (long long)K,
             warm ? " after an eager run" : " first seen in the capture");
    ref_tensor bias = ref_random(&rng, DEFT_F32, 1, &N, -1, 1);
    void *dbias = upload(&bias), *dout = poisoned(c.n_out, DEFT_F32);
    deft_testing_mm_epilogue ep = {DEFT_TESTING_MM_BIAS_RELU, dbias, NULL};
    if (warm) {
        CHECK_OK(deft_testing_matmul_fused(c.node, dout, c.da, c.db, &ep, stream, 0));
        cuda_ok(cudaStreamSynchronize(stream), name);
        cuda_ok(cudaMemset(dout, 0xff, (size_t)(c.n_out + GUARD) * sizeof(float)), "poison");
    }
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture")) {
        CHECK_OK(deft_testing_matmul_fused(c.node, dout, c.da, c.db, &ep, stream, 0));
        if (cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture") &&
            cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) {
            cuda_ok(cudaGraphLaunch(exec, stream), "launch");
            cuda_ok(cudaStreamSynchronize(stream), name);
            double *want = cpu_product(&c), *got = download(dout, c.n_out, DEFT_F32, name);
            epilogue_want(&c, DEFT_TESTING_MM_BIAS_RELU, &bias, want, NULL);
            check_close(name, got, want, c.n_out, tol_of(DEFT_F32, 0));
            free(want);
            free(got);
        }
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaFree(dbias);
    cudaFree(dout);
    ref_free(&bias);
    case_free(&c);
}

/* ---- what must be refused ---- */
static deft_tensor *node_of(deft_graph *g, deft_dtype dt, int nd, const int64_t *as, const int64_t *bs, int tb,
                            deft_device dev) {
    deft_tensor *a = deft_input(g, "a", dt, nd, as, dev), *b = deft_input(g, "b", dt, nd, bs, dev);
    return deft_matmul_t(a, b, 0, tb);
}

static void test_refusals(void) {
    deft_graph *g = deft_graph_new();
    const int64_t as[3] = {2, 8, 16}, bs[3] = {2, 16, 4}, bst[2] = {4, 16};
    deft_tensor *batched = node_of(g, DEFT_F32, 3, as, bs, 0, deft_cuda(0));
    deft_tensor *f64 = node_of(g, DEFT_F64, 2, as + 1, bs + 1, 0, deft_cuda(0));
    deft_tensor *i32 = node_of(g, DEFT_I32, 2, as + 1, bs + 1, 0, deft_cuda(0));   /* NULL: matmul wants floats */
    deft_tensor *cpu = node_of(g, DEFT_F32, 2, as + 1, bs + 1, 0, deft_cpu());
    deft_tensor *tb = node_of(g, DEFT_F32, 2, as + 1, bst, 1, deft_cuda(0));
    deft_tensor *ok = node_of(g, DEFT_F32, 2, as + 1, bs + 1, 0, deft_cuda(0));
    CHECK(batched && f64 && cpu && tb && ok);
    for (int k = DEFT_TESTING_MM_NONE; k <= DEFT_TESTING_MM_BGRAD_B; k++) {
        const int kind = k;
        CHECK_MSG(!deft_testing_matmul_fusable(batched, kind, 0), "batched matmul fusable with %s", epi_names[k]);
        CHECK_MSG(!deft_testing_matmul_fusable(f64, kind, 0), "f64 matmul fusable with %s", epi_names[k]);
        CHECK_MSG(!deft_testing_matmul_fusable(i32, kind, 0), "i32 matmul fusable with %s", epi_names[k]);
        CHECK_MSG(!deft_testing_matmul_fusable(cpu, kind, 0), "CPU matmul fusable with %s", epi_names[k]);
        CHECK_MSG(deft_testing_matmul_fusable(ok, kind, 0) &&
                      deft_testing_matmul_fusable(ok, kind, DEFT_CUDA_ALLOW_TF32),
                  "plain 2-d f32 matmul not fusable with %s", epi_names[k]);
        CHECK_MSG(deft_testing_matmul_fusable(tb, kind, 0) == (kind != DEFT_TESTING_MM_BGRAD_B),
                  "matmul with b transposed: fusable with %s is wrong", epi_names[k]);
    }
    /* A 3-d a against a 2-d b: one product over a's stacked rows, with a bias but no bias gradient (its a is not 2-d),
     * and not with a transposed (each matrix of a transposed is no stack of rows). */
    const int64_t ast[3] = {2, 16, 8};
    deft_tensor *a3 = deft_input(g, "a3", DEFT_F32, 3, as, deft_cuda(0));
    deft_tensor *b2 = deft_input(g, "b2", DEFT_F32, 2, bs + 1, deft_cuda(0));
    deft_tensor *rows = deft_matmul(a3, b2);
    deft_tensor *rows_tb = deft_matmul_t(a3, deft_input(g, "b2t", DEFT_F32, 2, bst, deft_cuda(0)), 0, 1);
    deft_tensor *a3t = deft_matmul_t(deft_input(g, "a3t", DEFT_F32, 3, ast, deft_cuda(0)), b2, 1, 0);
    CHECK(rows && rows_tb && a3t);
    for (int k = DEFT_TESTING_MM_NONE; k <= DEFT_TESTING_MM_BGRAD_B; k++) {
        CHECK_MSG(deft_testing_matmul_fusable(rows, k, 0) == (k != DEFT_TESTING_MM_BGRAD_B), "3-d a with %s",
                  epi_names[k]);
        CHECK_MSG(deft_testing_matmul_fusable(rows_tb, k, 0) == (k != DEFT_TESTING_MM_BGRAD_B), "3-d a, b^T with %s",
                  epi_names[k]);
        CHECK_MSG(!deft_testing_matmul_fusable(a3t, k, 0), "3-d a transposed fusable with %s", epi_names[k]);
    }
    CHECK(!deft_testing_matmul_fusable(deft_input(g, "x", DEFT_F32, 2, as + 1, deft_cuda(0)), DEFT_TESTING_MM_BIAS, 0));
    CHECK(!deft_testing_matmul_fusable(NULL, DEFT_TESTING_MM_BIAS, 0));
    /* Running a refused fusion is an error, never a launch. */
    float *d = NULL;
    if (cuda_ok(cudaMalloc((void **)&d, 4096), "cudaMalloc")) {
        deft_testing_mm_epilogue ep = {DEFT_TESTING_MM_BGRAD_B, NULL, d};
        CHECK_ERR(deft_testing_matmul_fused(tb, d, d, d, &ep, stream, 0), DEFT_ERR_INVALID, "cannot be fused");
        CHECK_ERR(deft_testing_matmul_fused(batched, d, d, d, &ep, stream, 0), DEFT_ERR_INVALID, "cannot be fused");
        deft_testing_mm_epilogue no_bias = {DEFT_TESTING_MM_BIAS, NULL, NULL};
        CHECK_ERR(deft_testing_matmul_fused(ok, d, d, d, &no_bias, stream, 0), DEFT_ERR_INVALID, "no vector");
        cudaFree(d);
    }
    deft_graph_free(g);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    if (!cuda_ok(cudaSetDevice(0), "cudaSetDevice") || !cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate"))
        return deft_check_finish();
    test_plain_2d();
    test_plain_batched();
    test_tf32_engaged();
    test_fused();
    check_captured(96, 80, 72, 1);
    check_captured(45, 51, 29, 0);
    test_refusals();
    deft_stream_workspaces_release(0, stream);
    cudaStreamDestroy(stream);
    return deft_check_finish();
}

#else

DEFT_CHECK_MAIN_WITHOUT_CUDA

#endif
