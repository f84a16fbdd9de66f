/* examples/gpt2.h's attention over the packed q/k/v product (deft_attention_packed) against the composition it
 * replaced (GPT2_ATTENTION_APART: q, k and v sliced out of c_attn's product and permuted to [B, H, T, D], the output
 * permuted back), on a small GPT-2 planned for one training step, in f32, under bf16 autocast and without the cheap
 * recomputations:
 *   - the activation bytes the planner makes (no_reuse_bytes: every buffer of the step) fall by at least the q, k
 *     and v copies ([B, T, 3C] of the activation dtype per layer), and the planned arena does not grow (in f32 it
 *     falls: the output's permuted copy goes). The arena's peak holds c_attn's product in the packed form where the
 *     apart one held q, k and v instead, so the peak falls by less than the copies, or not at all where it lies
 *     elsewhere (GPT-2 124M: at the LM head);
 *   - the packed graph has no permute and the apart one 8 per layer (the comparison is between the two forms);
 *   - from the same parameters both give the same loss and c_attn weight gradient, bit for bit (the one CPU
 *     kernel, the same sums). */
#include <string.h>

#include "check.h"
#include "deft_testing.h"

static int apart;
#define GPT2_ATTENTION_APART apart
#include "../examples/gpt2.h"

static const gpt2_config tiny = {64, 32, 64, 2, 4};
enum { BATCH = 3 };

static int count_op(const deft_graph *g, const char *op) {
    int k = 0;
    for (int id = 0; id < deft_graph_node_count(g); id++) k += !strcmp(deft_testing_op(deft_testing_node(g, id)), op);
    return k;
}

static deft_memory_report plan(int use_apart, const deft_compile_options *o, int *permutes) {
    gpt2 m;
    apart = use_apart;
    deft_graph *g = deft_graph_new();
    CHECK_OK(gpt2_build_shapes_into(&m, g, &tiny, BATCH, deft_cpu()));
    CHECK_OK(deft_backward(m.loss));
    *permutes = count_op(g, "permute");   /* before the compile's rewrites add their own nodes */
    deft_memory_report r = {0};
    CHECK_OK(deft_plan_memory(g, &m.loss, 1, o, &r));
    deft_graph_free(g);
    return r;
}

static void test_bytes(void) {
    const deft_compile_options opts[] = {{0}, {.autocast = DEFT_BF16}, {.no_cheap_recompute = 1}};
    const char *names[] = {"f32", "bf16 autocast", "f32 without cheap recomputes"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        int pa = 0, pp = 0;
        const deft_memory_report a = plan(1, &opts[i], &pa), p = plan(0, &opts[i], &pp);
        const size_t esz = opts[i].autocast ? 2 : 4;
        const size_t copies = (size_t)tiny.layers * BATCH * (size_t)tiny.seq * 3 * (size_t)tiny.width * esz;
        printf("%s: arena %zu -> %zu, activation bytes %zu -> %zu (q, k, v copies %zu)\n", names[i], a.arena_bytes,
               p.arena_bytes, a.no_reuse_bytes, p.no_reuse_bytes, copies);
        CHECK_MSG(p.no_reuse_bytes + copies <= a.no_reuse_bytes, "%s: activation bytes %zu packed, %zu apart: want "
                  "%zu less at least", names[i], p.no_reuse_bytes, a.no_reuse_bytes, copies);
        CHECK_MSG(p.arena_bytes <= a.arena_bytes, "%s: arena %zu packed > %zu apart", names[i], p.arena_bytes,
                  a.arena_bytes);
        if (!opts[i].autocast)
            CHECK_MSG(p.arena_bytes < a.arena_bytes, "%s: arena %zu packed, %zu apart", names[i], p.arena_bytes,
                      a.arena_bytes);
        /* apart: q, k, v and the output forward, their gradients backward */
        CHECK_MSG(pp == 0 && pa == 8 * tiny.layers, "%s: %d permutes packed, %d apart", names[i], pp, pa);
    }
}

static void feed(deft_program *p, const gpt2 *m) {
    int32_t x[BATCH * 32], y[BATCH * 32];
    for (int i = 0; i < BATCH * 32; i++) x[i] = (i * 7919 + 13) % 64, y[i] = (i * 104729 + 7) % 64;
    CHECK_OK(deft_program_feed(p, m->x, x, sizeof x));
    CHECK_OK(deft_program_feed(p, m->y, y, sizeof y));
}

/* Every parameter of `to` set to the values of its namesake in `from` (the draws follow node ids, which the apart
 * form's extra nodes shift). */
static void copy_params(const deft_graph *from, deft_graph *to) {
    int copied = 0;
    for (int id = 0; id < deft_graph_node_count(from); id++) {
        const deft_tensor *s = deft_testing_node(from, id);
        if (strcmp(deft_testing_op(s), "param") != 0) continue;
        deft_tensor *d = deft_graph_find(to, deft_tensor_name(s));
        const size_t bytes = deft_tensor_nbytes(s);
        void *buf = malloc(bytes);
        CHECK_MSG(d && deft_tensor_nbytes(d) == bytes, "parameter %s", deft_tensor_name(s));
        CHECK_OK(deft_param_get(s, buf, bytes));
        if (d) CHECK_OK(deft_param_set(d, buf, bytes));
        free(buf);
        copied++;
    }
    CHECK_MSG(copied == 4 + 12 * tiny.layers, "%d parameters copied", copied);
}

/* The loss and the first block's c_attn weight gradient [C, 3C] of graph g. */
static void loss_and_grad(deft_graph *g, const gpt2 *m, float *loss, float *gw) {
    CHECK_OK(deft_backward(m->loss));
    deft_tensor *w = deft_graph_find(g, "h0.attn.c_attn.weight");
    deft_tensor *outs[2] = {m->loss, w ? deft_grad(w) : NULL};
    deft_program *p = outs[1] ? deft_compile(g, outs, 2, NULL) : NULL;
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        feed(p, m);
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, m->loss, loss, sizeof *loss));
        CHECK_OK(deft_program_read(p, outs[1], gw, deft_tensor_nbytes(outs[1])));
    }
}

static void test_same_step(void) {
    const size_t n = 64 * 192;
    float la = 0, lp = 0, *ga = calloc(n, 4), *gp = calloc(n, 4);
    gpt2 ma, mp;
    deft_graph *a = deft_graph_new(), *p = deft_graph_new();
    apart = 1;
    CHECK_MSG(gpt2_build_into(&ma, a, &tiny, BATCH, deft_cpu()) == DEFT_OK, "build: %s", deft_errmsg());
    apart = 0;
    CHECK_MSG(gpt2_build_into(&mp, p, &tiny, BATCH, deft_cpu()) == DEFT_OK, "build: %s", deft_errmsg());
    copy_params(a, p);
    loss_and_grad(a, &ma, &la, ga);
    loss_and_grad(p, &mp, &lp, gp);
    size_t differ = 0, nonzero = 0;
    for (size_t i = 0; i < n; i++) differ += ga[i] != gp[i], nonzero += gp[i] != 0.0f;
    CHECK_MSG(isfinite(la) && la == lp, "loss %.9g apart, %.9g packed", la, lp);
    CHECK_MSG(differ == 0 && nonzero > n / 2, "c_attn weight gradient: %zu of %zu differ (%zu nonzero)", differ, n,
              nonzero);
    deft_graph_free(a);
    deft_graph_free(p);
    free(ga), free(gp);
}

int main(void) {
    test_bytes();
    test_same_step();
    return deft_check_finish();
}
