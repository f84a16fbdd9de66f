/* Cross-entropy's fast GPU kernels for long rows against the plain block kernels that re-read a row each pass (the
 * CE_REFERENCE debug knob): the streaming kernels (rows through shared memory, cuda_ce_stream.cu: rows on 16 bytes
 * that fit the device's shared memory twice) and the register kernels (a row held in registers: rows off 16 bytes,
 * or too long to stream). The same bits for the loss and the gradient, bf16, f16 and f32 logits, an f32 loss beside
 * half logits and a loss of their own dtype, plain mean, an ignore index with label smoothing, sum, rows of a
 * multiple of 8 classes and not (a short last group, rows off 16 bytes), 4 and 8 groups a thread, a block looping
 * over several rows, GPT-2's vocabulary over more rows than the loss's blocks (1100 of 50304: each streaming block
 * then walks several of the plain kernel's blocks), and rows too long for registers (the plain kernels, for both
 * settings). A target out of range is still found and reported on the fast paths. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft_testing.h"
#include "ref.h"

typedef struct regs_case {
    int64_t rows, c;
    int groups_half, groups_f32;   /* what deft_testing_ce_regs_groups must say: 0 the plain kernels */
} regs_case;

static const regs_case cases[] = {
    {64, 1024, 4, 4},       /* the fewest classes of a block per row: 32 threads, 4 groups each */
    {2100, 1024, 4, 4},     /* more rows than the loss's blocks: each block sums several */
    {64, 2001, 4, 4},       /* a last group of one class */
    {64, 1027, 8, 0},       /* 5 groups a thread; rows off 16 bytes */
    {32, 4095, 4, 4},       /* a last group of 7 */
    {64, 4100, 8, 0},       /* f32 rows on 16 bytes with a last group of 4 (streamed); halves off 16 bytes */
    {4, 32768, 4, 4},       /* 1024 threads, 4 groups each: the most f32 takes */
    {4, 50257, 8, 0},       /* GPT-2's vocabulary: 7 groups a thread */
    {4, 50304, 8, 0},       /* GPT-2's padded vocabulary */
    {1100, 50304, 8, 0},    /* the same over more rows than the loss's 1024 blocks, and than most GPUs' SMs */
    {3, 65536, 8, 0},       /* 8 groups a thread: the most halves take */
    {3, 65537, 0, 0},       /* one group more: the plain kernels */
};

typedef struct regs_opts {
    const char *name;
    int use;   /* 0: deft_cross_entropy's plain mean */
    deft_cross_entropy_options o;
    int ignore_every;
} regs_opts;

static const regs_opts opts[] = {
    {"plain mean", 0, {0}, 0},
    {"ignore -100 every 3rd, smoothing 0.1", 1,
     {.use_ignore_index = 1, .ignore_index = -100, .label_smoothing = 0.1}, 3},
    {"sum", 1, {.reduction = DEFT_REDUCTION_SUM}, 0},
    {"ignore 2 (a class) every 2nd, smoothing 0.2, sum", 1,
     {.use_ignore_index = 1, .ignore_index = 2, .label_smoothing = 0.2, .reduction = DEFT_REDUCTION_SUM}, 2},
};

/* The loss (raw, f32 when loss_f32 else the logits' dtype) and the gradient of 0.75 * loss for the logits (raw). */
static int run_ce(deft_device dev, const ref_tensor *x, const ref_tensor *t, const regs_opts *ro, int loss_f32,
                  void *loss_out, void *grad_out) {
    deft_graph *g = deft_graph_new();
    deft_tensor *xp = deft_param(g, "logits", x->dt, 2, x->shape, dev, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(xp, x->raw, (size_t)x->n * ref_esize(x->dt)));
    deft_tensor *tt = deft_constant(g, DEFT_I32, 1, t->shape, dev, t->raw, (size_t)t->n * 4);
    const deft_cross_entropy_options *o = ro->use ? &ro->o : NULL;
    deft_tensor *loss = loss_f32 ? deft_cross_entropy_as(xp, tt, o, DEFT_F32) : deft_cross_entropy_ex(xp, tt, o);
    int ok = 0;
    if (loss && deft_backward(deft_mul_scalar(loss, 0.75)) == DEFT_OK) {
        deft_tensor *outs[2] = {loss, deft_grad(xp)};
        deft_program *p = outs[1] ? deft_compile(g, outs, 2, NULL) : NULL;
        if (p && deft_program_run(p) == DEFT_OK &&
            deft_program_read(p, loss, loss_out, ref_esize(deft_tensor_dtype(loss))) == DEFT_OK &&
            deft_program_read(p, outs[1], grad_out, (size_t)x->n * ref_esize(x->dt)) == DEFT_OK)
            ok = 1;
        deft_program_free(p);
    }
    CHECK_MSG(ok, "run: %s", deft_errmsg());
    deft_graph_free(g);
    return ok;
}

