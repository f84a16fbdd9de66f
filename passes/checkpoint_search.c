/* Choosing what to drop, and the rewrite's entry point.
 *
 * Under a memory budget the choice is greedy on measured plans, not on a model of them: from nothing dropped, each
 * round tries dropping each remaining candidate (the DEFT_CKPT_TRIALS cheapest per byte), measures the lower bound of
 * the resulting plan, and keeps the one that lowers it most per unit of added recompute time; the planner's real
 * arena decides when the budget is met. A last pass keeps again, the latest in the forward pass first, every dropped
 * value the budget does not need dropped. Recompute time is a roofline estimate of the copies' FLOPs and bytes
 * (ir/op_cost.c).
 * Because dropped values are recomputed together just before their first backward reader, dropping a run of layers
 * recomputes that run once and holds it while the backward pass crosses it: the search finds checkpoint_sequential's
 * segments by itself where they pay, and keeps cheap recomputations (an activation from its kept input) first. */
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "checkpoint.h"

#define DEFT_CKPT_TRIALS 48

typedef struct deft_ckpt_search {
    const deft_ckpt_graph *a;
    const struct deft_program *owner;
    deft_ckpt_measure measure;
    void *ctx;
    int *redirect;
    bool *drop;
    const bool *recast;      /* dropped whatever the policy (deft_ckpt_always) */
} deft_ckpt_search;

/* Seconds, on a device that does 50 TFLOP/s and moves 2 TB/s (the ratio matters, not the scale). */
static double deft_ckpt_seconds(double flops, double bytes) {
    double f = flops / 50e12, b = bytes / 2e12;
    return f > b ? f : b;
}

/* Applies the current drop set, measures, and takes the copies out again. */
static deft_status deft_ckpt_trial(deft_ckpt_search *s, int full, size_t *total, double *seconds, double *area) {
    deft_ckpt_applied ap = {.redirect = s->redirect};
    deft_status st = deft_ckpt_apply(s->a, s->drop, s->owner, &ap);
    double held = 0.0;
    if (st == DEFT_OK) st = s->measure(s->ctx, s->redirect, full, total, &held);
    if (area) *area = held;
    deft_ckpt_truncate(s->a->g, s->a->n);
    if (seconds) *seconds = deft_ckpt_seconds(ap.flops, ap.bytes);
    return st;
}

typedef struct deft_ckpt_rank {
    double key;
    int id;
} deft_ckpt_rank;

static int deft_by_key(const void *pa, const void *pb) {
    const deft_ckpt_rank *a = pa, *b = pb;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->id - b->id;
}

/* The candidates not yet dropped, cheapest recompute per byte first (their own op only: a first sort). */
static int deft_ckpt_shortlist(const deft_ckpt_search *s, deft_ckpt_rank *r) {
    int n = 0;
    for (int i = 0; i < s->a->n_cands; i++) {
        int id = s->a->cands[i];
        if (s->drop[id]) continue;
        const deft_tensor *t = s->a->g->nodes[id];
        double f, b;
        deft_op_cost(t, &f, &b);
        r[n++] = (deft_ckpt_rank){deft_ckpt_seconds(f, b) / (double)(deft_node_buffer_bytes(t) + 1), id};
    }
    qsort(r, (size_t)n, sizeof *r, deft_by_key);
    return n < DEFT_CKPT_TRIALS ? n : DEFT_CKPT_TRIALS;
}

typedef struct deft_ckpt_choice {
    int id, lowers;
    double score, area;
} deft_ckpt_choice;

/* Lowering the bound beats not lowering it; then the lower score; then, for scores equal to rounding, the smaller
 * area: of two drops that free the same bytes at the same cost, the one whose recomputed values live shortest,
 * which spreads the kept values evenly instead of growing one long run to recompute. */
static bool deft_ckpt_better(const deft_ckpt_choice *a, const deft_ckpt_choice *b) {
    if (b->id < 0) return true;
    if (a->lowers != b->lowers) return a->lowers > b->lowers;
    double tol = 1e-9 * (a->score > b->score ? a->score : b->score);
    if (a->score < b->score - tol) return true;
    if (a->score > b->score + tol) return false;
    return a->area < b->area;
}

/* One round: the candidate whose drop lowers the bound most per added second (or, when none lowers it, the one
 * leaving the lowest bound). Returns -1 when none is left. */
static deft_status deft_ckpt_pick(deft_ckpt_search *s, deft_ckpt_rank *r, size_t bound, double secs, int *pick) {
    int n = deft_ckpt_shortlist(s, r);
    deft_ckpt_choice best = {-1, 0, 0.0, 0.0};
    for (int i = 0; i < n; i++) {
        size_t b;
        double t, area;
        s->drop[r[i].id] = true;
        deft_status st = deft_ckpt_trial(s, 0, &b, &t, &area);
        s->drop[r[i].id] = false;
        if (st != DEFT_OK) return st;
        double added = t - secs > 0 ? t - secs : 0.0;
        deft_ckpt_choice c = {r[i].id, b < bound, 0.0, area};
        c.score = c.lowers ? (added + 1e-12) / (double)(bound - b) : (double)b;
        if (deft_ckpt_better(&c, &best)) best = c;
    }
    *pick = best.id;
    return DEFT_OK;
}

