/* deft_memory_release_all: the caches of mem/ and the libraries' handles of ops/ given back in one call, GPUs
 * first. */
#include "cuda_kernels.h"
#include "device_errors.h"
#include "device_internal.h"

#ifdef DEFT_HAVE_CUDA
#include "cuda_workspace.h"
#endif

/* cuda:i's work finished; the libraries' handles, the legacy stream's library scratch and the data-error record
 * freed (streams programs own free their scratch); the pool's unused segments given back. */
static deft_status deft_release_gpu(int i) {
    deft_status s = deft_device_synchronize(deft_cuda(i));
    if (s != DEFT_OK) return s;
#ifdef DEFT_HAVE_CUDA
    deft_cuda_cublas_release(i);
    deft_cuda_cublaslt_release(i);
    deft_cuda_cudnn_release(i);
    deft_stream_workspaces_release(i, NULL);
#endif
    deft_device_errors_release(i);
    return deft_memory_empty_cache(deft_cuda(i));
}

deft_status deft_memory_release_all(void) {
    deft_status first = DEFT_OK;
    if (deft_cuda_started()) {
        const int n = deft_cuda_count();
        for (int i = 0; i < n; i++) {
            deft_status s = deft_release_gpu(i);
            if (first == DEFT_OK) first = s;
        }
    }
    deft_status s = deft_pinned_empty_cache();
    if (first == DEFT_OK) first = s;
    s = deft_memory_empty_cache(deft_cpu());
    return first == DEFT_OK ? s : first;
}
