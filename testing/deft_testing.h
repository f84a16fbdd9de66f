/* deft's test support: what the tests and benchmarks need beyond deft.h, with public types only. Built as the static
 * library deft_testing from the sources in testing/ (which may include any internal header); never installed and not
 * part of libdeft.a, so nothing here is API. Tests include only deft.h, this header and their own helpers. */
#ifndef DEFT_TESTING_H
#define DEFT_TESTING_H

#include "deft.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- what compiling decided (implemented in the library, runtime/execute.c) ---- */
/* Steps that run on their GPU's second stream, beside the main one: the weight gradients of convolutions and TF32
 * products of at least 64 MFLOP (and what only carries them to the optimizer) in a one-GPU program, which no
 * main-stream step reads before the optimizer's step. Graphs capture both streams; the compile option no_side_lane
 * keeps every step on one stream. None with optimizer_in_backward (or data parallel's pieces per bucket), a
 * memory budget or checkpointing. */
int deft_program_side_steps(const deft_program *p);
/* Products that run batched with others of their shape, as one call at the last one's step: on a GPU, products of
 * at least 64 MFLOP whose outputs are at most a wave of 128 x 128 tiles on the device (2^21 elements on 132 SMs;
 * passes/fusion_batch.c), such as an MLP's weight gradients, which nothing reads before the optimizer. Their inputs
 * live until the batch runs. None under data parallel, optimizer_in_backward, a memory budget, checkpointing or
 * no_fusion; the compile option no_product_batches turns batching off. */
int deft_program_batched_products(const deft_program *p);

/* ---- the nodes of a graph, as compiling sees them (testing_graph.c) ----
 * Op, activation and group names are those of the DOT dump ("cast", "optimizer", "act_grad", ...); asking about a
 * name that no op has aborts, so a misspelt name cannot make a check pass. */
deft_tensor *deft_testing_node(const deft_graph *g, int id);   /* node id in build order; NULL past the last */
int deft_testing_node_id(const deft_tensor *t);
deft_graph *deft_testing_graph_of(const deft_tensor *t);
const char *deft_testing_op(const deft_tensor *t);               /* its op's name */
int deft_testing_is_op(const deft_tensor *t, const char *op);   /* 1 if t's op is named op */
int deft_testing_src_count(const deft_tensor *t);
deft_tensor *deft_testing_src(const deft_tensor *t, int k);     /* input k; NULL past the last */
const int64_t *deft_testing_shape(const deft_tensor *t);        /* its deft_tensor_ndim dims */
const char *deft_testing_act(const deft_tensor *t);             /* an act_grad's activation ("relu", ...), else NULL */
int deft_testing_matmul_transposed(const deft_tensor *mm, int operand);   /* 1 if operand 0 (a) or 1 (b) is */
deft_tensor *deft_testing_view_base(const deft_tensor *t);      /* the node whose storage t's value lives in */
int deft_testing_has_device_copy(const deft_tensor *t);         /* a parameter's live value on a GPU exists */
/* Who made a node: the user, or the autocast rewrite (a cast its policy inserted, or another node of the rewritten
 * step), and for which role in a program (checkpointing's recomputations and copies, optimizer pieces). */
#define DEFT_TESTING_AUTOCAST_NONE 0
#define DEFT_TESTING_AUTOCAST_CAST 1
#define DEFT_TESTING_AUTOCAST_NODE 2
int deft_testing_autocast_mark(const deft_tensor *t);
#define DEFT_TESTING_CKPT_USER 0
#define DEFT_TESTING_CKPT_RECOMPUTE 1
#define DEFT_TESTING_CKPT_BACKWARD_COPY 2
#define DEFT_TESTING_CKPT_OPTIMIZER_PART 3
int deft_testing_ckpt_role(const deft_tensor *t);
/* A shallow copy of node t that claims to live on device d, for a kernel's refusal of mismatched devices (a machine
 * may lack the device); free it with deft_testing_node_copy_free. */
