/* The checkpoint rewrite's mechanics: which forward values the backward pass reads (the candidates for dropping),
 * and the copies that recompute dropped values and read them (passes/checkpoint.h explains the design). */
#include <stdlib.h>
#include <string.h>

#include "autocast.h"
#include "checkpoint.h"
#include "node.h"

static int deft_base_id(const deft_tensor *t) {
    while (t->is_view) t = t->src[0];
    return t->id;
}

static void deft_ckpt_mark_needed(const deft_ckpt_graph *a, deft_tensor *const *outputs, int n_outputs) {
    for (int i = 0; i < n_outputs; i++) a->needed[outputs[i]->id] = a->is_output[outputs[i]->id] = true;
    for (int id = a->n - 1; id >= 0; id--) {
        if (!a->needed[id]) continue;
        const deft_tensor *t = a->g->nodes[id];
        for (int k = 0; k < t->nsrc; k++) a->needed[t->src[k]->id] = true;
    }
}

/* The forward pass: every node a gradient was computed for (deft_backward gives each node on the loss's path one),
 * the counterparts of those nodes in the autocast rewrites (whose backward passes are derived again without giving
 * gradients to nodes), and what all these nodes read. */
static void deft_ckpt_mark_forward(const deft_ckpt_graph *a) {
    for (const deft_autocast *ac = a->g->autocasts; ac; ac = ac->next)
        for (int id = 0; id < ac->n_user && id < a->n; id++) {
            const deft_tensor *m = ac->map[id];
            if (m && a->g->nodes[id]->grad && m->id < a->n) a->forward[m->id] = true;
        }
    for (int id = a->n - 1; id >= 0; id--) {
        const deft_tensor *t = a->g->nodes[id];
        if (t->grad) a->forward[id] = true;
        if (!a->forward[id]) continue;
        for (int k = 0; k < t->nsrc; k++) a->forward[t->src[k]->id] = true;
    }
}

/* A value the backward pass reads may be dropped unless it is an output, a leaf, or read after an optimizer step
 * (which changes the parameters a recomputation would read). */
static void deft_ckpt_mark_candidates(deft_ckpt_graph *a) {
    int first_opt = a->n;
    for (int id = 0; id < a->n; id++)
        if (a->needed[id] && a->g->nodes[id]->op == DEFT_OP_OPTIMIZER && id < first_opt) first_opt = id;
    bool *after_opt = calloc((size_t)(a->n > 0 ? a->n : 1), sizeof *after_opt);
    for (int id = 0; id < a->n; id++) {
        const deft_tensor *t = a->g->nodes[id];
        if (!a->needed[id] || a->forward[id] || deft_op_is_leaf(t->op)) continue;
        for (int k = 0; k < t->nsrc; k++) {
            int b = deft_base_id(t->src[k]);
            if (!a->forward[b]) continue;
            a->read_late[b] = true;
            if (after_opt && id > first_opt) after_opt[b] = true;
        }
    }
    a->n_cands = 0;
    for (int id = 0; id < a->n; id++) {
        const deft_tensor *t = a->g->nodes[id];
        a->candidate[id] = a->read_late[id] && !a->is_output[id] && !deft_op_is_leaf(t->op) && !t->is_view &&
                           !deft_op_updates_state(t->op) && !(after_opt ? after_opt[id] : true);
        if (a->candidate[id]) a->cands[a->n_cands++] = id;
    }
    free(after_opt);
}

deft_status deft_ckpt_analyse(deft_graph *g, deft_tensor *const *outputs, int n_outputs, deft_ckpt_graph *a) {
    memset(a, 0, sizeof *a);
    a->g = g;
    a->n = g->n_nodes;
    size_t n = (size_t)(a->n ? a->n : 1);
    a->needed = calloc(n, sizeof *a->needed);
    a->is_output = calloc(n, sizeof *a->is_output);
    a->forward = calloc(n, sizeof *a->forward);
    a->read_late = calloc(n, sizeof *a->read_late);
    a->candidate = calloc(n, sizeof *a->candidate);
    a->cands = malloc(n * sizeof *a->cands);
    if (!a->needed || !a->is_output || !a->forward || !a->read_late || !a->candidate || !a->cands) {
        deft_ckpt_graph_free(a);
        return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for checkpointing");
    }
    deft_ckpt_mark_needed(a, outputs, n_outputs);
    deft_ckpt_mark_forward(a);
    deft_ckpt_mark_candidates(a);
    return DEFT_OK;
}

void deft_ckpt_graph_free(deft_ckpt_graph *a) {
    free(a->needed);
    free(a->is_output);
    free(a->forward);
    free(a->read_late);
    free(a->candidate);
    free(a->cands);
    memset(a, 0, sizeof *a);
}

void deft_ckpt_truncate(deft_graph *g, int n) {
    while (g->n_nodes > n) deft_node_destroy(g->nodes[--g->n_nodes]);
}

/* ---- applying a drop set ---- */

typedef struct deft_ckpt_apply_state {
    const deft_ckpt_graph *a;
    const bool *drop;
    const struct deft_program *owner;
    deft_tensor **late;      /* per original forward node: what holds its value in the backward pass */
    deft_ckpt_applied *out;
    int *stack, *cursor;     /* the depth-first walk that makes recompute nodes, sources first */
} deft_ckpt_apply_state;

