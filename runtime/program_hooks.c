/* The hooks the runtime registers on every graph it compiles a program from (ir/graph_hooks.h). */
#include "device_internal.h"
#include "optimizer_storage.h"
#include "program_hooks.h"
#include "program_state.h"

void deft_release_device_data(deft_tensor *t) {
    deft_mem_free(t->device, t->dev_data);
    t->dev_data = NULL;
}

const deft_graph_hooks deft_runtime_graph_hooks = {
    .program_free = deft_program_free,
    .node_plan = deft_program_node_plan,
    .release_device_data = deft_release_device_data,
    .optimizer_release = deft_optimizer_release,
};
