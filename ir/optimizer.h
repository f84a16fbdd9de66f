/* An optimizer's state, shared by ir/optimizer.c (building), runtime/optimizer_run.c (running on the CPU) and
 * ops/cuda/cuda_optimizer.cu (running on a GPU). Plain C: the CUDA side includes it too. */
#ifndef DEFT_OPTIMIZER_H
#define DEFT_OPTIMIZER_H

#include <math.h>

#include "graph_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum deft_optimizer_kind { DEFT_OPTIM_SGD, DEFT_OPTIM_ADAMW } deft_optimizer_kind;

/* The first-stage sums of the gradient norm on a GPU: at most this many blocks, each writing one partial sum. */
#define DEFT_OPTIMIZER_NORM_BLOCKS 512
/* About how many blocks the gradient norm (and the one-launch step over them) is cut into (below). */
#define DEFT_OPTIMIZER_STEP_BLOCKS 2048

/* The per-run state of an optimizer on a GPU, kept in device memory so that a step reads and advances it without the
 * host: a step captured once into a CUDA Graph advances it on every replay. Written by the step's kernels (and by
 * deft_optimizer_set_lr between steps); the host reads it back only when asked (deft_optimizer_updates). */
typedef struct deft_optimizer_dev {
    int64_t updates;          /* updates applied so far */
    int32_t micro;            /* runs since the last update */
    int32_t update_now;       /* this run applies an update (set by the prepare kernel, read by the update kernel) */
    double lr;                /* the learning rate of the next update */
    float last_norm;          /* the norm of the last update (NaN before the first): the step node's value */
    int32_t first;            /* this run's update is the first one (the momentum buffer and the moments start) */
    /* This run's coefficients, computed once on the device by the prepare kernel. */
    double scale;             /* 1/k times the clip factor */
    double step_size;         /* AdamW: lr / (1 - beta1^t) */
    double bc2_sqrt;          /* AdamW: sqrt(1 - beta2^t) */
    double decay;             /* AdamW: 1 - lr * weight_decay */
    double bc1;               /* AdamW: 1 - beta1^t, for the step size of a parameter group (lr_scale) */
    uint32_t blocks_done;     /* the one-launch step: blocks finished this run (the last one closes the run) */
    /* Dynamic loss scaling (deft_optimizer_scaler): the scale the backward pass starts from (a seed node of the
     * autocast step reads it here), clean updates in a row, and updates skipped for inf/NaN gradients. */
    float loss_scale;
    int32_t growth_tracker;
    int64_t skipped;
    double partial[DEFT_OPTIMIZER_NORM_BLOCKS];   /* the norm's first-stage sums of squares */
} deft_optimizer_dev;

/* One parameter's gradient in the gather table of a GPU optimizer: count elements at src go to flat_grads + offset.
 * src holds them in dtype (a deft_dtype: the parameters' own, or bf16/f16 under f32 weights), widened on load; the
 * kernels choose the load per segment, so the common case (the parameters' dtype) runs as before. */
typedef struct deft_optimizer_segment {
    const void *src;
    int64_t offset, count;
    int32_t dtype, pad;
} deft_optimizer_segment;

/* A gather table on the device, built for one set of gradient addresses and dtypes (a compiled program's arena places
 * the gradients at fixed addresses, so each program needs one table, built on its first run). */
typedef struct deft_optimizer_gather {
    const void **grads;                  /* host copy of the addresses the table was built for (n_params) */
    deft_dtype *dtypes;                  /* and of their dtypes (n_params) */
    deft_optimizer_segment *table;       /* device memory, n_params entries */
    uint64_t last_used;
} deft_optimizer_gather;

/* Dynamic loss scaling, as torch.cuda.amp.GradScaler, on while the programs that run this optimizer's step start
 * their backward pass from the scale (the step twin of an f16 autocast rewrite; passes/autocast_program.c turns it on
 * or off when a program is compiled, and refuses to mix scaled and unscaled steps of one optimizer). */
