/* cuBLAS and cuDNN scratch per stream (mem/cuda_workspace.cu): each program's stream holds what the algorithms
 * chosen for its steps asked for, never more than the caps (DEFT_CUBLAS_WORKSPACE_BYTES, DEFT_CUDNN_WORKSPACE_BYTES),
 * decided by the first (eager) run before the second captures the step; the program's reports (footprint and
 * memory report) say so once it has run, and the caps before. A plain cuBLAS call (an f64 product) asks for cuBLAS's
 * recommendation. The values are those of the CPU backend; freeing a program gives its scratch back. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft_testing.h"

#define GPU deft_cuda(0)

/* A product ([64, 256] x [256, 128]) and a convolution (8 x 16 x 32 x 32 by 32 3 x 3 filters, padded), in `dt`. */
enum { M = 64, K = 256, N = 128, B = 8, C = 16, HW = 32, O = 32, KS = 3 };
#define X_NUMEL ((size_t)M * K)
#define W_NUMEL ((size_t)K * N)
#define I_NUMEL ((size_t)B * C * HW * HW)
#define F_NUMEL ((size_t)O * C * KS * KS)
#define Y_NUMEL ((size_t)M * N)
#define Z_NUMEL ((size_t)B * O * HW * HW)

typedef struct net {
    deft_graph *g;
    deft_tensor *x, *w, *img, *filt, *y, *z;
    deft_program *p;
} net;

static float host_x[X_NUMEL], host_w[W_NUMEL], host_img[I_NUMEL], host_filt[F_NUMEL];

static void fill(float *v, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
}

/* f64 products take the plain cuBLAS path; the convolution is left out then (conv is not the point of that one). */
static int net_build(net *n, deft_device dev, deft_dtype dt, int with_conv) {
    memset(n, 0, sizeof *n);
    n->g = deft_graph_new();
    n->x = deft_input(n->g, "x", dt, 2, (int64_t[]){M, K}, dev);
    n->w = deft_input(n->g, "w", dt, 2, (int64_t[]){K, N}, dev);
    n->y = deft_matmul(n->x, n->w);
    deft_tensor *outs[2] = {n->y, NULL};
    if (with_conv) {
        n->img = deft_input(n->g, "img", dt, 4, (int64_t[]){B, C, HW, HW}, dev);
        n->filt = deft_input(n->g, "filt", dt, 4, (int64_t[]){O, C, KS, KS}, dev);
        n->z = outs[1] = deft_conv2d(n->img, n->filt, NULL, &(deft_conv2d_options){.padding = {1, 1}});
    }
    n->p = deft_compile(n->g, outs, with_conv ? 2 : 1, NULL);
    CHECK_MSG(n->p != NULL, "compile: %s", deft_errmsg());
    return n->p != NULL;
}

static void net_free(net *n) {
    deft_program_free(n->p);
    deft_graph_free(n->g);
}

static void feed_f32(net *n) {
    CHECK_OK(deft_program_feed(n->p, n->x, host_x, sizeof host_x));
    CHECK_OK(deft_program_feed(n->p, n->w, host_w, sizeof host_w));
    if (n->img) CHECK_OK(deft_program_feed(n->p, n->img, host_img, sizeof host_img));
    if (n->filt) CHECK_OK(deft_program_feed(n->p, n->filt, host_filt, sizeof host_filt));
}

static size_t footprint_workspace(deft_program *p) {
    deft_device_footprint fp[2];
    int n = 0;
    CHECK_OK(deft_program_footprint(p, fp, 2, &n));
    CHECK(n == 1);
    return n == 1 ? fp[0].workspace_bytes : 0;
}

static size_t report_workspace(deft_program *p) {
    deft_memory_report r;
    CHECK_OK(deft_program_memory(p, &r));
    return r.workspace_bytes;
}

static int64_t requested_now(void) {
    deft_memory_stats st;
    CHECK_OK(deft_memory_stats_get(GPU, &st));
    return st.requested_bytes.current;
}

