/* The cheap recomputations every checkpoint policy makes unless the compile option no_cheap_recompute is set
 * (passes/checkpoint.h): a value that one pass over memory makes again from a forward value the backward pass keeps
 * anyway is dropped and recomputed where the backward pass reads it. On the CPU, for a block shaped like GPT-2's (a
 * linear layer and GELU, whose gradient keeps its input; an exp, whose gradient keeps its output, permuted to
 * heads and read by a product's weight gradient):
 *  - exactly the GELU output and the permute are dropped, and the activation bytes fall by their bytes;
 *  - losses and every gradient are bit-identical to keeping them, in f32 and under bf16 autocast, and under a
 *    memory budget the program stays within it and exact;
 *  - a ReLU (whose gradient reads its output) and the casts of parameters are never dropped by this rule;
 *  - a layer norm of a value its own gradient keeps (a pre-norm block's) is dropped and made again, its value and
 *    row statistics the same bits, in f32 and under bf16 autocast; one of a value nothing else keeps (an input) is
 *    not;
 *  - with no_cheap_recompute nothing is dropped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft.h"
#include "ref.h"

#define B 2
#define T 8
#define C 16
#define H 2

typedef struct block {
    deft_graph *g;
    deft_tensor *x, *w1, *w2, *w3, *loss, *grads[3];
} block;

/* h = act(x W1); s = exp(h W2); p = heads of s, permuted; loss = mean((p viewed [B*H*T, C/H]) W3). */
static int build(block *b, int relu) {
    b->g = deft_graph_new();
    deft_graph_set_seed(b->g, 7);
    const deft_device cpu = deft_cpu();
    b->x = deft_input(b->g, "x", DEFT_F32, 2, (int64_t[]){B * T, C}, cpu);
    b->w1 = deft_param(b->g, "w1", DEFT_F32, 2, (int64_t[]){C, 4 * C}, cpu, DEFT_INIT_UNIFORM);
    b->w2 = deft_param(b->g, "w2", DEFT_F32, 2, (int64_t[]){4 * C, C}, cpu, DEFT_INIT_UNIFORM);
    b->w3 = deft_param(b->g, "w3", DEFT_F32, 2, (int64_t[]){C / H, 3}, cpu, DEFT_INIT_UNIFORM);
    deft_tensor *h = deft_matmul(b->x, b->w1);
    h = relu ? deft_relu(h) : deft_gelu_tanh(h);
    deft_tensor *s = deft_exp(deft_matmul(h, b->w2));
    deft_tensor *p = deft_permute(deft_reshape(s, 4, (int64_t[]){B, T, H, C / H}), (int[]){0, 2, 1, 3});
    deft_tensor *y = deft_matmul(deft_reshape(p, 2, (int64_t[]){B * H * T, C / H}), b->w3);
    b->loss = deft_mean(deft_mul(y, y), 0, NULL, 0);
    if (!b->loss || deft_backward(b->loss) != DEFT_OK) return 0;
    b->grads[0] = deft_grad(b->w1), b->grads[1] = deft_grad(b->w2), b->grads[2] = deft_grad(b->w3);
    return b->grads[0] && b->grads[1] && b->grads[2];
}

typedef struct outcome {
    float loss;
    float *grads;            /* the three gradients, one after the other */
    size_t grad_bytes;
    deft_checkpoint_report ck;
    size_t activation_bytes;
    char plan[8192];
} outcome;