typedef struct deft_optimizer_scaler {
    int on;
    int started;              /* the scale was set to an init_scale once; later programs go on from its value */
    double growth, backoff;
    int interval;
    /* The CPU's state (on a GPU it lives in deft_optimizer_dev instead). */
    float scale;
    int32_t tracker;
    int64_t skipped;
} deft_optimizer_scaler;

/* A parameter's own hyperparameters under parameter groups (deft_optimizer_param_group): its weight decay (AdamW's
 * decoupled decay, SGD's L2 term) and its learning rate as a multiple of the optimizer's. */
typedef struct deft_optimizer_group {
    double weight_decay, lr_scale;
} deft_optimizer_group;

/* Gather tables kept per optimizer; past this the least recently used one is rebuilt for the new addresses. */
#define DEFT_OPTIMIZER_GATHER_CACHE 16

/* The gradient norm is summed in blocks that never cross a parameter: parameter i's elements, in runs of `chunk`
 * (at least DEFT_OPTIMIZER_BLOCK_MIN, more when the storage is large), are blocks block_first[i] .. block_first[i+1]
 * - 1. Each block's sum of squares is formed alone and the sums are added in block order, so a step split into
 * pieces of whole parameters (optimizer in backward, passes/optimizer_split.c) gives the same norm, bit for bit, as
 * the whole step. */
#define DEFT_OPTIMIZER_BLOCK_MIN 2048

/* One block on the device: elements [lo, hi) of the flat storage, inside parameter `param`. */
typedef struct deft_optimizer_block {
    int64_t lo, hi;
    int32_t param, pad;
} deft_optimizer_block;

/* Optimizer in backward: a part of one optimizer's step, run as a node of its own. A piece updates the parameters
 * [first_param, first_param + n_params) of `whole` from their gradients and writes the sums of squares of their
 * blocks (f64, n_blocks of them from first_block on); the finisher reads every piece's sums, in flat order, adds them
 * as the whole step would, writes the norm and advances the counters (once per step). A part is itself a struct
 * deft_optimizer (so that nodes keep one kind of pointer) whose `part` is set: its parameter arrays and state are
 * whole's, borrowed; only its gather tables are its own. Parts are made on demand and kept by `whole` until the
 * graph goes (passes/optimizer_split.c). */
typedef struct deft_optimizer_part {
    struct deft_optimizer *whole;
    bool finisher;
    int first_param;
    int first_block, n_blocks;        /* a finisher: all of whole's */
    int n_pieces;                     /* a finisher: the pieces it reads, in flat order */
    int *piece_first_param, *piece_n_params;
} deft_optimizer_part;

/* ZeRO-1 with copies: a run of the flat storage that one rank owns (runtime/zero_f32.c). */
typedef struct deft_zero_f32_piece {
    int64_t lo, hi;   /* elements [lo, hi) of the flat storage */
    int root;         /* the rank whose slice holds them */
} deft_zero_f32_piece;

/* ZeRO-1 (the compile option zero_stage under dist; dist/dist_zero.c): the collectives a sharded step calls between
 * its kernels, given by dist/ (ops/ sits below it) when a replica is compiled. Each queues on `stream`, in place:
 * all_reduce_sum adds one f64 over the ranks; all_gather fills buf's whole from every rank's slice at buf + r * shard.
 * ctx and local name the communicator (the deft_dist and its local index). The gradients' reduces are no part of the
 * step: the replica queues them during the backward pass (dist/dist_program.c). */
typedef struct deft_optimizer_zero_ops {
    deft_status (*all_reduce_sum)(void *ctx, int local, double *x, void *stream);
    deft_status (*all_gather)(void *ctx, int local, void *buf, int64_t shard, deft_dtype dt, void *stream);
    /* Each piece of buf (dt) sent from its root to every rank, in place, as one NCCL group. */
    deft_status (*broadcast_pieces)(void *ctx, int local, void *buf, const deft_zero_f32_piece *pieces, int n,
                                    deft_dtype dt, void *stream);
} deft_optimizer_zero_ops;

