/* Which steps run on a GPU's side lane (passes/side_lane.h says why and how they are ordered). */
#include <stdlib.h>

#include "cuda_kernels.h"
#include "cuda_tuning.h"
#include "program_state.h"
#include "side_lane.h"

/* The side steps a side step's inputs outlive: the side lane runs about one step behind the main stream. */
#define DEFT_SIDE_KEEP 2

/* Every step on the same GPU: the programs one stream orders today. */
static bool deft_side_one_gpu(const deft_program *p) {
    if (p->n_steps == 0) return false;
    const deft_device d0 = deft_step_device(p->graph->nodes[p->steps[0]]);
    for (int i = 0; i < p->n_steps; i++) {
        const deft_device d = deft_step_device(p->graph->nodes[p->steps[i]]);
        if (d.type != DEFT_CUDA || d.index != d0.index) return false;
    }
    return true;
}

/* A program that splits its optimizer (pieces per bucket) or counts its bytes tightly keeps one stream. */
static bool deft_side_wanted(const deft_program *p) {
    return !p->split && p->config.side_lane && deft_side_one_gpu(p);
}

/* The members of step i (its group's, or its own node). */
static int deft_side_members(const deft_program *p, int i, const int **ids) {
    const int root = p->steps[i];
    const int gi = p->nodes[root].group;
    if (gi < 0) {
        *ids = &p->steps[i];
        return 1;
    }
    *ids = p->groups[gi].members;
    return p->groups[gi].n_members;
}

/* Whether step i may leave the main stream: it writes no output, updates no state, is no copy and no optimizer. */
static bool deft_side_kind_ok(const deft_program *p, int i) {
    const int *ids;
    const int n = deft_side_members(p, i, &ids);
    for (int m = 0; m < n; m++) {
        const deft_tensor *t = p->graph->nodes[ids[m]];
        if (p->nodes[ids[m]].is_output || deft_op_updates_state(t->op) || t->op == DEFT_OP_COPY) return false;
    }
    return true;
}

/* The products worth a stream of their own, as measured (bench/RESULTS.md, "Eighth round"): convolutions' weight
 * gradients and TF32 products gained beside other work; f32 products on the FMA units and bf16 ones lost, so they
 * stay on the main stream. Products below DEFT_SIDE_MIN_FLOPS (cuda_tuning.h) gain nothing beside another one and
 * would only add an edge to the graph. */
static bool deft_side_heavy(const deft_program *p, int i) {
    const int gi = p->nodes[p->steps[i]].group;
    if (gi >= 0 && p->groups[gi].kind == DEFT_GROUP_MATMUL_BATCH) return false;   /* it runs last: beside nothing */
    const int *ids;
    const int n = deft_side_members(p, i, &ids);
    const bool tf32 = (p->cuda_flags & DEFT_CUDA_ALLOW_TF32) != 0;
    for (int m = 0; m < n; m++) {
        const deft_tensor *t = p->graph->nodes[ids[m]];
        const bool wanted = t->op == DEFT_OP_CONV2D_WEIGHT_GRAD || (t->op == DEFT_OP_MATMUL && tf32 && t->dtype == DEFT_F32);
        if (!wanted) continue;
        double flops, bytes;
        deft_op_cost(t, &flops, &bytes);
        if (flops >= DEFT_SIDE_MIN_FLOPS) return true;
    }
    return false;
}

/* Calls f(p, i, base, ctx) for each node whose storage (a view's base) step i's members read. */
static void deft_side_each_input(deft_program *p, int i, void (*f)(deft_program *, int, int, void *), void *ctx) {
    const int *ids;
    const int n = deft_side_members(p, i, &ids);
    for (int m = 0; m < n; m++) {
        const deft_tensor *t = p->graph->nodes[ids[m]];
        for (int k = 0; k < t->nsrc; k++) f(p, i, deft_view_base(p->graph, t->src[k]->id, NULL), ctx);
    }
}

/* The step computing node base for step i, -1 for a leaf or a member of i's own group. */
static int deft_side_producer(const deft_program *p, int i, int base) {
    const int s = p->nodes[base].step;
    return s == i ? -1 : s;
}

