/* Data parallel pieces that need no GPU: the rendezvous (file and TCP) hands rank 0's id to every rank, and a rank
 * that never comes is an error naming it within the timeout, on either side; deft_dist_init refuses bad options
 * with a message; the sharded dataset loader gives rank r the global batches r, r + world, ... of the same (shuffled)
 * order. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "indexed_dataset.h"
#include "deft_testing.h"

typedef struct rank_job {
    const char *spec;
    int rank, world;
    unsigned char blob[32];
    double timeout;
    deft_status status;
    char msg[512];
} rank_job;

static void *rank_main(void *arg) {
    rank_job *j = arg;
    j->status = deft_rendezvous(j->spec, j->rank, j->world, j->blob, sizeof j->blob, j->timeout);
    snprintf(j->msg, sizeof j->msg, "%s", deft_errmsg());
    return NULL;
}

/* world ranks meet through spec in threads of their own; rank 0's blob reaches every one. */
static void test_meet(const char *spec, int world) {
    rank_job jobs[4];
    pthread_t th[4];
    for (int r = 0; r < world; r++) {
        jobs[r] = (rank_job){.spec = spec, .rank = r, .world = world, .timeout = 20.0};
        for (size_t i = 0; i < sizeof jobs[r].blob; i++) jobs[r].blob[i] = r == 0 ? (unsigned char)(i * 7 + 1) : 0;
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < world; r++) {
        CHECK_MSG(jobs[r].status == DEFT_OK, "%s rank %d: %s", spec, r, jobs[r].msg);
        CHECK_MSG(memcmp(jobs[r].blob, jobs[0].blob, sizeof jobs[0].blob) == 0, "%s rank %d got another id", spec, r);
    }
    if (strncmp(spec, "file:", 5) == 0) CHECK_MSG(access(spec + 5, F_OK) != 0, "%s was left behind", spec + 5);
}

/* A missing peer: rank 0 alone names the ranks that did not come; a rank alone says rank 0 did not publish. */
static void test_missing(const char *spec) {
    unsigned char blob[32] = {1};
    double t0 = deft_dist_now();
    CHECK_ERR(deft_rendezvous(spec, 0, 3, blob, sizeof blob, 0.3), DEFT_ERR_RUNTIME, "rank(s) 1, 2 of 3 did not arrive");
    CHECK(deft_dist_now() - t0 < 10.0);   /* returned, not hung (the deadline itself is 0.3 s) */
    CHECK_ERR(deft_rendezvous(spec, 2, 3, blob, sizeof blob, 0.3), DEFT_ERR_RUNTIME, "rank 0 did not");
    CHECK(strstr(deft_errmsg(), "rank 2 of 3") != NULL);
}

static void test_rendezvous(void) {
    char file[128];
    snprintf(file, sizeof file, "file:/tmp/deft_test_dist_%ld", (long)getpid());
    test_meet(file, 2);
    test_meet(file, 4);
    test_missing(file);
    char tcp[64];
    const int port = 20000 + (int)(getpid() % 20000);
    snprintf(tcp, sizeof tcp, "tcp:127.0.0.1:%d", port);
    test_meet(tcp, 3);
    snprintf(tcp, sizeof tcp, "tcp:127.0.0.1:%d", port + 1);
    test_missing(tcp);
    unsigned char blob[8];
    CHECK_ERR(deft_rendezvous("nfs:/x", 1, 2, blob, sizeof blob, 1), DEFT_ERR_INVALID, "expected file:PATH");
    CHECK_ERR(deft_rendezvous("tcp:hostonly", 1, 2, blob, sizeof blob, 1), DEFT_ERR_INVALID, "tcp:HOST:PORT");
    CHECK_ERR(deft_rendezvous("tcp:h:99999", 1, 2, blob, sizeof blob, 1), DEFT_ERR_INVALID, "1..65535");
    CHECK_ERR(deft_rendezvous(file, 2, 2, blob, sizeof blob, 1), DEFT_ERR_INVALID, "rank 2 of a world of 2");
    CHECK_OK(deft_rendezvous(file, 0, 1, blob, sizeof blob, 1));   /* a world of one meets nobody */
}

