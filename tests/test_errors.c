/* Bad input: every error is a status and a message that says what was wrong; nothing aborts. */
#include "check.h"

#define CPU deft_cpu()

static void test_shape_errors(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_input(g, "a", DEFT_F32, 2, (int64_t[]){32, 10}, CPU);
    deft_tensor *b = deft_input(g, "b", DEFT_F32, 2, (int64_t[]){9, 1}, CPU);
    CHECK_NULL_ERR(deft_matmul(a, b), "inner dimensions differ: a is [32, 10] (K = 10), b is [9, 1] (K = 9)");
    CHECK(deft_graph_error(g) == DEFT_ERR_SHAPE);
    deft_tensor *c = deft_input(g, "c", DEFT_F32, 2, (int64_t[]){7, 3}, CPU);
    deft_tensor *d = deft_input(g, "d", DEFT_F32, 1, (int64_t[]){4}, CPU);
    CHECK_NULL_ERR(deft_add(c, d), "shapes [7, 3] and [4] do not broadcast");
    CHECK_NULL_ERR(deft_mul(c, deft_input(g, "e", DEFT_F32, 3, (int64_t[]){2, 5, 3}, CPU)), "do not broadcast");
    CHECK_NULL_ERR(deft_matmul(d, c), "needs at least 2 dimensions");
    CHECK_NULL_ERR(deft_reshape(c, 2, (int64_t[]){5, -1}), "cannot become [5, -1]");
    CHECK_NULL_ERR(deft_reshape(c, 2, (int64_t[]){-1, -1}), "sizes must be positive");
    CHECK_NULL_ERR(deft_permute(c, (int[]){0, 0}), "not a permutation");
    CHECK_NULL_ERR(deft_slice(c, 0, 5, 2, 1), "is empty");
    CHECK_NULL_ERR(deft_slice(c, 0, 0, 2, 0), "step 0 must be positive");
    CHECK_NULL_ERR(deft_concat((deft_tensor *[]){c, d}, 2, 0), "concat: tensor 1 is f32 [4]");
    CHECK_NULL_ERR(deft_sum(c, 1, (int[]){2}, 0), "axis 2 is out of range for a tensor of 2 dimensions");
    CHECK_NULL_ERR(deft_mean(c, 2, (int[]){1, -1}, 0), "axis -1 is listed twice");
    CHECK_NULL_ERR(deft_softmax(c, -3), "axis -3 is out of range");
    CHECK_NULL_ERR(deft_transpose(c, 0, 2), "out of range");
    /* The graph keeps its first error, whatever came after. */
    CHECK(strstr(deft_graph_errmsg(g), "inner dimensions differ") != NULL);
    deft_graph_free(g);
}

static void test_leaf_errors(void) {
    deft_graph *g = deft_graph_new();
    CHECK_NULL_ERR(deft_input(g, "x", DEFT_F32, 2, (int64_t[]){3, 0}, CPU), "dimension 1 is 0; sizes must be positive");
    CHECK_NULL_ERR(deft_input(g, "x", DEFT_F32, 1, (int64_t[]){-4}, CPU), "dimension 0 is -4");
    CHECK_NULL_ERR(deft_input(g, "x", DEFT_F32, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, CPU), "0 to 8");
    CHECK_NULL_ERR(deft_input(g, "x", (deft_dtype)42, 1, (int64_t[]){2}, CPU), "unsupported dtype 42");
    CHECK_NULL_ERR(deft_input(NULL, "x", DEFT_F32, 1, (int64_t[]){2}, CPU), "graph is NULL");
    float three[3] = {1, 2, 3};
    CHECK_NULL_ERR(deft_constant(g, DEFT_F32, 1, (int64_t[]){4}, CPU, three, sizeof three),
                   "12 bytes given for a tensor of 16 bytes");
    CHECK_NULL_ERR(deft_arange(g, DEFT_F32, 5, 1, 1, CPU), "is empty");
    CHECK_NULL_ERR(deft_arange(g, DEFT_F32, 0, 1, 0, CPU), "step non-zero");
    CHECK_NULL_ERR(deft_uniform(g, DEFT_F32, 1, (int64_t[]){2}, CPU, 1, 0, 3), "low 1 is above high 0");
    CHECK_NULL_ERR(deft_normal(g, DEFT_I32, 1, (int64_t[]){2}, CPU, 0, 1, 3), "needs a floating dtype");
    deft_graph_free(g);
}

