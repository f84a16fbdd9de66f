/* The compile option `reorder`: hand the schedule's dependencies and buffer sizes to the order search
 * (plan/schedule_order.c) and apply the order it finds. */
#include <stdlib.h>

#include "program_state.h"
#include "schedule_order.h"

/* An optimizer writes parameters that earlier steps read and later ones read anew: it stays a barrier. */
static int deft_add_deps(const deft_program *p, int i, int *deps, int n, int last_barrier, const int *step_of) {
    const deft_tensor *t = p->graph->nodes[p->steps[i]];
    if (t->op == DEFT_OP_OPTIMIZER) {
        for (int j = 0; j < i; j++) deps[n++] = j;
        return n;
    }
    if (last_barrier >= 0) deps[n++] = last_barrier;
    for (int k = 0; k < t->nsrc; k++) {
        int s = step_of[deft_view_base(p->graph, t->src[k]->id, NULL)];
        if (s >= 0) deps[n++] = s;
    }
    return n;
}

static size_t deft_count_deps(const deft_program *p) {
    size_t n = 0;
    for (int i = 0; i < p->n_steps; i++) {
        const deft_tensor *t = p->graph->nodes[p->steps[i]];
        n += (size_t)t->nsrc + 1 + (t->op == DEFT_OP_OPTIMIZER ? (size_t)i : 0);
    }
    return n;
}

deft_status deft_program_reorder(deft_program *p) {
    int n = p->n_steps;
    if (n < 2) return DEFT_OK;
    deft_order_step *st = malloc((size_t)n * sizeof *st);
    int *deps = malloc(deft_count_deps(p) * sizeof *deps), *order = malloc((size_t)n * sizeof *order);
    int *step_of = malloc((size_t)p->n_nodes * sizeof *step_of), *old = malloc((size_t)n * sizeof *old);
    deft_status s = DEFT_OK;
    if (!st || !deps || !order || !step_of || !old) s = deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    for (int id = 0; s == DEFT_OK && id < p->n_nodes; id++) step_of[id] = -1;
    for (int i = 0; s == DEFT_OK && i < n; i++) step_of[p->steps[i]] = i;
    int nd = 0, barrier = -1;
    for (int i = 0; s == DEFT_OK && i < n; i++) {
        const deft_tensor *t = p->graph->nodes[p->steps[i]];
        st[i] = (deft_order_step){deft_tensor_bytes(t), p->nodes[t->id].is_output, nd, 0};
        nd = deft_add_deps(p, i, deps, nd, barrier, step_of);
        st[i].dep_end = nd;
        if (t->op == DEFT_OP_OPTIMIZER) barrier = i;
    }
    if (s == DEFT_OK) s = deft_schedule_order(st, n, deps, order);
    if (s == DEFT_OK) {
        for (int i = 0; i < n; i++) old[i] = p->steps[i];
        for (int i = 0; i < n; i++) p->steps[i] = old[order[i]];
    }
    free(st);
    free(deps);
    free(order);
    free(step_of);
    free(old);
    return s;
}
