/* The compile pipeline (pipeline.h): its stages, in order, and the measure checkpointing's search takes through
 * them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "checkpoint.h"
#include "gpu_support.h"
#include "optimizer.h"
#include "optimizer_place.h"
#include "optimizer_split.h"
#include "pipeline.h"
#include "schedule.h"
#include "side_lane.h"

/* One compile's way through the stages. */
typedef struct deft_pipeline {
    deft_program *p;
    deft_tensor *const *user;      /* the outputs asked for */
    deft_tensor *const *outputs;   /* what the program computes: user, or autocast's counterparts of it */
    deft_tensor **mapped;          /* autocast's counterparts (owned); NULL without autocast */
    int n_outputs;
    const int *ckpt_redirect;      /* checkpointing's: per original node, the copy computing it or -1; NULL: none */
    const deft_program *owner;     /* the program the rewrites' nodes belong to; NULL in a trial */
} deft_pipeline;

typedef struct deft_stage {
    const char *name;
    deft_status (*run)(deft_pipeline *pl);
} deft_stage;

/* ---------------------------------------------------------------- the graph rewrites */
static deft_status deft_stage_autocast(deft_pipeline *pl) {
    deft_program *p = pl->p;
    deft_status s = deft_autocast_outputs(p->graph, &p->config, pl->user, pl->n_outputs, &pl->mapped);
    if (pl->mapped) pl->outputs = pl->mapped;
    p->n_nodes = p->graph->n_nodes;
    return s;
}

static deft_status deft_trial_measure(void *ctx, const int *redirect, int full, size_t *total, double *area);
static deft_status deft_trial_measure_as(const deft_pipeline *pl, const deft_config *c, const int *redirect, int full,
                                         size_t *total, double *area);

/* The checkpoint rewrite appends the program's copies to the graph; the program then covers them. It runs whatever
 * the policy, for autocast's casts of inputs and the cheap recomputations (checkpoint.h). */
static deft_status deft_stage_checkpoint(deft_pipeline *pl) {
    deft_program *p = pl->p;
    const deft_config *c = &p->config;
    if (c->checkpoint == DEFT_CHECKPOINT_NONE && c->autocast == DEFT_F32 && !c->cheap_recompute) return DEFT_OK;
    deft_status s =
        deft_checkpoint_rewrite(p->graph, pl->outputs, pl->n_outputs, c, p, deft_trial_measure, pl, &p->ckpt);
    if (s == DEFT_OK) p->n_nodes = p->graph->n_nodes;
    if (p->ckpt) pl->ckpt_redirect = p->ckpt->redirect;
    return s;
}

/* Optimizer in backward, when asked for, or data parallel's pieces per bucket. */
static deft_status deft_stage_optimizer_split(deft_pipeline *pl) {
    deft_program *p = pl->p;
    const deft_config *c = &p->config;
    deft_status s = DEFT_OK;
    if (c->optimizer_in_backward || c->split_per_bucket)
        s = deft_optimizer_split(p->graph, pl->outputs, pl->n_outputs, pl->ckpt_redirect, c, pl->owner, &p->split);
    if (s == DEFT_OK) p->n_nodes = p->graph->n_nodes;
    return s;
}

/* ---------------------------------------------------------------- the schedule and its plan */
/* An original node that a copy computes reads its value there (an output asked for by the user's tensor). */
static void deft_link_copies(deft_program *p) {
    for (int id = 0; p->ckpt && id < p->ckpt->n_orig; id++)
        if (p->ckpt->redirect[id] >= 0) p->nodes[id].redirect = p->ckpt->redirect[id];
    for (int id = 0; p->split && id < p->split->n_after; id++)
        if (p->split->redirect[id] >= 0) p->nodes[id].redirect = p->split->redirect[id];
}

/* What the outputs need (read through the rewrites' copies), the steps in id order, and their plan. */
static deft_status deft_stage_schedule(deft_pipeline *pl) {
    deft_program *p = pl->p;
    p->cuda_flags = p->config.cuda_flags;
    deft_status s =
        deft_schedule_prepare(p, pl->outputs, pl->n_outputs, p->split ? p->split->redirect : pl->ckpt_redirect);
    if (s == DEFT_OK) s = deft_check_gpu_support(p);
    if (s == DEFT_OK && pl->user != pl->outputs) s = deft_autocast_alias(p, pl->user, pl->n_outputs);
    if (s != DEFT_OK) return s;
    deft_link_copies(p);
    p->persistent_bytes = deft_persistent_bytes(p);
    for (int id = 0; id < p->n_nodes; id++) p->nodes[id].group = -1;
    return deft_plan_pass(p);
}

