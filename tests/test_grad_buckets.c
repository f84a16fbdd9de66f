/* Data parallel's gradient buckets without a GPU (passes/grad_buckets.h, passes/optimizer_split.h):
 * - the cut of an MLP's optimizer step: every gradient once, in the order the backward pass makes them (the last
 *   layer's first), buckets of at most bucket_bytes unless a gradient alone, and a last bucket of at most
 *   last_bucket_bytes or one gradient (the first layer's); a large last_bucket_bytes takes everything;
 * - the split per bucket: one piece per bucket (the MLP's parameters are consecutive in each), made in bucket order,
 *   each piece's parameters exactly its bucket's, and a finisher. The split reads the option dist only as a flag, so
 *   a dummy pointer stands for a communicator here (no NCCL needed). */
#include "check.h"
#include "deft_testing.h"

#define LAYERS 4

typedef struct net {
    deft_graph *g;
    deft_tensor *loss, *step;
} net;

/* fc0: 600 -> 1024 (2.4 MB of weight), fc1, fc2: 1024 -> 1024 (4 MiB), fc3: 1024 -> 10. */
static net build(const deft_step_options *so) {
    net n = {deft_graph_new(), NULL, NULL};
    deft_tensor *x = deft_input(n.g, "x", DEFT_F32, 2, (int64_t[]){8, 600}, deft_cpu());
    deft_tensor *y = deft_input(n.g, "y", DEFT_I32, 1, (int64_t[]){8}, deft_cpu());
    deft_tensor *h = x;
    for (int l = 0; l < LAYERS; l++) {
        char name[8];
        snprintf(name, sizeof name, "fc%d", l);
        h = deft_linear(h, l == LAYERS - 1 ? 10 : 1024, name, NULL);
        if (l < LAYERS - 1) h = deft_relu(h);
    }
    n.loss = deft_cross_entropy(h, y);
    CHECK_OK(deft_backward(n.loss));
    n.step = deft_optimizer_step(deft_sgd(n.g, &(deft_sgd_options){.lr = 0.1, .momentum = 0.9}, so));
    CHECK(n.step != NULL);
    return n;
}

/* The layer of parameter i of the step ("fcL.weight" / "fcL.bias"). */
static int layer_of(const deft_tensor *step, int i) {
    return deft_tensor_name(deft_testing_optimizer_param(deft_testing_step_optimizer(step), i))[2] - '0';
}

/* The rules every cut keeps; returns the bytes of the last bucket. */
static size_t check_cut(const deft_tensor *step, const deft_testing_buckets *b, size_t limit, size_t last_limit) {
    const int n = deft_testing_src_count(step);
    CHECK(b->n == n && b->n_buckets >= 1 && b->first[0] == 0 && b->first[b->n_buckets] == n);
    int seen[2 * LAYERS] = {0};
    size_t total = 0, want = 0;
    for (int j = 0; j < n; j++) {
        seen[b->order[j]]++;
        want += deft_tensor_nbytes(deft_testing_src(step, j));
        if (j > 0) CHECK_MSG(layer_of(step, b->order[j]) <= layer_of(step, b->order[j - 1]),
                             "position %d: fc%d after fc%d", j, layer_of(step, b->order[j]),
                             layer_of(step, b->order[j - 1]));
    }
    for (int i = 0; i < n; i++) CHECK_MSG(seen[i] == 1, "parameter %d appears %d times", i, seen[i]);
    for (int k = 0; k < b->n_buckets; k++) {
        size_t bytes = 0;
        const int members = b->first[k + 1] - b->first[k];
        CHECK(members >= 1);
        for (int j = b->first[k]; j < b->first[k + 1]; j++)
            bytes += deft_tensor_nbytes(deft_testing_src(step, b->order[j]));
        CHECK_MSG(bytes == b->bytes[k], "bucket %d: %zu bytes, recorded %zu", k, bytes, b->bytes[k]);
        const size_t cap = k == b->n_buckets - 1 ? last_limit : limit;
        CHECK_MSG(members == 1 || bytes <= cap, "bucket %d: %d gradients, %zu bytes over %zu", k, members, bytes, cap);
        total += bytes;
    }
    CHECK(total == want);
    return b->bytes[b->n_buckets - 1];
}

