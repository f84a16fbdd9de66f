/* Offset assignment for one arena. Lifetimes are given; offsets are chosen so that buffers live at the same step
 * share no byte, and the arena (the highest end) should come near the lower bound (the most bytes live at one step).
 * The optimum is NP-hard to find, so three greedy orderings run, each followed by a repair pass, and the smallest
 * arena wins. No ordering wins everywhere (measured on the bench's graphs and random DAGs of 1k-300k nodes):
 *  - by breadth, the fullest step first: a buffer's key is the most bytes live at any step of its lifetime, and the
 *    buffers of that step come together, largest first. The step that sets the lower bound gets packed tightly
 *    before anything can fragment it. Best fit (the smallest gap that holds it) keeps the big gaps for later.
 *  - by breadth, longest lifetime first among equal keys: long-lived buffers need a gap free over all their steps,
 *    which gets rare as the arena fills.
 *  - by size, largest first, each at the lowest offset that holds it: small buffers fill what large ones left.
 * The repair pass takes the buffer that ends highest and moves it down: into a gap if one holds it, else to where
 * it displaces a few buffers that themselves fit elsewhere below the top. Greedy orders leave the top of the arena
 * to a few long-lived buffers that met a fragmented space; this is what moves them.
 *
 * Every placement asks which placed buffers overlap a lifetime. Buckets of steps index them on several levels (32
 * steps wide, 4 times wider per level up); a buffer sits in the lowest level where it touches at most two buckets.
 * A long-lived buffer is then not copied into every bucket it spans, and a query reads about the buffers live
 * around its lifetime, not every placed one. Buckets stay sorted by offset, so a query merges sorted runs (or, for
 * a long lifetime that reads many small buckets, sorts by radix). Step numbers far apart are first renumbered to
 * their ranks, so memory and time follow the number of buffers, not the largest step. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "graph_internal.h"
#include "planner.h"

#define DEFT_BUCKET_SHIFT 5    /* level 0 buckets hold 32 steps */
#define DEFT_LEVEL_SHIFT 2     /* each level's buckets hold 4 times the steps of the level below */
#define DEFT_MAX_LEVELS 14     /* 32 << 2 * 13 is past INT_MAX: one bucket holds every step */
#define DEFT_BLOCK_SHIFT 5     /* range maxima of live bytes: a sparse table over blocks of 32 steps */
#define DEFT_MERGE_RUNS 8      /* a query of more sorted runs is sorted by radix instead */
#define DEFT_MAX_BLOCKERS 16   /* the repair displaces at most this many buffers for one move... */
#define DEFT_REPAIR_TRIES 16   /* ...and tries at most this many places for it, the fewest bytes displaced first */

typedef struct deft_item {     /* a placed buffer as the index holds it: a copy, so a query stays in its buckets */
    size_t offset, size;
    int first, last, id;
} deft_item;

typedef struct deft_bucket {
    deft_item *items;          /* sorted by offset */
    int n, cap;
} deft_bucket;

typedef struct deft_span {
    size_t offset, size;
    int id;
} deft_span;

typedef enum deft_fit { DEFT_FIT_BEST, DEFT_FIT_LOWEST } deft_fit;

typedef struct deft_plan_work {
    const deft_plan_buffer *bufs;
    int n, failed;             /* failed: a bucket could not grow; the strategy's answer is void */
    size_t *size;              /* aligned sizes */
    size_t *offset;            /* the current strategy's offsets */
    deft_bucket *buckets;      /* every level's, level l's from level_at[l] */
    int level_at[DEFT_MAX_LEVELS + 1], n_levels;
    deft_span *found, *merged; /* one query's overlapping buffers: sorted runs, then merged */
    int *runs;                 /* where each run of found starts, then one past the last */
    deft_span *kept;           /* the repair's copy of a query, kept while it places other buffers */
    int *order;
} deft_plan_work;

static int deft_level_shift(int level) { return DEFT_BUCKET_SHIFT + DEFT_LEVEL_SHIFT * level; }

static int deft_level_of(const deft_plan_work *w, int first, int last) {
    int l = 0;
    while (l + 1 < w->n_levels && (last >> deft_level_shift(l)) - (first >> deft_level_shift(l)) > 1) l++;
    return l;
}

