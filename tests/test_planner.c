/* The first memory plan: no two buffers that live at the same step overlap, reuse never changes results, and the
 * arena stays near the lower bound. */
#include <limits.h>
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"
#include "xorshift.h"

static uint64_t rng_state = 88172645463325252ull;
static int rand_below(int n) { return xorshift64_below(&rng_state, n); }

static int overlaps(const deft_testing_plan_buffer *a, const deft_testing_plan_buffer *b) {
    int live_together = a->first <= b->last && b->first <= a->last;
    int share_bytes = a->offset < b->offset + b->size && b->offset < a->offset + a->size;
    return live_together && share_bytes;
}

/* Plans bufs and checks the plan: aligned, inside the arena, no two live buffers overlapping, arena between the lower
 * bound and the no-reuse size. */
static void plan_and_check(deft_testing_plan_buffer *bufs, int n, int trial) {
    deft_testing_plan_stats st;
    CHECK_OK(deft_testing_plan(bufs, n, 0, &st));
    int bad = 0;
    for (int i = 0; i < n; i++) {
        bad += bufs[i].offset % DEFT_TESTING_PLAN_ALIGN != 0 || bufs[i].offset + bufs[i].size > st.arena_bytes;
        for (int j = i + 1; j < n; j++) bad += overlaps(&bufs[i], &bufs[j]);
    }
    CHECK_MSG(bad == 0, "trial %d: %d overlapping or misplaced buffers", trial, bad);
    CHECK(st.lower_bound <= st.arena_bytes && st.arena_bytes <= st.no_reuse_bytes);
}

static void test_planner_random_lifetimes(void) {
    enum { N = 300 };
    static deft_testing_plan_buffer bufs[N];
    for (int trial = 0; trial < 50; trial++) {
        int n = 1 + rand_below(N);
        for (int i = 0; i < n; i++) {
            int first = rand_below(200), len = rand_below(20);
            bufs[i] = (deft_testing_plan_buffer){(size_t)(1 + rand_below(100000)), first, first + len, 0};
        }
        plan_and_check(bufs, n, trial);
    }
    deft_testing_plan_buffer backwards = {16, 5, 2, 0};
    CHECK_ERR(deft_testing_plan(&backwards, 1, 0, &(deft_testing_plan_stats){0}), DEFT_ERR_INVALID, "lifetime [5, 2]");
}

/* Long and short lifetimes mixed, sizes over three orders of magnitude: the shapes that make the repair pass move
 * buffers and displace others. */
static void test_planner_mixed_lifetimes(void) {
    enum { N = 600 };
    static deft_testing_plan_buffer bufs[N];
    for (int trial = 0; trial < 40; trial++) {
        int n = 50 + rand_below(N - 50), steps = 50 + rand_below(2000);
        for (int i = 0; i < n; i++) {
            int first = rand_below(steps), len = rand_below(8) == 0 ? rand_below(steps) : rand_below(12);
            size_t size = (size_t)256 << rand_below(6);
            if (rand_below(3) == 0) size -= (size_t)rand_below(200);
            bufs[i] = (deft_testing_plan_buffer){size, first, first + len, 0};
        }
        plan_and_check(bufs, n, trial);
    }
}

/* Step numbers far apart (the planner renumbers them to their ranks): the same overlaps, the same lower bound. */
static void test_planner_sparse_steps(void) {
    enum { N = 200 };
    static deft_testing_plan_buffer bufs[N], dense[N];
    for (int i = 0; i < N; i++) {
        int first = rand_below(300), len = rand_below(30);
        dense[i] = (deft_testing_plan_buffer){(size_t)(1 + rand_below(5000)), first, first + len, 0};
        bufs[i] = (deft_testing_plan_buffer){dense[i].size, first * 6000000, (first + len) * 6000000 + 5, 0};
    }
    deft_testing_plan_stats st, st_dense;
    CHECK_OK(deft_testing_plan(bufs, N, 0, &st));
    CHECK_OK(deft_testing_plan(dense, N, 0, &st_dense));
    CHECK(st.lower_bound == st_dense.lower_bound);
    CHECK(bufs[0].first == dense[0].first * 6000000);   /* the caller's lifetimes stay as they were */
    int bad = 0;
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++) bad += overlaps(&bufs[i], &bufs[j]);
    CHECK_MSG(bad == 0, "%d overlapping buffers", bad);
}

