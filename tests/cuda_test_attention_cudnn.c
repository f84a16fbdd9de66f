/* cuDNN's fused attention (ops/cuda/cuda_attention_cudnn.cu) against deft's own attention kernels (called directly,
 * whatever the dispatcher picks), node by node on cuda:0 with hand-fed buffers: B = 2, H = 3, T from 1 to 130 (off
 * and on multiples of 64), D = 32, 64 and 128, causal and not, bf16 and f16. For each case:
 *   forward    o and the f32 log-sum-exp past it (the backward's input) agree with deft's kernel;
 *   backward   dq, dk, dv agree with deft's kernel, reading the same forward buffer, both in the deterministic form
 *              (two runs give the same bits) and in the f32-atomics form;
 *   mixed      cuDNN's backward on cuDNN's forward buffer, and deft's backward on cuDNN's forward buffer, agree with
 *              deft's all along: the statistics follow one convention, so either half may run either kernel.
 * Tolerances, as the largest error over the largest magnitude of deft's result (cuDNN rounds the probabilities and
 * dS to the io dtype before its products, deft's kernels keep them in f32): o bf16 2e-2, f16 5e-3; lse 1e-3;
 * gradients bf16 3e-2, f16 1e-2.
 * Also: a problem first met inside a CUDA Graph capture is refused (nothing built there) and, once built eagerly,
 * captures and replays to the eager bits; f32, D = 5 and the backward at T = 1 are not usable.
 * Every plan built prints one line (engine, workspace); every refusal prints cuDNN's full text, so that one run on
 * a GPU says which descriptor or engine refused. Skips (exit 77) without a GPU or without cuDNN in the build. */
#include "deft_testing.h"
#include "check.h"
#include "ref.h"

#ifndef DEFT_HAVE_CUDA
DEFT_CHECK_MAIN_WITHOUT_CUDA
#else

#include <cuda_runtime_api.h>

#include "cuda_util.h"

enum { B = 2, H = 3 };

typedef struct att_case {
    int64_t t, d;
    int causal;
    deft_dtype dt;
    double scale;   /* 0: 1 / sqrt(D) */
} att_case;

