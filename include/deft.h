/* deft: deferred tensor computation in C.
 *
 * Building a graph runs nothing. A graph is compiled into a program for the outputs it is asked for (only the nodes
 * those outputs need are scheduled), planned into one arena per device, and run on request.
 *
 * Errors: builders return NULL on error and accept NULL inputs (so a chain is checked once at its end); every other
 * call returns a deft_status. deft_errmsg() gives the last message of the calling thread; a graph also remembers its
 * first error (deft_graph_error). Nothing in the library aborts or exits on bad input.
 */
#ifndef DEFT_H
#define DEFT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DEFT_VERSION_MAJOR 0
#define DEFT_VERSION_MINOR 1
#define DEFT_VERSION_PATCH 0

#define DEFT_MAX_DIMS 8

typedef enum deft_status {
    DEFT_OK = 0,
    DEFT_ERR_INVALID,     /* a bad argument: NULL, a wrong shape, dtype, size or option */
    DEFT_ERR_SHAPE,       /* shapes that do not fit the op */
    DEFT_ERR_DTYPE,       /* a dtype the op or device does not support */
    DEFT_ERR_DEVICE,      /* an unknown, unavailable or mismatched device */
    DEFT_ERR_NO_CUDA,     /* CUDA asked for in a build or on a machine without it */
    DEFT_ERR_OOM,         /* out of memory on a device */
    DEFT_ERR_STATE,       /* a call out of order: reading before running, feeding a non-input */
    DEFT_ERR_IO,          /* a file could not be read or written */
    DEFT_ERR_RUNTIME      /* a device or library call failed */
} deft_status;

typedef enum deft_dtype {
    DEFT_F32 = 0,
    DEFT_F64,
    DEFT_F16,
    DEFT_BF16,
    DEFT_I32,
    DEFT_DTYPE_COUNT
} deft_dtype;

typedef enum deft_device_type { DEFT_CPU = 0, DEFT_CUDA = 1 } deft_device_type;

/* A device is a plain value: { DEFT_CPU, 0 } or { DEFT_CUDA, n } for cuda:n. */
typedef struct deft_device {
    deft_device_type type;
    int index;
} deft_device;

typedef struct deft_graph deft_graph;
typedef struct deft_tensor deft_tensor;
typedef struct deft_program deft_program;

/* ---- errors and library facts ---- */
const char *deft_errmsg(void);                 /* last message of the calling thread ("" if none) */
const char *deft_status_name(deft_status s);
const char *deft_version(void);
int deft_has_cuda_build(void);                 /* 1 if built with CUDA support */
int deft_has_blas(void);                       /* 1 if CPU matmul goes through a CBLAS */

/* ---- dtypes ---- */
size_t deft_dtype_size(deft_dtype dt);
const char *deft_dtype_name(deft_dtype dt);

/* ---- devices ---- */
deft_device deft_cpu(void);
deft_device deft_cuda(int index);
/* Parses "cpu", "cuda", "cuda:N". Unknown strings are DEFT_ERR_DEVICE; "cuda" in a build or on a machine without
 * a usable GPU is DEFT_ERR_NO_CUDA; an index past the visible count is DEFT_ERR_DEVICE. */
deft_status deft_device_parse(const char *s, deft_device *out);
deft_device deft_device_default(void);         /* cuda:0 if a GPU works, else cpu */
int deft_device_equal(deft_device a, deft_device b);
/* Writes "cpu" or "cuda:N" into buf and returns buf. */
const char *deft_device_str(deft_device d, char *buf, size_t n);
int deft_cuda_device_count(void);              /* 0 without CUDA; starts the CUDA runtime on first call */
deft_status deft_device_name(deft_device d, char *buf, size_t n);
deft_status deft_device_memory(deft_device d, size_t *free_bytes, size_t *total_bytes);
/* 1 once anything has started the CUDA runtime in this process (nothing does at load time). */
int deft_cuda_runtime_started(void);

/* ---- graphs ---- */
deft_graph *deft_graph_new(void);
void deft_graph_free(deft_graph *g);           /* frees every program compiled from it too */
deft_status deft_graph_error(const deft_graph *g);   /* first error seen while building, DEFT_OK if none */
const char *deft_graph_errmsg(const deft_graph *g);
int deft_graph_node_count(const deft_graph *g);

/* ---- leaves ---- */
typedef enum deft_init {
    DEFT_INIT_ZEROS = 0,
    DEFT_INIT_ONES,
    DEFT_INIT_UNIFORM,       /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
    DEFT_INIT_NORMAL,        /* N(0, 1) */
    DEFT_INIT_KAIMING,       /* Kaiming uniform, a = sqrt(5), as torch.nn.Linear */
    DEFT_INIT_XAVIER         /* Xavier uniform */
} deft_init;

/* Inputs are fed before each run. */
deft_tensor *deft_input(deft_graph *g, const char *name, deft_dtype dt, int ndim, const int64_t *shape,
                        deft_device dev);
/* Parameters persist across runs; their first values come from `init` with the graph's seed. */
deft_tensor *deft_param(deft_graph *g, const char *name, deft_dtype dt, int ndim, const int64_t *shape,
                        deft_device dev, deft_init init);
/* A constant copies `bytes` of host data now (bytes must equal the tensor's size). */
deft_tensor *deft_constant(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev,
                           const void *data, size_t bytes);
deft_tensor *deft_zeros(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev);
deft_tensor *deft_full(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev,
                       double value);
/* 1-D [start, start+step, ...) below stop, as torch.arange. */
deft_tensor *deft_arange(deft_graph *g, deft_dtype dt, double start, double stop, double step, deft_device dev);
/* Random tensors from a seed: the same seed gives the same values on every device and every run. */
deft_tensor *deft_uniform(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev,
                          double low, double high, uint64_t seed);
deft_tensor *deft_normal(deft_graph *g, deft_dtype dt, int ndim, const int64_t *shape, deft_device dev,
                         double mean, double stddev, uint64_t seed);

