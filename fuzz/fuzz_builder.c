/* libFuzzer target: the builder API driven by bytes. Each input is a program of builder calls (leaves, elementwise,
 * products, shape ops, reductions, losses, layers, convolutions, pooling, batch norm, gathers, attention, backward,
 * optimizers) with
 * shapes, dtypes, devices and options from the bytes, odd values now and then (negative, zero, huge dimensions,
 * invalid dtypes and enums, NaN scalars, NULL operands); then deft_plan_memory, deft_compile with options from the
 * bytes (a small memory budget among them) and, when it compiles, two runs on the CPU under a 64 MiB device limit,
 * with every input fed and every output read. Every call must end in a status or a NULL with a message, never a
 * crash, a sanitizer report or a leak; the graph is freed at the end.
 * Seeds (--write-seeds DIR): a few hand-made byte programs (an MLP step, a conv net, shape ops), written here. */
#include "fuzz_common.h"

#include <math.h>

#define MAX_T 24
#define MAX_IO 8
#define MAX_COUNT 1000   /* the largest count small() gives (concat's n, a reduction's naxes) */
#define FEED_CAP ((size_t)1 << 20)   /* inputs and outputs larger than this are not fed or read */

typedef struct fuzz_state {
    const uint8_t *p;
    size_t n, at;
    deft_compile_options opts;   /* from the input's first bytes */
    unsigned fill_seed, free_program;
    deft_graph *g;
    deft_tensor *t[MAX_T];
    int nt;
    deft_tensor *inputs[MAX_IO], *steps[MAX_IO];
    int n_inputs, n_steps, names;
} fuzz_state;

static unsigned u8(fuzz_state *s) { return s->at < s->n ? s->p[s->at++] : 0; }

/* Mostly 1..4 (byte 0 is 1); one byte in eight an odd value. */
static int64_t dim(fuzz_state *s) {
    static const int64_t odd[16] = {0, 5, -1, -7, 64, 1000, 1 << 20, INT64_C(1) << 31, INT64_C(1) << 40, INT64_MAX,
                                    INT64_MIN, 7, 8, 16, 33, 255};
    unsigned b = u8(s);
    return b < 224 ? (int64_t)(b % 4) + 1 : odd[b & 15];
}

static int small(fuzz_state *s) {   /* an axis or a count: -2..5, now and then far out */
    unsigned b = u8(s);
    return b < 240 ? (int)(b % 8) - 2 : (b & 1 ? 1000 : -1000);
}

static double scalar(fuzz_state *s) {
    static const double v[12] = {0, 1, -1, 0.5, 2, 1e-3, 3.5, NAN, INFINITY, -INFINITY, 1e300, -1e-300};
    return v[u8(s) % 12];
}

static deft_dtype dtype(fuzz_state *s) {
    unsigned b = u8(s) % 16;
    if (b < 9 || b == 15) return DEFT_F32;
    static const int other[6] = {DEFT_F64, DEFT_F16, DEFT_BF16, DEFT_I32, DEFT_DTYPE_COUNT, -1};
    return (deft_dtype)other[b - 9];
}

static deft_device device(fuzz_state *s) {
    unsigned b = u8(s);
    if (b < 240) return deft_cpu();
    if (b < 248) return deft_cuda((int)(b & 3));
    return (deft_device){(deft_device_type)(b & 7), (int)(b & 1) - 1};
}

/* ndim 0..4, or now and then 8, 9 (more than deft takes) or -1; dims has room for 9. */
static int shape(fuzz_state *s, int64_t *dims) {
    unsigned b = u8(s);
    int nd = (int)(b % 6);
    if (nd == 5) nd = b & 0x80 ? DEFT_MAX_DIMS + 1 : b & 0x40 ? -1 : DEFT_MAX_DIMS;
    for (int i = 0; i < nd; i++) dims[i] = dim(s);
    return nd;
}

