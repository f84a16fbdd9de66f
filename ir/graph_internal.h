/* The graph's own structures, shared by every folder above ir/. Not installed. */
#ifndef DEFT_GRAPH_INTERNAL_H
#define DEFT_GRAPH_INTERNAL_H

#include "base.h"

#include <stdbool.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum deft_op {
    /* leaves: their storage is persistent (inputs, parameters, constants) */
    DEFT_OP_INPUT = 0,
    DEFT_OP_PARAM,
    DEFT_OP_CONSTANT,
    /* creation ops: computed by a kernel, planned like any other buffer */
    DEFT_OP_FULL,
    DEFT_OP_ARANGE,
    DEFT_OP_UNIFORM,
    DEFT_OP_NORMAL,
    /* broadcasting binary */
    DEFT_OP_ADD,
    DEFT_OP_SUB,
    DEFT_OP_MUL,
    DEFT_OP_DIV,
    DEFT_OP_MAXIMUM,
    /* tensor op scalar (p.scalar) */
    DEFT_OP_ADD_SCALAR,
    DEFT_OP_RSUB_SCALAR,
    DEFT_OP_MUL_SCALAR,
    DEFT_OP_DIV_SCALAR,
    DEFT_OP_RDIV_SCALAR,
    DEFT_OP_MAXIMUM_SCALAR,
    DEFT_OP_POW_SCALAR,
    /* unary */
    DEFT_OP_NEG,
    DEFT_OP_EXP,
    DEFT_OP_LOG,
    DEFT_OP_SQRT,
    DEFT_OP_RSQRT,
    DEFT_OP_TANH,
    DEFT_OP_SIGMOID,
    DEFT_OP_RELU,
    DEFT_OP_GELU,
    DEFT_OP_SILU,
    DEFT_OP_GELU_TANH,     /* gelu's tanh approximation (torch's approximate='tanh'), GPT-2's */
    /* dtype and device */
    DEFT_OP_CAST,
    DEFT_OP_COPY,          /* to another device (and maybe dtype): src[0] sits on another device */
    /* linear algebra */
    DEFT_OP_MATMUL,
    /* shape */
    DEFT_OP_RESHAPE,       /* always a view */
    DEFT_OP_PERMUTE,
    DEFT_OP_SLICE,         /* a view when p.slice.is_view */
    DEFT_OP_CONCAT,
    /* reductions */
    DEFT_OP_SUM,
    DEFT_OP_MEAN,
    DEFT_OP_MAX,
    DEFT_OP_SOFTMAX,
    DEFT_OP_LOG_SOFTMAX,
    /* comparisons (broadcasting binary): 1 where true, 0 elsewhere, in the inputs' dtype */
    DEFT_OP_EQ,
    DEFT_OP_GT,
    DEFT_OP_GE,
    /* training */
    DEFT_OP_ACT_GRAD,           /* src (dy, x) of y = act(x), same shapes; p.act names act; out = dy * act'(x) */
    DEFT_OP_EXPAND,             /* src[0] broadcast (numpy rules) to this node's shape, materialised */
    DEFT_OP_SLICE_GRAD,         /* zeros of this node's shape with src[0] written where p.slice selects */
    DEFT_OP_CROSS_ENTROPY,      /* src (logits [N, C], targets i32 [N]); p.ce; out [] = the mean (or sum) over the
                                 * rows not ignored of (1 - ls) (lse - logit[t]) + ls (lse - mean(logits)) */
    DEFT_OP_CROSS_ENTROPY_GRAD, /* src (dloss [], logits, targets); p.ce; out [N, C] = (softmax - (1 - ls) onehot -
                                 * ls / C) * dloss / count (mean) or * dloss (sum); ignored rows 0 */
    DEFT_OP_DROPOUT,            /* p.dropout */
    DEFT_OP_OPTIMIZER,          /* src: the gradients; p.optimizer; updates parameters in place */
    /* images (ir/build_conv.c, ir/build_norm.c); the layout is in p.conv, p.pool or p.bn */
    DEFT_OP_CONV2D,                 /* src (x, w[, bias]); p.conv */
    DEFT_OP_CONV2D_INPUT_GRAD,      /* src (dy, w); this node is dx, x's shape */
    DEFT_OP_CONV2D_WEIGHT_GRAD,     /* src (dy, x); this node is dw, w's shape */
    DEFT_OP_MAX_POOL2D,             /* src x; p.pool */
    DEFT_OP_MAX_POOL2D_GRAD,        /* src (dy, x): dy to each window's first maximum */
    DEFT_OP_AVG_POOL2D,             /* src x; p.pool */
    DEFT_OP_AVG_POOL2D_GRAD,        /* src dy; x's shape */
    DEFT_OP_ADAPTIVE_AVG_POOL2D,    /* src x; the output size is this node's H and W; p.pool.layout */
    DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD,   /* src dy; x's shape */
    /* batch norm: p.bn. stats is [2, C]: the mean and 1 / sqrt(var + eps) that normalise */
    DEFT_OP_BN_STATS,               /* batch: src (x[, running_mean, running_var]) and, with them, updates them in
                                     * place (momentum); running: src (running_mean, running_var). It changes state,
                                     * so checkpointing keeps it and never runs it again (deft_op_updates_state) */
    DEFT_OP_BATCH_NORM,             /* src (x, stats[, weight][, bias]) */
    DEFT_OP_BATCH_NORM_GRAD,        /* dx: batch src (dy, x, stats, sums[, weight]); running src (dy, stats[, weight]) */
    DEFT_OP_BATCH_NORM_WEIGHT_GRAD, /* sums [2, C]: of dy (the bias gradient) and of dy * xhat (the weight's);
                                     * src (dy, x, stats) */
    /* attention (ir/build_attention.c): p.attn. Each node's buffer holds, past its value, per-row statistics
     * (deft_node_extra_bytes): the forward's log-sum-exp, the gradient's rowsum(dO * O) */
    DEFT_OP_ATTENTION,              /* src (q, k, v) [B, H, T, D]; out [B, H, T, D]. Packed (p.attn.heads = H > 0):
                                     * src qkv [B, T, 3C]; out [B, T, C] laid out [B, T, H, D] */
    DEFT_OP_ATTENTION_GRAD,         /* src (dout, q, k, v, out): out [3, B, H, T, D] = dq, dk, dv. Packed: src
                                     * (dout, qkv, out): out [B, T, 3C], qkv's gradient (deft_attention_layout_of) */
    /* gathers and selects (ir/build_gather.c). An index outside its range is a run-time data error, recorded on a
     * GPU (mem/device_errors.h) as cross-entropy's targets are */
    DEFT_OP_EMBEDDING,              /* src (table [V, C], ids i32 [...]); out [..., C] = table[ids] */
    DEFT_OP_INDEX_SELECT,           /* src (a, index i32 [n]); p.gather.axis; out a's shape with that axis n long */
    DEFT_OP_INDEX_ORDER,            /* src index i32 [...] (n elements); p.gather.rows = L: out i32 [2P + L + 1]
                                     * (P = deft_index_order_pad(n)): P u64 keys (index << 32 | position) in
                                     * ascending order, padding last, then each value's first slot among them */
    DEFT_OP_EMBEDDING_GRAD,         /* src (dy [..., C], ids, order); out [V, C]: dy's rows summed per id, in order */
    DEFT_OP_INDEX_SELECT_GRAD,      /* src (dy, index, order); p.gather.axis; out the selected tensor's shape */
    DEFT_OP_WHERE,                  /* src (cond, a, b) broadcasting; cond any dtype (nonzero: true): a, else b */
    DEFT_OP_MASKED_FILL,            /* src (a, mask) (mask any dtype, broadcast to a); p.scalar where mask != 0 */
    /* layer norm over the last dim (ir/build_layer_norm.c): p.ln. The forward node keeps each row's mean and
     * 1 / sqrt(var + eps) past its value (deft_node_extra_bytes), which its backward nodes read */
    DEFT_OP_LAYER_NORM,             /* src (x[, weight][, bias]); out x's shape, in x's dtype or (f32 x) bf16 or f16 */
    DEFT_OP_LAYER_NORM_GRAD,        /* src (dy, x, ln[, weight]): dx, x's shape and dtype; dy in ln's dtype */
    DEFT_OP_LAYER_NORM_WEIGHT_GRAD, /* src (dy, x, ln): out [2, C] = column sums of dy * xhat (the weight's gradient)
                                     * and of dy (the bias's); its buffer holds the row blocks' partial sums past them */
    /* src (param): param (an optimizer's f32 parameter) in this node's dtype, bf16 or f16, kept by the optimizer
     * beside its flat storage and written by its updates (the compile option param_copies, ir/optimizer.h's
     * flat_low): a leaf to the schedule and the plan (persistent, computed by no step); a cast to autodiff. */
    DEFT_OP_PARAM_COPY,
    DEFT_OP_COUNT
} deft_op;

