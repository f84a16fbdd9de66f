/* bench_attention: causal scaled dot-product attention over [B, H, T, D] (GPT-2 124M's by default: B 16, H 12,
 * T 1024, D 64, bf16), forward alone and forward with backward, on each of deft's GPU attention kernels: the plain
 * ones (CUDA cores), deft's tensor-core ones and cuDNN's fused attention (debug knob ATTENTION_KERNEL 1, 2, 3; a
 * kernel that refuses the shape falls back to the plain ones). bench/peers/attention.py times
 * PyTorch's fused back ends on the same shape (FlashAttention-2, cuDNN's, the memory-efficient one) and prints the
 * same names with torch_ in place of deft_; issue 28 chooses deft's default by these figures.
 *
 * Each figure is a compiled program replayed as a CUDA Graph: forward, q k v (bf16 parameters, hashed values) to
 * the output; forward with backward, loss = sum(out * r) (r a hashed constant: the output's gradient; summed over D
 * first, then the rest) and the three gradients, so it also runs a product, two sums and their gradients that
 * PyTorch's autograd.grad(out, (q, k, v), r) does not (tens of microseconds). Timing: 2 warm-up runs, 3 to choose N so that N runs take about 0.2 s, then 7
 * repeats of a host clock around N runs and one read of a single element (the read waits for the device); the median
 * per run. TFLOP/s counts the causal products only: forward 2 B H T^2 D (two products of B H T^2 D / 2 multiply-adds),
 * backward 2.5 x that, FlashAttention's convention. Without a GPU it says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deft.h"
#include "deft_testing.h"

#define BENCH_NAME "bench_attention"
#include "bench_util.h"

#define REPEATS 7
#define TARGET_REPEAT_S 0.2

static const char help[] =
    "usage: bench_attention [--batch B] [--heads H] [--seq T] [--head-dim D] [--dtype bf16|f16] [--kernels LIST]\n"
    "\n"
    "Causal attention forward and forward+backward on each of deft's GPU attention kernels. One figure per line:\n"
    "<name> <value> <unit>. Without a GPU it says so.\n"
    "\n"
    "  --batch B        sequences (default: 16)\n"
    "  --heads H        heads (default: 12)\n"
    "  --seq T          sequence length (default: 1024)\n"
    "  --head-dim D     head size (default: 64)\n"
    "  --dtype bf16|f16 storage (default: bf16)\n"
    "  --kernels LIST   comma-separated of plain, mma, cudnn (default: all three)\n"
    "  -h, --help       this help\n";

typedef struct options {
    int64_t b, h, t, d;
    deft_dtype dt;
    int kernels[3];   /* plain, mma, cudnn: whether to run it */
} options;

static const char *const kernel_names[3] = {"plain", "mma", "cudnn"};

static void usage(void) {
    fprintf(stderr, "%s", help);
    exit(2);
}

static int64_t parse_positive(const char *v) {
    char *end = NULL;
    const long long x = strtoll(v, &end, 10);
    if (!end || *end || x < 1 || x > (1 << 20)) usage();
    return x;
}

static void parse_kernels(options *o, const char *list) {
    memset(o->kernels, 0, sizeof o->kernels);
    char buf[64];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int k = 0; k < 3; k++)
            if (!strcmp(w, kernel_names[k])) o->kernels[k] = found = 1;
        if (!found) usage();
    }
}

static void parse(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage();
        const char *a = argv[i], *v = argv[++i];
        if (!strcmp(a, "--batch")) o->b = parse_positive(v);
        else if (!strcmp(a, "--heads")) o->h = parse_positive(v);
        else if (!strcmp(a, "--seq")) o->t = parse_positive(v);
        else if (!strcmp(a, "--head-dim")) o->d = parse_positive(v);
        else if (!strcmp(a, "--dtype") && (!strcmp(v, "bf16") || !strcmp(v, "f16")))
            o->dt = !strcmp(v, "bf16") ? DEFT_BF16 : DEFT_F16;
        else if (!strcmp(a, "--kernels")) parse_kernels(o, v);
        else usage();
    }
}

/* A [B, H, T, D] tensor's host values from hash stream `stream`, stored in dt. */
static void *hashed(const options *o, uint64_t stream, double scale) {
    const int64_t n = o->b * o->h * o->t * o->d;
    uint16_t *v = xmalloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        const float f = hash_uniform(stream, (uint64_t)i, scale);
        v[i] = o->dt == DEFT_BF16 ? deft_f32_to_bf16(f) : deft_f32_to_f16(f);
    }
    return v;
}

typedef struct timed {
    deft_program *p;
    const deft_tensor *probe;   /* one element to read: the read waits for the device */
} timed;

