/* GPT-2 on the CPU against PyTorch (tests/gpt2_ref.h): f32 against the float64 reference. */
#include "gpt2_ref.h"

int main(void) {
    ref_file r;
    if (ref_load(&r, REF_PATH)) {
        const gpt2_ref_case k = {"cpu f32", deft_cpu(), DEFT_F32, 1e-5, 1e-5, 1e-4, 1e-4};
        gpt2_ref_check_grads(&r, &k);
        gpt2_ref_check_steps(&r, &k);
    }
    ref_free(&r);
    return deft_check_finish();
}