static const char *deft_fuzz_shape(int nd, const int64_t *dims, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < nd && used < n; i++) used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld",
                                                                     (long long)dims[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

static deft_tensor *pick(fuzz_state *s) {
    unsigned b = u8(s);
    deft_tensor *t = s->nt == 0 || b == 255 ? NULL : s->t[b % (unsigned)s->nt];
    return t;
}

/* DEFT_FUZZ_TRACE=1 prints each builder's result: to see what an input (a seed, a crash) builds. */
static int trace;

static void push(fuzz_state *s, deft_tensor *x) {
    if (trace) {
        char sh[128];
        if (x) {
            int64_t dims[DEFT_MAX_DIMS];
            for (int i = 0; i < deft_tensor_ndim(x); i++) dims[i] = deft_tensor_dim(x, i);
            fprintf(stderr, "  %s %s %s\n", deft_tensor_name(x), deft_dtype_name(deft_tensor_dtype(x)),
                    deft_fuzz_shape(deft_tensor_ndim(x), dims, sh, sizeof sh));
        } else {
            fprintf(stderr, "  NULL: %s\n", deft_errmsg());
        }
    }
    if (!x) {
        /* A builder that fails says why, NULL operands included (ir/build_check.c names the operand). */
        FUZZ_ASSERT(deft_errmsg()[0] != '\0');
        return;
    }
    if (s->nt < MAX_T) s->t[s->nt++] = x;
    else s->t[u8(s) % MAX_T] = x;
}

/* A fresh name, or now and then a repeated, empty, NULL or over-long one. */
static const char *name(fuzz_state *s, char *buf, size_t n) {
    unsigned b = u8(s);
    if (b == 250) return NULL;
    if (b == 251) return "";
    if (b == 252) return "p0";
    if (b == 253) {
        memset(buf, 'x', n - 1);
        buf[n - 1] = '\0';
        return buf;
    }
    snprintf(buf, n, "p%d", s->names++);
    return buf;
}

/* Options read field by field (an initializer list's order of evaluation is unspecified); byte 0 is a field's
 * default or smallest value. */
static int64_t dim0(fuzz_state *s) {
    const int64_t v = dim(s);
    return v == INT64_MIN ? v : v - 1;
}

static deft_conv2d_options conv_options(fuzz_state *s) {
    deft_conv2d_options o;
    for (int i = 0; i < 2; i++) o.stride[i] = dim0(s);
    for (int i = 0; i < 2; i++) o.padding[i] = dim0(s);
    for (int i = 0; i < 2; i++) o.dilation[i] = dim0(s);
    o.groups = dim0(s);
    o.layout = (deft_layout)(u8(s) % 3);
    return o;
}

static deft_pool2d_options pool_options(fuzz_state *s) {
    deft_pool2d_options o;
    for (int i = 0; i < 2; i++) o.kernel[i] = dim(s);
    for (int i = 0; i < 2; i++) o.stride[i] = dim0(s);
    for (int i = 0; i < 2; i++) o.padding[i] = dim0(s);
    o.exclude_pad = (int)(u8(s) & 1);
    o.layout = (deft_layout)(u8(s) % 3);
    return o;
}

static void op_leaf(fuzz_state *s, unsigned op) {
    int64_t dims[DEFT_MAX_DIMS + 1];
    char nb[96];
    deft_dtype dt = dtype(s);
    int nd = shape(s, dims);
    deft_device dev = device(s);
    deft_tensor *x = NULL;
    switch (op % 6) {
    case 0:
        x = deft_input(s->g, name(s, nb, sizeof nb), dt, nd, dims, dev);
        if (x && s->n_inputs < MAX_IO) s->inputs[s->n_inputs++] = x;
        break;
    case 1: {
        const char *nm = name(s, nb, sizeof nb);
        x = deft_param(s->g, nm, dt, nd, dims, dev, (deft_init)(u8(s) % 8));
        break;
    }
    case 2: {
        const unsigned which = u8(s);
        const double v = scalar(s);
        x = which & 1 ? deft_zeros(s->g, dt, nd, dims, dev) : deft_full(s->g, dt, nd, dims, dev, v);
        break;
    }
    case 3: {
        const double start = scalar(s), stop = scalar(s) * 4, step = scalar(s);
        x = deft_arange(s->g, dt, start, stop, step, dev);
        break;
    }
    case 4: {
        const unsigned which = u8(s), seed = u8(s);
        const double a = scalar(s), b = scalar(s);
        x = which & 1 ? deft_normal(s->g, dt, nd, dims, dev, a, b, seed)
                      : deft_uniform(s->g, dt, nd, dims, dev, a, b, seed);
        break;
    }
    case 5: {
        static const unsigned char data[4096];
        const size_t bytes = (size_t)u8(s) * 4;   /* right for small f32 shapes, wrong for most others */
        x = deft_constant(s->g, dt, nd, dims, dev, u8(s) == 255 ? NULL : data, bytes);
        break;
    }
    }
    push(s, x);
}

static void op_elementwise(fuzz_state *s, unsigned op) {
    deft_tensor *a = pick(s), *x = NULL;
    switch (op % 4) {
    case 0: {
        deft_tensor *(*const f[8])(deft_tensor *, deft_tensor *) = {deft_add, deft_sub,     deft_mul, deft_div,
                                                                   deft_maximum, deft_eq, deft_gt, deft_ge};
        const unsigned which = u8(s);
        x = f[which % 8](a, pick(s));
        break;
    }
    case 1: {
        deft_tensor *(*const f[9])(deft_tensor *, double) = {deft_add_scalar,  deft_sub_scalar, deft_rsub_scalar,
                                                            deft_mul_scalar,  deft_div_scalar, deft_rdiv_scalar,
                                                            deft_maximum_scalar, deft_pow_scalar, deft_add_scalar};
        const unsigned which = u8(s);
        x = f[which % 9](a, scalar(s));
        break;
    }
    case 2: {
        deft_tensor *(*const f[11])(deft_tensor *) = {deft_neg,  deft_exp,     deft_log,  deft_sqrt, deft_rsqrt,
                                                      deft_tanh, deft_sigmoid, deft_relu, deft_gelu, deft_silu,
                                                      deft_gelu_tanh};
        x = f[u8(s) % 11](a);
        break;
    }
    case 3: {
        const unsigned which = u8(s);
        const deft_device dev = device(s);
        x = which & 1 ? deft_to(a, dev, dtype(s)) : deft_cast(a, dtype(s));
        break;
    }
    }
    push(s, x);
}

static void op_shape(fuzz_state *s, unsigned op) {
    deft_tensor *a = pick(s), *x = NULL;
    int64_t dims[DEFT_MAX_DIMS + 1];
    switch (op % 6) {
    case 0: {
        deft_tensor *b = pick(s);
        const unsigned flags = u8(s);
        x = flags & 4 ? deft_matmul_t(a, b, (int)(flags & 1), (int)((flags >> 1) & 1)) : deft_matmul(a, b);
        break;
    }
    case 1: {
        const int nd = shape(s, dims);
        x = u8(s) & 1 ? deft_view(a, nd, dims) : deft_reshape(a, nd, dims);
        break;
    }
    case 2: {
        int perm[DEFT_MAX_DIMS];
        for (int i = 0; i < DEFT_MAX_DIMS; i++) perm[i] = small(s);
        const int a0 = small(s), a1 = small(s);
        x = u8(s) & 1 ? deft_transpose(a, a0, a1) : deft_permute(a, perm);
        break;
    }
    case 3: {
        const int axis = small(s);
        const int64_t v = dim0(s), start = v == INT64_MIN ? v : v - 1, end = dim(s), step = dim(s);
        x = deft_slice(a, axis, start, end, step);
        break;
    }
    case 4: {
        /* n may be 1000: the array holds as many as any n passed (the API reads n of them), four picks repeated. */
        static deft_tensor *ts[MAX_COUNT];
        ts[0] = a;
        for (int i = 1; i < 4; i++) ts[i] = pick(s);
        for (int i = 4; i < MAX_COUNT; i++) ts[i] = ts[i % 4];
        const int n = small(s), axis = small(s);
        x = deft_concat(ts, n, axis);
        break;
    }
    case 5: {
        static int axes[MAX_COUNT];
        const int naxes = small(s);
        for (int i = 0; i < DEFT_MAX_DIMS + 1; i++) axes[i] = small(s);
        for (int i = DEFT_MAX_DIMS + 1; i < MAX_COUNT; i++) axes[i] = axes[i % (DEFT_MAX_DIMS + 1)];
        const unsigned which = u8(s) % 5, keep = u8(s) & 1;
        if (which == 0) x = deft_sum(a, naxes, axes, (int)keep);
        else if (which == 1) x = deft_mean(a, naxes, axes, (int)keep);
        else if (which == 2) x = deft_max(a, naxes, axes, (int)keep);
        else x = which == 3 ? deft_softmax(a, axes[0]) : deft_log_softmax(a, axes[0]);
        break;
    }
    }
    push(s, x);
}

/* The transformer's ops: gathers, selection, attention, cross-entropy with options. */
static void op_transformer(fuzz_state *s, unsigned op) {
    deft_tensor *a = pick(s), *x = NULL;
    const unsigned which = u8(s);
    switch (op % 6) {
    case 0: x = deft_embedding(a, pick(s)); break;
    case 1: x = deft_index_select(a, (int)(int8_t)u8(s), pick(s)); break;
    case 2: {
        deft_tensor *b = pick(s);
        x = deft_where(a, b, pick(s));
        break;
    }
    case 3: x = deft_masked_fill(a, pick(s), scalar(s)); break;
    case 4: {
        const deft_attention_options o = {.causal = (int)(which & 1), .scale = which & 2 ? scalar(s) : 0};
        if (which & 8) {   /* q, k, v packed in a's last dim: heads from the byte's top bits, 0 and 1 included */
            x = deft_attention_packed(a, (int)(which >> 4) - 1, which & 4 ? &o : NULL);
            break;
        }
        deft_tensor *k = pick(s);
        x = deft_attention(a, k, pick(s), which & 4 ? &o : NULL);
        break;
    }
    case 5: {
        deft_cross_entropy_options o = deft_cross_entropy_defaults();
        o.use_ignore_index = (int)(which & 1);
        o.ignore_index = (int32_t)(int8_t)u8(s);
        o.label_smoothing = which & 2 ? scalar(s) : 0;
        o.reduction = (deft_reduction)((which >> 2) % 3);
        x = deft_cross_entropy_ex(a, pick(s), which & 0x10 ? NULL : &o);
        break;
    }
    }
    push(s, x);
}

/* Calls 0-7 are the layers; 8-13 the transformer's ops (added after the seeds, whose calls stay below 8). */
static void op_layer(fuzz_state *s, unsigned op) {
    if (op % 14 >= 8) {
        op_transformer(s, op % 14 - 8);
        return;
    }
    deft_tensor *a = pick(s), *x = NULL;
    char nb[96];
    const unsigned which = u8(s);
    switch (op % 14) {
    case 0: x = which & 1 ? deft_cross_entropy(a, pick(s)) : deft_mse_loss(a, pick(s)); break;
    case 1: x = deft_dropout(a, scalar(s), which); break;
    case 2: {
        deft_tensor *w = pick(s), *b = pick(s);
        x = deft_layer_norm(a, w, b, scalar(s));
        break;
    }
    case 3: {
        deft_linear_options o = {(deft_init)(which % 8), (int)((which >> 3) & 1), (int)((which >> 4) & 1)};
        const int64_t out = dim(s);
        x = deft_linear(a, out, name(s, nb, sizeof nb), which & 0x20 ? &o : NULL);
        break;
    }
    case 4: {
        const deft_conv2d_options o = conv_options(s);
        if (which & 1) {
            deft_tensor *w = pick(s), *b = pick(s);
            x = deft_conv2d(a, w, b, which & 2 ? &o : NULL);
        } else {
            const int64_t out = dim(s), kh = dim(s), kw = dim(s);
            x = deft_conv2d_layer(a, out, kh, kw, name(s, nb, sizeof nb), &o, (int)((which >> 1) & 1));
        }
        break;
    }
    case 5: {
        const deft_pool2d_options o = pool_options(s);
        if (which % 3 == 2) {
            const int64_t oh = dim(s), ow = dim(s);
            x = deft_adaptive_avg_pool2d(a, oh, ow, o.layout);
        } else {
            x = which % 3 ? deft_avg_pool2d(a, &o) : deft_max_pool2d(a, &o);
        }
        break;
    }
    case 6: {
        deft_batch_norm_options o = deft_batch_norm_defaults();
        o.eval = (int)(which & 1);
        if (which & 2) o.momentum = scalar(s), o.eps = scalar(s);
        o.layout = (deft_layout)((which >> 2) % 3);
        if (which & 0x10) {
            deft_tensor *w = pick(s), *b = pick(s), *rm = pick(s), *rv = pick(s);
            x = deft_batch_norm(a, w, b, rm, rv, &o);
        } else {
            x = deft_batch_norm_layer(a, name(s, nb, sizeof nb), which & 0x20 ? NULL : &o);
        }
        break;
    }
    case 7:   /* a pass-through for chains: a NULL stays NULL and keeps the message of the call that failed */
        if (!a) return;
        x = deft_set_name(a, name(s, nb, sizeof nb));
        break;
    }
    push(s, x);
}

static deft_optimizer *optimizer(fuzz_state *s) {
    const unsigned which = u8(s);
    deft_step_options st = {0, 0};
    if (which & 2) st.accumulate_steps = small(s), st.max_grad_norm = scalar(s);
    if (which & 1) {
        deft_sgd_options so = {0.01, 0, 0, 0, 0};
        if (which & 4) so.lr = scalar(s), so.momentum = scalar(s), so.dampening = scalar(s);
        if (which & 8) so.weight_decay = scalar(s), so.nesterov = (int)(u8(s) & 1);
        return deft_sgd(s->g, &so, which & 2 ? &st : NULL);
    }
    deft_adamw_options ao = deft_adamw_defaults();
    if (which & 4) ao.lr = scalar(s), ao.beta1 = scalar(s), ao.eps = scalar(s);
    return deft_adamw(s->g, which & 8 ? NULL : &ao, which & 2 ? &st : NULL);
}

static void op_train(fuzz_state *s, unsigned op) {
    deft_tensor *a = pick(s);
    switch (op % 4) {
    case 0: {
        const deft_status st = deft_backward(a);
        if (trace) fprintf(stderr, "backward: %s\n", st == DEFT_OK ? "ok" : deft_errmsg());
        push(s, deft_grad(pick(s)));
        break;
    }
    case 1: {
        deft_optimizer *o = optimizer(s);
        if (trace) fprintf(stderr, "optimizer: %s\n", o ? "ok" : deft_errmsg());
        deft_tensor *step = o ? deft_optimizer_step(o) : NULL;
        const double lr = scalar(s);
        if (o && lr != 0) (void)deft_optimizer_set_lr(o, lr);
        if (step && s->n_steps < MAX_IO) s->steps[s->n_steps++] = step;
        break;
    }
    case 2: (void)deft_param_set_requires_grad(a, (int)(u8(s) & 1)); break;
    case 3: (void)deft_checkpoint_span(a, pick(s)); break;
    }
}

static void build(fuzz_state *s) {
    int ops = 0;
    while (s->at < s->n && ops++ < 64) {
        unsigned op = u8(s);
        /* The thread's message, emptied so that a failing builder must write its own. The buffer is not const
         * (deft_errmsg returns the library's writable per-thread array), so this is a plain write. */
        ((char *)deft_errmsg())[0] = '\0';
        if (trace) fprintf(stderr, "op %u: category %u, call %u\n", op, op % 5, op / 5);
        switch (op % 5) {
        case 0: op_leaf(s, op / 5); break;
        case 1: op_elementwise(s, op / 5); break;
        case 2: op_shape(s, op / 5); break;
        case 3: op_layer(s, op / 5); break;
        case 4: op_train(s, op / 5); break;
        }
    }
}

static deft_compile_options compile_options(fuzz_state *s) {
    static const size_t budgets[4] = {0, 1 << 10, 1 << 16, 1 << 22};
    static const char *const stages[4] = {NULL, "schedule", "fusion", "no such stage"};
    const unsigned a = u8(s), b = u8(s);
    deft_compile_options o = {.memory_budget = budgets[a & 3], .no_reuse = (a >> 2) & 1, .reorder = (a >> 3) & 1,
                              .no_fusion = (a >> 4) & 1, .checkpoint = (int)(b % 5),
                              .checkpoint_segments = (int)(b >> 5), .optimizer_in_backward = (a >> 5) & 1,
                              .stop_after = stages[(a >> 6) & 3]};
    const unsigned c = u8(s), cast = c & 7;
    o.autocast = cast == 1 ? DEFT_BF16 : cast == 2 ? DEFT_F16 : cast == 3 ? DEFT_I32 : DEFT_F32;
    o.fuse_low_precision = (c >> 3) & 1;
    if (cast == 2) {   /* loss scaling is for f16 autocast only (other policies refuse the options) */
        o.loss_scale.disable = (c >> 4) & 1;
        o.loss_scale.growth_interval = (c >> 5) & 1 ? -1 : 0;   /* -1: refused */
    }
    o.deterministic = (c >> 6) & 1;
    return o;
}

/* Fills a buffer with small values of t's dtype (class indices 0..3 for i32), some NaN for floats. */
static void fill(fuzz_state *s, deft_tensor *t, void *buf, size_t bytes) {
    const unsigned seed = s->fill_seed++;
    const deft_dtype dt = deft_tensor_dtype(t);
    const size_t n = bytes / deft_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        const unsigned k = (unsigned)(i * 7 + seed);
        const float v = k % 97 == 0 && seed > 200 ? NAN : (float)(k % 9) * 0.25f - 1.0f;
        if (dt == DEFT_F32) ((float *)buf)[i] = v;
        else if (dt == DEFT_F64) ((double *)buf)[i] = v;
        else if (dt == DEFT_F16) ((uint16_t *)buf)[i] = deft_f32_to_f16(v);
        else if (dt == DEFT_BF16) ((uint16_t *)buf)[i] = deft_f32_to_bf16(v);
        else ((int32_t *)buf)[i] = (int32_t)(k % 4);
    }
}

