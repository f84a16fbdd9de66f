/* The waits between a program's lanes (passes/lane_hazards.h says the rules). */
#include <stdlib.h>
#include <string.h>

#include "lane_hazards.h"

void deft_hazards_reset(deft_hazards *h, int n_lanes) {
    h->n = n_lanes;
    h->n_foreign = 0;
    memset(h->issued, 0, sizeof h->issued);
    memset(h->seen, 0, sizeof h->seen);
    memset(h->own_at, 0, sizeof h->own_at);
}

void deft_hazards_free(deft_hazards *h) {
    free(h->foreign);
    h->foreign = NULL;
    h->n_foreign = h->cap_foreign = 0;
}

static bool deft_ranges_conflict(const deft_range *a, const deft_range *b) {
    return a->mem == b->mem && (a->write || b->write) && a->lo < b->hi && b->lo < a->hi;
}

/* Lane k must be waited for through its step count `at`: the mask gets bit k, and upto[k] the largest such count. */
static void deft_hazards_need(uint32_t *mask, int64_t *upto, int k, int64_t at) {
    *mask |= 1u << k;
    if (upto && at > upto[k]) upto[k] = at;
}

uint32_t deft_hazards_waits_upto(const deft_hazards *h, int lane, const deft_range *r, int nr, int64_t *upto) {
    uint32_t mask = 0;
    for (int k = 0; upto && k < h->n; k++) upto[k] = 0;
    for (int i = 0; i < nr; i++) {
        const int owner = r[i].mem;
        if (owner < h->n && owner != lane && h->own_at[owner] > h->seen[lane][owner])
            deft_hazards_need(&mask, upto, owner, h->own_at[owner]);
        for (int e = 0; e < h->n_foreign; e++) {
            const deft_foreign_access *a = &h->foreign[e];
            if (a->lane != lane && a->at > h->seen[lane][a->lane] && deft_ranges_conflict(&a->range, &r[i]))
                deft_hazards_need(&mask, upto, a->lane, a->at);
        }
    }
    return mask;
}

uint32_t deft_hazards_waits(const deft_hazards *h, int lane, const deft_range *r, int nr) {
    return deft_hazards_waits_upto(h, lane, r, nr, NULL);
}

void deft_hazards_waited(deft_hazards *h, int lane, int k) { h->seen[lane][k] = h->issued[k]; }

void deft_hazards_waited_upto(deft_hazards *h, int lane, int k, int64_t at) {
    if (at > h->seen[lane][k]) h->seen[lane][k] = at;
}

static deft_status deft_hazards_note(deft_hazards *h, int lane, const deft_range *r, int64_t at) {
    if (h->n_foreign == h->cap_foreign) {
        int cap = h->cap_foreign ? 2 * h->cap_foreign : 16;
        deft_foreign_access *f = realloc(h->foreign, (size_t)cap * sizeof *f);
        if (!f) return deft_set_error(DEFT_ERR_OOM, "run: out of host memory ordering the streams");
        h->foreign = f;
        h->cap_foreign = cap;
    }
    h->foreign[h->n_foreign++] = (deft_foreign_access){lane, *r, at};
    return DEFT_OK;
}

deft_status deft_hazards_queued(deft_hazards *h, int lane, const deft_range *r, int nr) {
    if (lane >= h->n) return DEFT_OK;
    const int64_t at = ++h->issued[lane];
    for (int i = 0; i < nr; i++) {
        if (r[i].mem == lane) {
            h->own_at[lane] = at;
            continue;
        }
        deft_status s = deft_hazards_note(h, lane, &r[i], at);
        if (s != DEFT_OK) return s;
    }
    return DEFT_OK;
}
