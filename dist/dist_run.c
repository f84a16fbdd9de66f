/* deft_dist_run: the steps of every local replica queued together. NCCL needs the collectives of every GPU of a
 * communicator in flight together, so each replica's step is queued by a thread of its own: no all-reduce then waits
 * for a peer that the same thread would queue later. The threads are started at the first run and kept until
 * deft_dist_free. Starting them anew for every step cost several times the host time of waking kept ones
 * (bench/RESULTS.md, "Twelfth round"): host time a data loader can use. Outside a replay the threads queue each
 * collective through a gate (dist/dist_gate.c), so that no thread's wait on its own device can hold back a collective
 * another GPU waits for. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "dist.h"
#include "graph_internal.h"

typedef struct deft_dist_job {
    deft_program *p;
    deft_status status;
    char msg[1024];
} deft_dist_job;

typedef struct deft_dist_worker {
    struct deft_dist_workers *all;
    int index;
    pthread_t thread;
} deft_dist_worker;

typedef struct deft_dist_workers {
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    unsigned long run;    /* bumped for each run: a worker queues its replica once per value */
    int pending;          /* replicas of the current run not yet queued */
    bool quit;
    deft_dist_gate *gate; /* passed around each collective; left by a replica whose run ended */
    int n;                /* threads started */
    deft_dist_job jobs[DEFT_DIST_MAX_LOCAL];
    deft_dist_worker worker[DEFT_DIST_MAX_LOCAL];
} deft_dist_workers;

static void deft_dist_job_run(deft_dist_job *j) {
    j->status = deft_program_run(j->p);
    if (j->status != DEFT_OK) snprintf(j->msg, sizeof j->msg, "%s", deft_errmsg());
}

static void *deft_dist_worker_main(void *arg) {
    deft_dist_worker *me = arg;
    deft_dist_workers *w = me->all;
    unsigned long done_run = 0;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (w->run == done_run && !w->quit) pthread_cond_wait(&w->go, &w->lock);
        if (w->quit) break;
        done_run = w->run;
        pthread_mutex_unlock(&w->lock);
        deft_dist_job_run(&w->jobs[me->index]);
        deft_dist_gate_leave(w->gate);
        pthread_mutex_lock(&w->lock);
        if (--w->pending == 0) pthread_cond_signal(&w->done);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* Stops and joins the w->n threads started, then frees w. */
static void deft_dist_workers_free(deft_dist_workers *w) {
    pthread_mutex_lock(&w->lock);
    w->quit = true;
    pthread_cond_broadcast(&w->go);
    pthread_mutex_unlock(&w->lock);
    for (int i = 0; i < w->n; i++) pthread_join(w->worker[i].thread, NULL);
    deft_dist_gate_free(w->gate);
    pthread_cond_destroy(&w->done);
    pthread_cond_destroy(&w->go);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

void deft_dist_workers_stop(deft_dist *d) {
    if (!d->workers) return;
    deft_dist_workers_free(d->workers);
    d->workers = NULL;
    d->gate = NULL;
}

/* One thread per local replica; none is queued before every one has started, so a failure leaves no all-reduce
 * without its partners. */
static deft_status deft_dist_workers_start(deft_dist *d, int n) {
    deft_dist_workers *w = calloc(1, sizeof *w);
    if (!w) return deft_set_error(DEFT_ERR_OOM, "dist_run: out of host memory");
    bool lock = false, go = false, done = false;
    if (!(lock = pthread_mutex_init(&w->lock, NULL) == 0) || !(go = pthread_cond_init(&w->go, NULL) == 0) ||
        !(done = pthread_cond_init(&w->done, NULL) == 0)) {
        if (go) pthread_cond_destroy(&w->go);
        if (lock) pthread_mutex_destroy(&w->lock);
        free(w);
        return deft_set_error(DEFT_ERR_RUNTIME, "dist_run: cannot make the workers' lock");
    }
    deft_status s = deft_dist_gate_new(&w->gate);
    if (s != DEFT_OK) {
        deft_dist_workers_free(w);
        return s;
    }
    for (; w->n < n; w->n++) {
        w->worker[w->n] = (deft_dist_worker){.all = w, .index = w->n};
        if (pthread_create(&w->worker[w->n].thread, NULL, deft_dist_worker_main, &w->worker[w->n]) != 0) {
            const int failed = w->n;
            deft_dist_workers_free(w);
            return deft_set_error(DEFT_ERR_RUNTIME, "dist_run: cannot start a thread for replica %d", failed);
        }
    }
    d->workers = w;
    d->gate = w->gate;
    return DEFT_OK;
}

/* Hands every worker its replica and waits until each has queued its step (or failed to). */
static void deft_dist_workers_run(deft_dist_workers *w, deft_program *const *replicas, int n) {
    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < n; i++) w->jobs[i] = (deft_dist_job){.p = replicas[i]};
    w->pending = n;
    deft_dist_gate_begin(w->gate, n);
    w->run++;
    pthread_cond_broadcast(&w->go);
    while (w->pending > 0) pthread_cond_wait(&w->done, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

deft_status deft_dist_run(deft_dist *d, deft_program *const *replicas, int n) {
    if (!d || !replicas) return deft_set_error(DEFT_ERR_INVALID, "dist_run: the dist or the replicas are NULL");
    if (n != d->n_local)
        return deft_set_error(DEFT_ERR_INVALID, "dist_run: %d replicas for %d local communicators", n, d->n_local);
    /* A replica in the wrong place, twice, or of another dist would leave an all-reduce without its partner. */
    for (int i = 0; i < n; i++) {
        if (!replicas[i]) return deft_set_error(DEFT_ERR_INVALID, "dist_run: replica %d is NULL", i);
        const int local = deft_ddp_local_of(replicas[i], d);
        if (local < 0)
            return deft_set_error(DEFT_ERR_INVALID, "dist_run: replicas[%d] is not a replica of this dist (compile it "
                                  "with the options dist and dist_local = %d)", i, i);
        if (local != i)
            return deft_set_error(DEFT_ERR_INVALID, "dist_run: replicas[%d] was compiled with dist_local = %d; "
                                  "replicas[i] must be the one compiled with dist_local = i", i, local);
    }
    if (n == 1) return deft_program_run(replicas[0]);
    deft_status s = d->workers ? DEFT_OK : deft_dist_workers_start(d, n);
    if (s != DEFT_OK) return s;
    d->running = 1;
    deft_dist_workers_run(d->workers, replicas, n);
    d->running = 0;
    for (int i = 0; i < n; i++)
        if (d->workers->jobs[i].status != DEFT_OK)
            return deft_set_error(d->workers->jobs[i].status, "dist_run: rank %d: %s", d->rank[i],
                                  d->workers->jobs[i].msg);
    return DEFT_OK;
}
