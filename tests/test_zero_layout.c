/* ZeRO-1's arithmetic, checked without GPUs through deft_testing_zero_plan (the library's own slicing and the reduces
 * dist/dist_zero.c builds for a replica, on a copy of a CPU optimizer; tests/cuda_test_zero.c runs them on 2 GPUs).
 * For AdamW over 58 f32 elements (a 7 -> 5 and a 5 -> 3 linear layer) in worlds of 1, 2, 3, 4 and 8 ranks (slices
 * that cut parameters, a parameter spread over five slices, slices of padding only), every rank:
 * - the slices: the storage padded to a multiple of world x 16 bytes (less than one multiple more), rank r's slice
 *   [r S, (r + 1) S);
 * - the bytes: the state arrays and the flat gradients are S elements each, so the flat gradients summed over the
 *   ranks are the padded storage once (1 / N per rank, none of them a full-size copy), and the planner counts exactly
 *   state + gradients;
 * - the reduces: each gradient's pieces tile it in rank order, each inside its root's slice, sent from its place in
 *   the gradient, the same list on every rank; on its root a piece lands at its place relative to lo in the flat
 *   gradients, inside the buffer; this rank's pieces over all the gradients cover its slice's parameter elements
 *   exactly once;
 * - bad world, rank or parameter: -1 with DEFT_ERR_INVALID's message; a bf16 gradient of the f32 optimizer (data
 *   parallel keeps f32 gradients under autocast, so none reaches a replica): -1, the message naming both dtypes. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "deft_testing.h"

#define IN 7
#define HID 5
#define OUT 3
#define MAXP 16

static deft_optimizer *build(deft_graph *g) {
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){4, IN}, deft_cpu());
    deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){4}, deft_cpu());
    deft_tensor *hidden = deft_relu(deft_linear(x, HID, "fc0", NULL));
    deft_tensor *loss = deft_cross_entropy(deft_linear(hidden, OUT, "fc1", NULL), y);
    CHECK_OK(deft_backward(loss));
    deft_optimizer *o = deft_adamw(g, NULL, NULL);
    CHECK(o && deft_optimizer_step(o));
    return o;
}

typedef struct layout {
    int n;
    int64_t off[8], numel[8], total;
} layout;

static layout layout_of(const deft_optimizer *o) {
    layout L = {.n = deft_optimizer_param_count(o)};
    for (int i = 0; i < L.n; i++) {
        L.off[i] = L.total;
        L.numel[i] = deft_tensor_numel(deft_optimizer_param(o, i));
        L.total += L.numel[i];
    }
    return L;
}

/* The bytes rank r of `world` holds and plans. */
static void check_sizes(const deft_testing_zero *z, const layout *L, int world, int r) {
    const int64_t quantum = (int64_t)world * 4, padded = z->padded, shard = padded / world;
    CHECK_MSG(z->world == world && z->rank == r && z->total == L->total, "world %d rank %d", world, r);
    CHECK_MSG(padded % quantum == 0 && padded >= L->total && padded - L->total < quantum, "world %d: %lld padded to "
              "%lld", world, (long long)L->total, (long long)padded);
    CHECK(z->lo == r * shard && z->hi == z->lo + shard);
    const size_t slice = (size_t)shard * sizeof(float);
    CHECK_MSG(z->grad_bytes == slice, "world %d: flat gradients of %zu bytes, the slice is %zu", world, z->grad_bytes,
              slice);
    CHECK(z->state_bytes == 2 * slice);
    CHECK(z->planned_bytes == z->state_bytes + z->grad_bytes);
    CHECK((size_t)world * z->grad_bytes == (size_t)padded * sizeof(float));
    if (world > 1) CHECK(z->grad_bytes < (size_t)L->total * sizeof(float));
}

/* Parameter i's pieces as rank r of `world` builds them, against rank 0's (ref, nref) when r > 0; marks the
 * elements rank r receives in got (relative to lo). */
