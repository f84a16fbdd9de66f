/* Compiling: which nodes run, in what order, where each value lives; then the arenas and input slots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "cuda_kernels.h"
#include "device_internal.h"
#include "dist.h"
#include "node.h"
#include "optimizer.h"
#include "optimizer_place.h"
#include "optimizer_split.h"
#include "program_state.h"
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

static deft_status deft_check_outputs(deft_graph *g, deft_tensor *const *outputs, int n_outputs) {
    if (!g) return deft_set_error(DEFT_ERR_INVALID, "compile: graph is NULL");
    if (g->first_error != DEFT_OK)
        return deft_set_error(g->first_error, "compile: the graph has an error: %s", g->first_errmsg);
    if (!outputs || n_outputs <= 0) return deft_set_error(DEFT_ERR_INVALID, "compile: no outputs asked for");
    for (int i = 0; i < n_outputs; i++) {
        if (!outputs[i]) return deft_set_error(DEFT_ERR_INVALID, "compile: output %d is NULL", i);
        if (outputs[i]->graph != g)
            return deft_set_error(DEFT_ERR_INVALID, "compile: output %d (%s) belongs to another graph", i,
                                  outputs[i]->name);
    }
    return DEFT_OK;
}

/* Marks what the outputs need: node ids are a topological order, so one backward pass suffices. An output that
 * checkpointing copied is computed by its copy (redirect, per original node: the copy's id or -1; may be NULL) and
 * read from there. */
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

static int deft_arena_for(deft_program *p, deft_device d) {
    for (int i = 0; i < p->n_arenas; i++)
        if (deft_device_equal(p->arenas[i].device, d)) return i;
    if (p->n_arenas == DEFT_MAX_ARENAS) return -1;
    p->arenas[p->n_arenas].device = d;
    return p->n_arenas++;
}

/* The nodes that run a kernel, in id order (a topological order). */
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

static void deft_schedule_buffer(deft_program *p, int id, int step, int arena) {
    deft_node_state *s = &p->nodes[id];
    s->step = step;
    s->arena = arena;
    s->buffer = p->n_buffers;
    p->buffers[p->n_buffers++] = (deft_buffer){id, arena, -1, {deft_tensor_bytes(p->graph->nodes[id]), step, step, 0}};
}

/* Gives each step (in the order of p->steps) its buffer, and each buffer its lifetime: until its last reader, views
 * being read through their base; outputs live to the end. */
static deft_status deft_schedule(deft_program *p) {
    const deft_graph *g = p->graph;
    p->n_buffers = 0;
    for (int id = 0; id < p->n_nodes; id++) p->nodes[id].step = p->nodes[id].buffer = p->nodes[id].arena = -1;
    for (int i = 0; i < p->n_steps; i++) {
        int id = p->steps[i];
        int arena = deft_arena_for(p, g->nodes[id]->device);
        if (arena < 0) return deft_set_error(DEFT_ERR_DEVICE, "compile: more than %d devices", DEFT_MAX_ARENAS);
        const deft_group *grp = p->nodes[id].group >= 0 ? &p->groups[p->nodes[id].group] : NULL;
        if (!grp) {
            deft_schedule_buffer(p, id, i, arena);
            continue;
        }
        /* A fused group runs at its root's step: every member is computed there, only the stores get buffers. */
        for (int m = 0; m < grp->n_members; m++) {
            p->nodes[grp->members[m]].step = i;
            p->nodes[grp->members[m]].arena = arena;
        }
        for (int k = 0; k < grp->n_stores; k++) deft_schedule_buffer(p, grp->stores[k], i, arena);
    }
    for (int id = 0; id < p->n_nodes; id++) {
        deft_node_state *s = &p->nodes[id];
        if (!s->needed) continue;
        int base = deft_view_base(g, id, &s->offset);
        if (base != id) {
            s->buffer = p->nodes[base].buffer;
            s->arena = p->nodes[base].arena;
        }
        const deft_tensor *t = g->nodes[id];
        for (int k = 0; s->step >= 0 && k < t->nsrc; k++) {
            int b = p->nodes[deft_view_base(g, t->src[k]->id, NULL)].buffer;
            if (b >= 0 && p->buffers[b].plan.last < s->step) p->buffers[b].plan.last = s->step;
        }
        if (s->is_output && s->buffer >= 0) p->buffers[s->buffer].plan.last = p->n_steps;
    }
    return deft_side_keep_inputs(p);
}

