/* The compile options resolved once (deft_compile_options with its defaults applied, checked, and the questions
 * several passes ask answered in one place). Every pass reads this, never deft_compile_options; the program keeps
 * it (p->config). */
#ifndef DEFT_COMPILE_CONFIG_H
#define DEFT_COMPILE_CONFIG_H

#include "graph_internal.h"

typedef struct deft_config {
    /* planning */
    size_t memory_budget;          /* 0: none */
    bool no_reuse;                 /* every buffer its own arena range */
    bool reorder;                  /* try the reordered steps, kept when the arena shrinks */
    int checkpoint;                /* a deft_checkpoint_policy, as given (the rewrite checks it) */
    int checkpoint_segments;
    /* autocast */
    deft_dtype autocast;           /* DEFT_F32: off */
    bool loss_scaled;              /* f16 autocast with dynamic loss scaling */
    deft_loss_scale_options loss_scale;   /* with GradScaler's defaults filled in (only those when !loss_scaled) */
    bool param_copies;             /* optimized parameters read through their optimizers' copies (runtime/param_copies.c) */
    /* the optimizer and data parallel */
    bool optimizer_in_backward;
    struct deft_dist *dist;        /* NULL: not a replica */
    int dist_local;
    size_t bucket_bytes;           /* 0 given: DEFT_BUCKET_DEFAULT_BYTES */
    size_t last_bucket_bytes;      /* 0 given: DEFT_LAST_BUCKET_DEFAULT_BYTES */
    bool split_per_bucket;         /* dist with dist_bucket_pieces: optimizer pieces per gradient bucket */
    int zero_stage;                /* 0, or 1 (ZeRO-1: dist's optimizers sharded, dist/dist_zero.c) */
    bool dist_bf16_grads;          /* dist_reduce_dtype bf16: the weights' bf16 gradients averaged as they are */
    /* what the GPU passes may do */
    bool fusion;                   /* not no_fusion */
    bool product_batches;          /* products of one shape may run as one batch (passes/fusion_batch.c) */
    bool side_lane;                /* weight-gradient work may take a GPU's second stream (passes/side_lane.h) */
    bool fold_relu_grad;           /* ReLU gradients may fold into batch norm's backward */
    bool cheap_recompute;          /* not no_cheap_recompute (passes/checkpoint.h) */
    bool fuse_low_precision;       /* bf16 and f16 elementwise chains fuse too */
    bool cuda_graphs;              /* not no_cuda_graphs */
    unsigned cuda_flags;           /* DEFT_CUDA_* (cuda_kernels.h): tf32, deterministic, conv_gemm, cudnn_find,
                                    * matmul_find */
    /* the pipeline (passes/pipeline.h) */
    int last_stage;                /* the index of the stage the compile stops after */
} deft_config;

/* Resolves o (NULL: every default) into *out. DEFT_ERR_INVALID, with a message, for an option out of range: an
 * autocast dtype other than bf16 or f16, a zero_stage other than 0 and 1 or one without dist (or with
 * optimizer_in_backward or dist_bucket_pieces), loss-scale options without f16 autocast or out of their ranges, an
 * unknown conv_gemm mode, a stop_after that names no stage. */
deft_status deft_config_resolve(const deft_compile_options *o, deft_config *out);

/* Whether the program counts its bytes tightly: a memory budget, checkpointing, or optimizer in backward (which frees
 * each gradient where its piece runs). Product batches and the side lane both keep inputs alive longer than the plan
 * would, so neither runs then. */
bool deft_config_tight_memory(const deft_config *c);

#endif
