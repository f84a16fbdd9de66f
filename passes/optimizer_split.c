/* Optimizer in backward: the step of an optimizer split into pieces that update the parameters as their gradients
 * become ready, and a finisher (passes/optimizer_split.h explains the design). */
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "grad_buckets.h"
#include "node.h"
#include "optimizer.h"
#include "optimizer_split.h"

typedef struct deft_split_ctx {
    deft_graph *g;
    int n;                  /* the graph's nodes before the rewrite */
    const struct deft_program *owner;
    bool *needed;           /* what the outputs need */
    int *param_of;          /* per node: its index among the parameters of the step being split, or -1 */
    int *ready;             /* per parameter: the last node before the step that gives its gradient or reads it */
    int *seen, stamp;       /* visits of deft_split_reaches */
    int *stack;
    int *made;              /* per step node: the finisher that stands for it, or -1 */
    int *late_at, *late;    /* per parameter of the step being split: its late nodes (deft_split_ready) */
    bool per_bucket;        /* data parallel: one piece per gradient bucket, all after the backward pass */
    const deft_config *config;
    int *bucket_of;         /* per bucket: per node made (from n on), its bucket (a piece) or -1 */
    int n_made;
} deft_split_ctx;

static int deft_split_base(const deft_tensor *t) {
    while (t->is_view) t = t->src[0];
    return t->id;
}

static int deft_split_target(const int *redirect, const deft_tensor *t) {
    return redirect && redirect[t->id] >= 0 ? redirect[t->id] : t->id;
}

static void deft_split_mark_needed(deft_split_ctx *c, deft_tensor *const *outputs, int n_outputs, const int *redirect) {
    for (int i = 0; i < n_outputs; i++) c->needed[deft_split_target(redirect, outputs[i])] = true;
    for (int id = c->n - 1; id >= 0; id--) {
        if (!c->needed[id]) continue;
        const deft_tensor *t = c->g->nodes[id];
        for (int k = 0; k < t->nsrc; k++) c->needed[t->src[k]->id] = true;
    }
}

/* Whether node `to` depends on node `from` (ids are a topological order, so the walk stops below `from`). */
static bool deft_split_reaches(deft_split_ctx *c, int from, int to) {
    if (from == to) return true;
    if (to < from) return false;
    c->stamp++;
    int top = 0;
    c->stack[top++] = to;
    c->seen[to] = c->stamp;
    while (top > 0) {
        const deft_tensor *t = c->g->nodes[c->stack[--top]];
        for (int k = 0; k < t->nsrc; k++) {
            const int s = t->src[k]->id;
            if (s == from) return true;
            if (s < from || c->seen[s] == c->stamp) continue;
            c->seen[s] = c->stamp;
            c->stack[top++] = s;
        }
    }
    return false;
}

/* A step splits only when each update needs its own gradient alone, and the program reads no parameter of the
 * optimizer after the step and nothing from the step but its value. Per bucket (data parallel) the split is not
 * asked for but chosen: a step that cannot split stays whole, quietly. */
static deft_status deft_split_check(const deft_split_ctx *c, const deft_tensor *step) {
    const deft_optimizer *opt = step->p.optimizer;
    const bool quiet = c->per_bucket;
    if (opt->accumulate_steps > 1 || opt->max_grad_norm > 0.0)
        return quiet ? DEFT_ERR_INVALID : deft_set_error(DEFT_ERR_INVALID,
                              "compile: optimizer_in_backward needs each update to depend on its own gradient only, "
                              "but %s %s (accumulate_steps %d, max_grad_norm %g)", step->name,
                              opt->accumulate_steps > 1 ? "accumulates micro-batches" : "clips by the global norm",
                              opt->accumulate_steps, opt->max_grad_norm);
    for (int id = 0; id < c->n; id++) {
        const deft_tensor *t = c->g->nodes[id];
        if (!c->needed[id] || t == step) continue;
        for (int k = 0; k < t->nsrc; k++) {
            if (t->src[k] == step)
                return quiet ? DEFT_ERR_INVALID : deft_set_error(DEFT_ERR_INVALID, "compile: optimizer_in_backward: %s reads the value of the "
                                      "step %s, which is only known once every piece has run", t->name, step->name);
            const int p = c->param_of[deft_split_base(t->src[k])];
            if (id > step->id && p >= 0)
                return quiet ? DEFT_ERR_INVALID : deft_set_error(DEFT_ERR_INVALID, "compile: optimizer_in_backward: %s reads the parameter %s "
                                      "after the step %s", t->name, opt->params[p]->name, step->name);
        }
    }
    return DEFT_OK;
}