/* Elementwise ops read element i before writing element i, so their output may take over an input's buffer. */
static bool deft_may_run_in_place(const deft_tensor *t, const deft_tensor *src) {
    if (!deft_kind_is_elementwise(deft_op_info_of(t->op)->kind)) return false;
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
                p->buffers[b].arena != p->buffers[own].arena || !deft_may_run_in_place(t, t->src[k]))
                continue;
            p->buffers[b].plan.last = p->buffers[own].plan.last;
            p->buffers[own].merged_into = b;
            break;
        }
    }
    for (int id = 0; id < p->n_nodes; id++)
        if (p->nodes[id].needed) p->nodes[id].buffer = deft_buffer_root(p, p->nodes[id].buffer);
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
        int n = 0;
        for (int b = 0; b < p->n_buffers; b++)
            if (p->buffers[b].arena == a && p->buffers[b].merged_into < 0) {
                idx[n] = b;
                tmp[n++] = p->buffers[b].plan;
            }
        deft_plan_stats stats;
        st = deft_plan_offsets(tmp, n, no_reuse, &stats);
        for (int i = 0; st == DEFT_OK && i < n; i++) p->buffers[idx[i]].plan.offset = tmp[i].offset;
        p->arenas[a].bytes = stats.arena_bytes;
        p->arenas[a].lower_bound = stats.lower_bound;
        /* Without reuse, in-place ops would have had buffers of their own too. */
        p->arenas[a].no_reuse_bytes = 0;
        for (int b = 0; b < p->n_buffers; b++)
            if (p->buffers[b].arena == a) p->arenas[a].no_reuse_bytes += deft_plan_align(p->buffers[b].plan.size);
    }
    free(tmp);
    free(idx);
    return st;
}

/* The CPU memory of a program that uses a GPU is page-locked, so that its copies to and from the GPUs are
 * asynchronous and can be captured in a CUDA Graph; other memory comes from the device's caching allocator. */
static deft_status deft_program_host_alloc(const deft_program *p, deft_device d, size_t bytes, const char *tag,
                                           void **out) {
    if (d.type == DEFT_CPU && p->pinned_host) return deft_pinned_alloc(bytes, out);
    return deft_mem_alloc_tagged(d, bytes, tag, out);
}

static void deft_program_host_free(const deft_program *p, deft_device d, void *ptr) {
    if (d.type == DEFT_CPU && p->pinned_host) (void)deft_pinned_free(ptr);
    else deft_mem_free(d, ptr);
}

/* Input slots, and device copies of parameters and constants that live on a GPU; `uploaded` marks the copies made
 * here, so that a compile failing later can give them back. */
static deft_status deft_place_persistent(deft_program *p, bool *uploaded) {
    for (int id = 0; id < p->n_nodes; id++) {
        deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed || !deft_op_is_leaf(t->op)) continue;
        size_t bytes = deft_tensor_bytes(t);
        deft_status s = DEFT_OK;
        if (t->op == DEFT_OP_INPUT) {
            s = deft_program_host_alloc(p, t->device, bytes, t->name, &p->nodes[id].input_storage);
        } else if (t->device.type != DEFT_CPU && !t->dev_data) {
            s = deft_mem_alloc_tagged(t->device, bytes, t->name, &t->dev_data);
            if (s == DEFT_OK) uploaded[id] = true;
            if (s == DEFT_OK) s = deft_mem_copy(t->device, t->dev_data, deft_cpu(), t->host_data, bytes);
        }
        if (s != DEFT_OK) return deft_set_error(s, "compile: storage for %s: %s", t->name, deft_errmsg());
    }
    return DEFT_OK;
}

