/* Reports of what the planner decided: numbers, a table, and per-node facts for the DOT dump. */
#include <stdio.h>
#include <string.h>

#include "activation_bytes.h"
#include "checkpoint.h"
#include "cuda_kernels.h"
#include "optimizer.h"
#include "program_state.h"

int deft_program_schedules(const deft_program *p, const deft_tensor *t) {
    return p && t && t->graph == p->graph && t->id < p->n_nodes && p->nodes[t->id].needed;
}

void deft_program_node_plan(const deft_program *p, const deft_tensor *t, deft_node_plan *out) {
    *out = (deft_node_plan){DEFT_PLACE_NONE, -1, 0, 0, -1, -1, -1, 0, -1, 0, 0, 0};
    out->dropped = p && p->ckpt && t && t->graph == p->graph && t->id < p->ckpt->n_orig && p->ckpt->dropped[t->id];
    out->recompute = t && t->ckpt_role == DEFT_CKPT_RECOMPUTE;
    if (!deft_program_schedules(p, t)) return;
    const deft_node_state *s = &p->nodes[t->id];
    out->step = s->step;
    out->is_output = s->is_output;
    out->group = s->group;
    out->side = s->step >= 0 && p->nodes[p->steps[s->step]].side;
    out->size = deft_tensor_bytes(t);
    if (s->buffer < 0 && s->group >= 0) {
        out->place = DEFT_PLACE_FUSED;
        return;
    }
    if (s->buffer < 0) {
        out->place = DEFT_PLACE_PERSISTENT;
        out->size = deft_tensor_bytes(t);
        return;
    }
    const deft_buffer *b = &p->buffers[s->buffer];
    out->place = t->is_view ? DEFT_PLACE_VIEW : DEFT_PLACE_ARENA;
    out->offset = b->plan.offset + s->offset;
    out->size = deft_node_buffer_bytes(t);   /* attention's statistics included (graph_internal.h) */
    out->first = b->plan.first;
    out->last = b->plan.last;
    out->buffer = s->buffer;
}

static size_t deft_workspaces_used(const deft_program *p, deft_device d);

/* The scratch over every GPU the program touches (each counted once). */
static size_t deft_program_workspace_bytes(const deft_program *p) {
    int seen[DEFT_MAX_ARENAS], n = 0;
    size_t sum = 0;
    for (int id = 0; p->nodes && id < p->n_nodes; id++) {
        const deft_device d = p->graph->nodes[id]->device;
        if (!p->nodes[id].needed || d.type != DEFT_CUDA) continue;
        bool dup = false;
        for (int i = 0; i < n; i++) dup = dup || seen[i] == d.index;
        if (dup || n == DEFT_MAX_ARENAS) continue;
        seen[n++] = d.index;
        sum += deft_workspaces_used(p, d);
    }
    return sum;
}

deft_status deft_program_memory(const deft_program *p, deft_memory_report *out) {
    if (!p || !out) return deft_set_error(DEFT_ERR_INVALID, "program_memory: NULL argument");
    *out = (deft_memory_report){0};
    for (int a = 0; a < p->n_arenas; a++) {
        out->arena_bytes += p->arenas[a].bytes;
        out->lower_bound_bytes += p->arenas[a].lower_bound;
        out->no_reuse_bytes += p->arenas[a].no_reuse_bytes;
    }
    out->persistent_bytes = p->persistent_bytes;
    for (int b = 0; b < p->n_buffers; b++) out->buffers += p->buffers[b].merged_into < 0;
    out->workspace_bytes = deft_program_workspace_bytes(p);
    return DEFT_OK;
}

deft_status deft_program_checkpoint(const deft_program *p, deft_checkpoint_report *out) {
    if (!p || !out) return deft_set_error(DEFT_ERR_INVALID, "program_checkpoint: NULL argument");
    *out = (deft_checkpoint_report){0};
    for (int a = 0; a < p->n_arenas; a++) out->arena_bytes += p->arenas[a].bytes;
    out->peak_bytes = out->arena_bytes + p->persistent_bytes;
    out->peak_bytes_without = out->peak_bytes;
    const deft_ckpt_plan *c = p->ckpt;
    if (!c) return DEFT_OK;
    out->policy = c->policy;
    out->dropped = c->n_dropped;
    out->dropped_bytes = c->dropped_bytes;
    out->recomputed = c->n_recompute;
    out->recompute_flops = c->recompute_flops;
    out->recompute_bytes = c->recompute_bytes;
    out->peak_bytes_without = c->total_without;
    return DEFT_OK;
}

