/* Casts of parameters run as one launch per device and dtype pair (passes/fusion_casts.c, deft_cuda_casts_run) on
 * cuda:0: the values equal those of the separate casts bit for bit (sizes of 1 to 65536 elements, whole vectors of
 * four and not; to bf16, f16 and f64), more casts than one launch takes make two groups, a cast of another dtype
 * pair is not taken in, and a cast that follows an optimizer step reads the updated parameter, as it does unfused.
 * Each program runs three times (eager, captured, replayed). Skips (exit 77) where no GPU works. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft_testing.h"
#include "ref.h"

static deft_device GPU;

enum { N_SIZES = 7, N_MANY = 30, RUNS = 3, MAX_OUTS = 2 * N_MANY + 4 };
static const int64_t sizes[N_SIZES] = {1, 3, 4, 5, 1000, 4099, 65536};

static deft_tensor *cg_param(deft_graph *g, const char *name, int64_t n, uint64_t seed) {
    deft_tensor *p = deft_param(g, name, DEFT_F32, 1, &n, GPU, DEFT_INIT_ZEROS);
    uint64_t r = seed;
    ref_tensor v = ref_random(&r, DEFT_F32, 1, &n, -3, 3);
    CHECK_OK(deft_param_set(p, v.raw, (size_t)n * sizeof(float)));
    ref_free(&v);
    return p;
}

typedef struct cg_outs {
    void *bytes[MAX_OUTS];
    size_t size[MAX_OUTS];
    int n, steps;
} cg_outs;

/* Compiles outs with or without fusion, runs RUNS times, keeps the outputs' bytes and the step count; *grouped: how
 * many of the outputs `check` (the first n_check) ran in a group. */
static cg_outs cg_run(deft_graph *g, deft_tensor *const *outs, int n, int fusion, int n_check, int *grouped) {
    cg_outs r = {0};
    deft_compile_options o = {0};
    o.no_fusion = !fusion;
    deft_program *p = deft_compile(g, outs, n, &o);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) return r;
    for (int run = 0; run < RUNS; run++) CHECK_OK(deft_program_run(p));
    r.n = n, r.steps = deft_program_step_count(p);
    for (int i = 0; i < n; i++) {
        r.size[i] = deft_tensor_nbytes(outs[i]);
        r.bytes[i] = calloc(1, r.size[i] + 1);
        CHECK_OK(deft_program_read(p, outs[i], r.bytes[i], r.size[i]));
    }
    *grouped = 0;
    for (int i = 0; i < n_check; i++) {
        deft_testing_node_plan np;
        deft_testing_program_node_plan(p, outs[i], &np);
        *grouped += np.group >= 0;
    }
    deft_program_free(p);
    return r;
}

static void cg_same(const char *what, cg_outs *a, cg_outs *b) {
    CHECK_MSG(a->n == b->n, "%s: %d outputs against %d", what, a->n, b->n);
    for (int i = 0; i < a->n && i < b->n; i++)
        CHECK_MSG(a->size[i] == b->size[i] && !memcmp(a->bytes[i], b->bytes[i], a->size[i]),
                  "%s: output %d differs fused / unfused", what, i);
    for (int i = 0; i < a->n; i++) free(a->bytes[i]);
    for (int i = 0; i < b->n; i++) free(b->bytes[i]);
}

/* Casts of N_SIZES parameters to bf16 and to f16, one to f64, and of N_MANY more to bf16. */
static void test_groups(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *outs[MAX_OUTS];
    int n = 0;
    char name[32];
    for (int i = 0; i < N_SIZES; i++) {
        snprintf(name, sizeof name, "p%d", i);
        deft_tensor *p = cg_param(g, name, sizes[i], 100 + (uint64_t)i);
        outs[i] = deft_cast(p, DEFT_BF16);
        outs[N_SIZES + i] = deft_cast(p, DEFT_F16);
    }
    n = 2 * N_SIZES;
    outs[n++] = deft_cast(cg_param(g, "single", 77, 7), DEFT_F64);
    deft_tensor *many[N_MANY];
    for (int i = 0; i < N_MANY; i++) {
        snprintf(name, sizeof name, "m%d", i);
        many[i] = deft_cast(cg_param(g, name, 8 + i, 200 + (uint64_t)i), DEFT_BF16);
    }
    CHECK_MSG(deft_graph_error(g) == DEFT_OK, "build: %s", deft_graph_errmsg(g));
    int grouped = 0, none = 0;
    cg_outs f = cg_run(g, outs, n, 1, 2 * N_SIZES, &grouped), u = cg_run(g, outs, n, 0, 2 * N_SIZES, &none);
    CHECK_MSG(grouped == 2 * N_SIZES && none == 0, "%d of %d casts grouped fused, %d unfused", grouped, 2 * N_SIZES,
              none);
    CHECK_MSG(f.steps == u.steps - 2 * (N_SIZES - 1), "%d steps fused, %d unfused: want two groups of %d", f.steps,
              u.steps, N_SIZES);
    cg_same("bf16, f16 and f64 casts", &f, &u);
    /* N_MANY casts of one pair: a full group and the rest */
    f = cg_run(g, many, N_MANY, 1, N_MANY, &grouped), u = cg_run(g, many, N_MANY, 0, 0, &none);
    CHECK_MSG(f.steps == u.steps - (N_MANY - 2), "%d casts: %d steps fused, %d unfused (two groups)", N_MANY, f.steps,
              u.steps);
    CHECK_MSG(grouped == N_MANY, "%d of %d casts grouped", grouped, N_MANY);
    cg_same("many casts", &f, &u);
    deft_graph_free(g);
}

/* loss = sum(f32(bf16(w1) * bf16(w2))); an SGD step; then bf16(w2) again: it must see the step's w2. Built once per
 * program, as the step changes the graph's parameters. */
static deft_graph *cg_step_graph(deft_tensor **outs) {
    deft_graph *g = deft_graph_new();
    deft_tensor *w1 = cg_param(g, "w1", 1000, 1), *w2 = cg_param(g, "w2", 1000, 2);
    deft_tensor *prod = deft_mul(deft_cast(w1, DEFT_BF16), deft_cast(w2, DEFT_BF16));
    deft_tensor *loss = deft_sum(deft_cast(prod, DEFT_F32), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.5}, NULL);
    outs[2] = opt ? deft_optimizer_step(opt) : NULL;
    outs[0] = deft_cast(w2, DEFT_BF16), outs[1] = loss;
    CHECK_MSG(outs[0] && outs[2], "build: %s", deft_graph_errmsg(g));
    return g;
}

static void test_cast_after_step(void) {
    deft_tensor *fo[3], *uo[3];
    deft_graph *gf = cg_step_graph(fo), *gu = cg_step_graph(uo);
    int grouped = 0, none = 0;
    if (fo[0] && fo[2] && uo[0] && uo[2]) {
        cg_outs f = cg_run(gf, fo, 3, 1, 1, &grouped), u = cg_run(gu, uo, 3, 0, 1, &none);
        CHECK_MSG(grouped == 0, "the cast after the optimizer step was grouped with the casts before it");
        cg_same("a cast after an optimizer step", &f, &u);
    }
    deft_graph_free(gf);
    deft_graph_free(gu);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    if (GPU.type != DEFT_CUDA) {
        printf("fusion runs on GPUs only: skipped\n");
        return DEFT_CHECK_SKIP;
    }
    test_groups();
    test_cast_after_step();
    return deft_check_finish();
}
