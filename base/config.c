/* The debug knobs' table (config.h), and the library's one reader of the environment: each knob starts from
 * DEFT_<NAME> once, on first use, so that tests and people can flip it; after that only deft_debug_set changes it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

typedef struct deft_debug_entry {
    const char *name;
    bool flag;   /* on/off: any value but empty and "0" is 1; otherwise a decimal integer (else 0) */
} deft_debug_entry;

static const deft_debug_entry deft_debug_table[DEFT_DEBUG_KNOB_COUNT] = {
    [DEFT_DEBUG_MATMUL_REFERENCE] = {"MATMUL_REFERENCE", true},
    [DEFT_DEBUG_BN_REFERENCE] = {"BN_REFERENCE", true},
    [DEFT_DEBUG_POOL_REFERENCE] = {"POOL_REFERENCE", true},
    [DEFT_DEBUG_FUSED_REFERENCE] = {"FUSED_REFERENCE", true},
    [DEFT_DEBUG_CONV_GEMM_PLAIN] = {"CONV_GEMM_PLAIN", false},
    [DEFT_DEBUG_CONV_GEMM_ROWS] = {"CONV_GEMM_ROWS", false},
    [DEFT_DEBUG_ATTENTION_KERNEL] = {"ATTENTION_KERNEL", false},
    [DEFT_DEBUG_SHAPE_REFERENCE] = {"SHAPE_REFERENCE", true},
    [DEFT_DEBUG_SLICE_GRAD_ADDS] = {"SLICE_GRAD_ADDS", true},
    [DEFT_DEBUG_CE_REFERENCE] = {"CE_REFERENCE", true},
    [DEFT_DEBUG_MAP_SCALAR] = {"MAP_SCALAR", true},
    [DEFT_DEBUG_LN_WIDE] = {"LN_WIDE", true},
    [DEFT_DEBUG_LN_REFERENCE] = {"LN_REFERENCE", true},
    [DEFT_DEBUG_OPT_REFERENCE] = {"OPT_REFERENCE", true},
};

static _Atomic int64_t deft_debug_values[DEFT_DEBUG_KNOB_COUNT];
static pthread_once_t deft_debug_once = PTHREAD_ONCE_INIT;

/* The value DEFT_<name> gives the knob, as the environment switches read it before the table existed. */
static int64_t deft_debug_from_env(const deft_debug_entry *e) {
    char var[64] = "DEFT_";
    strncat(var, e->name, sizeof var - strlen(var) - 1);
    const char *v = getenv(var);
    if (!v || !*v) return 0;
    if (e->flag) return strcmp(v, "0") != 0;
    char *end = NULL;
    const long long r = strtoll(v, &end, 10);
    return end && *end == '\0' ? (int64_t)r : 0;
}

static void deft_debug_init(void) {
    for (int k = 0; k < DEFT_DEBUG_KNOB_COUNT; k++)
        atomic_store(&deft_debug_values[k], deft_debug_from_env(&deft_debug_table[k]));
}

static bool deft_debug_known(deft_debug_knob knob) {
    return (int)knob >= 0 && (int)knob < DEFT_DEBUG_KNOB_COUNT;
}

int64_t deft_debug(deft_debug_knob knob) {
    if (!deft_debug_known(knob)) return 0;
    pthread_once(&deft_debug_once, deft_debug_init);
    return atomic_load_explicit(&deft_debug_values[knob], memory_order_relaxed);
}

void deft_debug_set(deft_debug_knob knob, int64_t value) {
    if (!deft_debug_known(knob)) return;
    pthread_once(&deft_debug_once, deft_debug_init);   /* so that the environment cannot overwrite it later */
    atomic_store(&deft_debug_values[knob], value);
}

const char *deft_debug_name(deft_debug_knob knob) {
    return deft_debug_known(knob) ? deft_debug_table[knob].name : NULL;
}

int deft_debug_find(const char *name) {
    if (!name) return -1;
    if (strncmp(name, "DEFT_", 5) == 0) name += 5;
    for (int k = 0; k < DEFT_DEBUG_KNOB_COUNT; k++)
        if (strcmp(name, deft_debug_table[k].name) == 0) return k;
    return -1;
}

const char *deft_env_get(const char *name) { return name ? getenv(name) : NULL; }
