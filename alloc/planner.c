/* Greedy-by-size offset assignment: the largest buffers are placed first, each into the lowest-waste gap left by
 * the already placed buffers whose lifetimes overlap it (best fit), or above them all. */
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "planner.h"

typedef struct deft_placed {
    size_t offset, size;
} deft_placed;

static const deft_plan_buffer *deft_sort_bufs;

static int deft_by_size_desc(const void *pa, const void *pb) {
    const deft_plan_buffer *a = &deft_sort_bufs[*(const int *)pa], *b = &deft_sort_bufs[*(const int *)pb];
    if (a->size != b->size) return a->size < b->size ? 1 : -1;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    return *(const int *)pa - *(const int *)pb;
}

static int deft_by_offset(const void *pa, const void *pb) {
    const deft_placed *a = pa, *b = pb;
    return a->offset < b->offset ? -1 : a->offset > b->offset ? 1 : 0;
}

static size_t deft_lower_bound(const deft_plan_buffer *bufs, int n) {
    int steps = 0;
    for (int i = 0; i < n; i++)
        if (bufs[i].last + 2 > steps) steps = bufs[i].last + 2;
    long long *delta = calloc((size_t)steps + 1, sizeof *delta);
    if (!delta) return 0;
    for (int i = 0; i < n; i++) {
        delta[bufs[i].first] += (long long)deft_plan_align(bufs[i].size);
        delta[bufs[i].last + 1] -= (long long)deft_plan_align(bufs[i].size);
    }
    long long live = 0, peak = 0;
    for (int s = 0; s < steps; s++) {
        live += delta[s];
        if (live > peak) peak = live;
    }
    free(delta);
    return (size_t)peak;
}

/* Best-fit gap among `placed` (sorted by offset) for `size` bytes. */
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

deft_status deft_plan_offsets(deft_plan_buffer *bufs, int n, int no_reuse, deft_plan_stats *stats) {
    memset(stats, 0, sizeof *stats);
    if (n < 0) return deft_set_error(DEFT_ERR_INVALID, "planner: %d buffers", n);
    for (int i = 0; i < n; i++) {
        if (bufs[i].last < bufs[i].first || bufs[i].first < 0)
            return deft_set_error(DEFT_ERR_INVALID, "planner: buffer %d has lifetime [%d, %d]", i, bufs[i].first,
                                  bufs[i].last);
        stats->no_reuse_bytes += deft_plan_align(bufs[i].size);
    }
    if (no_reuse) {
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            bufs[i].offset = off;
            off += deft_plan_align(bufs[i].size);
        }
        stats->arena_bytes = off;
        stats->lower_bound = deft_lower_bound(bufs, n);
        return DEFT_OK;
    }
    size_t count = n > 0 ? (size_t)n : 1;
    int *order = malloc(count * sizeof *order);
    deft_placed *placed = malloc(count * sizeof *placed);
    if (!order || !placed) {
        free(order);
        free(placed);
        return deft_set_error(DEFT_ERR_OOM, "planner: out of host memory for %d buffers", n);
    }
    for (int i = 0; i < n; i++) order[i] = i;
    deft_sort_bufs = bufs;
    qsort(order, (size_t)n, sizeof *order, deft_by_size_desc);
    size_t arena = 0;
    for (int k = 0; k < n; k++) {
        deft_plan_buffer *b = &bufs[order[k]];
        int np = 0;
        for (int j = 0; j < k; j++) {
            const deft_plan_buffer *o = &bufs[order[j]];
            if (o->first <= b->last && b->first <= o->last)
                placed[np++] = (deft_placed){o->offset, deft_plan_align(o->size)};
        }
        qsort(placed, (size_t)np, sizeof *placed, deft_by_offset);
        b->offset = deft_best_gap(placed, np, deft_plan_align(b->size));
        if (b->offset + deft_plan_align(b->size) > arena) arena = b->offset + deft_plan_align(b->size);
    }
    stats->arena_bytes = arena;
    stats->lower_bound = deft_lower_bound(bufs, n);
    free(order);
    free(placed);
    return DEFT_OK;
}