/* Sets or reads the value of a parameter (persistent) at any time; `bytes` must equal its size. */
deft_status deft_param_set(deft_tensor *param, const void *host, size_t bytes);
deft_status deft_param_get(const deft_tensor *param, void *host, size_t bytes);
void deft_graph_set_seed(deft_graph *g, uint64_t seed);

/* ---- tensor facts ---- */
int deft_tensor_ndim(const deft_tensor *t);
int64_t deft_tensor_dim(const deft_tensor *t, int axis);       /* negative axes count from the end */
int64_t deft_tensor_numel(const deft_tensor *t);
size_t deft_tensor_nbytes(const deft_tensor *t);
deft_dtype deft_tensor_dtype(const deft_tensor *t);
deft_device deft_tensor_device(const deft_tensor *t);
const char *deft_tensor_name(const deft_tensor *t);
deft_tensor *deft_set_name(deft_tensor *t, const char *name);  /* returns t, for chaining */

/* ---- elementwise, broadcasting (numpy rules) ---- */
deft_tensor *deft_add(deft_tensor *a, deft_tensor *b);
deft_tensor *deft_sub(deft_tensor *a, deft_tensor *b);
deft_tensor *deft_mul(deft_tensor *a, deft_tensor *b);
deft_tensor *deft_div(deft_tensor *a, deft_tensor *b);
deft_tensor *deft_maximum(deft_tensor *a, deft_tensor *b);
deft_tensor *deft_add_scalar(deft_tensor *a, double s);
deft_tensor *deft_sub_scalar(deft_tensor *a, double s);       /* a - s */
deft_tensor *deft_rsub_scalar(deft_tensor *a, double s);      /* s - a */
deft_tensor *deft_mul_scalar(deft_tensor *a, double s);
deft_tensor *deft_div_scalar(deft_tensor *a, double s);       /* a / s */
deft_tensor *deft_rdiv_scalar(deft_tensor *a, double s);      /* s / a */
deft_tensor *deft_maximum_scalar(deft_tensor *a, double s);
deft_tensor *deft_pow_scalar(deft_tensor *a, double s);

deft_tensor *deft_neg(deft_tensor *a);
deft_tensor *deft_exp(deft_tensor *a);
deft_tensor *deft_log(deft_tensor *a);
deft_tensor *deft_sqrt(deft_tensor *a);
deft_tensor *deft_rsqrt(deft_tensor *a);
deft_tensor *deft_tanh(deft_tensor *a);
deft_tensor *deft_sigmoid(deft_tensor *a);
deft_tensor *deft_relu(deft_tensor *a);
deft_tensor *deft_gelu(deft_tensor *a);        /* exact (erf) form, as torch's default */
deft_tensor *deft_silu(deft_tensor *a);

/* ---- dtype and device ---- */
deft_tensor *deft_cast(deft_tensor *a, deft_dtype dt);
/* Moves to a device and dtype; returns `a` itself when neither changes. */
deft_tensor *deft_to(deft_tensor *a, deft_device dev, deft_dtype dt);

/* ---- matrix products ---- */
/* a: [..., M, K] (or [..., K, M] when trans_a), b: [..., K, N] (or [..., N, K] when trans_b); leading (batch)
 * dims broadcast. A 2-D b against a batched a is the common linear-layer case. */
deft_tensor *deft_matmul_t(deft_tensor *a, deft_tensor *b, int trans_a, int trans_b);
deft_tensor *deft_matmul(deft_tensor *a, deft_tensor *b);

/* ---- shape ---- */
/* One dimension may be -1 (inferred). Aliases its input: no copy. */
deft_tensor *deft_reshape(deft_tensor *a, int ndim, const int64_t *shape);
deft_tensor *deft_view(deft_tensor *a, int ndim, const int64_t *shape);   /* the same as reshape */
deft_tensor *deft_permute(deft_tensor *a, const int *perm);
deft_tensor *deft_transpose(deft_tensor *a, int axis0, int axis1);
/* Elements start, start+step, ... below end along `axis` (python slicing with step > 0, negative indices count
 * from the end, bounds clamped). Aliases its input where the result is contiguous in it. */
deft_tensor *deft_slice(deft_tensor *a, int axis, int64_t start, int64_t end, int64_t step);
deft_tensor *deft_concat(deft_tensor *const *ts, int n, int axis);

/* ---- reductions; axes < 0 count from the end; naxes == 0 reduces over every axis ---- */
deft_tensor *deft_sum(deft_tensor *a, int naxes, const int *axes, int keepdim);
deft_tensor *deft_mean(deft_tensor *a, int naxes, const int *axes, int keepdim);
deft_tensor *deft_max(deft_tensor *a, int naxes, const int *axes, int keepdim);
deft_tensor *deft_softmax(deft_tensor *a, int axis);
deft_tensor *deft_log_softmax(deft_tensor *a, int axis);

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
    int reorder;               /* 1: reorder independent nodes to lower the peak (kept only when the arena shrinks) */
    int no_cuda_graphs;        /* 1: run every step eagerly, never as a CUDA Graph replay (for debugging) */
    int tf32;                  /* 1: f32 matmuls on a GPU may use TF32 tensor cores (10-bit mantissa products, f32
                                * accumulation), as torch.backends.cuda.matmul.allow_tf32; the CPU is unaffected */
    int deterministic;         /* 1: convolutions on a GPU take only the algorithms cuDNN calls deterministic (as
                                * torch.backends.cudnn.deterministic), so that the same program on the same inputs
                                * gives the same bits on every run; the default lets cuDNN choose kernels that sum
                                * weight gradients with atomics, a few ulps apart from run to run */
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
     * step stays one node. Off by default: on 1, 2 and 4 H200s the mid MLP's steps measured 3-4 % slower in pieces
     * (their launches and events cost more than the overlap gives); the one node waits for every bucket. */
    int dist_bucket_pieces;
    /* Switches for measuring what one GPU optimisation gives; zero keeps today's behaviour. */
    int no_side_lane;          /* 1: weight-gradient work never runs on a GPU's second stream (the side lane) */
    int no_product_batches;    /* 1: products of one shape never run as one batched cuBLASLt call */
    int no_relu_grad_fold;     /* 1: a ReLU's gradient is never folded into batch norm's backward kernel */
    int fuse_low_precision;    /* 1: bf16 and f16 elementwise chains are fused too (by default only f32 ones are) */
    int conv_gemm;             /* a deft_conv_gemm_mode: NHWC convolutions as im2col and one cuBLASLt product */
    int cudnn_find;            /* 1: cuDNN measures the candidate algorithms once per shape (outside a capture)
                                * instead of taking its heuristic's first choice */
} deft_compile_options;
/* Which NHWC convolutions (groups 1, within the workspace) run as im2col and a cuBLASLt product instead of cuDNN. */
typedef enum deft_conv_gemm_mode {
    DEFT_CONV_GEMM_DEFAULT = 0,   /* bf16 and f16 ones */
    DEFT_CONV_GEMM_NEVER,         /* none: cuDNN runs every convolution */
    DEFT_CONV_GEMM_WITH_F32       /* f32 ones too */
} deft_conv_gemm_mode;
#define DEFT_HAS_OPTIMIZER_IN_BACKWARD 1
#define DEFT_HAS_AUTOCAST_OPTION 1