/* Whether reordering gives the smaller final plan. Fusion and the side lane run over the order chosen and may keep
 * values alive longer in one order than in the other (a weight gradient's product on the side lane holds its inputs),
 * so the compile itself plans two trials to the end, with and without the reorder, and takes the smaller. */
static deft_status deft_reorder_pays(const deft_pipeline *pl, bool *pays) {
    deft_config plain = pl->p->config;
    plain.reorder = 0;
    size_t with = 0, without = 0;
    double area = 0.0;
    deft_status s = deft_trial_measure_as(pl, &pl->p->config, pl->ckpt_redirect, 1, &with, &area);
    if (s == DEFT_OK) s = deft_trial_measure_as(pl, &plain, pl->ckpt_redirect, 1, &without, &area);
    *pays = s == DEFT_OK && with < without;
    return s;
}

/* With `reorder`, a second plan over the reordered steps replaces the first only when its arenas are smaller; the
 * compile (not a trial, which stops at that) first asks whether that still holds once every stage has run. */
static deft_status deft_stage_reorder(deft_pipeline *pl) {
    deft_program *p = pl->p;
    if (!p->config.reorder || p->config.no_reuse) return DEFT_OK;
    if (pl->owner) {
        bool pays = false;
        deft_status s = deft_reorder_pays(pl, &pays);
        if (s != DEFT_OK || !pays) return s;
    }
    size_t in_order = deft_arena_total(p);
    int *kept = malloc((size_t)(p->n_steps ? p->n_steps : 1) * sizeof *kept);
    if (!kept) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    memcpy(kept, p->steps, (size_t)p->n_steps * sizeof *kept);
    deft_status s = deft_program_reorder(p);
    if (s == DEFT_OK) s = deft_plan_pass(p);
    if (s == DEFT_OK && deft_arena_total(p) >= in_order) {
        memcpy(p->steps, kept, (size_t)p->n_steps * sizeof *kept);
        s = deft_plan_pass(p);
    }
    free(kept);
    return s;
}

/* Fusion over the order chosen; the fused steps planned again. */
static deft_status deft_stage_fusion(deft_pipeline *pl) {
    deft_program *p = pl->p;
    if (!p->config.fusion) return DEFT_OK;
    const int before = p->n_steps;
    deft_status s = deft_program_fuse(p);
    if (s == DEFT_OK && p->n_steps != before) s = deft_plan_pass(p);
    return s;
}

/* Optimizer in backward: the pieces of split steps move up to their gradients, last of all (the fused groups run
 * where they will); the plan is made again when they moved. */
static deft_status deft_stage_optimizer_place(deft_pipeline *pl) {
    deft_program *p = pl->p;
    bool moved = false;
    deft_status s = p->split ? deft_program_place_parts(p, &moved) : DEFT_OK;
    if (s == DEFT_OK && moved) s = deft_plan_pass(p);
    return s;
}

/* The side lane is chosen over the final order and groups; its inputs' longer lives need a plan of their own. */
static deft_status deft_stage_side_lane(deft_pipeline *pl) {
    int side = 0;
    deft_status s = deft_side_mark(pl->p, &side);
    if (s == DEFT_OK && side > 0) s = deft_plan_pass(pl->p);
    return s;
}

/* The persistent bytes by kind, for messages: parameters, optimizer state, inputs (constants with them). */
static void deft_persistent_parts(const deft_program *p, size_t *params, size_t *state, size_t *inputs) {
    *params = *state = *inputs = 0;
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed) continue;
        if (t->op == DEFT_OP_PARAM) *params = deft_size_add_sat(*params, deft_tensor_bytes(t));
        else if (deft_op_is_leaf(t->op)) *inputs = deft_size_add_sat(*inputs, deft_tensor_bytes(t));
        else if (t->op == DEFT_OP_OPTIMIZER)
            *state = deft_size_add_sat(*state, deft_optimizer_state_bytes(t->p.optimizer));
    }
}

