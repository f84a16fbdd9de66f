/* The compile option `reorder`: hand the schedule's dependencies and buffer sizes to the order search
 * (plan/schedule_order.c) and apply the order it finds. */
#include <stdlib.h>

#include "program_state.h"
#include "schedule_order.h"

/* An optimizer writes parameters that earlier steps read and later ones read anew: it stays where it is, a barrier,
 * and the steps between two barriers are reordered among themselves. (Given to the order search as a step reading
 * every earlier one, it kept every value alive to it, and no order could lower that peak.) */
static bool deft_is_barrier(const deft_program *p, int i) {
    return p->graph->nodes[p->steps[i]]->op == DEFT_OP_OPTIMIZER;
}

/* The inputs of step i that are steps of the segment [lo, i), as indices from lo. */
static int deft_add_deps(const deft_program *p, int i, int lo, int *deps, int n, const int *step_of) {
    const deft_tensor *t = p->graph->nodes[p->steps[i]];
    for (int k = 0; k < t->nsrc; k++) {
        int s = step_of[deft_view_base(p->graph, t->src[k]->id, NULL)];
        if (s >= lo && s < i) deps[n++] = s - lo;
    }
    return n;
}

/* Reorders the steps [lo, hi) among themselves; st, deps, order and old are scratch of at least hi - lo entries
 * (deps: their sources). */
static deft_status deft_reorder_segment(deft_program *p, int lo, int hi, const int *step_of, deft_order_step *st,
                                        int *deps, int *order, int *old) {
    const int n = hi - lo;
    int nd = 0;
    for (int i = 0; i < n; i++) {
        const deft_tensor *t = p->graph->nodes[p->steps[lo + i]];
        st[i] = (deft_order_step){deft_tensor_bytes(t), p->nodes[t->id].is_output, nd, 0};
        nd = deft_add_deps(p, lo + i, lo, deps, nd, step_of);
        st[i].dep_end = nd;
    }
    deft_status s = deft_schedule_order(st, n, deps, order);
    if (s != DEFT_OK) return s;
    for (int i = 0; i < n; i++) old[i] = p->steps[lo + i];
    for (int i = 0; i < n; i++) p->steps[lo + i] = old[order[i]];
    return DEFT_OK;
}

static size_t deft_count_deps(const deft_program *p) {
    size_t n = 0;
    for (int i = 0; i < p->n_steps; i++) n += (size_t)p->graph->nodes[p->steps[i]]->nsrc;
    return n ? n : 1;
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
    for (int lo = 0; s == DEFT_OK && lo < n;) {
        int hi = lo;
        while (hi < n && !deft_is_barrier(p, hi)) hi++;
        if (hi - lo >= 2) s = deft_reorder_segment(p, lo, hi, step_of, st, deps, order, old);
        lo = hi + 1;   /* past the barrier */
    }
    free(st);
    free(deps);
    free(order);
    free(step_of);
    free(old);
    return s;
}