typedef enum deft_op_kind {
    DEFT_KIND_LEAF,
    DEFT_KIND_CREATE,
    DEFT_KIND_BINARY,
    DEFT_KIND_SCALAR,
    DEFT_KIND_UNARY,
    DEFT_KIND_CAST,          /* a dtype change, element by element */
    DEFT_KIND_ELEMENTWISE,   /* other same-shape elementwise ops (element i read before element i is written) */
    DEFT_KIND_OTHER
} deft_op_kind;

typedef struct deft_op_info {
    const char *name;
    deft_op_kind kind;
    bool float_only;      /* the op is defined on floating dtypes only (the builder refuses i32) */
    /* 1 + k where the output may take over operand k's buffer when that dies at this op (same bytes and dtype; the
     * planner's in place, passes/schedule.c): every backend's kernel, on every path, reads each part of operand k
     * that it writes before writing it, and no other thread writes it first. 0: none (elementwise kinds need none). */
    unsigned char overwrites;
} deft_op_info;

/* Kinds whose kernel computes element i from element i of each input only: they may write over a dying input. */
static inline bool deft_kind_is_elementwise(deft_op_kind k) {
    return k == DEFT_KIND_BINARY || k == DEFT_KIND_SCALAR || k == DEFT_KIND_UNARY || k == DEFT_KIND_CAST ||
           k == DEFT_KIND_ELEMENTWISE;
}

