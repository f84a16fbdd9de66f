/* Re-initialising a parameter from a normal distribution (GPT-2's N(0, 0.02) and its scaled residual projections),
 * at any time: the value goes where deft_param_set puts it (the host copy, and the device's or the optimizer's flat
 * block once a program placed it there). */
#include <math.h>
#include <stdlib.h>

#include "element.h"
#include "graph_internal.h"
#include "rng.h"

/* Seed 0 draws from a stream of the graph's seed and the parameter's node id: the same values for the same graph
 * seed and build order, whatever else was re-initialised, and other parameters' values do not move (the counter
 * deft_param draws its own seeds from is left alone). */
static uint64_t deft_param_init_seed(const deft_tensor *t, uint64_t seed) {
    if (seed != 0) return seed;
    return deft_rng_mix(t->graph->seed ^ deft_rng_mix(0x6e6f726d616c0000ull + (uint64_t)t->id));
}

deft_status deft_param_init_normal(deft_tensor *param, double mean, double std, uint64_t seed) {
    if (!param) return deft_set_error(DEFT_ERR_INVALID, "param_init_normal: tensor is NULL");
    if (param->op != DEFT_OP_PARAM)
        return deft_set_error(DEFT_ERR_STATE, "param_init_normal: %s is not a parameter", param->name);
    if (param->dtype != DEFT_F32 && param->dtype != DEFT_F64 && param->dtype != DEFT_F16 && param->dtype != DEFT_BF16)
        return deft_set_error(DEFT_ERR_DTYPE, "param_init_normal: parameter %s is %s; a normal draw needs a float",
                              param->name, deft_dtype_name(param->dtype));
    if (!isfinite(mean) || !(std >= 0.0) || !isfinite(std))
        return deft_set_error(DEFT_ERR_INVALID, "param_init_normal: %s: mean %g and std %g must be finite, std >= 0",
                              param->name, mean, std);
    const size_t bytes = deft_tensor_bytes(param);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf)
        return deft_set_error(DEFT_ERR_OOM, "param_init_normal: out of host memory for %zu bytes of %s", bytes,
                              param->name);
    const uint64_t s = deft_param_init_seed(param, seed);
    const int64_t n = deft_shape_numel(param->ndim, param->shape);
    /* The formula of the normal creation op (ops/cpu/cpu_create.c), so a non-zero seed gives deft_normal's values. */
    for (int64_t i = 0; i < n; i++)
        deft_store_from_f64(buf, param->dtype, i, mean + std * deft_rng_normal(s, (uint64_t)i));
    deft_status st = deft_param_set(param, buf, bytes);
    free(buf);
    return st;
}