static deft_bucket *deft_bucket_at(deft_plan_work *w, int level, int step) {
    return &w->buckets[w->level_at[level] + (step >> deft_level_shift(level))];
}

static void deft_bucket_add(deft_plan_work *w, deft_bucket *b, deft_item it) {
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 8;
        deft_item *items = realloc(b->items, (size_t)cap * sizeof *items);
        if (!items) {
            w->failed = 1;
            return;
        }
        b->items = items;
        b->cap = cap;
    }
    int lo = 0, hi = b->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (b->items[mid].offset <= it.offset) lo = mid + 1;
        else hi = mid;
    }
    memmove(b->items + lo + 1, b->items + lo, (size_t)(b->n - lo) * sizeof *b->items);
    b->items[lo] = it;
    b->n++;
}

static void deft_bucket_remove(deft_bucket *b, int id) {
    for (int j = 0; j < b->n; j++)
        if (b->items[j].id == id) {
            memmove(b->items + j, b->items + j + 1, (size_t)(b->n - j - 1) * sizeof *b->items);
            b->n--;
            return;
        }
}

/* Adds buffer i at w->offset[i]. Out of memory it sets w->failed and the index no longer matters. */
static void deft_index_add(deft_plan_work *w, int i) {
    const deft_plan_buffer *b = &w->bufs[i];
    deft_item it = {w->offset[i], w->size[i], b->first, b->last, i};
    int l = deft_level_of(w, b->first, b->last);
    deft_bucket *b0 = deft_bucket_at(w, l, b->first), *b1 = deft_bucket_at(w, l, b->last);
    deft_bucket_add(w, b0, it);
    if (b1 != b0) deft_bucket_add(w, b1, it);
}

static void deft_index_remove(deft_plan_work *w, int i) {
    const deft_plan_buffer *b = &w->bufs[i];
    int l = deft_level_of(w, b->first, b->last);
    deft_bucket *b0 = deft_bucket_at(w, l, b->first), *b1 = deft_bucket_at(w, l, b->last);
    deft_bucket_remove(b0, i);
    if (b1 != b0) deft_bucket_remove(b1, i);
}

static void deft_index_clear(deft_plan_work *w) {
    for (int k = 0; k < w->level_at[w->n_levels]; k++) w->buckets[k].n = 0;
}

/* Merges the sorted runs of w->found pairwise until one is left, and returns it. */
static deft_span *deft_merge_runs(deft_plan_work *w, int n_runs) {
    deft_span *src = w->found, *dst = w->merged;
    int *runs = w->runs;
    while (n_runs > 1) {
        int out = 0;
        for (int r = 0; r < n_runs; r += 2) {
            int a = runs[r], a_end = runs[r + 1], b = a_end, b_end = r + 1 < n_runs ? runs[r + 2] : a_end, k = a;
            while (a < a_end && b < b_end) dst[k++] = src[b].offset < src[a].offset ? src[b++] : src[a++];
            while (a < a_end) dst[k++] = src[a++];
            while (b < b_end) dst[k++] = src[b++];
            runs[out++] = runs[r];
        }
        runs[out] = runs[n_runs];
        n_runs = out;
        deft_span *t = src;
        src = dst;
        dst = t;
    }
    return src;
}

/* Sorts w->found by offset, least significant byte first over offset / DEFT_PLAN_ALIGN, and returns where the result
 * lies. A long query reads hundreds of buckets of a few items each: merging those runs would take a pass per
 * doubling, this takes a pass per byte of the largest offset. */
static deft_span *deft_radix_sort(deft_plan_work *w, int nf, size_t max_offset) {
    deft_span *src = w->found, *dst = w->merged;
    for (int shift = 0; shift < 64 && (max_offset / DEFT_PLAN_ALIGN) >> shift; shift += 8) {
        int count[257] = {0};
        for (int j = 0; j < nf; j++) count[((src[j].offset / DEFT_PLAN_ALIGN) >> shift & 255) + 1]++;
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (int j = 0; j < nf; j++) dst[count[(src[j].offset / DEFT_PLAN_ALIGN) >> shift & 255]++] = src[j];
        deft_span *t = src;
        src = dst;
        dst = t;
    }
    return src;
}

