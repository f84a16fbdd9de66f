/* deft_attention on the CPU: the blocked kernel (tiles of 16) against a plain reference that materialises the T x T
 * probabilities (tests/attention_ref.h), causal and not, T on and off the tile, D up to 128; its gradients against
 * the reference's and against finite differences in f64; the build errors; and that the plan never holds a T x T
 * buffer (the arena of a training step at T = 512 is smaller than one T x T f32 matrix), with the node known as one
 * to the plan, the checkpoint rewrite (recomputed, with the op cost's FLOPs), the DOT dump and autocast. */
#include "check.h"
#include "ref.h"
#include "grad_check.h"
#include "attention_ref.h"
#include "attention_run.h"
#include "deft_testing.h"

static uint64_t rng = 0xa77e1710ull;

static const deft_dtype dts[2] = {DEFT_F64, DEFT_F32};
/* f64 sums in another order than the reference; f32 loads round once, sums in double, stores round once. */
static double tol_of(deft_dtype dt) { return dt == DEFT_F64 ? 1e-12 : 2e-6; }

static void check_case(const char *what, const att_shape *s, deft_dtype dt, double tol) {
    double *qkv[3], *r;
    att_random(&rng, s, dt, 1.5, qkv, &r);
    const int64_t n = att_numel(s);
    double *want = malloc((size_t)n * sizeof *want), *gq = malloc((size_t)n * sizeof *gq);
    double *gk = malloc((size_t)n * sizeof *gk), *gv = malloc((size_t)n * sizeof *gv);
    att_ref_forward(s, qkv[0], qkv[1], qkv[2], want);
    att_ref_backward(s, qkv[0], qkv[1], qkv[2], r, gq, gk, gv);
    att_result res;
    if (att_run(s, dt, deft_cpu(), NULL, (const double *const *)qkv, r, 1, &res)) {
        const double e[4] = {att_rel_err(res.out, want, n), att_rel_err(res.dq, gq, n), att_rel_err(res.dk, gk, n),
                             att_rel_err(res.dv, gv, n)};
        static const char *const names[4] = {"out", "dq", "dk", "dv"};
        for (int i = 0; i < 4; i++)
            CHECK_MSG(e[i] <= tol, "%s %s [%lld, %lld, %lld, %lld] causal %d scale %g: %s off by %.3g (tol %g)",
                      what, deft_dtype_name(dt), (long long)s->b, (long long)s->h, (long long)s->t, (long long)s->d,
                      s->causal, s->scale, names[i], e[i], tol);
    }
    att_result_free(&res);
    free(want), free(gq), free(gk), free(gv);
    att_random_free(qkv, r);
}

/* Forward and gradients against the reference: T = 1, below, on and past the tile (16), D from 1 to 128. */
static void test_against_reference(void) {
    static const att_shape shapes[] = {
        {1, 1, 1, 4, 0, 0},   {2, 3, 7, 5, 0, 0},  {1, 2, 16, 8, 0, 0},  {1, 2, 33, 16, 0, 0.3},
        {2, 1, 50, 64, 0, 0}, {1, 1, 40, 128, 0, 0}, {1, 1, 17, 1, 0, 0}, {1, 2, 70, 32, 0, -0.2},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int causal = 0; causal < 2; causal++)
            for (int d = 0; d < 2; d++) {
                att_shape s = shapes[i];
                s.causal = causal;
                check_case("reference", &s, dts[d], tol_of(dts[d]));
            }
}

/* Large scores: the online softmax must rescale without overflow (every exponent stays <= 0). In f32 the saved
 * log-sum-exp (about 700 here) is an f32 too, good to 3e-5 relative, and so are the recomputed probabilities. */
static void test_large_scores(void) {
    att_shape s = {1, 2, 37, 8, 0, 40.0};
    check_case("large scores", &s, DEFT_F64, tol_of(DEFT_F64));
    s.causal = 1;
    check_case("large scores", &s, DEFT_F32, 1e-4);
}

/* Gradients by central differences in f64, self-attention (q = k = v one parameter, the three gradients summed)
 * included. */
