/* Knowing before running: the memory a program needs, and the largest batch that fits, from the plan alone. */
#include "check.h"

/* x[batch, 64] @ w[64, 128] -> relu -> @ w2[128, 10]: persistent = 4*(64*128 + 128*10) + the input. */
static deft_status build_mlp(deft_graph *g, int64_t batch, void *ctx, deft_tensor **outs, int *n) {
    int *calls = ctx;
    (*calls)++;
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){batch, 64}, deft_cpu());
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){64, 128}, deft_cpu(), DEFT_INIT_KAIMING);
    deft_tensor *w2 = deft_param(g, "w2", DEFT_F32, 2, (int64_t[]){128, 10}, deft_cpu(), DEFT_INIT_KAIMING);
    outs[0] = deft_matmul(deft_relu(deft_matmul(x, w)), w2);
    *n = 1;
    return outs[0] ? DEFT_OK : deft_graph_error(g);
}

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

/* What a batch needs, worked out by hand: weights and input persist; the hidden [b,128] buffer (relu runs in place)
 * and the output [b,10] are live together at the second matmul. */
static size_t need_by_hand(int64_t b) {
    size_t persistent = 4 * (64 * 128 + 128 * 10) + 4 * (size_t)b * 64;
    return persistent + align256(4 * (size_t)b * 128) + align256(4 * (size_t)b * 10);
}

int main(void) {
    int calls = 0;
    for (int64_t b = 1; b <= 300; b += 37) {
        deft_graph *g = deft_graph_new();
        deft_tensor *outs[1];
        int n;
        build_mlp(g, b, &calls, outs, &n);
        deft_memory_report r;
        CHECK_OK(deft_plan_memory(g, outs, n, NULL, &r));
        CHECK_MSG(r.arena_bytes + r.persistent_bytes == need_by_hand(b), "batch %lld: %zu vs %zu", (long long)b,
                  r.arena_bytes + r.persistent_bytes, need_by_hand(b));
        deft_graph_free(g);
    }
    int64_t best = 0;
    size_t budget = need_by_hand(1000) + 100;
    calls = 0;
    CHECK_OK(deft_largest_batch(build_mlp, &calls, budget, 100000, NULL, &best));
    CHECK_MSG(best >= 1000 && need_by_hand(best) <= budget && need_by_hand(best + 1) > budget, "best %lld",
              (long long)best);
    CHECK(calls < 25);   /* a binary search, not a scan */
    CHECK_OK(deft_largest_batch(build_mlp, &calls, (size_t)1 << 40, 512, NULL, &best));
    CHECK(best == 512);
    CHECK_ERR(deft_largest_batch(build_mlp, &calls, 1000, 512, NULL, &best), DEFT_ERR_OOM,
              "even a batch of 1 needs");
    CHECK_ERR(deft_largest_batch(NULL, NULL, 1000, 512, NULL, &best), DEFT_ERR_INVALID, "needs a builder");
    return deft_check_finish();
}
