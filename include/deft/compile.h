/* Compiling and running (included by deft.h): options, programs, feeding and reading, plans and their reports. */
#ifndef DEFT_PUBLIC_COMPILE_H
#define DEFT_PUBLIC_COMPILE_H

#include "deft/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- compiling and running ---- */
/* Dynamic loss scaling under f16 autocast, as torch.cuda.amp.GradScaler: the backward pass starts from the current
 * scale instead of 1; the optimizer's step unscales the gradients, and when any of them is inf or NaN it skips the
 * update and multiplies the scale by backoff_factor; after growth_interval clean updates in a row it multiplies it by
 * growth_factor. All of it runs inside the step (on a GPU, on the device: a CUDA Graph replay never waits on the
 * host). Zero fields take GradScaler's defaults. */
typedef struct deft_loss_scale_options {
    int disable;               /* 1: no loss scaling (the backward pass starts from 1) */
    double init_scale;         /* 0: 65536; else finite, > 0 and at most FLT_MAX */
    double growth_factor;      /* 0: 2; else finite and > 1 */
    double backoff_factor;     /* 0: 0.5; else in (0, 1) */
    int growth_interval;       /* 0: 2000; else >= 1 */
} deft_loss_scale_options;

typedef struct deft_compile_options {
    size_t memory_budget;      /* 0: no budget */
    int no_reuse;              /* 1: every buffer gets its own arena range (for checking the planner) */
    int reorder;               /* 1: reorder independent nodes to lower the peak (kept only when the final arena,
                                * planned through every later stage, shrinks) */
    int no_cuda_graphs;        /* 1: run every step eagerly, never as a CUDA Graph replay (for debugging) */
    int tf32;                  /* 1: f32 matmuls on a GPU may use TF32 tensor cores (10-bit mantissa products, f32
                                * accumulation), as torch.backends.cuda.matmul.allow_tf32; the CPU is unaffected */
    int deterministic;         /* 1: convolutions and attention's backward on a GPU take only the kernels that give
                                * the same bits on every run (as torch.backends.cudnn.deterministic and
                                * torch.use_deterministic_algorithms), so that the same program on the same inputs
                                * gives the same bits on every run; the default lets cuDNN choose kernels that sum
                                * weight gradients (and attention's dq) with atomics, a few ulps apart run to run */
    int no_fusion;             /* 1: every node runs as its own kernel (no fused elementwise chains, matmul or batch
                                * norm epilogues, or ReLU gradients folded into batch norm's backward), for
                                * debugging and for measuring what fusion gives */
    int checkpoint;            /* a deft_checkpoint_policy: which forward values to drop and recompute (below) */
    int checkpoint_segments;   /* DEFT_CHECKPOINT_SEGMENTS: the number of segments; 0: sqrt(forward matmuls and convs) */
    /* Mixed precision, as torch.autocast: DEFT_BF16 or DEFT_F16; 0 (DEFT_F32) is off and compiles the graph as built.
     * Compiling appends to the graph, once per policy, a rewritten step: matmuls take their f32 inputs cast to the
     * low precision (f32 accumulation) and give a low-precision result; bias adds (a parameter added to a low
     * tensor), activations and shape ops keep the low precision; reductions, softmax, exp/log/pow/rsqrt, losses and
     * anything mixing a low tensor with a computed f32 one run in f32. Parameters stay f32 (the master weights):
     * each is cast once per step by one node that every use, forward and backward, reads. The backward pass is
     * derived again from the rewritten loss, and the optimizer's step reads its gradients (f32). The program is read
     * and fed through the tensors of the graph as built: an output that became low precision is cast back to its
     * dtype. The user's tensors themselves are not computed (deft_program_schedules says 0, the DOT dump draws them
     * dashed beside the rewritten nodes, named "<name>@bf16"); inserted casts are drawn with the label "autocast". */
    deft_dtype autocast;
    deft_loss_scale_options loss_scale;   /* f16 autocast only (other policies refuse options set here) */
    /* 1 (with autocast): each parameter an optimizer updates is read, wherever autocast would cast it to the low
     * precision, from a persistent copy in that precision that the optimizer keeps beside its f32 master weights and
     * writes in the same pass as each update (rounded as the cast rounds, so every value is the same bit for bit),
     * instead of a cast in every step's forward pass (and again in its backward pass). The copies hold 2 bytes per
     * parameter for as long as the optimizer lives (deft_memory_report's persistent_bytes counts them); writing the
     * parameters between steps (deft_param_set, loading) has them written again before the next run. Refused without
     * autocast (DEFT_ERR_INVALID). With zero_stage 1 the step all-gathers the copies instead of the f32 parameters
     * and leaves the f32 values the replica does not read current on their owner only, until
     * deft_dist_gather_params (deft/dist.h). One optimizer keeps copies in one dtype (a program of the
     * other policy is DEFT_ERR_STATE), made by the first program that steps or reads it: while a live program
     * compiled without param_copies steps the optimizer (its captured step would write no copy), a program with it
     * is DEFT_ERR_STATE naming that step. */
    int param_copies;
    /* 1: optimizer in backward. Each optimizer step asked for runs in pieces, one per group of parameters that become
     * ready together (a layer's weight and bias), each placed right after the last step that computes one of its
     * gradients or reads one of its parameters, so every gradient's buffer dies there instead of living to the end of
     * the backward pass (the arena's peak drops by about the model's gradient bytes on a deep network). A finisher
     * adds the pieces' sums into the step's value (the norm) and advances the counters once: parameters, norms and
     * counters are bit-identical to the one-node step, on the CPU and on a GPU, eager or replayed, with or without
     * checkpointing. Needs one micro-batch per update and no clipping (accumulate_steps <= 1, max_grad_norm 0), no
     * f16 loss scaling, and no node of the program reading the step's value or a parameter after the step: anything
     * else is DEFT_ERR_INVALID at compile. */
    int optimizer_in_backward;
    /* Data parallel (deft_dist, below): a replica of a training step on one of `dist`'s ranks, NULL: none. */
    struct deft_dist *dist;
    int dist_local;            /* which of dist's communicators (0 .. deft_dist_local_count - 1) it uses */
    size_t bucket_bytes;       /* gradients all-reduced together, at most this many bytes per bucket; 0: 8 MiB */
    /* The bucket completed last (the first layers' gradients, produced at the end of the backward pass; its
     * all-reduce is the one nothing overlaps): at most this many bytes, but at least one gradient; 0: 1 MiB. */
    size_t last_bucket_bytes;
    /* 1: under dist the optimizer's update runs in pieces, one per bucket (its parameters, one fused launch, or one
     * per run of them consecutive in the optimizer's storage), in bucket order after the backward pass: each waits
     * for its own bucket only, so the updates of the earlier buckets run while the last all-reduce is in flight; a
     * finisher adds the norm and advances the counters (the parameters are bit-identical to the one-node step). A
     * step that accumulates, clips, scales an f16 loss, is read by the program or shares the program with another
     * step stays one node. Off by default: the mid MLP's steps were slower in pieces at every GPU count (their
     * launches and events cost more than the overlap gives; bench/RESULTS.md, "Sixth round", data parallel); the one
     * node waits for every bucket. */
    int dist_bucket_pieces;
    /* ZeRO stage under dist: 0 (plain data parallel: every rank holds the whole optimizer state) or 1 (the
     * optimizer's state is sharded: each rank updates one 1 / world slice of the parameters from that slice's
     * averaged gradients, reduced to it in buckets during the backward pass, and the slices are all-gathered back,
     * inside the step; dist/dist_zero.c). */
    int zero_stage;
    /* Under dist with bf16 autocast: the dtype the gradients are averaged in. 0 (or DEFT_F32): f32, as PyTorch's DDP
     * averages them (each weight's bf16 gradient is cast up first). DEFT_BF16: the weights' bf16 gradients are
     * averaged as they are (half the bytes on the wire, no casts; NCCL's average in bf16), as DDP's
     * bf16_compress_hook or FSDP's reduce_dtype; the optimizer widens them on load. Gradients that are f32 anyway (a
     * layer norm's, an embedding table's) stay f32. Refused without dist and bf16 autocast, and with zero_stage 1
     * (DEFT_ERR_INVALID). */
    deft_dtype dist_reduce_dtype;
    /* Switches for measuring what one GPU optimisation gives; zero keeps today's behaviour. */
    int no_side_lane;          /* 1: weight-gradient work never runs on a GPU's second stream (the side lane) */
    int no_product_batches;    /* 1: products of one shape never run as one batched cuBLASLt call */
    int no_relu_grad_fold;     /* 1: a ReLU's gradient is never folded into batch norm's backward kernel */
    int fuse_low_precision;    /* 1: bf16 and f16 elementwise chains are fused too (by default only f32 ones are) */
    int conv_gemm;             /* a deft_conv_gemm_mode (below): which convolutions run as im2col and cuBLASLt
                                * products instead of cuDNN; 0: the bf16 and f16 ones */
    int cudnn_find;            /* 1: cuDNN measures the candidate algorithms once per shape (outside a capture)
                                * instead of taking its heuristic's first choice */
    int matmul_find;           /* 1: cuBLASLt's candidate algorithms for each product shape are timed once
                                * (outside a capture, on the product's own operands) and the fastest kept; 0
                                * (default): the heuristic's first. A timed choice may differ from process to
                                * process, and with it the rounding of the products (`deterministic` promises the
                                * same bits only without it) */
    /* 1: keep every forward value the backward pass reads, also those that one pass over memory makes again from a
     * value it keeps anyway (an activation such as GELU, whose input its gradient reads; a cast; a permute; a layer norm, whose input its
     * gradient reads). By
     * default every checkpoint policy, DEFT_CHECKPOINT_NONE included, drops those and recomputes them where the
     * backward pass reads them, as torch.compile's partitioner does: one memory-bound kernel each, for the bytes of
     * a second copy (deft_program_checkpoint counts them as dropped and recomputed). */
    int no_cheap_recompute;
    /* The stage of the compile pipeline to stop after (deft_compile_stage_name, below); NULL: every stage. A program
     * stopped early is for looking at: deft_program_print_plan, deft_graph_dump_dot and the reports show it as that
     * stage left it, but it holds no memory and deft_program_run, _feed and _read refuse it (DEFT_ERR_STATE). A name
     * that is no stage is DEFT_ERR_INVALID, and the message lists the stages. */
    const char *stop_after;
} deft_compile_options;
/* Which NHWC convolutions (forward and weight gradient) run as im2col and cuBLASLt products (one per chunk of rows)
 * instead of cuDNN: only those of one group, fewer than 8 input channels (a network's stem) and windows of at most
 * 1024 elements, whose columns fit the stream's cuDNN workspace. */
