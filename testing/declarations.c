/* deft_testing.h declares again, under their own names, library functions that tests call (the tests may include
 * no internal header). This file includes both, so that a declaration that drifts from the library's is a compile
 * error here instead of a silent mismatch at link time. It defines nothing. */
#include "deft_testing.h"

#include "build_conv.h"
#include "build_grad_ops.h"
#include "caching_allocator.h"
#include "cuda_fault.h"
#include "cuda_kernels.h"
#include "cuda_workspace.h"
#include "device_internal.h"
#include "dist.h"
#include "optimizer.h"
#include "pinned_allocator.h"
#include "prefetch.h"
#include "program_run.h"
