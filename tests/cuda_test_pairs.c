/* The pairs of passes/fusion_pairs.c on cuda:0, each against the same program compiled with no_fusion: the values
 * must be the same bits.
 *   ce_pair   cross-entropy's loss (read by a scaling between it and its gradient, which must move) and its
 *             gradient, in f32 and bf16, mean and sum, with an ignore index and label smoothing, rows that stream
 *             through shared memory (one kernel), rows too short for that and the CE_REFERENCE knob (the two kernels
 *             in turn); a target out of range is still reported.
 *   act_pair  an MLP's GELU (both forms), SiLU, tanh and sigmoid made again in the backward pass and their gradients,
 *             in f32 and bf16, on the 16-byte kernel and (MAP_SCALAR knob, or an odd count) the plain one.
 * Each fused program holds the groups. Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it on the CPU
 * (no groups: those checks stand down). */
#include "check.h"
#include "deft_testing.h"
#include "ref.h"

static deft_device GPU;

/* Nodes of op `op` in p's graph that are members of a group of `kind`. */
static int grouped(deft_program *p, const char *op, const char *kind) {
    deft_graph *g = deft_testing_program_graph(p);
    int n = 0;
    for (int id = 0;; id++) {
        deft_tensor *t = deft_testing_node(g, id);
        if (!t) break;
        if (!deft_testing_is_op(t, op)) continue;
        deft_testing_node_plan np;
        deft_testing_program_node_plan(p, t, &np);
        n += np.group_kind && strcmp(np.group_kind, kind) == 0;
    }
    return n;
}

#define MAX_OUTS 4
typedef struct run_result {
    int n;
    int64_t len[MAX_OUTS];
    double *v[MAX_OUTS];
    int pairs;
} run_result;

/* Compiles outs (fused or not), runs twice (the second run replays), reads every output. */
static void run_program(deft_graph *g, deft_tensor **outs, int n, int fuse, const char *op, const char *kind,
                        run_result *r) {
    memset(r, 0, sizeof *r);
    deft_program *p = deft_compile(g, outs, n, &(deft_compile_options){.no_fusion = !fuse});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) return;
    CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_run(p));
    r->n = n;
    for (int i = 0; i < n; i++) {
        r->len[i] = deft_tensor_numel(outs[i]);
        r->v[i] = ref_read_program(p, outs[i], r->len[i]);
    }
    r->pairs = grouped(p, op, kind);
    deft_program_free(p);
}

static void same_bits(const char *what, const run_result *a, const run_result *b) {
    CHECK_MSG(a->n == b->n, "%s: %d outputs against %d", what, a->n, b->n);
    for (int i = 0; i < a->n && i < b->n; i++) {
        int64_t bad = -1;
        for (int64_t k = 0; k < a->len[i] && bad < 0; k++)
            if (memcmp(&a->v[i][k], &b->v[i][k], sizeof(double)) != 0) bad = k;
        CHECK_MSG(a->v[i] && b->v[i] && bad < 0, "%s: output %d differs at %lld: %.9g fused, %.9g apart", what, i,
                  (long long)bad, bad >= 0 ? a->v[i][bad] : 0.0, bad >= 0 ? b->v[i][bad] : 0.0);
    }
}

static void result_free(run_result *r) {
    for (int i = 0; i < r->n; i++) free(r->v[i]);
}

/* ---------------------------------------------------------------- cross-entropy */
typedef struct ce_case {
    int64_t rows, classes;
    deft_dtype dt;
    int ignore, sum, bad_target;
    double ls;
} ce_case;

/* loss = 0.5 cross_entropy(3 p, t): the scaling reads the loss between the loss and its gradient. */
static void ce_program(const ce_case *c, int fuse, run_result *r) {
    deft_graph *g = deft_graph_new();
    const int64_t shape[2] = {c->rows, c->classes};
    deft_tensor *p = deft_param(g, "p", c->dt, 2, shape, GPU, DEFT_INIT_NORMAL);
    int32_t *t = malloc((size_t)c->rows * sizeof *t);
    for (int64_t i = 0; i < c->rows; i++) t[i] = (int32_t)((i * 7919 + 13) % c->classes);
    if (c->ignore) t[1] = t[c->rows / 2] = -100;
    if (c->bad_target) t[c->rows - 1] = (int32_t)c->classes;
    deft_tensor *targets = deft_constant(g, DEFT_I32, 1, &c->rows, GPU, t, (size_t)c->rows * sizeof *t);
    free(t);
    deft_cross_entropy_options o = deft_cross_entropy_defaults();
    o.use_ignore_index = c->ignore;
    o.label_smoothing = c->ls;
    o.reduction = c->sum ? DEFT_REDUCTION_SUM : DEFT_REDUCTION_MEAN;
    deft_tensor *loss = deft_mul_scalar(deft_cross_entropy_ex(deft_mul_scalar(p, 3.0), targets, &o), 0.5);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[2] = {loss, deft_grad(p)};
    if (!c->bad_target) {
        run_program(g, outs, 2, fuse, "cross_entropy", "ce_pair", r);
    } else {
        memset(r, 0, sizeof *r);
        deft_program *prog = deft_compile(g, outs, 2, &(deft_compile_options){.no_fusion = !fuse});
        CHECK_MSG(prog != NULL, "compile: %s", deft_errmsg());
        if (prog) {
            /* The CPU refuses the run; a GPU's run goes on and the read reports the row. */
            float v = 0.0f;
            deft_status s = deft_program_run(prog);
            if (s == DEFT_OK) s = deft_program_read(prog, loss, &v, c->dt == DEFT_F32 ? sizeof v : 2);
            CHECK_MSG(s != DEFT_OK && strstr(deft_errmsg(), "target 1") != NULL,
                      "a target out of range: %d (%s)", (int)s, deft_errmsg());
            r->pairs = grouped(prog, "cross_entropy", "ce_pair");
            deft_program_free(prog);
        }
    }
    deft_graph_free(g);
}

