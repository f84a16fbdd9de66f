/* The CPU backend's tuning constants: the parallel thresholds, chunk and tile sizes of the kernels in ops/cpu. None
 * was set by a recorded measurement (bench/RESULTS.md holds no CPU kernel figures): each line says what it is and the
 * reasoning behind its value, for a measurement to replace. Those marked "fixes the order" also fix a summation order:
 * another value changes results in the last bits, and the result still does not depend on the thread count. */
#ifndef DEFT_CPU_TUNING_H
#define DEFT_CPU_TUNING_H

/* Elements below which starting a parallel region costs more than it saves; not measured. */
#define DEFT_CPU_PAR_MIN 32768
/* Elements of a row segment in elementwise walks, so that a few long rows spread over every thread; not measured. */
#define DEFT_CPU_SEGMENT 16384
/* Reduced elements per block of one output, summed alone, then the blocks in order (fixes the order); not measured. */
#define DEFT_CPU_RED_BLOCK 8192
/* Neighbouring outputs per task when a reduction keeps the innermost run; not measured. */
#define DEFT_CPU_RED_CHUNK 256
/* Side of the square tiles of strided gathers, so that a transpose reads and writes whole cache lines; not measured. */
#define DEFT_CPU_TRANSPOSE_TILE 32
/* Columns handled together when softmax's axis is not the innermost one (contiguous rows per pass); not measured. */
#define DEFT_CPU_SOFTMAX_CHUNK 256
/* Row chunks of cross-entropy's loss, summed alone, then in order (fixes the order); not measured. */
#define DEFT_CPU_CE_CHUNKS 64

#endif
