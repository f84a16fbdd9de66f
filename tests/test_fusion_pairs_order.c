/* The move that lets a fusion pair run at its later member's step (passes/fusion_pairs.c), on a CPU program stopped
 * after its schedule: the steps between the two members that read the earlier one, directly or through a view or
 * another moved step, go to just after the later member in their order, and the rest keep theirs; nothing moves when
 * the later member reads one of them or when an optimizer step lies between. */
#include "check.h"
#include "deft_testing.h"

static deft_program *scheduled(deft_graph *g, deft_tensor **outs, int n) {
    deft_program *p = deft_compile(g, outs, n, &(deft_compile_options){.stop_after = "schedule"});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    return p;
}

static int step_of(const deft_program *p, const deft_tensor *t) {
    for (int i = 0; i < deft_program_step_count(p); i++)
        if (deft_testing_step_node(p, i) == t) return i;
    return -1;
}

/* The steps' nodes in order, as indices into `nodes` (-1 for a node not among them). */
static void order_of(const deft_program *p, deft_tensor *const *nodes, int n, int *out) {
    for (int i = 0; i < deft_program_step_count(p); i++) {
        out[i] = -1;
        for (int k = 0; k < n; k++)
            if (deft_testing_step_node(p, i) == nodes[k]) out[i] = k;
    }
}

static void check_order(const char *what, const deft_program *p, deft_tensor *const *nodes, int n, const int *want) {
    int got[16];
    CHECK_MSG(deft_program_step_count(p) == n, "%s: %d steps, want %d", what, deft_program_step_count(p), n);
    if (deft_program_step_count(p) != n) return;
    order_of(p, nodes, n, got);
    for (int i = 0; i < n; i++)
        CHECK_MSG(got[i] == want[i], "%s: step %d runs node %d, want %d", what, i, got[i], want[i]);
}

/* u = exp(a); v = u + 1; w = 3 a; z = 2 v; t = -(u viewed as [2, 2]); q = w + 1. */
typedef struct chain {
    deft_graph *g;
    deft_tensor *n[6];   /* u, v, w, z, t, q: their build order is their step order */
} chain;

static void chain_build(chain *c) {
    c->g = deft_graph_new();
    deft_tensor *a = deft_param(c->g, "a", DEFT_F32, 1, (int64_t[]){4}, deft_cpu(), DEFT_INIT_NORMAL);
    deft_tensor *u = deft_exp(a), *v = deft_add_scalar(u, 1.0), *w = deft_mul_scalar(a, 3.0);
    deft_tensor *z = deft_mul_scalar(v, 2.0), *t = deft_neg(deft_reshape(u, 2, (int64_t[]){2, 2}));
    deft_tensor *q = deft_add_scalar(w, 1.0);
    deft_tensor *n[6] = {u, v, w, z, t, q};
    for (int i = 0; i < 6; i++) c->n[i] = n[i];
}

/* The chain's program stopped after its schedule, its outputs z, t and q (NULL after a failed check). */
static deft_program *chain_scheduled(chain *c) {
    chain_build(c);
    deft_tensor *outs[3] = {c->n[3], c->n[4], c->n[5]};
    return scheduled(c->g, outs, 3);
}

static void test_moves_readers(void) {
    chain c;
    deft_program *p = chain_scheduled(&c);
    if (p) {
        static const int built[6] = {0, 1, 2, 3, 4, 5}, moved_order[6] = {0, 2, 5, 1, 3, 4};
        check_order("before", p, c.n, 6, built);
        int moved = 0;
        CHECK_OK(deft_testing_defer_readers(p, step_of(p, c.n[0]), step_of(p, c.n[5]), &moved));
        CHECK_MSG(moved == 1, "the readers of u could not move past q");
        /* v, z (through v) and t (through the view) follow q; w keeps its place before it */
        check_order("after", p, c.n, 6, moved_order);
        deft_program_free(p);
    }
    deft_graph_free(c.g);
}

static void test_later_member_reads_them(void) {
    chain c;
    deft_program *p = chain_scheduled(&c);
    if (p) {
        static const int built[6] = {0, 1, 2, 3, 4, 5};
        int moved = 1;
        CHECK_OK(deft_testing_defer_readers(p, step_of(p, c.n[0]), step_of(p, c.n[3]), &moved));
        CHECK_MSG(moved == 0, "z reads v, which reads u: nothing may move past z");
        check_order("refused", p, c.n, 6, built);
        CHECK_ERR(deft_testing_defer_readers(p, 3, 3, &moved), DEFT_ERR_INVALID, "defer readers");
        CHECK_ERR(deft_testing_defer_readers(p, 0, 6, &moved), DEFT_ERR_INVALID, "of a program of 6");
        deft_program_free(p);
    }
    deft_graph_free(c.g);
}

/* An optimizer step between the two: the parameter it writes is read by the later steps, so nothing moves. */
static void test_optimizer_between(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_param(g, "a", DEFT_F32, 1, (int64_t[]){4}, deft_cpu(), DEFT_INIT_NORMAL);
    deft_tensor *u = deft_exp(a), *loss = deft_sum(deft_mul(u, u), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL);
    deft_tensor *step = opt ? deft_optimizer_step(opt) : NULL;
    deft_tensor *after = deft_add_scalar(a, 1.0);
    CHECK(step != NULL && after != NULL);
    if (step && after) {
        deft_tensor *outs[3] = {loss, step, after};
        deft_program *p = scheduled(g, outs, 3);
        const int e = p ? step_of(p, u) : -1, r = p ? step_of(p, after) : -1, s = p ? step_of(p, step) : -1;
        CHECK_MSG(!p || (e >= 0 && e < s && s < r), "steps: u %d, optimizer %d, after %d", e, s, r);
        if (p && e >= 0 && e < s && s < r) {
            int moved = 1;
            CHECK_OK(deft_testing_defer_readers(p, e, r, &moved));
            CHECK_MSG(moved == 0, "the readers of u moved past the optimizer's step");
            CHECK_MSG(step_of(p, step) == s && step_of(p, after) == r, "refused, yet the steps moved");
        }
        deft_program_free(p);
    }
    deft_graph_free(g);
}

int main(void) {
    test_moves_readers();
    test_later_member_reads_them();
    test_optimizer_between();
    return deft_check_finish();
}