typedef enum deft_conv_gemm_mode {
    DEFT_CONV_GEMM_DEFAULT = 0,   /* bf16 and f16 ones */
    DEFT_CONV_GEMM_NEVER,         /* none: cuDNN runs every convolution */
    DEFT_CONV_GEMM_WITH_F32       /* f32 ones too */
} deft_conv_gemm_mode;
#define DEFT_HAS_OPTIMIZER_IN_BACKWARD 1
#define DEFT_HAS_AUTOCAST_OPTION 1
#define DEFT_HAS_PARAM_COPIES 1

#define DEFT_HAS_TF32_OPTION 1
#define DEFT_HAS_NO_CUDA_GRAPHS_OPTION 1

/* Compiles the nodes that `outputs` need (and nothing else). opts may be NULL. */
deft_program *deft_compile(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                           const deft_compile_options *opts);
/* The compile pipeline's stages, in the order they run: autocast, checkpoint, optimizer_split, schedule, reorder,
 * fusion, optimizer_place, side_lane, budget (the names stop_after takes). */
int deft_compile_stage_count(void);
const char *deft_compile_stage_name(int i);   /* NULL out of range */
#define DEFT_HAS_STOP_AFTER 1
void deft_program_free(deft_program *p);
/* Copies host data into an input before the next run; bytes must equal the input's size. */
deft_status deft_program_feed(deft_program *p, deft_tensor *input, const void *host, size_t bytes);
deft_status deft_program_run(deft_program *p);
/* Copies an output of the last run to host memory; the tensor must be one of the compiled outputs. */
deft_status deft_program_read(deft_program *p, const deft_tensor *t, void *host, size_t bytes);