/* The placed buffers whose lifetimes overlap [first, last], sorted by offset, valid until the next query. */
static const deft_span *deft_overlapping(deft_plan_work *w, int first, int last, int *np) {
    int nf = 0, n_runs = 0;
    size_t max_offset = 0;
    for (int l = 0; l < w->n_levels; l++) {
        int sh = deft_level_shift(l), k0 = first >> sh, k1 = last >> sh;
        for (int k = k0; k <= k1; k++) {
            const deft_bucket *bk = &w->buckets[w->level_at[l] + k];
            int start = nf;
            for (int j = 0; j < bk->n; j++) {
                const deft_item *it = &bk->items[j];
                /* An item in two buckets that are both read counts in the first of them only. */
                if (k > k0 && (it->first >> sh) != k) continue;
                if (it->first <= last && first <= it->last) w->found[nf++] = (deft_span){it->offset, it->size, it->id};
            }
            if (nf > start) {
                w->runs[n_runs++] = start;
                if (w->found[nf - 1].offset > max_offset) max_offset = w->found[nf - 1].offset;
            }
        }
    }
    w->runs[n_runs] = nf;
    *np = nf;
    return n_runs > DEFT_MERGE_RUNS ? deft_radix_sort(w, nf, max_offset) : deft_merge_runs(w, n_runs);
}

/* Where `size` bytes go among `placed` (sorted by offset; they may overlap one another, being live at different
 * steps): the lowest gap that holds them, or the one they fill best; above them all when no gap does. */
static size_t deft_choose_gap(const deft_span *placed, int np, size_t size, deft_fit fit) {
    size_t best = SIZE_MAX, best_waste = SIZE_MAX, cursor = 0;
    for (int j = 0; j < np; j++) {
        if (placed[j].offset > cursor && placed[j].offset - cursor >= size) {
            if (fit == DEFT_FIT_LOWEST) return cursor;
            size_t waste = placed[j].offset - cursor - size;
            if (waste < best_waste) {
                best_waste = waste;
                best = cursor;
            }
        }
        size_t end = placed[j].offset + placed[j].size;
        if (end > cursor) cursor = end;
    }
    return best != SIZE_MAX ? best : cursor;
}

static size_t deft_lowest_place(deft_plan_work *w, int i) {
    int np;
    const deft_span *placed = deft_overlapping(w, w->bufs[i].first, w->bufs[i].last, &np);
    return deft_choose_gap(placed, np, w->size[i], DEFT_FIT_LOWEST);
}

static size_t deft_place_in_order(deft_plan_work *w, deft_fit fit) {
    size_t arena = 0;
    deft_index_clear(w);
    for (int k = 0; k < w->n && !w->failed; k++) {
        int i = w->order[k], np;
        const deft_span *placed = deft_overlapping(w, w->bufs[i].first, w->bufs[i].last, &np);
        w->offset[i] = deft_choose_gap(placed, np, w->size[i], fit);
        if (w->offset[i] + w->size[i] > arena) arena = w->offset[i] + w->size[i];
        deft_index_add(w, i);
    }
    return arena;
}

/* ---- the repair pass ---- */

/* A max-heap of buffers by their end. A moved buffer leaves a stale entry behind, which the pass skips. */
typedef struct deft_heap {
    struct deft_heap_entry {
        size_t end;
        int id;
    } *at;
    int n, cap;
} deft_heap;

static void deft_heap_push(deft_heap *h, size_t end, int id) {
    int k = h->n++;
    while (k > 0 && h->at[(k - 1) / 2].end < end) {
        h->at[k] = h->at[(k - 1) / 2];
        k = (k - 1) / 2;
    }
    h->at[k] = (struct deft_heap_entry){end, id};
}

static struct deft_heap_entry deft_heap_pop(deft_heap *h) {
    struct deft_heap_entry top = h->at[0], last = h->at[--h->n];
    int k = 0;
    for (;;) {
        int c = 2 * k + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->at[c + 1].end > h->at[c].end) c++;
        if (h->at[c].end <= last.end) break;
        h->at[k] = h->at[c];
        k = c;
    }
    if (h->n > 0) h->at[k] = last;
    return top;
}

/* Puts buffer i (out of the index) at offset p, after taking out the buffers in the way (largest first) and putting
 * each at the lowest offset that holds it, which must end below `limit`. Undone when one does not fit. */