deft_tensor *deft_testing_node_copy_on(const deft_tensor *t, deft_device d);
void deft_testing_node_copy_free(deft_tensor *copy);
/* Autocast keeps the casts of inputs for the backward pass instead of recasting them (the reference of the recast). */
void deft_testing_keep_input_casts(deft_graph *g, int keep);
/* The autocast rewrite of g under (dtype, scaled, f32_grads), made if needed, and the node standing in it for the
 * user's t (NULL when none). */
typedef struct deft_autocast deft_testing_autocast;
deft_status deft_testing_autocast_get(deft_graph *g, deft_dtype dtype, int scaled, int f32_grads,
                                      deft_testing_autocast **out);
deft_tensor *deft_testing_autocast_map(const deft_testing_autocast *ac, const deft_tensor *t);
/* The node standing for the user's t in g's latest autocast rewrite (the one a compile just made or reused), NULL
 * when g has none or it has no counterpart for t. */
deft_tensor *deft_testing_autocast_latest(const deft_graph *g, const deft_tensor *t);

/* ---- builders of the ops only the backward pass makes (implemented in the library, ir/) ---- */
/* dy * act'(x), for y = act(x) with act "relu", "gelu", "gelu_tanh", "silu", "tanh" or "sigmoid" (testing_graph.c). */
deft_tensor *deft_testing_act_grad(const char *act, deft_tensor *dy, deft_tensor *x);
deft_tensor *deft_expand(deft_tensor *a, int ndim, const int64_t *shape);
deft_tensor *deft_slice_grad(deft_tensor *dy, const deft_tensor *slice);
deft_tensor *deft_cross_entropy_grad(deft_tensor *dloss, deft_tensor *logits, deft_tensor *targets);
/* cross-entropy with a loss of loss_dtype (the logits' or f32), as autocast builds it (ir/build_train.c) */
deft_tensor *deft_cross_entropy_as(deft_tensor *logits, deft_tensor *targets, const deft_cross_entropy_options *o,
                                   deft_dtype loss_dtype);
/* layer norm with its value in out_dtype (x's, or bf16/f16 from f32 x), as autocast builds it
 * (ir/build_layer_norm.c) */
deft_tensor *deft_layer_norm_as(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, double eps,
                                deft_dtype out_dtype);
deft_tensor *deft_conv2d_input_grad(deft_tensor *dy, const deft_tensor *conv);
deft_tensor *deft_conv2d_weight_grad(deft_tensor *dy, const deft_tensor *conv);
deft_tensor *deft_pool2d_grad(deft_tensor *dy, const deft_tensor *pool);
/* attention's gradient node (dq, dk, dv stacked) of the attention node attn, for its output gradient dout */
deft_tensor *deft_attention_grad(deft_tensor *dout, const deft_tensor *attn);
/* Where node t's per-row statistics (attention's log-sum-exp, its gradient's scratch) start in its buffer, in bytes,
 * and the buffer's whole size (testing_kernels.c). */
size_t deft_testing_node_extra_offset(const deft_tensor *t);
size_t deft_testing_node_buffer_bytes(const deft_tensor *t);

/* ---- random numbers: value i of stream seed, as every creation kernel draws it (testing_graph.c) ---- */
double deft_testing_rng_uniform01(uint64_t seed, uint64_t i);
double deft_testing_rng_normal(uint64_t seed, uint64_t i);

/* ---- compiled programs (testing_program.c) ---- */
/* deft_compile, returning its status (implemented in the library). */
deft_status deft_compile_into(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                              const deft_compile_options *opts, deft_program **out);
deft_graph *deft_testing_program_graph(const deft_program *p);           /* the graph p was compiled from */
deft_tensor *deft_testing_step_node(const deft_program *p, int step);   /* the node run at step; NULL past the last */
/* The fusion pairs' move (passes/fusion_internal.h's deft_steps_defer_readers) on p's steps: the steps after
 * early_step up to late_step that read early_step's node go to just after late_step; *moved 0 where they may not
 * (late_step reads one, or a step between updates state). For a program stopped at "schedule" or later; it leaves
 * the plan stale, so the program is only looked at afterwards. */
