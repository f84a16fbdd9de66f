/* deft_attention on cuda:0 (ops/cuda/cuda_attention.cu, cuda_attention_mma.cu) against the plain reference that materialises the T x T
 * probabilities in double (tests/attention_ref.h): the output and dq, dk, dv of loss = sum(out * r), causal and
 * not, T = 1, T off the kernels' tiles (16 query rows forward, 8 backward, 32 keys) and T = 1000, D = 5, 64 and 128.
 * Tolerances, as the largest error over the largest reference magnitude (at least 0.01):
 *   f32                   1e-4   (float products and sums; the log-sum-exp saved in f32)
 *   bf16 under autocast   3e-2   (q, k, v and the output gradient cast to bf16, each result rounded to bf16 once)
 *   f16 (f16 parameters)  5e-3
 * The f16 and bf16 cases run on each kernel (debug knob ATTENTION_KERNEL: 1 deft's plain ones, 2 its tensor-core
 * ones, which take head sizes 32, 64, 96 and 128 and leave the others to the plain kernels; their tiles are 64 rows,
 * so T = 1, 33, 37, 45, 77, 130 and 1000 end off a tile; 3 cuDNN's fused attention, where it takes the shape).
 * Inputs are rounded to the dtype first, so that the reference sees exactly what the kernels see. Also: the backward
 * is deterministic (two runs, the same bits), f64 on a GPU is refused at compile naming the op, and the plan of a
 * causal step at T = 1024 holds no T x T buffer. Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it
 * on the CPU's kernel instead. */
#include "check.h"
#include "deft_testing.h"
#include "ref.h"
#include "attention_ref.h"
#include "attention_run.h"

static uint64_t rng = 0xa77e6b0full;
static deft_device GPU;

/* One case on the GPU against the reference; returns the result (caller frees) for further checks. */
static att_result gpu_case(const att_shape *s, deft_dtype param_dt, deft_dtype autocast, double tol) {
    const deft_dtype round_dt = autocast ? autocast : param_dt;
    double *qkv[3], *r;
    att_random(&rng, s, round_dt, 1.5, qkv, &r);
    const int64_t n = att_numel(s);
    double *want[4];
    for (int i = 0; i < 4; i++) want[i] = malloc((size_t)n * sizeof(double) + 8);
    att_ref_forward(s, qkv[0], qkv[1], qkv[2], want[0]);
    att_ref_backward(s, qkv[0], qkv[1], qkv[2], r, want[1], want[2], want[3]);
    const deft_compile_options opts = {.autocast = autocast};
    att_result res;
    if (att_run(s, param_dt, GPU, &opts, (const double *const *)qkv, r, 1, &res)) {
        double *got[4] = {res.out, res.dq, res.dk, res.dv};
        static const char *const names[4] = {"out", "dq", "dk", "dv"};
        for (int i = 0; i < 4; i++) {
            const double e = att_rel_err(got[i], want[i], n);
            CHECK_MSG(e <= tol, "%s%s [%lld, %lld, %lld, %lld] causal %d: %s off by %.3g (tol %g)",
                      deft_dtype_name(param_dt), autocast ? " autocast bf16" : "", (long long)s->b, (long long)s->h,
                      (long long)s->t, (long long)s->d, s->causal, names[i], e, tol);
        }
    }
    for (int i = 0; i < 4; i++) free(want[i]);
    att_random_free(qkv, r);
    return res;
}