/* An optimizer sharded across `world` ranks (world 0: not sharded). The flat storage is padded to `padded` elements (a
 * multiple of world * 16 bytes' worth, the padding zero and no parameter's); rank `rank` owns [lo, hi), hi - lo =
 * padded / world, and its state arrays hold only that slice (element lo at index 0). The update's blocks (those of the
 * norm, ir/optimizer.h, cut at lo and hi, without the padding) are on the device, relative to lo. Set before the
 * storage is made (runtime/optimizer_storage.c), fixed after it.
 *
 * The flat gradients hold the slice only (hi - lo elements, element lo at index 0). In a world of several ranks the
 * replica reduces each gradient's pieces to their owners during the backward pass (dist/dist_program.c), straight
 * into their places in the flat gradients: the gradients are in the optimizer's dtype, since data parallel training
 * keeps f32 gradients under autocast (ir/autocast.h), and a narrower one is refused. In a world of one the step
 * gathers the gradients from where the backward pass left them, as an unsharded step does. */
typedef struct deft_optimizer_zero {
    int world, rank;
    int64_t lo, hi, padded;
    int n_blocks;
    deft_optimizer_block *dev_blocks;
    const deft_optimizer_zero_ops *ops;
    void *ctx;
    int local;
    /* With low-precision copies (param_copies) in a world of several ranks the step all-gathers the copies instead
     * of the f32 parameters, and broadcasts from their owners only the f32 values of the parameters that the
     * replica reads in f32 (f32_param[i], n_params flags; the embedding tables and layer norms of an autocast
     * model): f32_pieces, their pieces cut at the slices. Set when the first program that steps the optimizer with
     * copies is compiled (runtime/zero_f32.c); NULL while none was. */
    bool *f32_param;
    deft_zero_f32_piece *f32_pieces;
    int n_f32_pieces;
} deft_optimizer_zero;

