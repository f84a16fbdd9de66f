/* bench_graph_replay: does work run eagerly on a GPU leave an already instantiated CUDA Graph slower to replay? The
 * probe of issue 29's "second program in one process runs slower" effect, without deft: in bench_mlp_train
 * --probe-other, one eager step of another deft program leaves the first program's replayed step about 15 us slower
 * for the rest of the process (bench/RESULTS.md, twenty-fourth round). Here the same kinds of eager work that such a
 * first step queues are tried one at a time against graphs of plain CUDA work, each graph timed before and after:
 *
 *   kernels   a graph of 200 launches of a small elementwise kernel;
 *   products  a graph of 200 cuBLASLt products, f32, 512 x 512 x 512, the heuristic's first algorithm;
 *   beta1     the same products accumulating into their output (beta = 1);
 *   bias, relu_bias   the same products with cuBLASLt's bias and ReLU-with-bias epilogues;
 *   bgradb, bgrada    with its bias-gradient epilogues (an operand transposed where the heuristic needs it), whose
 *             reduction cuBLASLt may run as a kernel of its own.
 * Each variant's first eager run is preceded and followed by a replay of the first two graphs.
 *   distinct  a graph of 43 launches of 43 different kernels (as many as the mid MLP's step has), timed after the
 *             same kernels run eagerly again, then after kernels the process never ran before run eagerly for the
 *             first time (21, then 64 more): whether the number of kernels a process has run slows a replay.
 *
 * After each eager action (another kernel, the same kernel, the same product, the same product from a new cuBLASLt
 * handle, the same kernel on another stream, a carveout set on the kernel, a kernel with a large stack frame) every
 * graph is replayed: 3 warm-up replays, then 21 replays each between two CUDA events, the median printed as
 * `graph_replay.<graph>_<stage> <us> us`. Without a GPU it says so and exits 0. */
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <cublasLt.h>
#include <cuda_runtime.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            printf("# bench_graph_replay: %s: %s\n", #x, cudaGetErrorString(e_));              \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define CB(x)                                                                                  \
    do {                                                                                       \
        cublasStatus_t e_ = (x);                                                               \
        if (e_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            printf("# bench_graph_replay: %s: cuBLAS status %d\n", #x, (int)e_);               \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

enum { N_ELEMS = 1 << 16, CHAIN = 200, SIDE = 512, WARMUP = 3, REPLAYS = 21 };

__global__ void k_axpy(float *y, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.999f * y[i] + x[i];
}
__global__ void k_other(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += 1.0f;
}

/* Local memory the driver must reserve for every resident thread: the context's local memory grows at its first
 * launch. */
__global__ void k_stack(float *y, int n, int j) {
    float frame[1024];
    for (int i = 0; i < 1024; i++) frame[i] = y[(i * 7 + threadIdx.x) % n];
    y[threadIdx.x % n] = frame[j & 1023];
}

/* DISTINCT kernels that differ only in a constant: each its own function to the driver. */
enum { DISTINCT = 128, DISTINCT_GRAPH = 43, DISTINCT_ELEMS = 1 << 14 };
template <int K>
__global__ void k_distinct(float *y, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (0.999f - 1e-6f * K) * y[i] + x[i];
}
typedef void (*distinct_fn)(float *, const float *, int);
template <int... K>
static constexpr std::array<distinct_fn, sizeof...(K)> distinct_table(std::integer_sequence<int, K...>) {
    return {{&k_distinct<K>...}};
}
static const std::array<distinct_fn, DISTINCT> distinct = distinct_table(std::make_integer_sequence<int, DISTINCT>{});

static cudaStream_t stream;

static void distinct_run(int from, int to, float *y, const float *x) {
    for (int k = from; k < to; k++) distinct[k]<<<DISTINCT_ELEMS / 256, 256, 0, stream>>>(y, x, DISTINCT_ELEMS);
    CK(cudaGetLastError());
}

/* The median replay of `ge` in microseconds. */
static double time_graph(cudaGraphExec_t ge) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double us[REPLAYS];
    for (int r = 0; r < WARMUP; r++) CK(cudaGraphLaunch(ge, stream));
    for (int r = 0; r < REPLAYS; r++) {
        CK(cudaEventRecord(a, stream));
        CK(cudaGraphLaunch(ge, stream));
        CK(cudaEventRecord(b, stream));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        us[r] = ms * 1000.0;
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(us, us + REPLAYS);
    return us[REPLAYS / 2];
}

/* One cuBLASLt product C = A B (+ beta C) on SIDE x SIDE f32 matrices, with an optional epilogue. */
struct product {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout;
    cublasLtMatmulAlgo_t algo;
    void *workspace;
    size_t workspace_bytes;
    float beta;
};

static void product_release_descriptors(product *p) {
    CB(cublasLtMatrixLayoutDestroy(p->layout));
    CB(cublasLtMatmulDescDestroy(p->desc));
    CB(cublasLtDestroy(p->h));
}

/* Returns false, holding nothing, when the heuristic offers no algorithm (an epilogue these layouts do not take);
 * the workspace is allocated only for an algorithm found, so that a refused try leaves the device as it was. */
static bool product_setup(product *p, cublasLtEpilogue_t epilogue, const float *bias, float beta,
                          cublasOperation_t ta = CUBLAS_OP_N, cublasOperation_t tb = CUBLAS_OP_N) {
    CB(cublasLtCreate(&p->h));
    CB(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CB(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        CB(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
        CB(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    CB(cublasLtMatrixLayoutCreate(&p->layout, CUDA_R_32F, SIDE, SIDE, SIDE));
    p->workspace_bytes = (size_t)32 << 20;
    p->beta = beta;
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &p->workspace_bytes,
                                            sizeof p->workspace_bytes));
    cublasLtMatmulHeuristicResult_t r;
    int got = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(p->h, p->desc, p->layout, p->layout, p->layout,
                                                            p->layout, pref, 1, &r, &got);
    CB(cublasLtMatmulPreferenceDestroy(pref));
    if (s != CUBLAS_STATUS_SUCCESS || got < 1) {
        product_release_descriptors(p);
        return false;
    }
    p->algo = r.algo;
    CK(cudaMalloc(&p->workspace, p->workspace_bytes));
    return true;
}

static void product_run(const product *p, const float *a, const float *b, float *c) {
    const float one = 1;
    CB(cublasLtMatmul(p->h, p->desc, &one, a, p->layout, b, p->layout, &p->beta, c, p->layout, c, p->layout,
                      &p->algo, p->workspace, p->workspace_bytes, stream));
}

static cudaGraphExec_t capture_products(const product *p, const float *a, const float *b, float *c) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < CHAIN; i++) product_run(p, a, b, c);
    CK(cudaStreamEndCapture(stream, &g));
    CK(cudaGraphInstantiate(&e, g, 0));
    return e;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts("usage: bench_graph_replay\n\nWhether eager work slows the replay of CUDA Graphs instantiated "
                 "before it\n(kernels, cuBLASLt products, with beta 1 and with epilogues), without deft.\nOne "
                 "figure per line: <name> <value> <unit>. Without a GPU it says so.");
            return 0;
        }
        fprintf(stderr, "usage: bench_graph_replay [--help]\n");
        return 2;
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
        printf("# bench_graph_replay: no usable GPU: skipped\n");
        return 0;
    }
    float *x, *y, *z, *a, *b, *c, *bias;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&x, N_ELEMS * 4));
    CK(cudaMalloc(&y, N_ELEMS * 4));
    CK(cudaMalloc(&z, N_ELEMS * 4));
    CK(cudaMalloc(&a, SIDE * SIDE * 4));
    CK(cudaMalloc(&b, SIDE * SIDE * 4));
    CK(cudaMalloc(&c, SIDE * SIDE * 4));
    CK(cudaMalloc(&bias, SIDE * 4));
    CK(cudaMemset(x, 0, N_ELEMS * 4));
    CK(cudaMemset(y, 0, N_ELEMS * 4));
    CK(cudaMemset(z, 0, N_ELEMS * 4));
    CK(cudaMemset(a, 0, SIDE * SIDE * 4));
    CK(cudaMemset(b, 0, SIDE * SIDE * 4));
    CK(cudaMemset(bias, 0, SIDE * 4));
    product plain;
    if (!product_setup(&plain, CUBLASLT_EPILOGUE_DEFAULT, NULL, 0.0f)) {
        printf("# bench_graph_replay: cuBLASLt offers no algorithm for the plain product\n");
        return 1;
    }
    /* Both graphs' work runs eagerly once before its capture, as a program's first step does. */
    k_axpy<<<N_ELEMS / 256, 256, 0, stream>>>(y, x, N_ELEMS);
    product_run(&plain, a, b, c);
    CK(cudaStreamSynchronize(stream));
    cudaGraph_t kg;
    cudaGraphExec_t kernels;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < CHAIN; i++) k_axpy<<<N_ELEMS / 256, 256, 0, stream>>>(y, x, N_ELEMS);
    CK(cudaStreamEndCapture(stream, &kg));
    CK(cudaGraphInstantiate(&kernels, kg, 0));
    cudaGraphExec_t products = capture_products(&plain, a, b, c);

