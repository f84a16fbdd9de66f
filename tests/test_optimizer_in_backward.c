/* Optimizer in backward on the CPU (the compile option optimizer_in_backward):
 *  1. SGD (momentum, weight decay) and AdamW on a deep MLP: losses, norms, parameters, optimizer state and update
 *     counts bit-identical to the one-node step over several runs; also with the `reorder` option, with activation
 *     checkpointing (segments), and with fusion off;
 *  2. the plan: the arena's lower bound drops by at least the model's gradient bytes less the two largest gradients;
 *     each layer's weight and bias form one piece; every piece runs after each step that gives one of its gradients or
 *     reads one of its parameters (recomputations included), right after the last of them, and the finisher after
 *     every piece;
 *  3. the pieces belong to the program: the graph's node count comes back when it is freed, and a program compiled
 *     without the option beside it runs the one-node step;
 *  4. what cannot be split is an error with a message: accumulation, clipping, f16 loss scaling, a node reading the
 *     step's value, a node reading a parameter after the step. */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>

#include "deft_testing.h"
#include "obwd_net.h"

static const obwd_spec SGD_NET = {.depth = 6, .batch = 16, .width = 48, .classes = 10, .adamw = 0};
static const obwd_spec ADAMW_NET = {.depth = 6, .batch = 16, .width = 48, .classes = 10, .adamw = 1};

static void test_bit_identical(void) {
    obwd_spec s = SGD_NET, a = ADAMW_NET;
    s.device = a.device = deft_cpu();
    CHECK(obwd_compare(&s, NULL, 4, "sgd") == 4);
    CHECK(obwd_compare(&a, NULL, 4, "adamw") == 4);
    CHECK(obwd_compare(&s, &(deft_compile_options){.reorder = 1}, 3, "sgd, reorder") == 3);
    CHECK(obwd_compare(&a, &(deft_compile_options){.no_fusion = 1}, 3, "adamw, no fusion") == 3);
    const deft_compile_options ck = {.checkpoint = DEFT_CHECKPOINT_SEGMENTS, .checkpoint_segments = 3};
    CHECK(obwd_compare(&s, &ck, 3, "sgd, checkpoint segments") == 3);
    CHECK(obwd_compare(&a, &ck, 3, "adamw, checkpoint segments") == 3);
}

static bool is_part(const deft_tensor *t) {
    return deft_testing_optimizer_part(deft_testing_step_optimizer(t), NULL, NULL) != NULL;
}

/* The step at which p runs t, -1 when it runs none for it (a leaf, a view, or a node p does not compute). */
static int step_of(const deft_program *p, const deft_tensor *t) {
    deft_testing_node_plan np;
    deft_testing_program_node_plan(p, t, &np);
    return np.step;
}

/* Every piece after the producers of its gradients and every reader of its parameters, with nothing but pieces
 * between the last of them and it; the finisher after every piece. Returns the number of pieces. */