static void test_finite_differences(void) {
    for (int causal = 0; causal < 2; causal++) {
        const int64_t shape[4] = {1, 2, 19, 3};   /* 19 keys: a full tile and a partial one */
        deft_graph *g = deft_graph_new();
        deft_tensor *p[3];
        for (int i = 0; i < 3; i++) p[i] = grad_check_param(g, &rng, i, 4, shape, -1.5, 1.5);
        const deft_attention_options o = {.causal = causal, .scale = causal ? 0.7 : 0.0};
        char name[64];
        snprintf(name, sizeof name, "finite differences causal %d", causal);
        grad_check_case(name, g, &rng, deft_attention(p[0], p[1], p[2], &o), p, 3, NULL, NULL, 0, 1e-6);
        deft_graph_free(g);

        g = deft_graph_new();
        deft_tensor *x = grad_check_param(g, &rng, 0, 4, shape, -1.5, 1.5);
        snprintf(name, sizeof name, "finite differences self-attention causal %d", causal);
        grad_check_case(name, g, &rng, deft_tanh(deft_attention(x, x, x, &o)), &x, 1, NULL, NULL, 0, 1e-6);
        deft_graph_free(g);
    }
}

static void test_build_errors(void) {
    deft_graph *g = deft_graph_new();
    const int64_t a[4] = {2, 3, 4, 5}, b[4] = {2, 3, 6, 5}, c3[3] = {2, 4, 5}, big[4] = {1, 1, 4, 129};
    deft_tensor *q = deft_input(g, "q", DEFT_F32, 4, a, deft_cpu());
    deft_tensor *k = deft_input(g, "k", DEFT_F32, 4, b, deft_cpu());
    deft_tensor *x3 = deft_input(g, "x3", DEFT_F32, 3, c3, deft_cpu());
    deft_tensor *wide = deft_input(g, "wide", DEFT_F32, 4, big, deft_cpu());
    deft_tensor *qi = deft_input(g, "qi", DEFT_I32, 4, a, deft_cpu());
    deft_tensor *qd = deft_input(g, "qd", DEFT_F64, 4, a, deft_cpu());
    const int nodes = deft_graph_node_count(g);
    CHECK_NULL_ERR(deft_attention(q, k, q, NULL), "q [2, 3, 4, 5], k [2, 3, 6, 5], v [2, 3, 4, 5]");
    CHECK(deft_graph_error(g) == DEFT_ERR_SHAPE);
    CHECK_NULL_ERR(deft_attention(x3, x3, x3, NULL), "[B, H, T, D] of one shape, got q [2, 4, 5]");
    CHECK_NULL_ERR(deft_attention(wide, wide, wide, NULL), "head size D = 129");
    CHECK_NULL_ERR(deft_attention(qi, qi, qi, NULL), "needs a floating dtype");
    CHECK_NULL_ERR(deft_attention(q, qd, q, NULL), "one dtype, got f32, f64 and f32");
    CHECK_NULL_ERR(deft_attention(q, q, q, &(deft_attention_options){.scale = NAN}), "scale nan must be finite");
    CHECK_NULL_ERR(deft_attention(q, NULL, q, NULL), "");
    CHECK_MSG(deft_graph_node_count(g) == nodes, "refused calls added nodes: %d -> %d", nodes,
              deft_graph_node_count(g));
    deft_graph_free(g);

    /* A head size the builder takes: D = 128 and an explicit scale. */
    g = deft_graph_new();
    const int64_t ok[4] = {1, 1, 3, 128};
    deft_tensor *x = deft_input(g, "x", DEFT_BF16, 4, ok, deft_cpu());
    deft_tensor *t = deft_attention(x, x, x, &(deft_attention_options){.causal = 1, .scale = 2.0});
    CHECK_MSG(t && deft_tensor_dtype(t) == DEFT_BF16 && deft_tensor_ndim(t) == 4 && deft_tensor_dim(t, 3) == 128,
              "attention on bf16 [1, 1, 3, 128]: %s", deft_errmsg());
    deft_graph_free(g);
}

/* A causal self-attention training step at T = 512: q = x wq, k = x wk, v = x wv, y = attention, loss = sum(y r).
 * 0: deft_attention; 1: the same written with matmul, a mask and softmax, which holds T x T tensors. */
typedef struct big_step {
    deft_graph *g;
    deft_tensor *attn, *loss, *grads[3];
} big_step;

enum { BIG_T = 512, BIG_H = 2, BIG_D = 16 };