static deft_status deft_check_budget(const deft_program *p, size_t budget) {
    size_t arena = 0;
    for (int a = 0; a < p->n_arenas; a++) arena += p->arenas[a].bytes;
    if (budget == 0 || arena + p->persistent_bytes <= budget) return DEFT_OK;
    if (p->persistent_bytes > budget)
        return deft_set_error(DEFT_ERR_OOM,
                              "compile: the memory budget of %zu bytes is smaller than the persistent state "
                              "(%zu bytes of inputs, parameters and constants)",
                              budget, p->persistent_bytes);
    return deft_set_error(DEFT_ERR_OOM,
                          "compile: the memory budget of %zu bytes is smaller than the %zu bytes this program needs "
                          "(arena %zu + persistent %zu)",
                          budget, arena + p->persistent_bytes, arena, p->persistent_bytes);
}

/* A GPU arena that cannot fit fails here, with the numbers, rather than somewhere in the allocator or a run. */
static deft_status deft_check_device_room(const deft_program *p) {
    for (int a = 0; a < p->n_arenas; a++) {
        deft_device d = p->arenas[a].device;
        size_t free_b = 0, total = 0;
        deft_memory_stats st;
        if (d.type != DEFT_CUDA || deft_device_memory(d, &free_b, &total) != DEFT_OK ||
            deft_memory_stats_get(d, &st) != DEFT_OK)
            continue;
        size_t cached = (size_t)(st.reserved_bytes.current - st.allocated_bytes.current);
        if (p->arenas[a].bytes <= free_b + cached) continue;
        char ds[32];
        return deft_set_error(DEFT_ERR_OOM,
                              "compile: the planned arena of %zu bytes does not fit on %s: %zu bytes free on the "
                              "device (of %zu) and %zu cached by deft's allocator",
                              p->arenas[a].bytes, deft_device_str(d, ds, sizeof ds), free_b, total, cached);
    }
    return DEFT_OK;
}

static deft_status deft_alloc_arenas(deft_program *p) {
    for (int a = 0; a < p->n_arenas; a++) {
        char tag[48], ds[32];
        snprintf(tag, sizeof tag, "arena %s", deft_device_str(p->arenas[a].device, ds, sizeof ds));
        deft_status s = deft_program_host_alloc(p, p->arenas[a].device, p->arenas[a].bytes, tag, &p->arenas[a].base);
        if (s != DEFT_OK) {
            char d[32];
            return deft_set_error(s, "compile: the arena of %zu bytes on %s: %s", p->arenas[a].bytes,
                                  deft_device_str(p->arenas[a].device, d, sizeof d), deft_errmsg());
        }
    }
    return DEFT_OK;
}

static size_t deft_arena_total(const deft_program *p) {
    size_t n = 0;
    for (int a = 0; a < p->n_arenas; a++) n += p->arenas[a].bytes;
    return n;
}

/* Buffers, in-place reuse and offsets for the current order of p->steps. */
static deft_status deft_plan_pass(deft_program *p, int no_reuse) {
    deft_status s = deft_schedule(p);
    if (s == DEFT_OK && !no_reuse) deft_merge_in_place(p);
    if (s == DEFT_OK) s = deft_plan_arenas(p, no_reuse);
    return s;
}

/* Optimizer in backward: the pieces of split steps move up to their gradients, last of all (the fused groups run
 * where they will); the plan is made again when they moved. */
static deft_status deft_place_parts(deft_program *p, int no_reuse, bool replan) {
    bool moved = false;
    deft_status s = p->split ? deft_program_place_parts(p, &moved) : DEFT_OK;
    if (s == DEFT_OK && moved && replan) s = deft_plan_pass(p, no_reuse);
    else if (s == DEFT_OK && moved) s = deft_schedule(p);
    return s;
}