/* got against want, each element within a relative tolerance of the larger of |want| and 1. */
static void check_close(const char *what, const float *got, const float *want, size_t n, float tol) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const float scale = fabsf(want[i]) > 1.0f ? fabsf(want[i]) : 1.0f;
        if (!(fabsf(got[i] - want[i]) <= tol * scale) && bad++ == 0) first = i;
    }
    CHECK_MSG(bad == 0, "%s: %zu of %zu values off; first [%zu] %g, expected %g", what, bad, n, first,
              bad ? got[first] : 0.0, bad ? want[first] : 0.0);
}

/* Before its first run a program reports each scratch it may use at its cap; after, exactly what its stream holds,
 * which is what the chosen algorithms asked for, within the caps; the capture and the replays change nothing. The
 * values are the CPU's. */
static void test_sized_to_choice(void) {
    static float want_y[Y_NUMEL], want_z[Z_NUMEL], got_y[Y_NUMEL], got_z[Z_NUMEL];
    net cpu, gpu;
    if (!net_build(&cpu, deft_cpu(), DEFT_F32, 1)) return;
    feed_f32(&cpu);
    CHECK_OK(deft_program_run(cpu.p));
    CHECK_OK(deft_program_read(cpu.p, cpu.y, want_y, sizeof want_y));
    CHECK_OK(deft_program_read(cpu.p, cpu.z, want_z, sizeof want_z));
    CHECK(footprint_workspace(cpu.p) == 0 && report_workspace(cpu.p) == 0);
    net_free(&cpu);

    if (!net_build(&gpu, GPU, DEFT_F32, 1)) return;
    const size_t caps = DEFT_CUBLAS_WORKSPACE_BYTES + DEFT_CUDNN_WORKSPACE_BYTES;
    CHECK_MSG(footprint_workspace(gpu.p) == caps && report_workspace(gpu.p) == caps,
              "before the first run: footprint %zu, report %zu, expected the caps %zu", footprint_workspace(gpu.p),
              report_workspace(gpu.p), caps);
    CHECK(deft_testing_program_workspace(gpu.p, 0, 0) == 0);   /* nothing taken before a run */
    feed_f32(&gpu);
    const int64_t before = requested_now();
    CHECK_OK(deft_program_run(gpu.p));
    const int64_t grown = requested_now() - before;
    const size_t held = deft_testing_program_workspace(gpu.p, 0, 0);
    const size_t asked = deft_testing_program_workspace(gpu.p, 0, 1);
    printf("after the first run: scratch %zu bytes held, %zu asked for (caps %zu)\n", held, asked, caps);
    CHECK_MSG(held == asked && held <= caps, "held %zu, asked %zu, caps %zu", held, asked, caps);
    CHECK_MSG(footprint_workspace(gpu.p) == held && report_workspace(gpu.p) == held,
              "after the first run: footprint %zu, report %zu, held %zu", footprint_workspace(gpu.p),
              report_workspace(gpu.p), held);
    CHECK_MSG(grown >= (int64_t)held, "the first run took %lld bytes from the allocator, less than its %zu of scratch",
              (long long)grown, held);
    for (int run = 1; run < 4; run++) CHECK_OK(deft_program_run(gpu.p));   /* a capture, then replays */
    CHECK_MSG(deft_program_graph_replays(gpu.p) >= 2, "replays %lld: %s",
              (long long)deft_program_graph_replays(gpu.p), deft_program_graph_status(gpu.p));
    CHECK_MSG(deft_testing_program_workspace(gpu.p, 0, 0) == held && footprint_workspace(gpu.p) == held,
              "the scratch changed after the first run: %zu, then %zu", held,
              deft_testing_program_workspace(gpu.p, 0, 0));
    CHECK_OK(deft_program_read(gpu.p, gpu.y, got_y, sizeof got_y));
    CHECK_OK(deft_program_read(gpu.p, gpu.z, got_z, sizeof got_z));
    check_close("product", got_y, want_y, Y_NUMEL, 1e-4f);
    check_close("convolution", got_z, want_z, Z_NUMEL, 1e-4f);

    const int64_t with = requested_now();
    net_free(&gpu);
    CHECK_MSG(with - requested_now() >= (int64_t)held, "freeing the program gave back %lld bytes, less than its %zu",
              (long long)(with - requested_now()), held);
}

