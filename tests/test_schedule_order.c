/* Schedule reordering: the order is always a topological order, its peak of live bytes is never above the given
 * order's, it finds the good order on shapes where one clearly exists, and bad dependencies are refused. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdint.h>
#include <time.h>

#include "check.h"
#include "deft_testing.h"
#include "xorshift.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static int rand_below(int n) { return xorshift64_below(&rng_state, n); }

/* A step list under construction. */
typedef struct sched_graph {
    deft_testing_order_step steps[512];
    int deps[4096];
    int n, n_deps;
} sched_graph;

static int add_step(sched_graph *g, size_t bytes, int keep_alive, int n_deps, const int *deps) {
    deft_testing_order_step *s = &g->steps[g->n];
    s->bytes = bytes;
    s->keep_alive = keep_alive;
    s->dep_begin = g->n_deps;
    for (int k = 0; k < n_deps; k++) g->deps[g->n_deps++] = deps[k];
    s->dep_end = g->n_deps;
    return g->n++;
}

/* The reference peak, straight from the definition: at each position, the outputs already made that are kept, are
 * read at that position or later, or are made right there. */
static size_t peak_of(const deft_testing_order_step *steps, int n, const int *deps, const int *order) {
    static int pos[100000];
    for (int k = 0; k < n; k++) pos[order[k]] = k;
    size_t peak = 0;
    for (int t = 0; t < n; t++) {
        size_t live = 0;
        for (int s = 0; s < n; s++) {
            if (pos[s] > t) continue;
            int alive = steps[s].keep_alive || pos[s] == t;
            for (int r = s + 1; r < n && !alive; r++)
                for (int k = steps[r].dep_begin; k < steps[r].dep_end; k++)
                    if (deps[k] == s && pos[r] >= t) alive = 1;
            if (alive) live += steps[s].bytes;
        }
        if (live > peak) peak = live;
    }
    return peak;
}

/* Every step exactly once, each after all its dependencies. */
static int is_topological(const deft_testing_order_step *steps, int n, const int *deps, const int *order) {
    static int pos[100000];
    for (int i = 0; i < n; i++) pos[i] = -1;
    for (int k = 0; k < n; k++) {
        if (order[k] < 0 || order[k] >= n || pos[order[k]] >= 0) return 0;
        pos[order[k]] = k;
    }
    for (int i = 0; i < n; i++)
        for (int k = steps[i].dep_begin; k < steps[i].dep_end; k++)
            if (pos[deps[k]] >= pos[i]) return 0;
    return 1;
}

static void identity(int *order, int n) {
    for (int i = 0; i < n; i++) order[i] = i;
}

static void test_random_dags(void) {
    static sched_graph g;
    static int order[512], given[512];
    int better = 0;
    for (int trial = 0; trial < 300; trial++) {
        g.n = g.n_deps = 0;
        int n = 1 + rand_below(trial < 200 ? 40 : 200), window = 1 + rand_below(20);
        for (int i = 0; i < n; i++) {
            int d[4], nd = i == 0 ? 0 : rand_below(4);
            for (int k = 0; k < nd; k++) {   /* mostly recent steps, now and then any earlier one (or a repeat) */
                int back = rand_below(5) == 0 ? i : (window < i ? window : i);
                d[k] = i - 1 - rand_below(back);
            }
            size_t bytes = rand_below(6) == 0 ? 0 : (size_t)1 << rand_below(16);
            add_step(&g, bytes, rand_below(8) == 0 || i == n - 1, nd, d);
        }
        CHECK_OK(deft_testing_schedule_order(g.steps, n, g.deps, order));
        CHECK_MSG(is_topological(g.steps, n, g.deps, order), "trial %d: not a topological order", trial);
        identity(given, n);
        size_t mine = peak_of(g.steps, n, g.deps, order), theirs = peak_of(g.steps, n, g.deps, given);
        CHECK_MSG(mine <= theirs, "trial %d: peak %zu above the given order's %zu", trial, mine, theirs);
        better += mine < theirs;
    }
    CHECK_MSG(better > 30, "reordering lowered the peak in only %d of 300 random graphs", better);
}