static void test_planner_edges(void) {
    deft_testing_plan_stats st;
    CHECK_OK(deft_testing_plan(NULL, 0, 0, &st));
    CHECK(st.arena_bytes == 0 && st.lower_bound == 0 && st.no_reuse_bytes == 0);
    deft_testing_plan_buffer one = {1, 3, 3, 77};
    CHECK_OK(deft_testing_plan(&one, 1, 0, &st));
    CHECK(one.offset == 0 && st.arena_bytes == 256 && st.lower_bound == 256);
    /* Two buffers live together never share; apart, they do. */
    deft_testing_plan_buffer two[2] = {{1000, 0, 1, 0}, {1000, 1, 2, 0}};
    CHECK_OK(deft_testing_plan(two, 2, 0, &st));
    CHECK(st.arena_bytes == 2048 && two[0].offset != two[1].offset);
    two[1].first = 2;
    CHECK_OK(deft_testing_plan(two, 2, 0, &st));
    CHECK(st.arena_bytes == 1024 && two[0].offset == 0 && two[1].offset == 0);
    CHECK_OK(deft_testing_plan(two, 2, 1, &st));
    CHECK(st.arena_bytes == 2048 && st.lower_bound == 1024 && two[1].offset == 1024);
    deft_testing_plan_buffer endless = {16, 0, INT_MAX, 0};
    CHECK_ERR(deft_testing_plan(&endless, 1, 0, &st), DEFT_ERR_INVALID, "lifetime [0, 2147483647]");
    CHECK_ERR(deft_testing_plan(&one, -1, 0, &st), DEFT_ERR_INVALID, "-1 buffers");
}

/* Same-size buffers: any step's live set stacks without holes, so the plan must reach the lower bound. */
static void test_planner_equal_sizes_reach_bound(void) {
    enum { N = 400 };
    static deft_testing_plan_buffer bufs[N];
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < N; i++) {
            int first = rand_below(500), len = rand_below(40);
            bufs[i] = (deft_testing_plan_buffer){4096, first, first + len, 0};
        }
        deft_testing_plan_stats st;
        CHECK_OK(deft_testing_plan(bufs, N, 0, &st));
        CHECK_MSG(st.arena_bytes == st.lower_bound, "trial %d: arena %zu, bound %zu", trial, st.arena_bytes,
                  st.lower_bound);
    }
}

static void test_chain_runs_in_place(void) {
    /* A chain of 20 same-size elementwise ops: each input dies where the next op reads it, so all run in place in
     * one buffer; without in-place reuse two would be live at a time. */
    deft_graph *g = deft_graph_new();
    deft_tensor *t = deft_full(g, DEFT_F32, 1, (int64_t[]){1000}, deft_cpu(), 1.0);
    for (int i = 0; i < 20; i++) t = deft_add_scalar(t, 1.0);
    deft_program *p = deft_compile(g, &t, 1, NULL);
    deft_memory_report m;
    CHECK_OK(deft_program_memory(p, &m));
    CHECK(m.buffers == 1);
    CHECK(m.arena_bytes == 4096);
    CHECK(m.lower_bound_bytes == 4096);
    CHECK(m.no_reuse_bytes == 21 * 4096);
    CHECK_OK(deft_program_run(p));
    float v[1000];
    CHECK_OK(deft_program_read(p, t, v, sizeof v));
    CHECK(v[0] == 21.0f && v[999] == 21.0f);
    deft_graph_free(g);
}