struct deft_optimizer {
    deft_graph *graph;
    deft_optimizer_kind kind;
    deft_sgd_options sgd;
    deft_adamw_options adamw;
    int accumulate_steps;
    double max_grad_norm;
    double lr;                 /* the learning rate (on a GPU, a mirror of dev->lr, which only set_lr writes) */
    /* Built while the debug knob OPT_REFERENCE was on (base/config.h): on a GPU it keeps flat gradients and its step
     * runs the plain kernels whatever its options, the reference a test holds the faster steps against. */
    bool reference;
    deft_dtype dtype;
    deft_device device;
    int n_params;
    deft_tensor **params;
    int64_t *offsets;          /* element offset of each parameter in the flat storage */
    int64_t total;             /* elements in the flat storage */
    /* Parameter groups (ir/optimizer_groups.c): per parameter, its hyperparameters and its group (-1: the
     * optimizer's own); NULL while no group was made, when every parameter takes the optimizer's options. Fixed once
     * the storage is made: a GPU's copy (dev_groups) is made with it, and captured steps read it. */
    deft_optimizer_group *groups;
    int *group_of;
    int n_groups;
    deft_optimizer_group *dev_groups;
    /* Made by the runtime when a program running the step is first compiled (runtime/optimizer_storage.c). */
    bool materialized;
    /* Flat storage on the optimizer's device: the parameters' values (each parameter's storage points into it),
     * the gradients summed over the micro-batches of one update (NULL unless deft_optimizer_keeps_grads; under ZeRO-1
     * the slice's averaged gradients, deft_optimizer_grad_count of them), and the
     * per-element state (SGD: momentum buffer;
     * AdamW: the first and second moments). */
    void *flat_params, *flat_grads, *state0, *state1;
    /* The compile option param_copies: the parameters in low_dtype (bf16 or f16), flat as flat_params (total
     * elements), which autocast programs read instead of casting each parameter every step (DEFT_OP_PARAM_COPY
     * nodes borrow their storage here). Made when the first such program is compiled; every update writes its
     * elements (CPU and GPU kernels, the cast's rounding); low_stale is set by whatever writes the parameters
     * outside a step (deft_param_set, a data-parallel broadcast) and cleared by the refresh before the next run.
     * Under ZeRO-1 it holds the padded storage (deft_optimizer_flat_count): each rank's update writes its slice,
     * the step all-gathers the rest. NULL: none. */
    void *flat_low;
    deft_dtype low_dtype;
    bool low_stale;
    /* ZeRO-1 with copies (zero.f32_param above): after a step the f32 values of the parameters outside f32_param
     * are current in their owner's slice only, until deft_dist_gather_params gathers them; meanwhile whatever reads
     * or writes them on the host, or reads them in f32 on the device, is refused (runtime/zero_f32.c). */
    bool f32_partial;
    /* The CPU's per-run state (on a GPU it lives in dev instead). */
    int micro;                 /* runs since the last update */
    int64_t updates;
    double last_norm;
    deft_tensor *step_node;
    /* GPU only: the per-run state on the device (made with the flat storage) and the gather tables. */
    deft_optimizer_dev *dev;
    deft_optimizer_gather gathers[DEFT_OPTIMIZER_GATHER_CACHE];
    int n_gathers;
    uint64_t gather_clock;
    deft_optimizer_scaler scaler;
    /* The norm's blocks (above): n_blocks in all, param i's from block_first[i] (n_params + 1 entries). On a GPU, the
     * device's copy of the blocks and one f64 per block for the one-launch step's sums. */
    int64_t chunk;
    int n_blocks;
    int *block_first;
    deft_optimizer_block *dev_blocks;
    double *dev_block_sums;
    /* Optimizer in backward: NULL for an optimizer; set for a part of one (it then owns nothing else). */
    deft_optimizer_part *part;
    struct deft_optimizer **parts;    /* an optimizer's parts made so far, freed with it */
    int n_parts;
    deft_optimizer_zero zero;         /* ZeRO-1 sharding (above); zero.world 0: none */
};

/* The optimizer a step node's optimizer stands for: itself, or the whole one of a part. */
static inline struct deft_optimizer *deft_optimizer_whole(struct deft_optimizer *opt) {
    return opt->part ? opt->part->whole : opt;
}

/* Whether the optimizer's state is sharded across ranks (ZeRO-1). */
static inline bool deft_optimizer_sharded(const struct deft_optimizer *opt) { return opt->zero.world > 0; }
/* Whether the step gathers the low-precision copies and broadcasts only zero.f32_pieces (above). */
static inline bool deft_optimizer_gathers_low(const struct deft_optimizer *opt) {
    return opt->zero.world > 1 && opt->flat_low && opt->zero.f32_param;
}

/* Elements of the flat parameters (the padded storage under ZeRO-1), and of each state array (the rank's slice under
 * ZeRO-1). */
static inline int64_t deft_optimizer_flat_count(const struct deft_optimizer *opt) {
    return deft_optimizer_sharded(opt) ? opt->zero.padded : opt->total;
}
static inline int64_t deft_optimizer_state_count(const struct deft_optimizer *opt) {
    return deft_optimizer_sharded(opt) ? opt->zero.hi - opt->zero.lo : opt->total;
}
/* Elements of the flat gradients, where they exist: the rank's slice under ZeRO-1, the parameters' otherwise. */
static inline int64_t deft_optimizer_grad_count(const struct deft_optimizer *opt) {
    return deft_optimizer_sharded(opt) ? opt->zero.hi - opt->zero.lo : opt->total;
}

/* ZeRO-1: the ranks whose slices parameter i's elements [off, off + count) meet, first .. last (none when count is
 * 0: *first > *last), and the piece of it that rank r owns, [*a, *e) of the flat storage. Every rank computes the
 * same pieces, so that their reduces (dist/dist_zero.c) match. */
