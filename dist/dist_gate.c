/* The gate the local replicas of deft_dist_run pass around each collective they queue outside a replay. A collective
 * in flight on one GPU finishes only once every local replica's thread has queued its own. CUDA may make a thread
 * wait for its device inside an unrelated call (loading a kernel on its first use: cuBLASLt's first product of a
 * shape was seen waiting so in a replica's first run, holding the products' lock, while its GPU's collective waited
 * for threads stopped on that lock). So no thread queues collective k before every thread has queued collective
 * k - 1, and none goes on past collective k before every thread has queued it: whatever a thread then waits for on
 * its device has been queued on every GPU. Replays queue whole graphs and pass no gate. A replica whose run ends
 * (done or failed) leaves the gate, so the others never wait for one that will not come; each wait has the dist's
 * deadline. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "dist.h"
#include "graph_internal.h"

struct deft_dist_gate {
    pthread_mutex_t lock;
    pthread_cond_t moved;
    int parties;              /* replicas still in the run */
    int waiting;              /* arrived at the current passage */
    unsigned long passage;    /* bumped each time every party has arrived */
};

deft_status deft_dist_gate_new(deft_dist_gate **out) {
    *out = NULL;
    deft_dist_gate *g = calloc(1, sizeof *g);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "dist_run: out of host memory");
    pthread_condattr_t ca;
    bool attr = pthread_condattr_init(&ca) == 0;
    bool ok = attr && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
    bool lock = ok && pthread_mutex_init(&g->lock, NULL) == 0;
    bool cond = lock && pthread_cond_init(&g->moved, &ca) == 0;
    if (attr) pthread_condattr_destroy(&ca);
    if (!cond) {
        if (lock) pthread_mutex_destroy(&g->lock);
        free(g);
        return deft_set_error(DEFT_ERR_RUNTIME, "dist_run: cannot make the replicas' gate");
    }
    *out = g;
    return DEFT_OK;
}

void deft_dist_gate_free(deft_dist_gate *g) {
    if (!g) return;
    pthread_cond_destroy(&g->moved);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* The caller holds the lock: the passage opens when every party still in the run has arrived. */
static void deft_gate_open_if_full(deft_dist_gate *g) {
    if (g->waiting < g->parties || g->waiting == 0) return;
    g->waiting = 0;
    g->passage++;
    pthread_cond_broadcast(&g->moved);
}

void deft_dist_gate_begin(deft_dist_gate *g, int parties) {
    pthread_mutex_lock(&g->lock);
    g->parties = parties;
    g->waiting = 0;
    pthread_mutex_unlock(&g->lock);
}

void deft_dist_gate_leave(deft_dist_gate *g) {
    pthread_mutex_lock(&g->lock);
    if (g->parties > 0) g->parties--;
    deft_gate_open_if_full(g);
    pthread_mutex_unlock(&g->lock);
}

deft_status deft_dist_gate_pass(deft_dist *d, int local, const char *what) {
    deft_dist_gate *g = d->gate;
    if (!g || !d->running || d->n_local < 2) return DEFT_OK;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    const double wait_s = d->timeout_s < 1e9 ? d->timeout_s : 1e9;   /* a deadline time_t holds */
    const double whole = (double)(time_t)wait_s;
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((wait_s - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g->lock);
    const unsigned long mine = g->passage;
    g->waiting++;
    deft_gate_open_if_full(g);
    int e = 0;
    while (g->passage == mine && e != ETIMEDOUT) e = pthread_cond_timedwait(&g->moved, &g->lock, &until);
    const bool passed = g->passage != mine;
    if (!passed) g->waiting--;
    pthread_mutex_unlock(&g->lock);
    if (passed) return DEFT_OK;
    return deft_set_error(DEFT_ERR_RUNTIME, "%s: rank %d waited more than %.3g s for the other replicas of this "
                          "process to reach the same collective (one stopped or is stuck)", what, d->rank[local],
                          d->timeout_s);
}