static void test_dtype_errors(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *f = deft_input(g, "f", DEFT_F32, 1, (int64_t[]){4}, CPU);
    deft_tensor *h = deft_input(g, "h", DEFT_F16, 1, (int64_t[]){4}, CPU);
    deft_tensor *i = deft_input(g, "i", DEFT_I32, 1, (int64_t[]){4}, CPU);
    CHECK_NULL_ERR(deft_add(f, h), "dtypes f32 and f16 differ");
    CHECK_NULL_ERR(deft_exp(i), "exp: needs a floating dtype (f32, f64, f16, bf16), got i32");
    CHECK_NULL_ERR(deft_cast(f, (deft_dtype)-1), "cast: unsupported dtype -1");
    CHECK_NULL_ERR(deft_cast(f, DEFT_DTYPE_COUNT), "unsupported dtype");
    CHECK_NULL_ERR(deft_to(f, CPU, (deft_dtype)99), "to: unsupported dtype 99");
    CHECK(deft_graph_error(g) == DEFT_ERR_DTYPE);
    deft_graph_free(g);
}

static void test_null_chains(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_input(g, "a", DEFT_F32, 2, (int64_t[]){2, 3}, CPU);
    deft_tensor *bad = deft_matmul(a, a);   /* [2,3] @ [2,3]: fails here */
    deft_tensor *chain = deft_softmax(deft_relu(deft_add(bad, a)), -1);
    CHECK(chain == NULL);
    CHECK(strstr(deft_errmsg(), "inner dimensions differ") != NULL);   /* the cause, not a later symptom */
    CHECK_ERR(deft_realize(chain, NULL, 0), DEFT_ERR_INVALID, "inner dimensions differ");
    deft_tensor *ok = deft_relu(a);
    CHECK(ok != NULL);
    CHECK(deft_compile(g, &ok, 1, NULL) == NULL);
    CHECK(strstr(deft_errmsg(), "the graph has an error") != NULL);
    deft_graph_free(g);
}

/* A NULL given where no call failed: the builder says which operand, and its graph keeps that as its error. */
static void test_null_operand(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_input(g, "a", DEFT_F32, 1, (int64_t[]){4}, CPU);
    CHECK(deft_add(a, NULL) == NULL);
    CHECK_MSG(strstr(deft_errmsg(), "add: operand 1 is NULL") != NULL, "message: %s", deft_errmsg());
    CHECK(deft_graph_error(g) == DEFT_ERR_INVALID);
    CHECK(deft_relu(NULL) == NULL);   /* no graph to blame: the message quotes the error before it, once */
    CHECK_MSG(strstr(deft_errmsg(), "relu: operand 0 is NULL; the last error before it: add: operand 1 is NULL") != NULL,
              "message: %s", deft_errmsg());
    CHECK(deft_sum(deft_relu(NULL), 0, NULL, 0) == NULL);
    CHECK_MSG(strstr(deft_errmsg(), "sum: operand 0 is NULL; the last error before it: add: operand 1") != NULL,
              "message: %s", deft_errmsg());
    deft_graph_free(g);
}

static void test_device_errors(void) {
    deft_device d = CPU;
    CHECK_ERR(deft_device_parse("cuda:abc", &d), DEFT_ERR_DEVICE, "unknown device \"cuda:abc\"");
    CHECK_ERR(deft_device_parse("tpu", &d), DEFT_ERR_DEVICE, "unknown device \"tpu\": expected cpu, cuda or cuda:N");
    CHECK_ERR(deft_device_parse("cuda:", &d), DEFT_ERR_DEVICE, "unknown device");
    CHECK_ERR(deft_device_parse("cuda:1x", &d), DEFT_ERR_DEVICE, "unknown device");
    CHECK_ERR(deft_device_parse("CPU ", &d), DEFT_ERR_DEVICE, "unknown device");
    CHECK_OK(deft_device_parse("cpu", &d));
    CHECK(d.type == DEFT_CPU);
    if (deft_cuda_device_count() == 0) {
        /* A CPU-only build, or a machine without a GPU: asking for CUDA is a clear error. */
        CHECK_ERR(deft_device_parse("cuda", &d), DEFT_ERR_NO_CUDA, "cuda:0 was asked for");
        CHECK_ERR(deft_device_parse("cuda:1", &d), DEFT_ERR_NO_CUDA, "cuda:1 was asked for, but");
        deft_graph *g = deft_graph_new();
        CHECK_NULL_ERR(deft_input(g, "x", DEFT_F32, 1, (int64_t[]){2}, deft_cuda(0)), "cuda:0 was asked for");
        CHECK(deft_graph_error(g) == DEFT_ERR_NO_CUDA);
        deft_tensor *c = deft_full(g, DEFT_F32, 1, (int64_t[]){2}, CPU, 1.0);
        CHECK_NULL_ERR(deft_to(c, deft_cuda(0), DEFT_F32), "cuda:0 was asked for");
        CHECK(deft_device_equal(deft_device_default(), CPU));
        deft_graph_free(g);
    }
    char buf[16];
    CHECK(strcmp(deft_device_str(deft_cuda(3), buf, sizeof buf), "cuda:3") == 0);
    CHECK(strcmp(deft_device_str(CPU, buf, sizeof buf), "cpu") == 0);
    size_t free_b = 0, total_b = 0;
    CHECK_OK(deft_device_memory(CPU, &free_b, &total_b));
    CHECK(total_b > 0 && free_b <= total_b);
}

