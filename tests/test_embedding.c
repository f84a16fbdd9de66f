/* Gathers and selection on the CPU: embedding, index_select, where and masked_fill against plain references, their
 * gradients against finite differences, the embedding's gradient bit for bit against a sum in position order (and
 * the same bits every run), ids out of range at run time and at build time, build errors, tied weights (an LM head
 * reading the embedding table transposed), and the new nodes in the DOT dump, the plan table and checkpointing. */
#include "check.h"
#include "deft_testing.h"
#include "ref.h"
#include "grad_check.h"

static uint64_t rng = 2024;

static deft_tensor *const_i32(deft_graph *g, int ndim, const int64_t *shape, const int32_t *v) {
    return deft_constant(g, DEFT_I32, ndim, shape, deft_cpu(), v, (size_t)ref_numel(ndim, shape) * sizeof *v);
}

/* ---------------------------------------------------------------- embedding values */
static void test_embedding_values(void) {
    static const deft_dtype dts[] = {DEFT_F32, DEFT_F64, DEFT_F16, DEFT_BF16};
    const int64_t tshape[2] = {7, 5}, ishape[2] = {2, 3};
    const int32_t ids[6] = {3, 0, 6, 3, 3, 1};
    for (int k = 0; k < 4; k++) {
        deft_graph *g = deft_graph_new();
        ref_tensor table = ref_random(&rng, dts[k], 2, tshape, -2, 2);
        deft_tensor *y = deft_embedding(ref_const(g, &table), const_i32(g, 2, ishape, ids));
        CHECK(y && deft_tensor_ndim(y) == 3 && deft_tensor_dim(y, 0) == 2 && deft_tensor_dim(y, 1) == 3 &&
              deft_tensor_dim(y, 2) == 5 && deft_tensor_dtype(y) == dts[k]);
        CHECK(y && strcmp(deft_testing_op(y), "embedding") == 0);
        double *got = ref_realize(y);
        int exact = got != NULL;
        for (int j = 0; got && j < 6; j++)
            for (int c = 0; c < 5; c++) exact = exact && got[j * 5 + c] == table.v[ids[j] * 5 + c];
        CHECK_MSG(exact, "embedding %s: rows are not the table's", deft_dtype_name(dts[k]));
        free(got);
        /* ids with no dimension: one row */
        const int32_t one = 6;
        got = ref_realize(deft_embedding(ref_const(g, &table), const_i32(g, 0, NULL, &one)));
        CHECK(got && got[0] == table.v[30] && got[4] == table.v[34]);
        free(got);
        ref_free(&table);
        deft_graph_free(g);
    }
}

/* ---------------------------------------------------------------- gradients against finite differences */
static void test_embedding_grad_fd(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *table = grad_check_param(g, &rng, 0, 2, (int64_t[]){6, 4}, -1, 1);
    deft_tensor *ids = deft_input(g, "ids", DEFT_I32, 2, (int64_t[]){3, 4}, deft_cpu());
    /* repeats, both ends, and rows 2 and 4 never used */
    int32_t idv[12] = {0, 5, 1, 1, 5, 3, 0, 0, 1, 3, 5, 5};
    deft_tensor *f = deft_embedding(table, ids);
    deft_tensor *loss = grad_check_loss(g, &rng, f);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[2] = {loss, deft_grad(table)};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        CHECK_OK(deft_program_feed(p, ids, idv, sizeof idv));
        grad_check_run(p, loss);
        double worst = grad_check_worst(p, loss, outs[1], table);
        CHECK_MSG(worst <= 1e-6, "embedding gradient off by %.3g", worst);
        double dt[24];
        CHECK_OK(deft_program_read(p, outs[1], dt, sizeof dt));
        for (int c = 0; c < 4; c++) CHECK(dt[2 * 4 + c] == 0.0 && dt[4 * 4 + c] == 0.0);
    }
    deft_graph_free(g);
}

/* dtable[v] = sum of w's rows j with ids[j] == v, in position order (float adds): the CPU gives these bits exactly,
 * and the same bits on every run. Many repeats of few ids; rows no id selects are 0. */
