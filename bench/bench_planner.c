/* bench_planner: how close the memory planner's arena comes to the lower bound (the largest sum of bytes live at any
 * step) on graphs of several shapes, and how long planning takes; then how much reordering a schedule lowers its peak
 * of live bytes, on step lists where the order given is a poor one. One figure per line: `<name> <value> <unit>`.
 *
 * The training-step graphs spell their backward pass out with ordinary ops (the same matmuls, reductions and
 * elementwise products autodiff emits), so the planner sees the lifetimes of a real step. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deft.h"
#include "deft_testing.h"

#define CPU deft_cpu()

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static int rand_below(int n) { return (int)(next_u64() % (uint64_t)n); }

typedef struct bench_graph {
    deft_graph *g;
    deft_tensor *outs[4096];
    int n_outs;
} bench_graph;

static void add_out(bench_graph *b, deft_tensor *t) {
    if (b->n_outs < 4096) b->outs[b->n_outs++] = t;
}

/* Forward through `layers` linear+activation layers, an MSE loss, the backward pass and an SGD update per layer:
 * the updated weights are the step's outputs. */
static void build_mlp_step(bench_graph *b, int layers, int64_t batch, int64_t width, int64_t in_dim) {
    deft_graph *g = b->g;
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){batch, in_dim}, CPU);
    deft_tensor *y = deft_input(g, "y", DEFT_F32, 2, (int64_t[]){batch, width}, CPU);
    deft_tensor *w[512], *bias[512], *z[512], *h[513];
    h[0] = x;
    for (int l = 0; l < layers; l++) {
        int64_t fan_in = l == 0 ? in_dim : width;
        w[l] = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){fan_in, width}, CPU, DEFT_INIT_KAIMING);
        bias[l] = deft_param(g, "b", DEFT_F32, 1, (int64_t[]){width}, CPU, DEFT_INIT_ZEROS);
        z[l] = deft_add(deft_matmul(h[l], w[l]), bias[l]);
        h[l + 1] = deft_silu(z[l]);
    }
    deft_tensor *diff = deft_sub(h[layers], y);
    add_out(b, deft_mean(deft_mul(diff, diff), 0, NULL, 0));
    deft_tensor *dh = deft_mul_scalar(diff, 2.0 / (double)(batch * width));
    for (int l = layers - 1; l >= 0; l--) {
        deft_tensor *sz = deft_sigmoid(z[l]);
        /* d silu(z) / dz = s + z s (1 - s) */
        deft_tensor *dz = deft_mul(dh, deft_add(sz, deft_mul(z[l], deft_mul(sz, deft_rsub_scalar(sz, 1.0)))));
        deft_tensor *dw = deft_matmul_t(h[l], dz, 1, 0);
        deft_tensor *db = deft_sum(dz, 1, (int[]){0}, 0);
        add_out(b, deft_sub(w[l], deft_mul_scalar(dw, 0.01)));
        add_out(b, deft_sub(bias[l], deft_mul_scalar(db, 0.01)));
        if (l > 0) dh = deft_matmul_t(dz, w[l], 0, 1);
    }
}

/* Inception-like blocks: four parallel branches of different depths concatenated, a projection, and a skip add
 * from the block's input, several blocks deep, plus a long skip from the first block to the last. */
static void build_branchy(bench_graph *b, int blocks, int64_t batch, int64_t width) {
    deft_graph *g = b->g;
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){batch, width}, CPU);
    deft_tensor *first = NULL;
    for (int k = 0; k < blocks; k++) {
        deft_tensor *br[4];
        for (int j = 0; j < 4; j++) {
            deft_tensor *t = x;
            for (int d = 0; d <= j; d++) {
                deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){d == 0 ? width : width / 2, width / 2},
                                            CPU, DEFT_INIT_KAIMING);
                t = deft_relu(deft_matmul(t, w));
            }
            br[j] = t;
        }
        deft_tensor *cat = deft_concat(br, 4, 1);
        deft_tensor *proj = deft_param(g, "p", DEFT_F32, 2, (int64_t[]){2 * width, width}, CPU, DEFT_INIT_KAIMING);
        x = deft_add(deft_tanh(deft_matmul(cat, proj)), x);
        if (!first) first = x;
    }
    add_out(b, deft_sum(deft_add(x, first), 0, NULL, 0));
}

/* Random DAG: each node reads one or two of the recent nodes (locality, as real graphs have) and now and then one
 * from far back (a skip); sizes vary by a factor of 16. */
