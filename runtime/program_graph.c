/* Whether a program's step can be one CUDA Graph replay, and the warm-up, capture, replay sequence. The CUDA calls
 * themselves are in runtime/program_graph_cuda.c. */
#include <stdio.h>

#include "program_graph.h"
#include "program_state.h"

/* The reason a replay could not stand for an eager run, or NULL when it can. */
static const char *deft_graph_blocker(const deft_program *p, int *device) {
    *device = -1;
    for (int i = 0; i < p->n_steps; i++) {
        const deft_tensor *t = p->graph->nodes[p->steps[i]];
        if (t->device.type != DEFT_CUDA) return "a step runs on the cpu";
        if (*device >= 0 && t->device.index != *device) return "steps run on more than one GPU";
        *device = t->device.index;
        if (t->op == DEFT_OP_COPY) return "a step copies between devices";
        if (t->op == DEFT_OP_DROPOUT) return "dropout draws a new mask each run, which a replay would repeat";
    }
    return *device < 0 ? "no step runs on a GPU" : NULL;
}

deft_status deft_program_gpu_init(deft_program *p, int allow_graphs) {
    deft_program_gpu *g = &p->gpu;
    *g = (deft_program_gpu){.device = -1};
    int device;
    const char *why = deft_graph_blocker(p, &device);
    if (why) {
        snprintf(g->why_eager, sizeof g->why_eager, "%s", why);
        return DEFT_OK;
    }
    deft_status s = deft_cuda_stream_create(device, &g->stream);
    if (s != DEFT_OK) return s;
    g->device = device;
    g->state = allow_graphs ? DEFT_GRAPH_WARMUP : DEFT_GRAPH_OFF;
    snprintf(g->why_eager, sizeof g->why_eager, "%s",
             allow_graphs ? "not captured yet (the first run is eager)" : "CUDA Graphs turned off by the compile option");
    return DEFT_OK;
}

void deft_program_gpu_free(deft_program *p) {
    deft_program_gpu *g = &p->gpu;
    if (g->device < 0) return;
    deft_cuda_graph_destroy(g->device, g->graph, g->exec);
    deft_cuda_stream_destroy(g->device, g->stream);
    g->device = -1;
}

/* A failed capture leaves the program eager for good, with the reason kept, and runs this step eagerly. */
static deft_status deft_capture_and_launch(deft_program *p, deft_status (*run_steps)(deft_program *, void *)) {
    deft_program_gpu *g = &p->gpu;
    deft_status s = deft_cuda_capture_begin(g->device, g->stream);
    deft_status ran = s == DEFT_OK ? run_steps(p, g->stream) : s;
    if (s == DEFT_OK) s = deft_cuda_capture_end(g->device, g->stream, &g->graph, &g->exec);
    if (ran == DEFT_OK && s == DEFT_OK) {
        g->state = DEFT_GRAPH_READY;
        snprintf(g->why_eager, sizeof g->why_eager, "replaying a CUDA Graph");
        return deft_cuda_graph_launch(g->device, g->exec, g->stream);
    }
    snprintf(g->why_eager, sizeof g->why_eager, "capture failed: %.140s", deft_errmsg());
    deft_cuda_graph_destroy(g->device, g->graph, g->exec);
    g->graph = g->exec = NULL;
    g->state = DEFT_GRAPH_OFF;
    return run_steps(p, g->stream);
}

deft_status deft_program_gpu_run(deft_program *p, deft_status (*run_steps)(deft_program *, void *)) {
    deft_program_gpu *g = &p->gpu;
    switch (g->state) {
    case DEFT_GRAPH_READY:
        g->replays++;
        return deft_cuda_graph_launch(g->device, g->exec, g->stream);
    case DEFT_GRAPH_CAPTURE: {
        deft_status s = deft_capture_and_launch(p, run_steps);
        if (s == DEFT_OK && g->state == DEFT_GRAPH_READY) g->replays++;
        return s;
    }
    case DEFT_GRAPH_WARMUP: {
        deft_status s = run_steps(p, g->stream);
        if (s == DEFT_OK) g->state = DEFT_GRAPH_CAPTURE;
        return s;
    }
    case DEFT_GRAPH_OFF: break;
    }
    return run_steps(p, g->stream);
}

int64_t deft_program_graph_replays(const deft_program *p) { return p ? p->gpu.replays : 0; }

const char *deft_program_graph_status(const deft_program *p) {
    return !p ? "no program" : p->gpu.state == DEFT_GRAPH_READY ? "replaying a CUDA Graph" : p->gpu.why_eager;
}
