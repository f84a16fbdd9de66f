/* The GPU's tuning constants: the CUDA kernels' block counts, chunk sizes, thresholds, vector widths and scratch sizes,
 * the fusion passes' GPU decisions, and data parallel's bucket and NCCL settings. Each comes with one line: what it
 * is and the measurement behind it. Every measurement named here ran on H200s (132 SMs, as an H100 SXM has);
 * "RESULTS: x" names the section of bench/RESULTS.md that holds its figures ("Figures" is the section "Figures
 * formerly in code comments"). A value with no measurement recorded says so.
 *
 * What depends on the card is asked of it, not set here: one wave of one-block-per-SM work is deft_cuda_sm_count
 * (mem/device_internal.h), and the constants "per SM" below are multiplied by it. The optimizer's norm blocks
 * (DEFT_OPTIMIZER_STEP_BLOCKS, DEFT_OPTIMIZER_NORM_BLOCKS) stay in ir/optimizer.h, as ir/ sits below ops/.
 *
 * Plain C without CUDA types: included by ops/cuda, passes/ and dist/. */
#ifndef DEFT_CUDA_TUNING_H
#define DEFT_CUDA_TUNING_H

#include <stddef.h>
#include <stdint.h>

/* ---- scratch per stream (cuda_workspace.cu) ---- */
/* A stream's cuBLAS and cuDNN scratch is what the algorithms chosen on it ask for; these are its caps, which the
 * algorithms are chosen within (cuBLASLt's MAX_WORKSPACE_BYTES, cuDNN's candidates by their memory). */
/* cuBLAS(Lt)'s cap on a main stream; no other size measured (RESULTS: "Checkpointing ResNet-18" counts it). */
#define DEFT_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)
/* cuDNN's cap on a main stream; no other size measured (RESULTS: the same). */
#define DEFT_CUDNN_WORKSPACE_BYTES ((size_t)64 << 20)
/* cuDNN's cap on a side lane: ResNet-18 bf16 b512, step and peak, full against small (RESULTS: Eighth round). */
#define DEFT_CUDNN_SIDE_WORKSPACE_BYTES ((size_t)16 << 20)
/* cuBLAS(Lt)'s cap on a side lane: measured together with the cuDNN one above (RESULTS: Eighth round). */
#define DEFT_CUBLAS_SIDE_WORKSPACE_BYTES ((size_t)4 << 20)
/* The floor of a stream's cuBLAS scratch once a plain cuBLAS call (cublasGemmEx, which chooses its own kernel within
 * what cublasSetWorkspace gives it) runs there: cuBLAS's documented recommendation for user workspaces
 * (cublasSetWorkspace: 32 MiB on Hopper, 4 MiB on other architectures), cut to the stream's cap; not measured. */
#define DEFT_CUBLAS_PLAIN_WORKSPACE_BYTES ((size_t)4 << 20)
#define DEFT_CUBLAS_PLAIN_WORKSPACE_HOPPER_BYTES ((size_t)32 << 20)
/* Batch norm's fast sums: column arrival counts a stream's scratch holds; a capacity, no measurement recorded. */
#define DEFT_NORM_COUNTERS 65536
/* Batch norm's fast sums: double2 chunk partials a stream's scratch holds; a capacity, no measurement recorded. */
#define DEFT_NORM_PARTIALS 229376

/* ---- batch norm's fast kernels (cuda_norm_fast.cu) ---- */
/* Elements of a channel per block in the plane walk (NCHW); no measurement recorded. */
#define DEFT_BN_PLANE_CHUNK 4096
/* The row walk's block below DEFT_BN_WIDE_ROWS: ResNet-18 steps, 256, 512, 1024 everywhere (RESULTS: Seventh round). */
#define DEFT_BN_ROW_THREADS 256
/* Rows from which the row walk's blocks are wide: ResNet-18 steps, from 8192 to 65536 rows (RESULTS: Seventh round). */
#define DEFT_BN_WIDE_ROWS 8192
/* The row walk's wide block, twice the loads in flight: measured with the rows above (RESULTS: Seventh round). */
#define DEFT_BN_WIDE_THREADS 512
/* Bytes of a row per block in the row walk: two 32-byte sectors; no measurement recorded. */
#define DEFT_BN_ROW_BYTES 64
/* The row walk's blocks per SM (deft_cuda_sm_count): ResNet-18 bf16 steps, 1 to 16 (RESULTS: Fifth round, Figures). */
#define DEFT_BN_ROW_BLOCKS_PER_SM 1

