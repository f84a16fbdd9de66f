/* deft_loader: pinned batches filled ahead of the training loop by a thread of their own, fed asynchronously.
 *
 * Batches are numbered in one sequence over the epochs (seq = epoch * batches_per_epoch + index); seq n lives in
 * buffer n % depth. The thread fills seq n once the buffer is free (n < released + depth), in order, so the order
 * never depends on timing. The consumer (deft_loader_next, on the training loop's thread) takes seq n once filled,
 * feeds it with deft_program_feed_async, and records a fence on the copy stream; a buffer goes back to the thread
 * (released, in order) once its fence has passed. Fences are queried without blocking on each call; the host waits
 * on one only when the next buffer the thread needs is still being copied from, i.e. when the loop runs `depth`
 * batches ahead of the device. Only the consumer makes CUDA calls, so a fill never meets a capture in progress. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "device_internal.h"
#include "loader_internal.h"
#include "prefetch.h"
#include "program_graph.h"
#include "program_state.h"

#define DEFT_LOADER_DEPTH 3
#define DEFT_LOADER_MAX_DEPTH 64

typedef struct deft_loader_buffer {
    void **data;         /* one pinned block per input */
    void *fence;         /* event on the copy stream after this buffer's copies (created on first use) */
    int fence_device;
    int fenced;          /* fence recorded and not yet seen to pass */
} deft_loader_buffer;

struct deft_loader {
    int n_inputs;
    deft_tensor **inputs;
    size_t *bytes;
    int64_t per_epoch;
    int depth;
    deft_loader_fill fill;
    void *ctx;
    void (*ctx_free)(void *ctx);
    deft_loader_buffer *buffers;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    int64_t filled;      /* seqs below it are filled */
    int64_t released;    /* seqs below it are free for refilling */
    int stop;
    deft_status error;   /* the fill of seq `filled` failed */
    char errmsg[1024];

    int64_t start;       /* the seq the thread fills first (0, or where deft_loader_seek put it) */

    /* the consumer's own */
    int64_t next;        /* the seq the next deft_loader_next takes */
    int end_due;         /* the last batch of an epoch was taken: the next call reports the end */
};

deft_status deft_loader_error(deft_status s, const char *fmt, ...) {
    if (!fmt) return deft_set_error(s, "%s", "");
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return deft_set_error(s, "%s", buf);
}

static void *deft_loader_main(void *arg) {
    deft_loader *l = arg;
    for (int64_t seq = l->start;; seq++) {
        pthread_mutex_lock(&l->mu);
        while (!l->stop && seq >= l->released + l->depth) pthread_cond_wait(&l->cv, &l->mu);
        int stop = l->stop;
        pthread_mutex_unlock(&l->mu);
        if (stop) break;
        deft_set_error(DEFT_OK, "%s", "");   /* so a callback that fails silently is told apart */
        deft_status s = l->fill(l->ctx, seq / l->per_epoch, seq % l->per_epoch,
                                (void *const *)l->buffers[seq % l->depth].data);
        pthread_mutex_lock(&l->mu);
        if (s != DEFT_OK) {
            l->error = s;
            if (deft_errmsg()[0]) snprintf(l->errmsg, sizeof l->errmsg, "%s", deft_errmsg());
            else snprintf(l->errmsg, sizeof l->errmsg, "the fill callback returned %s without a message",
                          deft_status_name(s));
        } else {
            l->filled = seq + 1;
        }
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        if (s != DEFT_OK) break;
    }
    return NULL;
}

/* Hands back to the thread, in order, the buffers whose copies have passed; with `wait_for`, waits until seq
 * wait_for is released too. */
static deft_status deft_loader_release(deft_loader *l, int64_t wait_for) {
    pthread_mutex_lock(&l->mu);
    int64_t r = l->released;
    pthread_mutex_unlock(&l->mu);
    int64_t start = r;
    deft_status s = DEFT_OK;
    for (; r < l->next; r++) {
        deft_loader_buffer *b = &l->buffers[r % l->depth];
        if (b->fenced) {
            deft_status qs;
            int done = deft_prefetch_cuda_event_done(b->fence_device, b->fence, &qs);
            if (!done && qs == DEFT_OK && r <= wait_for) qs = deft_prefetch_cuda_event_sync(b->fence_device, b->fence);
            else if (!done && qs == DEFT_OK) break;
            if (qs != DEFT_OK) {
                s = qs;
                break;
            }
            b->fenced = 0;
        }
    }
    if (r != start) {
        pthread_mutex_lock(&l->mu);
        l->released = r;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
    }
    return s;
}

