/* Test support: the library's debug knobs (base/config.h) set by name, as a test switches a kernel path between
 * two runs on the same data. */
#include "deft_testing.h"

#include "base.h"
#include "config.h"

deft_status deft_testing_set_debug(const char *name, int64_t value) {
    const int knob = deft_debug_find(name);
    if (knob < 0) return deft_set_error(DEFT_ERR_INVALID, "set_debug: no debug knob is named %s", name ? name : "NULL");
    deft_debug_set((deft_debug_knob)knob, value);
    return DEFT_OK;
}

int64_t deft_testing_debug(const char *name) {
    const int knob = deft_debug_find(name);
    return knob < 0 ? 0 : deft_debug((deft_debug_knob)knob);
}