static const char *deft_policy_name(int policy) {
    switch (policy) {
    case DEFT_CHECKPOINT_BUDGET: return "least recompute within the budget";
    case DEFT_CHECKPOINT_MARKED: return "marked spans";
    case DEFT_CHECKPOINT_SEGMENTS: return "segments";
    default: return "none; autocast recasts its inputs";
    }
}

/* What was dropped, what runs again to get it back, and what that bought. */
static void deft_print_checkpoint(const deft_program *p, FILE *f) {
    deft_checkpoint_report r;
    deft_program_checkpoint(p, &r);
    const deft_ckpt_plan *c = p->ckpt;
    fprintf(f, "  checkpointing (%s): %d activations dropped (%zu bytes; %d autocast casts of inputs, %d made again by "
               "one pass), %d nodes recomputed (%.4g GFLOP, %.4g GB moved); peak %zu bytes, %zu without\n",
            deft_policy_name(r.policy), r.dropped, r.dropped_bytes, c->n_recast, c->n_cheap, r.recomputed,
            r.recompute_flops / 1e9, r.recompute_bytes / 1e9, r.peak_bytes, r.peak_bytes_without);
    for (int id = 0; id < c->n_orig; id++)
        if (c->dropped[id])
            fprintf(f, "    dropped    %-24s %-10s %12zu bytes\n", p->graph->nodes[id]->name,
                    deft_op_name(p->graph->nodes[id]->op), deft_tensor_bytes(p->graph->nodes[id]));
    for (int id = c->n_orig; id < c->n_total && id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        /* Before the schedule (a compile stopped early) nothing is marked needed yet: every copy is listed. */
        if (t->ckpt_role != DEFT_CKPT_RECOMPUTE || t->is_view || (p->steps && !p->nodes[id].needed)) continue;
        double fl, by;
        deft_op_cost(t, &fl, &by);
        fprintf(f, "    recompute  %-24s %-10s %12.4g FLOP %12.4g bytes moved\n", t->ckpt_origin->name,
                deft_op_name(t->op), fl, by);
    }
}

/* The table's name and op columns are as wide as their longest entry (names run to 63 characters, op names past
 * 20), so that every row's columns line up whatever the graph's names. */
static void deft_buffer_widths(const deft_program *p, int *name_w, int *op_w) {
    *name_w = 24;
    *op_w = 10;
    for (int b = 0; b < p->n_buffers; b++) {
        if (p->buffers[b].merged_into >= 0) continue;
        const deft_tensor *t = p->graph->nodes[p->buffers[b].node];
        const int n = (int)strlen(t->name), o = (int)strlen(deft_op_name(t->op));
        if (n > *name_w) *name_w = n;
        if (o > *op_w) *op_w = o;
    }
}

static void deft_print_buffers(const deft_program *p, FILE *f) {
    int nw, ow;
    deft_buffer_widths(p, &nw, &ow);
    fprintf(f, "  %-*s %-*s %12s %12s %6s %6s\n", nw, "buffer", ow, "op", "offset", "bytes", "first", "last");
    for (int b = 0; b < p->n_buffers; b++) {
        const deft_buffer *buf = &p->buffers[b];
        if (buf->merged_into >= 0) continue;
        const deft_tensor *t = p->graph->nodes[buf->node];
        fprintf(f, "  %-*s %-*s %12zu %12zu %6d %6d\n", nw, t->name, ow, deft_op_name(t->op), buf->plan.offset,
                buf->plan.size, buf->plan.first, buf->plan.last);
    }
}

deft_status deft_program_print_plan(const deft_program *p, void *file) {
    if (!p) return deft_set_error(DEFT_ERR_INVALID, "print_plan: program is NULL");
    FILE *f = file ? (FILE *)file : stdout;
    deft_memory_report r;
    deft_program_memory(p, &r);
    fprintf(f, "memory plan: %d steps, %d buffers (%d ops ran in place)\n", p->n_steps, r.buffers,
            p->n_buffers - r.buffers);
    if (p->stopped_after) fprintf(f, "  compile stopped after stage %s: not runnable\n", p->stopped_after);
    for (int a = 0; a < p->n_arenas; a++) {
        char d[32];
        const deft_arena *ar = &p->arenas[a];
        fprintf(f, "  arena %-8s %12zu bytes (lower bound %zu, without reuse %zu)\n",
                deft_device_str(ar->device, d, sizeof d), ar->bytes, ar->lower_bound, ar->no_reuse_bytes);
    }
    fprintf(f, "  persistent    %12zu bytes\n", r.persistent_bytes);
    if (p->ckpt) deft_print_checkpoint(p, f);
    deft_print_buffers(p, f);
    return DEFT_OK;
}

