/* Optimizer in backward: placing the pieces of a split step (passes/optimizer_place.h). */
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "optimizer_place.h"
#include "optimizer_split.h"
#include "program_state.h"

static bool deft_is_piece(const deft_tensor *t) {
    return t->op == DEFT_OP_OPTIMIZER && t->p.optimizer->part && !t->p.optimizer->part->finisher;
}

/* Per node: the last step that reads it directly or through a view, or -1. */
static void deft_last_reads(const deft_program *p, int *last) {
    for (int id = 0; id < p->n_nodes; id++) last[id] = -1;
    for (int id = 0; id < p->n_nodes; id++) {
        const int step = p->nodes[id].step;
        if (!p->nodes[id].needed || step < 0) continue;
        const deft_tensor *t = p->graph->nodes[id];
        for (int k = 0; k < t->nsrc; k++) {
            const int b = deft_view_base(p->graph, t->src[k]->id, NULL);
            if (last[b] < step) last[b] = step;
        }
    }
}

/* The step after which piece t may run: its gradients are computed and every other reader of its parameters ran. */
static int deft_piece_anchor(const deft_program *p, const deft_tensor *t, const int *last) {
    int anchor = -1;
    for (int k = 0; k < t->nsrc; k++) {
        const int st = p->nodes[deft_view_base(p->graph, t->src[k]->id, NULL)].step;
        if (st > anchor) anchor = st;
    }
    const deft_optimizer *piece = t->p.optimizer;
    for (int i = 0; i < piece->n_params; i++)
        if (last[piece->params[i]->id] > anchor) anchor = last[piece->params[i]->id];
    return anchor;
}

/* The new order: pieces with no anchor first, then each step followed by the pieces anchored at it, in their order.
 * head and next (n_steps entries each) link each step's pieces. */
static void deft_reorder(const deft_program *p, const int *anchor, int *head, int *next, int *order) {
    const int n_steps = p->n_steps;
    for (int i = 0; i < n_steps; i++) head[i] = next[i] = -1;
    for (int j = n_steps - 1; j >= 0; j--)
        if (anchor[j] >= 0) {
            next[j] = head[anchor[j]];
            head[anchor[j]] = j;
        }
    int n = 0;
    for (int i = 0; i < n_steps; i++)
        if (anchor[i] == -1) order[n++] = p->steps[i];
    for (int i = 0; i < n_steps; i++) {
        if (anchor[i] != -2) continue;
        order[n++] = p->steps[i];
        for (int j = head[i]; j >= 0; j = next[j]) order[n++] = p->steps[j];
    }
}

/* Per bucket (data parallel): the pieces and the finisher after every other step, in their order (the buckets'),
 * so that no step of the backward pass waits behind a piece for its bucket's all-reduce. A piece may move later:
 * nothing but the finisher reads it, and no other step reads its parameters after the optimizer's step (the split
 * checks that). */
static deft_status deft_parts_last(deft_program *p, bool *moved) {
    int *order = malloc((size_t)(p->n_steps ? p->n_steps : 1) * sizeof *order);
    if (!order) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    int n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < p->n_steps; i++) {
            const deft_tensor *t = p->graph->nodes[p->steps[i]];
            const bool part = t->op == DEFT_OP_OPTIMIZER && t->p.optimizer->part;
            if (part == (pass == 1)) order[n++] = p->steps[i];
        }
    *moved = memcmp(order, p->steps, (size_t)p->n_steps * sizeof *order) != 0;
    memcpy(p->steps, order, (size_t)p->n_steps * sizeof *order);
    free(order);
    return DEFT_OK;
}

deft_status deft_program_place_parts(deft_program *p, bool *moved) {
    *moved = false;
    if (p->split && p->split->per_bucket) return deft_parts_last(p, moved);
    const size_t n_steps = (size_t)(p->n_steps ? p->n_steps : 1);
    int *last = malloc((size_t)(p->n_nodes ? p->n_nodes : 1) * sizeof *last);
    int *scratch = malloc(4 * n_steps * sizeof *scratch);
    deft_status s = DEFT_OK;
    if (!last || !scratch) s = deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    int *anchor = scratch, *head = scratch + n_steps, *next = scratch + 2 * n_steps, *order = scratch + 3 * n_steps;
    if (s == DEFT_OK) deft_last_reads(p, last);
    bool any = false;
    for (int i = 0; s == DEFT_OK && i < p->n_steps; i++) {
        const deft_tensor *t = p->graph->nodes[p->steps[i]];
        anchor[i] = deft_is_piece(t) ? deft_piece_anchor(p, t, last) : -2;
        any |= anchor[i] != -2;
        /* The schedule ran every source and reader before the piece: anything else is a bug upstream. */
        if (anchor[i] >= i)
            s = deft_set_error(DEFT_ERR_STATE, "compile: %s is scheduled before a step it must follow", t->name);
    }
    if (s == DEFT_OK && any) {
        deft_reorder(p, anchor, head, next, order);
        *moved = memcmp(order, p->steps, (size_t)p->n_steps * sizeof *order) != 0;
        memcpy(p->steps, order, (size_t)p->n_steps * sizeof *order);
    }
    free(last);
    free(scratch);
    return s;
}
