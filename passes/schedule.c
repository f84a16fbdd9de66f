/* The schedule of a program and the plan of its memory (schedule.h). */
#include <stdlib.h>

#include "checked.h"
#include "optimizer.h"
#include "optimizer_place.h"
#include "schedule.h"
#include "side_lane.h"

int deft_view_base(const deft_graph *g, int id, size_t *offset) {
    size_t off = 0;
    const deft_tensor *t = g->nodes[id];
    while (t->is_view) {
        off += t->view_offset;
        t = t->src[0];
    }
    if (offset) *offset = off;
    return t->id;
}

/* Marks what the outputs need: node ids are a topological order, so one backward pass suffices. */
static void deft_mark_needed(deft_program *p, deft_tensor *const *outputs, int n_outputs, const int *redirect) {
    for (int i = 0; i < n_outputs; i++) {
        int id = outputs[i]->id, c = redirect && redirect[id] >= 0 ? redirect[id] : id;
        p->nodes[id].is_output = true;
        p->nodes[c].needed = true;
        p->nodes[c].is_output = true;
        p->outputs[i] = c;
    }
    for (int id = p->n_nodes - 1; id >= 0; id--) {
        if (!p->nodes[id].needed) continue;
        const deft_tensor *t = p->graph->nodes[id];
        for (int k = 0; k < t->nsrc; k++) p->nodes[t->src[k]->id].needed = true;
    }
}

static deft_status deft_collect_steps(deft_program *p) {
    const deft_graph *g = p->graph;
    p->steps = malloc((size_t)(p->n_nodes ? p->n_nodes : 1) * sizeof *p->steps);
    p->buffers = malloc((size_t)(p->n_nodes ? p->n_nodes : 1) * sizeof *p->buffers);
    if (!p->steps || !p->buffers) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    p->n_steps = 0;
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = g->nodes[id];
        if (p->nodes[id].needed && !deft_op_is_leaf(t->op) && !t->is_view) p->steps[p->n_steps++] = id;
    }
    return DEFT_OK;
}

deft_status deft_schedule_prepare(deft_program *p, deft_tensor *const *outputs, int n_outputs, const int *redirect) {
    p->nodes = calloc((size_t)(p->n_nodes ? p->n_nodes : 1), sizeof *p->nodes);
    p->outputs = malloc((size_t)n_outputs * sizeof *p->outputs);
    if (!p->nodes || !p->outputs) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    p->n_outputs = n_outputs;
    deft_mark_needed(p, outputs, n_outputs, redirect);
    return deft_collect_steps(p);
}

static int deft_arena_for(deft_program *p, deft_device d) {
    for (int i = 0; i < p->n_arenas; i++)
        if (deft_device_equal(p->arenas[i].device, d)) return i;
    if (p->n_arenas == DEFT_MAX_ARENAS) return -1;
    p->arenas[p->n_arenas].device = d;
    return p->n_arenas++;
}

static void deft_schedule_buffer(deft_program *p, int id, int step, int arena) {
    deft_node_state *s = &p->nodes[id];
    s->step = step;
    s->arena = arena;
    s->buffer = p->n_buffers;
    p->buffers[p->n_buffers++] = (deft_buffer){id, arena, -1, {deft_node_buffer_bytes(p->graph->nodes[id]), step, step, 0}};
}

/* Each step's buffer; a fused group runs at its root's step: every member is computed there, only the stores get
 * buffers. */
static deft_status deft_schedule_steps(deft_program *p) {
    const deft_graph *g = p->graph;
    for (int i = 0; i < p->n_steps; i++) {
        int id = p->steps[i];
        int arena = deft_arena_for(p, g->nodes[id]->device);
        if (arena < 0) return deft_set_error(DEFT_ERR_DEVICE, "compile: more than %d devices", DEFT_MAX_ARENAS);
        const deft_group *grp = p->nodes[id].group >= 0 ? &p->groups[p->nodes[id].group] : NULL;
        if (!grp) {
            deft_schedule_buffer(p, id, i, arena);
            continue;
        }
        for (int m = 0; m < grp->n_members; m++) {
            p->nodes[grp->members[m]].step = i;
            p->nodes[grp->members[m]].arena = arena;
        }
        for (int k = 0; k < grp->n_stores; k++) deft_schedule_buffer(p, grp->stores[k], i, arena);
    }
    return DEFT_OK;
}