const deft_op_info *deft_op_info_of(deft_op op);
const char *deft_op_name(deft_op op);
/* What running node t's kernel costs, from its op and shapes (ir/op_cost.c): floating-point operations, and bytes
 * read and written. Leaves and views cost nothing. */
void deft_op_cost(const struct deft_tensor *t, double *flops, double *bytes);

typedef union deft_op_params {
    double scalar;                                          /* scalar ops; full's value */
    struct { double start, step; } arange;
    struct { double a, b; uint64_t seed; } rng;             /* uniform: low, high; normal: mean, stddev */
    struct { int trans_a, trans_b; } matmul;
    int perm[DEFT_MAX_DIMS];                                /* permute: out dim i = in dim perm[i] */
    struct { int axis; int64_t start, step; int is_view; } slice;   /* normalised: 0 <= start, step > 0 */
    int axis;                                               /* concat, softmax, log_softmax */
    /* concat: axis aliases p.axis; add_zero: each element is stored as x + 0 in its dtype's arithmetic (-0 becomes
     * +0), as the sum of zero-padded slice gradients it replaces gave (ir/autodiff_slices.c) */
    struct { int axis; int add_zero; } concat;
    struct { uint32_t mask; int keepdim; } reduce;         /* bit i set: input axis i is reduced */
    deft_init init;                                         /* params */
    deft_op act;                                            /* act_grad: the activation */
    /* cross_entropy and its gradient: targets equal to ignore_index (when has_ignore) are skipped; label smoothing
     * ls in [0, 1); reduction a deft_reduction (0 mean, 1 sum). All zero: deft_cross_entropy's plain mean. */
    struct { int32_t has_ignore, ignore_index; double smoothing; int reduction; } ce;
    /* dropout: run is the program's run count, written by the executor before each run, so that each run draws a
     * new mask while every reader within a run (backward, recomputation) sees the same one */
    struct { double p; uint64_t seed; uint64_t run; } dropout;
    struct deft_optimizer *optimizer;
    /* conv2d and its gradients: per (H, W) */
    struct { int64_t stride[2], pad[2], dil[2], groups; int layout; } conv;
    /* pooling: adaptive pooling uses layout only */
    struct { int64_t kernel[2], stride[2], pad[2]; int count_include_pad, layout; } pool;
    /* batch norm. batch: normalise by the batch's statistics (training, or no running statistics); update: the
     * stats node also updates the running statistics; has_weight/has_bias: which optional sources follow. */
    struct { double momentum, eps; int batch, update, has_weight, has_bias, layout; } bn;
    /* attention: scale > 0 resolved at build; heads 0 for q, k, v apart, H for the packed layout */
    struct { double scale; int causal; int heads; } attn;
    /* index_select and its gradient: the axis; index_order: rows (the index's range [0, rows)) and embedding (1
     * when it orders an embedding's ids, for the message naming a bad one) */
    struct { int axis; int embedding; int64_t rows; } gather;
    struct { double eps; int has_weight, has_bias; } ln;  /* layer norm and its gradients */
} deft_op_params;