/* Activation checkpointing: forward values the backward pass reads are dropped after the forward pass and
 * recomputed just before the backward steps that read them, giving the same bits (dropout recomputes its mask).
 * Compiling appends the recompute nodes, and copies of the backward nodes that read them, to the graph for that
 * program only: no node you built changes, other compiles never see them, and they go with the program (when they
 * are still the graph's last nodes; deft_graph_node_count counts them meanwhile). Outputs are read through your
 * tensors as ever; deft_program_schedules and deft_program_node_runs answer for what runs, so a backward node of
 * yours that a copy computes in its place reads as not scheduled. */
typedef enum deft_checkpoint_policy {
    DEFT_CHECKPOINT_NONE = 0,
    DEFT_CHECKPOINT_BUDGET,    /* the least recompute cost (FLOPs, bytes) whose plan fits memory_budget (arena +
                                * persistent); when none does, DEFT_ERR_OOM names the smallest budget that fits */
    DEFT_CHECKPOINT_MARKED,    /* drop what lies inside the spans given to deft_checkpoint_span */
    DEFT_CHECKPOINT_SEGMENTS   /* torch.utils.checkpoint.checkpoint_sequential: split the forward pass at layer
                                * boundaries into checkpoint_segments runs; keep only each run's last boundary,
                                * except in the last run, which keeps everything */
} deft_checkpoint_policy;
#define DEFT_HAS_CHECKPOINT 1
/* Marks the nodes on every path from `from` to `to` (both excluded) for DEFT_CHECKPOINT_MARKED, as
 * torch.utils.checkpoint.checkpoint(fn, from) returning `to`. */
deft_status deft_checkpoint_span(deft_tensor *from, deft_tensor *to);
typedef struct deft_checkpoint_report {
    int policy;                /* the deft_checkpoint_policy compiled with */
    int dropped;               /* forward values not kept for the backward pass */
    size_t dropped_bytes;      /* their bytes */
    int recomputed;            /* nodes run a second time in the backward pass */
    double recompute_flops;    /* their floating-point operations... */
    double recompute_bytes;    /* ...and the bytes they read and write */
    size_t arena_bytes;        /* the planned arenas with checkpointing */
    size_t peak_bytes;         /* arena + persistent: what memory_budget bounds */
    size_t peak_bytes_without; /* the same without checkpointing */
} deft_checkpoint_report;
/* What checkpointing did in p (zeros but for the arena and peak when nothing was dropped). Under autocast the casts
 * of inputs that the backward pass reads are always dropped and recast there (one cast kernel of the batch rather
 * than the cast held through the forward pass), whatever the policy, DEFT_CHECKPOINT_NONE included: they count
 * here as dropped and recomputed, and the budget search plans with them dropped. */
deft_status deft_program_checkpoint(const deft_program *p, deft_checkpoint_report *out);
#define DEFT_HAS_TF32_OPTION 1
#define DEFT_HAS_NO_CUDA_GRAPHS_OPTION 1

/* Compiles the nodes that `outputs` need (and nothing else). opts may be NULL. */
deft_program *deft_compile(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                           const deft_compile_options *opts);
void deft_program_free(deft_program *p);
/* Copies host data into an input before the next run; bytes must equal the input's size. */
deft_status deft_program_feed(deft_program *p, deft_tensor *input, const void *host, size_t bytes);
deft_status deft_program_run(deft_program *p);
/* Copies an output of the last run to host memory; the tensor must be one of the compiled outputs. */
deft_status deft_program_read(deft_program *p, const deft_tensor *t, void *host, size_t bytes);

/* ---- prefetch and loading ----
 * deft_program_feed_async queues the copy of a batch from pinned host memory into a second slot of the input and
 * returns at once (like tensor.to("cuda", non_blocking=True) from pin_memory()). The next deft_program_run reads
 * that slot once the copy is done, its stream waiting on the device, never the host; so feeding batch k+1 right
 * after running step k overlaps the copy with the step. A copy never overwrites a slot that a step still in flight
 * reads, and CUDA Graph replays go on (one graph per slot combination). The host buffer must come from
 * deft_pinned_alloc (or be page-locked by cudaHostAlloc / cudaHostRegister); other memory is DEFT_ERR_INVALID. It
 * must not be written until the copy is done: deft_pinned_free it (the pool hands it out again only after the
 * copy, as with Tensor.record_stream), or let a deft_loader recycle it. Feeding the same buffer again at once is
 * safe (copies run in order); a later deft_program_feed of the input replaces a batch fed asynchronously and not
 * yet run. Programs that do not run on one GPU's stream (CPU steps, several devices, dropout) copy synchronously,
 * as deft_program_feed does, from any host memory. */