deft_status deft_testing_defer_readers(deft_program *p, int early_step, int late_step, int *moved);
/* Where node t's value lives in p. */
#define DEFT_TESTING_PLACE_NONE 0         /* not computed by p */
#define DEFT_TESTING_PLACE_PERSISTENT 1   /* input, parameter or constant storage */
#define DEFT_TESTING_PLACE_ARENA 2        /* a planned range of the device's arena */
#define DEFT_TESTING_PLACE_VIEW 3         /* aliases another node's storage */
#define DEFT_TESTING_PLACE_FUSED 4        /* computed inside a fused kernel and never stored */
typedef struct deft_testing_node_plan {
    int place;               /* DEFT_TESTING_PLACE_* */
    int step;                /* position in the schedule, -1 if not scheduled */
    size_t offset, size;     /* arena range of its buffer (for views: the base's buffer, offset included) */
    int first, last;         /* lifetime of its buffer in steps */
    int buffer;              /* its buffer's index (nodes that ran in place, and views, share one); -1 if none */
    int is_output;
    int group;               /* the fused group computing it, -1 if none */
    const char *group_kind;  /* that group's kind ("elementwise", "matmul", "norm", "casts", "norm_grad",
                              * "matmul_batch"), NULL if none */
    int dropped;             /* checkpointing: its saved value is dropped after the forward pass */
    int recompute;           /* checkpointing: it is a recomputation of a dropped value */
    int side;                /* its step runs on the GPU's side lane */
} deft_testing_node_plan;
void deft_testing_program_node_plan(const deft_program *p, const deft_tensor *t, deft_testing_node_plan *out);
/* Optimizer steps split into pieces (optimizer in backward, or data parallel's pieces per bucket). */
typedef struct deft_testing_split {
    int n_before, n_after;   /* the graph's nodes before and after the rewrite */
    const int *redirect;     /* n_after entries: for an output, the node the program computes it by, or -1 */
    int n_steps;             /* step nodes split */
    int n_pieces;            /* pieces made, over all of them */
    int per_bucket;          /* data parallel: pieces per gradient bucket */
    const int *bucket_of;    /* per_bucket: per node from n_before on, the bucket of a piece, or -1 */
    void *owned;             /* deft_testing_optimizer_split's record, freed by deft_testing_split_free */
} deft_testing_split;
/* What p's rewrite split: 0 (and *out zeroed) when it split nothing. */
int deft_testing_program_split(const deft_program *p, deft_testing_split *out);
/* The rewrite alone, as compile runs it (no checkpointing redirect, no owner): *made 0 when no output is a step or
 * the step stays whole. */
deft_status deft_testing_optimizer_split(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                                         const deft_compile_options *opts, deft_testing_split *out, int *made);
/* Frees the record and, when they are still the graph's last nodes, the nodes it made. */
void deft_testing_split_free(deft_graph *g, deft_testing_split *s);
int deft_testing_split_per_bucket(const deft_compile_options *o);   /* whether the options split per bucket */

/* ---- optimizers (testing_program.c) ---- */
int deft_testing_optimizer_param_count(const deft_optimizer *o);
deft_tensor *deft_testing_optimizer_param(const deft_optimizer *o, int i);   /* in flat order; NULL past the last */
/* The optimizer a step node runs (a whole step, a piece or a finisher), NULL for any other node. */
deft_optimizer *deft_testing_step_optimizer(const deft_tensor *t);
/* For a piece or finisher of a split step: the whole optimizer, its first parameter's index there and whether it
 * is the finisher; NULL for an optimizer that is no part (the pointers may be NULL). */
deft_optimizer *deft_testing_optimizer_part(const deft_optimizer *o, int *first_param, int *finisher);
int deft_testing_optimizer_gather_tables(const deft_optimizer *o);   /* gather tables registered (GPU) */
/* The flat storage: array 0 holds the parameters' values, 1 (and 2 for AdamW) the per-element state; each is
 * deft_testing_optimizer_array_bytes long. deft_testing_optimizer_read copies one to host after the queued steps. */