/* Buffers and in-place reuse for the current order, and each arena's lower bound without placing anything. */
static deft_status deft_bound_pass(deft_program *p, int no_reuse) {
    for (int id = 0; id < p->n_nodes; id++) p->nodes[id].group = -1;
    deft_status s = deft_schedule(p);
    if (s == DEFT_OK) s = deft_place_parts(p, no_reuse, false);
    if (s == DEFT_OK && !no_reuse) deft_merge_in_place(p);
    for (int a = 0; s == DEFT_OK && a < p->n_arenas; a++) {
        deft_plan_buffer *tmp = malloc((size_t)(p->n_buffers ? p->n_buffers : 1) * sizeof *tmp);
        if (!tmp) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory planning");
        int n = 0;
        for (int b = 0; b < p->n_buffers; b++)
            if (p->buffers[b].arena == a && p->buffers[b].merged_into < 0) tmp[n++] = p->buffers[b].plan;
        p->arenas[a].lower_bound = deft_plan_lower_bound(tmp, n);
        free(tmp);
    }
    return s;
}

/* With `reorder`, a second plan over the reordered steps replaces the first only when its arenas are smaller. */
static deft_status deft_order_steps(deft_program *p, const deft_compile_options *opts) {
    int no_reuse = opts ? opts->no_reuse : 0;
    for (int id = 0; id < p->n_nodes; id++) p->nodes[id].group = -1;
    deft_status s = deft_plan_pass(p, no_reuse);
    if (s != DEFT_OK || !opts || !opts->reorder || no_reuse) return s;
    size_t in_order = deft_arena_total(p);
    int *kept = malloc((size_t)(p->n_steps ? p->n_steps : 1) * sizeof *kept);
    if (!kept) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    memcpy(kept, p->steps, (size_t)p->n_steps * sizeof *kept);
    s = deft_program_reorder(p);
    if (s == DEFT_OK) s = deft_plan_pass(p, no_reuse);
    if (s == DEFT_OK && deft_arena_total(p) >= in_order) {
        memcpy(p->steps, kept, (size_t)p->n_steps * sizeof *kept);
        s = deft_plan_pass(p, no_reuse);
    }
    free(kept);
    return s;
}

/* The order of the steps, then fusion over that order, then the plan of the fused steps. */
static deft_status deft_plan_steps(deft_program *p, const deft_compile_options *opts) {
    deft_status s = deft_order_steps(p, opts);
    const int no_reuse = opts ? opts->no_reuse : 0;
    if (s == DEFT_OK && !(opts && opts->no_fusion)) {
        const int before = p->n_steps;
        s = deft_program_fuse(p, deft_product_batches_wanted(opts));
        if (s == DEFT_OK && p->n_steps != before) s = deft_plan_pass(p, no_reuse);
    }
    if (s == DEFT_OK) s = deft_place_parts(p, no_reuse, true);
    /* The side lane is chosen over the final order and groups; its inputs' longer lives need a plan of their own. */
    int side = 0;
    if (s == DEFT_OK) s = deft_side_mark(p, opts, &side);
    if (s == DEFT_OK && side > 0) s = deft_plan_pass(p, no_reuse);
    return s;
}

static size_t deft_persistent_bytes(const deft_program *p) {
    size_t n = 0;
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed) continue;
        if (deft_op_is_leaf(t->op)) n += deft_tensor_bytes(t);
        if (t->op == DEFT_OP_OPTIMIZER) n += deft_optimizer_state_bytes(t->p.optimizer);
    }
    return n;
}

/* A failed compile leaves the graph's device memory as it found it (out of memory must leak nothing): the copies it
 * made go back. Their host values are still current, since nothing ran on them. */
static void deft_release_uploads(deft_program *p, const bool *uploaded) {
    for (int id = 0; id < p->n_nodes; id++)
        if (uploaded[id]) deft_node_release_device_data(p->graph->nodes[id]);
}

