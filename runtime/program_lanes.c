/* A program's streams, one per GPU, and the events between them (runtime/program_lanes.h says how they order). */
#include <stdlib.h>
#include <string.h>

#include "prefetch.h"
#include "program_graph.h"
#include "program_run.h"
#include "program_state.h"

int deft_program_touches_gpu(const deft_program *p) {
    for (int id = 0; id < p->n_nodes; id++)
        if (p->nodes[id].needed && p->graph->nodes[id]->device.type == DEFT_CUDA) return 1;
    return 0;
}

/* The lane of a device's memory or work; the host's (n) for the CPU. */
static int deft_lane_of(const deft_lanes *L, deft_device d) {
    if (d.type != DEFT_CUDA) return L->n;
    for (int i = 0; i < L->n; i++)
        if (L->device[i] == d.index) return i;
    return L->n;
}

int deft_lanes_step_lane(const deft_program *p, int id) {
    if (p->gpu->lanes.side && p->nodes[id].side) return p->gpu->lanes.side;
    return deft_lane_of(&p->gpu->lanes, deft_step_device(p->graph->nodes[id]));
}

static deft_status deft_lanes_add(deft_lanes *L, deft_device d) {
    if (d.type != DEFT_CUDA || deft_lane_of(L, d) < L->n) return DEFT_OK;
    if (L->n == DEFT_MAX_LANES)
        return deft_set_error(DEFT_ERR_DEVICE, "compile: the program touches more than %d GPUs", DEFT_MAX_LANES);
    L->device[L->n++] = d.index;
    return DEFT_OK;
}

/* Lane 0 is the GPU of the first step that runs on one; then the other GPUs in step order, then those that only
 * hold leaves. */
static deft_status deft_lanes_find(deft_program *p) {
    deft_lanes *L = &p->gpu->lanes;
    deft_status s = DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < p->n_steps; i++) {
        deft_device d = deft_step_device(p->graph->nodes[p->steps[i]]);
        s = deft_lanes_add(L, d);
    }
    for (int id = 0; s == DEFT_OK && id < p->n_nodes; id++)
        if (p->nodes[id].needed) s = deft_lanes_add(L, p->graph->nodes[id]->device);
    bool side = false;
    for (int i = 0; s == DEFT_OK && L->n > 0 && i < p->n_steps; i++) {
        L->host_steps += deft_lanes_step_lane(p, p->steps[i]) == L->n;
        side = side || p->nodes[p->steps[i]].side;
    }
    /* The side lane: its steps were marked only where every step runs on this one GPU. */
    if (s == DEFT_OK && side && L->n == 1 && !L->host_steps) {
        L->side = L->n;
        L->device[L->n++] = L->device[0];
    }
    return s;
}

/* Peer access makes copies between the GPUs direct; without it they are staged through the host, still right. */
static deft_status deft_lanes_enable_peers(const deft_lanes *L) {
    for (int i = 0; i < L->n; i++)
        for (int j = 0; j < L->n; j++) {
            if (L->device[i] == L->device[j]) continue;   /* the side lane shares its GPU with lane 0 */
            deft_status s = deft_cuda_peer_enable(L->device[i], L->device[j]);
            if (s != DEFT_OK) return s;
        }
    return DEFT_OK;
}

/* One event per side step of a run. */
static deft_status deft_lanes_side_events(deft_program *p) {
    deft_lanes *L = &p->gpu->lanes;
    if (!L->side) return DEFT_OK;
    int n = 0;
    for (int i = 0; i < p->n_steps; i++) n += deft_lanes_step_lane(p, p->steps[i]) == L->side;
    if (n == 0) return DEFT_OK;
    L->side_events = calloc((size_t)n, sizeof *L->side_events);
    if (!L->side_events) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory for the side lane's events");
    deft_status s = DEFT_OK;
    for (; s == DEFT_OK && L->n_side_events < n; L->n_side_events++)
        s = deft_prefetch_cuda_event_new(L->device[L->side], &L->side_events[L->n_side_events]);
    if (s != DEFT_OK) L->n_side_events--;   /* the one that failed was not made */
    return s;
}

