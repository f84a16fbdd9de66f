/* CUDA devices: the runtime starts lazily; count, names and memory are sane; parsing and the default pick cuda:0;
 * bad indices are DEFT_ERR_DEVICE naming the count; memory can be allocated, copied both ways and between GPUs;
 * an impossible allocation is DEFT_ERR_OOM with a useful message; CUDA_VISIBLE_DEVICES is honoured (checked in a
 * child process run with it set). Skips (exit 77) where no GPU works. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft.h"
#include "deft_testing.h"

static void test_facts(int count) {
    for (int i = 0; i < count; i++) {
        char name[256] = "";
        size_t free_b = 0, total_b = 0;
        CHECK_OK(deft_device_name(deft_cuda(i), name, sizeof name));
        CHECK_MSG(name[0] != '\0', "cuda:%d has an empty name", i);
        CHECK_OK(deft_device_memory(deft_cuda(i), &free_b, &total_b));
        CHECK_MSG(total_b > ((size_t)1 << 30), "cuda:%d total %zu bytes", i, total_b);
        CHECK_MSG(free_b > 0 && free_b <= total_b, "cuda:%d free %zu of %zu bytes", i, free_b, total_b);
        printf("cuda:%d: %s, %.2f GiB free of %.2f GiB\n", i, name, (double)free_b / (1 << 30),
               (double)total_b / (1 << 30));
    }
}

static void test_parse(int count) {
    deft_device d = deft_cpu();
    CHECK_OK(deft_device_parse("cuda:0", &d));
    CHECK(d.type == DEFT_CUDA && d.index == 0);
    d = deft_cpu();
    CHECK_OK(deft_device_parse("cuda", &d));
    CHECK(d.type == DEFT_CUDA && d.index == 0);
    deft_device def = deft_device_default();
    CHECK(def.type == DEFT_CUDA && def.index == 0);

    char count_str[16];
    snprintf(count_str, sizeof count_str, "%d", count);
    CHECK_ERR(deft_device_parse("cuda:999", &d), DEFT_ERR_DEVICE, "cuda:999");
    CHECK_MSG(strstr(deft_errmsg(), count_str) != NULL, "\"%s\" does not name the count %d", deft_errmsg(), count);
    size_t f, t;
    CHECK_ERR(deft_device_memory(deft_cuda(count), &f, &t), DEFT_ERR_DEVICE, count_str);
    char name[64];
    CHECK_ERR(deft_device_name(deft_cuda(999), name, sizeof name), DEFT_ERR_DEVICE, count_str);
    /* The CUDA layer itself refuses bad indices too, whoever calls it. */
    CHECK_ERR(deft_cuda_name(count, name, sizeof name), DEFT_ERR_DEVICE, count_str);
    CHECK_ERR(deft_cuda_set_device(-1), DEFT_ERR_DEVICE, "cuda:-1");
    void *p = (void *)1;
    CHECK_ERR(deft_cuda_alloc(count + 3, 64, &p), DEFT_ERR_DEVICE, count_str);
    CHECK(p == NULL);
}

static void fill_pattern(uint8_t *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((i * 2654435761u + seed) >> 7);
}