/* Which nodes run, in what order, and the plan of their buffers; `full`: the arenas as the planner places them,
 * otherwise only the buffers' lifetimes and the lower bound (what checkpointing's search compares). outputs are
 * what the program computes; user what it was asked for (the same, or under autocast the tensors that outputs
 * stand for, read through an alias). */
static deft_status deft_build_plan(deft_program *p, deft_tensor *const *outputs, deft_tensor *const *user,
                                   int n_outputs, const deft_compile_options *opts, const int *redirect, int full) {
    p->nodes = calloc((size_t)(p->n_nodes ? p->n_nodes : 1), sizeof *p->nodes);
    p->outputs = malloc((size_t)n_outputs * sizeof *p->outputs);
    if (!p->nodes || !p->outputs) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    p->n_outputs = n_outputs;
    p->cuda_flags = (opts && opts->tf32 ? DEFT_CUDA_ALLOW_TF32 : 0u) |
                    (opts && opts->deterministic ? DEFT_CUDA_DETERMINISTIC : 0u);
    deft_mark_needed(p, outputs, n_outputs, redirect);
    deft_status s = user != outputs ? deft_autocast_alias(p, user, n_outputs) : DEFT_OK;
    if (s == DEFT_OK) s = deft_collect_steps(p);
    if (s == DEFT_OK && full) s = deft_plan_steps(p, opts);
    if (s == DEFT_OK && !full) s = deft_bound_pass(p, opts ? opts->no_reuse : 0);
    p->persistent_bytes = deft_persistent_bytes(p);
    return s;
}

/* checkpointing's measure (graph/checkpoint.h): a plan of the graph as it stands, in a program of its own. */
typedef struct deft_trial_ctx {
    deft_graph *g;
    deft_tensor *const *outputs;
    int n_outputs;
    const deft_compile_options *opts;
} deft_trial_ctx;

/* Optimizer in backward, when asked for, or data parallel's pieces per bucket: the split of the steps among the
 * outputs (each read through redirect). */
static deft_status deft_split_steps(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                                    const deft_compile_options *opts, const int *redirect, const deft_program *owner,
                                    deft_opt_split **out) {
    *out = NULL;
    if (!opts || !(opts->optimizer_in_backward || deft_optimizer_split_per_bucket(opts))) return DEFT_OK;
    return deft_optimizer_split(g, outputs, n_outputs, redirect, opts, owner, out);
}

static deft_status deft_trial_measure(void *ctx, const int *redirect, int full, size_t *total, double *area) {
    const deft_trial_ctx *c = ctx;
    deft_opt_split *sp = NULL;
    deft_status s = deft_split_steps(c->g, c->outputs, c->n_outputs, c->opts, redirect, NULL, &sp);
    deft_program t = {.graph = c->g, .n_nodes = c->g->n_nodes, .gpu.device = -1, .split = sp};
    if (s == DEFT_OK)
        s = deft_build_plan(&t, c->outputs, c->outputs, c->n_outputs, c->opts, sp ? sp->redirect : redirect, full);
    *total = t.persistent_bytes;
    for (int a = 0; a < t.n_arenas; a++) *total += full ? t.arenas[a].bytes : t.arenas[a].lower_bound;
    *area = 0.0;
    for (int b = 0; s == DEFT_OK && b < t.n_buffers; b++)
        if (t.buffers[b].merged_into < 0)
            *area += (double)t.buffers[b].plan.size * (double)(t.buffers[b].plan.last - t.buffers[b].plan.first + 1);
    deft_program_groups_free(&t);
    free(t.nodes);
    free(t.steps);
    free(t.outputs);
    free(t.buffers);
    deft_opt_split_free(c->g, sp);
    return s;
}

