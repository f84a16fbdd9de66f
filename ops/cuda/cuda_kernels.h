/* The CUDA backend's entry point, callable from C. Declared in every build; defined only when CUDA is built. */
#ifndef DEFT_CUDA_KERNELS_H
#define DEFT_CUDA_KERNELS_H

#include "graph_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a program asks kernels to run (bits of `flags`). */
#define DEFT_CUDA_ALLOW_TF32 1u      /* f32 matmuls may use TF32 tensor cores (compile option `tf32`) */
#define DEFT_CUDA_DETERMINISTIC 2u   /* only cuDNN algorithms that give the same bits every run (`deterministic`) */
#define DEFT_CUDA_CONV_GEMM_NEVER 4u /* no convolution as im2col and a product (`conv_gemm` DEFT_CONV_GEMM_NEVER) */
#define DEFT_CUDA_CONV_GEMM_F32 8u   /* f32 convolutions as im2col and a product too (DEFT_CONV_GEMM_WITH_F32) */
#define DEFT_CUDA_CUDNN_FIND 16u     /* cuDNN measures its candidate algorithms (`cudnn_find`) */
#define DEFT_CUDA_MATMUL_FIND 32u    /* cuBLASLt's candidate algorithms are timed (`matmul_find`) */

/* Runs node n on the current CUDA device, enqueued on `stream` (a cudaStream_t; NULL for the legacy stream).
 * Pointers are device pointers with the same contract as deft_cpu_run_node. Returns a status carrying the CUDA or
 * cuBLAS error string on failure. */
deft_status deft_cuda_run_node(const deft_tensor *n, void *out, const void *const *in, void *stream, unsigned flags);

/* What node n's first run would build in a library's cache (cuDNN's fused attention plans: a graph, kernels compiled
 * and loaded), built now on the current device for `stream`, so that no run has to: a program calls it at compile.
 * Nodes with nothing to build return DEFT_OK at once. */
deft_status deft_cuda_prepare_node(const deft_tensor *n, void *stream, unsigned flags);

/* Batch norm node n (DEFT_OP_BATCH_NORM) followed by the add of `residual` (n's shape and dtype, contiguous; NULL for
 * none) and a ReLU (relu != 0), stored once in `out`: each step rounded as its own kernel would round it, so the
 * result is that of the three kernels bit for bit. Runs a fused group of passes/fusion_norm.c. */
deft_status deft_cuda_batch_norm_epilogue(const deft_tensor *n, void *out, const void *const *in, const void *residual,
                                          int relu, void *stream);

/* Batch norm's backward node n (DEFT_OP_BATCH_NORM_WEIGHT_GRAD or DEFT_OP_BATCH_NORM_GRAD) reading, in place of its
 * dy, the gradient of a ReLU: in[0] is that ReLU's incoming gradient and relu_out its output, masked on load as the
 * act_grad kernel masks them (the same values bit for bit); the other inputs as n's own step passes them. Runs a
 * fused group of passes/fusion_norm_grad.c. */
deft_status deft_cuda_batch_norm_grad_masked(const deft_tensor *n, void *out, const void *const *in,
                                             const void *relu_out, void *stream);

/* Layer norm node n (DEFT_OP_LAYER_NORM) reading x = a + b in place of its x: the sum rounded to x's dtype as the add
 * kernel rounds it, stored in s (the residual stream) and normalised into out (with its statistics; in n's dtype,
 * which may be bf16 or f16 beside an f32 x), bit for bit what the add's kernel and n's own give. b has b_dtype: x's,
 * or bf16 or f16 beside an f32 x (the source of a cast to f32, widened on load, which is exact). in: n's sources as its own step passes them (in[0] unread). Layer norm's dx node n
 * (DEFT_OP_LAYER_NORM_GRAD) with `residual` (n's shape and dtype) added to it: out = residual + dx, dx rounded as its
 * store would round it. Run fused groups of passes/fusion_layer_norm.c. */
deft_status deft_cuda_layer_norm_add(const deft_tensor *n, void *out, void *s, const void *a, const void *b,
                                     deft_dtype b_dtype, const void *const *in, void *stream);
deft_status deft_cuda_layer_norm_grad_add(const deft_tensor *n, void *out, const void *const *in, const void *residual,
                                          void *stream);
