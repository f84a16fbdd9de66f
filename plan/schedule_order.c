/* Reordering a schedule to lower its peak of live bytes. Five orders are tried and the given order 0..n-1 stays
 * unless one of them has a strictly lower peak (each is measured exactly, so the answer is never worse):
 *  - a list scheduler: among the steps whose inputs are all done, it runs the one that changes live memory least,
 *    its output's bytes (none if nothing reads it and it is not kept) minus the inputs it is the last reader of.
 *    It frees a big intermediate as soon as it can and starts cheap steps before expensive ones. Being greedy, it
 *    cannot see that a costly step now enables a large free later.
 *  - depth first from the outputs, inputs in their given order or the last first: one branch is finished before
 *    the next starts, which is what the greedy misses when every branch starts with cheap steps.
 *  - the same two depth-first orders, freeing eagerly: after each step, a value it made or read whose remaining
 *    readers can run (with the few steps they still need) and hold about no more than the value runs them at once.
 *    A loss taken in blocks then takes each block's gradient through the head's products (which free the block's
 *    logits) right after the block's loss, instead of holding every block's logits into the backward pass.
 *
 * The list scheduler's keys change as it goes: when all readers of a step but one have run, that last reader's key
 * drops by the step's bytes. Ready steps sit in an indexed heap whose keys only ever drop, so an update is a sift up;
 * each dependency is visited a constant number of times: O((n + edges) log n). The rest is O(n + edges). */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "schedule_order.h"

typedef struct deft_sched {
    const deft_order_step *steps;
    int n;
    int *dep_at, *deps;        /* each step's distinct dependencies: deps[dep_at[s] .. dep_at[s + 1]) */
    int *reader_at, *readers;  /* the steps that read each step, the same way */
    int *unmet;                /* per step, dependencies not yet run */
    int *unread;               /* per step, readers not yet run */
    uint64_t *freed;           /* per step, the bytes of the inputs it is the last reader of, as things stand */
    char *done;
    char *emitted;             /* the depth-first orders: placed in the order */
    int *heap, *heap_pos, heap_n;   /* ready steps; heap_pos -1 outside the heap */
} deft_sched;

/* What the step holds after it runs: nothing when no step reads it and it is not kept. */
static uint64_t deft_sched_alloc(const deft_sched *s, int i) {
    return s->reader_at[i + 1] > s->reader_at[i] || s->steps[i].keep_alive ? (uint64_t)s->steps[i].bytes : 0;
}

/* Whether step a should run before step b: the lower change of live bytes (compared without overflow), then the
 * smaller output (the lower peak while it runs), then the earlier step (the given order where nothing else decides). */
static int deft_sched_before(const deft_sched *s, int a, int b) {
    uint64_t alloc_a = deft_sched_alloc(s, a), alloc_b = deft_sched_alloc(s, b);
    uint64_t fa = s->freed[a], fb = s->freed[b];
    int neg_a = fa > alloc_a, neg_b = fb > alloc_b;
    if (neg_a != neg_b) return neg_a;
    uint64_t mag_a = neg_a ? fa - alloc_a : alloc_a - fa, mag_b = neg_b ? fb - alloc_b : alloc_b - fb;
    if (mag_a != mag_b) return neg_a ? mag_a > mag_b : mag_a < mag_b;
    if (s->steps[a].bytes != s->steps[b].bytes) return s->steps[a].bytes < s->steps[b].bytes;
    return a < b;
}

static void deft_heap_set(deft_sched *s, int k, int id) {
    s->heap[k] = id;
    s->heap_pos[id] = k;
}

static void deft_heap_up(deft_sched *s, int k) {
    int id = s->heap[k];
    while (k > 0 && deft_sched_before(s, id, s->heap[(k - 1) / 2])) {
        deft_heap_set(s, k, s->heap[(k - 1) / 2]);
        k = (k - 1) / 2;
    }
    deft_heap_set(s, k, id);
}

static int deft_heap_pop(deft_sched *s) {
    int top = s->heap[0], id = s->heap[--s->heap_n], k = 0;
    s->heap_pos[top] = -1;
    if (s->heap_n == 0) return top;
    for (;;) {
        int c = 2 * k + 1;
        if (c >= s->heap_n) break;
        if (c + 1 < s->heap_n && deft_sched_before(s, s->heap[c + 1], s->heap[c])) c++;
        if (!deft_sched_before(s, s->heap[c], id)) break;
        deft_heap_set(s, k, s->heap[c]);
        k = c;
    }
    deft_heap_set(s, k, id);
    return top;
}

