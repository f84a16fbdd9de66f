/* Batched products (ops/cuda/cuda_matmul_batch.cu, passes/fusion_batch.c):
 *  1. the batch kernel (deft_testing_matmul_batch) on weight-gradient shapes (a [K, M] transposed, b [K, N]) in f32,
 *     TF32, bf16 and f16, some parts with bias gradients: every output and bias gradient against a float64 CPU
 *     product and sum, through the cuBLASLt batch and through the reference path (debug knob MATMUL_REFERENCE, one
 *     product at a time); outputs poisoned with NaN first, so an element left unwritten fails; a capture into a CUDA
 *     Graph after an eager run gives the eager bits; and the batches it must refuse;
 *  2. an MLP's plan: its layers' weight gradients batched in f32 and TF32, none where they are small, with
 *     no_product_batches, optimizer_in_backward, checkpointing or no_fusion;
 *  3. the MLP trained with and without batches: losses, step norms and parameters within f32 rounding of each other
 *     after every run; and batched replays equal to batched eager runs bit for bit.
 * Skips (exit 77) where no GPU works. DEFT_TEST_GPU_AS_CPU=1 runs part 2 and 3 on the CPU, where nothing is batched. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "deft_testing.h"
#include "obwd_net.h"
#include "ref.h"

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static deft_device GPU;

#ifdef DEFT_HAVE_CUDA
#define PARTS 5
static uint64_t rng = 0xba7c4ull;

typedef struct batch_case {
    deft_graph *g;
    deft_dtype dt;
    int64_t M, N, K;
    deft_tensor *mm[PARTS];
    ref_tensor a[PARTS], b[PARTS];
    void *da[PARTS], *db[PARTS], *dout[PARTS], *dgrad[PARTS];
} batch_case;

static void *device_copy(const ref_tensor *t) {
    void *d = NULL;
    if (cudaMalloc(&d, (size_t)t->n * deft_dtype_size(t->dt)) != cudaSuccess) return NULL;
    cudaMemcpy(d, t->raw, (size_t)t->n * deft_dtype_size(t->dt), cudaMemcpyHostToDevice);
    return d;
}

/* Every byte 0xff: NaN in f32, f16 and bf16. The batch runs on a stream that does not wait for the legacy one,
 * so the poison is in place before it returns. */
static void poison(const batch_case *c) {
    for (int i = 0; i < PARTS; i++) {
        cudaMemset(c->dout[i], 0xff, (size_t)(c->M * c->N) * deft_dtype_size(c->dt));
        cudaMemset(c->dgrad[i], 0xff, (size_t)c->N * deft_dtype_size(c->dt));
    }
    cudaDeviceSynchronize();
}

/* PARTS products out[M, N] = a^T b, a [K, M] and b [K, N] of dtype dt, with random inputs on cuda:0. */
static int case_make(batch_case *c, deft_dtype dt, int64_t M, int64_t N, int64_t K) {
    *c = (batch_case){.g = deft_graph_new(), .dt = dt, .M = M, .N = N, .K = K};
    int ok = 1;
    for (int i = 0; i < PARTS; i++) {
        const int64_t as[2] = {K, M}, bs[2] = {K, N};
        c->mm[i] = deft_matmul_t(deft_input(c->g, "a", dt, 2, as, deft_cuda(0)),
                                 deft_input(c->g, "b", dt, 2, bs, deft_cuda(0)), 1, 0);
        c->a[i] = ref_random(&rng, dt, 2, as, -1, 1);
        c->b[i] = ref_random(&rng, dt, 2, bs, -1, 1);
        c->da[i] = device_copy(&c->a[i]);
        c->db[i] = device_copy(&c->b[i]);
        ok &= c->mm[i] && c->da[i] && c->db[i] &&
              cudaMalloc(&c->dout[i], (size_t)(M * N) * deft_dtype_size(dt)) == cudaSuccess &&
              cudaMalloc(&c->dgrad[i], (size_t)N * deft_dtype_size(dt)) == cudaSuccess;
    }
    CHECK_MSG(ok, "making the batch: %s", deft_errmsg());
    return ok;
}

static void case_free(batch_case *c) {
    for (int i = 0; i < PARTS; i++) {
        cudaFree(c->da[i]);
        cudaFree(c->db[i]);
        cudaFree(c->dout[i]);
        cudaFree(c->dgrad[i]);
        ref_free(&c->a[i]);
        ref_free(&c->b[i]);
    }
    deft_graph_free(c->g);
}

