/* A full consistency check of one pool, for tests: every invariant the allocator relies on, checked from the
 * structures themselves, so that a test can say "still consistent" after an error path instead of hoping. */
#include "caching_internal.h"
#include "base.h"

typedef struct deft_check_sums {
    int64_t reserved, segments, allocated, allocations, requested, active, free_blocks;
} deft_check_sums;

/* Checks a free tree: in order, heap-ordered priorities, only free blocks of the right pool. Returns its size, or
 * -1 after setting the message. */
static int64_t deft_check_tree(const deft_block *t, bool small, const deft_block **prev) {
    if (!t) return 0;
    int64_t l = deft_check_tree(t->left, small, prev);
    if (l < 0) return -1;
    if (t->state != DEFT_BLOCK_FREE || t->segment->small != small) {
        deft_set_error(DEFT_ERR_STATE, "check: block %p in the %s tree is not a free block of that pool",
                       (void *)t->addr, small ? "small" : "large");
        return -1;
    }
    const deft_block *p = *prev;
    if (p && !((uintptr_t)p->stream < (uintptr_t)t->stream ||
               (p->stream == t->stream && (p->size < t->size || (p->size == t->size && p->addr < t->addr))))) {
        deft_set_error(DEFT_ERR_STATE, "check: the free tree is out of order at %p", (void *)t->addr);
        return -1;
    }
    if ((t->left && t->left->prio > t->prio) || (t->right && t->right->prio > t->prio)) {
        deft_set_error(DEFT_ERR_STATE, "check: treap priorities broken at %p", (void *)t->addr);
        return -1;
    }
    *prev = t;
    int64_t r = deft_check_tree(t->right, small, prev);
    return r < 0 ? -1 : l + 1 + r;
}

static deft_status deft_check_block(const deft_pool *p, const deft_segment *seg, const deft_block *b,
                                    deft_check_sums *sum) {
    void *a = (void *)b->addr;
    if (b->segment != seg || b->stream != seg->stream || b->size == 0 || b->size % 512 != 0)
        return deft_set_error(DEFT_ERR_STATE, "check: block %p has a wrong segment, stream or size", a);
    if (b->next && (b->next->prev != b || b->next->addr != b->addr + b->size))
        return deft_set_error(DEFT_ERR_STATE, "check: block %p is not followed by its neighbour", a);
    if (b->state == DEFT_BLOCK_FREE && b->next && b->next->state == DEFT_BLOCK_FREE)
        return deft_set_error(DEFT_ERR_STATE, "check: free blocks %p and its next were not merged", a);
    if (b->state == DEFT_BLOCK_ALLOCATED && deft_map_get(&p->live, b->addr) != b)
        return deft_set_error(DEFT_ERR_STATE, "check: allocated block %p is missing from the live map", a);
    if (b->state != DEFT_BLOCK_ALLOCATED && deft_map_get(&p->live, b->addr))
        return deft_set_error(DEFT_ERR_STATE, "check: block %p is in the live map but not allocated", a);
    if ((b->state == DEFT_BLOCK_PENDING) != (b->pending_events > 0))
        return deft_set_error(DEFT_ERR_STATE, "check: block %p: pending state and event count disagree", a);
    if (b->state == DEFT_BLOCK_ALLOCATED) {
        sum->allocated += (int64_t)b->size;
        sum->allocations++;
        sum->requested += (int64_t)b->requested;
    }
    if (b->state != DEFT_BLOCK_FREE) sum->active += (int64_t)b->size;
    else sum->free_blocks++;
    return DEFT_OK;
}

static deft_status deft_check_segment(const deft_pool *p, const deft_segment *seg, deft_check_sums *sum) {
    if (seg->next && seg->next->prev != seg)
        return deft_set_error(DEFT_ERR_STATE, "check: the segment list is broken at %p", (void *)seg->base);
    if (!seg->first || seg->first->prev || seg->first->addr != seg->base)
        return deft_set_error(DEFT_ERR_STATE, "check: segment %p does not start with its first block",
                              (void *)seg->base);
    size_t covered = 0;
    for (const deft_block *b = seg->first; b; b = b->next) {
        deft_status s = deft_check_block(p, seg, b, sum);
        if (s != DEFT_OK) return s;
        covered += b->size;
    }
    if (covered != seg->size)
        return deft_set_error(DEFT_ERR_STATE, "check: the blocks of segment %p cover %zu of %zu bytes",
                              (void *)seg->base, covered, seg->size);
    sum->reserved += (int64_t)seg->size;
    sum->segments++;
    return DEFT_OK;
}

static bool deft_check_stat(const deft_memory_stat *s, int64_t want) {
    return s->current == want && s->current == s->allocated - s->freed && s->peak >= s->current;
}

static deft_status deft_check_stats(const deft_pool *p, const deft_check_sums *sum) {
    const deft_memory_stats *st = &p->stats;
    if (!deft_check_stat(&st->reserved_bytes, sum->reserved) || !deft_check_stat(&st->segment, sum->segments))
        return deft_set_error(DEFT_ERR_STATE, "check: reserved statistics disagree with the segments");
    if (!deft_check_stat(&st->allocated_bytes, sum->allocated) ||
        !deft_check_stat(&st->allocation, sum->allocations) || !deft_check_stat(&st->requested_bytes, sum->requested))
        return deft_set_error(DEFT_ERR_STATE, "check: allocated statistics disagree with the blocks");
    if (!deft_check_stat(&st->active_bytes, sum->active))
        return deft_set_error(DEFT_ERR_STATE, "check: active_bytes disagrees with the blocks");
    if ((int64_t)p->live.count != sum->allocations)
        return deft_set_error(DEFT_ERR_STATE, "check: the live map holds %zu blocks, %lld are allocated",
                              p->live.count, (long long)sum->allocations);
    if (st->num_device_alloc - st->num_device_free != sum->segments)
        return deft_set_error(DEFT_ERR_STATE, "check: device allocs minus frees is not the segment count");
    return DEFT_OK;
}

deft_status deft_pool_check(const deft_pool *p) {
    deft_check_sums sum = {0};
    for (const deft_segment *seg = p->segments; seg; seg = seg->next) {
        deft_status s = deft_check_segment(p, seg, &sum);
        if (s != DEFT_OK) return s;
    }
    const deft_block *prev = NULL;
    int64_t small = deft_check_tree(p->free_small, true, &prev);
    prev = NULL;
    int64_t large = small < 0 ? -1 : deft_check_tree(p->free_large, false, &prev);
    if (small < 0 || large < 0) return DEFT_ERR_STATE;
    if (small + large != sum.free_blocks)
        return deft_set_error(DEFT_ERR_STATE, "check: %lld free blocks but %lld in the trees",
                              (long long)sum.free_blocks, (long long)(small + large));
    return deft_check_stats(p, &sum);
}

deft_status deft_caching_check(deft_device d) {
    deft_pool *p;
    deft_status s = deft_pool_of(d, &p);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&p->mu);
    s = deft_pool_check(p);
    pthread_mutex_unlock(&p->mu);
    return s;
}