/* A program that uses GPUs runs on a stream per GPU, without synchronising the host (reading an output, or feeding
 * an input that is not on its first GPU, waits for the step). Its first run is eager; the second captures the whole
 * step into one CUDA Graph, and every later run is one replay. The graph holds the GPU's steps and the deft_to
 * copies from and to the CPU: the CPU inputs, arena and outputs of such a program are page-locked, so those copies
 * are asynchronous. Programs that stay eager (status says why): steps on several GPUs (each GPU's steps on its own
 * stream, copies between GPUs asynchronous, events ordering them), a compute step on the CPU (the host waits for the
 * GPUs only around it), dropout (a replay would repeat its mask), a copy from a CPU parameter or constant (pageable
 * memory), or no_cuda_graphs. */
int64_t deft_program_graph_replays(const deft_program *p);      /* runs done as a replay */
const char *deft_program_graph_status(const deft_program *p);   /* "replaying a CUDA Graph", or why not */

/* Runs one step of p, as deft_program_run does (its effects are a step's: an optimizer updates the parameters, the
 * outputs hold this step's values), but eagerly, without replaying a CUDA Graph, and times every step on its stream
 * (a fused group is one step, named after its root, its members listed): the host's clock around a step on the CPU,
 * a pair of CUDA events on a GPU's stream. Writes the times to `path` as a Chrome trace-event JSON file (open it in
 * ui.perfetto.dev or chrome://tracing): a track per stream, an "X" event per step (args: op, dtype, shape, bytes,
 * arena offset or "persistent"/"view"/"fused"), and "C" counters of the arena bytes live at each step. Waits for
 * the step. Refuses what deft_program_run refuses; a path that cannot be written is DEFT_ERR_IO, and on any failure
 * no file is left at path. Later runs go on as before (graph replay included). */
