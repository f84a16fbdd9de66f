/* Out of device memory under deft_memory_set_limit, mid-run and mid-compile: a clear DEFT_ERR_OOM with the numbers,
 * nothing leaked (the allocator's allocated bytes back where they were), and, once the limit is raised, the same
 * program (or a new compile) trains with the same losses as one that never failed.
 *
 * The mid-run case must come first in the process: what a run allocates lazily (the matmul workspace on a device's
 * first matmul, once per process) exists only before the first matmul anything in this process runs. */
#include "check.h"
#include "deft_testing.h"
#include "train_net.h"

#define MiB ((size_t)1 << 20)
#define STEPS 4

static void check_allocator_unchanged(const char *what, const deft_memory_stats *before) {
    deft_memory_stats now = net_gpu_stats();
    printf("%s: %lld bytes allocated before, %lld after\n", what, (long long)before->allocated_bytes.current,
           (long long)now.allocated_bytes.current);
    CHECK_MSG(now.allocated_bytes.current == before->allocated_bytes.current,
              "%s: %lld bytes allocated before, %lld after", what, (long long)before->allocated_bytes.current,
              (long long)now.allocated_bytes.current);
    CHECK_MSG(now.num_ooms > before->num_ooms, "%s: num_ooms %lld, was %lld", what, (long long)now.num_ooms,
              (long long)before->num_ooms);
    CHECK_OK(deft_caching_check(NET_GPU));
}

/* Nothing but the cached segments that are wholly free goes back, then the limit leaves `headroom` bytes for new
 * segments: less than any segment a lazy allocation needs (2 MiB at least). */
static deft_memory_stats squeeze(size_t headroom) {
    CHECK_OK(deft_memory_empty_cache(NET_GPU));
    deft_memory_stats s = net_gpu_stats();
    CHECK_OK(deft_memory_set_limit(NET_GPU, (size_t)s.reserved_bytes.current + headroom));
    return s;
}

/* A program's first matmul needs its stream's cuBLAS workspace: under DEFT_DEBUG_MATMUL_REFERENCE a plain cuBLAS
 * call, which asks for cuBLAS's recommendation (32 MiB on Hopper; cuBLASLt's choices may ask for nothing). It fails
 * cleanly under the limit, and the program, never recompiled, trains as a fresh one does once the limit is lifted,
 * with the one gather table its compile built. */
static void test_oom_mid_run(void) {
    train_net n;
    if (!net_build(&n, 64, 96, 48)) return;
    deft_program *p = net_compile(&n, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) {
        net_free(&n);
        return;
    }

    const size_t rec = deft_testing_cublas_floor(0);
    char asked[96];
    snprintf(asked, sizeof asked, "out of memory on cuda:0: tried to allocate %.2f MiB", (double)rec / (double)MiB);
    CHECK_OK(deft_testing_set_debug("MATMUL_REFERENCE", 1));
    deft_memory_stats before = squeeze(1 * MiB);
    CHECK_ERR(net_try_step(&n, p, 0), DEFT_ERR_OOM, asked);
    CHECK_MSG(strstr(deft_errmsg(), "workspace") && strstr(deft_errmsg(), "deft_memory_set_limit") &&
                  strstr(deft_errmsg(), "run: step"),
              "the message names the step, the workspace and the limit: %s", deft_errmsg());
    printf("first matmul under the limit: %s\n", deft_errmsg());
    check_allocator_unchanged("workspace", &before);
    float unread;
    CHECK_ERR(deft_program_read(p, n.loss, &unread, sizeof unread), DEFT_ERR_STATE, "run the program first");

    /* The optimizer's gather table was built by the compile (runtime/kernel_prepare.c), so no run needs one: a
     * replica's first run must not build it while its peers' collectives wait. */
    CHECK_MSG(deft_testing_optimizer_gather_tables(n.opt) == 1, "gather tables after the compile: %d",
              deft_testing_optimizer_gather_tables(n.opt));
    CHECK(deft_optimizer_updates(n.opt) == 0);

    /* Raised: the same program runs (eagerly, then captured, then replayed) and matches a program that never
     * failed, so the failed runs changed no parameter and no optimizer state. */
    CHECK_OK(deft_testing_set_debug("MATMUL_REFERENCE", 0));
    CHECK_OK(deft_memory_set_limit(NET_GPU, 0));
    float got[STEPS], want[STEPS];
    for (int i = 0; i < STEPS; i++) got[i] = net_step(&n, p, (uint64_t)i);
    CHECK_MSG(deft_program_graph_replays(p) >= 2, "replays %lld: %s", (long long)deft_program_graph_replays(p),
              deft_program_graph_status(p));
    CHECK(deft_testing_optimizer_gather_tables(n.opt) == 1);
    net_reference_losses(&n, 0, STEPS, want);
    net_check_losses("after the mid-run OOM", got, want, STEPS);
    net_free(&n);
}

/* A limit below the persistent state plus the arena fails the compile with the numbers and leaves the allocator as
 * it was; raised (still a limit), the compile succeeds and trains as a program compiled without one. The arena is
 * made larger than the 20 MiB segments small tensors share, so no cached free block can hold it. */
static void test_oom_mid_compile(void) {
    train_net n;
    if (!net_build(&n, 4096, 256, 2048)) return;
    deft_tensor *outs[2] = {n.loss, n.step};
    deft_memory_report rep;
    CHECK_OK(deft_plan_memory(n.g, outs, 2, NULL, &rep));
    CHECK_MSG(rep.arena_bytes > 24 * MiB, "the arena is %zu bytes; the test wants more than 24 MiB", rep.arena_bytes);

    deft_memory_stats before = squeeze(rep.arena_bytes / 2);
    deft_program *p = net_compile(&n, NULL);
    CHECK_MSG(p == NULL, "compiled under a limit %zu bytes short of the arena", rep.arena_bytes / 2);
    CHECK_MSG(strstr(deft_errmsg(), "compile") && strstr(deft_errmsg(), "out of memory on cuda:0: tried to allocate") &&
                  strstr(deft_errmsg(), "deft_memory_set_limit"),
              "the message says what was asked and the limit: %s", deft_errmsg());
    printf("compile under the limit: %s\n", deft_errmsg());
    check_allocator_unchanged("compile", &before);
    /* The frozen parameter is the graph's, but its device copy was made by the compile that failed. */
    CHECK_MSG(!deft_testing_has_device_copy(deft_graph_find(n.g, "scale")),
              "the failed compile kept a device copy of scale");
    deft_program_free(p);

    const size_t raised = (size_t)before.reserved_bytes.current + rep.arena_bytes + rep.persistent_bytes + 64 * MiB;
    CHECK_OK(deft_memory_set_limit(NET_GPU, raised));
    p = net_compile(&n, NULL);
    CHECK_MSG(p != NULL, "compile under the raised limit: %s", deft_errmsg());
    float got[STEPS], want[STEPS];
    for (int i = 0; p && i < STEPS; i++) got[i] = net_step(&n, p, 100 + (uint64_t)i);
    CHECK(net_gpu_stats().reserved_bytes.current <= (int64_t)raised);
    CHECK_OK(deft_memory_set_limit(NET_GPU, 0));
    if (p) {
        net_reference_losses(&n, 100, STEPS, want);
        net_check_losses("after the compile OOM", got, want, STEPS);
    }
    net_free(&n);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    test_oom_mid_run();   /* first: see the comment at the top */
    test_oom_mid_compile();
    CHECK_OK(deft_memory_set_limit(NET_GPU, 0));
    return deft_check_finish();
}