/* Layer norm's dx node n (residual added when not NULL, as deft_cuda_layer_norm_grad_add) and the weight gradient
 * node wg reading the same dy, x and ln (in: n's sources), in one pass over the rows that also sums wg's partials
 * (cuda_layer_norm.cu): dx and wg bit for bit what their own kernels give. */
deft_status deft_cuda_layer_norm_grad_sums(const deft_tensor *n, void *out, const void *const *in, const void *residual,
                                           const deft_tensor *wg, void *wg_out, void *stream);

/* Cross-entropy's loss node and its gradient node over the same logits and targets, run as one pass over each row
 * (cuda_cross_entropy.cu, cuda_ce_stream.cu): both nodes' values, bit for bit what their own kernels give; the
 * gradient may overwrite the logits. Runs a pair of passes/fusion_pairs.c. */
deft_status deft_cuda_cross_entropy_pair(const deft_tensor *loss, const deft_tensor *grad, void *loss_out,
                                         void *grad_out, const void *dloss, const void *logits, const void *targets,
                                         void *stream);
/* An activation node act (GELU, its tanh form, SiLU, tanh or sigmoid) and the act_grad node grad of the same
 * activation over the same x, in one pass: y = act(x) and dx = grad's value from dy and x, each rounded as its own
 * kernel rounds it (cuda_act_pair.cu). Each output may share its storage with x or dy, not with the other output.
 * Runs a pair of passes/fusion_pairs.c. */
deft_status deft_cuda_act_pair(const deft_tensor *act, const deft_tensor *grad, void *y, void *dx, const void *x,
                               const void *dy, void *stream);

/* Casts casts[0..n) (DEFT_OP_CAST nodes of one source and one destination dtype) in one launch: in[i] the source of
 * casts[i], out[i] its value; the same values as n separate casts. Runs a fused group of passes/fusion_casts.c. */
#define DEFT_CASTS_MAX 24   /* casts per launch: a fused group's members (DEFT_FUSED_MAX_OPS) */
deft_status deft_cuda_casts_run(const deft_tensor *const *casts, void *const *out, const void *const *in, int n,
                                void *stream);

/* Whether cuDNN has an algorithm for convolution node n (a conv2d or one of its gradients) at all; when not, why
 * (into why[0..n)) for a compile to refuse it with. The gradients of f64 NHWC convolutions have none. */
bool deft_cuda_conv_supported(const deft_tensor *n, char *why, size_t why_bytes);
/* Whether the attention kernels (ops/cuda/cuda_attention.cu) take node n (attention or its gradient): f32, f16,
 * bf16, head size up to DEFT_ATTENTION_MAX_HEAD; when not, why. */
bool deft_cuda_attention_supported(const deft_tensor *n, char *why, size_t why_bytes);
/* Whether deft's tensor-core attention kernels (ops/cuda/cuda_attention_mma.cu) take node n with these buffers: f16
 * or bf16, head size 32, 64, 96 or 128, every buffer 16-byte aligned. */
bool deft_cuda_attention_mma_usable(const deft_tensor *n, void *out, const void *const *in);

/* cuDNN's fused attention (ops/cuda/cuda_attention_cudnn.cu) for an attention node or its gradient, with the
 * buffers of deft_cuda_attention (the forward's log-sum-exp past its value, the backward's f32 scratch), on `st` (a
 * cudaStream_t). _usable: f16 or bf16, head size a multiple of 8 up to 128, T >= 2 for the gradient, an sm80+ GPU, a
 * build with cuDNN (no cuDNN call). Whatever cuDNN will not run (its graph or plan refused, the plan's workspace
 * past the stream's cuDNN scratch, a problem first met inside a CUDA Graph capture, misaligned buffers) returns
 * DEFT_CUDNN_ATTENTION_REFUSED with the reason and cuDNN's own text, nothing enqueued: run deft's kernels then.
 * deft_cudnn_attention's backward is deterministic (DEFT_CUDA_DETERMINISTIC); _flags takes the program's flags, and
 * without that bit the backward sums dq with f32 atomics (faster, less workspace, bits vary run to run). */
#define DEFT_CUDNN_ATTENTION_REFUSED DEFT_ERR_DEVICE
struct CUstream_st;
bool deft_cudnn_attention_usable(const deft_tensor *n);
deft_status deft_cudnn_attention(const deft_tensor *n, void *out, const void *const *in, struct CUstream_st *st);
deft_status deft_cudnn_attention_flags(const deft_tensor *n, void *out, const void *const *in, struct CUstream_st *st,
                                       unsigned flags);
