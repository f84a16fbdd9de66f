/* Offset assignment for one arena. Two greedy strategies run and the smaller arena wins:
 *  - by size: the largest buffers are placed first, so small ones fill the holes they leave;
 *  - by first use: buffers are placed in schedule order (largest first among those born at the same step), which
 *    wins on long chains where lifetimes, not sizes, decide what can share.
 * Each buffer goes into the best-fitting gap among the already placed buffers whose lifetimes overlap its own.
 * Placed buffers are indexed by time buckets so that finding the overlapping ones costs about the number of
 * buffers live around that time, not the number placed: this keeps 100k-buffer plans fast. */
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "planner.h"

#define DEFT_BUCKET_STEPS 32

typedef struct deft_order_key {
    size_t size;
    int first;
    int idx;
} deft_order_key;

typedef struct deft_placed {
    size_t offset, size;
} deft_placed;

typedef struct deft_bucket {
    int *items;
    int n, cap;
} deft_bucket;

typedef struct deft_plan_work {
    const deft_plan_buffer *bufs;
    size_t *offsets;        /* per buffer, the strategy's answer */
    int *stamp;             /* per buffer, the query that last saw it (dedupes long-lived ones) */
    deft_bucket *buckets;
    int n_buckets;
    deft_placed *scratch;   /* overlapping placed buffers of one query */
    int *found;
} deft_plan_work;

static int deft_by_size_desc(const void *pa, const void *pb) {
    const deft_order_key *a = pa, *b = pb;
    if (a->size != b->size) return a->size < b->size ? 1 : -1;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    return a->idx - b->idx;
}

static int deft_by_first_use(const void *pa, const void *pb) {
    const deft_order_key *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->size != b->size) return a->size < b->size ? 1 : -1;
    return a->idx - b->idx;
}

static int deft_by_offset(const void *pa, const void *pb) {
    const deft_placed *a = pa, *b = pb;
    return a->offset < b->offset ? -1 : a->offset > b->offset ? 1 : 0;
}

static size_t deft_lower_bound(const deft_plan_buffer *bufs, int n, int steps) {
    long long *delta = calloc((size_t)steps + 2, sizeof *delta);
    if (!delta) return 0;
    for (int i = 0; i < n; i++) {
        delta[bufs[i].first] += (long long)deft_plan_align(bufs[i].size);
        delta[bufs[i].last + 1] -= (long long)deft_plan_align(bufs[i].size);
    }
    long long live = 0, peak = 0;
    for (int s = 0; s <= steps; s++) {
        live += delta[s];
        if (live > peak) peak = live;
    }
    free(delta);
    return (size_t)peak;
}

/* Best-fit gap among `placed` (sorted by offset) for `size` bytes; above them all if none fits. */
static size_t deft_best_gap(const deft_placed *placed, int np, size_t size) {
    size_t best = (size_t)-1, best_waste = (size_t)-1, cursor = 0;
    for (int j = 0; j < np; j++) {
        if (placed[j].offset > cursor && placed[j].offset - cursor >= size) {
            size_t waste = placed[j].offset - cursor - size;
            if (waste < best_waste) {
                best_waste = waste;
                best = cursor;
            }
        }
        size_t end = placed[j].offset + placed[j].size;
        if (end > cursor) cursor = end;
    }
    return best != (size_t)-1 ? best : cursor;
}

/* Keeps each bucket sorted by offset, so a query inside one bucket needs no sort. */
static int deft_bucket_insert(deft_bucket *b, int item, const size_t *offsets) {
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 8;
        int *items = realloc(b->items, (size_t)cap * sizeof *items);
        if (!items) return -1;
        b->items = items;
        b->cap = cap;
    }
    int lo = 0, hi = b->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (offsets[b->items[mid]] <= offsets[item]) lo = mid + 1;
        else hi = mid;
    }
    memmove(b->items + lo + 1, b->items + lo, (size_t)(b->n - lo) * sizeof *b->items);
    b->items[lo] = item;
    b->n++;
    return 0;
}

static void deft_sort_placed(deft_placed *a, int n) {
    if (n < 24) {
        for (int i = 1; i < n; i++) {
            deft_placed x = a[i];
            int j = i - 1;
            for (; j >= 0 && a[j].offset > x.offset; j--) a[j + 1] = a[j];
            a[j + 1] = x;
        }
        return;
    }
    qsort(a, (size_t)n, sizeof *a, deft_by_offset);
}

