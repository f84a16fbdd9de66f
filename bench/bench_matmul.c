/* bench_matmul: one large square matrix product C[S, S] = A B compiled by deft, beside the same product called from
 * cuBLAS directly in this executable, in fp32, TF32, bf16 and fp16, for S = 8192 and 10000. bench/peers/matmul.py
 * runs it in PyTorch (torch.matmul) and prints the same names with "torch" in place of "deft"; scripts/bench_matmul.sh
 * runs both and prints the ratios. One figure per line: `<name> <value> <unit>`, names `matmul.<S>.<precision>.*`.
 *
 *   ./bench_matmul [--size S] [--precision fp32|tf32|bf16|fp16]    (default: both sizes, every precision)
 *
 * deft: a graph of two inputs [S, S] on cuda:0 and deft_matmul, compiled (with `.tf32 = 1` for tf32), fed once
 * with uniform values in [-1, 1) (a seeded xorshift, never zeros); the first two runs are eager and the capture of
 * the CUDA Graph, then every run is a replay of one matmul node.
 * cuBLAS directly: the best of cublasGemmEx (default algorithm) and each of cublasLtMatmul's first 8 heuristic
 * algorithms (32 MiB workspace), timed the same way, on the same values: the best rate cuBLAS reaches called
 * directly. fp32 computes in CUBLAS_COMPUTE_32F, tf32 in CUBLAS_COMPUTE_32F_FAST_TF32, bf16 and fp16 in f32.
 *
 * Timing, the same for both: 2 warm-up calls, 3 to choose N so that N calls take about 200 ms, then 7 repeats of a
 * host clock around N calls closed by cudaDeviceSynchronize; the figure is the median of (time / N), with the fastest
 * and slowest repeat, and TFLOP/s = 2 S^3 / time. deft_vs_cublas_relerr is the relative norm difference of deft's
 * output and cuBLAS's on the same inputs (a check that both computed the same product). Without a GPU (or a build
 * without CUDA) the bench says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deft.h"

static const char help[] =
    "usage: bench_matmul [--size S] [--precision fp32|tf32|bf16|fp16]\n"
    "\n"
    "One large square matrix product C[S, S] = A B compiled by deft, beside the same product called from cuBLAS\n"
    "directly. One figure per line: <name> <value> <unit>. Without a GPU it says so.\n"
    "\n"
    "  --size S                         the matrices' side (default: both 8192 and 10000)\n"
    "  --precision fp32|tf32|bf16|fp16  one precision (default: every one)\n"
    "  -h, --help                       this help\n";

/* --help (or -h) answers on stdout with exit 0, with or without CUDA. */
static void matmul_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            exit(0);
        }
}

#ifdef DEFT_HAVE_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#define REPEATS 7
#define TARGET_REPEAT_S 0.2
#define LT_ALGOS 8
#define WORKSPACE_BYTES ((size_t)32 << 20)

static const char *prog = "bench_matmul";

typedef enum { P_FP32, P_TF32, P_BF16, P_FP16, P_COUNT } precision;
static const char *const p_names[P_COUNT] = {"fp32", "tf32", "bf16", "fp16"};

static void die(const char *what, const char *why) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, why);
    exit(1);
}
#define DEFT_CHECK(call)                                   \
    do {                                                   \
        if ((call) != DEFT_OK) die(#call, deft_errmsg());  \
    } while (0)
#define CUDA_CHECK(call)                                        \
    do {                                                        \
        cudaError_t e_ = (call);                                \
        if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_)); \
    } while (0)
#define CUBLAS_CHECK(call)                                          \
    do {                                                            \
        cublasStatus_t s_ = (call);                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) die(#call, cublasGetStatusString(s_)); \
    } while (0)

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) die("malloc", "out of host memory");
    return p;
}

