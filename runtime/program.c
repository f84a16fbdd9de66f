/* Compiling: the options resolved, the pipeline run (which nodes run, in what order, where each value lives:
 * passes/pipeline.h); then the program's memory (arenas, input slots, device copies) and its freeing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "device_internal.h"
#include "node.h"
#include "optimizer.h"
#include "optimizer_split.h"
#include "optimizer_storage.h"
#include "param_copies.h"
#include "program_graph.h"
#include "program_hooks.h"
#include "replica_hooks.h"
#include "prefetch.h"
#include "zero_f32.h"
#include "pipeline.h"
#include "program_run.h"
#include "program_state.h"
#include "schedule.h"

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
        } else if (t->op == DEFT_OP_PARAM_COPY) {
            if (!t->storage_borrowed) s = deft_param_copy_bind(p, t, &uploaded[id]);
            if (s != DEFT_OK) return s;
        } else if (t->device.type != DEFT_CPU && !t->dev_data) {
            s = deft_mem_alloc_tagged(t->device, bytes, t->name, &t->dev_data);
            if (s == DEFT_OK) uploaded[id] = true;
            if (s == DEFT_OK) s = deft_mem_copy(t->device, t->dev_data, deft_cpu(), t->host_data, bytes);
        }
        if (s != DEFT_OK) return deft_set_error(s, "compile: storage for %s: %s", t->name, deft_errmsg());
    }
    return DEFT_OK;
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

/* A failed compile leaves the graph's device memory as it found it (out of memory must leak nothing): the copies it
 * made go back. Their host values are still current, since nothing ran on them. */
static void deft_release_uploads(deft_program *p, const bool *uploaded) {
    for (int id = 0; id < p->n_nodes; id++)
        if (!uploaded[id]) continue;
        else if (p->graph->nodes[id]->op == DEFT_OP_PARAM_COPY) deft_param_copy_unmake(p->graph->nodes[id]);
        else deft_release_device_data(p->graph->nodes[id]);
}

/* The memory of a program that went through every stage: loss scaling set in its optimizers, persistent storage,
 * arenas, streams and graphs, and a data-parallel replica's buckets. */
static deft_status deft_program_allocate(deft_program *p) {
    p->pinned_host = deft_program_touches_gpu(p);
    bool *uploaded = calloc((size_t)(p->n_nodes ? p->n_nodes : 1), sizeof *uploaded);
    if (!uploaded) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    deft_status s = deft_program_check_sharding(p);
    if (s == DEFT_OK) s = deft_autocast_configure_steps(p);
    if (s == DEFT_OK) p->persistent_bytes = deft_persistent_bytes(p);   /* once loss scaling is set */
    if (s == DEFT_OK) s = deft_place_persistent(p, uploaded);
    if (s == DEFT_OK) s = deft_check_device_room(p);
    if (s == DEFT_OK) s = deft_alloc_arenas(p);
    if (s == DEFT_OK) s = deft_program_gpu_init(p, p->config.cuda_graphs);
    if (s == DEFT_OK) s = deft_program_make_device_errors(p);
    if (s == DEFT_OK) s = deft_program_prepare_kernels(p);
    if (s == DEFT_OK) s = deft_replica_attach(p, &p->config);
    /* Last: a sharded optimizer's f32 set is made only by a compile that succeeds. */
    if (s == DEFT_OK) s = deft_program_zero_f32_bind(p);
    if (s != DEFT_OK) deft_release_uploads(p, uploaded);
    free(uploaded);
    return s;
}

static deft_status deft_compile_with(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                                     const deft_compile_options *opts, bool allocate, deft_program **out) {
    *out = NULL;
    deft_status s = deft_check_outputs(g, outputs, n_outputs);
    if (s == DEFT_OK) deft_graph_set_hooks(g, &deft_runtime_graph_hooks);
    deft_config config;
    if (s == DEFT_OK) s = deft_config_resolve(opts, &config);
    if (s == DEFT_OK) s = deft_replica_shard(g, &config);   /* ZeRO-1: before the optimizers' storage is made */
    if (s == DEFT_OK) s = deft_optimizers_materialize(g);
    if (s != DEFT_OK) {
        if (g) deft_optimizers_unshard_unmade(g);
        return s;
    }
    deft_program *p = calloc(1, sizeof *p);
    deft_program_gpu *gpu = calloc(1, sizeof *gpu);
    if (!p || !gpu) {
        free(p);
        free(gpu);
        return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    }
    p->graph = g;
    p->n_nodes = g->n_nodes;
    p->config = config;
    p->gpu = gpu;
    p->gpu->device = -1;
    s = deft_graph_add_program(g, p);
    if (s != DEFT_OK) {
        free(gpu);
        free(p);
        return s;
    }
    s = deft_pipeline_run(p, outputs, n_outputs);
    if (s == DEFT_OK && allocate && !p->stopped_after) s = deft_program_allocate(p);
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
    if (p->gpu->device >= 0) (void)deft_device_synchronize(deft_cuda(p->gpu->device));
    deft_replica_free(p);   /* its events and stream, before the program's */
    deft_program_gpu_free(p);
    free(p->gpu);
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