static int check_order(const deft_program *p, const deft_optimizer *opt) {
    int pieces = 0, last_piece = -1, finisher = -1;
    const deft_graph *g = deft_testing_program_graph(p);
    for (int i = 0; i < deft_program_step_count(p); i++) {
        const deft_tensor *t = deft_testing_step_node(p, i);
        if (!is_part(t)) continue;
        const deft_optimizer *piece = deft_testing_step_optimizer(t);
        int finishes = 0;
        CHECK(deft_testing_optimizer_part(piece, NULL, &finishes) == opt);
        if (finishes) {
            finisher = i;
            continue;
        }
        pieces++;
        last_piece = i;
        int anchor = -1;
        for (int k = 0; k < deft_testing_src_count(t); k++) {
            const deft_tensor *grad = deft_testing_src(t, k);
            const int st = step_of(p, deft_testing_view_base(grad));
            CHECK_MSG(st < i, "%s runs at %d, before its gradient %s (step %d)", deft_tensor_name(t), i,
                      deft_tensor_name(grad), st);
            if (st > anchor) anchor = st;
        }
        for (int id = 0; id < deft_graph_node_count(g); id++) {
            const deft_tensor *r = deft_testing_node(g, id);
            const int r_step = step_of(p, r);
            if (r_step < 0) continue;
            for (int k = 0; k < deft_testing_src_count(r); k++) {
                const deft_tensor *base = deft_testing_view_base(deft_testing_src(r, k));
                for (int m = 0; m < deft_testing_optimizer_param_count(piece); m++) {
                    if (deft_testing_optimizer_param(piece, m) != base) continue;
                    CHECK_MSG(r_step < i, "%s updates %s at step %d, before its reader %s (step %d)",
                              deft_tensor_name(t), deft_tensor_name(deft_testing_src(r, k)), i, deft_tensor_name(r),
                              r_step);
                    if (r_step > anchor) anchor = r_step;
                }
            }
        }
        for (int j = anchor + 1; j < i; j++)
            CHECK_MSG(is_part(deft_testing_step_node(p, j)), "%s runs at %d, not right after step %d: %s between",
                      deft_tensor_name(t), i, anchor, deft_tensor_name(deft_testing_step_node(p, j)));
    }
    CHECK_MSG(finisher > last_piece, "the finisher at %d, the last piece at %d", finisher, last_piece);
    return pieces;
}

static size_t grad_bytes(const deft_optimizer *o, size_t *largest2) {
    size_t total = 0, a = 0, b = 0;
    for (int i = 0; i < deft_testing_optimizer_param_count(o); i++) {
        const size_t n = deft_tensor_nbytes(deft_testing_optimizer_param(o, i));
        total += n;
        if (n > a) {
            b = a;
            a = n;
        } else if (n > b) {
            b = n;
        }
    }
    *largest2 = a + b;
    return total;
}

static void test_plan(const deft_compile_options *extra, const char *what) {
    /* A small batch: the activations the backward pass keeps are small beside the gradients. */
    obwd_spec s = {.depth = 12, .batch = 4, .width = 256, .classes = 10, .device = deft_cpu()};
    obwd_net n;
    if (!obwd_build(&n, &s)) return;
    deft_compile_options o = extra ? *extra : (deft_compile_options){0};
    deft_memory_report whole, split;
    CHECK_OK(deft_plan_memory(n.g, (deft_tensor *[]){n.loss, n.step}, 2, &o, &whole));
    o.optimizer_in_backward = 1;
    CHECK_OK(deft_plan_memory(n.g, (deft_tensor *[]){n.loss, n.step}, 2, &o, &split));
    size_t largest2;
    const size_t grads = grad_bytes(n.opt, &largest2);
    const size_t lb_whole = whole.lower_bound_bytes, lb_split = split.lower_bound_bytes;
    printf("%s: lower bound %zu -> %zu bytes (gradients %zu)\n", what, lb_whole, lb_split, grads);
    /* The whole step's peak holds every gradient; the split one at most the two largest, beside the activations the
     * backward pass keeps (at most two per layer, batch x width f32 each). */
    const size_t acts = (size_t)(2 * s.depth + 2) * (size_t)(s.batch * s.width) * sizeof(float);
    CHECK_MSG(lb_split + grads <= lb_whole + largest2 + acts, "%s: lower bound %zu -> %zu, gradients %zu", what,
              lb_whole, lb_split, grads);
    CHECK_MSG(lb_split * 3 < lb_whole, "%s: lower bound %zu -> %zu", what, lb_whole, lb_split);
    const int before = deft_graph_node_count(n.g);
    deft_program *p = obwd_compile(&n, &o);
    CHECK_MSG(p != NULL, "%s: %s", what, deft_errmsg());
    if (p) {
        CHECK_MSG(check_order(p, n.opt) == s.depth + 1, "%s: pieces are not one per layer", what);
        deft_testing_split sp;
        CHECK(deft_testing_program_split(p, &sp) && sp.n_pieces == s.depth + 1 && sp.n_steps == 1);
        float l, norm;
        CHECK(obwd_run(&n, p, 0, &l, &norm) && isfinite(norm) && norm > 0.0f);
        deft_program_free(p);
    }
    CHECK_MSG(deft_graph_node_count(n.g) == before, "%s: %d nodes after freeing, %d before", what,
              deft_graph_node_count(n.g), before);
    obwd_free(&n);
}