struct deft_tensor {
    deft_graph *graph;
    int id;                       /* index in graph->nodes; the order nodes were built (a topological order) */
    deft_op op;
    deft_dtype dtype;
    deft_device device;
    int ndim;
    int64_t shape[DEFT_MAX_DIMS];
    int nsrc;
    deft_tensor **src;            /* nsrc inputs */
    deft_op_params p;
    char name[64];
    /* A view shares its storage with src[0] at view_offset bytes (reshape, contiguous slice). */
    bool is_view;
    size_t view_offset;
    /* Persistent leaves (params, constants): the value on the host, owned by the graph. For a parameter on a GPU,
     * dev_data holds the live value once a program has been compiled for it (the host copy is then stale). */
    void *host_data;
    void *dev_data;
    /* Training: whether a parameter wants a gradient, and the gradient node deft_backward made for this tensor. */
    bool no_grad;
    deft_tensor *grad;
    /* A parameter whose storage an optimizer owns (flat): host_data/dev_data point into it and are not freed here. */
    bool storage_borrowed;
    /* Checkpointing (passes/checkpoint*.c). ckpt_marked: inside a span given to deft_checkpoint_span. A node the
     * rewrite made for one program has ckpt_role != 0 and ckpt_origin, the user's node it stands for; user nodes
     * never read such nodes, so other compiles never see them. */
    bool ckpt_marked;
    unsigned char ckpt_role;      /* a deft_ckpt_role */
    deft_tensor *ckpt_origin;
    const struct deft_program *ckpt_owner;
    /* Made by the autocast rewrite (ir/autocast.c): a deft_autocast_mark; 0 for the user's own nodes. */
    uint8_t autocast;
};

typedef enum deft_ckpt_role {
    DEFT_CKPT_USER = 0,
    DEFT_CKPT_RECOMPUTE,          /* a forward node run again in the backward pass */
    DEFT_CKPT_BACKWARD_COPY,      /* a backward node that reads recomputed values instead of saved ones */
    DEFT_CKPT_OPTIMIZER_PART      /* a piece of an optimizer's step, or its finisher (passes/optimizer_split.h) */
} deft_ckpt_role;

struct deft_program;