int deft_testing_optimizer_arrays(const deft_optimizer *o);
size_t deft_testing_optimizer_array_bytes(const deft_optimizer *o);
deft_status deft_testing_optimizer_read(const deft_optimizer *o, int array, void *host, size_t bytes);
/* ZeRO-1's sharding of o (all zero when it is not sharded): its world and rank, the slice [lo, hi) of the flat storage
 * padded to `padded` elements (o's parameters hold `total`), the bytes of its state arrays as allocated (AdamW's two
 * moments, SGD's momentum buffer: the slice's under ZeRO-1, the whole storage's otherwise), of its flat gradients as
 * allocated (0: none; the slice's under ZeRO-1), and what the planner counts for the step (the state and the flat
 * gradients). deft_testing_optimizer_read reads the
 * slice of a state array of a sharded optimizer: (hi - lo) elements. */
typedef struct deft_testing_zero {
    int world, rank;
    int64_t lo, hi, padded, total;
    size_t state_bytes, planned_bytes;
    size_t grad_bytes;
} deft_testing_zero;
void deft_testing_optimizer_zero(const deft_optimizer *o, deft_testing_zero *out);
/* ZeRO-1's arithmetic without GPUs (testing/testing_zero.c), on a shallow copy of o (built, on any device, sharded or
 * not; o is left alone and nothing is queued): *out as deft_testing_optimizer_zero would report o sharded as rank
 * `rank` of `world` (the bytes those the sharded optimizer would allocate and plan), and the reduces a replica of
 * that rank would queue for parameter `param`'s gradient held in dtype dt, built by the replica's own code (dist/dist_zero.c's deft_zero_reduces_new): up to max of them into
 * pieces. Returns how many there are, -1 (with the error) for a bad world, rank or param, or a gradient not in o's
 * dtype (DEFT_ERR_DTYPE: the reduces land in the flat gradients as they are). */
typedef struct deft_testing_zero_piece {
    int root;                 /* the rank the piece is averaged into */
    int64_t start, count;     /* its elements of the flat storage */
    size_t send_offset;       /* its first byte in the gradient */
    size_t dest_offset;       /* on the root: its first byte there; (size_t)-1 on the other ranks */
} deft_testing_zero_piece;
int deft_testing_zero_plan(const deft_optimizer *o, int world, int rank, int param, deft_dtype dt,
                           deft_testing_zero *out, deft_testing_zero_piece *pieces, int max);
/* ZeRO-1 with param_copies (runtime/zero_f32.c), without GPUs: which of o's parameters p reads in f32, into reads
 * (o's parameter count of them), and the pieces their f32 values are broadcast in from their owners when o is
 * sharded as rank `rank` of `world` (on a shallow copy; o is left alone): up to max into pieces (start and count;
 * the offsets (size_t)-1). Returns how many pieces there are, -1 with the error for a bad world or rank. */
int deft_testing_zero_f32_plan(const deft_program *p, const deft_optimizer *o, int world, int rank, bool *reads,
                               deft_testing_zero_piece *pieces, int max);
/* o's f32 values made partial as a sharded step with copies leaves them, current only for the parameters flagged in
 * f32_param (o's parameter count of flags), whatever o's device: the refusals can then be driven on the CPU.
 * f32_param NULL: whole again (what deft_dist_gather_params leaves). */
deft_status deft_testing_zero_partial(deft_optimizer *o, const bool *f32_param);
/* Checks the n sources of a step node of o as building one does (implemented in the library, ir/optimizer.c). */
deft_status deft_optimizer_check_grads(const deft_optimizer *opt, const char *step_name, deft_tensor *const *srcs,
                                       int n);

/* ---- data parallel (implemented in the library, dist/) ---- */
/* The gate deft_dist_run's replicas pass before and after queuing each collective (dist/dist_gate.c), passed by
 * `threads` threads `passes` times each (testing_gate.c). Thread `quitter` (-1: none) stops before its pass
 * quit_after: it leaves the gate as a replica whose run failed, or with `stuck` neither arrives nor leaves until the
 * others are done, which then fail past timeout_s. */