static const att_case cases[] = {
    {1, 64, 0, DEFT_BF16, 0},    {1, 64, 1, DEFT_BF16, 0},    {2, 128, 0, DEFT_BF16, 0},   {37, 64, 1, DEFT_BF16, 0},
    {37, 64, 0, DEFT_BF16, 0.3}, {64, 64, 1, DEFT_BF16, 0},   {100, 32, 1, DEFT_BF16, 0},  {130, 64, 1, DEFT_BF16, 0},
    {130, 64, 0, DEFT_BF16, 0},  {130, 128, 1, DEFT_BF16, 0}, {37, 32, 1, DEFT_F16, 0},    {64, 64, 0, DEFT_F16, 0},
    {129, 64, 1, DEFT_F16, 0},   {130, 128, 1, DEFT_F16, 0},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static uint64_t rng = 0xc0d1a77eull;
static deft_device GPU;
static cudaStream_t st;

/* The nodes of one case: attention over q, k, v and its gradient for dout (shapes only: fed by hand). */
typedef struct att_nodes {
    deft_graph *g;
    deft_tensor *fwd, *grad;
} att_nodes;

static att_nodes att_build(const att_case *c) {
    att_nodes a = {deft_graph_new(), NULL, NULL};
    const int64_t shape[4] = {B, H, c->t, c->d};
    deft_tensor *q = deft_input(a.g, "q", c->dt, 4, shape, GPU), *k = deft_input(a.g, "k", c->dt, 4, shape, GPU);
    deft_tensor *v = deft_input(a.g, "v", c->dt, 4, shape, GPU), *dout = deft_input(a.g, "dout", c->dt, 4, shape, GPU);
    a.fwd = deft_attention(q, k, v, &(deft_attention_options){.causal = c->causal, .scale = c->scale});
    a.grad = deft_attention_grad(dout, a.fwd);
    CHECK_MSG(a.fwd && a.grad, "building the nodes: %s", deft_errmsg());
    return a;
}

/* Device buffers of one case: q, k, v, dout, and forward and gradient buffers of each run. */
enum { F_OWN, F_CUDNN, N_FWD };
enum { G_OWN, G_DET, G_DET2, G_ATOMIC, G_CUDNN_ON_CUDNN, G_OWN_ON_CUDNN, N_GRAD };
typedef struct att_bufs {
    void *in[4];   /* q, k, v, dout */
    void *fwd[N_FWD], *grad[N_GRAD];
    size_t fwd_bytes, grad_bytes;
} att_bufs;

static int att_alloc(const att_case *c, const att_nodes *a, att_bufs *b) {
    const int64_t n = B * H * c->t * c->d;
    const size_t esz = deft_dtype_size(c->dt);
    void *raw = malloc((size_t)n * esz);
    for (int i = 0; i < 4; i++) {
        const double range = i < 3 ? 1.5 : 1.0;   /* q, k, v; then dout */
        for (int64_t j = 0; j < n; j++) ref_store(raw, c->dt, j, ref_unif(&rng, -range, range));
        b->in[i] = dev_alloc((size_t)n * esz);
        if (b->in[i]) CUDA_OK(cudaMemcpy(b->in[i], raw, (size_t)n * esz, cudaMemcpyHostToDevice));
    }
    free(raw);
    b->fwd_bytes = deft_testing_node_buffer_bytes(a->fwd);
    b->grad_bytes = deft_testing_node_buffer_bytes(a->grad);
    for (int i = 0; i < N_FWD; i++) b->fwd[i] = dev_alloc(b->fwd_bytes);
    for (int i = 0; i < N_GRAD; i++) b->grad[i] = dev_alloc(b->grad_bytes);
    int ok = 1;
    for (int i = 0; i < 4; i++) ok = ok && b->in[i];
    for (int i = 0; i < N_FWD; i++) ok = ok && b->fwd[i];
    for (int i = 0; i < N_GRAD; i++) ok = ok && b->grad[i];
    CUDA_OK(cudaDeviceSynchronize());   /* the copies and fills, on the legacy stream, before st reads them */
    return ok;
}

static void att_free(att_bufs *b) {
    for (int i = 0; i < 4; i++) cudaFree(b->in[i]);
    for (int i = 0; i < N_FWD; i++) cudaFree(b->fwd[i]);
    for (int i = 0; i < N_GRAD; i++) cudaFree(b->grad[i]);
}

/* Whether cuDNN ran; prints its plan line, or the full text of its refusal. */
static int cudnn_ran(deft_status s, const deft_tensor *n, unsigned flags, const char *what) {
    static char line[8192];
    deft_cudnn_attention_describe(n, flags, line, sizeof line);
    if (s == DEFT_OK) {
        printf("    %s: %s\n", what, line);
        return 1;
    }
    printf("    %s REFUSED (%s): %s\n", what, deft_status_name(s), s == DEFT_CUDNN_ATTENTION_REFUSED ? line
                                                                                                  : deft_errmsg());
    return 0;
}

/* o and the log-sum-exp of buffer `got` against `want` (forward buffers of node fwd). */
static void compare_forward(const char *label, const att_case *c, const deft_tensor *fwd, const void *got,
                            const void *want) {
    const int64_t n = B * H * c->t * c->d, rows = B * H * c->t;
    const size_t off = deft_testing_node_extra_offset(fwd);
    char what[320];
    double *g = dev_read(got, 0, c->dt, n), *w = dev_read(want, 0, c->dt, n);
    snprintf(what, sizeof what, "%s: o", label);
    ref_close_tol(what, g, w, n, c->dt == DEFT_BF16 ? 2e-2 : 5e-3);
    free(g), free(w);
    g = dev_read(got, off, DEFT_F32, rows), w = dev_read(want, off, DEFT_F32, rows);
    snprintf(what, sizeof what, "%s: log-sum-exp", label);
    ref_close_tol(what, g, w, rows, 1e-3);
    free(g), free(w);
}

/* dq, dk and dv of gradient buffer `got` against `want`. */
static void compare_grads(const char *label, const att_case *c, const void *got, const void *want) {
    static const char *const names[3] = {"dq", "dk", "dv"};
    const int64_t n = B * H * c->t * c->d;
    const size_t part = (size_t)n * deft_dtype_size(c->dt);
    for (int i = 0; i < 3; i++) {
        char what[320];
        snprintf(what, sizeof what, "%s: %s", label, names[i]);
        double *g = dev_read(got, i * part, c->dt, n), *w = dev_read(want, i * part, c->dt, n);
        ref_close_tol(what, g, w, n, c->dt == DEFT_BF16 ? 3e-2 : 1e-2);
        free(g), free(w);
    }
}

/* Whether the first `bytes` of two device buffers hold the same bits. */
static int same_bits(const void *a, const void *b, size_t bytes) {
    void *ha = malloc(bytes), *hb = malloc(bytes);
    CUDA_OK(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost));
    const int same = memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return same;
}