static int deft_try_displace(deft_plan_work *w, deft_heap *h, int i, size_t p, const int *blockers, int nb,
                             size_t limit) {
    size_t old_i = w->offset[i], old[DEFT_MAX_BLOCKERS];
    for (int k = 0; k < nb; k++) {
        old[k] = w->offset[blockers[k]];
        deft_index_remove(w, blockers[k]);
    }
    w->offset[i] = p;
    deft_index_add(w, i);
    int k = 0;
    for (; k < nb; k++) {
        int b = blockers[k];
        size_t to = deft_lowest_place(w, b);
        if (to + w->size[b] >= limit) break;
        w->offset[b] = to;
        deft_index_add(w, b);
    }
    if (k == nb) {
        for (int j = 0; j < nb; j++) deft_heap_push(h, w->offset[blockers[j]] + w->size[blockers[j]], blockers[j]);
        return 1;
    }
    /* Every bucket gets back the items it had, so these adds never need memory. */
    for (int j = 0; j < k; j++) deft_index_remove(w, blockers[j]);
    deft_index_remove(w, i);
    w->offset[i] = old_i;
    for (int j = 0; j < nb; j++) {
        w->offset[blockers[j]] = old[j];
        deft_index_add(w, blockers[j]);
    }
    return 0;
}

static int deft_by_size_desc(const void *pa, const void *pb) {
    const deft_span *a = pa, *b = pb;
    if (a->size != b->size) return a->size < b->size ? 1 : -1;
    return a->id - b->id;
}

/* The places worth a try for `size` bytes below `end` among `placed`: offset 0 and every placed buffer's end, ranked
 * by the bytes in the way (fewest first), those with more than DEFT_MAX_BLOCKERS buffers in the way left out. */
static int deft_displace_candidates(const deft_span *placed, int np, size_t size, size_t end, size_t *cand) {
    size_t cost[DEFT_REPAIR_TRIES], widest = 0;
    int nc = 0;
    for (int j = 0; j < np; j++)
        if (placed[j].size > widest) widest = placed[j].size;
    for (int j = -1; j < np; j++) {
        size_t p = j < 0 ? 0 : placed[j].offset + placed[j].size, bytes = 0;
        if (p + size >= end) continue;
        int lo = 0, hi = np, count = 0;
        while (lo < hi) {   /* nothing that starts a widest buffer or more below p reaches p */
            int mid = (lo + hi) / 2;
            if (placed[mid].offset + widest <= p) lo = mid + 1;
            else hi = mid;
        }
        for (int q = lo; q < np && placed[q].offset < p + size; q++)
            if (placed[q].offset + placed[q].size > p) {
                bytes += placed[q].size;
                count++;
            }
        if (count == 0 || count > DEFT_MAX_BLOCKERS) continue;
        if (nc == DEFT_REPAIR_TRIES && bytes >= cost[nc - 1]) continue;
        int at = nc < DEFT_REPAIR_TRIES ? nc++ : DEFT_REPAIR_TRIES - 1;
        for (; at > 0 && cost[at - 1] > bytes; at--) {
            cost[at] = cost[at - 1];
            cand[at] = cand[at - 1];
        }
        cost[at] = bytes;
        cand[at] = p;
    }
    return nc;
}

/* Moves buffer i (out of the index, ending at `end`) lower: into a gap, else by displacing others. Returns whether
 * it moved; either way it is back in the index. */
static int deft_move_down(deft_plan_work *w, deft_heap *h, int i, size_t end) {
    int np;
    size_t size = w->size[i];
    const deft_span *placed = deft_overlapping(w, w->bufs[i].first, w->bufs[i].last, &np);
    size_t to = deft_choose_gap(placed, np, size, DEFT_FIT_LOWEST);
    if (to + size < end) {
        w->offset[i] = to;
        deft_index_add(w, i);
        return 1;
    }
    memcpy(w->kept, placed, (size_t)np * sizeof *w->kept);
    size_t cand[DEFT_REPAIR_TRIES];
    int nc = deft_displace_candidates(w->kept, np, size, end, cand);
    for (int t = 0; t < nc && !w->failed; t++) {
        deft_span in_way[DEFT_MAX_BLOCKERS];
        int blockers[DEFT_MAX_BLOCKERS], nb = 0;
        for (int q = 0; q < np && nb < DEFT_MAX_BLOCKERS; q++)
            if (w->kept[q].offset < cand[t] + size && w->kept[q].offset + w->kept[q].size > cand[t])
                in_way[nb++] = w->kept[q];
        qsort(in_way, (size_t)nb, sizeof *in_way, deft_by_size_desc);
        for (int q = 0; q < nb; q++) blockers[q] = in_way[q].id;
        if (deft_try_displace(w, h, i, cand[t], blockers, nb, end)) return 1;
    }
    deft_index_add(w, i);
    return 0;
}