#define SHOW(stage)                                                                                     \
    do {                                                                                                \
        printf("graph_replay.kernels_%s %.2f us\n", stage, time_graph(kernels));                        \
        printf("graph_replay.products_%s %.2f us\n", stage, time_graph(products));                      \
    } while (0)
    SHOW("before");
    SHOW("again");
    k_other<<<N_ELEMS / 256, 256, 0, stream>>>(z, N_ELEMS);
    CK(cudaStreamSynchronize(stream));
    SHOW("after_other_kernel_eager");
    k_axpy<<<N_ELEMS / 256, 256, 0, stream>>>(z, x, N_ELEMS);
    CK(cudaStreamSynchronize(stream));
    SHOW("after_same_kernel_eager");
    product_run(&plain, a, b, c);
    CK(cudaStreamSynchronize(stream));
    SHOW("after_same_product_eager");
    product fresh;
    if (product_setup(&fresh, CUBLASLT_EPILOGUE_DEFAULT, NULL, 0.0f)) {
        product_run(&fresh, a, b, c);
        CK(cudaStreamSynchronize(stream));
        SHOW("after_same_product_new_handle");
    } else {
        printf("# bench_graph_replay: a new handle's heuristic offers no algorithm: skipped\n");
    }
    CK(cudaFuncSetAttribute(k_axpy, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
    SHOW("after_carveout_set");
    cudaStream_t other;
    CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    k_axpy<<<N_ELEMS / 256, 256, 0, other>>>(z, x, N_ELEMS);
    CK(cudaStreamSynchronize(other));
    SHOW("after_same_kernel_other_stream");
    k_stack<<<1, 32, 0, stream>>>(z, N_ELEMS, 5);
    CK(cudaStreamSynchronize(stream));
    SHOW("after_stack_kernel");

    /* Kernels the process never ran before, run eagerly after a graph of many different kernels was made. */
    distinct_run(0, DISTINCT_GRAPH, y, x);
    CK(cudaStreamSynchronize(stream));
    cudaGraph_t dg;
    cudaGraphExec_t dgraph;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    distinct_run(0, DISTINCT_GRAPH, y, x);
    CK(cudaStreamEndCapture(stream, &dg));
    CK(cudaGraphInstantiate(&dgraph, dg, 0));
    printf("graph_replay.distinct_before %.2f us\n", time_graph(dgraph));
    distinct_run(0, DISTINCT_GRAPH, z, x);
    CK(cudaStreamSynchronize(stream));
    printf("graph_replay.distinct_after_same_kernels %.2f us\n", time_graph(dgraph));
    distinct_run(DISTINCT_GRAPH, DISTINCT_GRAPH + 21, z, x);
    CK(cudaStreamSynchronize(stream));
    printf("graph_replay.distinct_after_21_new_kernels %.2f us\n", time_graph(dgraph));
    printf("graph_replay.kernels_after_21_new_kernels %.2f us\n", time_graph(kernels));
    distinct_run(DISTINCT_GRAPH + 21, DISTINCT, z, x);
    CK(cudaStreamSynchronize(stream));
    printf("graph_replay.distinct_after_%d_new_kernels %.2f us\n", DISTINCT - DISTINCT_GRAPH, time_graph(dgraph));
    printf("graph_replay.kernels_after_%d_new_kernels %.2f us\n", DISTINCT - DISTINCT_GRAPH, time_graph(kernels));

    /* Products accumulating into their output, then with epilogues (the bias gradients with whichever operand
     * transposed that the heuristic takes): the graphs made before are timed before and after each variant's
     * first eager run, then the variant is captured and run eagerly once more. */
    struct variant {
        const char *name;
        cublasLtEpilogue_t epilogue;
        float beta;
    } const variants[] = {{"beta1", CUBLASLT_EPILOGUE_DEFAULT, 1.0f},
                          {"bias", CUBLASLT_EPILOGUE_BIAS, 0.0f},
                          {"relu_bias", CUBLASLT_EPILOGUE_RELU_BIAS, 0.0f},
                          {"bgradb", CUBLASLT_EPILOGUE_BGRADB, 0.0f},
                          {"bgrada", CUBLASLT_EPILOGUE_BGRADA, 0.0f}};
    static const cublasOperation_t ops[2] = {CUBLAS_OP_N, CUBLAS_OP_T};
    for (const variant &v : variants) {
        product p;
        bool found = false;
        for (int t = 0; t < 4 && !found; t++) found = product_setup(&p, v.epilogue, bias, v.beta, ops[t / 2], ops[t % 2]);
        if (!found) {
            printf("# bench_graph_replay: %s: cuBLASLt offers no algorithm for these layouts: skipped\n", v.name);
            continue;
        }
        printf("graph_replay.%s_kernels_before_first %.2f us\n", v.name, time_graph(kernels));
        printf("graph_replay.%s_products_before_first %.2f us\n", v.name, time_graph(products));
        product_run(&p, a, b, c);
        CK(cudaStreamSynchronize(stream));
        printf("graph_replay.%s_kernels_after_first %.2f us\n", v.name, time_graph(kernels));
        printf("graph_replay.%s_products_after_first %.2f us\n", v.name, time_graph(products));
        cudaGraphExec_t g = capture_products(&p, a, b, c);
        printf("graph_replay.%s_before %.2f us\n", v.name, time_graph(g));
        product_run(&p, a, b, c);
        CK(cudaStreamSynchronize(stream));
        printf("graph_replay.%s_after_eager %.2f us\n", v.name, time_graph(g));
    }
    return 0;
}