deft_status deft_program_feed_async(deft_program *p, deft_tensor *input, const void *pinned_host, size_t bytes);

/* A loader (torch.utils.data.DataLoader with pin_memory): a thread of its own fills `depth` pinned batches ahead of
 * the training loop by calling `fill` for batch (epoch, index), index in [0, batches_per_epoch), in order, batch
 * after batch, epoch after epoch; deft_loader_next feeds the next one asynchronously into a program and recycles
 * its buffers once their copies are done. Batches come in the same order whatever the threads' timing.
 * `fill` runs on the loader's thread and writes buffers[i] (deft_tensor_nbytes of inputs[i]) for each input; a
 * status other than DEFT_OK stops the loader, and deft_loader_next returns it with the message the callback left
 * (deft_loader_error sets one) once the batches filled before it are taken. */
typedef struct deft_loader deft_loader;
typedef deft_status (*deft_loader_fill)(void *ctx, int64_t epoch, int64_t index, void *const *buffers);
/* depth 0 means 3; otherwise 2..64. The inputs must stay alive while the loader does. */
deft_status deft_loader_new(deft_tensor *const *inputs, int n_inputs, int64_t batches_per_epoch, int depth,
                            deft_loader_fill fill, void *ctx, deft_loader **out);
/* The built-in loader over a dataset: x ([batch, features], f32) and y ([batch], i32) get consecutive batches of
 * d (which must outlive the loader), the last incomplete one dropped; with shuffle, each epoch in a new order drawn
 * from seed and the epoch number (deft_shuffle). */
struct deft_dataset;   /* below, with the idx files */
deft_status deft_loader_new_dataset(const struct deft_dataset *d, deft_tensor *x, deft_tensor *y, int shuffle,
                                    uint64_t seed, int depth, deft_loader **out);
typedef struct deft_loader_batch {
    int64_t epoch, index;    /* the batch just fed (index -1 when end is set) */
    int64_t fed;             /* batches fed by this loader so far, this one included */
    int end;                 /* 1: the epoch is over and nothing was fed; the next call starts the next epoch */
} deft_loader_batch;
/* Feeds the next batch into p (deft_program_feed_async of each input) and says which it was; after the last batch
 * of an epoch, one call returns with end set. out may be NULL. */