/* Two chains, given interleaved: each makes a big buffer that its next step reduces to a small output. */
static void test_two_chains(void) {
    static sched_graph g;
    g.n = g.n_deps = 0;
    int a1 = add_step(&g, 100, 0, 0, NULL);
    int b1 = add_step(&g, 100, 0, 0, NULL);
    add_step(&g, 1, 1, 1, &a1);
    add_step(&g, 1, 1, 1, &b1);
    int order[4], given[4] = {0, 1, 2, 3};
    CHECK(peak_of(g.steps, g.n, g.deps, given) == 201);
    CHECK_OK(deft_testing_schedule_order(g.steps, g.n, g.deps, order));
    CHECK(order[0] == 0 && order[1] == 2 && order[2] == 1 && order[3] == 3);
    CHECK(peak_of(g.steps, g.n, g.deps, order) == 102);
}

/* An input fans out to four big intermediates, each reduced to a small one, and all of those to one output. Given
 * stage by stage, all four big ones are live at once (peak 410 bytes); branch by branch, one is (113). */
static void test_fan_out_then_reduce(void) {
    static sched_graph g;
    g.n = g.n_deps = 0;
    int x = add_step(&g, 10, 0, 0, NULL), big[4], small[4];
    for (int k = 0; k < 4; k++) big[k] = add_step(&g, 100, 0, 1, &x);
    for (int k = 0; k < 4; k++) small[k] = add_step(&g, 1, 0, 1, &big[k]);
    add_step(&g, 1, 1, 4, small);
    int order[10], given[10];
    identity(given, g.n);
    CHECK(peak_of(g.steps, g.n, g.deps, given) == 410);
    CHECK_OK(deft_testing_schedule_order(g.steps, g.n, g.deps, order));
    CHECK(is_topological(g.steps, g.n, g.deps, order));
    size_t peak = peak_of(g.steps, g.n, g.deps, order);
    CHECK_MSG(peak == 113, "peak %zu, wanted 113", peak);
    for (int k = 0; k < 4; k++) CHECK(order[1 + 2 * k] == big[k] && order[2 + 2 * k] == small[k]);
}

/* A shape where the greedy choice loses: it runs the kept step 3 early (it adds less than step 1), and step 2's big
 * output then comes on top of it. The given order stays. */
static void test_keeps_given_order_when_greedy_loses(void) {
    static sched_graph g;
    g.n = g.n_deps = 0;
    add_step(&g, 5, 1, 0, NULL);
    add_step(&g, 20, 0, 0, NULL);
    add_step(&g, 50, 0, 2, (int[]){0, 1});
    add_step(&g, 10, 1, 0, NULL);
    int order[6];
    CHECK_OK(deft_testing_schedule_order(g.steps, g.n, g.deps, order));
    for (int i = 0; i < 4; i++) CHECK(order[i] == i);
    CHECK(peak_of(g.steps, g.n, g.deps, order) == 75);
    /* A chain has one order only. */
    g.n = g.n_deps = 0;
    for (int i = 0; i < 6; i++) add_step(&g, 64, i == 5, i ? 1 : 0, (int[]){i - 1});
    CHECK_OK(deft_testing_schedule_order(g.steps, g.n, g.deps, order));
    for (int i = 0; i < 6; i++) CHECK(order[i] == i);
}

/* A loss in four blocks, as gpt2.h takes it: each block's logits L (100 bytes) are read by its loss C and by its
 * gradient G (100, which also reads a seed), and G by the head's two products A (1, toward the weight's gradient)
 * and B (1, toward the input's): given forward first, all four L are live at once (peak over 400); the eager
 * depth-first order takes each block through G, A and B before the next block's logits (peak at most 250). */