deft_status deft_schedule_buffers(deft_program *p) {
    const deft_graph *g = p->graph;
    p->n_buffers = 0;
    for (int id = 0; id < p->n_nodes; id++) p->nodes[id].step = p->nodes[id].buffer = p->nodes[id].arena = -1;
    deft_status s = deft_schedule_steps(p);
    if (s != DEFT_OK) return s;
    for (int id = 0; id < p->n_nodes; id++) {
        deft_node_state *st = &p->nodes[id];
        if (!st->needed) continue;
        int base = deft_view_base(g, id, &st->offset);
        if (base != id) {
            st->buffer = p->nodes[base].buffer;
            st->arena = p->nodes[base].arena;
        }
        const deft_tensor *t = g->nodes[id];
        for (int k = 0; st->step >= 0 && k < t->nsrc; k++) {
            int b = p->nodes[deft_view_base(g, t->src[k]->id, NULL)].buffer;
            if (b >= 0 && p->buffers[b].plan.last < st->step) p->buffers[b].plan.last = st->step;
        }
        if (st->is_output && st->buffer >= 0) p->buffers[st->buffer].plan.last = p->n_steps;
    }
    return deft_side_keep_inputs(p);
}

/* Elementwise ops read element i before writing element i, so their output may take over an input's buffer; an op
 * whose row of the op table names an operand it overwrites (cross-entropy's gradient its logits) that operand's. */
static bool deft_may_run_in_place(const deft_tensor *t, int k) {
    const deft_tensor *src = t->src[k];
    const deft_op_info *info = deft_op_info_of(t->op);
    if (info->overwrites)
        return k == info->overwrites - 1 && src->dtype == t->dtype && deft_tensor_bytes(src) == deft_tensor_bytes(t);
    if (!deft_kind_is_elementwise(info->kind)) return false;
    return deft_tensor_bytes(src) == deft_tensor_bytes(t) && deft_dtype_size(src->dtype) == deft_dtype_size(t->dtype);
}

static int deft_buffer_root(const deft_program *p, int b) {
    while (b >= 0 && p->buffers[b].merged_into >= 0) b = p->buffers[b].merged_into;
    return b;
}

/* An op whose input buffer dies at that op writes its output there instead of in a buffer of its own. */
static void deft_merge_in_place(deft_program *p) {
    const deft_graph *g = p->graph;
    for (int step = 0; step < p->n_steps; step++) {
        int id = p->steps[step];
        const deft_tensor *t = g->nodes[id];
        int own = p->nodes[id].buffer;
        for (int k = 0; k < t->nsrc; k++) {
            size_t off;
            int base = deft_view_base(g, t->src[k]->id, &off);
            int b = deft_buffer_root(p, p->nodes[base].buffer);
            if (b < 0 || off != 0 || b == own || p->buffers[b].plan.last != step ||
                p->buffers[b].arena != p->buffers[own].arena || !deft_may_run_in_place(t, k))
                continue;
            p->buffers[b].plan.last = p->buffers[own].plan.last;
            p->buffers[own].merged_into = b;
            break;
        }
    }
    for (int id = 0; id < p->n_nodes; id++)
        if (p->nodes[id].needed) p->nodes[id].buffer = deft_buffer_root(p, p->nodes[id].buffer);
}

/* Arena a's buffers that are planned (not merged into another): their plans into tmp, their indices into idx. */
static int deft_arena_buffers(const deft_program *p, int a, deft_plan_buffer *tmp, int *idx) {
    int n = 0;
    for (int b = 0; b < p->n_buffers; b++)
        if (p->buffers[b].arena == a && p->buffers[b].merged_into < 0) {
            if (idx) idx[n] = b;
            tmp[n++] = p->buffers[b].plan;
        }
    return n;
}