/* A program without the option, compiled beside one with it, steps the same optimizer with the one-node step; the
 * update count goes on from one to the other. */
static void test_beside(void) {
    obwd_spec s = SGD_NET;
    s.device = deft_cpu();
    obwd_net n;
    if (!obwd_build(&n, &s)) return;
    deft_program *split = obwd_compile(&n, &(deft_compile_options){.optimizer_in_backward = 1});
    deft_program *whole = obwd_compile(&n, NULL);
    CHECK(split && whole);
    int steps_whole = 0;
    for (int i = 0; whole && i < deft_program_step_count(whole); i++) {
        const deft_tensor *t = deft_testing_step_node(whole, i);
        CHECK(!is_part(t));
        steps_whole += t == n.step;
    }
    CHECK(steps_whole == 1);
    float l, norm;
    if (split && whole) {
        CHECK(obwd_run(&n, split, 0, &l, &norm));
        CHECK(obwd_run(&n, whole, 1, &l, &norm));
        CHECK(obwd_run(&n, split, 2, &l, &norm));
        CHECK(deft_optimizer_updates(n.opt) == 3);
    }
    obwd_free(&n);
}

/* A parameter read by a backward step made after its gradient: h = w * (x @ u) differentiates into dw = dh * (x @ u)
 * first, then d(x @ u) = dh * w, which reads w. The update of w must wait for that read. */
typedef struct reader_net {
    deft_graph *g;
    deft_tensor *x, *loss, *step;
    deft_optimizer *opt;
} reader_net;

static int reader_build(reader_net *n) {
    n->g = deft_graph_new();
    deft_graph_set_seed(n->g, 5);
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){16, 8}, deft_cpu());
    deft_tensor *u = deft_param(n->g, "u", DEFT_F32, 2, (int64_t[]){8, 8}, deft_cpu(), DEFT_INIT_KAIMING);
    deft_tensor *w = deft_param(n->g, "w", DEFT_F32, 1, (int64_t[]){8}, deft_cpu(), DEFT_INIT_KAIMING);
    deft_tensor *h = deft_relu(deft_mul(w, deft_matmul(n->x, u)));
    n->loss = deft_mean(deft_mul(h, h), 2, (int[]){0, 1}, 0);
    CHECK_OK(deft_backward(n->loss));
    n->opt = deft_sgd(n->g, &(deft_sgd_options){.lr = 0.1, .momentum = 0.9}, NULL);
    n->step = deft_optimizer_step(n->opt);
    return n->step != NULL;
}

/* Whether the flat parameters of a and b (of one size) hold the same bytes. */
static int same_params(const deft_optimizer *a, const deft_optimizer *b) {
    const size_t bytes = deft_testing_optimizer_array_bytes(a);
    unsigned char *x = malloc(bytes), *y = malloc(bytes);
    const int same = x && y && bytes == deft_testing_optimizer_array_bytes(b) &&
                     deft_testing_optimizer_read(a, 0, x, bytes) == DEFT_OK &&
                     deft_testing_optimizer_read(b, 0, y, bytes) == DEFT_OK && memcmp(x, y, bytes) == 0;
    free(x);
    free(y);
    return same;
}