static deft_dtype dtype_of(precision p) { return p == P_BF16 ? DEFT_BF16 : p == P_FP16 ? DEFT_F16 : DEFT_F32; }
static cudaDataType_t cuda_type_of(precision p) {
    return p == P_BF16 ? CUDA_R_16BF : p == P_FP16 ? CUDA_R_16F : CUDA_R_32F;
}
static cublasComputeType_t compute_of(precision p) {
    return p == P_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* n uniform values in [-1, 1) stored in the precision's dtype (a seeded xorshift64*). */
static void *host_values(precision p, int64_t n, uint64_t seed) {
    const deft_dtype dt = dtype_of(p);
    void *h = xmalloc((size_t)n * deft_dtype_size(dt));
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        const float v = (float)((double)((s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        if (dt == DEFT_F32) ((float *)h)[i] = v;
        else ((uint16_t *)h)[i] = dt == DEFT_BF16 ? deft_f32_to_bf16(v) : deft_f32_to_f16(v);
    }
    return h;
}

static double load(const void *h, deft_dtype dt, int64_t i) {
    if (dt == DEFT_F32) return ((const float *)h)[i];
    const uint16_t u = ((const uint16_t *)h)[i];
    return dt == DEFT_BF16 ? deft_bf16_to_f32(u) : deft_f16_to_f32(u);
}

/* ---- the timing loop, shared by every contender ---- */
typedef void (*call_fn)(void *ctx);

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median, fastest and slowest seconds per call over REPEATS repeats of N calls. */
static void time_calls(call_fn f, void *ctx, double out[3]) {
    for (int i = 0; i < 2; i++) f(ctx);
    CUDA_CHECK(cudaDeviceSynchronize());
    double t0 = seconds();
    for (int i = 0; i < 3; i++) f(ctx);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double per = (seconds() - t0) / 3;
    const int n = per > 0 ? (int)fmax(1.0, fmin(1000.0, TARGET_REPEAT_S / per)) : 1000;
    double t[REPEATS];
    for (int r = 0; r < REPEATS; r++) {
        CUDA_CHECK(cudaDeviceSynchronize());
        t0 = seconds();
        for (int i = 0; i < n; i++) f(ctx);
        CUDA_CHECK(cudaDeviceSynchronize());
        t[r] = (seconds() - t0) / n;
    }
    qsort(t, REPEATS, sizeof t[0], cmp_double);
    out[0] = t[REPEATS / 2];
    out[1] = t[0];
    out[2] = t[REPEATS - 1];
}

static void report(int64_t S, precision p, const char *who, const double t[3]) {
    const double flop = 2.0 * (double)S * (double)S * (double)S;
    printf("matmul.%lld.%s.%s_ms %.4f ms\n", (long long)S, p_names[p], who, t[0] * 1e3);
    printf("matmul.%lld.%s.%s_ms_min %.4f ms\n", (long long)S, p_names[p], who, t[1] * 1e3);
    printf("matmul.%lld.%s.%s_ms_max %.4f ms\n", (long long)S, p_names[p], who, t[2] * 1e3);
    printf("matmul.%lld.%s.%s_tflops %.2f TFLOP/s\n", (long long)S, p_names[p], who, flop / t[0] / 1e12);
    fflush(stdout);
}

/* ---- deft: a compiled program of one matmul ---- */
static void deft_call(void *ctx) { DEFT_CHECK(deft_program_run((deft_program *)ctx)); }

/* Times deft and leaves its output in host_out. */
static void bench_deft(int64_t S, precision p, const void *ha, const void *hb, void *host_out) {
    const deft_dtype dt = dtype_of(p);
    const size_t bytes = (size_t)(S * S) * deft_dtype_size(dt);
    deft_graph *g = deft_graph_new();
    const int64_t shape[2] = {S, S};
    deft_tensor *a = deft_input(g, "a", dt, 2, shape, deft_cuda(0));
    deft_tensor *b = deft_input(g, "b", dt, 2, shape, deft_cuda(0));
    deft_tensor *c = deft_matmul(a, b);
    if (!c) die("building the graph", deft_graph_errmsg(g));
    deft_compile_options co;
    memset(&co, 0, sizeof co);
    co.tf32 = p == P_TF32;
    deft_program *prog_ = deft_compile(g, &c, 1, &co);
    if (!prog_) die("deft_compile", deft_errmsg());
    DEFT_CHECK(deft_program_feed(prog_, a, ha, bytes));
    DEFT_CHECK(deft_program_feed(prog_, b, hb, bytes));
    double t[3];
    time_calls(deft_call, prog_, t);
    report(S, p, "deft", t);
    printf("matmul.%lld.%s.deft_graph_replays %lld runs\n", (long long)S, p_names[p],
           (long long)deft_program_graph_replays(prog_));
    DEFT_CHECK(deft_program_read(prog_, c, host_out, bytes));
    deft_graph_free(g);
}

/* ---- cuBLAS called directly ---- */
typedef struct direct {
    int64_t S;
    precision p;
    void *a, *b, *c, *ws;
    cublasHandle_t h;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout;
    const cublasLtMatmulAlgo_t *algo;
} direct;

static const float one = 1.0f, zero = 0.0f;

/* Row-major C = A B as column-major C^T = B^T A^T: B first (as the library does). */
static void gemmex_call(void *ctx) {
    direct *d = ctx;
    const int n = (int)d->S;
    const cudaDataType_t t = cuda_type_of(d->p);
    CUBLAS_CHECK(cublasGemmEx(d->h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, d->b, t, n, d->a, t, n, &zero, d->c, t, n,
                              compute_of(d->p), CUBLAS_GEMM_DEFAULT));
}

static void lt_call(void *ctx) {
    direct *d = ctx;
    CUBLAS_CHECK(cublasLtMatmul(d->lt, d->desc, &one, d->b, d->layout, d->a, d->layout, &zero, d->c, d->layout, d->c,
                                d->layout, d->algo, d->ws, WORKSPACE_BYTES, 0));
}

/* The best median of cublasGemmEx and the Lt heuristic's first LT_ALGOS algorithms; leaves C in host_out. */
static void bench_cublas(int64_t S, precision p, const void *ha, const void *hb, void *host_out) {
    const size_t bytes = (size_t)(S * S) * deft_dtype_size(dtype_of(p));
    direct d;
    memset(&d, 0, sizeof d);
    d.S = S;
    d.p = p;
    CUDA_CHECK(cudaMalloc(&d.a, bytes));
    CUDA_CHECK(cudaMalloc(&d.b, bytes));
    CUDA_CHECK(cudaMalloc(&d.c, bytes));
    CUDA_CHECK(cudaMalloc(&d.ws, WORKSPACE_BYTES));
    CUDA_CHECK(cudaMemcpy(d.a, ha, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d.b, hb, bytes, cudaMemcpyHostToDevice));
    CUBLAS_CHECK(cublasCreate(&d.h));
    CUBLAS_CHECK(cublasSetWorkspace(d.h, d.ws, WORKSPACE_BYTES));
    double best[3], t[3];
    time_calls(gemmex_call, &d, best);
    const char *best_name = "cublasGemmEx";

    CUBLAS_CHECK(cublasLtCreate(&d.lt));
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.desc, compute_of(p), CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.layout, cuda_type_of(p), (uint64_t)S, (uint64_t)S, S));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = WORKSPACE_BYTES;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res[LT_ALGOS];
    int got = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(d.lt, d.desc, d.layout, d.layout, d.layout, d.layout, pref, LT_ALGOS,
                                                res, &got));
    static char names[LT_ALGOS][32];
    for (int i = 0; i < got; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        d.algo = &res[i].algo;
        time_calls(lt_call, &d, t);
        if (t[0] < best[0]) {
            memcpy(best, t, sizeof best);
            snprintf(names[i], sizeof names[i], "cublasLtMatmul#%d", i);
            best_name = names[i];
        }
    }
    report(S, p, "cublas", best);
    printf("# matmul.%lld.%s: cuBLAS's best is %s (of %d Lt algorithms and cublasGemmEx)\n", (long long)S,
           p_names[p], best_name, got);
    /* The output of the last contender timed; every one computes the same product. */
    CUDA_CHECK(cudaMemcpy(host_out, d.c, bytes, cudaMemcpyDeviceToHost));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(d.layout);
    cublasLtMatmulDescDestroy(d.desc);
    cublasLtDestroy(d.lt);
    cublasDestroy(d.h);
    cudaFree(d.a);
    cudaFree(d.b);
    cudaFree(d.c);
    cudaFree(d.ws);
}