struct deft_graph {
    deft_tensor **nodes;
    int n_nodes, cap_nodes;
    deft_status first_error;
    char first_errmsg[1024];
    uint64_t seed;
    uint64_t param_counter;       /* distinct default seeds per parameter */
    struct deft_program **programs;   /* compiled from this graph, freed with it */
    const struct deft_graph_hooks *hooks;   /* the runtime's, from the first program on (ir/graph_hooks.h) */
    int n_programs, cap_programs;
    struct deft_optimizer **optimizers;   /* built on this graph, freed with it */
    int n_optimizers;
    /* deft_backward's calls (ir/autodiff.c), so that a rewrite can re-derive the backward pass: each loss and the
     * range of node ids the call added. */
    struct deft_backward_call *backward_calls;
    int n_backward_calls;
    struct deft_autocast *autocasts;      /* the autocast rewrites made so far (ir/autocast.c), freed with it */
    bool keep_input_casts;   /* tests only: autocast keeps the casts of inputs for the backward pass (passes/checkpoint.h) */
};

/* ---- errors of a graph (ir/graph.c) ---- */
/* As deft_set_error, and records it as the graph's first error if it has none. */
deft_status deft_graph_fail(deft_graph *g, deft_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- shapes of nodes (ir/build_check.c) ---- */
/* DEFT_ERR_SHAPE (with message) unless src broadcasts to out's shape; kernels re-check what builders checked. */
deft_status deft_check_expand_shape(const deft_tensor *src, const deft_tensor *out);

/* Never wraps: every node's count and bytes were checked when it was made (deft_node_new), at most PTRDIFF_MAX. */
static inline size_t deft_tensor_bytes(const deft_tensor *t) {
    return (size_t)deft_shape_numel(t->ndim, t->shape) * deft_dtype_size(t->dtype);
}

/* Attention's nodes keep per-row statistics past their value in the same buffer: the rows are the [B, H, T] of
 * the value ([3, B, H, T, D] for the gradient: its dq, dk and dv share them; in the packed layout B H T as well,
 * stored [B, H, T]), f64 for f64 values and f32 otherwise,
 * from the offset below (aligned so that every kernel may load them as it likes). Other nodes have none. The
 * planner sizes a node's buffer with deft_node_buffer_bytes; deft_attention checks at build that it fits. */
static inline size_t deft_node_extra_offset(const deft_tensor *t) {
    return (deft_tensor_bytes(t) + 255) & ~(size_t)255;
}
/* The [B, H, T, D] of an attention node or its gradient in either layout: apart (q, k, v and the value [B, H, T, D],
 * the gradient [3, B, H, T, D]) or packed (p.attn.heads = H: the value [B, T, C], the gradient [B, T, 3C]). */
typedef struct deft_attention_dims {
    int64_t b, h, t, d;
} deft_attention_dims;
static inline deft_attention_dims deft_attention_dims_of(const deft_tensor *t) {
    deft_attention_dims a;
    const int r = t->ndim;
    if (t->p.attn.heads > 0) {
        const int64_t c = t->op == DEFT_OP_ATTENTION ? t->shape[2] : t->shape[2] / 3;
        a.b = t->shape[0], a.h = t->p.attn.heads, a.t = t->shape[1], a.d = c / t->p.attn.heads;
    } else {
        a.b = t->shape[r - 4], a.h = t->shape[r - 3], a.t = t->shape[r - 2], a.d = t->shape[r - 1];
    }
    return a;
}
/* Where the kernels find element (b, h, i, c) of q, k and v (and of dq, dk and dv in the gradient's value: the same
 * layout) and of the output (and dout): b * sb + h * sh + i * st + c elements from each one's base. Where the three
 * share one buffer (packed q, k, v; every gradient's value), k's base is q's + part elements and v's k's + part.
 * Apart, each is a row-major [B, H, T, D]; packed, the thirds of [B, T, 3C] and the output a row-major [B, T, H, D]:
 * the strides cuDNN's SDPA takes as well (D's stride 1). */
typedef struct deft_attention_strides {
    int64_t sb, sh, st;
} deft_attention_strides;
typedef struct deft_attention_layout {
    deft_attention_strides qkv, out;
    int64_t part;
} deft_attention_layout;
static inline deft_attention_layout deft_attention_layout_of(const deft_tensor *t) {
    const deft_attention_dims a = deft_attention_dims_of(t);
    deft_attention_layout l;
    if (t->p.attn.heads > 0) {
        const int64_t c = a.h * a.d;
        l.qkv.sb = a.t * 3 * c, l.qkv.sh = a.d, l.qkv.st = 3 * c;
        l.out.sb = a.t * c, l.out.sh = a.d, l.out.st = c;
        l.part = c;
    } else {
        l.qkv.sb = a.h * a.t * a.d, l.qkv.sh = a.t * a.d, l.qkv.st = a.d;
        l.out = l.qkv;
        l.part = a.b * a.h * a.t * a.d;
    }
    return l;
}
static inline int64_t deft_attention_rows(const deft_tensor *t) {
    const deft_attention_dims a = deft_attention_dims_of(t);
    return a.b * a.h * a.t;
}
/* Layer norm's rows: every element of x but its last dim's (x, dy or the forward node). Its forward node keeps the
 * rows' means then their 1 / sqrt(var + eps) (f64 for f64, f32 otherwise); the weight gradient node keeps the partial
 * sums of DEFT_LAYER_NORM_PARTS blocks of rows at most ([parts, 2, C]), which it adds up in a fixed order (no float
 * atomics: the same bits every run). deft_layer_norm checks at build that these fit. 256: on a GPU the fused dx and
 * weight gradient kernel (ops/cuda/cuda_layer_norm.cu) runs one block a row block, and 64 left half an H100's
 * SMs idle; the partials stay small beside the rows (256 x 2 x 768 f32: 1.5 MB beside GPT-2's 50 MB of x). */
#define DEFT_LAYER_NORM_PARTS 256
static inline int64_t deft_layer_norm_rows(const deft_tensor *x) {
    int64_t r = 1;
    for (int d = 0; d + 1 < x->ndim; d++) r *= x->shape[d];
    return r;
}
static inline int64_t deft_layer_norm_parts(int64_t rows) {
    return rows < 1 ? 1 : rows < DEFT_LAYER_NORM_PARTS ? rows : DEFT_LAYER_NORM_PARTS;
}
/* A sum, mean or max on a GPU with few outputs and long rows splits each output's row over `parts` blocks
 * (ops/cuda/cuda_reduce.cu): their 8-byte partials (double; int64 for i32) sit past the value, and a second kernel
 * adds each output's partials in a fixed order (the same bits every run). 0: no split. The rows are longer than a
 * fused chain's reduction may be (ops/fused.h's DEFT_FUSED_MAX_REDUCE_NUMEL, 2^16), which sums in one block's
 * order, so that a fused chain keeps the unfused bits (cuda_reduce.cu asserts it). No measurement recorded. */
#define DEFT_REDUCE_SPLIT_MAX_OUTPUTS 64
#define DEFT_REDUCE_SPLIT_MIN_LEN (((int64_t)1 << 16) + 1)
#define DEFT_REDUCE_SPLIT_PART_LEN 8192   /* elements a part at least */
#define DEFT_REDUCE_SPLIT_PARTIALS 1024   /* outputs x parts at most */
static inline int64_t deft_reduce_split_parts(const deft_tensor *t) {
    if ((t->op != DEFT_OP_SUM && t->op != DEFT_OP_MEAN && t->op != DEFT_OP_MAX) || t->device.type != DEFT_CUDA ||
        t->nsrc < 1)
        return 0;
    const int64_t nout = deft_shape_numel(t->ndim, t->shape);
    if (nout < 1 || nout > DEFT_REDUCE_SPLIT_MAX_OUTPUTS) return 0;
    const int64_t len = deft_shape_numel(t->src[0]->ndim, t->src[0]->shape) / nout;
    if (len < DEFT_REDUCE_SPLIT_MIN_LEN) return 0;
    const int64_t by_len = len / DEFT_REDUCE_SPLIT_PART_LEN, cap = DEFT_REDUCE_SPLIT_PARTIALS / nout;
    return by_len < cap ? by_len : cap;
}
/* A half-precision attention gradient on a GPU also keeps, past its statistics, an f32 [B, H, T, D] accumulator for
 * cuDNN's dq (summed with atomics across key blocks): in the node's buffer rather than the stream's cuDNN scratch,
 * whose cap it would pass at GPT-2's sizes (bench/RESULTS.md, eighteenth round). Under 4/6 of the node's own bytes,
 * so the sizes deft_attention checked cover it. */
static inline bool deft_attention_has_accum(const deft_tensor *t) {
    return t->op == DEFT_OP_ATTENTION_GRAD && t->device.type == DEFT_CUDA &&
           (t->dtype == DEFT_BF16 || t->dtype == DEFT_F16);
}
static inline size_t deft_node_extra_bytes(const deft_tensor *t) {
    const size_t esz = t->dtype == DEFT_F64 ? 8 : 4;
    if (t->op == DEFT_OP_SUM || t->op == DEFT_OP_MEAN || t->op == DEFT_OP_MAX)
        return (size_t)deft_reduce_split_parts(t) * (size_t)deft_shape_numel(t->ndim, t->shape) * 8;
    if (t->op == DEFT_OP_LAYER_NORM) return 2 * (size_t)deft_layer_norm_rows(t) * esz;
    if (t->op == DEFT_OP_LAYER_NORM_WEIGHT_GRAD)
        return (size_t)deft_layer_norm_parts(deft_layer_norm_rows(t->src[0])) * 2 * (size_t)t->shape[1] * esz;
    if (t->op != DEFT_OP_ATTENTION && t->op != DEFT_OP_ATTENTION_GRAD) return 0;
    const size_t stats = (size_t)deft_attention_rows(t) * esz;
    if (!deft_attention_has_accum(t)) return stats;
    return ((stats + 255) & ~(size_t)255) + (size_t)deft_attention_rows(t) * (size_t)deft_attention_dims_of(t).d * 4;
}
/* Where the f32 dq accumulator of a GPU half-precision attention gradient starts (deft_attention_has_accum). */
static inline size_t deft_attention_accum_offset(const deft_tensor *t) {
    return deft_node_extra_offset(t) + (((size_t)deft_attention_rows(t) * 4 + 255) & ~(size_t)255);
}
static inline size_t deft_node_buffer_bytes(const deft_tensor *t) {
    const size_t extra = deft_node_extra_bytes(t);
    return extra ? deft_node_extra_offset(t) + extra : deft_tensor_bytes(t);
}

/* Ops whose kernel writes state besides their value (an optimizer's parameters, batch norm's running statistics):
 * they run once per step, so a checkpoint rewrite keeps their values rather than recomputing them. */
static inline bool deft_op_updates_state(deft_op op) { return op == DEFT_OP_OPTIMIZER || op == DEFT_OP_BN_STATS; }

static inline bool deft_op_is_leaf(deft_op op) {
    return op == DEFT_OP_INPUT || op == DEFT_OP_PARAM || op == DEFT_OP_CONSTANT || op == DEFT_OP_PARAM_COPY;
}

/* The device that does a step's work: a copy to the host is queued by the GPU it comes from. */
static inline deft_device deft_step_device(const deft_tensor *t) {
    if (t->op == DEFT_OP_COPY && t->device.type == DEFT_CPU) return t->src[0]->device;
    return t->device;
}

/* The convolution and its two gradients (cuDNN's on a GPU). */
static inline bool deft_op_is_conv(deft_op op) {
    return op == DEFT_OP_CONV2D || op == DEFT_OP_CONV2D_INPUT_GRAD || op == DEFT_OP_CONV2D_WEIGHT_GRAD;
}

/* The keys an index_order node sorts: n rounded up to a power of two (at least 1), because the GPU sorts them with a
 * bitonic network in place; the padding keys (all ones) sort last. n is at most 2^31 (positions are 32 bits). */
static inline int64_t deft_index_order_pad(int64_t n) {
    int64_t p = 1;
    while (p < n) p *= 2;
    return p;
}



#ifdef __cplusplus
}
#endif
#endif