static void test_reader_after_grad(void) {
    reader_net a, b;
    if (!reader_build(&a) || !reader_build(&b)) return;
    deft_program *pa = deft_compile(a.g, (deft_tensor *[]){a.loss, a.step}, 2, NULL);
    deft_program *pb = deft_compile(b.g, (deft_tensor *[]){b.loss, b.step}, 2,
                                    &(deft_compile_options){.optimizer_in_backward = 1});
    CHECK(pa && pb);
    if (pb) CHECK(check_order(pb, b.opt) >= 1);
    float hx[16 * 8];
    for (int i = 0; i < 16 * 8; i++) hx[i] = (float)((i * 37) % 19) / 9.0f - 1.0f;
    for (int r = 0; pa && pb && r < 3; r++) {
        float la, lb, na, nb;
        CHECK_OK(deft_program_feed(pa, a.x, hx, sizeof hx));
        CHECK_OK(deft_program_feed(pb, b.x, hx, sizeof hx));
        CHECK_OK(deft_program_run(pa));
        CHECK_OK(deft_program_run(pb));
        CHECK_OK(deft_program_read(pa, a.loss, &la, sizeof la));
        CHECK_OK(deft_program_read(pb, b.loss, &lb, sizeof lb));
        CHECK_OK(deft_program_read(pa, a.step, &na, sizeof na));
        CHECK_OK(deft_program_read(pb, b.step, &nb, sizeof nb));
        CHECK_MSG(la == lb && na == nb, "run %d: loss %.9g / %.9g, norm %.9g / %.9g", r, (double)la, (double)lb,
                  (double)na, (double)nb);
        CHECK_MSG(same_params(a.opt, b.opt), "run %d: parameters differ", r);
    }
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

static void check_refused(obwd_net *n, deft_tensor *const *outs, int n_outs, const deft_compile_options *o,
                          const char *needle) {
    deft_compile_options opt = o ? *o : (deft_compile_options){0};
    opt.optimizer_in_backward = 1;
    const int before = deft_graph_node_count(n->g);
    deft_program *p = NULL;
    CHECK_ERR(deft_compile_into(n->g, outs, n_outs, &opt, &p), DEFT_ERR_INVALID, needle);
    CHECK(p == NULL);
    /* An autocast rewrite stays in the graph for later compiles; nothing else may. */
    CHECK(opt.autocast != DEFT_F32 || deft_graph_node_count(n->g) == before);
}

static void test_errors(void) {
    obwd_spec s = SGD_NET;
    s.device = deft_cpu();
    s.depth = 2;
    obwd_net n;
    if (!obwd_build(&n, &s)) return;
    deft_tensor *outs[2] = {n.loss, n.step};
    check_refused(&n, outs, 2, &(deft_compile_options){.autocast = DEFT_F16}, "f16 loss scaling");
    deft_tensor *twice = deft_mul_scalar(n.step, 2.0);
    check_refused(&n, (deft_tensor *[]){n.loss, n.step, twice}, 3, NULL, "reads the value of the step");
    deft_tensor *w_after = deft_sum(deft_graph_find(n.g, "fc0.weight"), 2, (int[]){0, 1}, 0);
    check_refused(&n, (deft_tensor *[]){n.loss, n.step, w_after}, 3, NULL, "after the step");
    obwd_free(&n);

    for (int k = 0; k < 2; k++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){4, 3}, deft_cpu());
        deft_tensor *loss = deft_mean(deft_linear(x, 2, "fc", NULL), 2, (int[]){0, 1}, 0);
        CHECK_OK(deft_backward(loss));
        deft_step_options so = k == 0 ? (deft_step_options){.accumulate_steps = 2} : (deft_step_options){.max_grad_norm = 1.0};
        deft_tensor *step = deft_optimizer_step(deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, &so));
        deft_program *p = NULL;
        CHECK_ERR(deft_compile_into(g, (deft_tensor *[]){loss, step}, 2,
                                    &(deft_compile_options){.optimizer_in_backward = 1}, &p),
                  DEFT_ERR_INVALID, k == 0 ? "accumulates micro-batches" : "clips by the global norm");
        deft_graph_free(g);
    }
}

int main(void) {
    test_bit_identical();
    test_plan(NULL, "plain");
    test_plan(&(deft_compile_options){.checkpoint = DEFT_CHECKPOINT_SEGMENTS, .checkpoint_segments = 3},
              "checkpoint segments");
    test_beside();
    test_reader_after_grad();
    test_errors();
    return deft_check_finish();
}