static void inputs(const regs_case *rc, const regs_opts *ro, deft_dtype dt, uint64_t *rng, ref_tensor *x,
                   ref_tensor *t) {
    *x = ref_random(rng, dt, 2, (int64_t[]){rc->rows, rc->c}, -6, 6);
    *t = ref_alloc(DEFT_I32, 1, (int64_t[]){rc->rows});
    for (int64_t r = 0; r < rc->rows; r++) {
        const int ignored = ro->ignore_every > 0 && r % ro->ignore_every == 0;
        ref_set(t, r, ignored ? (double)ro->o.ignore_index : (double)(ref_next(rng) % (uint64_t)rc->c));
    }
}

/* One case, one dtype, one set of options: the register kernels' bits (knob 0) against the plain ones' (knob 1). */
static void check_bits(deft_device dev, const regs_case *rc, const regs_opts *ro, deft_dtype dt, int loss_f32,
                       uint64_t *rng) {
    ref_tensor x, t;
    inputs(rc, ro, dt, rng, &x, &t);
    const size_t bytes = (size_t)x.n * ref_esize(dt);
    unsigned char *ga = malloc(bytes), *gb = malloc(bytes);
    uint32_t la = 0, lb = 0;
    int ok = ga && gb;
    for (int reference = 0; ok && reference < 2; reference++) {
        CHECK_OK(deft_testing_set_debug("CE_REFERENCE", reference));
        ok = run_ce(dev, &x, &t, ro, loss_f32, reference ? (void *)&lb : (void *)&la, reference ? gb : ga);
    }
    CHECK_OK(deft_testing_set_debug("CE_REFERENCE", 0));
    if (ok) {
        CHECK_MSG(la == lb, "%lld x %lld %s (%s loss), %s: loss bits 0x%08x in registers, 0x%08x plain",
                  (long long)rc->rows, (long long)rc->c, deft_dtype_name(dt), loss_f32 ? "f32" : "own", ro->name, la,
                  lb);
        int64_t differ = 0, first = -1, nonzero = 0;
        const size_t es = ref_esize(dt);
        for (int64_t i = 0; i < x.n; i++) {
            const int d = memcmp(ga + (size_t)i * es, gb + (size_t)i * es, es) != 0;
            if (d && first < 0) first = i;
            differ += d;
            nonzero += ref_load(ga, dt, i) != 0.0;
        }
        CHECK_MSG(differ == 0, "%lld x %lld %s (%s loss), %s: %lld gradient elements differ (first %lld: %.9g, %.9g)",
                  (long long)rc->rows, (long long)rc->c, deft_dtype_name(dt), loss_f32 ? "f32" : "own", ro->name,
                  (long long)differ, (long long)first, first >= 0 ? ref_load(ga, dt, first) : 0.0,
                  first >= 0 ? ref_load(gb, dt, first) : 0.0);
        CHECK_MSG(nonzero > 0, "%lld x %lld %s: the gradient is all zeros", (long long)rc->rows, (long long)rc->c,
                  deft_dtype_name(dt));
    }
    free(ga), free(gb);
    ref_free(&x), ref_free(&t);
}

/* The kernels each case is meant to reach; the knob sends every row to the plain ones. */
static void check_groups(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const regs_case *rc = &cases[i];
        CHECK_MSG(deft_testing_ce_regs_groups(DEFT_BF16, rc->c) == rc->groups_half &&
                      deft_testing_ce_regs_groups(DEFT_F16, rc->c) == rc->groups_half &&
                      deft_testing_ce_regs_groups(DEFT_F32, rc->c) == rc->groups_f32,
                  "%lld classes: groups bf16 %d, f16 %d, f32 %d (want %d, %d)", (long long)rc->c,
                  deft_testing_ce_regs_groups(DEFT_BF16, rc->c), deft_testing_ce_regs_groups(DEFT_F16, rc->c),
                  deft_testing_ce_regs_groups(DEFT_F32, rc->c), rc->groups_half, rc->groups_f32);
    }
    CHECK(deft_testing_ce_regs_groups(DEFT_F64, 4096) == 0);
    /* Streaming: rows on 16 bytes that fit twice in any GPU's shared memory stream; rows off 16 bytes, f64, rows of
     * a warp never do. Whether GPT-2's rows stream depends on the device's shared memory (an H100's: yes). */
    CHECK(deft_testing_ce_streams(DEFT_BF16, 1024) == 1 && deft_testing_ce_streams(DEFT_F16, 4096) == 1 &&
          deft_testing_ce_streams(DEFT_F32, 2048) == 1 && deft_testing_ce_streams(DEFT_F32, 4100) == 1);
    CHECK(deft_testing_ce_streams(DEFT_BF16, 1027) == 0 && deft_testing_ce_streams(DEFT_BF16, 50257) == 0 &&
          deft_testing_ce_streams(DEFT_F32, 2001) == 0 && deft_testing_ce_streams(DEFT_F64, 4096) == 0 &&
          deft_testing_ce_streams(DEFT_BF16, 1016) == 0 && deft_testing_ce_streams(DEFT_BF16, 1028) == 0);
    printf("GPT-2's rows (50304 bf16) %s on this device; f32 rows of 32768 %s\n",
           deft_testing_ce_streams(DEFT_BF16, 50304) ? "stream" : "do not stream",
           deft_testing_ce_streams(DEFT_F32, 32768) ? "stream" : "do not stream");
    CHECK(deft_testing_ce_regs_groups(DEFT_BF16, 1023) == 0);   /* a warp per row */
    CHECK_OK(deft_testing_set_debug("CE_REFERENCE", 1));
    CHECK(deft_testing_ce_regs_groups(DEFT_BF16, 50304) == 0 && deft_testing_ce_regs_groups(DEFT_F32, 1024) == 0);
    CHECK(deft_testing_ce_streams(DEFT_BF16, 50304) == 0 && deft_testing_ce_streams(DEFT_F32, 1024) == 0);
    CHECK_OK(deft_testing_set_debug("CE_REFERENCE", 0));
}