/* The placed buffers whose lifetimes overlap buffer i's, into w->scratch sorted by offset; returns their count. */
static int deft_overlapping(deft_plan_work *w, int i) {
    const deft_plan_buffer *b = &w->bufs[i];
    int np = 0, k0 = b->first / DEFT_BUCKET_STEPS, k1 = b->last / DEFT_BUCKET_STEPS;
    for (int k = k0; k <= k1; k++) {
        const deft_bucket *bk = &w->buckets[k];
        for (int j = 0; j < bk->n; j++) {
            int o = bk->items[j];
            if (w->stamp[o] == i) continue;
            w->stamp[o] = i;
            if (w->bufs[o].first <= b->last && b->first <= w->bufs[o].last)
                w->scratch[np++] = (deft_placed){w->offsets[o], deft_plan_align(w->bufs[o].size)};
        }
    }
    if (k1 > k0) deft_sort_placed(w->scratch, np);
    return np;
}

static deft_status deft_place_in_order(deft_plan_work *w, const deft_order_key *order, int n, size_t *arena) {
    for (int k = 0; k < w->n_buckets; k++) w->buckets[k].n = 0;
    for (int i = 0; i < n; i++) w->stamp[i] = -1;
    *arena = 0;
    for (int k = 0; k < n; k++) {
        int i = order[k].idx;
        int np = deft_overlapping(w, i);
        size_t size = deft_plan_align(w->bufs[i].size);
        w->offsets[i] = deft_best_gap(w->scratch, np, size);
        if (w->offsets[i] + size > *arena) *arena = w->offsets[i] + size;
        for (int b = w->bufs[i].first / DEFT_BUCKET_STEPS; b <= w->bufs[i].last / DEFT_BUCKET_STEPS; b++)
            if (deft_bucket_insert(&w->buckets[b], i, w->offsets) != 0)
                return deft_set_error(DEFT_ERR_OOM, "planner: out of host memory");
    }
    return DEFT_OK;
}

static void deft_work_free(deft_plan_work *w, deft_order_key *order) {
    for (int k = 0; w->buckets && k < w->n_buckets; k++) free(w->buckets[k].items);
    free(w->buckets);
    free(w->offsets);
    free(w->stamp);
    free(w->scratch);
    free(order);
}

static deft_status deft_plan_greedy(deft_plan_buffer *bufs, int n, int steps, size_t *arena) {
    size_t count = n > 0 ? (size_t)n : 1;
    deft_plan_work w = {.bufs = bufs, .n_buckets = steps / DEFT_BUCKET_STEPS + 1};
    w.offsets = malloc(count * sizeof *w.offsets);
    w.stamp = malloc(count * sizeof *w.stamp);
    w.scratch = malloc(count * sizeof *w.scratch);
    w.buckets = calloc((size_t)w.n_buckets, sizeof *w.buckets);
    deft_order_key *order = malloc(count * sizeof *order);
    if (!w.offsets || !w.stamp || !w.scratch || !w.buckets || !order) {
        deft_work_free(&w, order);
        return deft_set_error(DEFT_ERR_OOM, "planner: out of host memory for %d buffers", n);
    }
    for (int i = 0; i < n; i++) order[i] = (deft_order_key){bufs[i].size, bufs[i].first, i};
    int (*strategies[2])(const void *, const void *) = {deft_by_size_desc, deft_by_first_use};
    deft_status s = DEFT_OK;
    *arena = (size_t)-1;
    for (int k = 0; k < 2 && s == DEFT_OK; k++) {
        size_t this_arena;
        qsort(order, (size_t)n, sizeof *order, strategies[k]);
        s = deft_place_in_order(&w, order, n, &this_arena);
        if (s == DEFT_OK && this_arena < *arena) {
            *arena = this_arena;
            for (int i = 0; i < n; i++) bufs[i].offset = w.offsets[i];
        }
    }
    deft_work_free(&w, order);
    return s;
}

deft_status deft_plan_offsets(deft_plan_buffer *bufs, int n, int no_reuse, deft_plan_stats *stats) {
    memset(stats, 0, sizeof *stats);
    if (n < 0) return deft_set_error(DEFT_ERR_INVALID, "planner: %d buffers", n);
    int steps = 0;
    for (int i = 0; i < n; i++) {
        if (bufs[i].last < bufs[i].first || bufs[i].first < 0)
            return deft_set_error(DEFT_ERR_INVALID, "planner: buffer %d has lifetime [%d, %d]", i, bufs[i].first,
                                  bufs[i].last);
        stats->no_reuse_bytes += deft_plan_align(bufs[i].size);
        if (bufs[i].last + 1 > steps) steps = bufs[i].last + 1;
    }
    stats->lower_bound = deft_lower_bound(bufs, n, steps);
    if (no_reuse) {
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            bufs[i].offset = off;
            off += deft_plan_align(bufs[i].size);
        }
        stats->arena_bytes = off;
        return DEFT_OK;
    }
    if (n == 0) return DEFT_OK;
    return deft_plan_greedy(bufs, n, steps, &stats->arena_bytes);
}