static void test_init_errors(void) {
    deft_dist *d = (deft_dist *)&d;
    CHECK_ERR(deft_dist_init(NULL, &d), DEFT_ERR_INVALID, "options are NULL");
    CHECK(d == NULL);
    deft_dist_options o = {.rank = 2, .world = 2, .rendezvous = "file:/tmp/x"};
    CHECK_ERR(deft_dist_init(&o, &d), DEFT_ERR_INVALID, "rank 2 of a world of 2");
    o = (deft_dist_options){.rank = 0, .world = 2, .rendezvous = "/tmp/x"};
    CHECK_ERR(deft_dist_init(&o, &d), DEFT_ERR_INVALID, "\"file:PATH\"");
    o = (deft_dist_options){.rank = 0, .world = 2, .rendezvous = "file:/tmp/x", .timeout_s = -1};
    CHECK_ERR(deft_dist_init(&o, &d), DEFT_ERR_INVALID, "timeout");
    CHECK_ERR(deft_dist_init_local(0, 0, &d), DEFT_ERR_INVALID, "0 GPUs asked for");
    /* NCCL's blocks per collective: 0 (the default) or 1..DEFT_DIST_MAX_BLOCKS, refused before NCCL or a GPU is
     * looked for. */
    o = (deft_dist_options){.rank = 0, .world = 2, .rendezvous = "file:/tmp/x", .collective_blocks = -1};
    CHECK_ERR(deft_dist_init(&o, &d), DEFT_ERR_INVALID, "collective_blocks -1: 0 (the default, 32) or 1..64");
    o.collective_blocks = DEFT_DIST_MAX_BLOCKS + 1;
    CHECK_ERR(deft_dist_init(&o, &d), DEFT_ERR_INVALID, "collective_blocks 65");
    CHECK_ERR(deft_dist_init_local_with(NULL, &d), DEFT_ERR_INVALID, "options are NULL");
    CHECK_ERR(deft_dist_init_local_with(&(deft_dist_local_options){.ngpus = 2, .collective_blocks = 65}, &d),
              DEFT_ERR_INVALID, "dist_init_local: collective_blocks 65");
    CHECK_ERR(deft_dist_init_local_with(&(deft_dist_local_options){.ngpus = 0, .collective_blocks = 8}, &d),
              DEFT_ERR_INVALID, "0 GPUs asked for");
    CHECK(d == NULL);
    if (!deft_has_nccl_build()) {
        CHECK_ERR(deft_dist_init_local(2, 0, &d), DEFT_ERR_NO_CUDA, "without NCCL");
        CHECK_ERR(deft_dist_init_local_with(&(deft_dist_local_options){.ngpus = 2, .collective_blocks = 64}, &d),
                  DEFT_ERR_NO_CUDA, "without NCCL");
        o = (deft_dist_options){.rank = 1, .world = 2, .rendezvous = "file:/tmp/x"};
        CHECK_ERR(deft_dist_init(&o, &d), DEFT_ERR_NO_CUDA, "without NCCL");
    } else if (deft_cuda_device_count() == 0) {
        CHECK_ERR(deft_dist_init_local(2, 0, &d), DEFT_ERR_NO_CUDA, "no usable GPU");
    }
    CHECK(deft_dist_world(NULL) == 0 && deft_dist_rank(NULL, 0) == -1);
    CHECK_ERR(deft_dist_run(NULL, NULL, 0), DEFT_ERR_INVALID, "NULL");
    CHECK_ERR(deft_program_dist_synchronize(NULL), DEFT_ERR_INVALID, "program is NULL");
}

/* Rank r of world takes global batches r, r + world, ... of deft_shuffle's order (or of 0, 1, ...). */
static void test_shard(int shuffle, int world) {
    enum { N = 23, F = 2, B = 3 };
    float images[N * F];
    int32_t labels[N];
    deft_dataset d = indexed_dataset(images, labels, N, F);
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){B, F}, deft_cpu());
    deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){B}, deft_cpu());
    deft_tensor *yo = deft_add_scalar(y, 0.0);
    deft_program *p = deft_compile(g, &yo, 1, NULL);
    CHECK(p != NULL);
    deft_loader *l = NULL;
    CHECK_ERR(deft_loader_new_dataset_shard(&d, x, y, shuffle, 5, world, world, 0, &l), DEFT_ERR_INVALID,
              "rank");
    CHECK_ERR(deft_loader_new_dataset_shard(&d, x, y, shuffle, 5, 0, 8, 0, &l), DEFT_ERR_INVALID,
              "every rank needs one");
    const int64_t per_rank = (N / B) / world;
    for (int r = 0; r < world; r++) {
        CHECK_OK(deft_loader_new_dataset_shard(&d, x, y, shuffle, 5, r, world, 0, &l));
        for (int64_t e = 0; e < 2; e++) {
            int64_t order[N];
            for (int i = 0; i < N; i++) order[i] = i;
            if (shuffle) CHECK_OK(deft_shuffle(order, N, 5 + (uint64_t)e * 0x9E3779B97F4A7C15ull));
            for (int64_t i = 0; i < per_rank; i++) {
                deft_loader_batch b;
                CHECK_OK(deft_loader_next(l, p, &b));
                CHECK(b.epoch == e && b.index == i && !b.end);
                CHECK_OK(deft_program_run(p));
                int32_t ys[B];
                CHECK_OK(deft_program_read(p, yo, ys, sizeof ys));
                const int64_t global = i * world + r;
                for (int k = 0; k < B; k++)
                    CHECK_MSG(ys[k] == (int32_t)order[global * B + k], "rank %d of %d, epoch %lld batch %lld", r,
                              world, (long long)e, (long long)i);
            }
            deft_loader_batch b;
            CHECK_OK(deft_loader_next(l, p, &b));
            CHECK(b.end == 1);
        }
        deft_loader_free(l);
    }
    deft_graph_free(g);
}

int main(void) {
    test_rendezvous();
    test_init_errors();
    test_shard(0, 2);
    test_shard(1, 2);
    test_shard(1, 3);
    return deft_check_finish();
}