deft_status deft_loader_next(deft_loader *l, deft_program *p, deft_loader_batch *out) {
    if (out) *out = (deft_loader_batch){.index = -1};
    if (!l) return deft_set_error(DEFT_ERR_INVALID, "loader_next: loader is NULL");
    if (!p) return deft_set_error(DEFT_ERR_INVALID, "loader_next: program is NULL");
    int64_t n = l->next;
    if (l->end_due) {
        l->end_due = 0;
        if (out) *out = (deft_loader_batch){.epoch = n / l->per_epoch - 1, .index = -1, .fed = n, .end = 1};
        return DEFT_OK;
    }
    /* The thread fills seq n into the buffer of seq n - depth: that one's copy must have passed. */
    deft_status s = deft_loader_release(l, n - l->depth);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&l->mu);
    while (l->filled <= n && l->error == DEFT_OK) pthread_cond_wait(&l->cv, &l->mu);
    int filled = l->filled > n;
    char msg[1024];
    deft_status err = l->error;
    snprintf(msg, sizeof msg, "%s", l->errmsg);
    pthread_mutex_unlock(&l->mu);
    if (!filled)
        return deft_set_error(err, "loader: filling batch %lld of epoch %lld failed: %s",
                              (long long)(n % l->per_epoch), (long long)(n / l->per_epoch), msg);

    deft_loader_buffer *b = &l->buffers[n % l->depth];
    for (int i = 0; i < l->n_inputs; i++) {
        s = deft_program_feed_async(p, l->inputs[i], b->data[i], l->bytes[i]);
        if (s != DEFT_OK) return s;
    }
    s = deft_prefetch_fence(p, &b->fence, &b->fence_device, &b->fenced);
    if (s != DEFT_OK) {
        /* Without a fence the copies are waited for here, so the buffer can still be recycled safely. */
        (void)deft_device_synchronize(deft_cuda(p->gpu->device));
        b->fenced = 0;
        return s;
    }
    l->next = n + 1;
    l->end_due = (n + 1) % l->per_epoch == 0;
    if (out) *out = (deft_loader_batch){.epoch = n / l->per_epoch, .index = n % l->per_epoch, .fed = n + 1};
    return DEFT_OK;
}

/* Waits for a fill in progress to end and the thread with it. */
static void deft_loader_stop_thread(deft_loader *l) {
    if (!l->thread_started) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->thread_started = 0;
}

static deft_status deft_loader_start_thread(deft_loader *l, const char *what) {
    l->stop = 0;
    int e = pthread_create(&l->thread, NULL, deft_loader_main, l);
    if (e != 0) return deft_set_error(DEFT_ERR_RUNTIME, "%s: starting the thread failed: %s", what, strerror(e));
    l->thread_started = 1;
    return DEFT_OK;
}

void deft_loader_position(const deft_loader *l, int64_t *epoch, int64_t *index) {
    int64_t e = 0, i = 0;
    if (l && l->end_due) e = l->next / l->per_epoch - 1, i = l->per_epoch;
    else if (l) e = l->next / l->per_epoch, i = l->next % l->per_epoch;
    if (epoch) *epoch = e;
    if (index) *index = i;
}

int64_t deft_loader_batches_per_epoch(const deft_loader *l) { return l ? l->per_epoch : 0; }

/* The thread is stopped and every buffer's copy waited for before the counters move, so no buffer a copy still
 * reads is filled again, and the batches from the new position come in the same order as from a new loader. */
deft_status deft_loader_seek(deft_loader *l, int64_t epoch, int64_t index) {
    if (!l) return deft_set_error(DEFT_ERR_INVALID, "loader_seek: loader is NULL");
    int64_t seq;
    if (epoch < 0 || index < 0 || index > l->per_epoch || !deft_i64_mul(epoch, l->per_epoch, &seq) ||
        !deft_i64_add(seq, index, &seq) || seq > INT64_MAX - 2 * (int64_t)DEFT_LOADER_MAX_DEPTH)
        return deft_set_error(DEFT_ERR_INVALID, "loader_seek: position (epoch %lld, index %lld) is out of range; an "
                              "epoch has %lld batches (index %lld: its end not yet reported)", (long long)epoch,
                              (long long)index, (long long)l->per_epoch, (long long)l->per_epoch);
    deft_loader_stop_thread(l);
    deft_status s = DEFT_OK;
    for (int k = 0; k < l->depth; k++) {
        deft_loader_buffer *b = &l->buffers[k];
        deft_status qs = b->fenced ? deft_prefetch_cuda_event_sync(b->fence_device, b->fence) : DEFT_OK;
        if (qs != DEFT_OK && s == DEFT_OK) s = qs;
        b->fenced = 0;
    }
    l->start = l->filled = l->released = l->next = seq;
    l->end_due = index == l->per_epoch;
    l->error = DEFT_OK;
    l->errmsg[0] = '\0';
    deft_status ts = deft_loader_start_thread(l, "loader_seek");
    if (ts != DEFT_OK) {   /* no thread will fill: deft_loader_next must say so rather than wait */
        l->error = ts;
        snprintf(l->errmsg, sizeof l->errmsg, "%s", deft_errmsg());
    }
    return s != DEFT_OK ? s : ts;
}

