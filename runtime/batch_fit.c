/* The largest batch that fits, answered by the planner: each probe builds and plans a graph, nothing runs. */
#include "checked.h"
#include "deft.h"
#include "graph_internal.h"

#define DEFT_BATCH_MAX_OUTPUTS 64

/* Bytes a step of this batch needs, or a failed status (the builder's, or the planner's). */
static deft_status deft_batch_bytes(deft_batch_builder build, void *ctx, int64_t batch,
                                    const deft_compile_options *opts, size_t *need) {
    deft_graph *g = deft_graph_new();
    if (!g) return DEFT_ERR_OOM;
    deft_tensor *outs[DEFT_BATCH_MAX_OUTPUTS];
    int n = 0;
    deft_status s = build(g, batch, ctx, outs, &n);
    if (s != DEFT_OK)
        s = deft_set_error(s, "largest_batch: building batch %lld: %s", (long long)batch, deft_errmsg());
    if (s == DEFT_OK && (n <= 0 || n > DEFT_BATCH_MAX_OUTPUTS))
        s = deft_set_error(DEFT_ERR_INVALID, "largest_batch: the builder named %d outputs (1 to %d)", n,
                           DEFT_BATCH_MAX_OUTPUTS);
    if (s == DEFT_OK && deft_graph_error(g) != DEFT_OK)
        s = deft_set_error(deft_graph_error(g), "largest_batch: building batch %lld: %s", (long long)batch,
                           deft_graph_errmsg(g));
    deft_memory_report r;
    if (s == DEFT_OK && (s = deft_plan_memory(g, outs, n, opts, &r)) != DEFT_OK)
        s = deft_set_error(s, "largest_batch: planning batch %lld: %s", (long long)batch, deft_errmsg());
    if (s == DEFT_OK && !deft_size_add(r.arena_bytes, r.persistent_bytes, need))
        s = deft_set_error(DEFT_ERR_SHAPE, "largest_batch: batch %lld needs more than %zu bytes", (long long)batch,
                           SIZE_MAX);
    deft_graph_free(g);
    return s;
}

deft_status deft_largest_batch(deft_batch_builder build, void *ctx, size_t bytes, int64_t max_batch,
                               const deft_compile_options *opts, int64_t *out) {
    if (!build || !out || max_batch < 1)
        return deft_set_error(DEFT_ERR_INVALID, "largest_batch: needs a builder, an output and max_batch >= 1");
    deft_compile_options plan_opts = opts ? *opts : (deft_compile_options){0};
    plan_opts.memory_budget = 0;   /* the bytes given are the budget: probes must report, not fail */
    size_t need;
    deft_status s = deft_batch_bytes(build, ctx, 1, &plan_opts, &need);
    if (s != DEFT_OK) return s;
    if (need > bytes)
        return deft_set_error(DEFT_ERR_OOM, "largest_batch: even a batch of 1 needs %zu bytes, more than the %zu given",
                              need, bytes);
    int64_t lo = 1, hi = max_batch;   /* lo fits; find the last that does */
    /* Doubling first keeps the probes near the answer: a loose max_batch costs a few probes, and no probe builds a
     * graph whose sizes pass what memory can hold unless the budget does too (that probe's error then says so). */
    while (lo < hi) {
        const int64_t next = lo <= hi / 2 ? 2 * lo : hi;
        s = deft_batch_bytes(build, ctx, next, &plan_opts, &need);
        if (s != DEFT_OK) return s;
        if (need > bytes) {
            hi = next - 1;
            break;
        }
        lo = next;
    }
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        s = deft_batch_bytes(build, ctx, mid, &plan_opts, &need);
        if (s != DEFT_OK) return s;
        if (need <= bytes) lo = mid;
        else hi = mid - 1;
    }
    *out = lo;
    return DEFT_OK;
}
