/* Test support for the gate deft_dist_run's replicas pass around each collective (deft_testing_gate): threads that
 * stand for the replicas pass it as their runs would, counting who had arrived whenever one gets through. */
#define _POSIX_C_SOURCE 200809L
#include "deft_testing.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dist.h"

#define DEFT_TESTING_GATE_MAX 16
#define DEFT_TESTING_GATE_PASSES 256

typedef struct deft_testing_gate_run {
    deft_dist d;
    deft_testing_gate_case c;
    pthread_mutex_t lock;
    int arrived[DEFT_TESTING_GATE_PASSES];
    bool release_stuck;
    deft_testing_gate_result *out;
} deft_testing_gate_run;

typedef struct deft_testing_gate_thread {
    deft_testing_gate_run *run;
    int index;
} deft_testing_gate_thread;

/* Replicas still in the run when passage k opens. */
static int deft_testing_gate_expected(const deft_testing_gate_case *c, int k) {
    return c->quitter >= 0 && k >= c->quit_after ? c->threads - 1 : c->threads;
}

static void deft_testing_gate_nap(void) {
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* The stuck replica neither arrives nor leaves until the others are done. */
static void deft_testing_gate_stall(deft_testing_gate_run *r) {
    for (;;) {
        pthread_mutex_lock(&r->lock);
        const bool go = r->release_stuck;
        pthread_mutex_unlock(&r->lock);
        if (go) return;
        deft_testing_gate_nap();
    }
}

static void *deft_testing_gate_main(void *arg) {
    deft_testing_gate_thread *t = arg;
    deft_testing_gate_run *r = t->run;
    const deft_testing_gate_case *c = &r->c;
    deft_status s = DEFT_OK;
    int k = 0;
    for (; k < c->passes && s == DEFT_OK; k++) {
        if (t->index == c->quitter && k == c->quit_after) {
            if (c->stuck) deft_testing_gate_stall(r);
            break;
        }
        pthread_mutex_lock(&r->lock);
        r->arrived[k]++;
        pthread_mutex_unlock(&r->lock);
        s = deft_dist_gate_pass(&r->d, t->index, "test collective");
        if (s != DEFT_OK) break;
        pthread_mutex_lock(&r->lock);
        if (r->arrived[k] != deft_testing_gate_expected(c, k)) r->out->early_passes++;
        pthread_mutex_unlock(&r->lock);
    }
    r->out->status[t->index] = s;
    r->out->passed[t->index] = k;
    if (s != DEFT_OK) snprintf(r->out->message[t->index], sizeof r->out->message[t->index], "%s", deft_errmsg());
    deft_dist_gate_leave(r->d.gate);
    return NULL;
}

int deft_testing_gate(const deft_testing_gate_case *c, deft_testing_gate_result *out) {
    memset(out, 0, sizeof *out);
    if (c->threads < 1 || c->threads > DEFT_TESTING_GATE_MAX || c->passes < 0 || c->passes > DEFT_TESTING_GATE_PASSES)
        return -1;
    deft_testing_gate_run r;
    memset(&r, 0, sizeof r);
    r.c = *c;
    r.out = out;
    r.d.n_local = c->threads;
    r.d.world = c->threads;
    r.d.running = 1;
    r.d.timeout_s = c->timeout_s;
    for (int i = 0; i < c->threads; i++) r.d.rank[i] = i;
    if (deft_dist_gate_new(&r.d.gate) != DEFT_OK || pthread_mutex_init(&r.lock, NULL) != 0) return -1;
    deft_dist_gate_begin(r.d.gate, c->threads);
    deft_testing_gate_thread t[DEFT_TESTING_GATE_MAX];
    pthread_t th[DEFT_TESTING_GATE_MAX];
    int started = 0;
    for (; started < c->threads; started++) {
        t[started] = (deft_testing_gate_thread){&r, started};
        if (pthread_create(&th[started], NULL, deft_testing_gate_main, &t[started]) != 0) break;
    }
    for (int i = 0; i < started; i++) {
        if (i == c->quitter && c->stuck) continue;
        pthread_join(th[i], NULL);
    }
    pthread_mutex_lock(&r.lock);
    r.release_stuck = true;
    pthread_mutex_unlock(&r.lock);
    if (c->stuck && c->quitter >= 0 && c->quitter < started) pthread_join(th[c->quitter], NULL);
    pthread_mutex_destroy(&r.lock);
    deft_dist_gate_free(r.d.gate);
    return started == c->threads ? 0 : -1;
}
