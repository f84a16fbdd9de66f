/* Leaves (inputs, parameters, constants) and creation ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"
#include "element.h"
#include "node.h"
#include "rng.h"

static deft_tensor *deft_leaf(deft_graph *g, const char *what, deft_op op, deft_dtype dt, int ndim,
                              const int64_t *shape, deft_device dev) {
    if (!g) {
        deft_set_error(DEFT_ERR_INVALID, "%s: graph is NULL", what);
        return NULL;
    }
    if (!deft_check_leaf(g, what, dt, ndim, shape, dev)) return NULL;
    return deft_node_new(g, op, dt, dev, ndim, shape, 0, NULL);
}

deft_tensor *deft_input(deft_graph *g, const char *name, deft_dtype dt, int ndim, const int64_t *shape,
                        deft_device dev) {
    deft_tensor *t = deft_leaf(g, "input", DEFT_OP_INPUT, dt, ndim, shape, dev);
    return t && name ? deft_set_name(t, name) : t;
}

/* fan_in and fan_out of a weight stored [in, out] (as x @ w); a 1-D tensor counts its length as fan_in. */
static void deft_fans(const deft_tensor *t, double *fan_in, double *fan_out) {
    if (t->ndim <= 1) {
        *fan_in = *fan_out = t->ndim ? (double)t->shape[0] : 1.0;
        return;
    }
    *fan_out = (double)t->shape[t->ndim - 1];
    *fan_in = (double)deft_shape_numel(t->ndim, t->shape) / *fan_out;
}

static void deft_param_init_values(deft_tensor *t, uint64_t seed) {
    int64_t n = deft_shape_numel(t->ndim, t->shape);
    double fan_in, fan_out, bound = 0.0;
    deft_fans(t, &fan_in, &fan_out);
    switch (t->p.init) {
    case DEFT_INIT_UNIFORM:
    case DEFT_INIT_KAIMING: bound = 1.0 / sqrt(fan_in); break; /* kaiming_uniform(a=sqrt(5)) reduces to this */
    case DEFT_INIT_XAVIER: bound = sqrt(6.0 / (fan_in + fan_out)); break;
    default: break;
    }
    for (int64_t i = 0; i < n; i++) {
        double v = 0.0;
        switch (t->p.init) {
        case DEFT_INIT_ZEROS: v = 0.0; break;
        case DEFT_INIT_ONES: v = 1.0; break;
        case DEFT_INIT_NORMAL: v = deft_rng_normal(seed, (uint64_t)i); break;
        default: v = bound * (2.0 * deft_rng_uniform01(seed, (uint64_t)i) - 1.0); break;
        }
        deft_store_from_f64(t->host_data, t->dtype, i, v);
    }
}

deft_tensor *deft_param(deft_graph *g, const char *name, deft_dtype dt, int ndim, const int64_t *shape,
                        deft_device dev, deft_init init) {
    if (g && ((int)init < DEFT_INIT_ZEROS || init > DEFT_INIT_XAVIER)) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "param: unknown init %d", (int)init);
        return NULL;
    }
    char what[80];   /* a failed check names the parameter: a model has many */
    snprintf(what, sizeof what, name ? "param %.60s" : "param", name);
    deft_tensor *t = deft_leaf(g, what, DEFT_OP_PARAM, dt, ndim, shape, dev);
    if (!t) return NULL;
    if (name) deft_set_name(t, name);
    t->p.init = init;
    t->host_data = malloc(deft_tensor_bytes(t));
    if (!t->host_data) {
        deft_graph_fail(g, DEFT_ERR_OOM, "param %s: out of host memory for %zu bytes", t->name,
                        deft_tensor_bytes(t));
        return NULL;
    }
    deft_param_init_values(t, deft_rng_mix(g->seed ^ (0x9e37ull * ++g->param_counter)));
    return t;
}

void deft_param_fill_uniform(deft_tensor *t, double bound) {
    uint64_t seed = deft_rng_mix(t->graph->seed ^ (0x51ull * ++t->graph->param_counter));
    int64_t n = deft_shape_numel(t->ndim, t->shape);
    for (int64_t i = 0; i < n; i++)
        deft_store_from_f64(t->host_data, t->dtype, i, bound * (2.0 * deft_rng_uniform01(seed, (uint64_t)i) - 1.0));
}