deft_status deft_lanes_init(deft_program *p) {
    deft_lanes *L = &p->gpu->lanes;
    memset(L, 0, sizeof *L);
    deft_status s = deft_lanes_find(p);
    for (int i = 0; s == DEFT_OK && i < L->n; i++) {
        s = deft_cuda_stream_create(L->device[i], L->side && i == L->side, &L->stream[i]);
        if (s == DEFT_OK) s = deft_prefetch_cuda_event_new(L->device[i], &L->event[i]);
    }
    if (s == DEFT_OK && L->n > 0) s = deft_prefetch_cuda_event_new(L->device[0], &L->fork);
    if (s == DEFT_OK) s = deft_lanes_side_events(p);
    if (s == DEFT_OK) s = deft_lanes_enable_peers(L);
    if (s != DEFT_OK) deft_lanes_free(p);
    return s;
}

void deft_lanes_free(deft_program *p) {
    deft_lanes *L = &p->gpu->lanes;
    for (int i = 0; i < L->n; i++) {
        if (L->stream[i]) (void)deft_cuda_stream_sync(L->device[i], L->stream[i]);
        deft_prefetch_cuda_event_free(L->device[i], L->event[i]);
        deft_cuda_stream_destroy(L->device[i], L->stream[i]);
    }
    if (L->n > 0) deft_prefetch_cuda_event_free(L->device[0], L->fork);
    for (int j = 0; j < L->n_side_events; j++) deft_prefetch_cuda_event_free(L->device[L->side], L->side_events[j]);
    free(L->side_events);
    deft_hazards_free(&L->hazards);
    memset(L, 0, sizeof *L);
}

/* Lane l (or the host) waits for everything queued on lane k so far. */
static deft_status deft_lane_wait(deft_lanes *L, int l, int k) {
    deft_status s = deft_prefetch_cuda_record(L->device[k], L->event[k], L->stream[k]);
    if (s == DEFT_OK && l == L->n) s = deft_prefetch_cuda_event_sync(L->device[k], L->event[k]);
    else if (s == DEFT_OK) s = deft_prefetch_cuda_stream_wait(L->device[l], L->stream[l], L->event[k]);
    if (s == DEFT_OK) deft_hazards_waited(&L->hazards, l, k);
    return s;
}

/* Lane l (or the host) waits for lane k through k's step count `at`: on the event of that step where k is the side
 * lane, which records one after each step; otherwise on everything k queued so far. */
static deft_status deft_lane_wait_upto(deft_lanes *L, int l, int k, int64_t at) {
    if (!L->side || k != L->side || at < 1 || at > L->n_side_events) return deft_lane_wait(L, l, k);
    void *ev = L->side_events[at - 1];
    deft_status s = l == L->n ? deft_prefetch_cuda_event_sync(L->device[k], ev)
                              : deft_prefetch_cuda_stream_wait(L->device[l], L->stream[l], ev);
    if (s == DEFT_OK) deft_hazards_waited_upto(&L->hazards, l, k, at);
    return s;
}

static deft_range deft_node_range(const deft_program *p, int id, bool write) {
    const deft_tensor *t = p->graph->nodes[id];
    const uintptr_t lo = (uintptr_t)deft_program_data(p, id);
    return (deft_range){deft_lane_of(&p->gpu->lanes, t->device), lo, lo + deft_node_buffer_bytes(t), write};
}

