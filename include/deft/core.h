/* deft's core (included by deft.h): status codes, dtypes, devices, graphs, tensors and the builders of ops. */
#ifndef DEFT_PUBLIC_CORE_H
#define DEFT_PUBLIC_CORE_H

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
/* The message of the calling thread's last failure ("" if none yet). SQLite's convention: it is meaningful only right
 * after a call returned a status other than DEFT_OK (or a builder or deft_compile returned NULL), and it is not
 * cleared when a later call succeeds: after a success it may still hold an older failure's text. Read it (or copy
 * it) before the next deft call; the pointer stays valid for the thread's life, its text changes with the next
 * failure. Other threads' failures never change it. */
const char *deft_errmsg(void);
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
/* Sets a float parameter to draws from N(mean, std^2), at any time (as deft_param_set). seed 0 draws from the graph's
 * seed and the parameter (the same values for the same graph seed and build order; no other parameter's values
 * change); any other seed gives exactly deft_normal(..., mean, std, seed)'s values. GPT-2 starts its weights at
 * N(0, 0.02) and its residual projections at N(0, 0.02 / sqrt(2 n_layer)). A non-finite mean or std, or std < 0, is
 * DEFT_ERR_INVALID; a non-parameter DEFT_ERR_STATE; an i32 parameter DEFT_ERR_DTYPE. */
deft_status deft_param_init_normal(deft_tensor *param, double mean, double std, uint64_t seed);
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
/* GELU's tanh approximation, torch's gelu(x, approximate='tanh') and GPT-2's:
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
deft_tensor *deft_gelu_tanh(deft_tensor *a);
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

/* ---- comparisons: 1 where true and 0 elsewhere, in a's dtype; broadcasting ---- */
deft_tensor *deft_eq(deft_tensor *a, deft_tensor *b);
deft_tensor *deft_gt(deft_tensor *a, deft_tensor *b);
deft_tensor *deft_ge(deft_tensor *a, deft_tensor *b);

/* ---- gathers and selection ----
 * An index outside its range is an error with a message naming it and the range: on the CPU the run fails; on a
 * GPU (where finding it at run time would need a host wait) the rows it selected are NaN (0 for i32) and the
 * program's next deft_program_read fails, as for cross-entropy's targets. An index that is a constant is checked
 * when the op is built. The gradients add rows in a fixed order (sorted by index, then by position), never with
 * float atomics: the same inputs give the same bits on every run. */
/* torch.nn.functional.embedding: table [V, C] float, ids i32 of any shape [...] -> [..., C], rows of the table.
 * The table's gradient sums dy's rows per id; rows no id selects get 0. Under autocast it keeps the table's dtype
 * (a bf16 or f16 table gives a bf16 or f16 value). A GPT's LM head may read the same table transposed
 * (deft_matmul_t(x, table, 0, 1)): the gradients of both uses add up. */
deft_tensor *deft_embedding(deft_tensor *table, deft_tensor *ids);
/* torch.index_select: the entries of `a` at index (i32 [n]) along `axis` (< 0 counts from the end); the result is
 * a's shape with that axis n long. Any dtype; float ones have a gradient (scatter-add into a's shape). */
deft_tensor *deft_index_select(deft_tensor *a, int axis, deft_tensor *index);
/* torch.where: a where cond is nonzero (NaN counts as nonzero, as torch's bool conversion), b elsewhere; cond, a
 * and b broadcast (numpy rules). cond may have any dtype (deft_eq, deft_gt and deft_ge give 1 and 0 in their inputs'
 * dtype); a and b share one dtype, the result's. Gradients go to a where cond holds and to b elsewhere. */
deft_tensor *deft_where(deft_tensor *cond, deft_tensor *a, deft_tensor *b);
/* torch.Tensor.masked_fill: `value` (rounded to a's dtype) where mask is nonzero, a elsewhere; mask (any dtype)
 * broadcasts to a's shape. a's gradient is dy where mask is zero, 0 elsewhere. */
deft_tensor *deft_masked_fill(deft_tensor *a, deft_tensor *mask, double value);

/* ---- losses and layers ---- */
deft_tensor *deft_mse_loss(deft_tensor *pred, deft_tensor *target);          /* mean((pred - target)^2) */
/* Mean over N of -log softmax(logits)[target]: logits [N, C] float, targets [N] i32 class indices. A target out of
 * [0, C) is an error with a message: on the CPU the run fails; on a GPU (where finding it at run time would need a
 * host wait) the run's loss is NaN and the program's next deft_program_read fails. Fused, stable for large logits. */