/* Lowers the arena of the placement in w->offset while the buffer that ends highest can move down. */
static size_t deft_repair(deft_plan_work *w, deft_heap *h) {
    h->n = 0;
    deft_index_clear(w);
    for (int i = 0; i < w->n; i++) {
        deft_index_add(w, i);
        deft_heap_push(h, w->offset[i] + w->size[i], i);
    }
    /* A move lowers the buffer that ends highest, by DEFT_PLAN_ALIGN at least, and can lift the buffers it displaces
     * only below that end; the cap on moves and the heap's room bound the pass's time on pathological inputs. */
    for (long moves = 0; h->n > 0 && h->n + DEFT_MAX_BLOCKERS + 1 <= h->cap && moves < 4L * w->n && !w->failed;
         moves++) {
        struct deft_heap_entry e = deft_heap_pop(h);
        int i = e.id;
        if (e.end != w->offset[i] + w->size[i]) continue;
        deft_index_remove(w, i);
        if (!deft_move_down(w, h, i, e.end)) break;
        deft_heap_push(h, w->offset[i] + w->size[i], i);
    }
    size_t arena = 0;
    for (int i = 0; i < w->n; i++)
        if (w->offset[i] + w->size[i] > arena) arena = w->offset[i] + w->size[i];
    return arena;
}

/* ---- orderings ---- */

/* The step of the most bytes live in [first, last]: a sparse table over blocks of steps, where row j holds the
 * step of the maximum over blocks b .. b + 2^j - 1, and direct scans at the ends. */
typedef struct deft_range_max {
    const size_t *live;
    int *table;
    int n_blocks, n_rows;
} deft_range_max;

static int deft_argmax_scan(const size_t *live, int from, int to, int best) {
    for (int t = from; t <= to; t++)
        if (best < 0 || live[t] > live[best]) best = t;
    return best;
}

static int deft_argmax_pick(const size_t *live, int a, int b) { return live[b] > live[a] ? b : a; }

static deft_status deft_range_max_init(deft_range_max *r, const size_t *live, int steps) {
    r->live = live;
    r->n_blocks = ((steps - 1) >> DEFT_BLOCK_SHIFT) + 1;
    r->n_rows = 1;
    while (r->n_rows < 31 && (1 << r->n_rows) <= r->n_blocks) r->n_rows++;
    r->table = malloc((size_t)r->n_rows * (size_t)r->n_blocks * sizeof *r->table);
    if (!r->table) return deft_set_error(DEFT_ERR_OOM, "planner: out of host memory for %d steps", steps);
    for (int b = 0; b < r->n_blocks; b++) {
        int start = b << DEFT_BLOCK_SHIFT, width = (1 << DEFT_BLOCK_SHIFT) - 1;
        r->table[b] = deft_argmax_scan(live, start, steps - 1 - start > width ? start + width : steps - 1, -1);
    }
    for (int j = 1; j < r->n_rows; j++) {
        int *row = r->table + (size_t)j * (size_t)r->n_blocks, *prev = row - r->n_blocks;
        for (int b = 0; b + (1 << j) <= r->n_blocks; b++)
            row[b] = deft_argmax_pick(live, prev[b], prev[b + (1 << (j - 1))]);
    }
    return DEFT_OK;
}