/* The checkpoint rewrite appends the program's copies to the graph; the program then covers them. */
static deft_status deft_checkpoint(deft_program *p, deft_tensor *const *outputs, int n_outputs,
                                   const deft_compile_options *opts) {
    deft_trial_ctx ctx = {p->graph, outputs, n_outputs, opts};
    deft_status s = deft_checkpoint_rewrite(p->graph, outputs, n_outputs, opts, p, deft_trial_measure, &ctx, &p->ckpt);
    if (s == DEFT_OK) p->n_nodes = p->graph->n_nodes;
    return s;
}

/* An original node that a copy computes reads its value there (an output asked for by the user's tensor). */
static void deft_link_copies(deft_program *p) {
    for (int id = 0; p->ckpt && id < p->ckpt->n_orig; id++)
        if (p->ckpt->redirect[id] >= 0) p->nodes[id].redirect = p->ckpt->redirect[id];
    for (int id = 0; p->split && id < p->split->n_after; id++)
        if (p->split->redirect[id] >= 0) p->nodes[id].redirect = p->split->redirect[id];
}

/* Checkpointing (when asked, and under autocast for the casts of inputs: graph/checkpoint.h) rewrites the step that
 * autocast (when asked) made: outputs are what the program computes, user the tensors it was asked for. */
static deft_status deft_build(deft_program *p, deft_tensor *const *outputs, deft_tensor *const *user, int n_outputs,
                              const deft_compile_options *opts, bool allocate) {
    deft_status s = DEFT_OK;
    if (opts && (opts->checkpoint != DEFT_CHECKPOINT_NONE || opts->autocast != DEFT_F32))
        s = deft_checkpoint(p, outputs, n_outputs, opts);
    if (s == DEFT_OK)
        s = deft_split_steps(p->graph, outputs, n_outputs, opts, p->ckpt ? p->ckpt->redirect : NULL, p, &p->split);
    if (s == DEFT_OK) p->n_nodes = p->graph->n_nodes;
    const int *redirect = p->split ? p->split->redirect : p->ckpt ? p->ckpt->redirect : NULL;
    if (s == DEFT_OK) s = deft_build_plan(p, outputs, user, n_outputs, opts, redirect, 1);
    if (s == DEFT_OK) deft_link_copies(p);
    if (s == DEFT_OK) s = deft_check_budget(p, opts ? opts->memory_budget : 0);
    if (!allocate) return s;
    p->pinned_host = s == DEFT_OK && deft_program_touches_gpu(p);
    bool *uploaded = calloc((size_t)(p->n_nodes ? p->n_nodes : 1), sizeof *uploaded);
    if (!uploaded) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    if (s == DEFT_OK) s = deft_autocast_configure_steps(p, opts);
    if (s == DEFT_OK) p->persistent_bytes = deft_persistent_bytes(p);   /* loss scaling keeps flat gradients */
    if (s == DEFT_OK) s = deft_place_persistent(p, uploaded);
    if (s == DEFT_OK) s = deft_check_device_room(p);
    if (s == DEFT_OK) s = deft_alloc_arenas(p);
    if (s == DEFT_OK) s = deft_program_gpu_init(p, !(opts && opts->no_cuda_graphs));
    if (s == DEFT_OK) s = deft_ddp_attach(p, opts);
    if (s != DEFT_OK) deft_release_uploads(p, uploaded);
    free(uploaded);
    return s;
}

static deft_status deft_compile_with(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                                     const deft_compile_options *opts, bool allocate, deft_program **out) {
    *out = NULL;
    deft_status s = deft_check_outputs(g, outputs, n_outputs);
    deft_tensor **mapped = NULL;
    if (s == DEFT_OK) s = deft_autocast_outputs(g, opts, outputs, n_outputs, &mapped);
    if (s != DEFT_OK) return s;
    deft_program *p = calloc(1, sizeof *p);
    if (!p) {
        free(mapped);
        return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    }
    p->graph = g;
    p->n_nodes = g->n_nodes;
    p->gpu.device = -1;
    s = deft_graph_add_program(g, p);
    if (s != DEFT_OK) {
        free(p);
        free(mapped);
        return s;
    }
    s = deft_build(p, mapped ? mapped : outputs, outputs, n_outputs, opts, allocate);
    free(mapped);
    if (s != DEFT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", deft_errmsg());
        deft_program_free(p);
        return deft_set_error(s, "%s", msg);
    }
    *out = p;
    return DEFT_OK;
}