static inline void deft_optimizer_zero_ranks(const struct deft_optimizer *opt, int64_t off, int64_t count, int *first,
                                             int *last) {
    const int64_t shard = opt->zero.hi - opt->zero.lo;
    *first = 0;
    *last = -1;
    if (shard <= 0 || count <= 0) return;
    *first = (int)(off / shard);
    *last = (int)((off + count - 1) / shard);
}
static inline void deft_optimizer_zero_piece(const struct deft_optimizer *opt, int64_t off, int64_t count, int r,
                                             int64_t *a, int64_t *e) {
    const int64_t shard = opt->zero.hi - opt->zero.lo, lo = (int64_t)r * shard, hi = lo + shard;
    *a = off > lo ? off : lo;
    *e = off + count < hi ? off + count : hi;
}
/* Where in the flat gradients this rank receives a piece of its slice starting at flat element a (bytes). */
static inline size_t deft_optimizer_zero_dest_offset(const struct deft_optimizer *opt, int64_t a) {
    return (size_t)(a - opt->zero.lo) * deft_dtype_size(opt->dtype);
}

void deft_optimizer_destroy(struct deft_optimizer *opt);

/* A learning rate an optimizer takes. */
static inline bool deft_optimizer_lr_valid(double lr) { return isfinite(lr) && lr >= 0.0; }

/* Whether the flat gradients exist: the CPU sums into them, and on a GPU so do several micro-batches per update (and
 * the reference step, deft_optimizer.reference). A GPU step of one micro-batch reads each gradient where the backward
 * pass left it (ops/cuda/cuda_optimizer.cu): at once in one launch, or with clipping or loss scaling (which need the
 * norm before any update) in a pass for the norm and a pass for the update; a model's worth of memory and a write and
 * a read of it per step are saved. */
static inline bool deft_optimizer_keeps_grads(const struct deft_optimizer *opt) {
    /* The direct step (clipping without flat gradients) is AdamW's over f32 parameters: on the GPU its SGD and f64
     * variants differed from the plain kernels in the last bit, not yet explained. Loss scaling keeps the plain
     * kernels too: with it the direct step passed on an H100 once, but not since the rule changed to this one. */
    const bool direct = opt->kind == DEFT_OPTIM_ADAMW && opt->dtype == DEFT_F32 && !opt->scaler.on;
    /* ZeRO-1 receives its slice's averaged gradients in slice-sized flat gradients. */
    return opt->device.type == DEFT_CPU || opt->zero.world > 0 || opt->accumulate_steps > 1 || opt->reference ||
           (!direct && (opt->max_grad_norm > 0.0 || opt->scaler.on));
}


/* Whether the step can run in pieces during the backward pass: each update needs nothing but its own gradient (one
 * micro-batch per update, no clipping; the program must not scale its loss either, which compile checks). */
static inline bool deft_optimizer_splittable(const struct deft_optimizer *opt) {
    return !opt->part && opt->accumulate_steps == 1 && !(opt->max_grad_norm > 0.0);
}

/* Elements [*lo, *hi) of the flat storage that block b (of parameter i) covers. */
static inline void deft_optimizer_block_range(const struct deft_optimizer *w, int i, int b, int64_t *lo, int64_t *hi) {
    const int64_t start = w->offsets[i], end = i + 1 < w->n_params ? w->offsets[i + 1] : w->total;
    *lo = start + (int64_t)(b - w->block_first[i]) * w->chunk;
    *hi = *lo + w->chunk < end ? *lo + w->chunk : end;
}

/* Bytes of the flat gradients and the state (the flat parameters count as the parameters themselves); under ZeRO-1
 * the slice's (the gradients' too). A finisher stands for its whole step (a
 * program that runs the pieces runs it instead of the step node); a piece holds none. */