static void test_program_errors(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){4, 3}, CPU);
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){3, 2}, CPU, DEFT_INIT_KAIMING);
    deft_tensor *y = deft_matmul(x, w);
    deft_tensor *side = deft_relu(x);
    deft_program *p = deft_compile(g, &y, 1, NULL);
    CHECK(p != NULL);
    float buf[12] = {0};
    CHECK_ERR(deft_program_run(p), DEFT_ERR_STATE, "input x was never fed");
    CHECK_ERR(deft_program_feed(p, x, buf, 40), DEFT_ERR_INVALID, "40 bytes given for input x of 48 bytes");
    CHECK_ERR(deft_program_feed(p, w, buf, 24), DEFT_ERR_STATE, "w is a param, not an input");
    CHECK_ERR(deft_program_feed(p, x, NULL, 48), DEFT_ERR_INVALID, "host buffer is NULL");
    CHECK_OK(deft_program_feed(p, x, buf, sizeof buf));
    float out[8];
    CHECK_ERR(deft_program_read(p, y, out, sizeof out), DEFT_ERR_STATE, "has not been computed");
    CHECK_OK(deft_program_run(p));
    CHECK_ERR(deft_program_read(p, side, out, sizeof out), DEFT_ERR_STATE, "is not an output of this program");
    CHECK_ERR(deft_program_read(p, y, out, 4), DEFT_ERR_INVALID, "4 bytes asked for output");
    CHECK_OK(deft_program_read(p, y, out, sizeof out));
    for (int i = 0; i < 8; i++) CHECK(out[i] == 0.0f);
    CHECK_ERR(deft_realize(side, out, sizeof out), DEFT_ERR_STATE, "never fed");
    CHECK(deft_compile(g, NULL, 1, NULL) == NULL);
    CHECK(strstr(deft_errmsg(), "no outputs") != NULL);
    deft_graph *other = deft_graph_new();
    deft_tensor *o = deft_full(other, DEFT_F32, 1, (int64_t[]){1}, CPU, 0);
    CHECK(deft_compile(g, &o, 1, NULL) == NULL);
    CHECK(strstr(deft_errmsg(), "belongs to another graph") != NULL);
    CHECK_NULL_ERR(deft_add(x, deft_reshape(o, 2, (int64_t[]){1, 1})), "different graphs");
    deft_graph_free(other);
    deft_graph_free(g);
}

static void test_budget_errors(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){64, 64}, CPU, DEFT_INIT_XAVIER);
    deft_tensor *y = deft_relu(deft_matmul(w, w));
    deft_compile_options small = {.memory_budget = 1000};
    CHECK(deft_compile(g, &y, 1, &small) == NULL);
    CHECK_MSG(strstr(deft_errmsg(), "budget of 1000 bytes is smaller than the persistent state (16384 bytes") != NULL,
              "%s", deft_errmsg());
    deft_compile_options tight = {.memory_budget = 20000};
    CHECK(deft_compile(g, &y, 1, &tight) == NULL);
    CHECK_MSG(strstr(deft_errmsg(), "budget of 20000 bytes is smaller than the 32768 bytes this program needs (arena 16384 + persistent 16384)") != NULL, "%s",
              deft_errmsg());
    deft_compile_options enough = {.memory_budget = 32768};   /* relu runs in place */
    deft_program *p = deft_compile(g, &y, 1, &enough);
    CHECK(p != NULL);
    deft_graph_free(g);
}

int main(void) {
    test_shape_errors();
    test_leaf_errors();
    test_dtype_errors();
    test_null_chains();
    test_null_operand();
    test_device_errors();
    test_program_errors();
    test_budget_errors();
    return deft_check_finish();
}