/* The parts, parts 1 and 3 without a bias gradient. */
static void parts_of(const batch_case *c, deft_testing_mm_part *p) {
    for (int i = 0; i < PARTS; i++)
        p[i] = (deft_testing_mm_part){c->mm[i], c->dout[i], c->da[i], c->db[i], i % 2 ? NULL : c->dgrad[i]};
}

/* ||got - want|| / ||want|| for part i's output and bias gradient. */
static void check_part(const batch_case *c, int i, double tol, const char *what) {
    const int64_t M = c->M, N = c->N, K = c->K;
    const size_t esz = deft_dtype_size(c->dt);
    unsigned char *out = malloc((size_t)(M * N) * esz), *grad = malloc((size_t)N * esz);
    cudaMemcpy(out, c->dout[i], (size_t)(M * N) * esz, cudaMemcpyDeviceToHost);
    cudaMemcpy(grad, c->dgrad[i], (size_t)N * esz, cudaMemcpyDeviceToHost);
    double num = 0, den = 0, gnum = 0, gden = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double want = 0;
            for (int64_t k = 0; k < K; k++) want += c->a[i].v[k * M + m] * c->b[i].v[k * N + n];
            const double d = ref_load(out, c->dt, m * N + n) - want;
            num += d * d;
            den += want * want;
        }
    for (int64_t n = 0; i % 2 == 0 && n < N; n++) {
        double want = 0;
        for (int64_t k = 0; k < K; k++) want += c->b[i].v[k * N + n];
        const double d = ref_load(grad, c->dt, n) - want;
        gnum += d * d;
        gden += want * want;
    }
    const double e = sqrt(num / den), ge = i % 2 == 0 ? sqrt(gnum / gden) : 0.0;
    CHECK_MSG(e <= tol, "%s, part %d: output relative error %.3g over %.3g", what, i, e, tol);
    CHECK_MSG(ge <= tol, "%s, part %d: bias gradient relative error %.3g over %.3g", what, i, ge, tol);
    free(out);
    free(grad);
}

static void run_batch(batch_case *c, unsigned flags, int reference, cudaStream_t st, const char *what) {
    deft_testing_mm_part p[PARTS];
    parts_of(c, p);
    poison(c);
    if (reference) CHECK_OK(deft_testing_set_debug("MATMUL_REFERENCE", 1));
    CHECK_OK(deft_testing_matmul_batch(p, PARTS, st, flags));
    if (reference) CHECK_OK(deft_testing_set_debug("MATMUL_REFERENCE", 0));
    CHECK_MSG(cudaStreamSynchronize(st) == cudaSuccess, "%s: synchronize", what);
    const double tol = c->dt == DEFT_F32 ? (flags ? 5e-3 : 1e-5) : 2e-2;
    for (int i = 0; i < PARTS; i++) check_part(c, i, reference ? (c->dt == DEFT_F32 ? 1e-5 : tol) : tol, what);
}

/* The output bytes of every part, concatenated (malloc'd). */
static unsigned char *outputs_of(const batch_case *c) {
    const size_t one = (size_t)(c->M * c->N + c->N) * deft_dtype_size(c->dt);
    unsigned char *h = malloc(one * PARTS);
    for (int i = 0; i < PARTS; i++) {
        cudaMemcpy(h + i * one, c->dout[i], (size_t)(c->M * c->N) * deft_dtype_size(c->dt), cudaMemcpyDeviceToHost);
        cudaMemcpy(h + i * one + (size_t)(c->M * c->N) * deft_dtype_size(c->dt), c->dgrad[i],
                   (size_t)c->N * deft_dtype_size(c->dt), cudaMemcpyDeviceToHost);
    }
    return h;
}