typedef struct deft_testing_gate_case {
    int threads, passes, quitter, quit_after, stuck;
    double timeout_s;
} deft_testing_gate_case;
typedef struct deft_testing_gate_result {
    int early_passes;            /* passages a thread got through before every replica still in the run arrived */
    int passed[16];              /* the passes each thread got through */
    deft_status status[16];
    char message[16][256];       /* a failed thread's message */
} deft_testing_gate_result;
/* 0 when the threads ran (whatever the gate answered), -1 for a case out of range (at most 16 threads and 256
 * passes) or threads that could not start. */
int deft_testing_gate(const deft_testing_gate_case *c, deft_testing_gate_result *out);

/* The replica's buckets in the order they were cut: their bytes and the step each joins back before, into
 * bytes[0 .. max) and joins[0 .. max) (either may be NULL). The number of buckets, -1 when p is not a replica. */
int deft_ddp_bucket_layout(const deft_program *p, size_t *bytes, int *joins, int max);
int deft_ddp_packed_buckets(const deft_program *p);   /* buckets packed into one buffer; -1: not a replica */
/* The buckets of sharded optimizers' gradients (ZeRO-1), in the order they were cut: their bytes, the step after which
 * their reduces are queued (-1: before the first), the step they join back before and their ncclReduce calls (0 in a
 * world of one), into the first max entries (any may be NULL). Their number, -1 when p is not a replica. */
int deft_ddp_zero_buckets(const deft_program *p, size_t *bytes, int *ready, int *joins, int *pieces, int max);
/* Rank 0 publishes `bytes` of `blob`, the others wait for them ("file:PATH" or "tcp:HOST:PORT"). */
deft_status deft_rendezvous(const char *spec, int rank, int world, void *blob, size_t bytes, double timeout_s);
double deft_dist_now(void);   /* seconds on a monotonic clock */
/* The packing kernels: bytes[i] of tensors[i] to packed + offsets[i], or back (unpack); CUDA builds only. */
deft_status deft_cuda_dist_pack(void *const *tensors, const size_t *offsets, const size_t *bytes, int n, void *packed,
                                int unpack, void *stream);
/* The gradient buckets of optimizer step node `step` under o's limits (testing_program.c). */
typedef struct deft_testing_buckets {
    int n;               /* the step's parameters */
    const int *order;    /* parameter indices, in the order their gradients become ready */
    int n_buckets;
    const int *first;    /* n_buckets + 1 entries: bucket b is order[first[b] .. first[b + 1]) */
    const size_t *bytes; /* per bucket */
    void *owned;
} deft_testing_buckets;
deft_status deft_testing_grad_buckets(const deft_tensor *step, const deft_compile_options *o,
                                      deft_testing_buckets *out);
void deft_testing_grad_buckets_free(deft_testing_buckets *b);

/* ---- the planner and the schedule's order, on plain lists (testing_plan.c) ---- */
#define DEFT_TESTING_PLAN_ALIGN 256   /* offsets and sizes are multiples of this */
typedef struct deft_testing_plan_buffer {
    size_t size;      /* bytes asked for */
    int first, last;  /* steps of its first write and last read */
    size_t offset;    /* out: where it lives in the arena */
} deft_testing_plan_buffer;
typedef struct deft_testing_plan_stats {
    size_t arena_bytes, lower_bound, no_reuse_bytes;
} deft_testing_plan_stats;
/* The planner on n buffers: offsets such that no two buffers live at one step overlap (no_reuse: none shared). */
deft_status deft_testing_plan(deft_testing_plan_buffer *bufs, int n, int no_reuse, deft_testing_plan_stats *stats);
typedef struct deft_testing_order_step {
    size_t bytes;             /* what the step's output occupies until its last reader (0: nothing) */
    int keep_alive;           /* 1: the output lives to the end */
    int dep_begin, dep_end;   /* its inputs: deps[dep_begin .. dep_end) are indices of earlier steps */
} deft_testing_order_step;
/* A topological order of the n steps that keeps the peak of live bytes low (compile option reorder). */
deft_status deft_testing_schedule_order(const deft_testing_order_step *steps, int n, const int *deps, int *order);
/* The waits between a program's lanes (GPU streams 0 .. n-1, the host n), apart from any stream. */
typedef struct deft_testing_hazards deft_testing_hazards;
typedef struct deft_testing_range {
    int mem;                 /* the lane owning the memory */
    uintptr_t lo, hi;        /* bytes [lo, hi) */
    int write;
} deft_testing_range;
deft_testing_hazards *deft_testing_hazards_new(int n_lanes);   /* reset for a run; NULL when out of memory */
void deft_testing_hazards_reset(deft_testing_hazards *h, int n_lanes);
void deft_testing_hazards_free(deft_testing_hazards *h);     /* frees its record (h stays, to be looked at) */
void deft_testing_hazards_delete(deft_testing_hazards *h);   /* frees h */
/* The record of this run's accesses of lanes to memory not their own: how many, its capacity, and whether it holds
 * storage (either pointer may be NULL). */