static void deft_heap_push(deft_sched *s, int id) {
    deft_heap_set(s, s->heap_n++, id);
    deft_heap_up(s, s->heap_n - 1);
}

/* Step d is down to one reader that has not run: that reader now frees d. */
static void deft_sched_last_reader(deft_sched *s, int d) {
    if (s->steps[d].keep_alive || s->steps[d].bytes == 0) return;
    for (int k = s->reader_at[d]; k < s->reader_at[d + 1]; k++) {
        int r = s->readers[k];
        if (s->done[r]) continue;
        s->freed[r] += s->steps[d].bytes;
        if (s->heap_pos[r] >= 0) deft_heap_up(s, s->heap_pos[r]);
        return;
    }
}

static void deft_sched_run(deft_sched *s, int *order) {
    int n = s->n, at = 0;
    for (int i = 0; i < n; i++) {
        s->unmet[i] = s->dep_at[i + 1] - s->dep_at[i];
        s->unread[i] = s->reader_at[i + 1] - s->reader_at[i];
        s->freed[i] = 0;
        s->done[i] = 0;
        s->heap_pos[i] = -1;
    }
    s->heap_n = 0;
    for (int i = 0; i < n; i++)
        if (s->unread[i] == 1) deft_sched_last_reader(s, i);
    for (int i = 0; i < n; i++)
        if (s->unmet[i] == 0) deft_heap_push(s, i);
    while (s->heap_n > 0) {
        int i = deft_heap_pop(s);
        s->done[i] = 1;
        order[at++] = i;
        for (int k = s->dep_at[i]; k < s->dep_at[i + 1]; k++)
            if (--s->unread[s->deps[k]] == 1) deft_sched_last_reader(s, s->deps[k]);
        for (int k = s->reader_at[i]; k < s->reader_at[i + 1]; k++)
            if (--s->unmet[s->readers[k]] == 0) deft_heap_push(s, s->readers[k]);
    }
}

/* Whether every dependency of step r is placed. */
static int deft_sched_ready(const deft_sched *s, int r) {
    for (int k = s->dep_at[r]; k < s->dep_at[r + 1]; k++)
        if (!s->emitted[s->deps[k]]) return 0;
    return 1;
}

/* The eager orders place a value's remaining readers (with the steps they still need, if those can run) once all of
 * that costs at most this much more than the value: the step that frees a value often makes its own output first
 * (a gradient over the logits), and only the readers after it free anything. */
#define DEFT_SCHED_EAGER_SLACK 4   /* the value's bytes / 4 */

/* Queues the unplaced readers of value v, and the unplaced steps they read (each must be able to run now), when
 * together they hold at most v's bytes and the slack; returns the new queue length (cap: its room). */
static int deft_sched_queue_readers(const deft_sched *s, int v, int *pending, int n_pending, int cap) {
    if (s->steps[v].keep_alive || s->steps[v].bytes == 0) return n_pending;
    const uint64_t room = (uint64_t)s->steps[v].bytes + s->steps[v].bytes / DEFT_SCHED_EAGER_SLACK;
    uint64_t cost = 0;
    int first = n_pending;
    for (int k = s->reader_at[v]; k < s->reader_at[v + 1]; k++) {
        const int r = s->readers[k];
        if (s->emitted[r]) continue;
        if (n_pending >= cap) return first;
        pending[n_pending++] = r;
        cost += deft_sched_alloc(s, r);
        for (int q = s->dep_at[r]; q < s->dep_at[r + 1]; q++) {
            const int u = s->deps[q];
            if (s->emitted[u] || u == v) continue;
            if (!deft_sched_ready(s, u) || n_pending >= cap) return first;   /* its cone is not cheap to finish */
            pending[n_pending++] = u;   /* above r: placed before it */
            cost += deft_sched_alloc(s, u);
        }
        if (cost > room) return first;
    }
    return n_pending;
}

/* Places step i (which can run); with `eager`, then for i's output and each of its inputs, the remaining readers
 * deft_sched_queue_readers takes, and in turn theirs. `pending` is scratch of `cap` entries. */