static double rel_diff(const void *x, const void *y, deft_dtype dt, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double a = load(x, dt, i), b = load(y, dt, i);
        num += (a - b) * (a - b);
        den += b * b;
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static void bench_one(int64_t S, precision p) {
    const deft_dtype dt = dtype_of(p);
    const size_t bytes = (size_t)(S * S) * deft_dtype_size(dt);
    void *ha = host_values(p, S * S, 0x9E3779B97F4A7C15ull), *hb = host_values(p, S * S, 0xD1B54A32D192ED03ull);
    void *out_deft = xmalloc(bytes), *out_cublas = xmalloc(bytes);
    printf("matmul.%lld.%s.gflop %.3f GFLOP\n", (long long)S, p_names[p],
           2.0 * (double)S * (double)S * (double)S / 1e9);
    bench_deft(S, p, ha, hb, out_deft);
    bench_cublas(S, p, ha, hb, out_cublas);
    printf("matmul.%lld.%s.deft_vs_cublas_relerr %.3g x\n", (long long)S, p_names[p],
           rel_diff(out_deft, out_cublas, dt, S * S));
    free(ha);
    free(hb);
    free(out_deft);
    free(out_cublas);
}

int main(int argc, char **argv) {
    int64_t size = 0;
    int only = -1;
    matmul_help(argc, argv);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            size = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            const char *v = argv[++i];
            for (int k = 0; k < P_COUNT; k++)
                if (!strcmp(v, p_names[k])) only = k;
            if (only < 0) die("--precision", "expected fp32, tf32, bf16 or fp16");
        } else {
            fprintf(stderr, "usage: %s [--size S] [--precision fp32|tf32|bf16|fp16]\n", prog);
            return 2;
        }
    }
    if (deft_cuda_device_count() == 0) {
        printf("# %s: no usable GPU: skipped\n", prog);
        return 0;
    }
    char name[256];
    if (deft_device_name(deft_cuda(0), name, sizeof name) == DEFT_OK) printf("# %s on %s\n", prog, name);
    CUDA_CHECK(cudaSetDevice(0));
    const int64_t sizes[2] = {8192, 10000};
    for (int si = 0; si < 2; si++) {
        const int64_t S = size > 0 ? size : sizes[si];
        for (int p = 0; p < P_COUNT; p++)
            if (only < 0 || only == p) bench_one(S, (precision)p);
        if (size > 0) break;
    }
    return 0;
}

#else

int main(int argc, char **argv) {
    matmul_help(argc, argv);
    for (int i = 1; i < argc; i += 2)   /* bad usage is still an error here, as in a build with CUDA */
        if ((strcmp(argv[i], "--size") && strcmp(argv[i], "--precision")) || i + 1 == argc) {
            fprintf(stderr, "usage: bench_matmul [--size S] [--precision fp32|tf32|bf16|fp16]\n");
            return 2;
        }
    printf("# bench_matmul: built without CUDA: skipped\n");
    return 0;
}

#endif