static void test_loss_blocks(void) {
    static sched_graph g;
    g.n = g.n_deps = 0;
    int h = add_step(&g, 10, 0, 0, NULL), logits[4], loss[4], a[4], b[4];
    for (int k = 0; k < 4; k++) {
        logits[k] = add_step(&g, 100, 0, 1, &h);
        loss[k] = add_step(&g, 1, 0, 1, &logits[k]);
    }
    add_step(&g, 1, 1, 4, loss);
    int seed = add_step(&g, 1, 0, 0, NULL);
    for (int k = 3; k >= 0; k--) {
        int grad = add_step(&g, 100, 0, 2, (int[]){logits[k], seed});
        a[k] = add_step(&g, 1, 0, 1, &grad);
        b[k] = add_step(&g, 1, 0, 1, &grad);
    }
    add_step(&g, 1, 1, 4, a);
    add_step(&g, 1, 1, 4, b);
    int order[32], given[32];
    identity(given, g.n);
    CHECK(peak_of(g.steps, g.n, g.deps, given) > 400);
    CHECK_OK(deft_testing_schedule_order(g.steps, g.n, g.deps, order));
    CHECK(is_topological(g.steps, g.n, g.deps, order));
    const size_t peak = peak_of(g.steps, g.n, g.deps, order);
    CHECK_MSG(peak <= 250, "peak %zu, wanted at most 250", peak);
}

static void test_bad_input(void) {
    static sched_graph g;
    int order[4];
    g.n = g.n_deps = 0;
    add_step(&g, 8, 0, 0, NULL);
    add_step(&g, 8, 0, 1, (int[]){2});
    add_step(&g, 8, 1, 1, (int[]){0});
    CHECK_ERR(deft_testing_schedule_order(g.steps, g.n, g.deps, order), DEFT_ERR_INVALID, "step 1 depends on step 2");
    g.deps[0] = 1;   /* on itself */
    CHECK_ERR(deft_testing_schedule_order(g.steps, g.n, g.deps, order), DEFT_ERR_INVALID, "step 1 depends on step 1");
    g.deps[0] = -3;
    CHECK_ERR(deft_testing_schedule_order(g.steps, g.n, g.deps, order), DEFT_ERR_INVALID, "step 1 depends on step -3");
    g.deps[0] = 0;
    g.steps[2].dep_end = g.steps[2].dep_begin - 1;
    CHECK_ERR(deft_testing_schedule_order(g.steps, g.n, g.deps, order), DEFT_ERR_INVALID, "step 2 has dependencies");
    g.steps[2].dep_end = g.steps[2].dep_begin + 1;
    CHECK_ERR(deft_testing_schedule_order(g.steps, g.n, NULL, order), DEFT_ERR_INVALID, "deps is NULL");
    CHECK_ERR(deft_testing_schedule_order(g.steps, -1, g.deps, order), DEFT_ERR_INVALID, "-1 steps");
    CHECK_OK(deft_testing_schedule_order(g.steps, g.n, g.deps, order));
    CHECK(order[0] == 0 && order[1] == 1 && order[2] == 2);
    CHECK_OK(deft_testing_schedule_order(NULL, 0, NULL, NULL));
    /* More dependencies than an int indexes: refused before any is read. */
    const deft_testing_order_step huge[2] = {{8, 0, 0, INT_MAX}, {8, 0, 0, INT_MAX}};
    CHECK_ERR(deft_testing_schedule_order(huge, 2, g.deps, order), DEFT_ERR_INVALID, "more than an int indexes");
}

/* 100k steps in layers of 100 independent chains given layer by layer: the order must stay valid and come fast. */
static void test_large(void) {
    enum { N = 100000, CHAINS = 100 };
    static deft_testing_order_step steps[N];
    static int deps[2 * N], order[N];
    int nd = 0;
    for (int i = 0; i < N; i++) {
        steps[i] = (deft_testing_order_step){(size_t)(256 << rand_below(6)), i >= N - CHAINS, nd, nd};
        if (i >= CHAINS) deps[nd++] = i - CHAINS;
        if (i >= 4 * CHAINS && rand_below(10) == 0) deps[nd++] = rand_below(i - CHAINS);
        steps[i].dep_end = nd;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_OK(deft_testing_schedule_order(steps, N, deps, order));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECK(is_topological(steps, N, deps, order));
    printf("100k steps reordered in %.1f ms\n", ms);
    CHECK_MSG(ms < 2000, "%.1f ms", ms);   /* a loose guard against quadratic time; the bench measures */
}

int main(void) {
    test_random_dags();
    test_two_chains();
    test_fan_out_then_reduce();
    test_keeps_given_order_when_greedy_loses();
    test_loss_blocks();
    test_bad_input();
    test_large();
    return deft_check_finish();
}
