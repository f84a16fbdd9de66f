/* Feeding a compiled program's inputs from host memory. */
#include "device_internal.h"
#include "program_state.h"

deft_status deft_program_feed(deft_program *p, deft_tensor *input, const void *host, size_t bytes) {
    deft_status s = deft_check_program_tensor(p, input, "feed");
    if (s != DEFT_OK) return s;
    if (input->op != DEFT_OP_INPUT)
        return deft_set_error(DEFT_ERR_STATE, "feed: %s is a %s, not an input", input->name,
                              deft_op_name(input->op));
    if (bytes != deft_tensor_bytes(input))
        return deft_set_error(DEFT_ERR_INVALID, "feed: %zu bytes given for input %s of %zu bytes (%lld x %s)",
                              bytes, input->name, deft_tensor_bytes(input),
                              (long long)deft_shape_numel(input->ndim, input->shape), deft_dtype_name(input->dtype));
    if (!host) return deft_set_error(DEFT_ERR_INVALID, "feed: host buffer is NULL");
    deft_node_state *st = &p->nodes[input->id];
    if (!st->needed) return DEFT_OK;   /* an input this program does not read: nothing to do */
    s = deft_mem_copy(input->device, st->input_storage, deft_cpu(), host, bytes);
    if (s == DEFT_OK) st->fed = true;
    return s;
}