static void ce_check(const ce_case *c, const char *knob) {
    char what[200];
    snprintf(what, sizeof what, "cross_entropy %s [%lld, %lld] ignore %d sum %d ls %g bad %d%s%s",
             deft_dtype_name(c->dt), (long long)c->rows, (long long)c->classes, c->ignore, c->sum, c->ls,
             c->bad_target, knob ? " knob " : "", knob ? knob : "");
    if (knob) CHECK_OK(deft_testing_set_debug(knob, 1));
    run_result fused, apart;
    ce_program(c, 1, &fused);
    ce_program(c, 0, &apart);
    if (knob) CHECK_OK(deft_testing_set_debug(knob, 0));
    if (GPU.type == DEFT_CUDA) CHECK_MSG(fused.pairs == 1, "%s: %d cross-entropy pairs, want 1", what, fused.pairs);
    CHECK_MSG(apart.pairs == 0, "%s: no_fusion formed %d pairs", what, apart.pairs);
    if (!c->bad_target) same_bits(what, &fused, &apart);
    result_free(&fused);
    result_free(&apart);
}

static void test_cross_entropy(void) {
    static const ce_case cases[] = {
        {96, 1536, DEFT_BF16, 0, 0, 0, 0.0},   {64, 1100, DEFT_F32, 0, 0, 0, 0.0},
        {96, 1536, DEFT_BF16, 1, 0, 0, 0.0},   {64, 2048, DEFT_F32, 1, 1, 0, 0.1},
        {33, 4104, DEFT_BF16, 0, 0, 0, 0.05},  {50, 100, DEFT_F32, 1, 0, 0, 0.0},
        {40, 1030, DEFT_BF16, 0, 0, 0, 0.0},   {48, 1536, DEFT_BF16, 0, 0, 1, 0.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) ce_check(&cases[i], NULL);
    ce_check(&cases[0], "CE_REFERENCE");
    ce_check(&cases[3], "CE_REFERENCE");
}

/* ---------------------------------------------------------------- activations */
typedef deft_tensor *(*act_fn)(deft_tensor *);

/* mean((act(x w1) w2)^2) and its gradients; the activation is made again in the backward pass. */
static void act_program(act_fn act, deft_dtype dt, int64_t rows, int fuse, run_result *r) {
    deft_graph *g = deft_graph_new();
    const int64_t k = 24, hid = 40;
    deft_tensor *x = deft_param(g, "x", dt, 2, (int64_t[]){rows, k}, GPU, DEFT_INIT_NORMAL);
    deft_tensor *w1 = deft_param(g, "w1", dt, 2, (int64_t[]){k, hid}, GPU, DEFT_INIT_XAVIER);
    deft_tensor *w2 = deft_param(g, "w2", dt, 2, (int64_t[]){hid, k}, GPU, DEFT_INIT_XAVIER);
    deft_tensor *y = deft_matmul(act(deft_matmul(x, w1)), w2);
    deft_tensor *loss = deft_mean(deft_mul(y, y), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[4] = {loss, deft_grad(x), deft_grad(w1), deft_grad(w2)};
    run_program(g, outs, 4, fuse, "act_grad", "act_pair", r);
    deft_graph_free(g);
}

static void act_check(const char *name, act_fn act, deft_dtype dt, int64_t rows, const char *knob) {
    char what[160];
    snprintf(what, sizeof what, "%s %s rows %lld%s%s", name, deft_dtype_name(dt), (long long)rows,
             knob ? " knob " : "", knob ? knob : "");
    if (knob) CHECK_OK(deft_testing_set_debug(knob, 1));
    run_result fused, apart;
    act_program(act, dt, rows, 1, &fused);
    act_program(act, dt, rows, 0, &apart);
    if (knob) CHECK_OK(deft_testing_set_debug(knob, 0));
    if (GPU.type == DEFT_CUDA) CHECK_MSG(fused.pairs == 1, "%s: %d activation pairs, want 1", what, fused.pairs);
    same_bits(what, &fused, &apart);
    result_free(&fused);
    result_free(&apart);
}

static void test_activations(void) {
    static const struct { const char *name; act_fn fn; } acts[] = {
        {"gelu_tanh", deft_gelu_tanh}, {"gelu", deft_gelu}, {"silu", deft_silu},
        {"tanh", deft_tanh},           {"sigmoid", deft_sigmoid},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        act_check(acts[i].name, acts[i].fn, DEFT_BF16, 64, NULL);
        act_check(acts[i].name, acts[i].fn, DEFT_F32, 37, NULL);
    }
    act_check("gelu_tanh", deft_gelu_tanh, DEFT_BF16, 37, NULL);   /* 37 x 40: a tail past the last vector */
    act_check("gelu_tanh", deft_gelu_tanh, DEFT_BF16, 64, "MAP_SCALAR");
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return 77;
    test_cross_entropy();
    test_activations();
    return deft_check_finish();
}