/* Per parameter: ready[i], the last node before the step that gives its gradient or reads it (through views too),
 * and its late nodes late[late_at[i] .. late_at[i + 1]): the gradient's node and the readers that it does not depend
 * on (the backward steps reading the parameter, recomputations; not the forward pass, which every gradient follows). */
static deft_status deft_split_ready(deft_split_ctx *c, const deft_tensor *step) {
    const deft_optimizer *opt = step->p.optimizer;
    int *count = calloc((size_t)opt->n_params + 1, sizeof *count);
    if (!count) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for optimizer_in_backward");
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < opt->n_params; i++) {
            const int g = deft_split_base(step->src[i]);
            if (pass == 1) c->late[c->late_at[i]] = g;
            count[i] = 1;
            c->ready[i] = g;
        }
        for (int id = 0; id < step->id; id++) {
            const deft_tensor *t = c->g->nodes[id];
            if (!c->needed[id] || deft_op_is_leaf(t->op)) continue;
            for (int k = 0; k < t->nsrc; k++) {
                const int p = c->param_of[deft_split_base(t->src[k])];
                if (p < 0) continue;
                if (c->ready[p] < id) c->ready[p] = id;
                if (deft_split_reaches(c, id, deft_split_base(step->src[p]))) continue;
                if (pass == 1) c->late[c->late_at[p] + count[p]] = id;
                count[p]++;   /* a node reading the parameter twice is listed twice: harmless */
            }
        }
        if (pass == 1) break;
        c->late_at[0] = 0;
        for (int i = 0; i < opt->n_params; i++) c->late_at[i + 1] = c->late_at[i] + count[i];
        free(c->late);
        c->late = malloc((size_t)(c->late_at[opt->n_params] ? c->late_at[opt->n_params] : 1) * sizeof *c->late);
        if (!c->late) {
            free(count);
            return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for optimizer_in_backward");
        }
    }
    free(count);
    return DEFT_OK;
}

/* Parameter j may join the group [first, j) when no late node of a member and one of j depend on each other: then
 * neither parameter's last use must come before the other's (a layer's weight and bias), so updating them together
 * delays neither. A bias whose gradient follows the next layer's weight's backward read is ready only after that
 * weight's, and starts a group of its own. */
static bool deft_split_together(deft_split_ctx *c, int first, int j) {
    for (int m = first; m < j; m++)
        for (int a = c->late_at[m]; a < c->late_at[m + 1]; a++)
            for (int b = c->late_at[j]; b < c->late_at[j + 1]; b++) {
                const int x = c->late[a], y = c->late[b];
                if (x != y && (x < y ? deft_split_reaches(c, x, y) : deft_split_reaches(c, y, x))) return false;
            }
    return true;
}

static void deft_split_own(deft_tensor *t, const deft_tensor *step, const struct deft_program *owner) {
    t->ckpt_role = DEFT_CKPT_OPTIMIZER_PART;
    t->ckpt_owner = owner;
    t->ckpt_origin = (deft_tensor *)step;
}

