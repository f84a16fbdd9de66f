/* Running a compiled program: feeding inputs, running the steps in order, reading outputs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "device_errors.h"
#include "device_internal.h"
#include "optimizer.h"
#include "optimizer_run.h"
#include "param_copies.h"
#include "program_graph.h"
#include "prefetch.h"
#include "program_run.h"
#include "program_state.h"
#include "replica_hooks.h"
#include "trace.h"
#include "zero_f32.h"

/* A compile stopped after a stage (the option stop_after) made a program to look at, without memory to run in. */
static deft_status deft_stopped_error(const deft_program *p, const char *what) {
    return deft_set_error(DEFT_ERR_STATE, "%s: the compile stopped after stage %s (stop_after): the program can be "
                          "printed and dumped, not run", what, p->stopped_after);
}

deft_status deft_check_program_tensor(const deft_program *p, const deft_tensor *t, const char *what) {
    if (!p) return deft_set_error(DEFT_ERR_INVALID, "%s: program is NULL", what);
    if (!t) return deft_set_error(DEFT_ERR_INVALID, "%s: tensor is NULL", what);
    if (p->stopped_after) return deft_stopped_error(p, what);
    if (t->graph != p->graph || t->id >= p->n_nodes)
        return deft_set_error(DEFT_ERR_STATE, "%s: %s is not part of this program's graph as compiled", what,
                              t->name);
    return DEFT_OK;
}

static deft_status deft_check_fed(const deft_program *p) {
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (p->nodes[id].needed && t->op == DEFT_OP_INPUT && !p->nodes[id].fed)
            return deft_set_error(DEFT_ERR_STATE,
                                  "run: input %s was never fed; call deft_program_feed (or _feed_async) first",
                                  t->name);
    }
    return DEFT_OK;
}

static deft_status deft_run_step(deft_program *p, int id, void *stream) {
    const deft_tensor *t = p->graph->nodes[id];
    if (p->nodes[id].group >= 0) return deft_group_run(p, &p->groups[p->nodes[id].group], stream);
    void *out = deft_program_data(p, id);
    if (t->op == DEFT_OP_COPY) {
        const deft_tensor *src = t->src[0];
        return deft_cuda_copy_async(t->device, out, src->device, deft_program_data(p, src->id), deft_tensor_bytes(t),
                                    stream);
    }
    const void *in_small[4];
    const void **in = t->nsrc <= 4 ? in_small : malloc((size_t)t->nsrc * sizeof *in);
    if (!in) return deft_set_error(DEFT_ERR_OOM, "run: out of host memory");
    for (int k = 0; k < t->nsrc; k++) in[k] = deft_program_data(p, t->src[k]->id);
    deft_status s;
    if (t->op == DEFT_OP_OPTIMIZER) {
        s = deft_optimizer_run(t->p.optimizer, t->src, in, out, stream);
    } else if (t->device.type == DEFT_CPU) {
        s = deft_cpu_run_node(t, out, in);
    } else {
#ifdef DEFT_HAVE_CUDA
        s = deft_cuda_set_device(t->device.index);
        if (s == DEFT_OK) s = deft_cuda_run_node(t, out, in, stream, p->cuda_flags);
#else
        (void)stream;
        s = deft_set_error(DEFT_ERR_NO_CUDA, "deft was built without CUDA");
#endif
    }
    if (in != in_small) free((void *)in);
    return s;
}

static deft_status deft_step_failed(deft_program *p, int i, deft_status s) {
    char msg[768];
    snprintf(msg, sizeof msg, "%s", deft_errmsg());
    const int id = p->steps[i];
    return deft_set_error(s, "run: step %d (%s, %s): %s", i, p->graph->nodes[id]->name,
                          deft_op_name(p->graph->nodes[id]->op), msg);
}

/* Each step on the stream of its lane (runtime/program_lanes.h), or on the host; the run begins and ends on lane 0's.
 * The lanes are joined back even after a failure, so that a capture ends cleanly. tr (NULL: none) times each step
 * on the stream it runs on (runtime/trace.c). */
static deft_status deft_run_steps_with(deft_program *p, deft_trace *tr) {
    const deft_replica_hooks *ddp = p->ddp ? deft_replica_hooks_get() : NULL;
    deft_status s = deft_lanes_begin_run(p);
    if (s == DEFT_OK && ddp) s = ddp->begin_run(p);
    for (int i = 0; s == DEFT_OK && i < p->n_steps; i++) {
        void *on = NULL;
        s = deft_lanes_before_step(p, p->steps[i], &on);
        if (s == DEFT_OK && ddp) s = ddp->before_step(p, i);   /* joins the buckets read here */
        if (s == DEFT_OK && tr) s = deft_trace_step_begin(tr, i, on);
        if (s == DEFT_OK) s = deft_run_step(p, p->steps[i], on);
        if (s == DEFT_OK && tr) s = deft_trace_step_end(tr, i, on);
        if (s == DEFT_OK) s = deft_lanes_after_step(p, p->steps[i]);
        if (s == DEFT_OK && ddp) s = ddp->after_step(p, i);    /* all-reduces the buckets complete here */
        if (s != DEFT_OK) s = deft_step_failed(p, i, s);
    }
    deft_status ddp_joined = ddp ? ddp->end_run(p) : DEFT_OK;
    if (s == DEFT_OK) s = ddp_joined;
    deft_status joined = deft_lanes_end_run(p);
    return s != DEFT_OK ? s : joined;
}

static deft_status deft_run_steps(deft_program *p, void *stream) {
    (void)stream;
    return deft_run_steps_with(p, NULL);
}

