/* Whether a program's step can be one CUDA Graph replay, and the warm-up, capture, replay sequence. A step on one
 * GPU, with copies from and to the host, is one graph, captured from lane 0's stream, which forks any other lanes
 * into the capture and joins them back (runtime/program_lanes.c), over one GPU or several. The CUDA calls are in
 * runtime/program_graph_cuda.c. */
#include <stdio.h>

#include "program_graph.h"
#include "program_state.h"

/* A copy from a parameter or constant on the CPU reads the graph's own (pageable) memory, which a captured copy
 * cannot use; the copy's source, or NULL. */
static const deft_tensor *deft_pageable_source(const deft_program *p, const deft_tensor *t) {
    if (t->op != DEFT_OP_COPY || t->src[0]->device.type != DEFT_CPU) return NULL;
    const deft_tensor *base = p->graph->nodes[deft_view_base(p->graph, t->src[0]->id, NULL)];
    return base->op == DEFT_OP_PARAM || base->op == DEFT_OP_CONSTANT ? base : NULL;
}

/* The reason a replay could not stand for an eager run, written to why[n]; 0 when it can. */
static int deft_graph_blocker(const deft_program *p, char *why, size_t n) {
    const deft_lanes *L = &p->gpu->lanes;
    if (L->host_steps == p->n_steps) {   /* the GPUs only hold leaves (an output that is an input, say) */
        snprintf(why, n, "no step runs on a GPU");
        return 1;
    }
    for (int i = 0; i < p->n_steps; i++) {
        const deft_tensor *t = p->graph->nodes[p->steps[i]];
        const deft_tensor *pageable = deft_pageable_source(p, t);
        if (deft_lanes_step_lane(p, p->steps[i]) == L->n) {
            snprintf(why, n,
                     "step %d (%.40s, %s) runs on the cpu, which a CUDA Graph cannot hold: every run is eager, the "
                     "host waiting for the GPUs only around its steps",
                     i, t->name, deft_op_name(t->op));
            return 1;
        }
        if (pageable) {
            snprintf(why, n,
                     "step %d (%.40s) copies %.40s from pageable cpu memory, which a CUDA Graph cannot copy from "
                     "(put it on the GPU, or make it an input)",
                     i, t->name, pageable->name);
            return 1;
        }
        if (t->op == DEFT_OP_DROPOUT) {
            snprintf(why, n, "dropout draws a new mask each run, which a replay would repeat");
            return 1;
        }
    }
    return 0;
}

deft_status deft_program_gpu_init(deft_program *p, int allow_graphs) {
    deft_program_gpu *g = p->gpu;
    *g = (deft_program_gpu){.device = -1};
    deft_status s = deft_lanes_init(p);
    if (s != DEFT_OK) return s;
    if (g->lanes.n == 0) {
        snprintf(g->why_eager, sizeof g->why_eager, "no step runs on a GPU");
        return DEFT_OK;
    }
    g->device = g->lanes.device[0];
    g->stream = g->lanes.stream[0];
    if (deft_graph_blocker(p, g->why_eager, sizeof g->why_eager)) return DEFT_OK;
    g->state = allow_graphs ? DEFT_GRAPH_WARMUP : DEFT_GRAPH_OFF;
    snprintf(g->why_eager, sizeof g->why_eager, "%s",
             allow_graphs ? "not captured yet (the first run is eager)" : "CUDA Graphs turned off by the compile option");
    return DEFT_OK;
}

static void deft_drop_execs(deft_program_gpu *g) {
    for (int i = 0; i < DEFT_GRAPH_EXECS; i++) {
        deft_cuda_graph_destroy(g->device, g->execs[i].graph, g->execs[i].exec);
        g->execs[i] = (deft_graph_exec){0};
    }
}

void deft_program_gpu_free(deft_program *p) {
    deft_program_gpu *g = p->gpu;
    (void)deft_lanes_wait_idle(p);   /* a replay in flight still uses its graph, and every lane (joined into 0) */
    if (g->device >= 0) deft_drop_execs(g);
    deft_lanes_free(p);
    g->device = -1;
    g->stream = NULL;
}

static deft_graph_exec *deft_find_exec(deft_program_gpu *g, uint64_t key) {
    for (int i = 0; i < DEFT_GRAPH_EXECS; i++)
        if (g->execs[i].exec && g->execs[i].key == key) return &g->execs[i];
    return NULL;
}

/* An unused entry, or the one launched longest ago (its graph is destroyed: it is captured again if met again). */
static deft_graph_exec *deft_free_exec(deft_program_gpu *g) {
    deft_graph_exec *e = &g->execs[0];
    for (int i = 0; i < DEFT_GRAPH_EXECS; i++) {
        if (!g->execs[i].exec) return &g->execs[i];
        if (g->execs[i].last_used < e->last_used) e = &g->execs[i];
    }
    deft_cuda_graph_destroy(g->device, e->graph, e->exec);
    *e = (deft_graph_exec){0};
    return e;
}