static void test_memory(int count) {
    const size_t n = ((size_t)1 << 20) + 37;   /* not a multiple of anything convenient */
    uint8_t *host = malloc(n), *back = malloc(n);
    fill_pattern(host, n, 1);
    void *a = NULL, *b = NULL, *z = (void *)1;
    CHECK_OK(deft_cuda_alloc(0, 0, &z));
    CHECK(z == NULL);
    CHECK_OK(deft_cuda_alloc(0, n, &a));
    CHECK_OK(deft_cuda_alloc(0, n, &b));
    CHECK_OK(deft_mem_copy(deft_cuda(0), a, deft_cpu(), host, n));
    CHECK_OK(deft_mem_copy(deft_cuda(0), b, deft_cuda(0), a, n));
    memset(back, 0, n);
    CHECK_OK(deft_mem_copy(deft_cpu(), back, deft_cuda(0), b, n));
    CHECK_MSG(memcmp(host, back, n) == 0, "host -> cuda:0 -> cuda:0 -> host changed the bytes");
    CHECK_OK(deft_device_synchronize(deft_cuda(0)));

    if (count >= 2) {
        void *c = NULL;
        CHECK_OK(deft_cuda_alloc(1, n, &c));
        CHECK_OK(deft_mem_copy(deft_cuda(1), c, deft_cuda(0), b, n));
        memset(back, 0, n);
        CHECK_OK(deft_mem_copy(deft_cpu(), back, deft_cuda(1), c, n));
        CHECK_MSG(memcmp(host, back, n) == 0, "cuda:0 -> cuda:1 changed the bytes");
        deft_cuda_free(1, c);
    }

    /* A petabyte cannot fit: a clear OOM, and the runtime is still usable after it. */
    void *huge = (void *)1;
    CHECK_ERR(deft_cuda_alloc(0, (size_t)1 << 50, &huge), DEFT_ERR_OOM, "out of memory on cuda:0");
    CHECK_MSG(strstr(deft_errmsg(), "free") && strstr(deft_errmsg(), "total"), "OOM message: %s", deft_errmsg());
    CHECK(huge == NULL);
    void *after = NULL;
    CHECK_OK(deft_cuda_alloc(0, 4096, &after));
    CHECK_OK(deft_cuda_synchronize(0));
    deft_cuda_free(0, after);
    deft_cuda_free(0, a);
    deft_cuda_free(0, b);
    free(host);
    free(back);
}

/* Runs this program again with CUDA_VISIBLE_DEVICES set and `mode` telling the child what to expect. */
static void run_child(const char *self, const char *visible, const char *mode) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "CUDA_VISIBLE_DEVICES='%s' DEFT_TEST_CHILD=%s '%s'", visible, mode, self);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "child with CUDA_VISIBLE_DEVICES='%s' failed (status %d)", visible, rc);
}

/* The child's side: it sees no GPU ("none") or exactly one ("one"). */
static int child_main(const char *mode, int started_at_entry) {
    CHECK(started_at_entry == 0);
    const int count = deft_cuda_device_count();
    if (strcmp(mode, "none") == 0) {
        CHECK_MSG(count == 0, "CUDA_VISIBLE_DEVICES='' still shows %d GPUs", count);
        deft_device d = deft_device_default();
        CHECK(d.type == DEFT_CPU);
        CHECK_ERR(deft_device_parse("cuda:0", &d), DEFT_ERR_NO_CUDA, "cuda:0");
    } else {
        CHECK_MSG(count == 1, "CUDA_VISIBLE_DEVICES=1 shows %d GPUs", count);
        void *p = NULL;
        CHECK_OK(deft_cuda_alloc(0, 256, &p));
        deft_cuda_free(0, p);
    }
    return deft_check_finish();
}

int main(int argc, char **argv) {
    /* Before any other deft call: nothing may have started the CUDA runtime at load time. */
    const int started_at_entry = deft_cuda_runtime_started();
    (void)argc;
    const char *child = getenv("DEFT_TEST_CHILD");
    if (child) return child_main(child, started_at_entry);

    CHECK_MSG(started_at_entry == 0, "the CUDA runtime was started before main");
    const int count = deft_cuda_device_count();
    if (count == 0) {
        if (deft_check_failures) return deft_check_finish();
        printf("no GPU: skipped\n");
        return DEFT_CHECK_SKIP;
    }
    CHECK_MSG(deft_cuda_runtime_started() == 1, "counting devices did not start the runtime");
    printf("%d CUDA device%s visible\n", count, count == 1 ? "" : "s");
    test_facts(count);
    test_parse(count);
    test_memory(count);
    /* compute-sanitizer's injection, inherited by the child, shows it the GPU whatever CUDA_VISIBLE_DEVICES says. */
    if (getenv("DEFT_TEST_COMPUTE_SANITIZER")) {
        printf("under compute-sanitizer: the CUDA_VISIBLE_DEVICES children are not run (the tool shows them the GPU)\n");
    } else {
        run_child(argv[0], "", "none");
        if (count >= 2) run_child(argv[0], "1", "one");
    }
    return deft_check_finish();
}