static int deft_range_argmax(const deft_range_max *r, int first, int last) {
    int b0 = (first >> DEFT_BLOCK_SHIFT) + 1, b1 = (last >> DEFT_BLOCK_SHIFT) - 1;
    if (b0 > b1) return deft_argmax_scan(r->live, first, last, -1);
    int best = deft_argmax_scan(r->live, first, (b0 << DEFT_BLOCK_SHIFT) - 1, -1), j = 0;
    while ((2 << j) <= b1 - b0 + 1) j++;
    const int *row = r->table + (size_t)j * (size_t)r->n_blocks;
    best = deft_argmax_pick(r->live, best, deft_argmax_pick(r->live, row[b0], row[b1 - (1 << j) + 1]));
    return deft_argmax_scan(r->live, (b1 + 1) << DEFT_BLOCK_SHIFT, last, best);
}

typedef enum deft_strategy {
    DEFT_BY_BREADTH_STEP,      /* the fullest step first, its buffers together, largest first */
    DEFT_BY_BREADTH_LENGTH,    /* the fullest step first, longest lifetime first */
    DEFT_BY_SIZE,              /* largest first */
    DEFT_N_STRATEGIES
} deft_strategy;

static const deft_fit deft_strategy_fit[DEFT_N_STRATEGIES] = {DEFT_FIT_BEST, DEFT_FIT_BEST, DEFT_FIT_LOWEST};

typedef struct deft_order_key {
    uint64_t k1, k2, k3;       /* the larger first */
    int idx;
} deft_order_key;

static int deft_by_key(const void *pa, const void *pb) {
    const deft_order_key *a = pa, *b = pb;
    if (a->k1 != b->k1) return a->k1 < b->k1 ? 1 : -1;
    if (a->k2 != b->k2) return a->k2 < b->k2 ? 1 : -1;
    if (a->k3 != b->k3) return a->k3 < b->k3 ? 1 : -1;
    return a->idx - b->idx;
}

static void deft_order_by(deft_plan_work *w, deft_strategy st, const deft_range_max *rm, deft_order_key *keys) {
    for (int i = 0; i < w->n; i++) {
        const deft_plan_buffer *b = &w->bufs[i];
        uint64_t size = w->size[i], length = (uint64_t)(b->last - b->first), early = (uint64_t)(INT_MAX - b->first);
        if (st == DEFT_BY_SIZE) {
            keys[i] = (deft_order_key){size, early, 0, i};
        } else {
            int at = deft_range_argmax(rm, b->first, b->last);
            if (st == DEFT_BY_BREADTH_STEP) keys[i] = (deft_order_key){rm->live[at], (uint64_t)(INT_MAX - at), size, i};
            else keys[i] = (deft_order_key){rm->live[at], length, size, i};
        }
    }
    qsort(keys, (size_t)w->n, sizeof *keys, deft_by_key);
    for (int i = 0; i < w->n; i++) w->order[i] = keys[i].idx;
}

static void deft_work_free(deft_plan_work *w) {
    for (int k = 0; w->buckets && k < w->level_at[w->n_levels]; k++) free(w->buckets[k].items);
    free(w->buckets);
    free(w->size);
    free(w->offset);
    free(w->found);
    free(w->merged);
    free(w->runs);
    free(w->kept);
    free(w->order);
}