static deft_status deft_launch(deft_program_gpu *g, deft_graph_exec *e) {
    e->last_used = ++g->launches;
    g->replays++;
    return deft_cuda_graph_launch(g->device, e->exec, g->stream);
}

/* Captures the step for the current slot key and launches it. A failed capture leaves the program eager for good,
 * with the reason kept, and runs this step eagerly; so does a step that cannot run under capture (DEFT_ERR_STATE). */
static deft_status deft_capture_and_launch(deft_program *p, deft_status (*run_steps)(deft_program *, void *)) {
    deft_program_gpu *g = p->gpu;
    deft_graph_exec *e = deft_free_exec(g);
    void *graph = NULL, *exec = NULL;
    deft_status s = deft_cuda_capture_begin(g->device, g->stream);
    deft_status ran = s == DEFT_OK ? run_steps(p, g->stream) : s;
    if (s == DEFT_OK) s = deft_cuda_capture_end(g->device, g->stream, &graph, &exec);
    if (ran == DEFT_OK && s == DEFT_OK) {
        *e = (deft_graph_exec){.key = g->key, .graph = graph, .exec = exec};
        g->captures++;
        g->state = DEFT_GRAPH_READY;
        snprintf(g->why_eager, sizeof g->why_eager, "replaying a CUDA Graph");
        return deft_launch(g, e);
    }
    if (s == DEFT_OK && ran != DEFT_OK && ran != DEFT_ERR_STATE) {
        /* A step failed (a launch, memory) while the capture itself went well: that is the run's error, not the
         * graph's, so it is returned and the next run captures again. Captured work never ran. */
        char msg[768];
        snprintf(msg, sizeof msg, "%s", deft_errmsg());
        deft_cuda_graph_destroy(g->device, graph, exec);
        return deft_set_error(ran, "%s (while capturing a CUDA Graph: no step of this run was executed)", msg);
    }
    snprintf(g->why_eager, sizeof g->why_eager, "capture failed: %.140s", deft_errmsg());
    deft_cuda_graph_destroy(g->device, graph, exec);
    deft_drop_execs(g);
    g->state = DEFT_GRAPH_OFF;
    return run_steps(p, g->stream);
}

deft_status deft_program_gpu_run(deft_program *p, deft_status (*run_steps)(deft_program *, void *)) {
    deft_program_gpu *g = p->gpu;
    switch (g->state) {
    case DEFT_GRAPH_READY: {
        deft_graph_exec *e = deft_find_exec(g, g->key);
        return e ? deft_launch(g, e) : deft_capture_and_launch(p, run_steps);
    }
    case DEFT_GRAPH_CAPTURE: return deft_capture_and_launch(p, run_steps);
    case DEFT_GRAPH_WARMUP: {
        deft_status s = run_steps(p, g->stream);
        if (s == DEFT_OK) g->state = DEFT_GRAPH_CAPTURE;
        return s;
    }
    case DEFT_GRAPH_OFF: break;
    }
    return run_steps(p, g->stream);
}

size_t deft_program_gpu_workspace(const deft_program *p, int device, int asked) {
    const deft_lanes *L = &p->gpu->lanes;
    size_t sum = 0;
    for (int i = 0; i < L->n; i++)   /* the side lane is a lane of its own, on lane 0's GPU */
        if (L->device[i] == device && L->stream[i])
            sum += deft_cuda_stream_workspace_bytes(device, L->stream[i], asked);
    return sum;
}

/* After a run rather than at compile: the algorithms are chosen by the first (eager) run, which grows the scratch to
 * what they ask for before any capture (mem/cuda_workspace.cu). */
void deft_program_gpu_note_workspaces(deft_program *p) {
    const deft_lanes *L = &p->gpu->lanes;
    p->n_workspace = 0;
    for (int i = 0; i < L->n && p->n_workspace < DEFT_MAX_ARENAS; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen = seen || L->device[j] == L->device[i];
        if (seen) continue;
        p->workspace_device[p->n_workspace] = L->device[i];
        p->workspace_bytes[p->n_workspace++] = deft_program_gpu_workspace(p, L->device[i], 0);
    }
    p->workspace_noted = true;
}

int64_t deft_program_graph_replays(const deft_program *p) { return p ? p->gpu->replays : 0; }

const char *deft_program_graph_status(const deft_program *p) {
    return !p ? "no program" : p->gpu->state == DEFT_GRAPH_READY ? "replaying a CUDA Graph" : p->gpu->why_eager;
}