static void run_backwards(const att_case *c, const att_nodes *a, att_bufs *b, const char *label, int fwd_ran) {
    const void *on_own[5] = {b->in[3], b->in[0], b->in[1], b->in[2], b->fwd[F_OWN]};
    const void *on_cudnn[5] = {b->in[3], b->in[0], b->in[1], b->in[2], b->fwd[F_CUDNN]};
    CHECK_OK(deft_cuda_attention_own(a->grad, b->grad[G_OWN], on_own, st));
    char what[256];
    snprintf(what, sizeof what, "%s backward, deterministic", label);
    if (cudnn_ran(deft_cudnn_attention(a->grad, b->grad[G_DET], on_own, st), a->grad, DEFT_CUDA_DETERMINISTIC, what)) {
        CHECK_OK(deft_cudnn_attention(a->grad, b->grad[G_DET2], on_own, st));
        CUDA_OK(cudaStreamSynchronize(st));
        compare_grads(what, c, b->grad[G_DET], b->grad[G_OWN]);
        CHECK_MSG(same_bits(b->grad[G_DET], b->grad[G_DET2], deft_testing_node_extra_offset(a->grad)),
                  "%s: two runs differ", what);
    } else {
        CHECK_MSG(0, "%s: refused", what);
    }
    snprintf(what, sizeof what, "%s backward, f32 atomics", label);
    if (cudnn_ran(deft_cudnn_attention_flags(a->grad, b->grad[G_ATOMIC], on_own, st, 0), a->grad, 0, what)) {
        CUDA_OK(cudaStreamSynchronize(st));
        compare_grads(what, c, b->grad[G_ATOMIC], b->grad[G_OWN]);
    } else {
        CHECK_MSG(0, "%s: refused", what);
    }
    if (!fwd_ran) return;
    /* either half on either kernel: the statistics cuDNN's forward wrote are those deft's backward reads */
    snprintf(what, sizeof what, "%s cuDNN backward on cuDNN's forward", label);
    CHECK_OK(deft_cudnn_attention(a->grad, b->grad[G_CUDNN_ON_CUDNN], on_cudnn, st));
    CUDA_OK(cudaStreamSynchronize(st));
    compare_grads(what, c, b->grad[G_CUDNN_ON_CUDNN], b->grad[G_OWN]);
    snprintf(what, sizeof what, "%s deft's backward on cuDNN's forward", label);
    CHECK_OK(deft_cuda_attention_own(a->grad, b->grad[G_OWN_ON_CUDNN], on_cudnn, st));
    CUDA_OK(cudaStreamSynchronize(st));
    compare_grads(what, c, b->grad[G_OWN_ON_CUDNN], b->grad[G_OWN]);
}

static void run_case(const att_case *c) {
    char label[128];
    snprintf(label, sizeof label, "%s [%d, %d, %lld, %lld]%s%s", deft_dtype_name(c->dt), B, H, (long long)c->t,
             (long long)c->d, c->causal ? " causal" : "", c->scale != 0 ? " scale 0.3" : "");
    printf("  %s\n", label);
    att_nodes a = att_build(c);
    att_bufs b;
    memset(&b, 0, sizeof b);
    if (a.fwd && a.grad && att_alloc(c, &a, &b)) {
        CHECK_MSG(deft_cudnn_attention_usable(a.fwd), "%s: the forward is not usable", label);
        const void *qkv[3] = {b.in[0], b.in[1], b.in[2]};
        CHECK_OK(deft_cuda_attention_own(a.fwd, b.fwd[F_OWN], qkv, st));
        char what[192];
        snprintf(what, sizeof what, "%s forward", label);
        const int fwd_ran = cudnn_ran(deft_cudnn_attention(a.fwd, b.fwd[F_CUDNN], qkv, st), a.fwd, 0, what);
        CUDA_OK(cudaStreamSynchronize(st));
        if (fwd_ran) compare_forward(what, c, a.fwd, b.fwd[F_CUDNN], b.fwd[F_OWN]);
        else CHECK_MSG(c->t == 1, "%s: refused", what);   /* T = 1 is cuDNN's to refuse: deft's kernel runs it */
        if (c->t >= 2) {
            run_backwards(c, &a, &b, label, fwd_ran);
        } else {
            const void *in5[5] = {b.in[3], b.in[0], b.in[1], b.in[2], b.fwd[F_OWN]};
            CHECK(!deft_cudnn_attention_usable(a.grad));
            CHECK_ERR(deft_cudnn_attention(a.grad, b.grad[G_DET], in5, st), DEFT_CUDNN_ATTENTION_REFUSED, "T >= 2");
        }
    }
    att_free(&b);
    deft_graph_free(a.g);
}

