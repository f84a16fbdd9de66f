/* deft_dist_options from the variables a launcher sets (scripts/deft_launch and torchrun: RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_ADDR, MASTER_PORT; Open MPI's OMPI_COMM_WORLD_*; PMI's PMI_RANK and PMI_SIZE). They are the
 * launcher's protocol, not options or knobs, so they are read at each call through base/config.c's deft_env_get,
 * which keeps the library's one reader of the environment in one file; checking their values is this file's concern. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "dist.h"
#include "graph_internal.h"

/* The rendezvous (dist_rendezvous.c) takes host names of up to 255 bytes. */
#define DEFT_ENV_MAX_ADDR 255

/* One launcher's names for rank, world and local rank (NULL: it sets none). */
typedef struct deft_env_names {
    const char *launcher, *rank, *world, *local;
} deft_env_names;

static const deft_env_names deft_env_launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI", "PMI_RANK", "PMI_SIZE", NULL},
};

/* The variable's value; NULL when unset or empty (an empty export is as good as none). */
static const char *deft_env_value(const char *name) {
    const char *v = deft_env_get(name);
    return v && *v ? v : NULL;
}

/* The value of `name` as a decimal integer in [lo, hi]; `what` says what the bounds mean. */
static deft_status deft_env_int(const char *name, long lo, long hi, const char *what, int *out) {
    const char *v = deft_env_value(name);
    if (!v) return deft_set_error(DEFT_ERR_INVALID, "dist_init_env: %s is not set", name);
    char *end = NULL;
    errno = 0;
    const long x = strtol(v, &end, 10);
    /* strtol would also take leading blanks and a '+': a launcher writes neither */
    if ((!isdigit((unsigned char)v[0]) && v[0] != '-') || *end != '\0' || errno == ERANGE)
        return deft_set_error(DEFT_ERR_INVALID, "dist_init_env: %s=\"%s\" is not a decimal integer", name, v);
    if (x < lo || x > hi)
        return deft_set_error(DEFT_ERR_INVALID, "dist_init_env: %s=%ld: %s", name, x, what);
    *out = (int)x;
    return DEFT_OK;
}

/* The first launcher whose rank or world variable is set (the others are not looked at). */
static const deft_env_names *deft_env_launcher(void) {
    for (size_t i = 0; i < sizeof deft_env_launchers / sizeof deft_env_launchers[0]; i++)
        if (deft_env_value(deft_env_launchers[i].rank) || deft_env_value(deft_env_launchers[i].world))
            return &deft_env_launchers[i];
    return NULL;
}

static deft_status deft_env_ranks(const deft_env_names *l, int *rank, int *world, int *device) {
    char why[64];
    snprintf(why, sizeof why, "deft takes 1..%d ranks", DEFT_DIST_MAX_WORLD);
    deft_status s = deft_env_int(l->world, 1, DEFT_DIST_MAX_WORLD, why, world);
    if (s == DEFT_OK) s = deft_env_int(l->rank, 0, INT_MAX, "a rank must be >= 0", rank);
    if (s != DEFT_OK) return s;
    if (*rank >= *world)
        return deft_set_error(DEFT_ERR_INVALID, "dist_init_env: %s=%d is not below %s=%d", l->rank, *rank, l->world,
                              *world);
    *device = -1;
    if (l->local && deft_env_value(l->local))
        return deft_env_int(l->local, 0, INT_MAX, "a local rank must be >= 0", device);
    return DEFT_OK;
}

/* "tcp:MASTER_ADDR:MASTER_PORT" into buf (n bytes, room for any address of DEFT_ENV_MAX_ADDR), when it fits the
 * caller's buffer of `room` bytes. */
static deft_status deft_env_rendezvous(const deft_env_names *l, char *buf, size_t n, size_t room) {
    const char *mpi = l == &deft_env_launchers[0] ? "" : " (MPI launchers do not set it: mpirun -x it)";
    const char *addr = deft_env_value("MASTER_ADDR");
    if (!addr)
        return deft_set_error(DEFT_ERR_INVALID, "dist_init_env: MASTER_ADDR is not set: the ranks meet at "
                              "MASTER_ADDR:MASTER_PORT, rank 0's host%s", mpi);
    if (!deft_env_value("MASTER_PORT"))
        return deft_set_error(DEFT_ERR_INVALID, "dist_init_env: MASTER_PORT is not set: the ranks meet at "
                              "MASTER_ADDR:MASTER_PORT, a free port on rank 0's host%s", mpi);
    int port = 0;
    deft_status s = deft_env_int("MASTER_PORT", 1, 65535, "a port must be in 1..65535", &port);
    if (s != DEFT_OK) return s;
    const size_t len = strlen(addr);
    const size_t need = len + (size_t)snprintf(NULL, 0, "tcp::%d", port) + 1;
    if (len > DEFT_ENV_MAX_ADDR || need > room)
        return deft_set_error(DEFT_ERR_INVALID, "dist_init_env: MASTER_ADDR=\"%.64s%s\" (%zu bytes) is too long: "
                              "at most %d bytes, and \"tcp:MASTER_ADDR:MASTER_PORT\" (%zu bytes with its end) must "
                              "fit the rendezvous buffer of %zu", addr, len > 64 ? "..." : "", len, DEFT_ENV_MAX_ADDR,
                              need, room);
    snprintf(buf, n, "tcp:%s:%d", addr, port);
    return DEFT_OK;
}

deft_status deft_dist_options_from_env(deft_dist_options *o, char *rendezvous, size_t n) {
    if (!o || !rendezvous || n == 0)
        return deft_set_error(DEFT_ERR_INVALID, "dist_options_from_env: the options or the rendezvous buffer are "
                              "NULL or empty");
    const deft_env_names *l = deft_env_launcher();
    if (!l)
        return deft_set_error(DEFT_ERR_INVALID, "dist_init_env: no launcher's variables: RANK and WORLD_SIZE "
                              "(scripts/deft_launch, torchrun), OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE "
                              "(Open MPI) or PMI_RANK and PMI_SIZE are not set");
    int rank = 0, world = 0, device = -1;
    char spec[DEFT_ENV_MAX_ADDR + 16];
    deft_status s = deft_env_ranks(l, &rank, &world, &device);
    if (s == DEFT_OK) s = deft_env_rendezvous(l, spec, sizeof spec, n);
    if (s != DEFT_OK) return s;
    memcpy(rendezvous, spec, strlen(spec) + 1);
    o->rank = rank;
    o->world = world;
    o->device = device;
    o->rendezvous = rendezvous;
    return DEFT_OK;
}

deft_status deft_dist_init_env(double timeout_s, deft_dist **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "dist_init_env: out is NULL");
    *out = NULL;
    char spec[DEFT_ENV_MAX_ADDR + 16];
    deft_dist_options o = {.timeout_s = timeout_s};
    deft_status s = deft_dist_options_from_env(&o, spec, sizeof spec);
    return s == DEFT_OK ? deft_dist_init(&o, out) : s;
}