static void test_cut(void) {
    net n = build(NULL);
    const size_t fc0_weight = 1024 * 600 * sizeof(float), mib = 1 << 20;
    deft_testing_buckets b;
    CHECK_OK(deft_testing_grad_buckets(n.step, NULL, &b));
    /* Defaults: 8 MiB, and a last bucket of 1 MiB, which fc0's weight (the last gradient made) exceeds alone. */
    const size_t last = check_cut(n.step, &b, 8 * mib, mib);
    const int last_param = b.order[b.first[b.n_buckets - 1]];
    printf("defaults: %d buckets, the last %zu bytes (%s)\n", b.n_buckets, last,
           deft_tensor_name(deft_testing_optimizer_param(deft_testing_step_optimizer(n.step), last_param)));
    CHECK(b.first[b.n_buckets] - b.first[b.n_buckets - 1] == 1 && layer_of(n.step, last_param) == 0);
    CHECK(last == fc0_weight || last == 1024 * sizeof(float));
    deft_testing_grad_buckets_free(&b);

    /* Small buckets: every one of several gradients within 64 KiB; the last bucket of 8 KiB holds a bias or less. */
    CHECK_OK(deft_testing_grad_buckets(n.step, &(deft_compile_options){.bucket_bytes = 64 << 10,
                                                                   .last_bucket_bytes = 8 << 10}, &b));
    check_cut(n.step, &b, 64 << 10, 8 << 10);
    CHECK(b.n_buckets >= 6);
    deft_testing_grad_buckets_free(&b);

    /* A last bucket larger than the model takes every gradient: one bucket. */
    CHECK_OK(deft_testing_grad_buckets(n.step, &(deft_compile_options){.last_bucket_bytes = 64 * mib}, &b));
    check_cut(n.step, &b, 8 * mib, 64 * mib);
    CHECK(b.n_buckets == 1 && b.bytes[0] > 10 * mib);
    deft_testing_grad_buckets_free(&b);
    deft_graph_free(n.g);
}

/* The split per bucket matches the cut, piece by piece, in bucket order. */
static void test_split(void) {
    net n = build(NULL);
    const deft_compile_options o = {.dist = (struct deft_dist *)&n, .bucket_bytes = 5 << 20, .dist_bucket_pieces = 1};
    deft_testing_buckets b;
    CHECK_OK(deft_testing_grad_buckets(n.step, &o, &b));
    const int before = deft_graph_node_count(n.g);
    deft_testing_split sp;
    int made = 0;
    CHECK_OK(deft_testing_optimizer_split(n.g, (deft_tensor *[]){n.loss, n.step}, 2, &o, &sp, &made));
    CHECK(made && sp.per_bucket && sp.n_steps == 1);
    if (!made) return;
    printf("split per bucket: %d buckets, %d pieces\n", b.n_buckets, sp.n_pieces);
    CHECK(sp.n_pieces == b.n_buckets && sp.n_before == before && sp.n_after == before + b.n_buckets + 1);
    for (int k = 0; k < b.n_buckets && k < sp.n_pieces; k++) {
        const deft_tensor *piece = deft_testing_node(n.g, before + k);
        int first_param = -1, finisher = 1;
        const int is_part =
            deft_testing_optimizer_part(deft_testing_step_optimizer(piece), &first_param, &finisher) != NULL;
        const int nsrc = deft_testing_src_count(piece);
        CHECK_MSG(is_part && !finisher && sp.bucket_of[k] == k, "node %d is not bucket %d's piece", before + k, k);
        CHECK(nsrc == b.first[k + 1] - b.first[k]);
        for (int j = b.first[k]; is_part && j < b.first[k + 1]; j++) {
            const int i = b.order[j];
            CHECK_MSG(i >= first_param && i < first_param + nsrc, "bucket %d's parameter %d is not in its piece", k, i);
        }
    }
    const deft_tensor *fin = deft_testing_node(n.g, sp.n_after - 1);
    int fin_finisher = 0;
    CHECK(deft_testing_optimizer_part(deft_testing_step_optimizer(fin), NULL, &fin_finisher) && fin_finisher &&
          sp.bucket_of[b.n_buckets] == -1);
    CHECK(sp.redirect[deft_testing_node_id(n.step)] == deft_testing_node_id(fin));
    deft_testing_split_free(n.g, &sp);
    CHECK(deft_graph_node_count(n.g) == before);

    /* Which options split per bucket (compile asks only then): dist with dist_bucket_pieces; not dist alone, not
     * without dist. */
    CHECK(deft_testing_split_per_bucket(&o));
    CHECK(!deft_testing_split_per_bucket(&(deft_compile_options){.dist = o.dist}));
    CHECK(!deft_testing_split_per_bucket(&(deft_compile_options){.bucket_bytes = 1 << 20}));
    deft_testing_grad_buckets_free(&b);
    deft_graph_free(n.g);

    /* A step that clips needs every gradient before any update: it stays whole, without an error. */
    n = build(&(deft_step_options){.max_grad_norm = 1.0});
    CHECK_OK(deft_testing_optimizer_split(n.g, (deft_tensor *[]){n.loss, n.step}, 2, &o, &sp, &made));
    CHECK(!made && deft_graph_node_count(n.g) == before);
    deft_graph_free(n.g);
}

int main(void) {
    test_cut();
    test_split();
    return deft_check_finish();
}