static big_step build_big(int naive, deft_dtype dt) {
    big_step b = {deft_graph_new(), NULL, NULL, {NULL}};
    const int64_t xs[4] = {1, BIG_H, BIG_T, BIG_D}, ws[2] = {BIG_D, BIG_D};
    deft_tensor *x = deft_input(b.g, "x", dt, 4, xs, deft_cpu());
    deft_tensor *w[3];
    const char *names[3] = {"wq", "wk", "wv"};
    for (int i = 0; i < 3; i++) w[i] = deft_param(b.g, names[i], dt, 2, ws, deft_cpu(), DEFT_INIT_XAVIER);
    deft_tensor *q = deft_matmul(x, w[0]), *k = deft_matmul(x, w[1]), *v = deft_matmul(x, w[2]);
    if (!naive) {
        b.attn = deft_attention(q, k, v, &(deft_attention_options){.causal = 1});
    } else {
        const int64_t ms[2] = {BIG_T, BIG_T};
        double *mask = malloc(sizeof(double) * BIG_T * BIG_T);
        for (int i = 0; i < BIG_T; i++)
            for (int j = 0; j < BIG_T; j++) mask[i * BIG_T + j] = j > i ? -1e30 : 0.0;
        deft_tensor *m = deft_constant(b.g, DEFT_F64, 2, ms, deft_cpu(), mask, sizeof(double) * BIG_T * BIG_T);
        free(mask);
        deft_tensor *s = deft_add(deft_mul_scalar(deft_matmul_t(q, k, 0, 1), 0.25), deft_cast(m, dt));
        b.attn = deft_matmul(deft_softmax(s, -1), v);
    }
    b.loss = deft_sum(deft_mul(b.attn, deft_tanh(x)), 0, NULL, 0);
    CHECK_OK(deft_backward(b.loss));
    for (int i = 0; i < 3; i++) b.grads[i] = deft_grad(w[i]);
    return b;
}

static void test_no_square_buffer(void) {
    const size_t square = (size_t)BIG_T * BIG_T * sizeof(float);
    big_step b = build_big(0, DEFT_F32);
    deft_tensor *outs[4] = {b.loss, b.grads[0], b.grads[1], b.grads[2]};
    deft_program *p = deft_compile(b.g, outs, 4, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        float *x = malloc(sizeof(float) * BIG_H * BIG_T * BIG_D);
        for (int i = 0; i < BIG_H * BIG_T * BIG_D; i++) x[i] = (float)ref_unif(&rng, -1, 1);
        CHECK_OK(deft_program_feed(p, deft_graph_find(b.g, "x"), x, sizeof(float) * BIG_H * BIG_T * BIG_D));
        free(x);
        deft_memory_report m;
        CHECK_OK(deft_program_memory(p, &m));
        CHECK_MSG(m.arena_bytes < square, "arena %zu bytes: not below one T x T f32 matrix (%zu)", m.arena_bytes,
                  square);
        /* The attention node: one arena buffer, its value and the [B, H, T] f32 statistics past it. */
        deft_testing_node_plan np;
        deft_testing_program_node_plan(p, b.attn, &np);
        const size_t value = (size_t)BIG_H * BIG_T * BIG_D * 4, want = ((value + 255) & ~(size_t)255) + BIG_H * BIG_T * 4;
        CHECK_MSG(np.place == DEFT_TESTING_PLACE_ARENA && np.size == want, "attention: place %d size %zu, want %zu",
                  np.place, np.size, want);
        CHECK_OK(deft_program_run(p));
        /* The plan table names the node once, as attention, and its gradient once. */
        FILE *f = tmpfile();
        CHECK_OK(deft_program_print_plan(p, f));
        char text[1 << 16];
        rewind(f);
        const size_t got = fread(text, 1, sizeof text - 1, f);
        text[got] = '\0';
        fclose(f);
        const char *a = strstr(text, " attention ");
        CHECK_MSG(a && !strstr(a + 1, " attention "), "the plan table lists attention %s", a ? "twice" : "nowhere");
        CHECK_MSG(strstr(text, "attention_grad") != NULL, "the plan table lacks attention_grad");
    }
    deft_graph_free(b.g);

    /* The same step written naively holds T x T values: what the fused node saves. */
    b = build_big(1, DEFT_F32);
    deft_tensor *nouts[4] = {b.loss, b.grads[0], b.grads[1], b.grads[2]};
    deft_memory_report m;
    CHECK_OK(deft_plan_memory(b.g, nouts, 4, NULL, &m));
    CHECK_MSG(m.arena_bytes >= square * BIG_H, "the naive step's arena %zu is below H T x T (%zu)?", m.arena_bytes,
              square * BIG_H);
    deft_graph_free(b.g);
}

/* Checkpointing drops the attention node and recomputes it (its cost: 4 B H T^2 D FLOPs, half when causal); the
 * gradients are the same bits. */
