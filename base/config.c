/* The environment switches (DEFT_*_REFERENCE, DEFT_CONV_GEMM, ...), declared in graph_internal.h. Read at each
 * call: a getenv is nothing beside a compile or an eager launch, graph replays never ask, and tests switch them
 * between runs. */
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

bool deft_env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

int64_t deft_env_int(const char *name, int64_t fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end = NULL;
    const long long r = strtoll(v, &end, 10);
    return (end && *end == '\0') ? (int64_t)r : fallback;
}