int deft_testing_hazards_foreign(const deft_testing_hazards *h, int *capacity, int *stored);
int64_t deft_testing_hazards_seen(const deft_testing_hazards *h, int lane, int k);   /* k's count when lane waited */
uint32_t deft_testing_hazards_waits(const deft_testing_hazards *h, int lane, const deft_testing_range *r, int nr);
uint32_t deft_testing_hazards_waits_upto(const deft_testing_hazards *h, int lane, const deft_testing_range *r, int nr,
                                         int64_t *upto);
void deft_testing_hazards_waited(deft_testing_hazards *h, int lane, int k);
void deft_testing_hazards_waited_upto(deft_testing_hazards *h, int lane, int k, int64_t at);
deft_status deft_testing_hazards_queued(deft_testing_hazards *h, int lane, const deft_testing_range *r, int nr);

/* ---- memory below deft.h (implemented in the library, mem/; event hooks in testing_memory.c) ---- */
deft_status deft_caching_alloc(deft_device d, size_t bytes, void *stream, const char *tag, void **out);
deft_status deft_caching_free(deft_device d, void *ptr);
deft_status deft_caching_record_stream(deft_device d, void *ptr, void *stream);
deft_status deft_caching_check(deft_device d);   /* every invariant of d's pool */
deft_status deft_pinned_check(void);             /* every invariant of the pinned pool */
/* How a pool learns that a stream has passed a point; tests swap in their own to see blocks that wait. */
typedef struct deft_testing_event_hooks {
    deft_status (*record)(int index, void *stream, void **event);
    int (*query)(int index, void *event);
    void (*wait)(int index, void *event);
    void (*destroy)(int index, void *event);
} deft_testing_event_hooks;
/* Replaces the hooks of every pool of `type` (NULL: the default); DEFT_ERR_STATE while a block waits on old ones. */
deft_status deft_testing_caching_set_event_hooks(deft_device_type type, const deft_testing_event_hooks *hooks);
deft_status deft_testing_pinned_set_event_hooks(const deft_testing_event_hooks *hooks);
deft_status deft_mem_copy(deft_device dst_dev, void *dst, deft_device src_dev, const void *src, size_t bytes);
deft_status deft_device_synchronize(deft_device d);
deft_status deft_cuda_name(int index, char *buf, size_t n);
deft_status deft_cuda_alloc(int index, size_t bytes, void **out);
void deft_cuda_free(int index, void *ptr);
/* kind: 0 host->device, 1 device->host, 2 device->device. */
deft_status deft_cuda_copy(int dst_index, void *dst, int src_index, const void *src, size_t bytes, int kind);
deft_status deft_cuda_synchronize(int index);
deft_status deft_cuda_set_device(int index);
/* The copy stream of a GPU that asynchronous feeds use. */
deft_status deft_prefetch_cuda_copy_stream(int device, void **stream);