/* Whether checkpointing could meet the budget, asked only where the rewrites left the graph as a plain compile
 * sees it: no checkpoint plan (autocast's recasts) and no optimizer split of this program's own. *smallest: the
 * smallest total the search reached, or 0 when not asked. */
static void deft_budget_probe(deft_pipeline *pl, size_t *smallest) {
    const deft_program *p = pl->p;
    *smallest = 0;
    if (p->config.checkpoint != DEFT_CHECKPOINT_NONE || p->ckpt || p->split) return;
    char kept[1024];
    snprintf(kept, sizeof kept, "%s", deft_errmsg());   /* a failed trial must not leave its own message */
    deft_status s = deft_checkpoint_probe(p->graph, pl->outputs, pl->n_outputs, p->config.memory_budget,
                                          deft_trial_measure, pl, smallest);
    if (s != DEFT_OK) *smallest = 0;
    deft_set_error(DEFT_OK, "%s", kept);
}

/* Over the budget: the program's needs, then what checkpointing would change. */
static deft_status deft_over_budget(const deft_program *p, size_t arena, size_t smallest) {
    const size_t budget = p->config.memory_budget, persistent = p->persistent_bytes;
    char need[256], parts[256];
    size_t params, state, inputs;
    deft_persistent_parts(p, &params, &state, &inputs);
    snprintf(need, sizeof need, "the memory budget of %zu bytes is smaller than the %zu bytes this program needs "
             "(arena %zu + persistent %zu)", budget, deft_size_add_sat(arena, persistent), arena, persistent);
    snprintf(parts, sizeof parts, "persistent %zu bytes (parameters %zu, optimizer state %zu, inputs %zu)",
             persistent, params, state, inputs);
    if (persistent > budget)
        return deft_set_error(DEFT_ERR_OOM, "compile: the memory budget of %zu bytes is smaller than the persistent "
                              "state (%zu bytes: parameters %zu, optimizer state %zu, inputs %zu), which no "
                              "checkpointing can shrink", budget, persistent, params, state, inputs);
    if (smallest && smallest <= budget)
        return deft_set_error(DEFT_ERR_OOM, "compile: %s; it fits with checkpointing: compile with .checkpoint = "
                              "DEFT_CHECKPOINT_BUDGET", need);
    if (smallest)
        return deft_set_error(DEFT_ERR_OOM, "compile: %s, and it does not fit with checkpointing either: the "
                              "smallest peak is %zu bytes: %s + arena %zu bytes (activations)", need, smallest,
                              parts, smallest > persistent ? smallest - persistent : 0);
    return deft_set_error(DEFT_ERR_OOM, "compile: %s: %s + arena %zu bytes (activations)", need, parts, arena);
}

static deft_status deft_stage_budget(deft_pipeline *pl) {
    const deft_program *p = pl->p;
    const size_t budget = p->config.memory_budget, arena = deft_arena_total(p);
    if (budget == 0 || deft_size_add_sat(arena, p->persistent_bytes) <= budget) return DEFT_OK;
    size_t smallest = 0;
    if (p->persistent_bytes <= budget) deft_budget_probe(pl, &smallest);
    return deft_over_budget(p, arena, smallest);
}

enum { DEFT_STAGE_OPTIMIZER_SPLIT = 2, DEFT_STAGE_SCHEDULE = 3, DEFT_STAGE_SIDE_LANE = 7 };

static const deft_stage deft_stages[] = {
    {"autocast", deft_stage_autocast},
    {"checkpoint", deft_stage_checkpoint},
    [DEFT_STAGE_OPTIMIZER_SPLIT] = {"optimizer_split", deft_stage_optimizer_split},
    [DEFT_STAGE_SCHEDULE] = {"schedule", deft_stage_schedule},
    {"reorder", deft_stage_reorder},
    {"fusion", deft_stage_fusion},
    {"optimizer_place", deft_stage_optimizer_place},
    [DEFT_STAGE_SIDE_LANE] = {"side_lane", deft_stage_side_lane},
    {"budget", deft_stage_budget},
};
#define DEFT_STAGE_COUNT ((int)(sizeof deft_stages / sizeof deft_stages[0]))

static deft_status deft_pipeline_stages(deft_pipeline *pl, int first, int last) {
    deft_status s = DEFT_OK;
    for (int i = first; s == DEFT_OK && i <= last; i++) s = deft_stages[i].run(pl);
    return s;
}

