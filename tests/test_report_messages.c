/* What deft tells the user when things go wrong or get long:
 *  1. a memory budget met only with checkpointing says so and names the option; one that nothing meets says what
 *     the smallest peak consists of (persistent: parameters, optimizer state, inputs; arena: activations);
 *  2. deft_errmsg() follows the documented (SQLite) convention: set by a failure, not cleared by later successes;
 *  3. the plan table keeps its columns aligned for 60+ character names and long op names. */
#include "ckpt_net.h"

/* ---------------------------------------------------------------- 1. budgets and checkpointing */
static deft_program *rm_compile(ck_net *n, size_t budget) {
    deft_compile_options o = {.memory_budget = budget};
    return deft_compile(n->g, n->outs, n->n_outs, &o);
}

static size_t rm_number_after(const char *text, const char *key) {
    const char *m = strstr(text, key);
    return m ? (size_t)strtoull(m + strlen(key), NULL, 10) : 0;
}

static void test_budget_messages(void) {
    ck_spec s = {.depth = 8, .batch = 64, .in = 12, .sgd = 1, .seed = 5};
    for (int l = 0; l < s.depth; l++) s.width[l] = 48;
    ck_net n;
    if (!ck_build(&n, &s, deft_cpu())) return;
    deft_memory_report plain;
    CHECK_OK(deft_plan_memory(n.g, n.outs, n.n_outs, NULL, &plain));
    const size_t need = plain.arena_bytes + plain.persistent_bytes, smallest = ck_smallest_budget(&n);
    CHECK_MSG(smallest > plain.persistent_bytes && smallest < need, "smallest %zu, persistent %zu, need %zu",
              smallest, plain.persistent_bytes, need);

    /* Between the smallest checkpointed plan and the plain one: checkpointing is the answer, by name. */
    CHECK(rm_compile(&n, (smallest + need) / 2) == NULL);
    const char *m = deft_errmsg();
    CHECK_MSG(strstr(m, "fits with checkpointing: compile with .checkpoint = DEFT_CHECKPOINT_BUDGET") != NULL,
              "message: %s", m);
    CHECK_MSG(rm_number_after(m, "budget of ") == (smallest + need) / 2, "message: %s", m);
    deft_program *p = deft_compile(n.g, n.outs, n.n_outs,
                                   &(deft_compile_options){.memory_budget = (smallest + need) / 2,
                                                           .checkpoint = DEFT_CHECKPOINT_BUDGET});
    CHECK_MSG(p != NULL, "the advice does not work: %s", deft_errmsg());
    deft_program_free(p);

    /* Below the smallest: no advice to checkpoint, the smallest peak in parts that add up. */
    CHECK(rm_compile(&n, smallest - 1) == NULL);
    m = deft_errmsg();
    CHECK_MSG(strstr(m, "fits with checkpointing") == NULL && strstr(m, "does not fit with checkpointing") != NULL,
              "message: %s", m);
    const size_t peak = rm_number_after(m, "smallest peak is "), persistent = rm_number_after(m, "persistent ");
    const size_t params = rm_number_after(m, "parameters "), state = rm_number_after(m, "optimizer state ");
    const size_t inputs = rm_number_after(m, "inputs "), arena = rm_number_after(m, "+ arena ");
    CHECK_MSG(peak == smallest, "peak %zu, smallest %zu: %s", peak, smallest, m);
    CHECK_MSG(persistent == plain.persistent_bytes && params + state + inputs == persistent,
              "persistent %zu = %zu + %zu + %zu?: %s", persistent, params, state, inputs, m);
    CHECK_MSG(params > 0 && state > 0 && inputs >= (size_t)s.batch * (size_t)s.in * 4 + (size_t)s.batch * 4,
              "parts: %s", m);
    CHECK_MSG(arena + persistent == peak && strstr(m, "(activations)") != NULL, "message: %s", m);

    /* Below the persistent state: checkpointing cannot help, and the message says why. */
    CHECK(rm_compile(&n, plain.persistent_bytes / 2) == NULL);
    m = deft_errmsg();
    CHECK_MSG(strstr(m, "smaller than the persistent state") != NULL && strstr(m, "no checkpointing can") != NULL && strstr(m, "parameters ") != NULL &&
              strstr(m, "fits with checkpointing") == NULL, "message: %s", m);

    /* Probing leaves the graph as it was: a plain compile still plans the same. */
    deft_memory_report again;
    CHECK_OK(deft_plan_memory(n.g, n.outs, n.n_outs, NULL, &again));
    CHECK(again.arena_bytes == plain.arena_bytes && again.persistent_bytes == plain.persistent_bytes);
    ck_free(&n);
}