deft_status deft_loader_next(deft_loader *l, deft_program *p, deft_loader_batch *out);
/* Stops the thread (waiting for a fill in progress) and frees the buffers once their copies are done. */
void deft_loader_free(deft_loader *l);
/* For fill callbacks: sets the calling thread's message (printf format) and returns s. */
deft_status deft_loader_error(deft_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

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

/* What compiling decided, for tests and reports. */
int deft_program_step_count(const deft_program *p);              /* nodes that run each step */
/* Steps that run on their GPU's second stream, beside the main one: the weight gradients of convolutions and TF32
 * products of at least 64 MFLOP (and what only carries them to the optimizer) in a one-GPU program, which no
 * main-stream step reads before the optimizer's step. Graphs capture both streams; DEFT_SIDE_STREAM=0 at compile
 * time keeps every step on one stream. None with optimizer_in_backward (or data parallel's pieces per bucket), a
 * memory budget or checkpointing. */
int deft_program_side_steps(const deft_program *p);
/* Products that run batched with others of their shape, as one call at the last one's step: on a GPU, products of
 * at least 64 MFLOP whose outputs have fewer than 2^21 elements (less than a wave of tiles on an H200), such as an
 * MLP's weight gradients, which nothing reads before the optimizer. Their inputs live until the batch runs. None
 * under data parallel, optimizer_in_backward, a memory budget, checkpointing or no_fusion; DEFT_PRODUCT_BATCHES=0 at
 * compile time turns batching off. */
int deft_program_batched_products(const deft_program *p);
int deft_program_schedules(const deft_program *p, const deft_tensor *t);   /* 1 if t is computed by p */
int64_t deft_program_node_runs(const deft_program *p, const deft_tensor *t); /* times t's kernel has run */
typedef struct deft_memory_report {
    size_t arena_bytes;        /* sum over devices of the planned arenas */
    size_t lower_bound_bytes;  /* largest sum of bytes live at any one step */
    size_t no_reuse_bytes;     /* arena size if no buffer were reused */
    size_t persistent_bytes;   /* parameters, constants and inputs */
    int buffers;               /* planned buffers (views share their base's) */
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
 * none fits. Memory is assumed to grow with the batch. */
deft_status deft_largest_batch(deft_batch_builder build, void *ctx, size_t bytes, int64_t max_batch,
                               const deft_compile_options *opts, int64_t *out);
/* What one device needs for a compiled program, before it runs. */
typedef struct deft_device_memory {
    deft_device device;
    size_t persistent_bytes;   /* inputs, parameters, constants and optimizer state on this device */
    size_t arena_bytes;        /* the planned arena */
    size_t workspace_bytes;    /* scratch the program's kernels use (cuBLAS, cuDNN, batch norm's sums) */
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

/* ---- device memory: the caching allocator and what it can show (named as PyTorch names them) ---- */
typedef struct deft_memory_stat {
    int64_t current, peak, allocated, freed;   /* allocated/freed: running totals since the process started */
} deft_memory_stat;

typedef struct deft_memory_stats {
    deft_memory_stat allocated_bytes;   /* bytes handed out in blocks (rounded sizes) */
    deft_memory_stat reserved_bytes;    /* bytes held in segments from the device (cached included) */
    deft_memory_stat active_bytes;      /* bytes in blocks in use or waiting on a stream */
    deft_memory_stat requested_bytes;   /* bytes callers asked for, before rounding */
    deft_memory_stat allocation;        /* block counts */
    deft_memory_stat segment;           /* segment counts */
    int64_t num_alloc_retries;          /* allocations that had to free the cache and retry */
    int64_t num_ooms;                   /* allocations that failed after the retry */
    int64_t num_device_alloc;           /* segments taken from the device (cudaMalloc or the host's allocator) */
    int64_t num_device_free;            /* segments given back */
} deft_memory_stats;

deft_status deft_memory_stats_get(deft_device d, deft_memory_stats *out);
/* Peaks back to the current values. */
deft_status deft_memory_reset_peak(deft_device d);
/* Gives every unused cached segment back to the device. */
deft_status deft_memory_empty_cache(deft_device d);
/* Caps the bytes the allocator may reserve on d (like set_per_process_memory_fraction); 0 removes the cap. */
deft_status deft_memory_set_limit(deft_device d, size_t bytes);
/* A human table of the statistics, like torch.cuda.memory_summary(); file is a FILE* (NULL = stdout). */
deft_status deft_memory_summary(deft_device d, void *file);
/* Records alloc and free events (size, tag, time) for snapshots, keeping the last max_entries; 0 turns it off. */
deft_status deft_memory_record_history(size_t max_entries);
/* Writes every device's segments and blocks (with their states) and the recorded history as JSON. */
deft_status deft_memory_snapshot(const char *path);

/* ---- pinned (page-locked) host memory, cached ----
 * Blocks come from cached page-locked segments (cudaHostAlloc) so that host-to-device copies run at full speed and
 * asynchronously. A freed block is reused only once every stream recorded on it has passed that point (an event per
 * use), so a copy still in flight never sees its source overwritten. Without CUDA the blocks are ordinary host
 * memory (aligned to 4096) and the same caching and counters apply. */
deft_status deft_pinned_alloc(size_t bytes, void **out);
deft_status deft_pinned_free(void *ptr);          /* a double free or a foreign pointer is DEFT_ERR_INVALID */
/* Marks that work queued on `stream` (a cudaStream_t; NULL is the legacy default stream) uses the block: freeing it
 * then waits for that work before the block is handed out again (like Tensor.record_stream). */
deft_status deft_pinned_record_stream(void *ptr, void *stream);
int deft_pinned_is_page_locked(const void *ptr); /* 1 if ptr lies in a page-locked pinned block */
deft_status deft_pinned_stats(deft_memory_stats *out);
deft_status deft_pinned_empty_cache(void);        /* gives every unused segment back */

/* ---- comparisons: 1 where true and 0 elsewhere, in a's dtype; broadcasting ---- */
deft_tensor *deft_eq(deft_tensor *a, deft_tensor *b);
deft_tensor *deft_gt(deft_tensor *a, deft_tensor *b);
deft_tensor *deft_ge(deft_tensor *a, deft_tensor *b);

/* ---- training: gradients ----
 * Every parameter requires a gradient unless told otherwise. deft_backward(loss) adds to the graph the nodes that
 * compute d loss / d p for every parameter p the loss depends on; inputs and frozen parameters cost nothing. The
 * gradient of a parameter is an ordinary tensor of the graph: compile it as an output to read it. Calling backward
 * again (another loss) adds to the gradients, as in PyTorch. */
deft_status deft_param_set_requires_grad(deft_tensor *param, int requires_grad);
deft_status deft_backward(deft_tensor *loss);
/* The gradient of t (a parameter, or any tensor on the loss's path) after deft_backward; NULL (with a message) if
 * it has none. */
deft_tensor *deft_grad(const deft_tensor *t);

/* ---- losses and layers ---- */
deft_tensor *deft_mse_loss(deft_tensor *pred, deft_tensor *target);          /* mean((pred - target)^2) */
/* Mean over N of -log softmax(logits)[target]: logits [N, C] float, targets [N] i32 class indices. A target out of
 * [0, C) is an error with a message: on the CPU the run fails; on a GPU (where finding it at run time would need a
 * host wait) the run's loss is NaN and the program's next deft_program_read fails. Fused, stable for large logits. */
deft_tensor *deft_cross_entropy(deft_tensor *logits, deft_tensor *targets);
/* Zeroes each element with probability p and scales the rest by 1/(1-p). The mask comes from `seed` and the run
 * count: a new mask each run, the same one wherever the run reads it again (the backward pass, recomputation). */
deft_tensor *deft_dropout(deft_tensor *x, double p, uint64_t seed);
/* Normalises over the last dim: (x - mean) / sqrt(var + eps) * weight + bias; weight and bias ([D]) may be NULL. */
deft_tensor *deft_layer_norm(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, double eps);
typedef struct deft_linear_options {
    deft_init weight_init;   /* DEFT_INIT_KAIMING (torch's default), DEFT_INIT_XAVIER, DEFT_INIT_ZEROS, ... */
    int no_bias;             /* 1: no bias */
    int zero_bias;           /* 1: bias starts at zero (default: U(-1/sqrt(in), 1/sqrt(in)), as torch) */
} deft_linear_options;
/* x [..., in] @ weight [in, out] + bias [out]. Creates the parameters "<name>.weight" and "<name>.bias" in x's graph
 * on x's device and dtype. opts may be NULL (torch.nn.Linear's initialisation). */
deft_tensor *deft_linear(deft_tensor *x, int64_t out_features, const char *name, const deft_linear_options *opts);
/* The node of the graph named `name` (the first one), or NULL. */
deft_tensor *deft_graph_find(const deft_graph *g, const char *name);

/* ---- images: convolution, pooling, batch norm ----
 * Layouts: DEFT_NCHW takes x [N, C, H, W] and a conv weight [O, C/groups, KH, KW] (torch's); DEFT_NHWC takes
 * x [N, H, W, C] and a conv weight [O, KH, KW, C/groups] (the memory order of torch's channels_last and of cuDNN's
 * NHWC filters). Outputs keep the input's layout. Float dtypes only; the CPU kernels run f32 and f64 (im2col and
 * the CBLAS), other dtypes fail at run with DEFT_ERR_DTYPE. Every op has a backward rule. On a GPU conv2d runs
 * through cuDNN (f32, f16 and bf16 accumulating in f32, f64 where cuDNN has it; a build without cuDNN fails at run
 * with DEFT_ERR_DEVICE) and the others through plain kernels, in f32, f64, f16 and bf16. */
typedef enum deft_layout { DEFT_NCHW = 0, DEFT_NHWC = 1 } deft_layout;
#define DEFT_HAS_CONV2D 1
typedef struct deft_conv2d_options {
    int64_t stride[2];       /* per (H, W); 0: 1 */
    int64_t padding[2];      /* zeros on both sides of H and W */
    int64_t dilation[2];     /* 0: 1 */
    int64_t groups;          /* 0: 1; C and O must be multiples of it (groups = C = O: depthwise) */
    deft_layout layout;
} deft_conv2d_options;
/* torch.nn.functional.conv2d: bias ([O]) may be NULL, opts may be NULL (stride 1, no padding, NCHW). The output is
 * [N, O, OH, OW] (NHWC: [N, OH, OW, O]) with OH = (H + 2 pad - dil (KH - 1) - 1) / stride + 1. */
deft_tensor *deft_conv2d(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, const deft_conv2d_options *opts);
/* A conv layer as torch.nn.Conv2d: creates "<name>.weight" (and "<name>.bias" unless no_bias) in x's graph, dtype
 * and device, with torch's initialisation (uniform in +-1 / sqrt(C/groups * KH * KW)). */
deft_tensor *deft_conv2d_layer(deft_tensor *x, int64_t out_channels, int64_t kernel_h, int64_t kernel_w,
                               const char *name, const deft_conv2d_options *opts, int no_bias);
typedef struct deft_pool2d_options {
    int64_t kernel[2];       /* required */
    int64_t stride[2];       /* 0: the kernel's size (torch's default) */
    int64_t padding[2];      /* at most half the kernel */
    int exclude_pad;         /* avg: 1 divides by the elements inside the input (count_include_pad=False) */
    deft_layout layout;
} deft_pool2d_options;
/* Max pooling; the gradient goes to the first maximum of each window (row-major), as torch's. */
deft_tensor *deft_max_pool2d(deft_tensor *x, const deft_pool2d_options *opts);
/* Average pooling; padding counts in the divisor unless exclude_pad (torch's count_include_pad=True default). */
deft_tensor *deft_avg_pool2d(deft_tensor *x, const deft_pool2d_options *opts);
/* torch.nn.AdaptiveAvgPool2d((out_h, out_w)): window i spans [floor(i H / out_h), ceil((i + 1) H / out_h)). */
deft_tensor *deft_adaptive_avg_pool2d(deft_tensor *x, int64_t out_h, int64_t out_w, deft_layout layout);
/* Batch norm over the channel axis (1 for DEFT_NCHW, the last for DEFT_NHWC) of an input of rank 2 or more.
 * Training: normalises by the batch's mean and biased variance, and each run updates the running statistics in
 * place as torch.nn.BatchNorm2d: r = (1 - momentum) r + momentum s, with the unbiased variance for running_var.
 * Evaluation: normalises by the running statistics and changes nothing.
 * The running statistics are parameters (deft_param, [C]) that the op writes (training) and that never get a
 * gradient: no optimizer touches them, and deft_params_save/load keep them with the model. When both are NULL the
 * batch's statistics are used in either mode and nothing is updated (track_running_stats=False). Weight and bias
 * ([C]) may be NULL (affine=False). Dtypes: x (and y, dx) f32, f64, f16 or bf16; weight, bias and the running
 * statistics f32 when x is f16 or bf16 (torch's cuDNN batch norm: statistics kept and computed in f32), x's dtype
 * otherwise; any other mix is DEFT_ERR_DTYPE. deft_batch_norm_layer makes them so. */
typedef struct deft_batch_norm_options {
    int eval;                /* 0: training; 1: evaluation */
    double momentum;         /* in [0, 1] */
    double eps;              /* >= 0 */
    deft_layout layout;
} deft_batch_norm_options;
/* Training, momentum 0.1, eps 1e-5, NCHW (torch's). NULL options mean these. */
deft_batch_norm_options deft_batch_norm_defaults(void);
deft_tensor *deft_batch_norm(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, deft_tensor *running_mean,
                             deft_tensor *running_var, const deft_batch_norm_options *opts);
/* A layer as torch.nn.BatchNorm2d(C): creates "<name>.weight" (ones), "<name>.bias" (zeros), and the running
 * statistics "<name>.running_mean" (zeros) and "<name>.running_var" (ones), marked as needing no gradient. */
deft_tensor *deft_batch_norm_layer(deft_tensor *x, const char *name, const deft_batch_norm_options *opts);

/* ---- optimizers: graph nodes that update the parameters in place ----
 * An optimizer keeps the parameters it updates, their gradients and its state in flat storage, and updates all of
 * them in one pass per step. Build it after deft_backward; compile its step node together with the loss. */
typedef struct deft_optimizer deft_optimizer;
typedef struct deft_sgd_options {
    double lr, momentum, dampening, weight_decay;
    int nesterov;
} deft_sgd_options;
typedef struct deft_adamw_options {
    double lr, beta1, beta2, eps, weight_decay;
} deft_adamw_options;
/* torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2. */
deft_adamw_options deft_adamw_defaults(void);
typedef struct deft_step_options {
    int accumulate_steps;    /* k >= 1 (0 means 1): the update runs every k-th run with the mean of the k runs'
                              * gradients, so k micro-batches of a mean loss step as one batch k times larger */
    double max_grad_norm;    /* > 0: clip the accumulated gradients to this global L2 norm before updating */
} deft_step_options;
/* Over every parameter of g that has a gradient (they must share one device and one dtype, f32 or f64). The SGD
 * options are required; NULL AdamW options mean deft_adamw_defaults(); step may be NULL. The hyperparameters follow
 * torch.optim.SGD and torch.optim.AdamW exactly; bad ones (a NaN or negative lr, nesterov without momentum) fail. */
deft_optimizer *deft_sgd(deft_graph *g, const deft_sgd_options *o, const deft_step_options *step);
deft_optimizer *deft_adamw(deft_graph *g, const deft_adamw_options *o, const deft_step_options *step);
/* The node that accumulates the gradients and applies the update every k-th run. Its value (one f32) is the global
 * gradient norm, before clipping, of the last update (under f16 loss scaling: of the unscaled gradients, and the inf
 * or NaN norm of a step it skipped). */
deft_tensor *deft_optimizer_step(deft_optimizer *opt);
/* Takes effect at the next update, without recompiling. NaN, infinite or negative: DEFT_ERR_INVALID. */
deft_status deft_optimizer_set_lr(deft_optimizer *opt, double lr);
double deft_optimizer_lr(const deft_optimizer *opt);
int64_t deft_optimizer_updates(const deft_optimizer *opt);   /* updates applied so far */
/* The dynamic loss scale of an optimizer stepped by an f16 autocast program (deft_loss_scale_options) and the updates
 * it skipped for inf/NaN gradients, read at any time (on a GPU, after the queued steps: a small device-to-host copy).
 * Before any such program was compiled the scale is 1 and nothing was skipped. Either pointer may be NULL. */
deft_status deft_optimizer_loss_scale(const deft_optimizer *opt, double *scale, int64_t *skipped);

/* ---- parameter files ----
 * Format (little-endian): "DEFTPARM", u32 version (1), u32 count; then per parameter: u32 name length, the name,
 * u32 dtype, u32 ndim, ndim x i64 dims, u64 data bytes, the data, u32 CRC-32 of the data. Loading checks every
 * record against the graph's parameter of that name (dtype, shape) and the checksum before changing anything. */
deft_status deft_params_save(const deft_graph *g, const char *path);
deft_status deft_params_load(deft_graph *g, const char *path);

/* ---- datasets in the idx format (MNIST's files) ---- */
typedef struct deft_idx {
    int type;                /* the idx type code: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64 */
    int ndim;
    int64_t dims[DEFT_MAX_DIMS];
    void *data;              /* dims' product elements, host byte order */
    size_t bytes;
} deft_idx;
/* Reads a whole idx file; a bad magic, a short file or sizes that do not match the header are DEFT_ERR_IO with the
 * path and what was wrong. */
deft_status deft_idx_read(const char *path, deft_idx *out);
deft_status deft_idx_write(const char *path, const deft_idx *in);
void deft_idx_free(deft_idx *d);
/* A classification dataset: images as f32 in [0, 1] ([n, features]) and labels as i32. */
typedef struct deft_dataset {
    int64_t n, features;
    int n_classes;           /* 1 + the largest label */
    float *images;
    int32_t *labels;
} deft_dataset;
/* Loads an images idx file (u8, [n, rows, cols] or [n, features]) and a labels idx file (u8, [n]); the counts must
 * agree. */
deft_status deft_dataset_load_idx(const char *images_path, const char *labels_path, deft_dataset *out);
void deft_dataset_free(deft_dataset *d);
/* Copies `batch` samples starting at position `start` of `order` (a permutation of [0, n), or NULL for 0, 1, ...)
 * into x ([batch, features]) and y ([batch]). */
deft_status deft_dataset_batch(const deft_dataset *d, const int64_t *order, int64_t start, int64_t batch, float *x,
                               int32_t *y);
/* Fills order with a permutation of [0, n) drawn from seed (Fisher-Yates). NULL order (n > 0) or n < 0: an error. */
deft_status deft_shuffle(int64_t *order, int64_t n, uint64_t seed);

/* ---- CIFAR-10 (the binary version: data_batch_1..5.bin, test_batch.bin) ----
 * A record is one label byte (0..9) and 3072 pixel bytes: the red, green and blue 32x32 planes, row-major. */
#define DEFT_CIFAR_IMAGE_BYTES 3072
#define DEFT_CIFAR_CLASSES 10
typedef struct deft_cifar {
    int64_t n;
    uint8_t *pixels;         /* [n, 3, 32, 32] bytes, as in the files */
    int32_t *labels;         /* [n], 0..9 */
} deft_cifar;
/* Reads the records of the files in order. A file that is empty or not a whole number of records (truncated), a
 * label above 9 or a file that cannot be read is DEFT_ERR_IO with the path and what was wrong; nothing is kept. */
deft_status deft_cifar_read(const char *const *paths, int n_paths, deft_cifar *out);
/* train: dir/data_batch_1.bin .. dir/data_batch_5.bin; else dir/test_batch.bin. */
deft_status deft_cifar_load(const char *dir, int train, deft_cifar *out);
void deft_cifar_free(deft_cifar *d);
/* How batches are made. Pixels become (p / 255 - mean[c]) / std[c] with CIFAR-10's mean (0.4914, 0.4822, 0.4465)
 * and std (0.2470, 0.2435, 0.2616), in f32 [batch, 3, 32, 32] (DEFT_NCHW) or [batch, 32, 32, 3] (DEFT_NHWC).
 * Augmentation as torchvision's RandomCrop(32, padding=crop_padding) (zero pixels around) then
 * RandomHorizontalFlip(), drawn from seed, the epoch and the sample's index in the dataset: deterministic. Zeros
 * mean: NCHW, no augmentation, no shuffling. */
typedef struct deft_cifar_options {
    deft_layout layout;
    int crop_padding;        /* 0: no crop; 4 is the usual; at most 16 */
    int flip;                /* 1: mirror left-right with probability 1/2 */
    int shuffle;             /* 1 (feeds only): each epoch in a new order from seed and the epoch (deft_shuffle) */
    uint64_t seed;
} deft_cifar_options;
/* The crop offset and flip that sample `sample` gets in `epoch`: output pixel (y, x) is input pixel
 * (y + dy, (flip ? 31 - x : x) + dx), zero outside the image. */
typedef struct deft_cifar_augmentation {
    int dy, dx, flip;
} deft_cifar_augmentation;
deft_cifar_augmentation deft_cifar_augment_draw(const deft_cifar_options *o, int64_t epoch, int64_t sample);
/* As deft_dataset_batch: `batch` samples from position `start` of order (NULL: 0, 1, ...) into x and y, augmented
 * for `epoch` as opts says (NULL: NCHW, plain). */
deft_status deft_cifar_batch(const deft_cifar *d, const int64_t *order, int64_t start, int64_t batch,
                             const deft_cifar_options *opts, int64_t epoch, float *x, int32_t *y);
/* A feed makes batch (epoch, index) of d (which must outlive it) for a deft_loader: deft_cifar_feed_fill is a
 * deft_loader_fill over it, so decoding, normalising and augmenting run on the loader's thread. The last incomplete
 * batch of an epoch is dropped. */
typedef struct deft_cifar_feed deft_cifar_feed;
deft_status deft_cifar_feed_new(const deft_cifar *d, int64_t batch, const deft_cifar_options *opts,
                                deft_cifar_feed **out);
int64_t deft_cifar_feed_batches(const deft_cifar_feed *f);                       /* per epoch */
deft_status deft_cifar_feed_fill(void *feed, int64_t epoch, int64_t index, void *const *buffers);
void deft_cifar_feed_free(deft_cifar_feed *f);   /* after the loader that uses it */
/* A loader over the feed into x (f32, the feed's layout and batch) and y (i32 [batch]); other shapes are refused. */
deft_status deft_loader_new_cifar(deft_cifar_feed *f, deft_tensor *x, deft_tensor *y, int depth, deft_loader **out);

/* ---- several GPUs: data-parallel training over NCCL ----
 * A deft_dist holds NCCL communicators: every local GPU of one process (deft_dist_init_local), or one rank of a
 * group of processes on one host or many (deft_dist_init), which find each other through a rendezvous. Each rank
 * builds the same training graph on its own GPU and compiles it with the compile options `dist` and `dist_local`:
 * the program is then a replica whose step all-reduces (averages) the gradients that its optimizers read, in
 * buckets of at most `bucket_bytes`, each queued on a communication stream as soon as the backward pass has
 * produced the last gradient of the bucket (overlapping the rest of the backward pass), and joined back before the
 * optimizer's step reads them: all of it inside the step's CUDA Graph. Replicas start from rank 0's parameters and
 * buffers (broadcast at their first run) and stay bit-identical. NCCL's NVLink multicast (NVLS) is switched off
 * (NCCL_NVLS_ENABLE=0 unless the environment says otherwise). Every wait on another rank has a deadline: a rank
 * that does not come to the rendezvous, or stops or dies later, is a DEFT_ERR_RUNTIME on the others (the
 * communicators are aborted) within `timeout_s`, never a hang. Without NCCL (or without a GPU) the calls fail with
 * DEFT_ERR_NO_CUDA. */
typedef struct deft_dist deft_dist;
#define DEFT_HAS_DIST 1
int deft_has_nccl_build(void);                 /* 1 if built with NCCL */
typedef struct deft_dist_options {
    int rank, world;           /* this process's rank in [0, world) */
    /* How the ranks meet: "file:PATH" (rank 0 writes NCCL's id to PATH, which every rank can read: a shared
     * directory; the others take it and leave PATH.rankN beside it; PATH must not be left from an earlier run) or
     * "tcp:HOST:PORT" (rank 0 listens on PORT, the others connect to HOST:PORT). */
    const char *rendezvous;
    int device;                /* this rank's GPU (cuda:device); -1: rank modulo the visible GPUs */
    double timeout_s;          /* the deadline of every wait on another rank; 0: 300 */
} deft_dist_options;
/* One communicator per GPU cuda:0 .. cuda:ngpus-1 of this process (ranks 0 .. ngpus-1). Their replicas run their
 * steps together through deft_dist_run (one host thread per GPU). timeout_s: as in deft_dist_options. */
deft_status deft_dist_init_local(int ngpus, double timeout_s, deft_dist **out);
/* One rank of `world`, one process each; returns once every rank has joined (or with an error at the deadline). */
deft_status deft_dist_init(const deft_dist_options *o, deft_dist **out);
/* Stops the threads of deft_dist_run and destroys the communicators; free the programs compiled with it first. */
void deft_dist_free(deft_dist *d);
int deft_dist_world(const deft_dist *d);
int deft_dist_local_count(const deft_dist *d);                 /* communicators this process holds */
int deft_dist_rank(const deft_dist *d, int local);             /* the global rank of the local-th one, -1 if none */
deft_device deft_dist_device(const deft_dist *d, int local);   /* its GPU */
/* Runs one step of every local replica together (replicas[i] compiled with dist_local = i; anything else is
 * DEFT_ERR_INVALID), one host thread per GPU (started at the first run, kept until deft_dist_free), and returns once
 * each is queued, like deft_program_run. Call it from one thread at a time per dist. A replica of a deft_dist_init_local communicator
 * with several GPUs cannot run alone (its all-reduce would wait for the others): deft_program_run refuses it. */
deft_status deft_dist_run(deft_dist *d, deft_program *const *replicas, int n);
/* Waits for the queued steps of a replica, at most the timeout; past it the communicators are aborted and the
 * answer is DEFT_ERR_RUNTIME naming the rank (deft_program_read waits the same way). */
deft_status deft_program_dist_synchronize(deft_program *p);
/* deft_loader_new_dataset's loader for rank `rank` of `world`: global batch k of an epoch (k = 0, 1, ...; in the
 * order drawn from seed and the epoch with shuffle, the same on every rank) goes to rank k % world, so rank r takes
 * batches r, r + world, ...; every rank gets (n / batch) / world batches per epoch, the rest are dropped. */
deft_status deft_loader_new_dataset_shard(const struct deft_dataset *d, deft_tensor *x, deft_tensor *y, int shuffle,
                                          uint64_t seed, int rank, int world, int depth, deft_loader **out);

/* ---- half-precision conversion helpers (round to nearest even) ---- */
uint16_t deft_f32_to_f16(float f);
float deft_f16_to_f32(uint16_t h);
uint16_t deft_f32_to_bf16(float f);
float deft_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
