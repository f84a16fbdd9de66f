/* Feeding a compiled program's inputs from host memory (asynchronous feeds are in runtime/prefetch.c). */
#include "device_internal.h"
#include "prefetch.h"
#include "program_run.h"
#include "program_state.h"

deft_status deft_feed_check(const deft_program *p, const deft_tensor *input, const void *host, size_t bytes,
                            const char *what) {
    deft_status s = deft_check_program_tensor(p, input, what);
    if (s != DEFT_OK) return s;
    if (input->op != DEFT_OP_INPUT)
        return deft_set_error(DEFT_ERR_STATE, "%s: %s is a %s, not an input", what, input->name,
                              deft_op_name(input->op));
    if (bytes != deft_tensor_bytes(input))
        return deft_set_error(DEFT_ERR_INVALID, "%s: %zu bytes given for input %s of %zu bytes (%lld x %s)", what,
                              bytes, input->name, deft_tensor_bytes(input),
                              (long long)deft_shape_numel(input->ndim, input->shape), deft_dtype_name(input->dtype));
    if (!host) return deft_set_error(DEFT_ERR_INVALID, "%s: host buffer is NULL", what);
    return DEFT_OK;
}

deft_status deft_program_feed(deft_program *p, deft_tensor *input, const void *host, size_t bytes) {
    deft_status s = deft_feed_check(p, input, host, bytes, "feed");
    if (s != DEFT_OK) return s;
    deft_node_state *st = &p->nodes[input->id];
    if (!st->needed) return DEFT_OK;   /* an input this program does not read: nothing to do */
    s = deft_prefetch_before_feed(p, input);
    if (s == DEFT_OK) s = deft_mem_copy(input->device, st->input_storage, deft_cpu(), host, bytes);
    if (s == DEFT_OK) st->fed = true;
    return s;
}