static deft_tensor *deft_split_piece_node(deft_split_ctx *c, deft_tensor *step, int first, int n) {
    deft_optimizer *piece = deft_optimizer_piece(step->p.optimizer, first, n);
    if (!piece) return NULL;
    const int64_t shape[1] = {piece->part->n_blocks};
    deft_tensor *t = deft_node_new(c->g, DEFT_OP_OPTIMIZER, DEFT_F64, step->device, 1, shape, n, step->src + first);
    if (!t) return NULL;
    t->p.optimizer = piece;
    if (n == 1) snprintf(t->name, sizeof t->name, "%.24s[%.36s]", step->name, piece->params[0]->name);
    else snprintf(t->name, sizeof t->name, "%.20s[%.26s +%d]", step->name, piece->params[0]->name, n - 1);
    deft_split_own(t, step, c->owner);
    return t;
}

typedef struct deft_split_group {
    int first, n, ready;    /* per bucket, ready is the bucket */
} deft_split_group;

static int deft_split_by_ready(const void *a, const void *b) {
    const deft_split_group *x = a, *y = b;
    return x->ready != y->ready ? (x->ready < y->ready ? -1 : 1) : (x->first < y->first ? -1 : x->first > y->first);
}

/* The groups of consecutive parameters that become ready together, in flat order. */
static int deft_split_groups(deft_split_ctx *c, const deft_optimizer *opt, deft_split_group *groups) {
    int n = 0;
    for (int i = 0; i < opt->n_params; i++) {
        if (n > 0 && deft_split_together(c, groups[n - 1].first, i)) {
            groups[n - 1].n++;
            if (c->ready[i] > groups[n - 1].ready) groups[n - 1].ready = c->ready[i];
            continue;
        }
        groups[n++] = (deft_split_group){i, 1, c->ready[i]};
    }
    return n;
}

static int deft_split_int_cmp(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* Per bucket (passes/grad_buckets.h): each bucket's parameters in runs consecutive in the flat storage (a piece
 * updates such a run; a model's buckets are one run each when its parameters were made in the order the forward pass
 * reads them). */
static deft_status deft_split_bucket_groups(const deft_split_ctx *c, const deft_tensor *step, deft_split_group *groups,
                                            int *n_groups) {
    deft_grad_buckets b;
    deft_status s = deft_grad_buckets_cut(step, c->config, &b);
    if (s != DEFT_OK) return s;
    *n_groups = 0;
    for (int k = 0; k < b.n_buckets; k++) {
        int *members = b.order + b.first[k];
        const int n = b.first[k + 1] - b.first[k];
        qsort(members, (size_t)n, sizeof *members, deft_split_int_cmp);
        for (int j = 0; j < n; j++) {
            deft_split_group *last = *n_groups ? &groups[*n_groups - 1] : NULL;
            if (j > 0 && members[j] == last->first + last->n) last->n++;
            else groups[(*n_groups)++] = (deft_split_group){members[j], 1, k};
        }
    }
    deft_grad_buckets_free(&b);
    return DEFT_OK;
}

/* The groups of the step's pieces (in any order; ready says when each may run). */
static deft_status deft_split_plan(deft_split_ctx *c, deft_tensor *step, deft_split_group *groups, int *n_groups) {
    if (c->per_bucket) return deft_split_bucket_groups(c, step, groups, n_groups);
    c->late_at = malloc(((size_t)step->p.optimizer->n_params + 1) * sizeof *c->late_at);
    if (!c->late_at) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    deft_status s = deft_split_ready(c, step);
    if (s == DEFT_OK) *n_groups = deft_split_groups(c, step->p.optimizer, groups);
    return s;
}

/* Per bucket, the bucket of each piece made, for the replica's collectives (dist/dist_program.c). */
static void deft_split_note(deft_split_ctx *c, const deft_tensor *t, int bucket) {
    if (!c->bucket_of) return;
    while (c->n_made <= t->id - c->n) c->bucket_of[c->n_made++] = -1;
    c->bucket_of[t->id - c->n] = bucket;
}

/* The pieces, made in the order they become ready (a good order before the schedule places them; per bucket, the
 * buckets' order, which is the order they run in), then the finisher reading them in flat order. A step that may
 * not split is an error, or per bucket stays whole. */