deft_tensor *deft_constant(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev,
                           const void *data, size_t bytes) {
    if (g && !data) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "constant: data is NULL");
        return NULL;
    }
    deft_tensor *t = deft_leaf(g, "constant", DEFT_OP_CONSTANT, dt, ndim, shape, dev);
    if (!t) return NULL;
    if (bytes != deft_tensor_bytes(t)) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "constant: %zu bytes given for a tensor of %zu bytes", bytes,
                        deft_tensor_bytes(t));
        return NULL;
    }
    t->host_data = malloc(bytes);
    if (!t->host_data) {
        deft_graph_fail(g, DEFT_ERR_OOM, "constant: out of host memory for %zu bytes", bytes);
        return NULL;
    }
    memcpy(t->host_data, data, bytes);
    return t;
}

/* `what` names the builder the user called in messages. */
static deft_tensor *deft_full_as(deft_graph *g, const char *what, deft_dtype dt, int ndim, const int64_t *shape,
                                 deft_device dev, double value) {
    deft_tensor *t = deft_leaf(g, what, DEFT_OP_FULL, dt, ndim, shape, dev);
    if (t) t->p.scalar = value;
    return t;
}

deft_tensor *deft_full(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev,
                       double value) {
    return deft_full_as(g, "full", dt, ndim, shape, dev, value);
}

deft_tensor *deft_zeros(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev) {
    return deft_full_as(g, "zeros", dt, ndim, shape, dev, 0.0);
}

deft_tensor *deft_arange(deft_graph *g, deft_dtype dt, double start, double stop, double step, deft_device dev) {
    if (!g) return deft_leaf(g, "arange", DEFT_OP_ARANGE, dt, 0, NULL, dev);
    if (step == 0.0 || !isfinite(start) || !isfinite(stop) || !isfinite(step)) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "arange: start %g, stop %g and step %g must be finite, step non-zero",
                        start, stop, step);
        return NULL;
    }
    /* The quotient may be infinite or past int64: converting such a double is undefined, so test it first. */
    const double count = ceil((stop - start) / step);
    if (!(count < 0x1p63)) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "arange: [%g, %g) with step %g has %.4g elements; too large", start, stop,
                        step, count);
        return NULL;
    }
    if (!(count >= 1.0)) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "arange: [%g, %g) with step %g is empty; sizes must be positive", start,
                        stop, step);
        return NULL;
    }
    int64_t n = (int64_t)count;
    deft_tensor *t = deft_leaf(g, "arange", DEFT_OP_ARANGE, dt, 1, &n, dev);
    if (t) {
        t->p.arange.start = start;
        t->p.arange.step = step;
    }
    return t;
}

static deft_tensor *deft_random(deft_graph *g, const char *what, deft_op op, deft_dtype dt, int ndim,
                                const int64_t *shape, deft_device dev, double a, double b, uint64_t seed) {
    if (g && !deft_require_float(g, what, dt)) return NULL;
    deft_tensor *t = deft_leaf(g, what, op, dt, ndim, shape, dev);
    if (t) {
        t->p.rng.a = a;
        t->p.rng.b = b;
        t->p.rng.seed = seed;
    }
    return t;
}

deft_tensor *deft_uniform(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev,
                          double low, double high, uint64_t seed) {
    if (g && !(low <= high)) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "uniform: low %g is above high %g", low, high);
        return NULL;
    }
    return deft_random(g, "uniform", DEFT_OP_UNIFORM, dt, ndim, shape, dev, low, high, seed);
}

deft_tensor *deft_normal(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev,
                         double mean, double stddev, uint64_t seed) {
    if (g && !(stddev >= 0.0)) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "normal: stddev %g must be >= 0", stddev);
        return NULL;
    }
    return deft_random(g, "normal", DEFT_OP_NORMAL, dt, ndim, shape, dev, mean, stddev, seed);
}
