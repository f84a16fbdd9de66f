/* deft_program_trace on the CPU: a small MLP's training step traced to a Chrome trace-event file, which must be
 * valid JSON (checked by a strict parser here) with one "X" event per step, names escaped, durations >= 0 and an
 * arena counter; its refusals; and that the program runs on after it exactly as it would have. */
#include <stdint.h>

#include "check.h"
#include "read_file.h"
#include "deft_testing.h"

#define CPU deft_cpu()
#define TRACE_PATH "test_trace.json"
#define ODD_NAME "hid\"den\\1"   /* a quote and a backslash: escaped in the file */

typedef struct mlp {
    deft_graph *g;
    deft_tensor *x, *y, *w1, *w2, *loss, *step;
    deft_program *prog;
} mlp;

static void mlp_build(mlp *m, const deft_compile_options *o) {
    static const float X[8] = {0.5f, -1, 2, 0.25f, -0.5f, 1.5f, 1, -2}, Y[4] = {1, -1, 0.5f, 2};
    float w1[6], w2[3];
    for (int i = 0; i < 6; i++) w1[i] = 0.1f * (float)(i - 2);
    for (int i = 0; i < 3; i++) w2[i] = 0.2f * (float)(1 - i);
    m->g = deft_graph_new();
    m->x = deft_input(m->g, "x", DEFT_F32, 2, (int64_t[]){4, 2}, CPU);
    m->y = deft_input(m->g, "y", DEFT_F32, 2, (int64_t[]){4, 1}, CPU);
    m->w1 = deft_param(m->g, "w1", DEFT_F32, 2, (int64_t[]){2, 3}, CPU, DEFT_INIT_ZEROS);
    m->w2 = deft_param(m->g, "w2", DEFT_F32, 2, (int64_t[]){3, 1}, CPU, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(m->w1, w1, sizeof w1));
    CHECK_OK(deft_param_set(m->w2, w2, sizeof w2));
    deft_tensor *h = deft_relu(deft_set_name(deft_matmul(m->x, m->w1), ODD_NAME));
    m->loss = deft_mse_loss(deft_matmul(h, m->w2), m->y);
    CHECK_OK(deft_backward(m->loss));
    deft_optimizer *opt = deft_sgd(m->g, &(deft_sgd_options){.lr = 0.1}, NULL);
    CHECK(opt != NULL);
    m->step = deft_optimizer_step(opt);
    m->prog = deft_compile(m->g, (deft_tensor *[]){m->loss, m->step}, 2, o);
    CHECK(m->prog != NULL);
    if (!m->prog || o) return;
    CHECK_OK(deft_program_feed(m->prog, m->x, X, sizeof X));
    CHECK_OK(deft_program_feed(m->prog, m->y, Y, sizeof Y));
}


/* ---- a strict JSON parser (RFC 8259), answering whether the whole text is one value ---- */

static const char *json_value(const char *s, int depth);

static const char *json_ws(const char *s) {
    while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t') s++;
    return s;
}

static const char *json_string(const char *s) {
    if (*s++ != '"') return NULL;
    for (; *s != '"'; s++) {
        if ((unsigned char)*s < 0x20) return NULL;   /* a raw control character (or the end) */
        if (*s != '\\') continue;
        s++;
        if (*s == 'u') {
            for (int k = 1; k <= 4; k++)
                if (!strchr("0123456789abcdefABCDEF", s[k]) || !s[k]) return NULL;
            s += 4;
        } else if (!*s || !strchr("\"\\/bfnrt", *s)) {
            return NULL;
        }
    }
    return s + 1;
}

static const char *json_number(const char *s) {
    if (*s == '-') s++;
    if (*s == '0') s++;
    else if (*s >= '1' && *s <= '9') while (*s >= '0' && *s <= '9') s++;
    else return NULL;
    if (*s == '.') {
        if (!(*++s >= '0' && *s <= '9')) return NULL;
        while (*s >= '0' && *s <= '9') s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!(*s >= '0' && *s <= '9')) return NULL;
        while (*s >= '0' && *s <= '9') s++;
    }
    return s;
}

/* An object (close '}') or array (close ']'), after its opening bracket. */
static const char *json_members(const char *s, char close, int depth) {
    s = json_ws(s);
    if (*s == close) return s + 1;
    for (;;) {
        if (close == '}') {
            s = json_string(json_ws(s));
            if (!s || *(s = json_ws(s)) != ':') return NULL;
            s++;
        }
        s = json_value(s, depth + 1);
        if (!s) return NULL;
        s = json_ws(s);
        if (*s == close) return s + 1;
        if (*s++ != ',') return NULL;
    }
}

static const char *json_value(const char *s, int depth) {
    if (depth > 64) return NULL;
    s = json_ws(s);
    switch (*s) {
    case '{': return json_members(s + 1, '}', depth);
    case '[': return json_members(s + 1, ']', depth);
    case '"': return json_string(s);
    case 't': return strncmp(s, "true", 4) ? NULL : s + 4;
    case 'f': return strncmp(s, "false", 5) ? NULL : s + 5;
    case 'n': return strncmp(s, "null", 4) ? NULL : s + 4;
    default: return json_number(s);
    }
}