/* An f64 product runs through cublasGemmEx, which asks for cuBLAS's recommendation for the card: the stream holds
 * exactly that (it is below the cap), so the report is nonzero; the values are the CPU's. */
static void test_plain_cublas_floor(void) {
    static double x[X_NUMEL], w[W_NUMEL], want[Y_NUMEL], got[Y_NUMEL];
    for (size_t i = 0; i < X_NUMEL; i++) x[i] = host_x[i];
    for (size_t i = 0; i < W_NUMEL; i++) w[i] = host_w[i];
    net cpu, gpu;
    if (!net_build(&cpu, deft_cpu(), DEFT_F64, 0)) return;
    CHECK_OK(deft_program_feed(cpu.p, cpu.x, x, sizeof x));
    CHECK_OK(deft_program_feed(cpu.p, cpu.w, w, sizeof w));
    CHECK_OK(deft_program_run(cpu.p));
    CHECK_OK(deft_program_read(cpu.p, cpu.y, want, sizeof want));
    net_free(&cpu);

    if (!net_build(&gpu, GPU, DEFT_F64, 0)) return;
    CHECK_OK(deft_program_feed(gpu.p, gpu.x, x, sizeof x));
    CHECK_OK(deft_program_feed(gpu.p, gpu.w, w, sizeof w));
    for (int run = 0; run < 3; run++) CHECK_OK(deft_program_run(gpu.p));
    const size_t rec = deft_testing_cublas_floor(0), ws = footprint_workspace(gpu.p);
    CHECK_MSG(rec == ((size_t)4 << 20) || rec == ((size_t)32 << 20), "cuBLAS's recommendation %zu", rec);
    CHECK_MSG(ws > 0 && ws == rec && ws <= DEFT_CUBLAS_WORKSPACE_BYTES && report_workspace(gpu.p) == ws &&
                  deft_testing_program_workspace(gpu.p, 0, 1) == ws,
              "f64 product: workspace %zu (report %zu, asked %zu), cuBLAS's recommendation %zu", ws,
              report_workspace(gpu.p), deft_testing_program_workspace(gpu.p, 0, 1), rec);
    CHECK_OK(deft_program_read(gpu.p, gpu.y, got, sizeof got));
    size_t bad = 0;
    for (size_t i = 0; i < Y_NUMEL; i++) bad += !(fabs(got[i] - want[i]) <= 1e-12 * (fabs(want[i]) + 1.0));
    CHECK_MSG(bad == 0, "f64 product: %zu of %d values differ from the CPU's", bad, (int)Y_NUMEL);
    net_free(&gpu);
}

/* Two programs, a stream each: each holds its own scratch, and freeing one leaves the other's intact. */
static void test_scratch_per_stream(void) {
    static float before[Y_NUMEL], after[Y_NUMEL];
    net a, b;
    if (!net_build(&a, GPU, DEFT_F32, 1)) return;
    if (!net_build(&b, GPU, DEFT_F32, 1)) {
        net_free(&a);
        return;
    }
    feed_f32(&a);
    feed_f32(&b);
    CHECK_OK(deft_program_run(a.p));
    CHECK_OK(deft_program_run(b.p));
    CHECK_OK(deft_program_read(a.p, a.y, before, sizeof before));
    /* The same problems: the same choices, so the same scratch (each program's own). */
    CHECK_MSG(footprint_workspace(a.p) == footprint_workspace(b.p), "scratch %zu and %zu for the same step",
              footprint_workspace(a.p), footprint_workspace(b.p));
    net_free(&b);
    for (int run = 0; run < 3; run++) CHECK_OK(deft_program_run(a.p));
    CHECK_OK(deft_program_read(a.p, a.y, after, sizeof after));
    CHECK(memcmp(before, after, sizeof before) == 0);
    net_free(&a);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    fill(host_x, X_NUMEL, 1);
    fill(host_w, W_NUMEL, 2);
    fill(host_img, I_NUMEL, 3);
    fill(host_filt, F_NUMEL, 4);
    test_sized_to_choice();
    test_plain_cublas_floor();
    test_scratch_per_stream();
    return deft_check_finish();
}