static void deft_sched_place(deft_sched *s, int i, int *order, int *at, int eager, int *pending, int cap) {
    int n_pending = 0;
    pending[n_pending++] = i;
    while (n_pending > 0) {
        const int j = pending[--n_pending];
        if (s->emitted[j] || !deft_sched_ready(s, j)) continue;   /* placed already, or left to the walk */
        s->emitted[j] = 1;
        order[(*at)++] = j;
        if (!eager) continue;
        n_pending = deft_sched_queue_readers(s, j, pending, n_pending, cap);
        for (int k = s->dep_at[j]; k < s->dep_at[j + 1]; k++)
            n_pending = deft_sched_queue_readers(s, s->deps[k], pending, n_pending, cap);
    }
}

/* Depth first from the steps nobody reads, in their given order: a step runs right after the last of its inputs, each
 * input's whole cone before the next input's (the last input first when `last_first`). This finishes one branch
 * before the next starts, which the greedy misses when a branch starts with cheap steps and pays off only later
 * (every head's projections before any head's scores). `eager`: deft_sched_place's early frees. Returns the steps
 * placed: all n (every step lies in the cone of one nobody reads). */
static int deft_sched_depth_first(deft_sched *s, int *order, int last_first, int eager, int *pending, int cap) {
    int n = s->n, at = 0, *stack = s->heap, *cursor = s->unmet;
    for (int i = 0; i < n; i++) {
        s->done[i] = 0;
        s->emitted[i] = 0;
    }
    for (int root = 0; root < n; root++) {
        if (s->reader_at[root + 1] > s->reader_at[root]) continue;
        int depth = 0;
        stack[depth] = root;
        cursor[depth] = 0;
        s->done[root] = 1;
        while (depth >= 0) {
            int i = stack[depth], n_deps = s->dep_at[i + 1] - s->dep_at[i];
            if (cursor[depth] == n_deps) {
                deft_sched_place(s, i, order, &at, eager, pending, cap);
                depth--;
                continue;
            }
            int c = cursor[depth]++;
            int d = s->deps[s->dep_at[i] + (last_first ? n_deps - 1 - c : c)];
            if (s->done[d]) continue;
            s->done[d] = 1;
            stack[++depth] = d;
            cursor[depth] = 0;
        }
    }
    return at;
}

/* The most bytes live at any position of `order`, with pos and delta as scratch (n entries each). Sums wrap the way
 * the planner's do; only absurd totals would. */
static uint64_t deft_sched_peak(const deft_sched *s, const int *order, int *pos, uint64_t *delta) {
    int n = s->n;
    for (int k = 0; k < n; k++) {
        pos[order[k]] = k;
        delta[k] = 0;
    }
    for (int i = 0; i < n; i++) {
        int end = pos[i];
        if (s->steps[i].keep_alive) end = n - 1;
        for (int k = s->reader_at[i]; k < s->reader_at[i + 1]; k++)
            if (pos[s->readers[k]] > end) end = pos[s->readers[k]];
        delta[pos[i]] += s->steps[i].bytes;
        if (end + 1 < n) delta[end + 1] -= s->steps[i].bytes;
    }
    uint64_t live = 0, peak = 0;
    for (int k = 0; k < n; k++) {
        live += delta[k];
        if (live > peak) peak = live;
    }
    return peak;
}

/* Checks every dependency and builds the distinct-dependency and reader lists. */
static deft_status deft_sched_build(deft_sched *s, const int *deps) {
    int n = s->n;
    int *seen = malloc((size_t)n * sizeof *seen);
    if (!seen) return deft_set_error(DEFT_ERR_OOM, "schedule_order: out of host memory for %d steps", n);
    for (int i = 0; i < n; i++) seen[i] = -1;
    int m = 0;
    s->dep_at[0] = 0;
    for (int i = 0; i < n; i++) {
        for (int k = s->steps[i].dep_begin; k < s->steps[i].dep_end; k++) {
            int d = deps[k];
            if (d < 0 || d >= i) {
                free(seen);
                return deft_set_error(DEFT_ERR_INVALID,
                                      "schedule_order: step %d depends on step %d, not an earlier one", i, d);
            }
            if (seen[d] == i) continue;   /* read twice, counted once */
            seen[d] = i;
            s->deps[m++] = d;
            s->reader_at[d + 1]++;
        }
        s->dep_at[i + 1] = m;
    }
    free(seen);
    for (int i = 0; i < n; i++) s->reader_at[i + 1] += s->reader_at[i];
    /* Fill readers in step order, each list ascending, using unmet as the cursor. */
    for (int i = 0; i < n; i++) s->unmet[i] = s->reader_at[i];
    for (int i = 0; i < n; i++)
        for (int k = s->dep_at[i]; k < s->dep_at[i + 1]; k++) s->readers[s->unmet[s->deps[k]]++] = i;
    return DEFT_OK;
}