static const att_shape shapes[] = {
    {1, 1, 1, 64, 0, 0},   {2, 3, 37, 64, 0, 0},  {1, 2, 1000, 64, 0, 0}, {1, 1, 1000, 128, 0, 0},
    {2, 2, 77, 128, 0, 0}, {1, 1, 50, 5, 0, 0.5}, {3, 1, 33, 32, 0, 0},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void test_f32(void) {
    for (size_t i = 0; i < N_SHAPES; i++)
        for (int causal = 0; causal < 2; causal++) {
            att_shape s = shapes[i];
            s.causal = causal;
            att_result r = gpu_case(&s, DEFT_F32, 0, 1e-4);
            att_result_free(&r);
        }
}

/* The halves' kernel the cases run on (1 plain, 2 tensor cores), for the messages. */
static int64_t kernel_now(void) { return deft_testing_debug("ATTENTION_KERNEL"); }

static void test_bf16_autocast(void) {
    fprintf(stderr, "bf16 autocast, attention kernel %lld\n", (long long)kernel_now());
    for (size_t i = 0; i < N_SHAPES; i++)
        for (int causal = 0; causal < 2; causal++) {
            if (shapes[i].t == 1000 && shapes[i].d == 128 && !causal) continue;   /* time: the other T = 1000 do */
            att_shape s = shapes[i];
            s.causal = causal;
            att_result r = gpu_case(&s, DEFT_F32, DEFT_BF16, 3e-2);
            att_result_free(&r);
        }
}

static void test_f16(void) {
    const att_shape f16_shapes[] = {{2, 2, 45, 64, 1, 0}, {1, 1, 1, 128, 0, 0}, {1, 1, 130, 128, 0, 0},
                                    {2, 3, 200, 96, 1, 0}, {1, 2, 129, 32, 1, 0.3}};
    fprintf(stderr, "f16, attention kernel %lld\n", (long long)kernel_now());
    for (size_t i = 0; i < 5; i++) {
        att_result r = gpu_case(&f16_shapes[i], DEFT_F16, 0, 5e-3);
        att_result_free(&r);
    }
}

/* Under the compile option `deterministic` (deft's kernels: always) dq is summed per query tile and dk, dv per key
 * tile, never with atomics: two runs give the same bits. */
static void test_deterministic(void) {
    const att_shape s = {2, 2, 300, 64, 1, 0};
    double *qkv[3], *r;
    att_random(&rng, &s, DEFT_BF16, 1.0, qkv, &r);
    const int64_t n = att_numel(&s);
    const deft_compile_options opts = {.autocast = DEFT_BF16, .deterministic = 1};
    att_result a = {0}, b = {0};
    const int ok = att_run(&s, DEFT_F32, GPU, &opts, (const double *const *)qkv, r, 1, &a) &&
                   att_run(&s, DEFT_F32, GPU, &opts, (const double *const *)qkv, r, 1, &b);
    if (ok) {
        const size_t bytes = (size_t)n * sizeof(double);
        CHECK_MSG(!memcmp(a.out, b.out, bytes) && !memcmp(a.dq, b.dq, bytes) && !memcmp(a.dk, b.dk, bytes) &&
                      !memcmp(a.dv, b.dv, bytes),
                  "two runs of the same attention step differ");
    }
    att_result_free(&a);
    att_result_free(&b);
    att_random_free(qkv, r);
}

static void test_f64_refused(void) {
    if (GPU.type == DEFT_CPU) return;   /* the CPU runs f64 */
    deft_graph *g = deft_graph_new();
    const int64_t shape[4] = {1, 1, 4, 8};
    deft_tensor *x = deft_input(g, "x", DEFT_F64, 4, shape, GPU);
    deft_tensor *y = deft_attention(x, x, x, NULL);
    CHECK(y != NULL);
    deft_program *p = deft_compile(g, &y, 1, NULL);
    CHECK_MSG(p == NULL && deft_errmsg() && strstr(deft_errmsg(), "attention") && strstr(deft_errmsg(), "f64"),
              "f64 attention on a GPU: %s", p ? "compiled" : deft_errmsg());
    deft_graph_free(g);
}

/* The plan of a causal GPT-2-like attention step at T = 1024 (12 heads of 64, f32 and bf16 autocast): the arena
 * is below one T x T f32 matrix per head. Planned only, never run. */
static void test_no_square_buffer(void) {
    enum { T = 1024, H = 12, D = 64 };
    for (int ac = 0; ac < 2; ac++) {
        deft_graph *g = deft_graph_new();
        const int64_t xs[4] = {1, H, T, D};
        deft_tensor *q = deft_param(g, "q", DEFT_F32, 4, xs, GPU, DEFT_INIT_ZEROS);
        deft_tensor *k = deft_param(g, "k", DEFT_F32, 4, xs, GPU, DEFT_INIT_ZEROS);
        deft_tensor *v = deft_param(g, "v", DEFT_F32, 4, xs, GPU, DEFT_INIT_ZEROS);
        deft_tensor *loss = deft_sum(deft_attention(q, k, v, &(deft_attention_options){.causal = 1}), 0, NULL, 0);
        CHECK_OK(deft_backward(loss));
        deft_tensor *outs[4] = {loss, deft_grad(q), deft_grad(k), deft_grad(v)};
        deft_memory_report m;
        const deft_compile_options opts = {.autocast = ac ? DEFT_BF16 : DEFT_F32};
        CHECK_OK(deft_plan_memory(g, outs, 4, &opts, &m));
        CHECK_MSG(m.arena_bytes < (size_t)T * T * H * 4, "autocast %d: arena %zu bytes holds H T x T", ac,
                  m.arena_bytes);
        deft_graph_free(g);
    }
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    test_f32();
    for (int kernel = 1; kernel <= 3; kernel++) {
        CHECK_OK(deft_testing_set_debug("ATTENTION_KERNEL", kernel));
        test_bf16_autocast();
        test_f16();
        test_deterministic();
    }
    CHECK_OK(deft_testing_set_debug("ATTENTION_KERNEL", 0));
    test_f64_refused();
    test_no_square_buffer();
    return deft_check_finish();
}