static void run(fuzz_state *s, deft_program *p, deft_tensor *const *outs, int n_outs) {
    static unsigned char buf[FEED_CAP];
    for (int i = 0; i < s->n_inputs; i++) {
        size_t bytes = deft_tensor_nbytes(s->inputs[i]);
        if (bytes > FEED_CAP) continue;
        fill(s, s->inputs[i], buf, bytes);
        (void)deft_program_feed(p, s->inputs[i], buf, bytes);
    }
    for (int r = 0; r < 2; r++) {
        deft_status st = deft_program_run(p);
        if (trace) fprintf(stderr, "run %d: %s\n", r, st == DEFT_OK ? "ok" : deft_errmsg());
        if (st != DEFT_OK) {
            FUZZ_ASSERT(deft_errmsg()[0] != '\0');
            return;
        }
        for (int i = 0; i < n_outs; i++) {
            size_t bytes = deft_tensor_nbytes(outs[i]);
            if (bytes <= FEED_CAP) FUZZ_ASSERT(deft_program_read(p, outs[i], buf, bytes) == DEFT_OK);
        }
    }
}

static void compile_and_run(fuzz_state *s) {
    deft_tensor *outs[3 + MAX_IO];
    int n_outs = 0;
    for (int i = s->nt - 1; i >= 0 && n_outs < 3; i--) outs[n_outs++] = s->t[i];
    for (int i = 0; i < s->n_steps; i++) outs[n_outs++] = s->steps[i];
    if (n_outs == 0) return;
    const deft_compile_options o = s->opts;
    deft_memory_report report;
    (void)deft_plan_memory(s->g, outs, n_outs, &o, &report);
    deft_program *p = deft_compile(s->g, outs, n_outs, &o);
    if (trace) fprintf(stderr, "compile (%d outputs): %s\n", n_outs, p ? "ok" : deft_errmsg());
    if (!p) {
        FUZZ_ASSERT(deft_errmsg()[0] != '\0');
        return;
    }
    static FILE *devnull;
    if (!devnull) devnull = fopen("/dev/null", "w");
    if (devnull) (void)deft_program_print_plan(p, devnull);
    if (!o.stop_after) run(s, p, outs, n_outs);
    if (s->free_program) deft_program_free(p);   /* else deft_graph_free frees it */
}