deft_tensor *deft_cross_entropy(deft_tensor *logits, deft_tensor *targets);
typedef enum deft_reduction { DEFT_REDUCTION_MEAN = 0, DEFT_REDUCTION_SUM = 1 } deft_reduction;
typedef struct deft_cross_entropy_options {
    int use_ignore_index;    /* 1: rows whose target equals ignore_index add nothing and count for nothing */
    int32_t ignore_index;    /* with use_ignore_index (deft_cross_entropy_defaults: -100, torch's); any value */
    double label_smoothing;  /* in [0, 1): the target is (1 - ls) onehot + ls / C, as torch's */
    deft_reduction reduction;
} deft_cross_entropy_options;
/* torch.nn.functional.cross_entropy's defaults: ignore_index -100 (on), no smoothing, mean. */
deft_cross_entropy_options deft_cross_entropy_defaults(void);
/* torch.nn.functional.cross_entropy(logits, targets, ignore_index=, label_smoothing=, reduction=): logits [..., C]
 * float and targets [...] i32 (the leading dims flattened, a view); out []. Row i's loss is
 * (1 - ls) (lse_i - x_i[t_i]) + ls (lse_i - mean_c x_i[c]); mean divides the sum over the rows not ignored by their
 * count, so a batch whose targets are all ignored has the loss NaN (0 / 0, as torch 2.x) and a zero gradient; sum
 * adds them (0 when all are ignored). A target outside [0, C) that is not ignore_index is an error as for
 * deft_cross_entropy. NULL options: no ignore index, no smoothing, mean (deft_cross_entropy). A label_smoothing
 * outside [0, 1) or an unknown reduction is DEFT_ERR_INVALID. */
deft_tensor *deft_cross_entropy_ex(deft_tensor *logits, deft_tensor *targets, const deft_cross_entropy_options *o);
/* Zeroes each element with probability p and scales the rest by 1/(1-p). The mask comes from `seed` and the run
 * count: a new mask each run, the same one wherever the run reads it again (the backward pass, recomputation). */
deft_tensor *deft_dropout(deft_tensor *x, double p, uint64_t seed);
/* Normalises over the last dim: (x - mean) / sqrt(var + eps) * weight + bias; weight and bias ([D], x's dtype) may be
 * NULL; eps finite and >= 0. One node that keeps each row's mean and 1 / sqrt(var + eps) for its backward pass; on a
 * GPU a residual add before it (s = a + b read by the layer norm) and the add of the residual gradient after its dx
 * run fused with it. Under autocast it runs in f32, as torch's layer_norm does; where only products read it, its
 * value is written in the low dtype directly (computed in f32, rounded once: the cast's bits). */
deft_tensor *deft_layer_norm(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, double eps);
/* Scaled dot-product attention: softmax(scale * q k^T [+ causal mask]) v over q, k, v [B, H, T, D] (one shape, a
 * float dtype, D at most DEFT_ATTENTION_MAX_HEAD). One node, fused like FlashAttention: no T x T tensor exists in
 * the arena; the node keeps beside its value only each row's log-sum-exp ([B, H, T], f32, f64 for f64 inputs) for
 * its backward node, which gives dq, dk and dv at once. Causal: query i sees keys 0..i. Under autocast q, k and v
 * are cast to the low dtype, as for a matmul (statistics and accumulation stay f32). o may be NULL (not causal,
 * scale 1/sqrt(D)). */
typedef struct deft_attention_options {
    int causal;              /* 1: query i attends to keys j <= i only */
    double scale;            /* multiplies q k^T; 0: 1/sqrt(D) */
} deft_attention_options;
#define DEFT_ATTENTION_MAX_HEAD 128
deft_tensor *deft_attention(deft_tensor *q, deft_tensor *k, deft_tensor *v, const deft_attention_options *o);
/* The same attention read straight out of a fused projection, as GPT-2's c_attn gives it: qkv [B, T, 3C] holds q, k
 * and v as the thirds of its last dim, each [B, T, H, D] with C = heads * D (C divisible by heads, D at most
 * DEFT_ATTENTION_MAX_HEAD). Returns [B, T, C] laid out [B, T, H, D]: equal to deft_attention(q, k, v) permuted to
 * [B, T, H, D] and reshaped, with q = permute(reshape(slice(qkv, 2, 0, C), [B, T, H, D]), [0, 2, 1, 3]) and so on,
 * but with no copy of q, k, v or the output: the kernels read and write those strides (cuDNN's too), and the
 * gradient node writes qkv's gradient [B, T, 3C] directly, dq, dk and dv at their places. */
deft_tensor *deft_attention_packed(deft_tensor *qkv, int heads, const deft_attention_options *o);
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

/* ---- half-precision conversion helpers (round to nearest even) ---- */
uint16_t deft_f32_to_f16(float f);
float deft_f16_to_f32(uint16_t h);
uint16_t deft_f32_to_bf16(float f);
float deft_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
