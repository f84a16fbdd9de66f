/* Activation memory from the plan (passes/activation_bytes.h): which forward values the steps after the forward
 * pass read, and the peak of their buffers' bytes over the schedule. Issue 7 asks mixed precision for "activation
 * memory about half of fp32's"; the arena alone does not show it, as f32 weight gradients may set its size. */
#include <stdlib.h>
#include <string.h>

#include "activation_bytes.h"
#include "autocast.h"
#include "autodiff.h"

/* Marks t and every node it reads (ids below n) in `mark`. */
static deft_status deft_mark_ancestors(const deft_tensor *t, int n, bool *mark) {
    if (t->id >= n || mark[t->id]) return DEFT_OK;
    const deft_tensor **stack = malloc((size_t)n * sizeof *stack);
    if (!stack) return deft_set_error(DEFT_ERR_OOM, "activation bytes: out of host memory");
    int top = 0;
    mark[t->id] = true;
    stack[top++] = t;
    while (top > 0) {
        const deft_tensor *u = stack[--top];
        for (int k = 0; k < u->nsrc; k++) {
            const deft_tensor *s = u->src[k];
            if (s->id < n && !mark[s->id]) {
                mark[s->id] = true;
                stack[top++] = s;
            }
        }
    }
    free(stack);
    return DEFT_OK;
}

/* The forward pass of p: the ancestors of every differentiated loss, of the autocast counterparts of those and of
 * the counterparts' casts to f32. A cast that the loss does not read (the f32 read-through of bf16 logits that a
 * program outputs, now that cross-entropy reads the bf16 logits) is forward work too, not a reader after the forward
 * pass. */
static deft_status deft_forward_nodes(const deft_program *p, bool *fwd) {
    const deft_graph *g = p->graph;
    deft_status s = DEFT_OK;
    for (int c = 0; s == DEFT_OK && c < g->n_backward_calls; c++) {
        const deft_tensor *loss = g->backward_calls[c].loss;
        s = deft_mark_ancestors(loss, p->n_nodes, fwd);
    }
    for (const deft_autocast *ac = g->autocasts; s == DEFT_OK && ac; ac = ac->next)
        for (int id = 0; s == DEFT_OK && id < ac->n_user && id < p->n_nodes; id++)
            if (fwd[id] && ac->map[id]) {
                const deft_tensor *m = ac->map[id];
                s = deft_mark_ancestors(m, p->n_nodes, fwd);
                if (s == DEFT_OK && m->id < ac->cap && ac->to_f32[m->id])
                    s = deft_mark_ancestors(ac->to_f32[m->id], p->n_nodes, fwd);
            }
    return s;
}

/* Forward values in the arena that depend on an input (not on parameters and constants alone). */
static void deft_activations(const deft_program *p, const bool *fwd, bool *data, bool *act) {
    const deft_graph *g = p->graph;
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = g->nodes[id];
        data[id] = t->op == DEFT_OP_INPUT;
        for (int k = 0; k < t->nsrc && !data[id]; k++) data[id] = t->src[k]->id < id && data[t->src[k]->id];
        act[id] = data[id] && fwd[id] && p->nodes[id].needed && p->nodes[id].buffer >= 0 && !deft_op_is_leaf(t->op);
    }
}

/* saved_until[b]: the last step outside the forward pass that reads an activation in buffer b (-1: none). */
static void deft_saved_until(const deft_program *p, const bool *fwd, const bool *act, int *saved_until) {
    const deft_graph *g = p->graph;
    for (int b = 0; b < p->n_buffers; b++) saved_until[b] = -1;
    for (int id = 0; id < p->n_nodes; id++) {
        const int step = p->nodes[id].needed ? p->nodes[id].step : -1;   /* a fused member: its group's step */
        if (fwd[id] || step < 0) continue;
        const deft_tensor *t = g->nodes[id];
        for (int k = 0; k < t->nsrc; k++) {
            const int base = deft_view_base(g, t->src[k]->id, NULL);
            const int b = p->nodes[base].buffer;
            if (base < p->n_nodes && act[base] && b >= 0 && saved_until[b] < step) saved_until[b] = step;
        }
    }
}

/* The peak over the steps of the bytes of the buffers of arena `a` between their first write and saved_until. */
static size_t deft_arena_peak(const deft_program *p, int a, const int *saved_until, int64_t *delta) {
    memset(delta, 0, (size_t)(p->n_steps + 2) * sizeof *delta);
    for (int b = 0; b < p->n_buffers; b++) {
        const deft_buffer *buf = &p->buffers[b];
        if (buf->arena != a || buf->merged_into >= 0 || saved_until[b] < 0) continue;
        const int from = buf->plan.first < saved_until[b] ? buf->plan.first : saved_until[b];
        delta[from] += (int64_t)buf->plan.size;
        delta[saved_until[b] + 1] -= (int64_t)buf->plan.size;
    }
    int64_t live = 0, peak = 0;
    for (int s = 0; s <= p->n_steps; s++) {
        live += delta[s];
        if (live > peak) peak = live;
    }
    return (size_t)peak;
}

deft_status deft_activation_peaks(const deft_program *p, size_t *per_arena) {
    for (int a = 0; a < p->n_arenas; a++) per_arena[a] = 0;
    const size_t n = (size_t)(p->n_nodes ? p->n_nodes : 1);
    bool *fwd = calloc(n, sizeof *fwd), *act = calloc(n, sizeof *act), *data = calloc(n, sizeof *data);
    int *saved_until = malloc((size_t)(p->n_buffers ? p->n_buffers : 1) * sizeof *saved_until);
    int64_t *delta = malloc((size_t)(p->n_steps + 2) * sizeof *delta);
    deft_status s = DEFT_OK;
    if (!fwd || !act || !data || !saved_until || !delta)
        s = deft_set_error(DEFT_ERR_OOM, "activation bytes: out of host memory");
    if (s == DEFT_OK) s = deft_forward_nodes(p, fwd);
    if (s == DEFT_OK) {
        deft_activations(p, fwd, data, act);
        deft_saved_until(p, fwd, act, saved_until);
        for (int a = 0; a < p->n_arenas; a++) per_arena[a] = deft_arena_peak(p, a, saved_until, delta);
    }
    free(fwd);
    free(act);
    free(data);
    free(saved_until);
    free(delta);
    return s;
}