deft_status deft_schedule_order(const deft_order_step *steps, int n, const int *deps, int *order) {
    if (n < 0) return deft_set_error(DEFT_ERR_INVALID, "schedule_order: %d steps", n);
    if (n == 0) return DEFT_OK;
    if (!steps || !order) return deft_set_error(DEFT_ERR_INVALID, "schedule_order: steps or order is NULL");
    size_t n_edges = 0;
    for (int i = 0; i < n; i++) {
        if (steps[i].dep_begin < 0 || steps[i].dep_end < steps[i].dep_begin)
            return deft_set_error(DEFT_ERR_INVALID, "schedule_order: step %d has dependencies [%d, %d)", i,
                                  steps[i].dep_begin, steps[i].dep_end);
        n_edges += (size_t)(steps[i].dep_end - steps[i].dep_begin);
    }
    if (n_edges > 0 && !deps) return deft_set_error(DEFT_ERR_INVALID, "schedule_order: deps is NULL");
    /* Dependencies are indexed by int, and the eager orders' queue holds steps and edges together. */
    if (n_edges > (size_t)INT_MAX - (size_t)n)
        return deft_set_error(DEFT_ERR_INVALID, "schedule_order: %zu dependencies of %d steps are more than an int "
                              "indexes", n_edges, n);
    size_t cn = (size_t)n, ce = n_edges ? n_edges : 1;
    deft_sched s = {.steps = steps, .n = n};
    s.dep_at = malloc((cn + 1) * sizeof *s.dep_at);
    s.deps = malloc(ce * sizeof *s.deps);
    s.reader_at = calloc(cn + 1, sizeof *s.reader_at);
    s.readers = malloc(ce * sizeof *s.readers);
    s.unmet = malloc(cn * sizeof *s.unmet);
    s.unread = malloc(cn * sizeof *s.unread);
    s.freed = malloc(cn * sizeof *s.freed);
    s.done = malloc(cn);
    s.emitted = malloc(cn);
    s.heap = malloc(cn * sizeof *s.heap);
    s.heap_pos = malloc(cn * sizeof *s.heap_pos);
    /* pending: the eager orders' queue, steps and edges long; past that, deft_sched_queue_readers queues nothing more
     * (an order that frees less eagerly, never a wrong one). */
    int *mine = malloc(cn * sizeof *mine), *pending = malloc((cn + ce) * sizeof *pending);
    deft_status st = DEFT_OK;
    if (!s.dep_at || !s.deps || !s.reader_at || !s.readers || !s.unmet || !s.unread || !s.freed || !s.done ||
        !s.emitted || !s.heap || !s.heap_pos || !mine || !pending)
        st = deft_set_error(DEFT_ERR_OOM, "schedule_order: out of host memory for %d steps", n);
    if (st == DEFT_OK) st = deft_sched_build(&s, deps);
    if (st == DEFT_OK) {
        /* The scratch for the peaks, heap_pos and freed, is free between the schedulers. */
        for (int i = 0; i < n; i++) order[i] = i;
        uint64_t best = deft_sched_peak(&s, order, s.heap_pos, s.freed);
        for (int k = 0; k < 5; k++) {
            if (k == 0) deft_sched_run(&s, mine);
            else if (deft_sched_depth_first(&s, mine, k % 2 == 0, k >= 3, pending, (int)(cn + ce)) != n) continue;
            uint64_t peak = deft_sched_peak(&s, mine, s.heap_pos, s.freed);
            if (peak < best) {
                best = peak;
                memcpy(order, mine, cn * sizeof *order);
            }
        }
    }
    free(s.dep_at);
    free(s.deps);
    free(s.reader_at);
    free(s.readers);
    free(s.unmet);
    free(s.unread);
    free(s.freed);
    free(s.done);
    free(s.emitted);
    free(s.heap);
    free(s.heap_pos);
    free(mine);
    free(pending);
    return st;
}