static int deft_footprint_slot(deft_device_footprint *fp, int *n, int max, deft_device d) {
    for (int i = 0; i < *n; i++)
        if (deft_device_equal(fp[i].device, d)) return i;
    if (*n == max) return -1;
    fp[*n] = (deft_device_footprint){.device = d};
    return (*n)++;
}

/* The scratch of the program's streams on d (mem/cuda_workspace.cu). Once it has run, what they hold: what the
 * algorithms chosen for its steps asked for. Before, the most they may hold: on the main stream cuBLAS's cap if it
 * multiplies matrices there, cuDNN's if it convolves, batch norm's if it sums per channel (batch statistics, gradient
 * sums); on the side lane (passes/side_lane.h) the smaller caps, as its steps need them. */
static size_t deft_workspaces_used(const deft_program *p, deft_device d) {
    if (d.type != DEFT_CUDA || !deft_has_cuda_build()) return 0;
    if (p->workspace_noted) {
        for (int i = 0; i < p->n_workspace; i++)
            if (p->workspace_device[i] == d.index) return p->workspace_bytes[i];
        return 0;
    }
    bool cublas[2] = {false, false}, cudnn[2] = {false, false}, norm = false;
    for (int id = 0; id < p->n_nodes; id++) {   /* every node, as a product may be a fused group's member */
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed || !deft_device_equal(t->device, d)) continue;
        const int side = p->nodes[id].step >= 0 && p->nodes[p->steps[p->nodes[id].step]].side;
        cublas[side] = cublas[side] || t->op == DEFT_OP_MATMUL;
        cudnn[side] = cudnn[side] || deft_op_is_conv(t->op);
        norm = norm || (t->op == DEFT_OP_BN_STATS && t->p.bn.batch) || t->op == DEFT_OP_BATCH_NORM_WEIGHT_GRAD;
    }
    return (cublas[0] ? DEFT_CUBLAS_WORKSPACE_BYTES : 0) + (cudnn[0] ? DEFT_CUDNN_WORKSPACE_BYTES : 0) +
           (cublas[1] ? DEFT_CUBLAS_SIDE_WORKSPACE_BYTES : 0) + (cudnn[1] ? DEFT_CUDNN_SIDE_WORKSPACE_BYTES : 0) +
           (norm ? DEFT_NORM_WORKSPACE_BYTES : 0);
}

deft_status deft_program_footprint(const deft_program *p, deft_device_footprint *out, int max, int *n) {
    if (!p || !out || !n || max <= 0) return deft_set_error(DEFT_ERR_INVALID, "program_footprint: bad argument");
    *n = 0;
    int full = 0;
    size_t act[DEFT_MAX_ARENAS];
    deft_status s = deft_activation_peaks(p, act);
    if (s != DEFT_OK) return s;
    for (int a = 0; a < p->n_arenas; a++) {
        int i = deft_footprint_slot(out, n, max, p->arenas[a].device);
        if (i < 0) full = 1;
        else out[i].arena_bytes += p->arenas[a].bytes, out[i].activation_bytes += act[a];
    }
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed) continue;
        size_t bytes = deft_op_is_leaf(t->op) ? deft_tensor_bytes(t)
                       : t->op == DEFT_OP_OPTIMIZER ? deft_optimizer_state_bytes(t->p.optimizer) : 0;
        if (!bytes) continue;
        int i = deft_footprint_slot(out, n, max, t->device);
        if (i < 0) full = 1;
        else out[i].persistent_bytes += bytes;
    }
    for (int i = 0; i < *n; i++) {
        out[i].workspace_bytes = deft_workspaces_used(p, out[i].device);
        out[i].total_bytes = out[i].persistent_bytes + out[i].arena_bytes + out[i].workspace_bytes;
    }
    if (full)
        return deft_set_error(DEFT_ERR_INVALID, "program_footprint: the program touches more than %d devices", max);
    return DEFT_OK;
}
