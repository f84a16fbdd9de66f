/* Laziness: building runs nothing, compiling schedules only what the outputs need, views alias their source. */
#include "check.h"

static void test_dead_branch_never_runs(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 1, (int64_t[]){5}, deft_cpu());
    deft_tensor *live = deft_mul_scalar(deft_add_scalar(x, 1.0), 2.0);
    deft_tensor *dead = deft_exp(deft_mul(x, x));
    deft_tensor *dead_leaf = deft_uniform(g, DEFT_F32, 1, (int64_t[]){1000}, deft_cpu(), 0, 1, 7);
    CHECK(live && dead && dead_leaf);
    deft_program *p = deft_compile(g, &live, 1, NULL);
    CHECK(p != NULL);
    CHECK(deft_program_step_count(p) == 2);
    CHECK(deft_program_schedules(p, live));
    CHECK(!deft_program_schedules(p, dead));
    CHECK(!deft_program_schedules(p, dead_leaf));
    float in[5] = {0, 1, 2, 3, 4}, out[5];
    CHECK_OK(deft_program_feed(p, x, in, sizeof in));
    for (int r = 0; r < 3; r++) CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_read(p, live, out, sizeof out));
    for (int i = 0; i < 5; i++) CHECK_NEAR(out[i], 2.0 * (in[i] + 1.0), 0);
    CHECK(deft_program_node_runs(p, live) == 3);
    CHECK(deft_program_node_runs(p, dead) == 0);
    deft_graph_free(g);
}

static void test_building_runs_nothing(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_full(g, DEFT_F32, 2, (int64_t[]){2, 3}, deft_cpu(), 1.5);
    deft_tensor *b = deft_sum(deft_add(a, a), 0, NULL, 0);
    CHECK(deft_graph_node_count(g) == 3);
    /* Nothing computed yet: there is no program to read from. */
    deft_program *p = deft_compile(g, &b, 1, NULL);
    float v = 0;
    CHECK_ERR(deft_program_read(p, b, &v, sizeof v), DEFT_ERR_STATE, "run the program first");
    CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_read(p, b, &v, sizeof v));
    CHECK_NEAR(v, 18.0, 1e-6);
    deft_graph_free(g);
}

static void test_views_alias(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_arange(g, DEFT_F32, 0, 24, 1, deft_cpu());
    deft_tensor *r = deft_reshape(a, 3, (int64_t[]){2, 3, 4});
    deft_tensor *s = deft_slice(r, 0, 1, 2, 1);          /* contiguous: a view */
    deft_tensor *t = deft_slice(r, 2, 1, 4, 2);          /* strided: a copy */
    deft_tensor *sum_s = deft_sum(s, 0, NULL, 0);
    deft_tensor *outs[] = {sum_s, t};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK(p != NULL);
    CHECK(deft_program_step_count(p) == 3);  /* arange, the strided slice, the sum */
    CHECK_OK(deft_program_run(p));
    float v, tv[12];
    CHECK_OK(deft_program_read(p, sum_s, &v, sizeof v));
    CHECK_NEAR(v, 12 + 13 + 14 + 15 + 16 + 17 + 18 + 19 + 20 + 21 + 22 + 23, 1e-4);
    CHECK_OK(deft_program_read(p, t, tv, sizeof tv));
    for (int i = 0; i < 6; i++) {
        CHECK_NEAR(tv[2 * i], 4 * i + 1, 0);
        CHECK_NEAR(tv[2 * i + 1], 4 * i + 3, 0);
    }
    deft_memory_report m;
    CHECK_OK(deft_program_memory(p, &m));
    CHECK(m.buffers == 3);
    deft_graph_free(g);
}

static void test_to_is_free_when_nothing_changes(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_full(g, DEFT_F32, 1, (int64_t[]){4}, deft_cpu(), 2.0);
    CHECK(deft_to(a, deft_cpu(), DEFT_F32) == a);
    CHECK(deft_cast(a, DEFT_F32) == a);
    int n = deft_graph_node_count(g);
    deft_tensor *h = deft_to(a, deft_cpu(), DEFT_F16);
    CHECK(h != a && deft_graph_node_count(g) == n + 1);
    uint16_t hv[4];
    CHECK_OK(deft_realize(h, hv, sizeof hv));
    CHECK_NEAR(deft_f16_to_f32(hv[3]), 2.0, 0);
    deft_graph_free(g);
}

static void test_params_persist(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){3, 2}, deft_cpu(), DEFT_INIT_KAIMING);
    float wv[6], bound = 1.0f / sqrtf(3.0f);
    CHECK_OK(deft_param_get(w, wv, sizeof wv));
    int distinct = 0;
    for (int i = 0; i < 6; i++) {
        CHECK(fabsf(wv[i]) <= bound);
        distinct += i > 0 && wv[i] != wv[i - 1];
    }
    CHECK(distinct >= 4);
    float ones[6] = {1, 1, 1, 1, 1, 1};
    CHECK_OK(deft_param_set(w, ones, sizeof ones));
    deft_tensor *s = deft_sum(w, 0, NULL, 0);
    float v;
    CHECK_OK(deft_realize(s, &v, sizeof v));
    CHECK_NEAR(v, 6.0, 0);
    CHECK_ERR(deft_param_set(w, ones, 5), DEFT_ERR_INVALID, "5 bytes given");
    CHECK_ERR(deft_param_get(s, wv, sizeof wv), DEFT_ERR_STATE, "not a parameter");
    deft_graph_free(g);
}

int main(void) {
    test_dead_branch_never_runs();
    test_building_runs_nothing();
    test_views_alias();
    test_to_is_free_when_nothing_changes();
    test_params_persist();
    return deft_check_finish();
}