void deft_loader_free(deft_loader *l) {
    if (!l) return;
    deft_loader_stop_thread(l);
    for (int k = 0; l->buffers && k < l->depth; k++) {
        deft_loader_buffer *b = &l->buffers[k];
        if (b->fenced) (void)deft_prefetch_cuda_event_sync(b->fence_device, b->fence);
        if (b->fence) deft_prefetch_cuda_event_free(b->fence_device, b->fence);
        for (int i = 0; b->data && i < l->n_inputs; i++) (void)deft_pinned_free(b->data[i]);
        free(b->data);
    }
    if (l->ctx_free) l->ctx_free(l->ctx);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l->buffers);
    free(l->bytes);
    free(l->inputs);
    free(l);
}

static deft_status deft_loader_check(deft_tensor *const *inputs, int n_inputs, int64_t per_epoch, int depth,
                                     deft_loader_fill fill, deft_loader **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "loader_new: out is NULL");
    *out = NULL;
    if (!inputs || n_inputs < 1 || n_inputs > 64)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new: %d inputs (1 to 64 are needed)%s", n_inputs,
                              inputs ? "" : ", and the array is NULL");
    for (int i = 0; i < n_inputs; i++) {
        if (!inputs[i]) return deft_set_error(DEFT_ERR_INVALID, "loader_new: input %d is NULL", i);
        if (inputs[i]->op != DEFT_OP_INPUT)
            return deft_set_error(DEFT_ERR_INVALID, "loader_new: %s is a %s, not an input", inputs[i]->name,
                                  deft_op_name(inputs[i]->op));
    }
    if (per_epoch < 1)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new: %lld batches per epoch (at least 1 is needed)",
                              (long long)per_epoch);
    if (depth != 0 && (depth < 2 || depth > DEFT_LOADER_MAX_DEPTH))
        return deft_set_error(DEFT_ERR_INVALID, "loader_new: depth %d (0 for %d, or 2 to %d)", depth,
                              DEFT_LOADER_DEPTH, DEFT_LOADER_MAX_DEPTH);
    if (!fill) return deft_set_error(DEFT_ERR_INVALID, "loader_new: the fill callback is NULL");
    return DEFT_OK;
}

/* Takes ownership of ctx (freed with ctx_free, also on failure). */
static deft_status deft_loader_create(deft_tensor *const *inputs, int n_inputs, int64_t per_epoch, int depth,
                                      deft_loader_fill fill, void *ctx, void (*ctx_free)(void *), deft_loader **out) {
    deft_status s = deft_loader_check(inputs, n_inputs, per_epoch, depth, fill, out);
    deft_loader *l = s == DEFT_OK ? calloc(1, sizeof *l) : NULL;
    if (!l) {
        if (ctx_free) ctx_free(ctx);
        return s != DEFT_OK ? s : deft_set_error(DEFT_ERR_OOM, "loader_new: out of host memory");
    }
    l->n_inputs = n_inputs;
    l->per_epoch = per_epoch;
    l->depth = depth ? depth : DEFT_LOADER_DEPTH;
    l->fill = fill;
    l->ctx = ctx;
    l->ctx_free = ctx_free;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->inputs = malloc((size_t)n_inputs * sizeof *l->inputs);
    l->bytes = malloc((size_t)n_inputs * sizeof *l->bytes);
    l->buffers = calloc((size_t)l->depth, sizeof *l->buffers);
    if (!l->inputs || !l->bytes || !l->buffers) s = deft_set_error(DEFT_ERR_OOM, "loader_new: out of host memory");
    for (int i = 0; s == DEFT_OK && i < n_inputs; i++) {
        l->inputs[i] = inputs[i];
        l->bytes[i] = deft_tensor_bytes(inputs[i]);
    }
    for (int k = 0; s == DEFT_OK && k < l->depth; k++) {
        deft_loader_buffer *b = &l->buffers[k];
        b->data = calloc((size_t)n_inputs, sizeof *b->data);
        if (!b->data) s = deft_set_error(DEFT_ERR_OOM, "loader_new: out of host memory");
        /* A zero-byte input gets NULL from the pool; the feed of zero bytes never reads it. */
        for (int i = 0; s == DEFT_OK && i < n_inputs; i++) s = deft_pinned_alloc(l->bytes[i], &b->data[i]);
    }
    if (s == DEFT_OK) s = deft_loader_start_thread(l, "loader_new");
    if (s != DEFT_OK) {
        deft_loader_free(l);
        return s;
    }
    *out = l;
    return DEFT_OK;
}

