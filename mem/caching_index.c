/* The two indexes of the caching allocator.
 *
 * Free blocks sit in a treap (a binary search tree kept balanced by random priorities) ordered by (stream, size,
 * address): best fit is the first key >= (stream, size, 0), found in O(log n) expected, and a block leaves the tree
 * in O(log n) when it is handed out or merged with a neighbour. PyTorch uses a std::set with the same order; a treap
 * is the smallest balanced structure to write in C, and the nodes are the blocks themselves (no allocation).
 * Ordering by address among equal sizes keeps the reuse deterministic and prefers low addresses, which keeps the
 * high part of a segment free so that it coalesces.
 *
 * Live blocks are found by address in a hash map (open addressing, linear probing, deletion by backward shift, so
 * there are no tombstones and lookups stay short), which is what lets a double free or a foreign pointer be
 * reported instead of corrupting the pool. */
#include <stdlib.h>

#include "caching_internal.h"

/* ---- the treap ---- */

/* -1, 0, 1 as block a compares with the key (stream, size, addr). */
static int deft_key_cmp(const deft_block *a, uintptr_t stream, size_t size, uintptr_t addr) {
    uintptr_t as = (uintptr_t)a->stream;
    if (as != stream) return as < stream ? -1 : 1;
    if (a->size != size) return a->size < size ? -1 : 1;
    if (a->addr != addr) return a->addr < addr ? -1 : 1;
    return 0;
}

static bool deft_block_less(const deft_block *a, const deft_block *b) {
    return deft_key_cmp(a, (uintptr_t)b->stream, b->size, b->addr) < 0;
}

/* Joins two treaps where every key of a is below every key of b. */
static deft_block *deft_treap_merge(deft_block *a, deft_block *b) {
    if (!a) return b;
    if (!b) return a;
    if (a->prio > b->prio) {
        a->right = deft_treap_merge(a->right, b);
        return a;
    }
    b->left = deft_treap_merge(a, b->left);
    return b;
}

/* Splits t into the keys below k (lo) and the rest (hi). */
static void deft_treap_split(deft_block *t, const deft_block *k, deft_block **lo, deft_block **hi) {
    if (!t) {
        *lo = *hi = NULL;
        return;
    }
    if (deft_block_less(t, k)) {
        deft_treap_split(t->right, k, &t->right, hi);
        *lo = t;
    } else {
        deft_treap_split(t->left, k, lo, &t->left);
        *hi = t;
    }
}

void deft_tree_insert(deft_block **root, deft_block *b) {
    deft_block *lo, *hi;
    b->left = b->right = NULL;
    deft_treap_split(*root, b, &lo, &hi);
    *root = deft_treap_merge(deft_treap_merge(lo, b), hi);
}

void deft_tree_remove(deft_block **root, deft_block *b) {
    deft_block **p = root;
    while (*p && *p != b) p = deft_block_less(b, *p) ? &(*p)->left : &(*p)->right;
    if (!*p) return;   /* not in this tree: callers only remove blocks they know are free */
    *p = deft_treap_merge(b->left, b->right);
    b->left = b->right = NULL;
}

deft_block *deft_tree_best_fit(deft_block *root, void *stream, size_t size) {
    deft_block *best = NULL;
    for (deft_block *t = root; t;) {
        if (deft_key_cmp(t, (uintptr_t)stream, size, 0) >= 0) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    /* The first key at or above (stream, size) may belong to the next stream: no fit on this one. */
    return best && best->stream == stream ? best : NULL;
}

/* ---- the live map ---- */

static size_t deft_map_slot(const deft_block_map *m, uintptr_t addr) {
    /* Fibonacci hashing: addresses are multiples of 512, so the low bits carry nothing. */
    uint64_t h = (uint64_t)addr * UINT64_C(0x9E3779B97F4A7C15);
    return (size_t)(h >> 32) & (m->cap - 1);
}

static void deft_map_insert_raw(deft_block_map *m, deft_block *b) {
    size_t i = deft_map_slot(m, b->addr);
    while (m->keys[i]) i = (i + 1) & (m->cap - 1);
    m->keys[i] = b->addr;
    m->vals[i] = b;
    m->count++;
}

/* Keeps the load at most 1/2 so that probes stay short. */
deft_status deft_map_reserve_one(deft_block_map *m) {
    if ((m->count + 1) * 2 <= m->cap) return DEFT_OK;
    size_t cap = m->cap ? m->cap * 2 : 64;
    deft_block_map n = {calloc(cap, sizeof *n.keys), calloc(cap, sizeof *n.vals), cap, 0};
    if (!n.keys || !n.vals) {
        free(n.keys);
        free(n.vals);
        return DEFT_ERR_OOM;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) deft_map_insert_raw(&n, m->vals[i]);
    free(m->keys);
    free(m->vals);
    *m = n;
    return DEFT_OK;
}

void deft_map_put(deft_block_map *m, deft_block *b) { deft_map_insert_raw(m, b); }

static size_t deft_map_find(const deft_block_map *m, uintptr_t addr) {
    if (!m->cap || !addr) return SIZE_MAX;
    for (size_t i = deft_map_slot(m, addr); m->keys[i]; i = (i + 1) & (m->cap - 1))
        if (m->keys[i] == addr) return i;
    return SIZE_MAX;
}

deft_block *deft_map_get(const deft_block_map *m, uintptr_t addr) {
    size_t i = deft_map_find(m, addr);
    return i == SIZE_MAX ? NULL : m->vals[i];
}

/* Backward-shift deletion: moves later members of the probe run into the hole when their home slot allows it. */
deft_block *deft_map_take(deft_block_map *m, uintptr_t addr) {
    size_t i = deft_map_find(m, addr);
    if (i == SIZE_MAX) return NULL;
    deft_block *b = m->vals[i];
    size_t mask = m->cap - 1, hole = i;
    for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
        size_t home = deft_map_slot(m, m->keys[j]);
        /* j may move into the hole unless its home lies cyclically in (hole, j]. */
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (stays) continue;
        m->keys[hole] = m->keys[j];
        m->vals[hole] = m->vals[j];
        hole = j;
    }
    m->keys[hole] = 0;
    m->vals[hole] = NULL;
    m->count--;
    return b;
}