static int run(block *b, const deft_compile_options *o, outcome *out) {
    memset(out, 0, sizeof *out);
    deft_tensor *outs[4] = {b->loss, b->grads[0], b->grads[1], b->grads[2]};
    deft_program *p = deft_compile(b->g, outs, 4, o);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) return 0;
    uint64_t rng = 11;
    float xv[B * T * C];
    for (int i = 0; i < B * T * C; i++) xv[i] = (float)ref_unif(&rng, -2, 2);
    CHECK_OK(deft_program_feed(p, b->x, xv, sizeof xv));
    CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_read(p, b->loss, &out->loss, sizeof out->loss));
    for (int k = 0; k < 3; k++) out->grad_bytes += deft_tensor_nbytes(b->grads[k]);
    out->grads = malloc(out->grad_bytes);
    size_t at = 0;
    for (int k = 0; k < 3 && out->grads; k++) {
        CHECK_OK(deft_program_read(p, b->grads[k], (char *)out->grads + at, deft_tensor_nbytes(b->grads[k])));
        at += deft_tensor_nbytes(b->grads[k]);
    }
    CHECK_OK(deft_program_checkpoint(p, &out->ck));
    deft_device_footprint fp[2];
    int n = 0;
    CHECK_OK(deft_program_footprint(p, fp, 2, &n));
    for (int i = 0; i < n; i++) out->activation_bytes += fp[i].activation_bytes;
    FILE *f = tmpfile();
    if (f) {
        CHECK_OK(deft_program_print_plan(p, f));
        rewind(f);
        out->plan[fread(out->plan, 1, sizeof out->plan - 1, f)] = '\0';
        fclose(f);
    }
    deft_program_free(p);
    return 1;
}

static void same(const outcome *a, const outcome *b, const char *what) {
    CHECK_MSG(memcmp(&a->loss, &b->loss, sizeof a->loss) == 0, "%s: loss %.9g against %.9g", what, (double)a->loss,
              (double)b->loss);
    CHECK_MSG(a->grad_bytes == b->grad_bytes && a->grads && b->grads &&
                  memcmp(a->grads, b->grads, a->grad_bytes) == 0,
              "%s: gradients differ", what);
}

/* Whether the plan lists a dropped value named `name`. */
static int dropped_named(const outcome *o, const char *name) {
    char want[96];
    snprintf(want, sizeof want, "dropped    %s ", name);
    return strstr(o->plan, want) != NULL;
}

/* The block compiled twice, under `with` and under `without` (each on a graph of its own), run, and compared bit for
 * bit; 0 when either could not be built. */
static int pair(const deft_compile_options *with, const deft_compile_options *without, const char *what,
                outcome *a_out, outcome *b_out) {
    block a, b;
    if (!build(&a, 0) || !build(&b, 0)) {
        CHECK_MSG(0, "build: %s", deft_errmsg());
        return 0;
    }
    run(&a, with, a_out);
    run(&b, without, b_out);
    same(a_out, b_out, what);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
    return 1;
}

static void test_f32(void) {
    outcome cheap, kept;
    if (!pair(NULL, &(deft_compile_options){.no_cheap_recompute = 1}, "f32", &cheap, &kept)) return;
    const size_t gelu = (size_t)B * T * 4 * C * 4, perm = (size_t)B * T * C * 4;
    CHECK_MSG(cheap.ck.dropped == 2 && cheap.ck.dropped_bytes == gelu + perm && cheap.ck.recomputed == 2,
              "f32: %d dropped (%zu bytes), %d recomputed; want the GELU's %zu and the permute's %zu bytes",
              cheap.ck.dropped, cheap.ck.dropped_bytes, cheap.ck.recomputed, gelu, perm);
    CHECK_MSG(cheap.ck.policy == DEFT_CHECKPOINT_NONE && cheap.ck.recompute_bytes > 0, "f32: policy %d",
              cheap.ck.policy);
    CHECK_MSG(cheap.activation_bytes + gelu + perm == kept.activation_bytes,
              "f32: activation bytes %zu recomputing, %zu keeping", cheap.activation_bytes, kept.activation_bytes);
    CHECK_MSG(cheap.ck.peak_bytes < cheap.ck.peak_bytes_without, "f32: peak %zu, %zu without", cheap.ck.peak_bytes,
              cheap.ck.peak_bytes_without);
    CHECK_MSG(strstr(cheap.plan, "2 made again by one pass") != NULL, "f32: the plan does not say so: %.400s",
              cheap.plan);
    CHECK_MSG(kept.ck.dropped == 0 && kept.ck.recomputed == 0, "no_cheap_recompute: %d dropped", kept.ck.dropped);
    free(cheap.grads);
    free(kept.grads);
}