deft_status deft_loader_new(deft_tensor *const *inputs, int n_inputs, int64_t batches_per_epoch, int depth,
                            deft_loader_fill fill, void *ctx, deft_loader **out) {
    return deft_loader_create(inputs, n_inputs, batches_per_epoch, depth, fill, ctx, NULL, out);
}

/* ---- the built-in loader over a deft_dataset ---- */

typedef struct deft_dataset_feed {
    const deft_dataset *d;
    int64_t batch;
    int shuffle;
    uint64_t seed;
    int64_t *order;
    int64_t order_epoch;  /* the epoch `order` was drawn for, -1 before the first */
    int rank, world;      /* data parallel: this loader's batch `index` is the epoch's batch index * world + rank */
} deft_dataset_feed;

static void deft_dataset_feed_free(void *ctx) {
    deft_dataset_feed *f = ctx;
    if (f) free(f->order);
    free(f);
}

/* Runs on the loader's thread, epochs in order, so one permutation at a time suffices. */
static deft_status deft_dataset_fill(void *ctx, int64_t epoch, int64_t index, void *const *buffers) {
    deft_dataset_feed *f = ctx;
    if (f->shuffle && f->order_epoch != epoch) {
        deft_status s = deft_shuffle(f->order, f->d->n, f->seed + (uint64_t)epoch * 0x9E3779B97F4A7C15ull);
        if (s != DEFT_OK) return s;
        f->order_epoch = epoch;
    }
    const int64_t global = index * f->world + f->rank;
    return deft_dataset_batch(f->d, f->shuffle ? f->order : NULL, global * f->batch, f->batch, buffers[0], buffers[1]);
}

deft_status deft_loader_new_dataset(const deft_dataset *d, deft_tensor *x, deft_tensor *y, int shuffle, uint64_t seed,
                                    int depth, deft_loader **out) {
    return deft_loader_new_dataset_shard(d, x, y, shuffle, seed, 0, 1, depth, out);
}

deft_status deft_loader_new_dataset_shard(const deft_dataset *d, deft_tensor *x, deft_tensor *y, int shuffle,
                                          uint64_t seed, int rank, int world, int depth, deft_loader **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "loader_new_dataset: out is NULL");
    *out = NULL;
    if (!d || !d->images || !d->labels || d->n < 1)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new_dataset: the dataset is NULL or empty");
    if (!x || !y) return deft_set_error(DEFT_ERR_INVALID, "loader_new_dataset: x or y is NULL");
    int64_t batch = x->ndim == 2 ? x->shape[0] : 0;
    if (x->dtype != DEFT_F32 || x->ndim != 2 || x->shape[1] != d->features)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new_dataset: x (%s) must be f32 [batch, %lld]", x->name,
                              (long long)d->features);
    if (y->dtype != DEFT_I32 || y->ndim != 1 || y->shape[0] != batch)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new_dataset: y (%s) must be i32 [%lld], as x's batch",
                              y->name, (long long)batch);
    if (batch < 1 || batch > d->n)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new_dataset: a batch of %lld from %lld samples",
                              (long long)batch, (long long)d->n);
    if (world < 1 || rank < 0 || rank >= world)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new_dataset: rank %d of a world of %d", rank, world);
    if (d->n / batch < world)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new_dataset: %lld batches of %lld for %d ranks: every rank "
                              "needs one", (long long)(d->n / batch), (long long)batch, world);
    deft_dataset_feed *f = calloc(1, sizeof *f);
    if (f) f->order = shuffle ? malloc((size_t)d->n * sizeof *f->order) : NULL;
    if (!f || (shuffle && !f->order)) {
        deft_dataset_feed_free(f);
        return deft_set_error(DEFT_ERR_OOM, "loader_new_dataset: out of host memory");
    }
    *f = (deft_dataset_feed){.d = d, .batch = batch, .shuffle = shuffle, .seed = seed, .order = f->order,
                             .order_epoch = -1, .rank = rank, .world = world};
    return deft_loader_create((deft_tensor *[]){x, y}, 2, d->n / batch / world, depth, deft_dataset_fill, f,
                              deft_dataset_feed_free, out);
}