static void test_checkpoint(void) {
    const att_shape s = {2, 2, 21, 8, 1, 0};
    const int64_t shape[4] = {s.b, s.h, s.t, s.d}, n = att_numel(&s);
    double *qkv[3], *r;
    att_random(&rng, &s, DEFT_F64, 1.0, qkv, &r);
    double *grads[2][3] = {{NULL}};
    for (int ck = 0; ck < 2; ck++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *p[3];
        const char *names[3] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++) p[i] = att_param(g, names[i], &s, DEFT_F64, deft_cpu(), qkv[i]);
        deft_tensor *a = deft_tanh(p[0]);
        deft_tensor *o = deft_attention(a, p[1], p[2], &(deft_attention_options){.causal = 1});
        deft_tensor *y = deft_tanh(o);
        deft_tensor *rt = deft_constant(g, DEFT_F64, 4, shape, deft_cpu(), r, (size_t)n * sizeof(double));
        deft_tensor *loss = deft_sum(deft_mul(y, rt), 0, NULL, 0);
        CHECK_OK(deft_backward(loss));
        if (ck) CHECK_OK(deft_checkpoint_span(a, y));   /* marks o alone */
        deft_tensor *outs[4] = {loss, deft_grad(p[0]), deft_grad(p[1]), deft_grad(p[2])};
        deft_compile_options opts = {.checkpoint = ck ? DEFT_CHECKPOINT_MARKED : DEFT_CHECKPOINT_NONE};
        deft_program *prog = deft_compile(g, outs, 4, &opts);
        CHECK_MSG(prog != NULL, "compile: %s", deft_errmsg());
        if (!prog) {
            deft_graph_free(g);
            continue;
        }
        CHECK_OK(deft_program_run(prog));
        for (int i = 0; i < 3; i++) grads[ck][i] = ref_read_program(prog, outs[1 + i], n);
        if (ck) {
            ref_check_one_recompute(prog, 4.0 * s.b * s.h * s.t * s.t * s.d * 0.5);   /* causal: half */
            deft_testing_node_plan np;
            deft_testing_program_node_plan(prog, o, &np);
            CHECK_MSG(np.dropped, "the attention node was not dropped");
            CHECK_OK(deft_graph_dump_dot(g, prog, "test_attention.dot"));
            FILE *f = fopen("test_attention.dot", "r");
            char text[1 << 16];
            const size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
            text[got] = '\0';
            if (f) fclose(f);
            CHECK_MSG(strstr(text, "attention") && strstr(text, "attention_grad"), "the DOT dump lacks the nodes");
        }
        deft_graph_free(g);
    }
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(grads[0][i] && grads[1][i] && memcmp(grads[0][i], grads[1][i], (size_t)n * sizeof(double)) == 0,
                  "gradient %d differs with checkpointing", i);
        free(grads[0][i]);
        free(grads[1][i]);
    }
    att_random_free(qkv, r);
}

/* Under bf16 autocast the node runs in bf16 (its inputs cast like a matmul's) and stays close to f32. */
static void test_autocast(void) {
    const att_shape s = {1, 2, 45, 32, 1, 0};
    const int64_t n = att_numel(&s);
    double *qkv[3], *r;
    att_random(&rng, &s, DEFT_BF16, 1.0, qkv, &r);
    att_result lo, hi;
    const deft_compile_options ac = {.autocast = DEFT_BF16};
    const int a = att_run(&s, DEFT_F32, deft_cpu(), &ac, (const double *const *)qkv, r, 1, &lo);
    const int b = att_run(&s, DEFT_F32, deft_cpu(), NULL, (const double *const *)qkv, r, 1, &hi);
    if (a && b) {
        const double e[4] = {att_rel_err(lo.out, hi.out, n), att_rel_err(lo.dq, hi.dq, n),
                             att_rel_err(lo.dk, hi.dk, n), att_rel_err(lo.dv, hi.dv, n)};
        for (int i = 0; i < 4; i++) CHECK_MSG(e[i] <= 3e-2, "autocast bf16: tensor %d off by %.3g", i, e[i]);
        /* bf16 rounds the output: some difference is expected, or the node did not run in bf16 */
        CHECK_MSG(e[0] > 0.0, "autocast bf16 gave f32's bits");
    }
    att_result_free(&lo);
    att_result_free(&hi);
    att_random_free(qkv, r);
}

int main(void) {
    test_against_reference();
    test_large_scores();
    test_finite_differences();
    test_build_errors();
    test_no_square_buffer();
    test_checkpoint();
    test_autocast();
    return deft_check_finish();
}