/* A ReLU's gradient reads its output, so its input is not kept for it: its output is no second copy. */
static void test_relu(void) {
    block a;
    if (!build(&a, 1)) {
        CHECK_MSG(0, "build: %s", deft_errmsg());
        return;
    }
    outcome o;
    run(&a, NULL, &o);
    CHECK_MSG(o.ck.dropped == 1 && o.ck.dropped_bytes == (size_t)B * T * C * 4,
              "relu: %d dropped (%zu bytes); want the permute alone", o.ck.dropped, o.ck.dropped_bytes);
    free(o.grads);
    deft_graph_free(a.g);
}

static void test_bf16(void) {
    outcome cheap, kept;
    if (!pair(&(deft_compile_options){.autocast = DEFT_BF16},
              &(deft_compile_options){.autocast = DEFT_BF16, .no_cheap_recompute = 1}, "bf16", &cheap, &kept))
        return;
    CHECK_MSG(cheap.ck.dropped > kept.ck.dropped && cheap.activation_bytes < kept.activation_bytes,
              "bf16: %d dropped against %d, activations %zu against %zu", cheap.ck.dropped, kept.ck.dropped,
              cheap.activation_bytes, kept.activation_bytes);
    for (int w = 1; w <= 3; w++) {
        char name[16];
        snprintf(name, sizeof name, "w%d.bf16", w);
        CHECK_MSG(!dropped_named(&cheap, name), "bf16: the parameter cast %s was dropped", name);
    }
    free(cheap.grads);
    free(kept.grads);
}

/* Under a budget between the smallest and the plan's peak: within it, and the same bits. */
static void test_budget(void) {
    block r, a;
    if (!build(&r, 0) || !build(&a, 0)) {
        CHECK_MSG(0, "build: %s", deft_errmsg());
        return;
    }
    outcome ref, got;
    run(&r, NULL, &ref);
    const deft_compile_options tiny = {.checkpoint = DEFT_CHECKPOINT_BUDGET, .memory_budget = 1};
    deft_tensor *outs[4] = {a.loss, a.grads[0], a.grads[1], a.grads[2]};
    CHECK(deft_compile(a.g, outs, 4, &tiny) == NULL);
    const char *m = strstr(deft_errmsg(), "fits is ");
    CHECK_MSG(m != NULL, "no smallest budget in \"%s\"", deft_errmsg());
    const size_t smallest = m ? (size_t)strtoull(m + 8, NULL, 10) : 0;
    const size_t budget = smallest + (ref.ck.peak_bytes - smallest) / 2;
    run(&a, &(deft_compile_options){.checkpoint = DEFT_CHECKPOINT_BUDGET, .memory_budget = budget}, &got);
    same(&got, &ref, "budget");
    CHECK_MSG(got.ck.peak_bytes <= budget && got.ck.dropped >= 2, "budget %zu: peak %zu, %d dropped", budget,
              got.ck.peak_bytes, got.ck.dropped);
    free(ref.grads);
    free(got.grads);
    deft_graph_free(r.g);
    deft_graph_free(a.g);
}

/* A pre-norm block: h = x W0; y = layer_norm(h, g, b) W1; loss = mean(y * y). The layer norm's gradient keeps h. With
 * norm_input the layer norm reads the input x itself, a leaf: this rule makes again only values computed from the
 * batch, from a value the backward pass keeps. */