static deft_status deft_split_step(deft_split_ctx *c, deft_tensor *step, deft_opt_split *out) {
    deft_optimizer *opt = step->p.optimizer;
    for (int i = 0; i < opt->n_params; i++) c->param_of[opt->params[i]->id] = i;
    deft_status s = deft_split_check(c, step);
    if (s != DEFT_OK && c->per_bucket) {
        for (int i = 0; i < opt->n_params; i++) c->param_of[opt->params[i]->id] = -1;
        return DEFT_OK;
    }
    deft_split_group *groups = malloc((size_t)opt->n_params * sizeof *groups);
    deft_tensor **pieces = malloc((size_t)opt->n_params * sizeof *pieces);
    int *firsts = malloc((size_t)opt->n_params * sizeof *firsts);
    if (s == DEFT_OK && (!groups || !pieces || !firsts))
        s = deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for optimizer_in_backward");
    int n_groups = 0;
    if (s == DEFT_OK) s = deft_split_plan(c, step, groups, &n_groups);
    if (s == DEFT_OK) {
        for (int k = 0; k < n_groups; k++) firsts[k] = groups[k].first;
        qsort(firsts, (size_t)n_groups, sizeof *firsts, deft_split_int_cmp);
        qsort(groups, (size_t)n_groups, sizeof *groups, deft_split_by_ready);
    }
    for (int k = 0; s == DEFT_OK && k < n_groups; k++) {
        deft_tensor *t = deft_split_piece_node(c, step, groups[k].first, groups[k].n);
        if (!t) s = c->g->first_error != DEFT_OK ? c->g->first_error : DEFT_ERR_OOM;
        else pieces[t->p.optimizer->part->first_param] = t;
        if (t) deft_split_note(c, t, groups[k].ready);
    }
    for (int k = 0; s == DEFT_OK && k < n_groups; k++) pieces[k] = pieces[firsts[k]];
    deft_optimizer *fin = s == DEFT_OK ? deft_optimizer_finisher(opt, firsts, n_groups) : NULL;
    deft_tensor *f = fin ? deft_node_new(c->g, DEFT_OP_OPTIMIZER, DEFT_F32, step->device, 0, NULL, n_groups, pieces)
                         : NULL;
    if (s == DEFT_OK && !f) s = c->g->first_error != DEFT_OK ? c->g->first_error : DEFT_ERR_OOM;
    if (s == DEFT_OK) {
        f->p.optimizer = fin;
        deft_split_note(c, f, -1);
        snprintf(f->name, sizeof f->name, "%.48s.finish", step->name);
        deft_split_own(f, step, c->owner);
        c->made[step->id] = f->id;
        out->n_steps++;
        out->n_pieces += n_groups;
    }
    for (int i = 0; i < opt->n_params; i++) c->param_of[opt->params[i]->id] = -1;
    free(c->late_at);
    free(c->late);
    c->late_at = c->late = NULL;
    free(groups);
    free(pieces);
    free(firsts);
    return s;
}

/* The optimizer steps among the outputs, each once. */
static int deft_split_count_steps(const deft_split_ctx *c, deft_tensor *const *outputs, int n_outputs,
                                  const int *redirect) {
    int n = 0;
    for (int i = 0; i < n_outputs; i++) {
        const int id = deft_split_target(redirect, outputs[i]);
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= deft_split_target(redirect, outputs[j]) == id;
        n += !seen && c->g->nodes[id]->op == DEFT_OP_OPTIMIZER;
    }
    return n;
}

/* Per bucket, one step at most: two steps may read one gradient, which one bucket must hold (their pieces would
 * then wait on each other's buckets); with several, every step stays whole. */