/* bufs' lifetimes lie in [0, steps); live[t] is the bytes live at step t, at most `bound`. */
static deft_status deft_plan_greedy(deft_plan_buffer *bufs, int n, int steps, const size_t *live, size_t bound,
                                    size_t *arena) {
    size_t count = (size_t)n;
    deft_plan_work w = {.bufs = bufs, .n = n, .n_levels = 1};
    while (w.n_levels < DEFT_MAX_LEVELS && ((steps - 1) >> deft_level_shift(w.n_levels - 1)) > 1) w.n_levels++;
    for (int l = 0; l < w.n_levels; l++) w.level_at[l + 1] = w.level_at[l] + ((steps - 1) >> deft_level_shift(l)) + 1;
    w.size = malloc(count * sizeof *w.size);
    w.offset = malloc(count * sizeof *w.offset);
    w.found = malloc(count * sizeof *w.found);
    w.merged = malloc(count * sizeof *w.merged);
    w.runs = malloc((count + 1) * sizeof *w.runs);
    w.kept = malloc(count * sizeof *w.kept);
    w.order = malloc(count * sizeof *w.order);
    w.buckets = calloc((size_t)w.level_at[w.n_levels], sizeof *w.buckets);
    size_t *best = malloc(count * sizeof *best);
    deft_order_key *keys = malloc(count * sizeof *keys);
    deft_heap heap = {.cap = 2 * n + 2 * (DEFT_MAX_BLOCKERS + 1)};
    heap.at = malloc((size_t)heap.cap * sizeof *heap.at);
    deft_range_max rm = {0};
    deft_status s = DEFT_OK;
    if (!w.size || !w.offset || !w.found || !w.merged || !w.runs || !w.kept || !w.order || !w.buckets || !best ||
        !keys || !heap.at)
        s = deft_set_error(DEFT_ERR_OOM, "planner: out of host memory for %d buffers", n);
    if (s == DEFT_OK) s = deft_range_max_init(&rm, live, steps);
    for (int i = 0; s == DEFT_OK && i < n; i++) w.size[i] = deft_plan_align(bufs[i].size);
    *arena = SIZE_MAX;
    /* An arena at the lower bound cannot be beaten: the strategies after it would only cost time. */
    for (int st = 0; st < DEFT_N_STRATEGIES && s == DEFT_OK && *arena > bound; st++) {
        deft_order_by(&w, (deft_strategy)st, &rm, keys);
        size_t this_arena = deft_place_in_order(&w, deft_strategy_fit[st]);
        if (!w.failed && this_arena > bound) this_arena = deft_repair(&w, &heap);
        if (w.failed) s = deft_set_error(DEFT_ERR_OOM, "planner: out of host memory for %d buffers", n);
        if (s == DEFT_OK && this_arena < *arena) {
            *arena = this_arena;
            memcpy(best, w.offset, count * sizeof *best);
        }
    }
    for (int i = 0; s == DEFT_OK && i < n; i++) bufs[i].offset = best[i];
    free(rm.table);
    free(heap.at);
    free(best);
    free(keys);
    deft_work_free(&w);
    return s;
}

static int deft_by_int(const void *pa, const void *pb) {
    int a = *(const int *)pa, b = *(const int *)pb;
    return (a > b) - (a < b);
}

/* Renumbers steps to the ranks of the distinct first and last steps, which keeps every overlap and every sum of
 * live bytes: a plan then costs memory by buffers, not by the largest step number. */
static deft_status deft_compress_steps(deft_plan_buffer *bufs, int n, int *steps) {
    int *t = malloc(2 * (size_t)n * sizeof *t);
    if (!t) return deft_set_error(DEFT_ERR_OOM, "planner: out of host memory for %d buffers", n);
    for (int i = 0; i < n; i++) {
        t[2 * i] = bufs[i].first;
        t[2 * i + 1] = bufs[i].last;
    }
    qsort(t, 2 * (size_t)n, sizeof *t, deft_by_int);
    int m = 0;
    for (int k = 0; k < 2 * n; k++)
        if (m == 0 || t[k] != t[m - 1]) t[m++] = t[k];
    for (int i = 0; i < n; i++) {
        int *f = bsearch(&bufs[i].first, t, (size_t)m, sizeof *t, deft_by_int);
        int *l = bsearch(&bufs[i].last, t, (size_t)m, sizeof *t, deft_by_int);
        bufs[i].first = (int)(f - t);
        bufs[i].last = (int)(l - t);
    }
    free(t);
    *steps = m;
    return DEFT_OK;
}

/* The aligned sizes' sum, or false when a size or the sum passes DEFT_MAX_BYTES. Every offset and end the greedy
 * placement makes stays below this sum (a buffer goes into a gap or just above those already placed), so bounding
 * it here keeps the arithmetic below from wrapping. */
static bool deft_plan_total(const deft_plan_buffer *bufs, int n, size_t *total, int *bad) {
    size_t sum = 0;
    for (int i = 0; i < n; i++) {
        *bad = i;
        if (bufs[i].size > DEFT_MAX_BYTES || !deft_size_add(sum, deft_plan_align(bufs[i].size), &sum) ||
            sum > DEFT_MAX_BYTES)
            return false;
    }
    *total = sum;
    return true;
}