static int build_norm(block *b, int norm_input) {
    b->g = deft_graph_new();
    deft_graph_set_seed(b->g, 9);
    const deft_device cpu = deft_cpu();
    b->x = deft_input(b->g, "x", DEFT_F32, 2, (int64_t[]){B * T, C}, cpu);
    b->w1 = deft_param(b->g, "w0", DEFT_F32, 2, (int64_t[]){C, C}, cpu, DEFT_INIT_UNIFORM);
    b->w2 = deft_param(b->g, "w1", DEFT_F32, 2, (int64_t[]){C, 2 * C}, cpu, DEFT_INIT_UNIFORM);
    b->w3 = deft_param(b->g, "gain", DEFT_F32, 1, (int64_t[]){C}, cpu, DEFT_INIT_UNIFORM);
    deft_tensor *bias = deft_param(b->g, "bias", DEFT_F32, 1, (int64_t[]){C}, cpu, DEFT_INIT_UNIFORM);
    deft_tensor *h = deft_matmul(b->x, b->w1);
    deft_tensor *n = deft_layer_norm(norm_input ? b->x : h, b->w3, bias, 1e-5);
    deft_tensor *y = deft_matmul(norm_input ? deft_add(n, h) : n, b->w2);
    b->loss = deft_mean(deft_mul(y, y), 0, NULL, 0);
    if (!b->loss || deft_backward(b->loss) != DEFT_OK) return 0;
    b->grads[0] = deft_grad(b->w1), b->grads[1] = deft_grad(b->w2), b->grads[2] = deft_grad(b->w3);
    return b->grads[0] && b->grads[1] && b->grads[2];
}

/* want_bytes: the activation bytes the layer norm's value and row statistics (two floats a row) held. */
static void norm_pair(const deft_compile_options *with, const deft_compile_options *without, const char *what,
                      size_t want_bytes) {
    block a, b;
    if (!build_norm(&a, 0) || !build_norm(&b, 0)) {
        CHECK_MSG(0, "build: %s", deft_errmsg());
        return;
    }
    outcome cheap, kept;
    run(&a, with, &cheap);
    run(&b, without, &kept);
    same(&cheap, &kept, what);
    CHECK_MSG(cheap.ck.dropped == kept.ck.dropped + 1 && cheap.ck.recomputed == kept.ck.recomputed + 1,
              "%s: %d dropped, %d recomputed (%d and %d keeping); want the layer norm more", what, cheap.ck.dropped,
              cheap.ck.recomputed, kept.ck.dropped, kept.ck.recomputed);
    CHECK_MSG(cheap.activation_bytes + want_bytes == kept.activation_bytes,
              "%s: activation bytes %zu recomputing, %zu keeping; want %zu fewer", what, cheap.activation_bytes,
              kept.activation_bytes, want_bytes);
    free(cheap.grads);
    free(kept.grads);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

static void test_layer_norm(void) {
    const size_t stats = (size_t)B * T * 2 * 4;
    norm_pair(NULL, &(deft_compile_options){.no_cheap_recompute = 1}, "layer norm f32", (size_t)B * T * C * 4 + stats);
    /* Under autocast the layer norm writes its value in bf16 for the product (ir/autocast_layer_norm.c). */
    norm_pair(&(deft_compile_options){.autocast = DEFT_BF16},
              &(deft_compile_options){.autocast = DEFT_BF16, .no_cheap_recompute = 1}, "layer norm bf16",
              (size_t)B * T * C * 2 + stats);
    block c;
    if (!build_norm(&c, 1)) {
        CHECK_MSG(0, "build: %s", deft_errmsg());
        return;
    }
    outcome o;
    run(&c, NULL, &o);
    CHECK_MSG(o.ck.dropped == 0, "the layer norm of an input: %d dropped: %.600s", o.ck.dropped, o.plan);
    free(o.grads);
    deft_graph_free(c.g);
}

int main(void) {
    test_f32();
    test_relu();
    test_bf16();
    test_budget();
    test_layer_norm();
    return deft_check_finish();
}
