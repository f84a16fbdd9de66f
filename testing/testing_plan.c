/* Test support for the pure passes: the planner, the schedule's order and the lanes' hazards, on lists the tests
 * build. Each call copies the lists into the library's own structs and the results back, whole, so that a pass that
 * changed what it should only read would still show in the test. */
#include "deft_testing.h"

#include <stdlib.h>

#include "base.h"
#include "lane_hazards.h"
#include "planner.h"
#include "schedule_order.h"

_Static_assert(DEFT_TESTING_PLAN_ALIGN == DEFT_PLAN_ALIGN, "deft_testing.h's alignment is the planner's");

deft_status deft_testing_plan(deft_testing_plan_buffer *bufs, int n, int no_reuse, deft_testing_plan_stats *stats) {
    deft_plan_buffer *work = n > 0 ? malloc((size_t)n * sizeof *work) : NULL;
    if (n > 0 && !work) return deft_set_error(DEFT_ERR_OOM, "testing_plan: out of host memory");
    for (int i = 0; i < n; i++) work[i] = (deft_plan_buffer){bufs[i].size, bufs[i].first, bufs[i].last, bufs[i].offset};
    deft_plan_stats st;
    const deft_status s = deft_plan_offsets(work, n, no_reuse, &st);
    for (int i = 0; i < n; i++)
        bufs[i] = (deft_testing_plan_buffer){work[i].size, work[i].first, work[i].last, work[i].offset};
    *stats = (deft_testing_plan_stats){st.arena_bytes, st.lower_bound, st.no_reuse_bytes};
    free(work);
    return s;
}

deft_status deft_testing_schedule_order(const deft_testing_order_step *steps, int n, const int *deps, int *order) {
    deft_order_step *work = steps && n > 0 ? malloc((size_t)n * sizeof *work) : NULL;
    if (steps && n > 0 && !work) return deft_set_error(DEFT_ERR_OOM, "testing_schedule_order: out of host memory");
    for (int i = 0; steps && i < n; i++)
        work[i] = (deft_order_step){steps[i].bytes, steps[i].keep_alive, steps[i].dep_begin, steps[i].dep_end};
    const deft_status s = deft_schedule_order(work, n, deps, order);
    free(work);
    return s;
}

/* ---- lane hazards ---- */
struct deft_testing_hazards {
    deft_hazards h;
};

/* The ranges in the library's form; more than a test ever passes is a broken test. */
#define DEFT_TESTING_MAX_RANGES 16
static int deft_testing_ranges(const deft_testing_range *r, int nr, deft_range *out) {
    if (nr < 0 || nr > DEFT_TESTING_MAX_RANGES) return 0;
    for (int i = 0; i < nr; i++) out[i] = (deft_range){r[i].mem, r[i].lo, r[i].hi, r[i].write != 0};
    return 1;
}

deft_testing_hazards *deft_testing_hazards_new(int n_lanes) {
    deft_testing_hazards *h = calloc(1, sizeof *h);
    if (h) deft_hazards_reset(&h->h, n_lanes);
    return h;
}

void deft_testing_hazards_reset(deft_testing_hazards *h, int n_lanes) { deft_hazards_reset(&h->h, n_lanes); }

void deft_testing_hazards_free(deft_testing_hazards *h) { deft_hazards_free(&h->h); }

void deft_testing_hazards_delete(deft_testing_hazards *h) {
    if (!h) return;
    deft_hazards_free(&h->h);
    free(h);
}

int deft_testing_hazards_foreign(const deft_testing_hazards *h, int *capacity, int *stored) {
    if (capacity) *capacity = h->h.cap_foreign;
    if (stored) *stored = h->h.foreign != NULL;
    return h->h.n_foreign;
}

int64_t deft_testing_hazards_seen(const deft_testing_hazards *h, int lane, int k) { return h->h.seen[lane][k]; }

uint32_t deft_testing_hazards_waits(const deft_testing_hazards *h, int lane, const deft_testing_range *r, int nr) {
    deft_range rs[DEFT_TESTING_MAX_RANGES];
    return deft_testing_ranges(r, nr, rs) ? deft_hazards_waits(&h->h, lane, rs, nr) : UINT32_MAX;
}

uint32_t deft_testing_hazards_waits_upto(const deft_testing_hazards *h, int lane, const deft_testing_range *r, int nr,
                                         int64_t *upto) {
    deft_range rs[DEFT_TESTING_MAX_RANGES];
    return deft_testing_ranges(r, nr, rs) ? deft_hazards_waits_upto(&h->h, lane, rs, nr, upto) : UINT32_MAX;
}

void deft_testing_hazards_waited(deft_testing_hazards *h, int lane, int k) { deft_hazards_waited(&h->h, lane, k); }

void deft_testing_hazards_waited_upto(deft_testing_hazards *h, int lane, int k, int64_t at) {
    deft_hazards_waited_upto(&h->h, lane, k, at);
}

deft_status deft_testing_hazards_queued(deft_testing_hazards *h, int lane, const deft_testing_range *r, int nr) {
    deft_range rs[DEFT_TESTING_MAX_RANGES];
    if (!deft_testing_ranges(r, nr, rs)) return deft_set_error(DEFT_ERR_INVALID, "hazards_queued: %d ranges", nr);
    return deft_hazards_queued(&h->h, lane, rs, nr);
}
