/* The library's debug knobs: switches that send kernels down their reference paths or shape how a path cuts its
 * work, so that tests can compare two paths on the same data. They are not options: a program's behaviour comes
 * from its compile options (passes/compile_config.h); these exist for tests and for a person chasing a bug.
 *
 * One table, filled from the environment on first use (DEFT_<NAME>, e.g. DEFT_MATMUL_REFERENCE=1, so a knob can
 * still be flipped by hand), and changed after that only by deft_debug_set (tests: deft_testing_set_debug). Reads
 * are cheap atomics: kernels ask at each launch, and a CUDA Graph replay never asks. base/config.c is the one file
 * of the library that reads the environment. */
#ifndef DEFT_BASE_CONFIG_H
#define DEFT_BASE_CONFIG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum deft_debug_knob {
    DEFT_DEBUG_MATMUL_REFERENCE,   /* 1: every product takes the reference kernels (no cuBLASLt, no batches) */
    DEFT_DEBUG_BN_REFERENCE,       /* 1: batch norm takes its plain kernels, not the fast ones */
    DEFT_DEBUG_POOL_REFERENCE,     /* 1: pooling takes its plain kernels, not the fast ones */
    DEFT_DEBUG_FUSED_REFERENCE,    /* 1: fused elementwise chains run one element per thread, never vectorised */
    DEFT_DEBUG_CONV_GEMM_PLAIN,    /* nonzero: the im2col of the convolutions as products takes its plain kernel */
    DEFT_DEBUG_CONV_GEMM_ROWS,     /* > 0: those convolutions cut their rows into chunks of at most this many */
    DEFT_DEBUG_ATTENTION_KERNEL,   /* attention on a GPU: 0 the fastest that takes it, 1 the plain kernels, 2 deft's
                                    * tensor-core kernels, 3 cuDNN's fused attention (each falls back to the plain) */
    DEFT_DEBUG_SHAPE_REFERENCE,    /* 1: permutes, strided slices and concats on a GPU take the one-element kernel */
    DEFT_DEBUG_SLICE_GRAD_ADDS,    /* 1: backward adds the zero-padded gradients of slices, never one concat of them */
    DEFT_DEBUG_CE_REFERENCE,       /* 1: cross-entropy on a GPU re-reads each row per pass, never holds it in registers */
    DEFT_DEBUG_MAP_SCALAR,         /* 1: unary, scalar and activation-gradient ops on a GPU: one element a thread */
    DEFT_DEBUG_LN_WIDE,            /* 1: autocast keeps layer norm's f32 value, cast down (read at the rewrite) */
    DEFT_DEBUG_LN_REFERENCE,       /* 1: layer norm on a GPU: plain kernels (rows re-read, plain column sums) */
    DEFT_DEBUG_OPT_REFERENCE,      /* 1 when an optimizer is built: its GPU step keeps flat gradients and runs the plain
                                      kernels (gather, norm, prepare, update; ops/cuda/cuda_optimizer.cu) */
    DEFT_DEBUG_KNOB_COUNT
} deft_debug_knob;

/* The knob's value (0 when it was never set, here or in the environment). */
int64_t deft_debug(deft_debug_knob knob);
/* Sets the knob for every later call, on every thread; out-of-range knobs are ignored. */
void deft_debug_set(deft_debug_knob knob, int64_t value);
/* The knob's name without the DEFT_ prefix ("MATMUL_REFERENCE"), NULL when out of range. */
const char *deft_debug_name(deft_debug_knob knob);
/* The knob of that name (with or without the DEFT_ prefix), -1 when there is none. */
int deft_debug_find(const char *name);

/* The environment's value of `name` at this call (NULL when unset), for the variables that are a launcher's
 * protocol rather than knobs (dist/dist_env.c reads torchrun's, Open MPI's and PMI's RANK, WORLD_SIZE, ...): read
 * at each call, never kept, so that the environment is still read in this file alone. */
const char *deft_env_get(const char *name);

#ifdef __cplusplus
}
#endif
#endif