static void run_n(const timed *t, int n) {
    for (int i = 0; i < n; i++) CHECK(deft_program_run(t->p));
    float probe[2];
    CHECK(deft_program_read(t->p, t->probe, probe, deft_dtype_size(deft_tensor_dtype(t->probe))));
}

/* Median seconds per run over REPEATS repeats. */
static double time_runs(const timed *t) {
    run_n(t, 2);
    double t0 = seconds();
    run_n(t, 3);
    const double per = (seconds() - t0) / 3;
    const int n = per > 0 ? (int)fmax(1.0, fmin(1000.0, TARGET_REPEAT_S / per)) : 1000;
    double r[REPEATS];
    for (int i = 0; i < REPEATS; i++) {
        t0 = seconds();
        run_n(t, n);
        r[i] = (seconds() - t0) / n;
    }
    sort_times(r, REPEATS);
    return r[REPEATS / 2];
}

static deft_tensor *param(deft_graph *g, const char *name, const options *o, uint64_t stream) {
    const int64_t shape[4] = {o->b, o->h, o->t, o->d};
    deft_tensor *p = deft_param(g, name, o->dt, 4, shape, deft_cuda(0), DEFT_INIT_ZEROS);
    if (!p) die("deft_param");
    void *v = hashed(o, stream, 1.0);
    CHECK(deft_param_set(p, v, (size_t)(o->b * o->h * o->t * o->d) * 2));
    free(v);
    return p;
}

/* Seconds per run of the forward (backward 0) or the forward with backward (1). */
static double bench_one(const options *o, int backward) {
    deft_graph *g = deft_graph_new();
    deft_tensor *q = param(g, "q", o, 1), *k = param(g, "k", o, 2), *v = param(g, "v", o, 3);
    const deft_attention_options ao = {.causal = 1};
    deft_tensor *out = deft_attention(q, k, v, &ao);
    deft_tensor *outs[4];
    int n_outs;
    if (backward) {
        const int64_t shape[4] = {o->b, o->h, o->t, o->d};
        void *r = hashed(o, 4, 1.0);
        deft_tensor *rt = deft_constant(g, o->dt, 4, shape, deft_cuda(0), r, (size_t)(o->b * o->h * o->t * o->d) * 2);
        free(r);
        const int last = 3;   /* rows first: a scalar sum of many elements would be one long row */
        deft_tensor *loss = deft_sum(deft_sum(deft_mul(out, rt), 1, &last, 0), 0, NULL, 0);
        if (!loss) die("building the loss");
        CHECK(deft_backward(loss));
        outs[0] = loss, outs[1] = deft_grad(q), outs[2] = deft_grad(k), outs[3] = deft_grad(v);
        n_outs = 4;
    } else {
        const int64_t flat = o->b * o->h * o->t * o->d;
        outs[0] = out;
        outs[1] = deft_slice(deft_reshape(out, 1, &flat), 0, 0, 1, 1);
        n_outs = 2;
    }
    if (!outs[1]) die("building the graph");
    deft_program *p = deft_compile(g, outs, n_outs, NULL);
    if (!p) die("deft_compile");
    const timed t = {p, backward ? outs[0] : outs[1]};
    const double s = time_runs(&t);
    deft_program_free(p);
    deft_graph_free(g);
    return s;
}

int main(int argc, char **argv) {
    bench_help(argc, argv, help);
    options o = {16, 12, 1024, 64, DEFT_BF16, {1, 1, 1}};
    parse(argc, argv, &o);
    if (deft_cuda_device_count() < 1) {
        printf("%s: skipped: no usable CUDA device\n", prog);
        return 0;
    }
    char key[96];
    snprintf(key, sizeof key, "b%lld_h%lld_t%lld_d%lld_%s", (long long)o.b, (long long)o.h, (long long)o.t,
             (long long)o.d, deft_dtype_name(o.dt));
    const double fwd_flops = 2.0 * (double)o.b * (double)o.h * (double)o.t * (double)o.t * (double)o.d;
    for (int k = 0; k < 3; k++) {
        if (!o.kernels[k]) continue;
        CHECK(deft_testing_set_debug("ATTENTION_KERNEL", k + 1));
        for (int bwd = 0; bwd < 2; bwd++) {
            const double s = bench_one(&o, bwd), flops = bwd ? 3.5 * fwd_flops : fwd_flops;
            const char *what = bwd ? "fwdbwd" : "fwd";
            printf("attention.%s.deft_%s_%s_us %.1f us\n", key, kernel_names[k], what, s * 1e6);
            printf("attention.%s.deft_%s_%s_tflops %.1f TFLOP/s\n", key, kernel_names[k], what, flops / s / 1e12);
            fflush(stdout);
        }
    }
    CHECK(deft_testing_set_debug("ATTENTION_KERNEL", 0));
    deft_memory_release_all();
    return 0;
}