/* ---- small and thin products (cuda_matmul_small.cu) ---- */
/* Warps of a block in the one-warp-per-output kernel; no measurement recorded. */
#define DEFT_SMALL_WARPS_PER_BLOCK 4
/* Largest f32 product (multiply-adds) in one launch, not cuBLASLt's two: small MLP steps (RESULTS: Third round). */
#define DEFT_SMALL_MAX_MACS ((int64_t)1 << 15)
/* Largest K of those products; no measurement recorded. */
#define DEFT_SMALL_MAX_K 4096
/* Widest side of a skinny product (10 classes): cuBLAS against these kernels (RESULTS: Sixth round, Ninth round). */
#define DEFT_SKINNY_SIDE 16
/* Largest skinny product (multiply-adds); no measurement of the bound recorded. */
#define DEFT_SKINNY_MAX_MACS ((int64_t)1 << 24)
/* K up to which one thread computes a half output alone (no lanes to split K over); no measurement recorded. */
#define DEFT_SMALL_THREAD_K 32
/* The thin a^T b kernel's block; no other size measured. */
#define DEFT_THIN_THREADS 512
/* Columns of a per thin a^T b block: the mid MLP's classifier gradient, 8 against 32 (RESULTS: Figures). */
#define DEFT_THIN_COLS 8

/* ---- stem convolutions as im2col and a product (cuda_conv_gemm.cu) ---- */
/* Largest window row (KH * KW * C, padded) taken: a scope limit for stems, not measured. */
#define DEFT_CONV_GEMM_MAX_K 1024
/* Fewest rows worth a chunk: below it the products are too thin to beat cuDNN; no measurement recorded. */
#define DEFT_CONV_GEMM_MIN_ROWS 256
/* Columns per thread in the fast im2col (16 bytes of halves): the plain kernel against it (RESULTS: Sixth round). */
#define DEFT_IM2COL_VEC 8

/* ---- the optimizer's step (cuda_optimizer.cu, cuda_optimizer_fused.cu, cuda_optimizer_math.cuh) ---- */
/* Threads of an optimizer block; no measurement recorded. */
#define DEFT_OPT_THREADS 256
/* Elements one gather block covers at least; no measurement recorded. */
#define DEFT_OPT_GATHER_CHUNK 2048
/* Scalar loads in flight per thread: without, the step ran at about half the memory's rate (RESULTS: Third round). */
#define DEFT_OPT_UNROLL 4
/* f32 elements per load (16 bytes): ResNet-18 steps against one element a load (RESULTS: Seventh round). */
#define DEFT_OPT_VEC 4
/* Vectors in flight per thread in the vector walk; no measurement recorded. */
#define DEFT_OPT_VEC_UNROLL 2
/* Gradient loads in flight per thread in the direct step's norm (cuda_optimizer_direct.cu), whose order (one element
 * a thread, a grid's stride apart) rules out vectors: this many of 4 or 8 bytes, twice as many of 2 (bf16, f16), for
 * the bytes in flight; no measurement recorded. */
#define DEFT_OPT_NORM_UNROLL 8
/* Largest model (elements) whose step is one block without the ticket (RESULTS: Third round); bound not measured. */
#define DEFT_OPT_ONE_BLOCK_MAX ((int64_t)1 << 16)

/* ---- reductions, losses, pooling, packing ---- */
/* Longest reduced run that takes a thread per output (with the count below); no measurement recorded. */
#define DEFT_REDUCE_THREAD_MAX_LEN 32
/* Outputs from which such short reductions take a thread per output; no measurement recorded. */
#define DEFT_REDUCE_THREAD_MIN_OUTPUTS 2048
/* Outputs from which reductions of neighbouring outputs take a thread per output; no measurement recorded. */
#define DEFT_REDUCE_KEPT_MIN_OUTPUTS 8192
/* Blocks of cross-entropy's first kernel at most (its partials' buffer); no measurement recorded. */
#define DEFT_CE_MAX_BLOCKS 1024
/* Windows per side of a tile in NHWC max pooling's backward: ResNet-18, tiled against not (RESULTS: Fifth round). */
#define DEFT_POOL_TILE 4
/* Blocks per gradient at most in data parallel's bucket packing; no measurement recorded. */
#define DEFT_PACK_BLOCKS_MAX 64

/* ---- fusion decisions for GPUs (passes/) ---- */
/* Fewest FLOP of a product batched with others (fusion_batch.c): mid MLP products (RESULTS: Ninth round). */
#define DEFT_BATCH_MIN_FLOPS 64e6
/* Output elements of a tile of a batched product (128 x 128); a wave is deft_cuda_sm_count tiles (fusion_batch.c). */
#define DEFT_BATCH_TILE_ELEMENTS ((int64_t)128 * 128)
/* Fewest FLOP of a product worth the side lane (side_lane.c): mid MLP and ResNet-18 steps (RESULTS: Eighth round). */
#define DEFT_SIDE_MIN_FLOPS 64e6

/* ---- data parallel (passes/grad_buckets.c, dist/) ---- */
/* Gradient bucket bytes: mid MLP on 2 and 4 GPUs, 1 to 25 MiB buckets (RESULTS: Fourth round, data parallel). */
#define DEFT_BUCKET_DEFAULT_BYTES ((size_t)8 << 20)
/* The last bucket's bytes at most: other splits tried on 2 and 4 GPUs, dropped (RESULTS: Sixth round, Tenth round). */
#define DEFT_LAST_BUCKET_DEFAULT_BYTES ((size_t)1 << 20)
/* Gradients of one dtype from which a bucket is packed into one buffer: ResNet-18 (RESULTS: Eleventh round). */
#define DEFT_DDP_PACK_FROM 4

#endif