/* ---------------------------------------------------------------- 2. deft_errmsg's lifetime */
static void test_errmsg_convention(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 1, (int64_t[]){4}, deft_cpu());
    CHECK(deft_program_print_plan(NULL, NULL) == DEFT_ERR_INVALID);
    char failed[256];
    snprintf(failed, sizeof failed, "%s", deft_errmsg());
    CHECK_MSG(strstr(failed, "print_plan") != NULL, "message: %s", failed);
    /* Successes after it leave the text as it was: it is not a success's message. */
    deft_tensor *y = deft_relu(x);
    deft_program *p = deft_compile(g, &y, 1, NULL);
    CHECK(y != NULL && p != NULL);
    CHECK_OK(deft_program_feed(p, x, (float[]){1, -2, 3, -4}, 4 * sizeof(float)));
    CHECK_OK(deft_program_run(p));
    CHECK_MSG(strcmp(deft_errmsg(), failed) == 0, "a success changed the message to \"%s\"", deft_errmsg());
    /* The next failure replaces it. */
    CHECK(deft_program_read(p, y, NULL, 3) != DEFT_OK);
    CHECK_MSG(strcmp(deft_errmsg(), failed) != 0 && deft_errmsg()[0] != '\0', "message: %s", deft_errmsg());
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- 3. the plan table's columns */
#define RM_LONG_NAME "a_very_long_tensor_name_that_goes_on_and_on_past_sixty_chars"

/* Where each of a row's six columns ends: the name and op columns left-aligned (their ends are where the next
 * column's padding starts, so the row's right end and the numbers' ends are what must agree). */
static int rm_row_ends(const char *row, size_t len, int *ends) {
    int n = 0;
    for (size_t i = 0; i < len && n < 8; i++)
        if (row[i] != ' ' && (i + 1 == len || row[i + 1] == ' ')) ends[n++] = (int)i;
    return n;
}

static void test_plan_columns(void) {
    CHECK(strlen(RM_LONG_NAME) >= 60 && strlen(RM_LONG_NAME) < 64);
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){1, 2, 4, 4}, deft_cpu());
    deft_tensor *a = deft_set_name(deft_adaptive_avg_pool2d(deft_exp(x), 1, 1, DEFT_NCHW), RM_LONG_NAME);
    deft_tensor *out = deft_set_name(deft_mul_scalar(deft_exp(a), 2.0), "out");
    deft_program *p = deft_compile(g, &out, 1, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    char *text = p ? ck_plan_text(p) : NULL;
    const char *head = text ? strstr(text, "  buffer ") : NULL;
    CHECK_MSG(head && strstr(text, RM_LONG_NAME) && strstr(text, "adaptive_avg_pool2d"), "plan:\n%s", text);
    int want[8], rows = 0, long_row = 0;
    for (const char *row = head; row && *row; rows++) {
        const char *eol = strchr(row, '\n');
        size_t len = eol ? (size_t)(eol - row) : strlen(row);
        int ends[8], n = rm_row_ends(row, len, ends);
        long_row += strstr(row, RM_LONG_NAME) && strstr(row, RM_LONG_NAME) < row + len;
        if (row == head) memcpy(want, ends, sizeof want);
        CHECK_MSG(n == 6, "row of %d columns: %.*s", n, (int)len, row);
        /* offset, bytes, first and last are right-aligned: their ends must match the header's. */
        for (int c = 2; n == 6 && c < 6; c++)
            CHECK_MSG(ends[c] == want[c], "column %d ends at %d, not %d: %.*s", c, ends[c], want[c], (int)len, row);
        /* the op column starts one past the widest name: the same place in every row. */
        const char *op = row + 2;
        while (*op != ' ') op++;
        while (*op == ' ') op++;
        const char *hop = head + 2;
        while (*hop != ' ') hop++;
        while (*hop == ' ') hop++;
        CHECK_MSG(op - row == hop - head, "op column at %d, not %d: %.*s", (int)(op - row), (int)(hop - head),
                  (int)len, row);
        row = eol ? eol + 1 : NULL;
    }
    CHECK(rows >= 3 && long_row == 1);
    free(text);
    deft_graph_free(g);
}

int main(void) {
    test_budget_messages();
    test_errmsg_convention();
    test_plan_columns();
    return deft_check_finish();
}
