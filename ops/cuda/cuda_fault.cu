/* Test-only launch fault injection (ops/cuda/cuda_fault.h). One relaxed load per launch check when nothing is
 * pending, so it costs nothing measurable in the launch path it instruments. */
#include <atomic>

#include "cuda_fault.h"

static std::atomic<int> deft_injected_launch_error{0};

extern "C" void deft_cuda_fail_next_launch(int cuda_error) { deft_injected_launch_error.store(cuda_error); }

extern "C" int deft_cuda_take_injected_launch_error(void) {
    if (deft_injected_launch_error.load(std::memory_order_relaxed) == 0) return 0;
    return deft_injected_launch_error.exchange(0);
}