/* Builds the plan node n will run with under flags, on the current device for stream st, before any run (a refused
 * problem is remembered and returns DEFT_OK). */
deft_status deft_cudnn_attention_prepare(const deft_tensor *n, struct CUstream_st *st, unsigned flags);
/* One line on the plan node n runs with under flags (engine, workspace; 1), or the full text of this thread's last
 * refusal (0), into buf. */
int deft_cudnn_attention_describe(const deft_tensor *n, unsigned flags, char *buf, size_t cap);
/* Destroys cuda:dev's plans and cuDNN handle (its work done, and no CUDA Graph left that captured them). */
void deft_cudnn_attention_release(int dev);
/* deft's own attention kernels (the tensor-core ones where they take n and the knob allows, else the plain ones),
 * callable from C: what runs where cuDNN refuses, and the reference the tests compare cuDNN with. */
deft_status deft_cuda_attention_own(const deft_tensor *n, void *out, const void *const *in, struct CUstream_st *st);

/* The library handles of cuda:dev (cuBLAS, cuBLASLt, cuDNN), destroyed once its work is done
 * (deft_memory_release_all); the next call on it makes new ones. */
void deft_cuda_cublas_release(int dev);
void deft_cuda_cublaslt_release(int dev);
void deft_cuda_cudnn_release(int dev);
/* Makes cuda:dev's cuBLAS and cuBLASLt handles now (a program's compile) rather than at its first product: making one
 * allocates on the device, which a data-parallel replica's first run must not do while its peers' collectives wait. */
deft_status deft_cuda_cublas_prepare(int dev);
deft_status deft_cuda_cublaslt_prepare(int dev);

struct deft_optimizer;
struct deft_optimizer_segment;
/* An optimizer's step (ops/cuda/cuda_optimizer.cu) on `stream`, reading its gradients through `table` (one row per
 * gradient, runtime/optimizer_tables_cuda.c); out is the norm. Queued without a host wait. */
deft_status deft_cuda_optimizer_run(struct deft_optimizer *o, const struct deft_optimizer_segment *table, void *out,
                                    void *stream);
/* A part of a split step: a piece's block sums into out (f64), or the finisher's norm from the pieces' sums. */
deft_status deft_cuda_optimizer_part_run(struct deft_optimizer *o, const struct deft_optimizer_segment *table,
                                         void *out, void *stream);
/* The parameters' whole low-precision copy written from their values (ir/optimizer.h's flat_low), on `stream`. */
deft_status deft_cuda_optimizer_copy_refresh(struct deft_optimizer *o, void *stream);

/* Data parallel's bucket packing: bytes[i] of tensors[i] to packed + offsets[i], or back (unpack), in launches of
 * at most DEFT_PACK_MAX gradients. */
#define DEFT_PACK_MAX 64   /* gradients per packing launch */
deft_status deft_cuda_dist_pack(void *const *tensors, const size_t *offsets, const size_t *bytes, int n, void *packed,
                                int unpack, void *stream);

/* DEFT_CUBLAS_WORKSPACE_BYTES and DEFT_CUDNN_WORKSPACE_BYTES: the caps of the scratch a stream's cuBLAS and cuDNN
 * calls get from the caching allocator, sized to what their chosen algorithms ask for (shown in memory reports). */
#include "cuda_workspace.h"
/* What a plain cuBLAS call asks of its stream's scratch on cuda:dev (cuda_matmul.cu): cuBLAS's recommendation,
 * DEFT_CUBLAS_PLAIN_WORKSPACE_HOPPER_BYTES from compute capability 9 on, else DEFT_CUBLAS_PLAIN_WORKSPACE_BYTES. */
size_t deft_cuda_cublas_floor(int dev);

/* The groups of classes a thread of cross-entropy's register kernels holds for rows of c classes of dtype dt
 * (cuda_cross_entropy.cu), for tests: 0 where the plain kernels run (the CE_REFERENCE debug knob included). */
int deft_cuda_ce_regs_groups(deft_dtype dt, int64_t c);
/* 1 where cross-entropy's streaming kernels (cuda_ce_stream.cu) take rows of c classes of dtype dt on the current
 * device, their buffers 16-byte aligned (they come before the register kernels); 0 otherwise (the knob included). */
int deft_cuda_ce_streams(deft_dtype dt, int64_t c);

#ifdef __cplusplus
}
#endif
#endif