/* A target past C on the register path: the loss is NaN, the gradient's row NaN (the others finite), and the next
 * read reports the row, as the plain kernels do. */
static void check_bad_target(deft_device dev, deft_dtype dt, int64_t c) {
    uint64_t rng = 0xbadull;
    const int64_t rows = 5;
    ref_tensor x = ref_random(&rng, dt, 2, (int64_t[]){rows, c}, -3, 3);
    int32_t tv[5] = {1, 7, (int32_t)c + 5, 0, 3};
    char want[96];
    snprintf(want, sizeof want, "cross_entropy: target %d of row 2 is outside [0, %lld)", (int)c + 5, (long long)c);
    for (int reference = 0; reference < 2; reference++) {
        CHECK_OK(deft_testing_set_debug("CE_REFERENCE", reference));
        deft_graph *g = deft_graph_new();
        deft_tensor *xp = deft_input(g, "logits", dt, 2, x.shape, dev);
        deft_tensor *tt = deft_constant(g, DEFT_I32, 1, &rows, dev, tv, sizeof tv);
        deft_tensor *l = deft_cross_entropy_as(xp, tt, NULL, DEFT_F32);
        deft_tensor *gr = deft_cross_entropy_grad(deft_full(g, DEFT_F32, 0, NULL, dev, 1.0), xp, tt);
        deft_tensor *outs[2] = {l, gr};
        deft_program *p = deft_compile(g, outs, 2, NULL);
        CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
        const size_t bytes = (size_t)x.n * ref_esize(dt);
        unsigned char *grad = malloc(bytes);
        if (p && grad) {
            CHECK_OK(deft_program_feed(p, xp, x.raw, bytes));
            CHECK_OK(deft_program_run(p));
            float loss = 0.0f;
            CHECK_ERR(deft_program_read(p, l, &loss, sizeof loss), DEFT_ERR_INVALID, want);
            CHECK_MSG(isnan(loss), "%s %lld classes (reference %d): loss %g", deft_dtype_name(dt), (long long)c,
                      reference, loss);
            CHECK_OK(deft_program_run(p));
            CHECK_ERR(deft_program_read(p, gr, grad, bytes), DEFT_ERR_INVALID, want);
            int64_t nan_bad = 0, finite_rest = 0;
            for (int64_t i = 0; i < x.n; i++) {
                const double v = ref_load(grad, dt, i);
                if (i / c == 2) nan_bad += isnan(v);
                else finite_rest += isfinite(v);
            }
            CHECK_MSG(nan_bad == c && finite_rest == (rows - 1) * c, "%s %lld classes (reference %d): %lld of the bad "
                      "row NaN, %lld of the rest finite", deft_dtype_name(dt), (long long)c, reference,
                      (long long)nan_bad, (long long)finite_rest);
        }
        free(grad);
        deft_program_free(p);
        deft_graph_free(g);
    }
    CHECK_OK(deft_testing_set_debug("CE_REFERENCE", 0));
    ref_free(&x);
}

int main(void) {
    deft_device dev;
    if (!deft_test_gpu(&dev)) return DEFT_CHECK_SKIP;
    if (dev.type == DEFT_CUDA) check_groups();
    static const deft_dtype dts[] = {DEFT_BF16, DEFT_F16, DEFT_F32};
    uint64_t rng = 0xce4e65ull;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t oi = 0; oi < sizeof opts / sizeof opts[0]; oi++)
            for (int di = 0; di < 3; di++)
                /* halves: an f32 loss (autocast's) under the even options, the logits' own under the odd */
                check_bits(dev, &cases[ci], &opts[oi], dts[di], dts[di] == DEFT_F32 || oi % 2 == 0, &rng);
    if (dev.type == DEFT_CUDA) {   /* the CPU standing in refuses such a target before it runs */
        check_bad_target(dev, DEFT_BF16, 50304);
        check_bad_target(dev, DEFT_F32, 4096);
        check_bad_target(dev, DEFT_BF16, 50257);   /* the register kernels: rows off 16 bytes */
    }
    return deft_check_finish();
}