/* Seeds: byte programs: the compile options (3 bytes) and a byte for feeding and freeing, then each op byte
 * (category op % 5, call op / 5) followed by the bytes its call reads. DEFT_FUZZ_TRACE=1 shows what each builds. */
static void write_seeds(const char *dir) {
    /* x f32 [4, 3], y i32 [4], w f32 [3, 5]; relu(x @ w); linear to 4; cross entropy; backward; SGD. */
    static const uint8_t mlp[] = {0,  0, 0, 0,
                                  0,  0, 2, 3, 2, 0, 0,       0, 12, 1, 3, 0, 0,      5, 0, 2, 2, 225, 0, 0, 3,
                                  2,  0, 2, 0,                11, 3, 7,               18, 4, 0, 3, 0,
                                  3,  5, 1, 1,                4, 6, 2,                9, 0, 5, 5, 3, 0, 0};
    /* x f32 [2, 3, 4, 4]; conv 3x3 to 4 channels, padding 1; batch norm; relu; 2x2 max pool; mean; backward;
     * AdamW. */
    static const uint8_t conv[] = {0,  0, 0, 0,
                                   0,  0, 4, 1, 2, 3, 3, 0, 0,
                                   23, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 3, 2, 2, 0,
                                   33, 1, 0, 0,                11, 2, 7,
                                   28, 3, 0, 1, 1, 2, 2, 0, 0, 0, 0,
                                   27, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 0,
                                   4,  5, 0,                   9, 0, 0, 0};
    /* full [2, 3]; uniform [3, 2]; reshape; add; transpose; slice; concat; softmax; exp; sum over axis 1. */
    static const uint8_t shapes[] = {0,  0, 0, 0,
                                     10, 0, 2, 1, 2, 0, 0, 4,         20, 0, 2, 2, 1, 0, 0, 7, 2, 1,
                                     7,  0, 2, 2, 1, 0,               1, 2, 0, 1,
                                     12, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 1,
                                     17, 4, 3, 1, 2, 0,               22, 5, 4, 4, 4, 4, 2,
                                     27, 6, 2, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 0,
                                     11, 7, 1,                        27, 8, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 0, 1};
    deft_fuzz_seed_bytes(dir, "mlp", mlp, sizeof mlp);
    deft_fuzz_seed_bytes(dir, "conv", conv, sizeof conv);
    deft_fuzz_seed_bytes(dir, "shapes", shapes, sizeof shapes);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    deft_fuzz_start(argc, argv, write_seeds);
    trace = getenv("DEFT_FUZZ_TRACE") != NULL;
    if (deft_memory_set_limit(deft_cpu(), (size_t)64 << 20) != DEFT_OK) deft_fuzz_die(deft_errmsg());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_state s = {.p = data, .n = size, .g = deft_graph_new()};
    FUZZ_ASSERT(s.g != NULL);
    deft_graph_set_seed(s.g, 1);
    s.opts = compile_options(&s);
    const unsigned misc = u8(&s);
    s.fill_seed = misc >> 1;
    s.free_program = misc & 1;
    build(&s);
    compile_and_run(&s);
    deft_graph_free(s.g);
    return 0;
}