/* Keeps again what the budget does not need dropped, the latest in the forward pass first. */
static deft_status deft_ckpt_prune(deft_ckpt_search *s, size_t budget) {
    for (int i = s->a->n_cands - 1; i >= 0; i--) {
        int id = s->a->cands[i];
        if (!s->drop[id] || s->recast[id]) continue;
        s->drop[id] = false;
        size_t total;
        deft_status st = deft_ckpt_trial(s, 1, &total, NULL, NULL);
        if (st != DEFT_OK) return st;
        if (total > budget) s->drop[id] = true;
    }
    return DEFT_OK;
}

static deft_status deft_ckpt_over_budget(size_t budget, size_t smallest) {
    return deft_set_error(DEFT_ERR_OOM,
                          "compile: the memory budget of %zu bytes cannot be met, even recomputing activations "
                          "(checkpointing): the smallest budget this program fits is %zu bytes",
                          budget, smallest);
}

/* The greedy rounds: drops until the plan fits budget or nothing is left to drop. *smallest: the smallest total
 * seen (without when none was smaller); *total: the last one. */
static deft_status deft_ckpt_greedy(deft_ckpt_search *s, size_t budget, size_t without, size_t *smallest,
                                    size_t *total) {
    deft_ckpt_rank *r = malloc((size_t)(s->a->n_cands ? s->a->n_cands : 1) * sizeof *r);
    if (!r) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for checkpointing");
    size_t bound;
    double secs = 0.0;
    *smallest = *total = without;
    deft_status st = deft_ckpt_trial(s, 0, &bound, NULL, NULL);
    while (st == DEFT_OK && *total > budget) {
        int pick;
        st = deft_ckpt_pick(s, r, bound, secs, &pick);
        if (st != DEFT_OK || pick < 0) break;
        s->drop[pick] = true;
        st = deft_ckpt_trial(s, 0, &bound, &secs, NULL);
        if (st == DEFT_OK) st = deft_ckpt_trial(s, 1, total, NULL, NULL);
        if (st == DEFT_OK && *total < *smallest) *smallest = *total;
    }
    free(r);
    return st;
}

static deft_status deft_ckpt_search_budget(deft_ckpt_search *s, size_t budget, size_t without) {
    if (without <= budget) return DEFT_OK;
    size_t smallest, total;
    deft_status st = deft_ckpt_greedy(s, budget, without, &smallest, &total);
    if (st == DEFT_OK && total > budget) st = deft_ckpt_over_budget(budget, smallest);
    if (st == DEFT_OK) st = deft_ckpt_prune(s, budget);
    return st;
}

/* The budget search starts from the input casts dropped, measured. */
static deft_status deft_ckpt_search_from_recast(deft_ckpt_search *s, size_t budget, size_t without, int n_recast) {
    size_t from = without;
    deft_status st = n_recast > 0 ? deft_ckpt_trial(s, 1, &from, NULL, NULL) : DEFT_OK;
    return st == DEFT_OK ? deft_ckpt_search_budget(s, budget, from) : st;
}

/* drop starts as recast; the policy adds to it. */
static deft_status deft_ckpt_choose(deft_ckpt_search *s, const deft_config *cfg, size_t without,
                                    int n_recast) {
    memcpy(s->drop, s->recast, (size_t)s->a->n * sizeof *s->drop);
    switch (cfg->checkpoint) {
    case DEFT_CHECKPOINT_NONE: return DEFT_OK;
    case DEFT_CHECKPOINT_BUDGET:
        if (cfg->memory_budget == 0)
            return deft_set_error(DEFT_ERR_INVALID,
                                  "compile: checkpointing by budget (DEFT_CHECKPOINT_BUDGET) needs a memory_budget");
        return deft_ckpt_search_from_recast(s, cfg->memory_budget, without, n_recast);
    case DEFT_CHECKPOINT_MARKED: deft_ckpt_drop_marked(s->a, s->drop); return DEFT_OK;
    case DEFT_CHECKPOINT_SEGMENTS:
        if (cfg->checkpoint_segments < 0)
            return deft_set_error(DEFT_ERR_INVALID, "compile: checkpoint_segments is %d; it must be 0 or more",
                                  cfg->checkpoint_segments);
        deft_ckpt_drop_segments(s->a, cfg->checkpoint_segments, s->drop);
        return DEFT_OK;
    default:
        return deft_set_error(DEFT_ERR_INVALID, "compile: unknown checkpoint policy %d", cfg->checkpoint);
    }
}