/* ---- CUDA kernels, called directly (implemented in the library, ops/cuda/; wrappers in testing_kernels.c) ---- */
#define DEFT_CUDA_ALLOW_TF32 1u      /* f32 matmuls may use TF32 tensor cores */
#define DEFT_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)
#define DEFT_CUDNN_WORKSPACE_BYTES ((size_t)64 << 20)
#define DEFT_CUBLAS_SIDE_WORKSPACE_BYTES ((size_t)4 << 20)
#define DEFT_CUDNN_SIDE_WORKSPACE_BYTES ((size_t)16 << 20)
/* The caps above bound a stream's cuBLAS and cuDNN scratch, which holds what the algorithms chosen on it asked for
 * (mem/cuda_workspace.h). A plain cuBLAS call (f64 products, DEFT_DEBUG_MATMUL_REFERENCE) asks for cuBLAS's
 * recommendation on cuda:device, cut to the stream's cap: 32 MiB from compute capability 9 on, 4 MiB before; 0
 * without CUDA. */
size_t deft_testing_cublas_floor(int device);
/* Of every stream of p on cuda:device (its main stream, and its side lane's), the library scratch held now (asked =
 * 0), or the largest each kind's chosen algorithms asked for outside a capture (asked = 1), summed over cuBLAS's,
 * cuDNN's and batch norm's; 0 before the first run and without CUDA. */
size_t deft_testing_program_workspace(const deft_program *p, int device, int asked);
#define DEFT_MM_BATCH_MAX 12
/* Runs node n with device pointers, enqueued on `stream` (a cudaStream_t); flags: DEFT_CUDA_ALLOW_TF32. */
deft_status deft_cuda_run_node(const deft_tensor *n, void *out, const void *const *in, void *stream, unsigned flags);
/* The next kernel launch check reports cuda_error (a cudaError_t) as if that launch had failed, once. */
void deft_cuda_fail_next_launch(int cuda_error);
/* Gives back the library scratch (cuBLAS, cuDNN) that kernels run on a stream the test made took for it: call it
 * before destroying the stream, as programs do for theirs (CUDA builds only). */
void deft_stream_workspaces_release(int dev, void *stream);
/* cuDNN's fused attention (ops/cuda/cuda_kernels.h says what each does; CUDA builds only). st is a cudaStream_t. */
#define DEFT_CUDA_DETERMINISTIC 2u
#define DEFT_CUDNN_ATTENTION_REFUSED DEFT_ERR_DEVICE
struct CUstream_st;
bool deft_cudnn_attention_usable(const deft_tensor *n);
deft_status deft_cudnn_attention(const deft_tensor *n, void *out, const void *const *in, struct CUstream_st *st);
deft_status deft_cudnn_attention_flags(const deft_tensor *n, void *out, const void *const *in, struct CUstream_st *st,
                                       unsigned flags);
int deft_cudnn_attention_describe(const deft_tensor *n, unsigned flags, char *buf, size_t cap);
void deft_cudnn_attention_release(int dev);
deft_status deft_cuda_attention_own(const deft_tensor *n, void *out, const void *const *in, struct CUstream_st *st);
/* Matmuls with a cuBLASLt epilogue. */
#define DEFT_TESTING_MM_NONE 0
#define DEFT_TESTING_MM_BIAS 1        /* out[m, n] = (a b)[m, n] + bias[n] */
#define DEFT_TESTING_MM_BIAS_RELU 2   /* out[m, n] = max((a b)[m, n] + bias[n], 0) */
#define DEFT_TESTING_MM_BGRAD_B 3     /* out = a b, and bias_grad[n] = sum over k of op(b)[k, n] */
typedef struct deft_testing_mm_epilogue {
    int kind;              /* DEFT_TESTING_MM_* */
    const void *bias;
    void *bias_grad;
} deft_testing_mm_epilogue;
int deft_testing_matmul_fusable(const deft_tensor *mm, int kind, unsigned flags);
deft_status deft_testing_matmul_fused(const deft_tensor *mm, void *out, const void *a, const void *b,
                                      const deft_testing_mm_epilogue *ep, void *stream, unsigned flags);