static deft_status deft_plan_arenas(deft_program *p, int no_reuse) {
    deft_plan_buffer *tmp = malloc((size_t)(p->n_buffers ? p->n_buffers : 1) * sizeof *tmp);
    int *idx = malloc((size_t)(p->n_buffers ? p->n_buffers : 1) * sizeof *idx);
    if (!tmp || !idx) {
        free(tmp);
        free(idx);
        return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory planning");
    }
    deft_status st = DEFT_OK;
    for (int a = 0; a < p->n_arenas && st == DEFT_OK; a++) {
        const int n = deft_arena_buffers(p, a, tmp, idx);
        deft_plan_stats stats;
        st = deft_plan_offsets(tmp, n, no_reuse, &stats);
        for (int i = 0; st == DEFT_OK && i < n; i++) p->buffers[idx[i]].plan.offset = tmp[i].offset;
        p->arenas[a].bytes = stats.arena_bytes;
        p->arenas[a].lower_bound = stats.lower_bound;
        /* Without reuse, in-place ops would have had buffers of their own too. */
        p->arenas[a].no_reuse_bytes = 0;
        for (int b = 0; b < p->n_buffers; b++)
            if (p->buffers[b].arena == a)
                p->arenas[a].no_reuse_bytes =
                    deft_size_add_sat(p->arenas[a].no_reuse_bytes, deft_plan_align(p->buffers[b].plan.size));
    }
    free(tmp);
    free(idx);
    return st;
}

/* Each arena fits DEFT_MAX_BYTES (the planner checks); their sum with the persistent state must too, so that the
 * reports and budgets adding them up never wrap. */
static deft_status deft_check_program_bytes(const deft_program *p) {
    const size_t arenas = deft_arena_total(p), total = deft_size_add_sat(arenas, p->persistent_bytes);
    if (total <= DEFT_MAX_BYTES) return DEFT_OK;
    const size_t kept = p->persistent_bytes;
    return deft_set_error(DEFT_ERR_SHAPE,
                          "compile: the program needs more than %zu bytes (arenas %s%zu, persistent %s%zu): too large",
                          DEFT_MAX_BYTES, arenas == SIZE_MAX ? "over " : "",
                          arenas == SIZE_MAX ? DEFT_MAX_BYTES : arenas, kept == SIZE_MAX ? "over " : "",
                          kept == SIZE_MAX ? DEFT_MAX_BYTES : kept);
}

deft_status deft_plan_pass(deft_program *p) {
    const bool no_reuse = p->config.no_reuse;
    deft_status s = deft_schedule_buffers(p);
    if (s == DEFT_OK && !no_reuse) deft_merge_in_place(p);
    if (s == DEFT_OK) s = deft_plan_arenas(p, no_reuse);
    if (s == DEFT_OK) s = deft_check_program_bytes(p);
    return s;
}

deft_status deft_bound_pass(deft_program *p) {
    for (int id = 0; id < p->n_nodes; id++) p->nodes[id].group = -1;
    deft_status s = deft_schedule_buffers(p);
    bool moved = false;
    if (s == DEFT_OK && p->split) s = deft_program_place_parts(p, &moved);
    if (s == DEFT_OK && moved) s = deft_schedule_buffers(p);
    if (s == DEFT_OK && !p->config.no_reuse) deft_merge_in_place(p);
    for (int a = 0; s == DEFT_OK && a < p->n_arenas; a++) {
        deft_plan_buffer *tmp = malloc((size_t)(p->n_buffers ? p->n_buffers : 1) * sizeof *tmp);
        if (!tmp) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory planning");
        p->arenas[a].lower_bound = deft_plan_lower_bound(tmp, deft_arena_buffers(p, a, tmp, NULL));
        free(tmp);
    }
    return s;
}

size_t deft_arena_total(const deft_program *p) {
    size_t n = 0;
    for (int a = 0; a < p->n_arenas; a++) n = deft_size_add_sat(n, p->arenas[a].bytes);
    return n;
}

size_t deft_persistent_bytes(const deft_program *p) {
    size_t n = 0;
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed) continue;
        if (deft_op_is_leaf(t->op)) n = deft_size_add_sat(n, deft_tensor_bytes(t));
        if (t->op == DEFT_OP_OPTIMIZER) n = deft_size_add_sat(n, deft_optimizer_state_bytes(t->p.optimizer));
    }
    return n;
}