/* A random DAG of elementwise and shape ops over a few inputs; returns its outputs. */
static int build_random_dag(deft_tensor **in, int n_in, int n_nodes, deft_tensor **outs) {
    deft_tensor *pool[512];
    int np = 0;
    for (int i = 0; i < n_in; i++) pool[np++] = in[i];
    for (int k = 0; k < n_nodes && np < 512; k++) {
        deft_tensor *a = pool[np - 1 - rand_below(np < 8 ? np : 8)], *b = pool[rand_below(np)], *t;
        switch (rand_below(6)) {
        case 0: t = deft_add(a, b); break;
        case 1: t = deft_mul(a, deft_tanh(b)); break;
        case 2: t = deft_relu(a); break;
        case 3: t = deft_maximum(a, deft_mul_scalar(b, 0.5)); break;
        case 4: t = deft_reshape(deft_transpose(deft_reshape(a, 2, (int64_t[]){16, 8}), 0, 1), 1, (int64_t[]){128}); break;
        default: t = deft_sub(deft_sigmoid(a), b); break;
        }
        pool[np++] = t;
    }
    int n_out = 1 + rand_below(3);
    for (int i = 0; i < n_out; i++) outs[i] = pool[np - 1 - rand_below(np / 2)];
    outs[0] = pool[np - 1];
    return n_out;
}

/* No two arena buffers that live at the same step share a byte. */
static void check_program_plan(const deft_graph *g, const deft_program *p) {
    deft_testing_node_plan plans[1024];
    int n = 0;
    for (int i = 0; i < deft_graph_node_count(g) && n < 1024; i++) {
        deft_testing_program_node_plan(p, deft_testing_node(g, i), &plans[n]);
        int seen = 0;   /* nodes that ran in place share their buffer: count each buffer once */
        for (int j = 0; j < n; j++) seen |= plans[j].buffer == plans[n].buffer;
        if (plans[n].place == DEFT_TESTING_PLACE_ARENA && !seen) n++;
    }
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            deft_testing_plan_buffer a = {plans[i].size, plans[i].first, plans[i].last, plans[i].offset};
            deft_testing_plan_buffer b = {plans[j].size, plans[j].first, plans[j].last, plans[j].offset};
            bad += overlaps(&a, &b);
        }
    CHECK_MSG(bad == 0, "%d pairs of live buffers overlap", bad);
    deft_memory_report m;
    CHECK_OK(deft_program_memory(p, &m));
    CHECK(m.lower_bound_bytes <= m.arena_bytes && m.arena_bytes <= m.no_reuse_bytes);
}

static void test_reuse_equals_no_reuse(void) {
    for (int trial = 0; trial < 30; trial++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *in[3];
        for (int i = 0; i < 3; i++) in[i] = deft_input(g, "x", DEFT_F32, 1, (int64_t[]){128}, deft_cpu());
        deft_tensor *outs[3];
        int n_out = build_random_dag(in, 3, 20 + rand_below(200), outs);
        deft_program *reuse = deft_compile(g, outs, n_out, NULL);
        deft_program *plain = deft_compile(g, outs, n_out, &(deft_compile_options){.no_reuse = 1});
        CHECK(reuse && plain);
        if (!reuse || !plain) {
            deft_graph_free(g);
            continue;
        }
        check_program_plan(g, reuse);
        float x[128];
        for (int i = 0; i < 3; i++) {
            for (int j = 0; j < 128; j++) x[j] = (float)((int)(xorshift64(&rng_state) % 2001) - 1000) / 250.0f;
            CHECK_OK(deft_program_feed(reuse, in[i], x, sizeof x));
            CHECK_OK(deft_program_feed(plain, in[i], x, sizeof x));
        }
        CHECK_OK(deft_program_run(reuse));
        CHECK_OK(deft_program_run(plain));
        for (int o = 0; o < n_out; o++) {
            float a[128], b[128];
            CHECK_OK(deft_program_read(reuse, outs[o], a, sizeof a));
            CHECK_OK(deft_program_read(plain, outs[o], b, sizeof b));
            CHECK_MSG(memcmp(a, b, sizeof a) == 0, "trial %d output %d differs with reuse", trial, o);
        }
        deft_memory_report mr, mp;
        deft_program_memory(reuse, &mr);
        deft_program_memory(plain, &mp);
        CHECK(mr.arena_bytes <= mp.arena_bytes);
        deft_graph_free(g);
    }
}

int main(void) {
    test_planner_random_lifetimes();
    test_planner_mixed_lifetimes();
    test_planner_sparse_steps();
    test_planner_edges();
    test_planner_equal_sizes_reach_bound();
    test_chain_runs_in_place();
    test_reuse_equals_no_reuse();
    return deft_check_finish();
}