/* Each run draws new dropout masks; every reader within the run sees the same one. */
static void deft_stamp_run(deft_program *p) {
    for (int i = 0; i < p->n_steps; i++) {
        deft_tensor *t = p->graph->nodes[p->steps[i]];
        if (t->op == DEFT_OP_DROPOUT) t->p.dropout.run = p->run_count;
    }
}

/* One step, as deft_program_run or (tr given) eagerly on its streams, timed by runtime/trace.c: a traced step never
 * captures nor replays a graph, and leaves the graph state as it was (the next run goes on as it would have). */
static deft_status deft_program_run_with(deft_program *p, deft_trace *tr) {
    if (!p) return deft_set_error(DEFT_ERR_INVALID, "run: program is NULL");
    if (p->stopped_after) return deft_stopped_error(p, "run");
    deft_status s = deft_check_fed(p);
    if (s == DEFT_OK && p->ddp) s = deft_replica_hooks_get()->check_run(p);
    if (s == DEFT_OK) s = deft_program_check_f32_reads(p);
    if (s == DEFT_OK) s = deft_param_copies_refresh(p);   /* before a replay too: it is no part of the graph */
    if (s != DEFT_OK) return s;
    deft_stamp_run(p);
    if (p->gpu->device >= 0) {
        /* Slots fed asynchronously are switched in (the stream waits for their copies) before a graph is chosen. */
        s = deft_prefetch_before_run(p);
        if (s == DEFT_OK) s = tr ? deft_run_steps_with(p, tr) : deft_program_gpu_run(p, deft_run_steps);
        if (s == DEFT_OK) s = deft_prefetch_after_run(p);
        deft_program_gpu_note_workspaces(p);   /* a failed run may have grown some scratch too */
    } else {
        s = deft_run_steps_with(p, tr);
        for (int a = 0; s == DEFT_OK && a < p->n_arenas; a++) s = deft_device_synchronize(p->arenas[a].device);
    }
    for (int i = 0; s == DEFT_OK && i < p->n_steps; i++) p->nodes[p->steps[i]].runs++;
    for (int gi = 0; s == DEFT_OK && gi < p->n_groups; gi++)
        for (int m = 0; m < p->groups[gi].n_members; m++)
            if (p->groups[gi].members[m] != p->groups[gi].root) p->nodes[p->groups[gi].members[m]].runs++;
    /* After the run: its first wrote the copies from values still whole. */
    if (s == DEFT_OK) deft_program_mark_f32_partial(p);
    p->ran = s == DEFT_OK;
    p->run_count++;
    return s;
}

/* A program that uses a GPU returns once its step is queued (reads wait for it); one on the CPU alone has finished. */
deft_status deft_program_run(deft_program *p) { return deft_program_run_with(p, NULL); }

deft_status deft_program_run_traced(deft_program *p, deft_trace *tr) { return deft_program_run_with(p, tr); }

deft_status deft_program_read(deft_program *p, const deft_tensor *t, void *host, size_t bytes) {
    deft_status s = deft_check_program_tensor(p, t, "read");
    if (s != DEFT_OK) return s;
    if (!p->nodes[t->id].is_output)
        return deft_set_error(DEFT_ERR_STATE,
                              "read: %s is not an output of this program; pass it to deft_compile to read it",
                              t->name);
    if (!p->ran) return deft_set_error(DEFT_ERR_STATE, "read: %s has not been computed: run the program first", t->name);
    if (bytes != deft_tensor_bytes(t))
        return deft_set_error(DEFT_ERR_INVALID, "read: %zu bytes asked for output %s of %zu bytes", bytes, t->name,
                              deft_tensor_bytes(t));
    if (!host) return deft_set_error(DEFT_ERR_INVALID, "read: host buffer is NULL");
    /* The legacy stream's copy below waits for lane 0's work on lane 0's GPU; anything else waits for the run. */
    if (p->gpu->device >= 0 && (t->device.type != DEFT_CUDA || t->device.index != p->gpu->device))
        s = deft_lanes_wait_idle(p);
    if (s == DEFT_OK && p->ddp) s = deft_replica_hooks_get()->wait(p);   /* a peer that stopped is an error, not a hang */
    if (s != DEFT_OK) return s;
    s = deft_mem_copy(deft_cpu(), host, t->device, deft_program_data(p, t->id), bytes);
    if (s != DEFT_OK) return s;
    /* The copy waited for the run: what its kernels found in the data (a bad cross-entropy target) is reported
     * now, once, rather than by a host wait inside the step. */
    s = deft_program_take_device_errors(p);
    if (s == DEFT_OK) return DEFT_OK;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", deft_errmsg());
    return deft_set_error(s, "read %s: %s", t->name, msg);
}

deft_status deft_realize(deft_tensor *t, void *host, size_t bytes) {
    if (!t) {
        char cause[1024];
        snprintf(cause, sizeof cause, "%s", deft_errmsg());
        return deft_set_error(DEFT_ERR_INVALID, "realize: tensor is NULL (an earlier builder failed: %s)", cause);
    }
    deft_program *p;
    deft_status s = deft_compile_into(t->graph, &t, 1, NULL, &p);
    if (s != DEFT_OK) return s;
    s = deft_program_run(p);
    if (s == DEFT_OK) s = deft_program_read(p, t, host, bytes);
    if (s != DEFT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", deft_errmsg());
        deft_program_free(p);
        return deft_set_error(s, "realize: %s", msg);
    }
    deft_program_free(p);
    return DEFT_OK;
}

/* ---- what compiling decided ---- */

int deft_program_step_count(const deft_program *p) { return p ? p->n_steps : 0; }

int64_t deft_program_node_runs(const deft_program *p, const deft_tensor *t) {
    return deft_program_schedules(p, t) ? p->nodes[t->id].runs : 0;
}
