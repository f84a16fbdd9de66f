/* GPT-2 on a GPU against PyTorch (tests/gpt2_ref.h): f32 (no TF32) against the float64 reference, and bf16 autocast
 * with tolerances for its 8-bit mantissa. */
#include "gpt2_ref.h"

int main(void) {
    SKIP_WITHOUT_GPU();
    ref_file r;
    if (ref_load(&r, REF_PATH)) {
        const gpt2_ref_case f32 = {"cuda:0 f32", deft_cuda(0), DEFT_F32, 1e-5, 1e-5, 1e-4, 1e-4};
        const gpt2_ref_case bf16 = {"cuda:0 bf16", deft_cuda(0), DEFT_BF16, 2e-2, 5e-3, 1e-1, 1e-2};
        gpt2_ref_check_grads(&r, &f32);
        gpt2_ref_check_steps(&r, &f32);
        gpt2_ref_check_grads(&r, &bf16);
        gpt2_ref_check_steps(&r, &bf16);
    }
    ref_free(&r);
    return deft_check_finish();
}