static void test_embedding_grad_exact(void) {
    enum { V = 50, C = 33, N = 1000 };
    deft_graph *g = deft_graph_new();
    deft_tensor *table = deft_param(g, "wte", DEFT_F32, 2, (int64_t[]){V, C}, deft_cpu(), DEFT_INIT_NORMAL);
    deft_tensor *ids = deft_input(g, "ids", DEFT_I32, 1, (int64_t[]){N}, deft_cpu());
    float *w = malloc(N * C * sizeof *w), *want = calloc(V * C, sizeof *want), *got = malloc(V * C * sizeof *got),
          *again = malloc(V * C * sizeof *again);
    int32_t *idv = malloc(N * sizeof *idv);
    for (int i = 0; i < N * C; i++) w[i] = (float)ref_unif(&rng, -1, 1);
    for (int j = 0; j < N; j++) idv[j] = (int32_t)((j * 7 + (j * j) % 5) % 11) * 4;   /* 11 ids, all even */
    for (int j = 0; j < N; j++)
        for (int c = 0; c < C; c++) want[idv[j] * C + c] += w[j * C + c];
    deft_tensor *wt = deft_constant(g, DEFT_F32, 2, (int64_t[]){N, C}, deft_cpu(), w, N * C * sizeof *w);
    deft_tensor *loss = deft_sum(deft_mul(deft_embedding(table, ids), wt), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *dt = deft_grad(table);
    deft_program *p = deft_compile(g, &dt, 1, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        CHECK_OK(deft_program_feed(p, ids, idv, N * sizeof *idv));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, dt, got, V * C * sizeof *got));
        CHECK_MSG(memcmp(got, want, V * C * sizeof *got) == 0, "the gradient differs from the sum in position order");
        for (int r = 0; r < 5; r++) {
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, dt, again, V * C * sizeof *again));
            CHECK_MSG(memcmp(got, again, V * C * sizeof *got) == 0, "run %d gave other bits", r + 2);
        }
        CHECK(got[1 * C] == 0.0f && got[49 * C + C - 1] == 0.0f);
    }
    free(w), free(want), free(got), free(again), free(idv);
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- ids out of range */
static void test_bad_ids(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *table = deft_param(g, "t", DEFT_F32, 2, (int64_t[]){5, 4}, deft_cpu(), DEFT_INIT_NORMAL);
    deft_tensor *ids = deft_input(g, "ids", DEFT_I32, 2, (int64_t[]){2, 3}, deft_cpu());
    deft_tensor *loss = deft_sum(deft_embedding(table, ids), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[2] = {loss, deft_grad(table)};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        int32_t v[6] = {0, 1, 2, 3, 7, 4};
        CHECK_OK(deft_program_feed(p, ids, v, sizeof v));
        CHECK_ERR(deft_program_run(p), DEFT_ERR_INVALID, "embedding: token id 7 at position 4 is outside [0, 5)");
        v[4] = 4, v[0] = -1;
        CHECK_OK(deft_program_feed(p, ids, v, sizeof v));
        CHECK_ERR(deft_program_run(p), DEFT_ERR_INVALID, "embedding: token id -1 at position 0 is outside [0, 5)");
        v[0] = 0;
        CHECK_OK(deft_program_feed(p, ids, v, sizeof v));
        CHECK_OK(deft_program_run(p));
        float grad[20];
        CHECK_OK(deft_program_read(p, outs[1], grad, sizeof grad));
        /* ids 0, 1, 2, 3, 4, 4: row 4 twice */
        CHECK(grad[0] == 1.0f && grad[15] == 1.0f && grad[16] == 2.0f && grad[19] == 2.0f);
    }
    /* index_select at run time says index, not token id */
    deft_tensor *a = deft_param(g, "a", DEFT_F32, 2, (int64_t[]){3, 4}, deft_cpu(), DEFT_INIT_NORMAL);
    deft_tensor *ix = deft_input(g, "ix", DEFT_I32, 1, (int64_t[]){2}, deft_cpu());
    deft_tensor *sel = deft_index_select(a, 1, ix);
    deft_program *q = deft_compile(g, &sel, 1, NULL);
    CHECK_MSG(q != NULL, "compile: %s", deft_errmsg());
    if (q) {
        const int32_t v[2] = {3, 4};
        CHECK_OK(deft_program_feed(q, ix, v, sizeof v));
        CHECK_ERR(deft_program_run(q), DEFT_ERR_INVALID, "index_select: index 4 at position 1 is outside [0, 4)");
    }
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- build errors */
/* The builder returns NULL with status `want` and a message holding `needle`, and adds no node. */
#define CHECK_REFUSED(g, expr, want, needle)                                                                     \
    do {                                                                                                         \
        const int nodes_ = deft_graph_node_count(g);                                                             \
        CHECK_NULL_ERR(expr, needle);                                                                            \
        CHECK(deft_graph_error(g) == (want));                                                                    \
        CHECK(deft_graph_node_count(g) == nodes_);                                                               \
    } while (0)

static void test_build_errors(void) {
    const int32_t ids[4] = {0, 2, 9, 1};
    struct {
        deft_graph *g;
        deft_tensor *table, *idsf, *table3, *tablei, *idc, *x;
    } c;
    for (int k = 0; k < 13; k++) {
        c.g = deft_graph_new();
        c.table = deft_param(c.g, "t", DEFT_F32, 2, (int64_t[]){5, 3}, deft_cpu(), DEFT_INIT_NORMAL);
        c.idsf = deft_input(c.g, "idsf", DEFT_F32, 1, (int64_t[]){4}, deft_cpu());
        c.table3 = deft_input(c.g, "t3", DEFT_F32, 3, (int64_t[]){2, 3, 4}, deft_cpu());
        c.tablei = deft_input(c.g, "ti", DEFT_I32, 2, (int64_t[]){5, 3}, deft_cpu());
        c.idc = const_i32(c.g, 1, (int64_t[]){4}, ids);
        c.x = deft_input(c.g, "x", DEFT_F32, 2, (int64_t[]){2, 3}, deft_cpu());
        switch (k) {
        case 0:
            CHECK_REFUSED(c.g, deft_embedding(c.table, c.idsf), DEFT_ERR_DTYPE,
                          "embedding: ids (token indices) must be i32, got f32");
            break;
        case 1:
            CHECK_REFUSED(c.g, deft_embedding(c.table3, c.idc), DEFT_ERR_SHAPE,
                          "embedding: table [2, 3, 4] and ids [4]: expected a table [V, C]");
            break;
        case 2:
            CHECK_REFUSED(c.g, deft_embedding(c.tablei, c.idc), DEFT_ERR_DTYPE, "embedding: needs a floating");
            break;
        case 3:
            CHECK_REFUSED(c.g, deft_embedding(c.table, c.idc), DEFT_ERR_INVALID,
                          "embedding: token id 9 at position 2 is outside [0, 5) (the constant ids [4])");
            break;
        case 4: {
            /* through a reshape of the constant too */
            deft_tensor *r = deft_reshape(c.idc, 2, (int64_t[]){2, 2});
            CHECK_REFUSED(c.g, deft_embedding(c.table, r), DEFT_ERR_INVALID,
                          "embedding: token id 9 at position 2 is outside [0, 5)");
            break;
        }
        case 5:
            CHECK_REFUSED(c.g, deft_index_select(c.x, 0, c.idsf), DEFT_ERR_DTYPE,
                          "index_select: index must be i32, got f32");
            break;
        case 6: {
            deft_tensor *r = deft_reshape(c.idc, 2, (int64_t[]){2, 2});
            CHECK_REFUSED(c.g, deft_index_select(c.x, 0, r), DEFT_ERR_SHAPE,
                          "index_select: input [2, 3] and index [2, 2]: expected");
            break;
        }
        case 7:
            CHECK_REFUSED(c.g, deft_index_select(c.x, 2, c.idc), DEFT_ERR_SHAPE,
                          "index_select: axis 2 is out of range for a tensor of 2 dimensions");
            break;
        case 8:
            CHECK_REFUSED(c.g, deft_index_select(c.x, -1, c.idc), DEFT_ERR_INVALID,
                          "index_select: index 9 at position 2 is outside [0, 3) (the constant index [4])");
            break;
        case 9: {
            deft_tensor *b = deft_input(c.g, "b", DEFT_F64, 2, (int64_t[]){2, 3}, deft_cpu());
            CHECK_REFUSED(c.g, deft_where(c.x, c.x, b), DEFT_ERR_DTYPE, "where: a is f32 and b is f64");
            break;
        }
        case 10: {
            deft_tensor *a = deft_input(c.g, "a4", DEFT_F32, 1, (int64_t[]){4}, deft_cpu());
            deft_tensor *b = deft_input(c.g, "b3", DEFT_F32, 1, (int64_t[]){3}, deft_cpu());
            CHECK_REFUSED(c.g, deft_where(c.x, a, b), DEFT_ERR_SHAPE,
                          "where: cond [2, 3], a [4] and b [3] do not broadcast to one shape");
            break;
        }
        case 11: {
            deft_tensor *m = deft_input(c.g, "m", DEFT_I32, 1, (int64_t[]){5}, deft_cpu());
            CHECK_REFUSED(c.g, deft_masked_fill(c.x, m, 0.0), DEFT_ERR_SHAPE,
                          "masked_fill: mask [5] does not broadcast to a [2, 3]");
            break;
        }
        default: {
            /* a mask larger than a would make a larger result: refused */
            deft_tensor *m = deft_input(c.g, "m", DEFT_F32, 3, (int64_t[]){4, 2, 3}, deft_cpu());
            CHECK_REFUSED(c.g, deft_masked_fill(c.x, m, 1.0), DEFT_ERR_SHAPE,
                          "masked_fill: mask [4, 2, 3] does not broadcast to a [2, 3]");
            break;
        }
        }
        deft_graph_free(c.g);
    }
}

/* ---------------------------------------------------------------- index_select */
static void test_index_select(void) {
    static const deft_dtype dts[] = {DEFT_F64, DEFT_F32, DEFT_BF16, DEFT_I32};
    const int64_t shape[3] = {3, 4, 5};
    const int32_t idx[6] = {1, 0, 2, 2, 0, 1};
    for (int k = 0; k < 4; k++)
        for (int axis = -1; axis < 3; axis++) {
            deft_graph *g = deft_graph_new();
            ref_tensor a = ref_random(&rng, dts[k], 3, shape, -4, 4);
            const int ax = axis < 0 ? 2 : axis;
            deft_tensor *y = deft_index_select(ref_const(g, &a), axis, const_i32(g, 1, (int64_t[]){6}, idx));
            double *got = ref_realize(y);
            int64_t oshape[3] = {3, 4, 5};
            oshape[ax] = 6;
            CHECK(y && ref_shape_eq(y, 3, oshape));
            int exact = got != NULL;
            for (int64_t i = 0; got && i < 3 * 4 * 5 / shape[ax] * 6; i++) {
                int64_t at[3];
                ref_unravel(3, oshape, i, at);
                at[ax] = idx[at[ax]];
                exact = exact && got[i] == a.v[(at[0] * 4 + at[1]) * 5 + at[2]];
            }
            CHECK_MSG(exact, "index_select %s axis %d", deft_dtype_name(dts[k]), axis);
            free(got);
            ref_free(&a);
            deft_graph_free(g);
        }
    /* its gradient: finite differences along the middle axis, with repeats and an unselected entry */
    deft_graph *g = deft_graph_new();
    deft_tensor *a = grad_check_param(g, &rng, 0, 3, shape, -1, 1);
    const int32_t gi[5] = {3, 0, 3, 3, 1};
    deft_tensor *f = deft_tanh(deft_index_select(a, 1, const_i32(g, 1, (int64_t[]){5}, gi)));
    grad_check_case("index_select", g, &rng, f, &a, 1, NULL, NULL, 0, 1e-6);
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- where and masked_fill */
static void test_where_values(void) {
    deft_graph *g = deft_graph_new();
    ref_tensor c = ref_random(&rng, DEFT_F32, 2, (int64_t[]){3, 1}, -1, 1);
    ref_tensor a = ref_random(&rng, DEFT_F32, 2, (int64_t[]){1, 4}, -5, 5);
    ref_tensor b = ref_random(&rng, DEFT_F32, 2, (int64_t[]){3, 4}, -5, 5);
    ref_set(&c, 1, 0.0);
    ref_set(&c, 2, -0.0);   /* -0 is false */
    ((float *)c.raw)[0] = NAN;   /* NaN is true */
    double *got = ref_realize(deft_where(ref_const(g, &c), ref_const(g, &a), ref_const(g, &b)));
    int ok = got != NULL;
    for (int r = 0; got && r < 3; r++)
        for (int j = 0; j < 4; j++) ok = ok && got[r * 4 + j] == (r == 0 ? a.v[j] : b.v[r * 4 + j]);
    CHECK_MSG(ok, "where with a f32 condition (NaN, 0, -0) and broadcasting");
    free(got);
    /* an i32 condition choosing between f64 values; a comparison's 1/0 as the condition */
    const int32_t ci[4] = {0, 2, -1, 0};
    ref_tensor a64 = ref_random(&rng, DEFT_F64, 1, (int64_t[]){4}, -5, 5);
    ref_tensor b64 = ref_random(&rng, DEFT_F64, 1, (int64_t[]){4}, -5, 5);
    deft_tensor *ta = ref_const(g, &a64), *tb = ref_const(g, &b64);
    got = ref_realize(deft_where(const_i32(g, 1, (int64_t[]){4}, ci), ta, tb));
    CHECK(got && got[0] == b64.v[0] && got[1] == a64.v[1] && got[2] == a64.v[2] && got[3] == b64.v[3]);
    free(got);
    got = ref_realize(deft_where(deft_gt(ta, tb), ta, tb));   /* maximum */
    ok = got != NULL;
    for (int j = 0; got && j < 4; j++) ok = ok && got[j] == fmax(a64.v[j], b64.v[j]);
    CHECK(ok);
    free(got);
    /* masked_fill: -inf where the mask holds ([1, 4] over [3, 4]), into f32 and bf16 */
    const int32_t mi[4] = {1, 0, 0, 3};
    for (int k = 0; k < 2; k++) {
        ref_tensor x = ref_random(&rng, k ? DEFT_BF16 : DEFT_F32, 2, (int64_t[]){3, 4}, -5, 5);
        got = ref_realize(deft_masked_fill(ref_const(g, &x), const_i32(g, 2, (int64_t[]){1, 4}, mi), -INFINITY));
        ok = got != NULL;
        for (int i = 0; got && i < 12; i++) ok = ok && (mi[i % 4] ? isinf(got[i]) && got[i] < 0 : got[i] == x.v[i]);
        CHECK_MSG(ok, "masked_fill %s", k ? "bf16" : "f32");
        free(got);
        ref_free(&x);
    }
    ref_free(&a), ref_free(&b), ref_free(&c), ref_free(&a64), ref_free(&b64);
    deft_graph_free(g);
}

static void test_where_grad_fd(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = grad_check_param(g, &rng, 0, 2, (int64_t[]){1, 4}, -1, 1);
    deft_tensor *b = grad_check_param(g, &rng, 1, 2, (int64_t[]){3, 4}, -1, 1);
    const double cv[3] = {1.0, 0.0, 2.0};
    deft_tensor *cond = deft_constant(g, DEFT_F64, 2, (int64_t[]){3, 1}, deft_cpu(), cv, sizeof cv);
    deft_tensor *ps[2] = {a, b};
    grad_check_case("where", g, &rng, deft_mul(deft_where(cond, a, b), b), ps, 2, NULL, NULL, 0, 1e-6);
    deft_graph_free(g);
    /* masked_fill, the mask a comparison of the parameter itself (no gradient flows through it) */
    g = deft_graph_new();
    deft_tensor *x = grad_check_param(g, &rng, 0, 2, (int64_t[]){3, 5}, -1, 1);
    const double zero = 0.0;
    deft_tensor *mask = deft_gt(x, deft_constant(g, DEFT_F64, 0, NULL, deft_cpu(), &zero, sizeof zero));
    grad_check_case("masked_fill", g, &rng, deft_exp(deft_masked_fill(x, mask, 0.5)), &x, 1, NULL, NULL, 0, 1e-6);
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- tied weights */
/* A GPT's LM head reads the token table transposed: the table's gradient is the embedding's plus the matmul's. */
static void test_tied_weights(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *table = grad_check_param(g, &rng, 0, 2, (int64_t[]){6, 4}, -1, 1);
    deft_tensor *wp = grad_check_param(g, &rng, 1, 2, (int64_t[]){4, 4}, -1, 1);
    const int32_t ids[5] = {2, 5, 2, 0, 3};
    deft_tensor *x = deft_embedding(table, const_i32(g, 1, (int64_t[]){5}, ids));
    deft_tensor *h = deft_tanh(deft_matmul(x, wp));
    deft_tensor *logits = deft_matmul_t(h, table, 0, 1);
    CHECK(logits && deft_tensor_dim(logits, 0) == 5 && deft_tensor_dim(logits, 1) == 6);
    deft_tensor *ps[2] = {table, wp};
    grad_check_case("tied", g, &rng, logits, ps, 2, NULL, NULL, 0, 1e-5);
    /* both uses feed the table's gradient: an add of the embedding's gradient and the matmul's */
    deft_tensor *dt = deft_grad(table);
    CHECK(dt && strcmp(deft_testing_op(dt), "add") == 0);
    int saw_embedding_grad = 0, saw_matmul = 0;
    for (int k = 0; dt && k < deft_testing_src_count(dt); k++) {
        const char *op = deft_testing_op(deft_testing_src(dt, k));
        saw_embedding_grad += strcmp(op, "embedding_grad") == 0;
        saw_matmul += strcmp(op, "matmul") == 0;
    }
    CHECK(saw_embedding_grad == 1 && saw_matmul == 1);
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- the DOT dump, the plan table, checkpointing */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = '\0';
    fclose(f);
    return s;
}

typedef struct small_lm {
    deft_graph *g;
    deft_tensor *table, *w, *ids, *loss, *grads[2];
} small_lm;

/* embedding -> matmul -> tanh -> masked_fill and where against a causal-style mask -> mean, with a backward pass */
static void small_lm_build(small_lm *m) {
    m->g = deft_graph_new();
    deft_graph_set_seed(m->g, 5);
    m->table = deft_param(m->g, "wte", DEFT_F32, 2, (int64_t[]){9, 6}, deft_cpu(), DEFT_INIT_NORMAL);
    m->w = deft_param(m->g, "w", DEFT_F32, 2, (int64_t[]){6, 6}, deft_cpu(), DEFT_INIT_KAIMING);
    m->ids = deft_input(m->g, "ids", DEFT_I32, 1, (int64_t[]){6}, deft_cpu());
    deft_tensor *x = deft_embedding(m->table, m->ids);
    deft_tensor *h = deft_tanh(deft_matmul(x, m->w));
    float mask[36];
    for (int i = 0; i < 36; i++) mask[i] = (float)(i % 6 > i / 6);
    deft_tensor *mk = deft_constant(m->g, DEFT_F32, 2, (int64_t[]){6, 6}, deft_cpu(), mask, sizeof mask);
    deft_tensor *s = deft_masked_fill(h, mk, -1.0);
    deft_tensor *y = deft_where(deft_gt(h, x), s, deft_mul(x, h));
    m->loss = deft_mean(deft_mul(y, y), 0, NULL, 0);
    CHECK_OK(deft_backward(m->loss));
    m->grads[0] = deft_grad(m->table);
    m->grads[1] = deft_grad(m->w);
}

static void small_lm_run(small_lm *m, deft_program *p, float *out) {
    const int32_t ids[6] = {8, 1, 1, 4, 0, 8};
    CHECK_OK(deft_program_feed(p, m->ids, ids, sizeof ids));
    CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_read(p, m->grads[0], out, 54 * sizeof *out));
    CHECK_OK(deft_program_read(p, m->grads[1], out + 54, 36 * sizeof *out));
}

static void test_dump_plan_checkpoint(void) {
    small_lm m;
    small_lm_build(&m);
    deft_tensor *outs[3] = {m.loss, m.grads[0], m.grads[1]};
    deft_program *p = deft_compile(m.g, outs, 3, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    float plain[90], ck[90];
    if (p) {
        small_lm_run(&m, p, plain);
        CHECK_OK(deft_graph_dump_dot(m.g, p, "test_embedding.dot"));
        char *dot = read_text("test_embedding.dot");
        CHECK(dot && strstr(dot, "embedding f32 [6, 6]") && strstr(dot, "embedding_grad f32 [9, 6]") &&
              strstr(dot, "index_order i32") && strstr(dot, "masked_fill f32") && strstr(dot, "where f32"));
        free(dot);
        FILE *f = tmpfile();
        if (f) {
            CHECK_OK(deft_program_print_plan(p, f));
            long n = ftell(f);
            char *text = calloc((size_t)n + 1, 1);
            rewind(f);
            if (text && fread(text, 1, (size_t)n, f) == (size_t)n)
                CHECK_MSG(strstr(text, "embedding") && strstr(text, "embedding_grad") && strstr(text, "where"),
                          "plan table:\n%s", text);
            free(text);
            fclose(f);
        }
        /* what the backward keeps: the embedding's gradient reads dy, the ids and the order, never the table */
        for (int k = 0; k < deft_testing_src_count(m.grads[0]); k++)
            CHECK(deft_testing_src(m.grads[0], k) != m.table);
    }
    /* everything between the ids and the loss dropped and recomputed: the same gradients, bit for bit */
    CHECK_OK(deft_checkpoint_span(m.ids, m.loss));
    deft_program *q = deft_compile(m.g, outs, 3, &(deft_compile_options){.checkpoint = DEFT_CHECKPOINT_MARKED});
    CHECK_MSG(q != NULL, "compile with checkpointing: %s", deft_errmsg());
    if (p && q) {
        small_lm_run(&m, q, ck);
        CHECK_MSG(memcmp(plain, ck, sizeof ck) == 0, "checkpointed gradients differ");
        int recomputed = 0;
        for (int id = 0; deft_testing_node(m.g, id); id++) {
            deft_tensor *t = deft_testing_node(m.g, id);
            if (deft_testing_ckpt_role(t) != DEFT_TESTING_CKPT_RECOMPUTE) continue;
            deft_testing_node_plan np;
            deft_testing_program_node_plan(q, t, &np);
            if (np.step >= 0 && strcmp(deft_testing_op(t), "embedding") == 0) recomputed = 1;
        }
        CHECK_MSG(recomputed, "the embedding was not recomputed");
    }
    deft_graph_free(m.g);
}

/* Under bf16 autocast the embedding keeps its f32 table, masked_fill follows its bf16 input and where promotes: the
 * rewritten step runs, and its loss and gradients stay near the f32 ones. */
static void test_autocast(void) {
    small_lm m;
    small_lm_build(&m);
    deft_tensor *outs[3] = {m.loss, m.grads[0], m.grads[1]};
    deft_program *p = deft_compile(m.g, outs, 3, NULL);
    deft_program *q = deft_compile(m.g, outs, 3, &(deft_compile_options){.autocast = DEFT_BF16});
    CHECK_MSG(p && q, "compile: %s", deft_errmsg());
    float plain[90], low[90], lp = NAN, lq = NAN;
    if (p && q) {
        small_lm_run(&m, p, plain);
        small_lm_run(&m, q, low);
        CHECK_OK(deft_program_read(p, m.loss, &lp, sizeof lp));
        CHECK_OK(deft_program_read(q, m.loss, &lq, sizeof lq));
        CHECK_MSG(isfinite(lq) && fabs(lq - lp) <= 3e-2 * fabs(lp), "loss f32 %g, bf16 autocast %g", lp, lq);
        double want[90], have[90];
        for (int i = 0; i < 90; i++) want[i] = plain[i], have[i] = low[i];
        ref_close_tol("gradients under bf16 autocast", have, want, 90, 5e-2);
        int emb_f32 = 0, fill_bf16 = 0;
        for (int id = 0; deft_testing_node(m.g, id); id++) {
            deft_tensor *t = deft_testing_node(m.g, id);
            if (deft_testing_autocast_mark(t) != DEFT_TESTING_AUTOCAST_NODE) continue;
            emb_f32 += strcmp(deft_testing_op(t), "embedding") == 0 && deft_tensor_dtype(t) == DEFT_F32;
            fill_bf16 += strcmp(deft_testing_op(t), "masked_fill") == 0 && deft_tensor_dtype(t) == DEFT_BF16;
        }
        /* the embedding reads the table and ids unchanged: the user's node serves; masked_fill (and its gradient)
         * run in bf16 */
        CHECK_MSG(emb_f32 == 0 && fill_bf16 >= 1, "rewritten: %d f32 embeddings, %d bf16 masked_fills", emb_f32,
                  fill_bf16);
    }
    deft_graph_free(m.g);
}

int main(void) {
    test_embedding_values();
    test_embedding_grad_fd();
    test_embedding_grad_exact();
    test_bad_ids();
    test_build_errors();
    test_index_select();
    test_where_values();
    test_where_grad_fd();
    test_tied_weights();
    test_dump_plan_checkpoint();
    test_autocast();
    return deft_check_finish();
}