static deft_tensor *deft_ckpt_copy(const deft_ckpt_apply_state *st, const deft_tensor *t, deft_tensor **srcs,
                                   deft_ckpt_role role) {
    deft_tensor *c = deft_node_new(t->graph, t->op, t->dtype, t->device, t->ndim, t->shape, t->nsrc, srcs);
    if (!c) return NULL;
    c->p = t->p;
    c->is_view = t->is_view;
    c->view_offset = t->view_offset;
    c->ckpt_role = (unsigned char)role;
    c->ckpt_origin = (deft_tensor *)t;
    c->ckpt_owner = st->owner;
    if (role == DEFT_CKPT_RECOMPUTE) snprintf(c->name, sizeof c->name, "%.48s (recompute)", t->name);
    else snprintf(c->name, sizeof c->name, "%s", t->name);
    return c;
}

/* A forward value stays where it is for the backward pass when it is a leaf, an output, saved and not dropped, or
 * made by an op that updates state (running it again would update twice). */
static bool deft_ckpt_kept(const deft_ckpt_apply_state *st, const deft_tensor *t) {
    const deft_ckpt_graph *a = st->a;
    return deft_op_is_leaf(t->op) || a->is_output[t->id] || (a->read_late[t->id] && !st->drop[t->id]) ||
           deft_op_updates_state(t->op);
}

/* Makes the recompute node of forward node t once its sources' late values exist (all of them: *late set). */
static deft_status deft_ckpt_recompute_one(deft_ckpt_apply_state *st, deft_tensor *t) {
    deft_tensor *small[4], **srcs = t->nsrc <= 4 ? small : malloc((size_t)t->nsrc * sizeof *srcs);
    if (!srcs) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for checkpointing");
    bool same = true;
    for (int k = 0; k < t->nsrc; k++) {
        srcs[k] = st->late[t->src[k]->id];
        same &= srcs[k] == t->src[k];
    }
    deft_tensor *c = t;
    if (!same || !t->is_view) c = deft_ckpt_copy(st, t, srcs, DEFT_CKPT_RECOMPUTE);
    if (srcs != small) free(srcs);
    if (!c) return t->graph->first_error;
    if (c != t && !c->is_view) {
        double f, b;
        deft_op_cost(c, &f, &b);
        st->out->flops += f;
        st->out->bytes += b;
        st->out->n_recompute++;
    }
    st->late[t->id] = c;
    return DEFT_OK;
}

/* The node that holds forward value t in the backward pass, making recompute nodes as needed, sources first. */
static deft_status deft_ckpt_late(deft_ckpt_apply_state *st, deft_tensor *t, deft_tensor **out) {
    if (!st->late[t->id] && deft_ckpt_kept(st, t)) st->late[t->id] = t;
    int depth = 0;
    if (!st->late[t->id]) {
        st->stack[0] = t->id;
        st->cursor[0] = 0;
        depth = 1;
    }
    while (depth > 0) {
        deft_tensor *u = st->a->g->nodes[st->stack[depth - 1]];
        if (st->cursor[depth - 1] == u->nsrc) {
            deft_status s = deft_ckpt_recompute_one(st, u);
            if (s != DEFT_OK) return s;
            depth--;
            continue;
        }
        deft_tensor *src = u->src[st->cursor[depth - 1]++];
        if (st->late[src->id]) continue;
        if (deft_ckpt_kept(st, src)) {
            st->late[src->id] = src;
            continue;
        }
        st->stack[depth] = src->id;
        st->cursor[depth++] = 0;
    }
    *out = st->late[t->id];
    return DEFT_OK;
}

/* Copies backward node t when one of its sources now lives elsewhere. */
static deft_status deft_ckpt_backward_one(deft_ckpt_apply_state *st, deft_tensor *t) {
    const deft_ckpt_graph *a = st->a;
    deft_tensor *small[4], **srcs = t->nsrc <= 4 ? small : malloc((size_t)t->nsrc * sizeof *srcs);
    if (!srcs) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for checkpointing");
    bool same = true;
    deft_status s = DEFT_OK;
    for (int k = 0; k < t->nsrc && s == DEFT_OK; k++) {
        deft_tensor *src = t->src[k];
        if (a->forward[src->id]) s = deft_ckpt_late(st, src, &srcs[k]);
        else srcs[k] = st->out->redirect[src->id] >= 0 ? a->g->nodes[st->out->redirect[src->id]] : src;
        if (s == DEFT_OK) same &= srcs[k] == src;
    }
    if (s == DEFT_OK && !same) {
        deft_tensor *c = deft_ckpt_copy(st, t, srcs, DEFT_CKPT_BACKWARD_COPY);
        if (c) st->out->redirect[t->id] = c->id;
        else s = a->g->first_error;
    }
    if (srcs != small) free(srcs);
    return s;
}

deft_status deft_ckpt_apply(const deft_ckpt_graph *a, const bool *drop, const struct deft_program *owner,
                            deft_ckpt_applied *out) {
    size_t n = (size_t)(a->n ? a->n : 1);
    deft_ckpt_apply_state st = {a, drop, owner, calloc(n, sizeof(deft_tensor *)), out, malloc(n * sizeof(int)),
                                malloc(n * sizeof(int))};
    out->n_recompute = 0;
    out->flops = out->bytes = 0.0;
    for (int id = 0; id < a->n; id++) out->redirect[id] = -1;
    deft_status s = DEFT_OK;
    if (!st.late || !st.stack || !st.cursor) s = deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for checkpointing");
    for (int id = 0; s == DEFT_OK && id < a->n; id++) {
        deft_tensor *t = a->g->nodes[id];
        if (a->needed[id] && !a->forward[id] && !deft_op_is_leaf(t->op)) s = deft_ckpt_backward_one(&st, t);
    }
    free(st.late);
    free(st.stack);
    free(st.cursor);
    return s;
}
