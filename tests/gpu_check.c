/* The ctest that says why the cuda-labelled tests skip (registered in tests/extra_tests.cmake as
 * cuda_tests_need_a_gpu, or cuda_tests_need_a_cuda_build in a build without CUDA), and the line setup.sh closes
 * with. It prints what this build and machine have and exits 0 when the cuda tests can run, 77 (ctest: Skipped)
 * when they skip.
 *   gpu_check [number of cuda tests]                                                                              */
#include <stdio.h>
#include <stdlib.h>

#include "deft.h"

int main(int argc, char **argv) {
    char tests[64] = "the";
    if (argc > 1) snprintf(tests, sizeof tests, "the %s", argv[1]);
    if (!deft_has_cuda_build()) {
        printf("deft was built without CUDA (DEFT_CUDA=OFF, or no CUDA toolkit found): %s cuda-labelled tests skip "
               "(exit 77); the CPU runs everything else\n",
               tests);
        return 77;
    }
    int n = deft_cuda_device_count();
    if (n <= 0) {
        printf("no usable GPU on this machine (the CUDA backend is built, but no GPU works): %s cuda-labelled tests "
               "skip (exit 77); they need a CUDA GPU\n",
               tests);
        return 77;
    }
    char name[256] = "";
    if (deft_device_name(deft_cuda(0), name, sizeof name) != DEFT_OK) name[0] = '\0';
    printf("%d GPU(s) (cuda:0 is %s): %s cuda-labelled tests run on cuda:0\n", n, name, tests);
    return EXIT_SUCCESS;
}