static deft_status deft_split_outputs(deft_split_ctx *c, deft_tensor *const *outputs, int n_outputs,
                                      const int *redirect, deft_opt_split *out) {
    const bool scaled = c->config->loss_scaled;
    if (c->per_bucket && (scaled || deft_split_count_steps(c, outputs, n_outputs, redirect) != 1)) return DEFT_OK;
    for (int i = 0; i < n_outputs; i++) {
        deft_tensor *step = c->g->nodes[deft_split_target(redirect, outputs[i])];
        if (step->op != DEFT_OP_OPTIMIZER || step->p.optimizer->part || c->made[step->id] >= 0) continue;
        if (c->per_bucket) {
            c->bucket_of = malloc(((size_t)step->p.optimizer->n_params + 1) * sizeof *c->bucket_of);
            if (!c->bucket_of) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
        }
        if (scaled)
            return deft_set_error(DEFT_ERR_INVALID, "compile: optimizer_in_backward cannot run with f16 loss scaling: "
                                  "the step must see every gradient before it may skip an update (set "
                                  "loss_scale.disable, or use bf16)");
        deft_status s = deft_split_step(c, step, out);
        if (s != DEFT_OK) return s;
    }
    return DEFT_OK;
}

static deft_status deft_split_redirect(deft_split_ctx *c, deft_tensor *const *outputs, int n_outputs,
                                       const int *redirect, deft_opt_split *out) {
    out->n_after = c->g->n_nodes;
    out->per_bucket = c->per_bucket;
    out->bucket_of = c->bucket_of;
    c->bucket_of = NULL;
    out->redirect = malloc((size_t)out->n_after * sizeof *out->redirect);
    if (!out->redirect) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for optimizer_in_backward");
    for (int id = 0; id < out->n_after; id++) out->redirect[id] = -1;
    for (int i = 0; i < n_outputs; i++) {
        const int id = outputs[i]->id, target = deft_split_target(redirect, outputs[i]);
        out->redirect[id] = c->made[target] >= 0 ? c->made[target] : target != id ? target : -1;
    }
    return DEFT_OK;
}

deft_status deft_optimizer_split(deft_graph *g, deft_tensor *const *outputs, int n_outputs, const int *redirect,
                                 const deft_config *config, const struct deft_program *owner,
                                 deft_opt_split **out) {
    *out = NULL;
    const size_t n = (size_t)(g->n_nodes ? g->n_nodes : 1);
    deft_split_ctx c = {g, g->n_nodes, owner, calloc(n, sizeof(bool)), malloc(n * sizeof(int)), malloc(n * sizeof(int)),
                        calloc(n, sizeof(int)), 0, malloc(n * sizeof(int)), malloc(n * sizeof(int)), NULL, NULL,
                        config->split_per_bucket, config, NULL, 0};
    deft_opt_split *sp = calloc(1, sizeof *sp);
    deft_status s = DEFT_OK;
    if (!sp || !c.needed || !c.param_of || !c.ready || !c.seen || !c.stack || !c.made)
        s = deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for optimizer_in_backward");
    for (int id = 0; s == DEFT_OK && id < c.n; id++) c.param_of[id] = c.made[id] = -1;
    if (s == DEFT_OK) {
        sp->n_before = g->n_nodes;
        deft_split_mark_needed(&c, outputs, n_outputs, redirect);
        s = deft_split_outputs(&c, outputs, n_outputs, redirect, sp);
    }
    if (s == DEFT_OK && sp->n_steps > 0) s = deft_split_redirect(&c, outputs, n_outputs, redirect, sp);
    if (s != DEFT_OK && sp) deft_ckpt_truncate(g, sp->n_before);
    if (s != DEFT_OK || sp->n_steps == 0) {
        if (sp) free(sp->redirect);
        if (sp) free(sp->bucket_of);
        free(sp);
        sp = NULL;
    }
    free(c.needed);
    free(c.param_of);
    free(c.ready);
    free(c.seen);
    free(c.stack);
    free(c.made);
    free(c.bucket_of);
    *out = sp;
    return s;
}

void deft_opt_split_free(deft_graph *g, deft_opt_split *s) {
    if (!s) return;
    if (g && g->n_nodes == s->n_after) deft_ckpt_truncate(g, s->n_before);
    free(s->redirect);
    free(s->bucket_of);
    free(s);
}