deft_status deft_program_trace(deft_program *p, const char *path);
#define DEFT_HAS_PROGRAM_TRACE 1

/* What compiling decided, for tests and reports. */
int deft_program_step_count(const deft_program *p);              /* nodes that run each step */
int deft_program_schedules(const deft_program *p, const deft_tensor *t);   /* 1 if t is computed by p */
int64_t deft_program_node_runs(const deft_program *p, const deft_tensor *t); /* times t's kernel has run */
typedef struct deft_memory_report {
    size_t arena_bytes;        /* sum over devices of the planned arenas */
    size_t lower_bound_bytes;  /* largest sum of bytes live at any one step */
    size_t no_reuse_bytes;     /* arena size if no buffer were reused */
    size_t persistent_bytes;   /* parameters, constants and inputs */
    int buffers;               /* planned buffers (views share their base's) */
    size_t workspace_bytes;    /* library scratch of its GPUs' streams (cuBLAS, cuDNN, batch norm's sums), as
                                * deft_device_memory's below: summed over its GPUs */
} deft_memory_report;
deft_status deft_program_memory(const deft_program *p, deft_memory_report *out);
/* Plans the program that deft_compile would build, without allocating anything, and reports its memory: how much a
 * step will need on each device before anything runs. */
deft_status deft_plan_memory(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                             const deft_compile_options *opts, deft_memory_report *out);
/* Builds into g the graph of one step at the given batch size and names its outputs (at most 64). */
typedef deft_status (*deft_batch_builder)(deft_graph *g, int64_t batch, void *ctx, deft_tensor **outputs,
                                          int *n_outputs);
/* The largest batch in [1, max_batch] whose step fits in `bytes` (arena + persistent, every device together), found
 * by planning graphs built by `build`, never by running them. DEFT_ERR_OOM, with the bytes a batch of 1 needs, when
 * none fits. Memory is assumed to grow with the batch. The batches tried double from 1 until one does not fit, then
 * halve the gap: a loose max_batch costs a few probes. A probe that fails returns its error, with the batch named:
 * DEFT_ERR_SHAPE when its tensors or plan are too large to exist (past PTRDIFF_MAX bytes), as with a budget that
 * no memory has. */
deft_status deft_largest_batch(deft_batch_builder build, void *ctx, size_t bytes, int64_t max_batch,
                               const deft_compile_options *opts, int64_t *out);
/* What one device needs for a compiled program, before it runs. */
typedef struct deft_device_memory {
    deft_device device;
    size_t persistent_bytes;   /* inputs, parameters, constants and optimizer state on this device */
    size_t arena_bytes;        /* the planned arena */
    size_t workspace_bytes;    /* scratch the program's kernels use (cuBLAS, cuDNN, batch norm's sums): once it has
                                * run, what its streams hold, which is what the algorithms chosen for its steps asked
                                * for (the caching allocator's statistics count the same blocks); before its first
                                * run, the most they may hold (each scratch at its cap: 32 MiB cuBLAS, 64 MiB cuDNN
                                * on the main stream, 4 and 16 MiB on a side lane) */
    size_t total_bytes;        /* the sum of the three */
    size_t activation_bytes;   /* of the arena, the peak of saved activations: forward values that depend on an input
                                * and that the backward pass reads, summed over the steps they are kept alive for it
                                * (autocast's weight copies are not counted); 0 without deft_backward */
} deft_device_footprint;
/* Fills up to max entries (one per device the program touches) and sets *n to their number. */
deft_status deft_program_footprint(const deft_program *p, deft_device_footprint *out, int max, int *n);
/* Prints the memory report and the per-buffer plan (offset, size, lifetime) as a table. */
deft_status deft_program_print_plan(const deft_program *p, void *file /* FILE*, NULL = stdout */);

/* Compiles and runs the smallest subgraph that produces t, and copies its value to host (bytes = its size). */
deft_status deft_realize(deft_tensor *t, void *host, size_t bytes);

/* ---- seeing the graph ---- */
/* Writes a Graphviz DOT file; p may be NULL (the plan's offsets are added when given). */
deft_status deft_graph_dump_dot(const deft_graph *g, const deft_program *p, const char *path);

#ifdef __cplusplus
}
#endif
#endif