/* Products of one shape as one call (1 .. DEFT_MM_BATCH_MAX parts). */
typedef struct deft_testing_mm_part {
    const deft_tensor *mm;
    void *out;
    const void *a, *b;
    void *bias_grad;         /* NULL, or receives the bias gradient as DEFT_TESTING_MM_BGRAD_B */
} deft_testing_mm_part;
deft_status deft_testing_matmul_batch(const deft_testing_mm_part *parts, int n, void *stream, unsigned flags);
/* The kernels' flag of the compile option matmul_find: cuBLASLt's candidate algorithms timed. */
#define DEFT_CUDA_MATMUL_FIND 32u
/* Of the product problems met so far in the process under matmul_find: how many were chosen by timing cuBLASLt's
 * candidates, and how many kept the heuristic's first (their first call accumulated, or its output overlapped an
 * operand, or no candidate ran); both 0 without CUDA. */
void deft_testing_matmul_find_counts(int64_t *timed, int64_t *kept);
/* A fused elementwise kernel of one relu over `numel` elements of an input stored in input_dtype, to f32, with
 * NULL pointers: what the kernel says of a description it refuses before anything runs. */
deft_status deft_testing_fused_relu(deft_dtype input_dtype, int64_t numel);
/* The groups of classes a thread of cross-entropy's GPU register kernels holds for rows of `classes` logits of that
 * dtype: 0 where the plain kernels (re-reading the row each pass) run, the CE_REFERENCE knob included; -1 without
 * CUDA. */
int deft_testing_ce_regs_groups(deft_dtype logits, int64_t classes);
/* 1 where cross-entropy's streaming GPU kernels (rows through shared memory, taken before the register kernels) take
 * rows of `classes` logits of that dtype on the current device, given 16-byte aligned buffers; 0 where they do not
 * (the CE_REFERENCE knob included); -1 without CUDA. */
int deft_testing_ce_streams(deft_dtype logits, int64_t classes);

/* ---- debug knobs ---- */
/* The library's debug knobs (base/config.h), which send kernels down their reference paths so that a test can compare
 * two paths on the same data. Each starts from the environment (DEFT_<NAME>) and keeps what is set here for every
 * later launch, on every thread. Names, without the DEFT_ prefix (which is also accepted):
 *   MATMUL_REFERENCE   1: every product takes the reference cuBLAS path (no cuBLASLt, no batched call)
 *   BN_REFERENCE       1: batch norm takes its plain kernels
 *   POOL_REFERENCE     1: pooling takes its plain kernels
 *   FUSED_REFERENCE    1: fused elementwise chains run one element per thread, never vectorised
 *   CONV_GEMM_PLAIN    nonzero: the im2col of convolutions as products takes its plain kernel
 *   CONV_GEMM_ROWS     > 0: convolutions as products cut their rows into chunks of at most this many
 *   ATTENTION_KERNEL   attention on a GPU: 0 the fastest that takes it, 1 the plain kernels, 2 deft's tensor-core
 *                      kernels, 3 cuDNN's fused attention (2 and 3 fall back to the plain kernels where they refuse)
 *   SHAPE_REFERENCE    1: permutes, strided slices and concats on a GPU copy one element per thread (no row copies)
 *   SLICE_GRAD_ADDS    1: backward sums the zero-padded gradients of slices of one tensor, as it did before it
 *                      joined them into one concat (read when deft_backward runs)
 *   LN_WIDE            1: autocast keeps a layer norm's f32 value and casts it to bf16/f16 for the products that
 *                      read it, rather than writing it in bf16/f16 directly (read when the rewrite is made)
 *   LN_REFERENCE       1: layer norm on a GPU takes its plain kernels (each pass re-reads the row; the weight and
 *                      bias gradients sum 32 columns a block)
 *   CE_REFERENCE       1: cross-entropy on a GPU takes its plain block kernels (each pass re-reads the row), never
 *                      the ones that hold a row in registers
 * DEFT_ERR_INVALID for a name that is no knob. */
deft_status deft_testing_set_debug(const char *name, int64_t value);
/* The knob's value now (0 for a name that is no knob). */
int64_t deft_testing_debug(const char *name);

#ifdef __cplusplus
}
#endif
#endif