static bool deft_in(const int *ids, int n, int id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

/* What step id reads and writes: its node's value and its inputs'; for a fused group, the members it stores (the
 * others never reach memory) and what its members read from outside it. An optimizer writes parameters that are not
 * its inputs, and a step may touch more ranges than r holds: those are taken to write all of their GPU's memory. */
static int deft_step_ranges(const deft_program *p, int id, deft_range *r, int max) {
    const deft_tensor *t = p->graph->nodes[id];
    const deft_range all = {deft_lane_of(&p->gpu->lanes, t->device), 0, UINTPTR_MAX, true};
    if (t->op == DEFT_OP_OPTIMIZER) {
        r[0] = all;
        return 1;
    }
    const deft_group *g = p->nodes[id].group >= 0 ? &p->groups[p->nodes[id].group] : NULL;
    const int n_members = g ? g->n_members : 1;
    int n = 0;
    for (int m = 0; m < n_members; m++) {
        const deft_tensor *node = p->graph->nodes[g ? g->members[m] : id];
        if (n + 1 + node->nsrc > max) {
            r[0] = all;
            return 1;
        }
        if (!g || deft_in(g->stores, g->n_stores, node->id)) r[n++] = deft_node_range(p, node->id, true);
        for (int k = 0; k < node->nsrc; k++) {
            const int src = node->src[k]->id;   /* a member, or a view of one, is within a store or never stored */
            if (!g || !deft_in(g->members, g->n_members, deft_view_base(p->graph, src, NULL)))
                r[n++] = deft_node_range(p, src, false);
        }
    }
    return n;
}

/* One GPU and no host step: one stream, in order, nothing to wait for. */
static bool deft_lanes_one_stream(const deft_lanes *L) { return L->n == 1 && !L->host_steps; }

deft_status deft_lanes_begin_run(deft_program *p) {
    deft_lanes *L = &p->gpu->lanes;
    deft_hazards_reset(&L->hazards, L->n);
    memset(L->forked, 0, sizeof L->forked);
    if (L->n == 0 || deft_lanes_one_stream(L)) return DEFT_OK;
    deft_status s = deft_prefetch_cuda_record(L->device[0], L->fork, L->stream[0]);
    /* The previous run may still be copying into the host memory that this run's host steps use. */
    if (s == DEFT_OK && L->host_steps) s = deft_prefetch_cuda_event_sync(L->device[0], L->fork);
    return s;
}

deft_status deft_lanes_before_step(deft_program *p, int id, void **stream) {
    deft_lanes *L = &p->gpu->lanes;
    *stream = L->n ? L->stream[0] : NULL;
    if (L->n == 0 || deft_lanes_one_stream(L)) return DEFT_OK;
    *stream = NULL;
    const int l = deft_lanes_step_lane(p, id);
    deft_status s = DEFT_OK;
    if (l > 0 && l < L->n && !L->forked[l]) {
        s = deft_prefetch_cuda_stream_wait(L->device[l], L->stream[l], L->fork);
        L->forked[l] = s == DEFT_OK;
    }
    L->n_ranges = deft_step_ranges(p, id, L->ranges, DEFT_STEP_RANGES);
    int64_t upto[DEFT_MAX_LANES];
    const uint32_t waits = deft_hazards_waits_upto(&L->hazards, l, L->ranges, L->n_ranges, upto);
    for (int k = 0; s == DEFT_OK && k < L->n; k++)
        if (waits & (1u << k)) s = deft_lane_wait_upto(L, l, k, upto[k]);
    if (s == DEFT_OK && l < L->n) *stream = L->stream[l];
    return s;
}

deft_status deft_lanes_after_step(deft_program *p, int id) {
    deft_lanes *L = &p->gpu->lanes;
    if (L->n == 0 || deft_lanes_one_stream(L)) return DEFT_OK;
    const int l = deft_lanes_step_lane(p, id);
    deft_status s = deft_hazards_queued(&L->hazards, l, L->ranges, L->n_ranges);
    const bool side = L->side && l == L->side;
    const int64_t j = side ? L->hazards.issued[l] - 1 : -1;
    if (s == DEFT_OK && side && j < L->n_side_events)
        s = deft_prefetch_cuda_record(L->device[l], L->side_events[j], L->stream[l]);
    return s;
}

deft_status deft_lanes_end_run(deft_program *p) {
    deft_lanes *L = &p->gpu->lanes;
    deft_status first = DEFT_OK;
    for (int k = 1; k < L->n; k++) {
        if (!L->forked[k]) continue;
        deft_status s = deft_lane_wait(L, 0, k);
        if (first == DEFT_OK) first = s;
    }
    return first;
}

deft_status deft_lanes_wait_idle(deft_program *p) {
    deft_lanes *L = &p->gpu->lanes;
    return L->n ? deft_cuda_stream_sync(L->device[0], L->stream[0]) : DEFT_OK;
}