/* Step r, reading step s: s stays terminal only if r is the optimizer or a light terminal step (a cast, a sum). */
static void deft_side_note_reader(deft_program *p, int r, int base, void *ctx) {
    bool **t = ctx;   /* t[0]: terminal, t[1]: blocked */
    const int s = deft_side_producer(p, r, base);
    const bool carries = p->graph->nodes[p->steps[r]]->op == DEFT_OP_OPTIMIZER || (t[0][r] && !deft_side_heavy(p, r));
    if (s >= 0 && !carries) t[1][s] = true;
}

static void deft_side_note_side_source(deft_program *p, int i, int base, void *ctx) {
    const int s = deft_side_producer(p, i, base);
    if (s >= 0 && p->nodes[p->steps[s]].side) *(bool *)ctx = true;
}

/* A step is terminal when what it computes reaches nothing but the optimizer, through light steps at most: a
 * weight gradient, its cast, a bias gradient. The input gradients also end at the optimizer, but through the
 * products of the layers below: they are the backward pass's critical path and stay on the main stream. The side
 * steps are the heavy terminal ones and the terminal steps that read them. */
deft_status deft_side_mark(deft_program *p, int *count) {
    *count = 0;
    for (int i = 0; i < p->n_steps; i++) p->nodes[p->steps[i]].side = false;
    const int n_steps = p->n_steps;
    if (n_steps <= 0 || !deft_side_wanted(p)) return DEFT_OK;
    bool *terminal = calloc((size_t)n_steps, sizeof *terminal);
    bool *blocked = calloc((size_t)n_steps, sizeof *blocked);
    deft_status s = terminal && blocked ? DEFT_OK : deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    /* Readers come after what they read: going backwards, a step's readers are all decided when it is reached. */
    bool *t[2] = {terminal, blocked};
    for (int i = n_steps - 1; s == DEFT_OK && i >= 0; i--) {
        terminal[i] = !blocked[i] && p->graph->nodes[p->steps[i]]->op != DEFT_OP_OPTIMIZER && deft_side_kind_ok(p, i);
        deft_side_each_input(p, i, deft_side_note_reader, t);
    }
    for (int i = 0; s == DEFT_OK && i < n_steps; i++) {
        bool reads_side = false;
        if (terminal[i]) deft_side_each_input(p, i, deft_side_note_side_source, &reads_side);
        p->nodes[p->steps[i]].side = terminal[i] && (reads_side || deft_side_heavy(p, i));
        *count += p->nodes[p->steps[i]].side;
    }
    free(terminal);
    free(blocked);
    return s;
}

/* Per step index i: the last step through which side step i's inputs stay alive; -1 for a main step. */
static void deft_side_extents(const deft_program *p, int *until) {
    int later[DEFT_SIDE_KEEP];   /* the next DEFT_SIDE_KEEP side steps after the one being looked at */
    for (int k = 0; k < DEFT_SIDE_KEEP; k++) later[k] = p->n_steps;
    for (int i = p->n_steps - 1; i >= 0; i--) {
        if (!p->nodes[p->steps[i]].side) {
            until[i] = -1;
            continue;
        }
        until[i] = later[DEFT_SIDE_KEEP - 1];
        for (int k = DEFT_SIDE_KEEP - 1; k > 0; k--) later[k] = later[k - 1];
        later[0] = i;
    }
}

/* An input of a side step (its buffer) lives at least through step *ctx. */
static void deft_side_keep(deft_program *p, int i, int base, void *ctx) {
    (void)i;
    const int until = *(const int *)ctx, b = p->nodes[base].buffer;
    if (b >= 0 && p->buffers[b].plan.last < until) p->buffers[b].plan.last = until;
}

deft_status deft_side_keep_inputs(deft_program *p) {
    const int n_steps = p->n_steps;
    if (n_steps <= 0) return DEFT_OK;
    bool any = false;
    for (int i = 0; i < n_steps && !any; i++) any = p->nodes[p->steps[i]].side;
    if (!any) return DEFT_OK;
    int *until = malloc((size_t)n_steps * sizeof *until);
    if (!until) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory planning");
    deft_side_extents(p, until);
    for (int i = 0; i < n_steps; i++)
        if (until[i] >= 0) deft_side_each_input(p, i, deft_side_keep, &until[i]);
    free(until);
    return DEFT_OK;
}