/* ---------------------------------------------------------------- checkpointing's measure */
/* A plan of the graph as it stands, in a program of its own: every stage from the optimizer's split to the side
 * lane (full), or the split and the lower bound of the schedule in id order, which is cheaper. */
static deft_status deft_trial_run(deft_pipeline *tp, int full) {
    if (full) return deft_pipeline_stages(tp, DEFT_STAGE_OPTIMIZER_SPLIT, DEFT_STAGE_SIDE_LANE);
    deft_program *t = tp->p;
    deft_status s = deft_stage_optimizer_split(tp);
    if (s != DEFT_OK) return s;
    t->cuda_flags = t->config.cuda_flags;
    s = deft_schedule_prepare(t, tp->outputs, tp->n_outputs, t->split ? t->split->redirect : tp->ckpt_redirect);
    if (s == DEFT_OK) s = deft_bound_pass(t);
    if (t->nodes) t->persistent_bytes = deft_persistent_bytes(t);
    return s;
}

static deft_status deft_trial_measure(void *ctx, const int *redirect, int full, size_t *total, double *area) {
    const deft_pipeline *pl = ctx;
    return deft_trial_measure_as(pl, &pl->p->config, redirect, full, total, area);
}

/* A trial compiled with options c (the program's, or a variant of them). */
static deft_status deft_trial_measure_as(const deft_pipeline *pl, const deft_config *c, const int *redirect, int full,
                                         size_t *total, double *area) {
    deft_graph *g = pl->p->graph;
    deft_program t = {.graph = g, .n_nodes = g->n_nodes, .config = *c};
    deft_pipeline tp = {&t, pl->outputs, pl->outputs, NULL, pl->n_outputs, redirect, NULL};
    deft_status s = deft_trial_run(&tp, full);
    *total = t.persistent_bytes;   /* saturating: a trial too large to count loses to every other */
    for (int a = 0; a < t.n_arenas; a++)
        *total = deft_size_add_sat(*total, full ? t.arenas[a].bytes : t.arenas[a].lower_bound);
    *area = 0.0;
    for (int b = 0; s == DEFT_OK && b < t.n_buffers; b++)
        if (t.buffers[b].merged_into < 0)
            *area += (double)t.buffers[b].plan.size * (double)(t.buffers[b].plan.last - t.buffers[b].plan.first + 1);
    deft_program_groups_free(&t);
    free(t.nodes);
    free(t.steps);
    free(t.outputs);
    free(t.buffers);
    deft_opt_split_free(g, t.split);
    return s;
}

/* ---------------------------------------------------------------- running it */
int deft_pipeline_stage_count(void) { return DEFT_STAGE_COUNT; }

const char *deft_pipeline_stage_name(int i) { return i >= 0 && i < DEFT_STAGE_COUNT ? deft_stages[i].name : NULL; }

int deft_pipeline_stage_find(const char *name) {
    for (int i = 0; name && i < DEFT_STAGE_COUNT; i++)
        if (strcmp(name, deft_stages[i].name) == 0) return i;
    return -1;
}

int deft_compile_stage_count(void) { return DEFT_STAGE_COUNT; }

const char *deft_compile_stage_name(int i) { return deft_pipeline_stage_name(i); }

/* A program stopped before its schedule still answers every report: nothing is needed yet. */
static deft_status deft_pipeline_stop(deft_program *p, int last) {
    p->stopped_after = deft_stages[last].name;
    if (p->nodes) return DEFT_OK;
    p->nodes = calloc((size_t)(p->n_nodes ? p->n_nodes : 1), sizeof *p->nodes);
    if (!p->nodes) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    for (int id = 0; id < p->n_nodes; id++)
        p->nodes[id].step = p->nodes[id].buffer = p->nodes[id].arena = p->nodes[id].group = -1;
    return DEFT_OK;
}

deft_status deft_pipeline_run(deft_program *p, deft_tensor *const *outputs, int n_outputs) {
    deft_pipeline pl = {p, outputs, outputs, NULL, n_outputs, NULL, p};
    const int last = p->config.last_stage;
    deft_status s = deft_pipeline_stages(&pl, 0, last);
    if (s == DEFT_OK && last < DEFT_STAGE_COUNT - 1) s = deft_pipeline_stop(p, last);
    free(pl.mapped);
    return s;
}