deft_status deft_compile_into(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                              const deft_compile_options *opts, deft_program **out) {
    return deft_compile_with(g, outputs, n_outputs, opts, true, out);
}

deft_status deft_plan_memory(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                             const deft_compile_options *opts, deft_memory_report *out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "plan_memory: report is NULL");
    deft_program *p;
    deft_status s = deft_compile_with(g, outputs, n_outputs, opts, false, &p);
    if (s != DEFT_OK) return s;
    s = deft_program_memory(p, out);
    deft_program_free(p);
    return s;
}

deft_program *deft_compile(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                           const deft_compile_options *opts) {
    deft_program *p;
    deft_compile_into(g, outputs, n_outputs, opts, &p);
    return p;
}

/* Whether no other program of the graph covers the nodes from p's copies on (they may then leave the graph). */
static bool deft_copies_unshared(const deft_program *p) {
    if (!p->ckpt) return false;
    for (int i = 0; i < p->graph->n_programs; i++)
        if (p->graph->programs[i] != p && p->graph->programs[i]->n_nodes > p->ckpt->n_orig) return false;
    return true;
}

/* The same for the nodes optimizer in backward made (after the checkpoint copies, and taken out before them). */
static bool deft_split_unshared(const deft_program *p) {
    if (!p->split) return false;
    for (int i = 0; i < p->graph->n_programs; i++)
        if (p->graph->programs[i] != p && p->graph->programs[i]->n_nodes > p->split->n_before) return false;
    return true;
}

void deft_program_free(deft_program *p) {
    if (!p) return;
    /* Work still queued on the program's stream reads its arenas: finish it before they go back to the cache. */
    if (p->gpu.device >= 0) (void)deft_device_synchronize(deft_cuda(p->gpu.device));
    deft_ddp_free(p);   /* its events and stream, before the program's */
    deft_program_gpu_free(p);
    deft_prefetch_free(p);   /* the second input slots; the first ones go below */
    for (int a = 0; a < p->n_arenas; a++) deft_program_host_free(p, p->arenas[a].device, p->arenas[a].base);
    for (int id = 0; p->nodes && id < p->n_nodes; id++)
        if (p->nodes[id].input_storage)
            deft_program_host_free(p, p->graph->nodes[id]->device, p->nodes[id].input_storage);
    deft_graph_remove_program(p->graph, p);
    deft_opt_split_free(deft_split_unshared(p) ? p->graph : NULL, p->split);
    deft_ckpt_plan_free(deft_copies_unshared(p) ? p->graph : NULL, p->ckpt);
    deft_program_groups_free(p);
    free(p->nodes);
    free(p->steps);
    free(p->outputs);
    free(p->buffers);
    free(p->alias);
    free(p);
}

void *deft_program_data(const deft_program *p, int id) {
    if (p->alias) id = p->alias[id];
    if (p->nodes[id].redirect > 0) id = p->nodes[id].redirect;
    const deft_node_state *s = &p->nodes[id];
    int base = deft_view_base(p->graph, id, NULL);
    const deft_tensor *b = p->graph->nodes[base];
    char *ptr;
    if (b->op == DEFT_OP_INPUT) ptr = p->nodes[base].input_storage;
    else if (deft_op_is_leaf(b->op)) ptr = b->device.type == DEFT_CPU ? b->host_data : b->dev_data;
    else ptr = (char *)p->arenas[s->arena].base + p->buffers[s->buffer].plan.offset;
    return ptr ? ptr + s->offset : NULL;
}