static int json_valid(const char *text) {
    const char *end = json_value(text, 0);
    return end && *json_ws(end) == 0;
}

static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *s = text; (s = strstr(s, needle)); s += strlen(needle)) n++;
    return n;
}

static void test_trace_file(void) {
    mlp m;
    mlp_build(&m, NULL);
    remove(TRACE_PATH);
    CHECK_OK(deft_program_trace(m.prog, TRACE_PATH));
    char *text = read_file(TRACE_PATH);
    CHECK(text != NULL);
    if (!text) return;
    CHECK_MSG(json_valid(text), "not valid JSON:\n%s", text);
    CHECK(strncmp(text, "{\"traceEvents\":[", 16) == 0);
    CHECK(strstr(text, "\"displayTimeUnit\":\"ms\"") != NULL);
    const int steps = deft_program_step_count(m.prog);
    CHECK(steps > 6);   /* forward, backward and the optimizer's step */
    CHECK_MSG(count(text, "\"ph\":\"X\"") == steps, "%d X events for %d steps", count(text, "\"ph\":\"X\""), steps);
    CHECK(count(text, "\"ph\":\"C\"") >= 1);
    CHECK(strstr(text, "\"name\":\"arena bytes\"") != NULL);
    CHECK(strstr(text, "\"name\":\"thread_name\"") != NULL && strstr(text, "\"name\":\"cpu\"") != NULL);
    CHECK(strstr(text, "\"name\":\"hid\\\"den\\\\1\"") != NULL);   /* the odd name, escaped */
    CHECK(strstr(text, "\"op\":\"optimizer") != NULL || strstr(text, "\"cat\":\"optim") != NULL);
    int durs = 0;
    for (const char *s = text; (s = strstr(s, "\"dur\":")); s += 6, durs++) CHECK(strtod(s + 6, NULL) >= 0);
    CHECK(durs == steps);
    free(text);
    remove(TRACE_PATH);
    deft_graph_free(m.g);
}

/* After a trace the program runs on as if the trace had been a plain run. */
static void test_runs_on(void) {
    mlp a, b;
    mlp_build(&a, NULL);
    mlp_build(&b, NULL);
    CHECK_OK(deft_program_trace(a.prog, TRACE_PATH));
    CHECK_OK(deft_program_run(a.prog));
    CHECK_OK(deft_program_run(b.prog));
    CHECK_OK(deft_program_run(b.prog));
    float wa[6], wb[6], la, lb;
    CHECK_OK(deft_param_get(a.w1, wa, sizeof wa));
    CHECK_OK(deft_param_get(b.w1, wb, sizeof wb));
    CHECK(memcmp(wa, wb, sizeof wa) == 0);
    CHECK_OK(deft_param_get(a.w2, wa, 3 * sizeof(float)));
    CHECK_OK(deft_param_get(b.w2, wb, 3 * sizeof(float)));
    CHECK(memcmp(wa, wb, 3 * sizeof(float)) == 0);
    CHECK_OK(deft_program_read(a.prog, a.loss, &la, sizeof la));
    CHECK_OK(deft_program_read(b.prog, b.loss, &lb, sizeof lb));
    CHECK(la == lb);
    CHECK(deft_program_node_runs(a.prog, a.loss) == 2);
    remove(TRACE_PATH);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

static int file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

static void test_refusals(void) {
    mlp m;
    mlp_build(&m, NULL);
    CHECK_ERR(deft_program_trace(NULL, TRACE_PATH), DEFT_ERR_INVALID, "NULL");
    CHECK_ERR(deft_program_trace(m.prog, NULL), DEFT_ERR_INVALID, "NULL");
    CHECK_ERR(deft_program_trace(m.prog, "no-such-directory/trace.json"), DEFT_ERR_IO, "no-such-directory");
    deft_graph_free(m.g);

    remove(TRACE_PATH);
    mlp stopped;
    mlp_build(&stopped, &(deft_compile_options){.stop_after = "schedule"});
    CHECK_ERR(deft_program_trace(stopped.prog, TRACE_PATH), DEFT_ERR_STATE, "stop_after");
    CHECK(!file_exists(TRACE_PATH));
    deft_graph_free(stopped.g);

    mlp unfed;   /* compiled with options, so never fed */
    mlp_build(&unfed, &(deft_compile_options){0});
    CHECK_ERR(deft_program_trace(unfed.prog, TRACE_PATH), DEFT_ERR_STATE, "never fed");
    CHECK(!file_exists(TRACE_PATH));   /* nothing half-written left behind */
    deft_graph_free(unfed.g);
}

int main(void) {
    test_trace_file();
    test_runs_on();
    test_refusals();
    return deft_check_finish();
}