static void build_random_dag(bench_graph *b, int nodes) {
    deft_graph *g = b->g;
    deft_tensor **pool = malloc((size_t)(nodes + 8) * sizeof *pool);
    int np = 0;
    const int64_t sizes[5] = {256, 1024, 4096, 2048, 512};
    for (int i = 0; i < 5; i++) pool[np++] = deft_input(g, "x", DEFT_F32, 1, (int64_t[]){sizes[i]}, CPU);
    while (np < nodes) {
        deft_tensor *a = pool[np - 1 - rand_below(np < 6 ? np : 6)];
        int far = rand_below(10) == 0;
        deft_tensor *c = pool[far ? rand_below(np) : np - 1 - rand_below(np < 12 ? np : 12)];
        deft_tensor *t;
        int64_t na = deft_tensor_numel(a), nc = deft_tensor_numel(c);
        switch (rand_below(4)) {
        case 0: t = na == nc ? deft_add(a, c) : deft_tanh(a); break;
        case 1: t = deft_relu(a); break;
        case 2: { /* change size: repeat or shrink */
            int64_t target = sizes[rand_below(5)];
            t = target > na ? deft_concat((deft_tensor *[]){a, a}, 2, 0) : deft_slice(a, 0, 0, target, 1);
            t = deft_mul_scalar(t, 0.5);
            break;
        }
        default: t = na == nc ? deft_mul(a, c) : deft_exp(a); break;
        }
        pool[np++] = t;
    }
    for (int i = 1; i <= 16; i++) add_out(b, pool[np - i * (np / 17)]);
    add_out(b, pool[np - 1]);
    free(pool);
}

static int report(const char *name, bench_graph *b, int repeats) {
    deft_memory_report m;
    double times[16];
    if (deft_graph_error(b->g) != DEFT_OK) {
        fprintf(stderr, "bench_planner: building %s: %s\n", name, deft_graph_errmsg(b->g));
        return 1;
    }
    for (int r = 0; r < repeats; r++) {
        double t0 = now_ms();
        deft_status s = deft_plan_memory(b->g, b->outs, b->n_outs, NULL, &m);
        times[r] = now_ms() - t0;
        if (s != DEFT_OK) {
            fprintf(stderr, "bench_planner: planning %s: %s\n", name, deft_errmsg());
            return 1;
        }
    }
    for (int i = 1; i < repeats; i++)   /* insertion sort for the median */
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            double t = times[j];
            times[j] = times[j - 1];
            times[j - 1] = t;
        }
    printf("planner.%s.nodes %d count\n", name, deft_graph_node_count(b->g));
    printf("planner.%s.arena %zu bytes\n", name, m.arena_bytes);
    printf("planner.%s.lower_bound %zu bytes\n", name, m.lower_bound_bytes);
    printf("planner.%s.arena_over_bound %.4f x\n", name, (double)m.arena_bytes / (double)m.lower_bound_bytes);
    printf("planner.%s.no_reuse_over_arena %.2f x\n", name, (double)m.no_reuse_bytes / (double)m.arena_bytes);
    printf("planner.%s.plan_ms %.2f ms\n", name, times[repeats / 2]);
    deft_graph_free(b->g);
    return 0;
}

/* ---- schedule reordering, on step lists handed to the reordering directly (deft_testing_schedule_order) ---- */

typedef struct step_list {
    deft_testing_order_step *steps;
    int *deps;
    int n, n_deps;
} step_list;

static int add_step(step_list *l, size_t bytes, int keep_alive, int n_deps, const int *deps) {
    deft_testing_order_step *s = &l->steps[l->n];
    *s = (deft_testing_order_step){bytes, keep_alive, l->n_deps, l->n_deps + n_deps};
    for (int k = 0; k < n_deps; k++) l->deps[l->n_deps++] = deps[k];
    return l->n++;
}

/* The most bytes live at any position of `order`: an output lives from its step to its last reader, or to the end
 * when kept. */
static size_t peak_of(const step_list *l, const int *order) {
    int n = l->n, *pos = malloc((size_t)n * sizeof *pos), *end = malloc((size_t)n * sizeof *end);
    long long *delta = calloc((size_t)n + 1, sizeof *delta);
    for (int k = 0; k < n; k++) pos[order[k]] = k;
    for (int i = 0; i < n; i++) end[i] = l->steps[i].keep_alive ? n - 1 : pos[i];
    for (int i = 0; i < n; i++)
        for (int k = l->steps[i].dep_begin; k < l->steps[i].dep_end; k++)
            if (pos[i] > end[l->deps[k]]) end[l->deps[k]] = pos[i];
    for (int i = 0; i < n; i++) {
        delta[pos[i]] += (long long)l->steps[i].bytes;
        delta[end[i] + 1] -= (long long)l->steps[i].bytes;
    }
    long long live = 0, peak = 0;
    for (int k = 0; k < n; k++) {
        live += delta[k];
        if (live > peak) peak = live;
    }
    free(pos);
    free(end);
    free(delta);
    return (size_t)peak;
}

/* Multi-head attention written stage by stage, the way a batched formulation reads: the projections of every head,
 * then every head's scores, softmax and weighted values, then the concatenation and the output projection (kept).
 * Every head's seq x seq scores are live at once; head by head, one head's are. */