static void check_pieces(const deft_testing_zero *z, const layout *L, int i, const deft_testing_zero_piece *q, int n,
                         const deft_testing_zero_piece *ref, int nref, int *got) {
    const int64_t shard = z->hi - z->lo;
    const size_t gsz = sizeof(float);
    CHECK_MSG(n >= 1 && n <= MAXP, "parameter %d: %d pieces", i, n);
    int64_t at = L->off[i];
    for (int k = 0; k < n && k < MAXP; k++) {
        CHECK_MSG(q[k].start == at && q[k].count > 0, "parameter %d piece %d: [%lld, +%lld), expected from %lld", i, k,
                  (long long)q[k].start, (long long)q[k].count, (long long)at);
        CHECK(q[k].root == (int)(q[k].start / shard) && (q[k].start + q[k].count - 1) / shard == q[k].root);
        CHECK(k == 0 || q[k].root > q[k - 1].root);
        CHECK(q[k].send_offset == (size_t)(q[k].start - L->off[i]) * gsz);
        if (ref)
            CHECK_MSG(nref == n && ref[k].root == q[k].root && ref[k].start == q[k].start && ref[k].count == q[k].count,
                      "parameter %d piece %d differs between rank 0 and rank %d", i, k, z->rank);
        if (q[k].root == z->rank) {
            CHECK(q[k].dest_offset == (size_t)(q[k].start - z->lo) * sizeof(float));
            CHECK(q[k].dest_offset + (size_t)q[k].count * gsz <= (size_t)shard * sizeof(float));
            for (int64_t e = q[k].start; e < q[k].start + q[k].count; e++) got[e - z->lo]++;
        } else {
            CHECK(q[k].dest_offset == (size_t)-1);
        }
        at = q[k].start + q[k].count;
    }
    CHECK_MSG(at == L->off[i] + L->numel[i], "parameter %d: pieces end at %lld", i, (long long)at);
}

static void check_world(const deft_optimizer *o, const layout *L, int world) {
    static deft_testing_zero_piece ref[8][MAXP];
    int nref[8];
    for (int r = 0; r < world; r++) {
        deft_testing_zero z;
        int got[64] = {0};
        for (int i = 0; i < L->n; i++) {
            deft_testing_zero_piece q[MAXP];
            const int n = deft_testing_zero_plan(o, world, r, i, DEFT_F32, &z, q, MAXP);
            CHECK_MSG(n > 0, "world %d rank %d parameter %d: %s", world, r, i, deft_errmsg());
            if (n <= 0) return;
            if (i == 0) check_sizes(&z, L, world, r);
            check_pieces(&z, L, i, q, n, r ? ref[i] : NULL, nref[i], got);
            if (r == 0) {
                memcpy(ref[i], q, sizeof q);
                nref[i] = n;
            }
        }
        /* Its slice's parameter elements once each, its padding never. */
        for (int64_t e = z.lo; e < z.hi; e++)
            CHECK_MSG(got[e - z.lo] == (e < L->total ? 1 : 0), "world %d rank %d: element %lld received %d times",
                      world, r, (long long)e, got[e - z.lo]);
    }
}

static void check_refusals(const deft_optimizer *o, const layout *L) {
    deft_testing_zero z;
    deft_testing_zero_piece q[MAXP];
    CHECK(deft_testing_zero_plan(o, 0, 0, 0, DEFT_F32, &z, q, MAXP) == -1 && strstr(deft_errmsg(), "world of 0"));
    CHECK(deft_testing_zero_plan(o, 2, 2, 0, DEFT_F32, &z, q, MAXP) == -1 && strstr(deft_errmsg(), "rank 2"));
    CHECK(deft_testing_zero_plan(o, 2, 0, L->n, DEFT_F32, &z, q, MAXP) == -1 && strstr(deft_errmsg(), "parameter"));
    CHECK_MSG(deft_testing_zero_plan(o, 2, 0, 0, DEFT_BF16, &z, q, MAXP) == -1 && strstr(deft_errmsg(), "f32 flat") &&
                  strstr(deft_errmsg(), "is bf16"),
              "a bf16 gradient: %s", deft_errmsg());
}

int main(void) {
    deft_graph *g = deft_graph_new();
    deft_optimizer *o = build(g);
    deft_program *p = deft_compile(g, (deft_tensor *[]){deft_graph_find(g, "fc0.weight")}, 1, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    const layout L = layout_of(o);
    CHECK(L.n == 4 && L.total == IN * HID + HID + HID * OUT + OUT);
    /* Unsharded on the cpu: whole flat gradients, nothing sharded. */
    deft_testing_zero whole;
    deft_testing_optimizer_zero(o, &whole);
    CHECK(whole.world == 0 && whole.lo == 0 && whole.hi == 0);
    const int worlds[] = {1, 2, 3, 4, 8};
    for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++) {
        check_world(o, &L, worlds[w]);
    }
    check_refusals(o, &L);
    /* The optimizer itself is left unsharded. */
    deft_testing_optimizer_zero(o, &whole);
    CHECK(whole.world == 0 && whole.total == L.total);
    deft_program_free(p);
    deft_graph_free(g);
    return deft_check_finish();
}