static inline size_t deft_optimizer_state_bytes(const struct deft_optimizer *opt) {
    if (opt->part) return opt->part->finisher ? deft_optimizer_state_bytes(opt->part->whole) : 0;
    const size_t esz = deft_dtype_size(opt->dtype);
    const size_t arrays = opt->kind == DEFT_OPTIM_ADAMW ? 2u : 1u;
    const size_t grads = deft_optimizer_keeps_grads(opt) ? (size_t)deft_optimizer_grad_count(opt) * esz : 0;
    return (size_t)deft_optimizer_state_count(opt) * esz * arrays + grads;
}

/* Whether a gradient in dtype `grad` can feed a parameter in dtype `param`: its own dtype, or for f32 weights a bf16
 * or f16 gradient. The autocast step reads the low-precision gradient of a weight itself rather than its cast back to
 * f32 (ir/autocast.c); widening on load is exact, so the update is the same bit for bit. */
static inline bool deft_optimizer_grad_dtype_ok(deft_dtype param, deft_dtype grad) {
    return grad == param || (param == DEFT_F32 && (grad == DEFT_BF16 || grad == DEFT_F16));
}

/* The optimizer whose flat storage holds parameter t (its index there in *index, when index is not NULL); NULL when
 * none does. */
struct deft_optimizer *deft_optimizer_of_param(const deft_graph *g, const deft_tensor *t, int *index);
/* The compile option param_copies (ir/autocast.h): x's persistent copy in dt (DEFT_OP_PARAM_COPY), a new node, when x
 * is an f32 parameter of an optimizer with a step node and f32 weights and dt is bf16 or f16; NULL (no error) when x
 * does not qualify, or with the graph's error when out of memory. */
deft_tensor *deft_param_copy(deft_tensor *x, deft_dtype dt);
/* The DEFT_OP_PARAM_COPY nodes that borrow opt's copy storage (flat_low, runtime/param_copies.c) let go of it, before
 * it is freed. */
void deft_optimizer_unbind_copies(struct deft_optimizer *opt);

/* Checks the n sources of a step node of opt (a whole step or a piece; a finisher's sources are the pieces' sums, not
 * checked here): one per parameter, each with the parameter's element count and a dtype deft_optimizer_grad_dtype_ok
 * accepts. DEFT_ERR_DTYPE or DEFT_ERR_INVALID naming the step node `step_name` and the parameter otherwise. */
deft_status deft_optimizer_check_grads(const struct deft_optimizer *opt, const char *step_name,
                                       deft_tensor *const *srcs, int n);

/* Where the current loss scale (one f32) lives: on the optimizer's device, once a program running its step was compiled; the
 * host's before (NULL before the step node exists).
 * A seed node of an autocast backward pass borrows it as its storage. */
void *deft_optimizer_scale_storage(struct deft_optimizer *opt);

/* ---- optimizer in backward (passes/optimizer_split.c) ---- */
/* The piece of `whole` over parameters [first, first + n), or its finisher over the pieces that split its parameters
 * at `firsts` (n_pieces entries, increasing, the first 0): one made before, or a new one; NULL with a message when out
 * of memory. */
struct deft_optimizer *deft_optimizer_piece(struct deft_optimizer *whole, int first, int n);
struct deft_optimizer *deft_optimizer_finisher(struct deft_optimizer *whole, const int *firsts, int n_pieces);
/* Parameter i's hyperparameters: its group's, or the optimizer's own (weight decay of its options, lr_scale 1). */
static inline deft_optimizer_group deft_optimizer_group_of(const struct deft_optimizer *opt, int i) {
    if (opt->groups) return opt->groups[i];
    deft_optimizer_group g;
    g.weight_decay = opt->kind == DEFT_OPTIM_SGD ? opt->sgd.weight_decay : opt->adamw.weight_decay;
    g.lr_scale = 1.0;
    return g;
}

/* Computes the blocks (chunk, n_blocks, block_first) of an optimizer once its parameters are collected. */
deft_status deft_optimizer_blocks_init(struct deft_optimizer *opt);
void deft_optimizer_parts_free(struct deft_optimizer *whole);

#ifdef __cplusplus
}
#endif
#endif