static void build_attention_stage_major(step_list *l, int heads, size_t seq, size_t model) {
    size_t f = sizeof(float), head_dim = model / (size_t)heads;
    int norm = add_step(l, seq * model * f, 0, 0, NULL), q[64], k[64], v[64], sc[64], p[64], o[64];
    for (int h = 0; h < heads; h++) q[h] = add_step(l, seq * head_dim * f, 0, 1, &norm);
    for (int h = 0; h < heads; h++) k[h] = add_step(l, seq * head_dim * f, 0, 1, &norm);
    for (int h = 0; h < heads; h++) v[h] = add_step(l, seq * head_dim * f, 0, 1, &norm);
    for (int h = 0; h < heads; h++) sc[h] = add_step(l, seq * seq * f, 0, 2, (int[]){q[h], k[h]});
    for (int h = 0; h < heads; h++) p[h] = add_step(l, seq * seq * f, 0, 1, &sc[h]);
    for (int h = 0; h < heads; h++) o[h] = add_step(l, seq * head_dim * f, 0, 2, (int[]){p[h], v[h]});
    int cat = add_step(l, seq * model * f, 0, heads, o);
    add_step(l, seq * model * f, 1, 1, &cat);
}

/* An ensemble of deep narrow MLPs (widths 64 to 1024, batch 32, one score per example at the end, kept) evaluated
 * layer by layer across the members: every member's current activation is live at once; member by member, one is. */
static void build_ensemble_layer_major(step_list *l, int members, int layers) {
    int *prev = malloc((size_t)members * sizeof *prev);
    for (int layer = 0; layer < layers; layer++)
        for (int m = 0; m < members; m++) {
            size_t width = layer == layers - 1 ? 1 : (size_t)64 << (m + layer) % 5;
            prev[m] = add_step(l, 32 * width * sizeof(float), layer == layers - 1, layer ? 1 : 0, &prev[m]);
        }
    free(prev);
}

static int report_reorder(const char *name, step_list *l, int repeats) {
    int *order = malloc((size_t)l->n * sizeof *order), *given = malloc((size_t)l->n * sizeof *given);
    double times[16];
    for (int i = 0; i < l->n; i++) given[i] = i;
    for (int r = 0; r < repeats; r++) {
        double t0 = now_ms();
        deft_status s = deft_testing_schedule_order(l->steps, l->n, l->deps, order);
        times[r] = now_ms() - t0;
        if (s != DEFT_OK) {
            fprintf(stderr, "bench_planner: reordering %s: %s\n", name, deft_errmsg());
            free(order);
            free(given);
            return 1;
        }
    }
    for (int i = 1; i < repeats; i++)
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            double t = times[j];
            times[j] = times[j - 1];
            times[j - 1] = t;
        }
    printf("planner.%s.steps %d count\n", name, l->n);
    printf("planner.%s.peak_in_order %zu bytes\n", name, peak_of(l, given));
    printf("planner.%s.peak_reordered %zu bytes\n", name, peak_of(l, order));
    printf("planner.%s.reorder_ms %.2f ms\n", name, times[repeats / 2]);
    free(order);
    free(given);
    return 0;
}

static int bench_reorder(void) {
    enum { MAX_STEPS = 100000 };
    step_list l = {malloc(MAX_STEPS * sizeof *l.steps), malloc(2 * MAX_STEPS * sizeof *l.deps), 0, 0};
    int fails = 0;
    if (!l.steps || !l.deps) {
        fprintf(stderr, "bench_planner: out of memory\n");
        fails = 1;
    } else {
        build_attention_stage_major(&l, 16, 512, 1024);
        fails += report_reorder("attention_stage_major", &l, 7);
        l.n = l.n_deps = 0;
        build_ensemble_layer_major(&l, 1000, 100);
        fails += report_reorder("ensemble_layer_major_100k", &l, 5);
    }
    free(l.steps);
    free(l.deps);
    return fails;
}

static const char help[] =
    "usage: bench_planner\n"
    "\n"
    "How close the memory planner's arena comes to the lower bound on graphs of several shapes, how long planning\n"
    "takes, and how much reordering lowers a schedule's peak. One figure per line: <name> <value> <unit>.\n"
    "It takes no options.\n"
    "\n"
    "  -h, --help    this help\n";

/* --help (or -h) answers on stdout; any other argument is bad usage. */
static void parse_args(int argc, char **argv) {
    if (argc < 2) return;
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(help, stdout);
        exit(0);
    }
    fprintf(stderr, "usage: bench_planner (no options; --help tells more)\n");
    exit(2);
}

int main(int argc, char **argv) {
    static bench_graph b;
    parse_args(argc, argv);
    int fails = 0;
    b = (bench_graph){.g = deft_graph_new()};
    build_mlp_step(&b, 4, 256, 1024, 784);
    fails += report("mlp_step", &b, 7);
    b = (bench_graph){.g = deft_graph_new()};
    build_mlp_step(&b, 64, 32, 64, 64);
    fails += report("deep_narrow", &b, 7);
    b = (bench_graph){.g = deft_graph_new()};
    build_branchy(&b, 12, 128, 512);
    fails += report("branchy_skip", &b, 7);
    b = (bench_graph){.g = deft_graph_new()};
    build_random_dag(&b, 1000);
    fails += report("random_dag_1k", &b, 7);
    b = (bench_graph){.g = deft_graph_new()};
    build_random_dag(&b, 100000);
    fails += report("random_dag_100k", &b, 5);
    fails += bench_reorder();
    return fails ? 1 : 0;
}