/* After an eager run, the batch captured into a CUDA Graph and replayed gives the eager run's bits. */
static void check_captured(batch_case *c, unsigned flags, cudaStream_t st, const char *what) {
    deft_testing_mm_part p[PARTS];
    parts_of(c, p);
    unsigned char *eager = outputs_of(c);
    poison(c);

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK_OK(deft_testing_matmul_batch(p, PARTS, st, flags));
    CHECK(cudaStreamEndCapture(st, &graph) == cudaSuccess);
    CHECK(graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    CHECK(exec && cudaGraphLaunch(exec, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess);
    unsigned char *replayed = outputs_of(c);
    const size_t bytes = (size_t)(c->M * c->N + c->N) * deft_dtype_size(c->dt) * PARTS;
    CHECK_MSG(memcmp(eager, replayed, bytes) == 0, "%s: the replay differs from the eager run", what);
    free(eager);
    free(replayed);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
}

static void test_batch_values(void) {
    const deft_dtype dts[] = {DEFT_F32, DEFT_F32, DEFT_BF16, DEFT_F16};
    const unsigned flags[] = {0, DEFT_CUDA_ALLOW_TF32, 0, 0};
    cudaStream_t st;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return;
    for (int d = 0; d < 4; d++) {
        batch_case c;
        char what[96];
        snprintf(what, sizeof what, "%s%s batch 200x264x136", deft_dtype_name(dts[d]), flags[d] ? " tf32" : "");
        if (case_make(&c, dts[d], 200, 264, 136)) {
            run_batch(&c, flags[d], 1, st, what);   /* the reference first: the batch then finds outputs of NaN */
            run_batch(&c, flags[d], 0, st, what);
            check_captured(&c, flags[d], st, what);
        }
        case_free(&c);
    }
    deft_stream_workspaces_release(0, st);
    cudaStreamDestroy(st);
}

static void test_refusals(void) {
    batch_case c;
    if (!case_make(&c, DEFT_F32, 64, 48, 32)) {
        case_free(&c);
        return;
    }
    deft_testing_mm_part p[PARTS];
    parts_of(&c, p);
    CHECK(deft_testing_matmul_batch(p, 0, NULL, 0) == DEFT_ERR_INVALID);
    CHECK(deft_testing_matmul_batch(NULL, 2, NULL, 0) == DEFT_ERR_INVALID);
    CHECK(deft_testing_matmul_batch(p, DEFT_MM_BATCH_MAX + 1, NULL, 0) == DEFT_ERR_INVALID);
    deft_testing_mm_part q[2] = {p[0], p[1]};
    const int64_t other[2] = {32, 40};   /* b with another N */
    deft_tensor *a0 = deft_testing_src(c.mm[0], 0);   /* the first product's a */
    q[1].mm = deft_matmul_t(a0, deft_input(c.g, "b2", DEFT_F32, 2, other, deft_cuda(0)), 1, 0);
    CHECK(q[1].mm && deft_testing_matmul_batch(q, 2, NULL, 0) == DEFT_ERR_INVALID);
    q[1] = p[1];
    const int64_t as[2] = {32, 64}, bs[2] = {32, 48};   /* the same shape in bf16 */
    q[1].mm = deft_matmul_t(deft_input(c.g, "a16", DEFT_BF16, 2, as, deft_cuda(0)),
                            deft_input(c.g, "b16", DEFT_BF16, 2, bs, deft_cuda(0)), 1, 0);
    CHECK(q[1].mm && deft_testing_matmul_batch(q, 2, NULL, 0) == DEFT_ERR_INVALID);
    deft_tensor *elsewhere = deft_testing_node_copy_on(c.mm[1], deft_cuda(1));   /* on a GPU this machine may lack */
    q[1].mm = elsewhere;
    CHECK(elsewhere && deft_testing_matmul_batch(q, 2, NULL, 0) == DEFT_ERR_INVALID);
    deft_testing_node_copy_free(elsewhere);
    const int64_t bt[2] = {48, 32};   /* b transposed: no bias gradient */
    deft_tensor *tb = deft_matmul_t(a0, deft_input(c.g, "bt", DEFT_F32, 2, bt, deft_cuda(0)), 1, 1);
    deft_testing_mm_part r[2] = {{tb, p[0].out, p[0].a, p[0].b, c.dgrad[0]}, {tb, p[1].out, p[1].a, p[1].b, NULL}};
    CHECK(tb && deft_testing_matmul_batch(r, 2, NULL, 0) == DEFT_ERR_INVALID);
    q[0] = p[0];
    q[1] = p[1];
    q[1].out = NULL;
    CHECK(deft_testing_matmul_batch(q, 2, NULL, 0) == DEFT_ERR_INVALID);
    case_free(&c);
}
#endif

/* ---- the plan and the training of an MLP ---- */
static int expected(int on_gpu) { return GPU.type == DEFT_CUDA ? on_gpu : 0; }

static int batched_of(const obwd_spec *s, const deft_compile_options *o, int off) {
    obwd_net n;
    if (!obwd_build(&n, s)) return -1;
    deft_program *p = obwd_compile_without(&n, o, off ? OBWD_NO_PRODUCT_BATCHES : OBWD_ALL_ON);
    const int count = p ? deft_program_batched_products(p) : -1;
    float l = 0, norm = 0;
    CHECK(!p || (obwd_run(&n, p, 0, &l, &norm) && isfinite(l) && isfinite(norm)));
    obwd_free(&n);
    return count;
}

static void test_plan(void) {
    const obwd_spec big = {.depth = 4, .batch = 256, .width = 512, .classes = 10, .device = GPU};
    const obwd_spec small = {.depth = 4, .batch = 64, .width = 256, .classes = 10, .device = GPU};
    const deft_compile_options none = {0}, tf32 = {.tf32 = 1}, obwd = {.optimizer_in_backward = 1},
                               ckpt = {.checkpoint = DEFT_CHECKPOINT_SEGMENTS}, unfused = {.no_fusion = 1};
    /* fc0..fc3's weight gradients: 2 * 256 * 512 * 512 flops each, 512 x 512 outputs; the head's is too small. */
    CHECK(batched_of(&big, &none, 0) == expected(big.depth));
    CHECK(batched_of(&big, &tf32, 0) == expected(big.depth));
    CHECK(batched_of(&big, &none, 1) == 0);
    CHECK(batched_of(&small, &none, 0) == 0);
    CHECK(batched_of(&big, &obwd, 0) == 0);
    CHECK(batched_of(&big, &ckpt, 0) == 0);
    CHECK(batched_of(&big, &unfused, 0) == 0);
}

/* The relative difference of two float arrays' norms of difference: ||a - b|| / ||b||. */
static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Net a compiled with batches, net b without: every run's loss and norm, and the parameters and optimizer state,
 * within tol of each other. */
static void test_training(const deft_compile_options *o, double tol, const char *what) {
    const obwd_spec s = {.depth = 4, .batch = 256, .width = 512, .classes = 10, .device = GPU};
    obwd_net a, b;
    if (!obwd_build(&a, &s) || !obwd_build(&b, &s)) return;
    deft_program *pa = obwd_compile_without(&a, o, OBWD_ALL_ON);
    deft_program *pb = obwd_compile_without(&b, o, OBWD_NO_PRODUCT_BATCHES);
    CHECK(!pa || deft_program_batched_products(pa) == expected(s.depth));
    for (int r = 0; pa && pb && r < 5; r++) {
        float la, lb, na, nb;
        if (!obwd_run(&a, pa, r, &la, &na) || !obwd_run(&b, pb, r, &lb, &nb)) break;
        CHECK_MSG(fabs(la - lb) <= tol * fabs(lb), "%s, run %d: loss %.9g and %.9g", what, r, (double)la, (double)lb);
        CHECK_MSG(fabs(na - nb) <= tol * fabs(nb), "%s, run %d: norm %.9g and %.9g", what, r, (double)na, (double)nb);
        size_t ba = 0, bb = 0;
        unsigned char *sa = obwd_state(&a, &ba), *sb = obwd_state(&b, &bb);
        const double d = sa && sb && ba == bb ? rel_diff((const float *)sa, (const float *)sb, ba / sizeof(float)) : 1;
        CHECK_MSG(d <= tol, "%s, run %d: parameters and state %.3g apart", what, r, d);
        free(sa);
        free(sb);
    }
    obwd_free(&a);
    obwd_free(&b);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
#ifdef DEFT_HAVE_CUDA
    if (GPU.type == DEFT_CUDA) {
        test_batch_values();
        test_refusals();
    }
#endif
    test_plan();
    const deft_compile_options graphs = {0}, eager = {.no_cuda_graphs = 1}, tf32 = {.tf32 = 1};
    test_training(&graphs, 1e-5, "f32, graphs");
    test_training(&eager, 1e-5, "f32, eager");
    test_training(&tf32, 1e-4, "tf32, graphs");
    /* Replays against eager runs, both batched: the same kernels, the same bits. */
    const obwd_spec s = {.depth = 4, .batch = 256, .width = 512, .classes = 10, .device = GPU};
    CHECK(obwd_compare_programs(&s, &graphs, &eager, 0, 4, "batched, graphs against eager") == 4);
    return deft_check_finish();
}