deft_status deft_plan_offsets(deft_plan_buffer *bufs, int n, int no_reuse, deft_plan_stats *stats) {
    memset(stats, 0, sizeof *stats);
    if (n < 0) return deft_set_error(DEFT_ERR_INVALID, "planner: %d buffers", n);
    int steps = 0;
    for (int i = 0; i < n; i++) {
        if (bufs[i].last < bufs[i].first || bufs[i].first < 0 || bufs[i].last == INT_MAX)
            return deft_set_error(DEFT_ERR_INVALID, "planner: buffer %d has lifetime [%d, %d]", i, bufs[i].first,
                                  bufs[i].last);
        if (bufs[i].last + 1 > steps) steps = bufs[i].last + 1;
    }
    int bad = 0;
    if (!deft_plan_total(bufs, n, &stats->no_reuse_bytes, &bad)) {
        return deft_set_error(DEFT_ERR_SHAPE,
                              "planner: buffer %d of %zu bytes takes the %d buffers' sum past %zu bytes, the most an "
                              "arena may have: too large", bad, bufs[bad].size, n, DEFT_MAX_BYTES);
    }
    if (n == 0) return DEFT_OK;
    /* The planner works on a copy whose steps may be renumbered; only the offsets go back. */
    deft_plan_buffer *work = malloc((size_t)n * sizeof *work);
    size_t *live = NULL;
    deft_status s = work ? DEFT_OK : deft_set_error(DEFT_ERR_OOM, "planner: out of host memory for %d buffers", n);
    if (s == DEFT_OK) memcpy(work, bufs, (size_t)n * sizeof *work);
    if (s == DEFT_OK && steps / 8 > n) s = deft_compress_steps(work, n, &steps);
    if (s == DEFT_OK) {
        live = calloc((size_t)steps + 1, sizeof *live);
        if (!live) s = deft_set_error(DEFT_ERR_OOM, "planner: out of host memory for %d steps", steps);
    }
    if (s == DEFT_OK) {
        /* The subtraction wraps below zero and the running sum wraps back: unsigned arithmetic is exact mod 2^N. */
        for (int i = 0; i < n; i++) {
            live[work[i].first] += deft_plan_align(work[i].size);
            live[work[i].last + 1] -= deft_plan_align(work[i].size);
        }
        for (int t = 0; t < steps; t++) {
            if (t > 0) live[t] += live[t - 1];
            if (live[t] > stats->lower_bound) stats->lower_bound = live[t];
        }
        if (no_reuse) {
            size_t off = 0;
            for (int i = 0; i < n; i++) {
                work[i].offset = off;
                off += deft_plan_align(work[i].size);
            }
            stats->arena_bytes = off;
        } else {
            s = deft_plan_greedy(work, n, steps, live, stats->lower_bound, &stats->arena_bytes);
        }
    }
    for (int i = 0; s == DEFT_OK && i < n; i++) bufs[i].offset = work[i].offset;
    free(live);
    free(work);
    return s;
}

typedef struct deft_bound_event {
    int step;
    int end;          /* 0: a buffer starts at step; 1: one ends after step (ends sort after starts) */
    size_t bytes;
} deft_bound_event;

static int deft_by_event(const void *pa, const void *pb) {
    const deft_bound_event *a = pa, *b = pb;
    if (a->step != b->step) return a->step < b->step ? -1 : 1;
    return a->end - b->end;
}

size_t deft_plan_lower_bound(const deft_plan_buffer *bufs, int n) {
    if (n <= 0) return 0;
    size_t total;
    int bad;
    if (!deft_plan_total(bufs, n, &total, &bad)) return SIZE_MAX;
    deft_bound_event *ev = malloc(2 * (size_t)n * sizeof *ev);
    size_t live = 0, peak = 0;
    if (!ev) return total;   /* without scratch, the sum of every buffer still bounds from above what is asked */
    for (int i = 0; i < n; i++) {
        ev[2 * i] = (deft_bound_event){bufs[i].first, 0, deft_plan_align(bufs[i].size)};
        ev[2 * i + 1] = (deft_bound_event){bufs[i].last, 1, deft_plan_align(bufs[i].size)};
    }
    qsort(ev, 2 * (size_t)n, sizeof *ev, deft_by_event);
    for (int k = 0; k < 2 * n; k++) {
        if (ev[k].end) live -= ev[k].bytes;
        else live += ev[k].bytes;
        if (live > peak) peak = live;
    }
    free(ev);
    return peak;
}