static deft_status deft_ckpt_finish(deft_ckpt_search *s, deft_ckpt_plan *plan) {
    deft_ckpt_applied ap = {.redirect = plan->redirect};
    deft_status st = deft_ckpt_apply(s->a, s->drop, s->owner, &ap);
    if (st != DEFT_OK) {
        deft_ckpt_truncate(s->a->g, s->a->n);
        return st;
    }
    plan->n_total = s->a->g->n_nodes;
    plan->n_recompute = ap.n_recompute;
    plan->recompute_flops = ap.flops;
    plan->recompute_bytes = ap.bytes;
    for (int i = 0; i < s->a->n_cands; i++) {
        int id = s->a->cands[i];
        plan->dropped[id] = s->drop[id];
        plan->n_dropped += s->drop[id];
        plan->n_recast += s->recast[id];
        if (s->drop[id])
            plan->dropped_bytes = deft_size_add_sat(plan->dropped_bytes, deft_node_buffer_bytes(s->a->g->nodes[id]));
    }
    return DEFT_OK;
}

/* Autocast's casts of inputs, unless the graph asks to keep them (tests compare against that). */
static int deft_ckpt_recast(const deft_ckpt_graph *a, const deft_config *cfg, bool *recast) {
    if (cfg->autocast == DEFT_F32 || a->g->keep_input_casts) return 0;
    return deft_ckpt_input_casts(a, recast);
}

/* What every policy drops: the input casts, then (unless no_cheap_recompute) the cheap recomputations, in recast[]. */
static int deft_ckpt_always(const deft_ckpt_graph *a, const deft_config *cfg, bool *recast, int *n_cheap) {
    const int n = deft_ckpt_recast(a, cfg, recast);
    *n_cheap = cfg->cheap_recompute ? deft_ckpt_cheap_recomputes(a, recast) : 0;
    return n + *n_cheap;
}

deft_status deft_checkpoint_rewrite(deft_graph *g, deft_tensor *const *outputs, int n_outputs, const deft_config *cfg,
                                    const struct deft_program *owner, deft_ckpt_measure measure, void *ctx,
                                    deft_ckpt_plan **out) {
    *out = NULL;
    deft_ckpt_graph a;
    deft_status st = deft_ckpt_analyse(g, outputs, n_outputs, &a);
    if (st != DEFT_OK) return st;
    size_t n = (size_t)(a.n ? a.n : 1);
    deft_ckpt_plan *plan = calloc(1, sizeof *plan);
    bool *drop = calloc(n, sizeof *drop), *recast = calloc(n, sizeof *recast);
    if (plan) {
        plan->redirect = malloc(n * sizeof *plan->redirect);
        plan->dropped = calloc(n, sizeof *plan->dropped);
    }
    if (!plan || !drop || !recast || !plan->redirect || !plan->dropped)
        st = deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    deft_ckpt_search s = {&a, owner, measure, ctx, plan ? plan->redirect : NULL, drop, recast};
    int n_cheap = 0;
    const int n_recast = st == DEFT_OK ? deft_ckpt_always(&a, cfg, recast, &n_cheap) : 0;
    const bool nothing = st == DEFT_OK && cfg->checkpoint == DEFT_CHECKPOINT_NONE && n_recast == 0;
    if (st == DEFT_OK && !nothing) {
        plan->policy = cfg->checkpoint;
        plan->n_orig = a.n;
        st = deft_ckpt_trial(&s, 1, &plan->total_without, NULL, NULL);
        if (st == DEFT_OK) st = deft_ckpt_choose(&s, cfg, plan->total_without, n_recast);
        if (st == DEFT_OK) st = deft_ckpt_finish(&s, plan);
        if (st == DEFT_OK) plan->n_recast -= n_cheap, plan->n_cheap = n_cheap;
    }
    free(drop);
    free(recast);
    deft_ckpt_graph_free(&a);
    if (st != DEFT_OK || nothing) {
        deft_ckpt_plan_free(g, plan);
        return st;
    }
    *out = plan;
    return DEFT_OK;
}

void deft_ckpt_plan_free(deft_graph *g, deft_ckpt_plan *plan) {
    if (!plan) return;
    if (g && plan->n_total > plan->n_orig && g->n_nodes == plan->n_total) deft_ckpt_truncate(g, plan->n_orig);
    free(plan->redirect);
    free(plan->dropped);
    free(plan);
}

/* The budget search's greedy rounds alone (no pruning: whether it fits is all that is asked), their copies taken
 * out again: the graph is left as it was. */
deft_status deft_checkpoint_probe(deft_graph *g, deft_tensor *const *outputs, int n_outputs, size_t budget,
                                  deft_ckpt_measure measure, void *ctx, size_t *smallest) {
    deft_ckpt_graph a;
    deft_status st = deft_ckpt_analyse(g, outputs, n_outputs, &a);
    if (st != DEFT_OK) return st;
    size_t n = (size_t)(a.n ? a.n : 1), without = 0, total;
    int *redirect = malloc(n * sizeof *redirect);
    bool *drop = calloc(n, sizeof *drop), *recast = calloc(n, sizeof *recast);
    if (!redirect || !drop || !recast) st = deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    deft_ckpt_search s = {&a, NULL, measure, ctx, redirect, drop, recast};
    if (st == DEFT_OK) st = deft_ckpt_trial(&s, 1, &without, NULL, NULL);
    if (st == DEFT_OK) st = deft_ckpt_greedy(&s, budget, without, smallest, &total);
    free(redirect);
    free(drop);
    free(recast);
    deft_ckpt_graph_free(&a);
    return st;
}
