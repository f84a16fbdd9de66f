/* A parameter's value, read and written by the user: its host copy, and its device copy once a program placed it
 * there (or the optimizer's flat block). */
#include <string.h>

#include "device_internal.h"
#include "graph_internal.h"
#include "param_copies.h"
#include "zero_f32.h"

static deft_status deft_param_check(const deft_tensor *t, size_t bytes, const char *what) {
    if (!t) return deft_set_error(DEFT_ERR_INVALID, "%s: tensor is NULL", what);
    if (t->op != DEFT_OP_PARAM)
        return deft_set_error(DEFT_ERR_STATE, "%s: %s is not a parameter", what, t->name);
    if (bytes != deft_tensor_bytes(t))
        return deft_set_error(DEFT_ERR_INVALID, "%s: %zu bytes given for parameter %s of %zu bytes", what, bytes,
                              t->name, deft_tensor_bytes(t));
    return DEFT_OK;
}

deft_status deft_param_set(deft_tensor *param, const void *host, size_t bytes) {
    deft_status s = deft_param_check(param, bytes, "param_set");
    if (s != DEFT_OK) return s;
    if (!host) return deft_set_error(DEFT_ERR_INVALID, "param_set: host buffer is NULL");
    /* The copies would be written anew from the other parameters' stale values. */
    s = deft_param_check_f32_current(param, true, "param_set");
    if (s != DEFT_OK) return s;
    memcpy(param->host_data, host, bytes);
    deft_param_copies_mark_stale(param->graph, param);
    if (param->dev_data) return deft_mem_copy(param->device, param->dev_data, deft_cpu(), host, bytes);
    return DEFT_OK;
}

deft_status deft_param_get(const deft_tensor *param, void *host, size_t bytes) {
    deft_status s = deft_param_check(param, bytes, "param_get");
    if (s != DEFT_OK) return s;
    if (!host) return deft_set_error(DEFT_ERR_INVALID, "param_get: host buffer is NULL");
    s = deft_param_check_f32_current(param, false, "param_get");
    if (s != DEFT_OK) return s;
    if (param->dev_data) return deft_mem_copy(deft_cpu(), host, param->device, param->dev_data, bytes);
    memcpy(host, param->host_data, bytes);
    return DEFT_OK;
}
