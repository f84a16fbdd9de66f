/* Layer norm with its value in bf16 or f16 from f32 x (deft_layer_norm_as, what autocast builds where only products
 * read a layer norm: ir/autocast_layer_norm.c) on the CPU:
 *   - the value has the bits of the f32 layer norm cast down, and dx, dw and db, from a bf16 or f16 dy read as it is,
 *     the bits of the f32 node's gradients from that dy cast up, over shapes with and without weight and bias;
 *   - tests/ln_lowp.h's pre-norm block under bf16 and f16 autocast: the same loss and gradients bit for bit as with
 *     the f32 layer norms cast down (the debug knob LN_WIDE), activation bytes lower by exactly the f32 values, the
 *     f32 nodes not computed;
 *   - refusals: a value dtype that is not x's nor (from f32) bf16 or f16, with its message, and no node added. */
#include <math.h>

#include "ln_lowp.h"

static uint64_t rng = 0x10b1a5ull;

/* y = ln(x) in lo (direct or as the cast of the f32 value), loss = sum(y * r) with r in lo: y's raw bits, and dx, dw,
 * db as f32 bits (dw and db NULL without weight / bias). */
static int direct_run(const ref_tensor *x, const ref_tensor *w, const ref_tensor *b, const ref_tensor *r,
                      deft_dtype lo, int direct, void **out) {
    deft_graph *g = deft_graph_new();
    const deft_device cpu = deft_cpu();
    deft_tensor *xp = deft_param(g, "x", DEFT_F32, x->ndim, x->shape, cpu, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(xp, x->raw, (size_t)x->n * 4));
    deft_tensor *wp = NULL, *bp = NULL;
    if (w) CHECK_OK(deft_param_set(wp = deft_param(g, "w", DEFT_F32, 1, w->shape, cpu, DEFT_INIT_ZEROS), w->raw,
                                   (size_t)w->n * 4));
    if (b) CHECK_OK(deft_param_set(bp = deft_param(g, "b", DEFT_F32, 1, b->shape, cpu, DEFT_INIT_ZEROS), b->raw,
                                   (size_t)b->n * 4));
    deft_tensor *y = direct ? deft_layer_norm_as(xp, wp, bp, 1e-5, lo)
                            : deft_cast(deft_layer_norm(xp, wp, bp, 1e-5), lo);
    CHECK_MSG(y && deft_tensor_dtype(y) == lo, "build: %s", deft_graph_errmsg(g));
    deft_tensor *loss = deft_sum(deft_mul(y, ref_const(g, r)), 0, NULL, 0);
    int ok = loss && deft_backward(loss) == DEFT_OK;
    deft_tensor *outs[4] = {y, deft_grad(xp), wp ? deft_grad(wp) : NULL, bp ? deft_grad(bp) : NULL};
    deft_tensor *list[4];
    int n = 0;
    for (int i = 0; i < 4; i++)
        if (outs[i]) list[n++] = outs[i];
    deft_program *p = ok ? deft_compile(g, list, n, NULL) : NULL;
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    ok = p && deft_program_run(p) == DEFT_OK;
    for (int i = 0; i < 4; i++) {
        out[i] = NULL;
        if (!ok || !outs[i]) continue;
        const size_t bytes = deft_tensor_nbytes(outs[i]);
        out[i] = malloc(bytes);
        ok = deft_program_read(p, outs[i], out[i], bytes) == DEFT_OK;
    }
    CHECK_MSG(ok, "run: %s", deft_errmsg());
    deft_program_free(p);
    deft_graph_free(g);
    return ok;
}

static void test_direct(void) {
    static const struct { int ndim; int64_t shape[3]; int weight, bias; } cases[] = {
        {2, {5, 7}, 1, 1}, {3, {2, 3, 64}, 1, 0}, {2, {9, 1}, 0, 1}, {2, {4, 33}, 0, 0}};
    static const deft_dtype los[2] = {DEFT_BF16, DEFT_F16};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int li = 0; li < 2; li++) {
            const int64_t c = cases[ci].shape[cases[ci].ndim - 1];
            ref_tensor x = ref_random(&rng, DEFT_F32, cases[ci].ndim, cases[ci].shape, -2.0, 3.0);
            ref_tensor w = ref_random(&rng, DEFT_F32, 1, &c, 0.5, 1.5), b = ref_random(&rng, DEFT_F32, 1, &c, -1, 1);
            ref_tensor r = ref_random(&rng, los[li], cases[ci].ndim, cases[ci].shape, -1.0, 1.0);
            void *got[4], *want[4];
            const ref_tensor *wp = cases[ci].weight ? &w : NULL, *bp = cases[ci].bias ? &b : NULL;
            if (direct_run(&x, wp, bp, &r, los[li], 1, got) && direct_run(&x, wp, bp, &r, los[li], 0, want)) {
                const size_t bytes[4] = {(size_t)x.n * 2, (size_t)x.n * 4, (size_t)c * 4, (size_t)c * 4};
                static const char *const names[4] = {"y", "dx", "dw", "db"};
                for (int i = 0; i < 4; i++)
                    CHECK_MSG((got[i] == NULL) == (want[i] == NULL) &&
                                  (!got[i] || memcmp(got[i], want[i], bytes[i]) == 0),
                              "case %zu %s: %s differs from the f32 layer norm's cast", ci,
                              deft_dtype_name(los[li]), names[i]);
                for (int i = 0; i < 4; i++) free(got[i]), free(want[i]);
            }
            ref_free(&x), ref_free(&w), ref_free(&b), ref_free(&r);
        }
}

static void test_block(void) {
    const int64_t shape[3] = {2, 8, 64};
    lnl_check(deft_cpu(), shape, DEFT_BF16, NULL);
    lnl_check(deft_cpu(), shape, DEFT_F16, NULL);
}

static void check_refused(deft_dtype xdt, deft_dtype out, const char *needle) {
    deft_graph *g = deft_graph_new();
    const int64_t xs[2] = {2, 5};
    deft_tensor *x = deft_input(g, "x", xdt, 2, xs, deft_cpu());
    const int nodes = deft_graph_node_count(g);
    CHECK(deft_layer_norm_as(x, NULL, NULL, 1e-5, out) == NULL);
    CHECK_MSG(strstr(deft_errmsg(), needle) != NULL, "message \"%s\" lacks \"%s\"", deft_errmsg(), needle);
    CHECK(deft_graph_error(g) == DEFT_ERR_DTYPE);
    CHECK(deft_graph_node_count(g) == nodes);
    deft_graph_free(g);
}

static void test_refusals(void) {
    check_refused(DEFT_F64, DEFT_BF16, "layer_norm: a bf16 value from f64 x (x's dtype, or bf16 or f16 from f32)");
    check_refused(DEFT_BF16, DEFT_F32, "layer_norm: a f32 value from bf16 x");
    check_refused(DEFT_F32, DEFT_I32, "layer_norm: a i32 value from f32 x");
    check_refused(DEFT_F32, DEFT_F64, "layer_norm: a f64 value from f32 x");
    check_refused(DEFT_F32, (deft_dtype)99, "layer_norm: a invalid value from f32 x");
}

int main(void) {
    test_direct();
    test_block();
    test_refusals();
    return deft_check_finish();
}
