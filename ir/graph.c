/* Graph lifetime, node storage and tensor facts. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_hooks.h"
#include "graph_internal.h"
#include "node.h"
#include "autocast.h"
#include "optimizer.h"

deft_graph *deft_graph_new(void) {
    deft_graph *g = calloc(1, sizeof *g);
    if (!g) {
        deft_set_error(DEFT_ERR_OOM, "out of host memory creating a graph");
        return NULL;
    }
    g->seed = 0x5eedull;
    return g;
}

void deft_graph_free(deft_graph *g) {
    if (!g) return;
    while (g->n_programs > 0) g->hooks->program_free(g->programs[g->n_programs - 1]);
    free(g->programs);
    for (int i = 0; i < g->n_optimizers; i++) deft_optimizer_destroy(g->optimizers[i]);
    free(g->optimizers);
    deft_autocast_free_all(g);
    free(g->backward_calls);
    for (int i = 0; i < g->n_nodes; i++) deft_node_destroy(g->nodes[i]);
    free(g->nodes);
    free(g);
}

deft_status deft_graph_error(const deft_graph *g) { return g ? g->first_error : DEFT_ERR_INVALID; }

const char *deft_graph_errmsg(const deft_graph *g) { return g ? g->first_errmsg : "no graph"; }

int deft_graph_node_count(const deft_graph *g) { return g ? g->n_nodes : 0; }

void deft_graph_set_seed(deft_graph *g, uint64_t seed) {
    if (g) g->seed = seed;
}

void deft_graph_set_hooks(deft_graph *g, const deft_graph_hooks *hooks) { g->hooks = hooks; }

deft_status deft_graph_add_program(deft_graph *g, struct deft_program *p) {
    if (g->n_programs == g->cap_programs) {
        int cap = g->cap_programs ? 2 * g->cap_programs : 4;
        struct deft_program **np = realloc(g->programs, (size_t)cap * sizeof *np);
        if (!np) return deft_set_error(DEFT_ERR_OOM, "out of host memory registering a program");
        g->programs = np;
        g->cap_programs = cap;
    }
    g->programs[g->n_programs++] = p;
    return DEFT_OK;
}

bool deft_graph_owns_program(const deft_graph *g, const struct deft_program *p) {
    for (int i = 0; i < g->n_programs; i++)
        if (g->programs[i] == p) return true;
    return false;
}

void deft_graph_remove_program(deft_graph *g, struct deft_program *p) {
    for (int i = 0; i < g->n_programs; i++) {
        if (g->programs[i] == p) {
            g->programs[i] = g->programs[--g->n_programs];
            return;
        }
    }
}

void deft_node_destroy(deft_tensor *t) {
    if (!t) return;
    if (t->dev_data) t->graph->hooks->release_device_data(t);
    free(t->host_data);
    free(t->src);
    free(t);
}

deft_tensor *deft_node_new(deft_graph *g, deft_op op, deft_dtype dt, deft_device dev, int ndim,
                           const int64_t *shape, int nsrc, deft_tensor *const *src) {
    if (!deft_check_size(g, deft_op_name(op), dt, ndim, shape)) return NULL;
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? 2 * g->cap_nodes : 64;
        deft_tensor **nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            deft_graph_fail(g, DEFT_ERR_OOM, "out of host memory adding a node");
            return NULL;
        }
        g->nodes = nn;
        g->cap_nodes = cap;
    }
    deft_tensor *t = calloc(1, sizeof *t);
    deft_tensor **srcs = nsrc ? malloc((size_t)nsrc * sizeof *srcs) : NULL;
    if (!t || (nsrc && !srcs)) {
        free(t);
        free(srcs);
        deft_graph_fail(g, DEFT_ERR_OOM, "out of host memory adding a node");
        return NULL;
    }
    t->graph = g;
    t->id = g->n_nodes;
    t->op = op;
    t->dtype = dt;
    t->device = dev;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nsrc = nsrc;
    t->src = srcs;
    for (int i = 0; i < nsrc; i++) srcs[i] = src[i];
    snprintf(t->name, sizeof t->name, "%s_%d", deft_op_name(op), t->id);
    g->nodes[g->n_nodes++] = t;
    return t;
}

/* ---- tensor facts ---- */

int deft_tensor_ndim(const deft_tensor *t) { return t ? t->ndim : -1; }

int64_t deft_tensor_dim(const deft_tensor *t, int axis) {
    if (!t) return -1;
    if (axis < 0) axis += t->ndim;
    if (axis < 0 || axis >= t->ndim) return -1;
    return t->shape[axis];
}

int64_t deft_tensor_numel(const deft_tensor *t) { return t ? deft_shape_numel(t->ndim, t->shape) : -1; }

size_t deft_tensor_nbytes(const deft_tensor *t) { return t ? deft_tensor_bytes(t) : 0; }

deft_dtype deft_tensor_dtype(const deft_tensor *t) { return t ? t->dtype : DEFT_DTYPE_COUNT; }

deft_device deft_tensor_device(const deft_tensor *t) { return t ? t->device : deft_cpu(); }

const char *deft_tensor_name(const deft_tensor *t) { return t ? t->name : ""; }

deft_tensor *deft_set_name(deft_tensor *t, const char *name) {
    if (t && name) snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

/* Formats into a copy first, as deft_set_error does, so that a message may quote the previous one. */
deft_status deft_graph_fail(deft_graph *g, deft_status s, const char *fmt, ...) {
    char msg[sizeof g->first_errmsg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    deft_set_error(s, "%s", msg);
    if (g && g->first_error == DEFT_OK) {
        g->first_error = s;
        memcpy(g->first_errmsg, msg, sizeof g->first_errmsg);
    }
    return s;
}