/* A problem first met inside a capture is refused (building a plan there is not allowed); built eagerly, the same
 * call captures, and the replay writes the eager run's bits. */
static void test_capture(void) {
    const att_case c = {50, 64, 1, DEFT_BF16, 0};   /* a shape no other case builds */
    att_nodes a = att_build(&c);
    att_bufs b;
    memset(&b, 0, sizeof b);
    if (a.fwd && att_alloc(&c, &a, &b)) {
        const void *qkv[3] = {b.in[0], b.in[1], b.in[2]};
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        const deft_status first = deft_cudnn_attention(a.fwd, b.fwd[F_CUDNN], qkv, st);
        CUDA_OK(cudaStreamEndCapture(st, &graph));
        if (graph) cudaGraphDestroy(graph), graph = NULL;
        CHECK_MSG(first == DEFT_CUDNN_ATTENTION_REFUSED && strstr(deft_errmsg(), "capture"),
                  "first met in a capture: %s, %s", deft_status_name(first), deft_errmsg());
        /* eager into one buffer, the replay into the other */
        if (cudnn_ran(deft_cudnn_attention(a.fwd, b.fwd[F_OWN], qkv, st), a.fwd, 0, "capture case, eager")) {
            CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            const deft_status s = deft_cudnn_attention(a.fwd, b.fwd[F_CUDNN], qkv, st);
            CUDA_OK(cudaStreamEndCapture(st, &graph));
            CHECK_MSG(s == DEFT_OK, "inside a capture, the plan built: %s", deft_errmsg());
            if (graph) CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
            if (exec) CUDA_OK(cudaGraphLaunch(exec, st));
            CUDA_OK(cudaStreamSynchronize(st));
            CHECK_MSG(same_bits(b.fwd[F_CUDNN], b.fwd[F_OWN], b.fwd_bytes), "the replay differs from the eager run");
            if (exec) cudaGraphExecDestroy(exec);
            if (graph) cudaGraphDestroy(graph);
        } else {
            CHECK_MSG(0, "capture case: refused eagerly");
        }
    }
    att_free(&b);
    deft_graph_free(a.g);
}

/* What cuDNN's engines never take is said before any cuDNN call. */
static void test_not_usable(void) {
    deft_graph *g = deft_graph_new();
    const int64_t f32s[4] = {1, 2, 16, 64}, odd[4] = {1, 2, 16, 5};
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, f32s, GPU), *y = deft_input(g, "y", DEFT_BF16, 4, odd, GPU);
    deft_tensor *ax = deft_attention(x, x, x, NULL), *ay = deft_attention(y, y, y, NULL);
    CHECK(ax && ay);
    if (ax && ay) {
        CHECK(!deft_cudnn_attention_usable(ax));
        CHECK(!deft_cudnn_attention_usable(ay));
        const void *in[3] = {NULL, NULL, NULL};
        CHECK_ERR(deft_cudnn_attention(ay, NULL, in, st), DEFT_CUDNN_ATTENTION_REFUSED, "multiples of 8");
    }
    deft_graph_free(g);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    if (GPU.type != DEFT_CUDA) {
        printf("cuDNN's attention needs a GPU: skipped\n");
        return DEFT_CHECK_SKIP;
    }
    deft_graph *g = deft_graph_new();
    const int64_t shape[4] = {1, 1, 8, 64};
    deft_tensor *x = deft_input(g, "x", DEFT_BF16, 4, shape, GPU);
    const int usable = deft_cudnn_attention_usable(deft_attention(x, x, x, NULL));
    deft_graph_free(g);
    if (!usable) {
        printf("cuDNN's fused attention is not usable here (no cuDNN in the build, a runtime cuDNN older than these "
               "graphs need, or a GPU before sm80): skipped\n");
        return DEFT_CHECK_SKIP;
    }
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t i = 0; i < N_CASES; i++) run_case(&cases[i]);
    test_capture();
    test_not_usable();
    CUDA_OK(cudaStreamSynchronize(st));
    deft_cudnn_attention_release(0);
    deft_stream_workspaces_release(0, st);
    cudaStreamDestroy(st);
    return deft_check_finish();
}

#endif
