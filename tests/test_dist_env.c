/* deft_dist_options_from_env reads torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
 * else Open MPI's or PMI's, and refuses every bad value with DEFT_ERR_INVALID naming the variable and its value,
 * leaving the options and the buffer as they were; deft_dist_init_env parses, then fails as deft_dist_init does
 * where there is no NCCL or no GPU.
 *
 * `test_dist_env --print` prints what it read (tests/deft_launch_test.sh runs it under scripts/deft_launch). */
#define _POSIX_C_SOURCE 200809L
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static const char *const all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE",
};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
}

static void set_torchrun(const char *rank, const char *world, const char *local, const char *addr, const char *port) {
    clear_env();
    const char *names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
    const char *values[] = {rank, world, local, addr, port};
    for (int i = 0; i < 5; i++)
        if (values[i]) setenv(names[i], values[i], 1);
}

/* Options holding values that no parse gives, to see whether a call changed them. */
static deft_dist_options sentinel(void) {
    return (deft_dist_options){.rank = 77, .world = 88, .rendezvous = "untouched", .device = 99, .timeout_s = 5.5};
}

static void check_untouched(const deft_dist_options *o, const char *buf) {
    CHECK(o->rank == 77 && o->world == 88 && o->device == 99 && o->timeout_s == 5.5);
    CHECK(strcmp(o->rendezvous, "untouched") == 0);
    CHECK_MSG(strcmp(buf, "buffer") == 0, "the buffer became \"%s\"", buf);
}

/* The current environment must be refused with DEFT_ERR_INVALID and a message holding `needle`. */
static void check_refused(const char *needle, int line) {
    deft_dist_options o = sentinel();
    char buf[64] = "buffer";
    deft_status s = deft_dist_options_from_env(&o, buf, sizeof buf);
    CHECK_MSG(s == DEFT_ERR_INVALID, "line %d: %s (%s)", line, deft_status_name(s), deft_errmsg());
    CHECK_MSG(strstr(deft_errmsg(), needle) != NULL, "line %d: message \"%s\" lacks \"%s\"", line, deft_errmsg(),
              needle);
    check_untouched(&o, buf);
}
#define REFUSED(needle) check_refused(needle, __LINE__)

/* The current environment must give rank, world, device and rendezvous. */
static void check_parsed(int rank, int world, int device, const char *spec, int line) {
    deft_dist_options o = sentinel();
    char buf[300] = "buffer";
    deft_status s = deft_dist_options_from_env(&o, buf, sizeof buf);
    CHECK_MSG(s == DEFT_OK, "line %d: %s (%s)", line, deft_status_name(s), deft_errmsg());
    if (s != DEFT_OK) return;
    CHECK_MSG(o.rank == rank && o.world == world && o.device == device, "line %d: rank %d world %d device %d", line,
              o.rank, o.world, o.device);
    CHECK_MSG(o.rendezvous == buf && strcmp(buf, spec) == 0, "line %d: rendezvous \"%s\", wanted \"%s\"", line, buf,
              spec);
    CHECK_MSG(o.timeout_s == 5.5, "line %d: the timeout changed", line);
}
#define PARSED(rank, world, device, spec) check_parsed(rank, world, device, spec, __LINE__)

static void test_torchrun(void) {
    set_torchrun("2", "4", "1", "10.1.2.3", "29500");
    PARSED(2, 4, 1, "tcp:10.1.2.3:29500");
    set_torchrun("0", "1", NULL, "localhost", "1");   /* no LOCAL_RANK: the device is left to deft_dist_init */
    PARSED(0, 1, -1, "tcp:localhost:1");
    set_torchrun("3", "4", "", "node7.cluster", "65535");   /* empty counts as unset */
    PARSED(3, 4, -1, "tcp:node7.cluster:65535");
    set_torchrun("1", "2", "0", "::1", "29500");   /* the rendezvous takes the port after the last colon */
    PARSED(1, 2, 0, "tcp:::1:29500");
}

static void test_torchrun_refused(void) {
    set_torchrun(NULL, "4", "0", "h", "1");
    REFUSED("RANK is not set");
    set_torchrun("1", NULL, "0", "h", "1");
    REFUSED("WORLD_SIZE is not set");
    set_torchrun("x1", "4", "0", "h", "1");
    REFUSED("RANK=\"x1\" is not a decimal integer");
    set_torchrun("1", "4z", "0", "h", "1");
    REFUSED("WORLD_SIZE=\"4z\" is not a decimal integer");
    set_torchrun(" 1", "4", "0", "h", "1");
    REFUSED("RANK=\" 1\" is not a decimal integer");
    set_torchrun("99999999999999999999", "4", "0", "h", "1");
    REFUSED("RANK=\"99999999999999999999\" is not a decimal integer");
    set_torchrun("-1", "4", "0", "h", "1");
    REFUSED("RANK=-1: a rank must be >= 0");
    set_torchrun("4", "4", "0", "h", "1");
    REFUSED("RANK=4 is not below WORLD_SIZE=4");
    set_torchrun("0", "0", "0", "h", "1");
    REFUSED("WORLD_SIZE=0: deft takes 1..");
    set_torchrun("0", "-2", "0", "h", "1");
    REFUSED("WORLD_SIZE=-2");
    set_torchrun("0", "100000", "0", "h", "1");
    REFUSED("WORLD_SIZE=100000: deft takes 1..");
    set_torchrun("0", "2", "-1", "h", "1");
    REFUSED("LOCAL_RANK=-1: a local rank must be >= 0");
    set_torchrun("0", "2", "zero", "h", "1");
    REFUSED("LOCAL_RANK=\"zero\"");
    set_torchrun("0", "2", "0", NULL, "1");
    REFUSED("MASTER_ADDR is not set");
    set_torchrun("0", "2", "0", "h", NULL);
    REFUSED("MASTER_PORT is not set");
    set_torchrun("0", "2", "0", "h", "0");
    REFUSED("MASTER_PORT=0: a port must be in 1..65535");
    set_torchrun("0", "2", "0", "h", "65536");
    REFUSED("MASTER_PORT=65536: a port must be in 1..65535");
    set_torchrun("0", "2", "0", "h", "-5");
    REFUSED("MASTER_PORT=-5");
    set_torchrun("0", "2", "0", "h", "http");
    REFUSED("MASTER_PORT=\"http\" is not a decimal integer");
}

/* An address that does not fit the caller's buffer (64 bytes in REFUSED), or the rendezvous's 255 bytes. */
static void test_long_address(void) {
    char addr[400];
    memset(addr, 'a', sizeof addr - 1);
    addr[sizeof addr - 1] = '\0';
    addr[54] = '\0';   /* "tcp:" + 54 + ":29500" + NUL = 65 > 64 */
    set_torchrun("0", "2", "0", addr, "29500");
    REFUSED("(54 bytes) is too long");
    addr[53] = '\0';   /* 64: fits exactly */
    setenv("MASTER_ADDR", addr, 1);
    deft_dist_options o = sentinel();
    char buf[64] = "buffer";
    CHECK_OK(deft_dist_options_from_env(&o, buf, sizeof buf));
    CHECK(strlen(buf) == 63 && strncmp(buf, "tcp:aaaa", 8) == 0 && strcmp(buf + 57, ":29500") == 0);
    memset(addr, 'a', sizeof addr - 1);   /* 399 bytes: over the rendezvous's limit, whatever the buffer */
    setenv("MASTER_ADDR", addr, 1);
    o = sentinel();
    char big[1024] = "buffer";
    CHECK_ERR(deft_dist_options_from_env(&o, big, sizeof big), DEFT_ERR_INVALID, "(399 bytes) is too long");
    CHECK(strcmp(big, "buffer") == 0 && o.rank == 77);
}

static void test_mpi(void) {
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    REFUSED("MASTER_ADDR is not set: the ranks meet at MASTER_ADDR:MASTER_PORT, rank 0's host (MPI launchers do "
            "not set it");
    setenv("MASTER_ADDR", "head", 1);
    REFUSED("MASTER_PORT is not set");
    setenv("MASTER_PORT", "7000", 1);
    PARSED(5, 8, 1, "tcp:head:7000");
    setenv("OMPI_COMM_WORLD_RANK", "8", 1);
    REFUSED("OMPI_COMM_WORLD_RANK=8 is not below OMPI_COMM_WORLD_SIZE=8");
    setenv("OMPI_COMM_WORLD_RANK", "7", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "-3", 1);
    REFUSED("OMPI_COMM_WORLD_LOCAL_RANK=-3");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    REFUSED("OMPI_COMM_WORLD_SIZE is not set");
    /* torchrun's names win over Open MPI's (a user who exports both meant the former) */
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    PARSED(0, 2, -1, "tcp:head:7000");

    clear_env();
    setenv("PMI_RANK", "3", 1);
    setenv("PMI_SIZE", "6", 1);
    setenv("MASTER_ADDR", "head", 1);
    setenv("MASTER_PORT", "7001", 1);
    PARSED(3, 6, -1, "tcp:head:7001");
    setenv("PMI_SIZE", "0", 1);
    REFUSED("PMI_SIZE=0");
}

static void test_nothing_set(void) {
    clear_env();
    REFUSED("no launcher's variables: RANK and WORLD_SIZE");
    deft_dist_options o = sentinel();
    char buf[8] = "buffer";
    set_torchrun("0", "1", "0", "h", "1");
    CHECK_ERR(deft_dist_options_from_env(NULL, buf, sizeof buf), DEFT_ERR_INVALID, "NULL");
    CHECK_ERR(deft_dist_options_from_env(&o, NULL, 8), DEFT_ERR_INVALID, "NULL");
    CHECK_ERR(deft_dist_options_from_env(&o, buf, 0), DEFT_ERR_INVALID, "empty");
    check_untouched(&o, buf);
}

/* A port nothing listens on now (the kernel's pick). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* Parsing first: a bad environment is DEFT_ERR_INVALID whatever the build; a good one of one rank reaches
 * deft_dist_init, which needs NCCL and a GPU (else DEFT_ERR_NO_CUDA) and then meets itself on a free port. */
static void test_init_env(void) {
    deft_dist *d = (deft_dist *)&d;
    CHECK_ERR(deft_dist_init_env(10, NULL), DEFT_ERR_INVALID, "out is NULL");
    set_torchrun("0", "1", "0", "127.0.0.1", "0");
    CHECK_ERR(deft_dist_init_env(10, &d), DEFT_ERR_INVALID, "MASTER_PORT=0");
    CHECK(d == NULL);
    clear_env();
    CHECK_ERR(deft_dist_init_env(10, &d), DEFT_ERR_INVALID, "no launcher's variables");
    char port[16];
    snprintf(port, sizeof port, "%d", free_port());
    set_torchrun("0", "1", "0", "127.0.0.1", port);
    CHECK_ERR(deft_dist_init_env(-1, &d), DEFT_ERR_INVALID, "timeout");
    const int can = deft_has_nccl_build() && deft_cuda_device_count() > 0;
    deft_status s = deft_dist_init_env(30, &d);
    if (!can) {
        CHECK_MSG(s == DEFT_ERR_NO_CUDA && d == NULL, "%s (%s)", deft_status_name(s), deft_errmsg());
        return;
    }
    CHECK_MSG(s == DEFT_OK, "%s (%s)", deft_status_name(s), deft_errmsg());
    CHECK(deft_dist_world(d) == 1 && deft_dist_rank(d, 0) == 0 && deft_dist_device(d, 0).index == 0);
    deft_dist_free(d);
}

/* Under a launcher: one line of what this rank read. */
static int print_env(void) {
    deft_dist_options o = {0};
    char buf[300];
    deft_status s = deft_dist_options_from_env(&o, buf, sizeof buf);
    if (s != DEFT_OK) {
        fprintf(stderr, "test_dist_env: %s\n", deft_errmsg());
        return 1;
    }
    printf("rank %d world %d device %d rendezvous %s\n", o.rank, o.world, o.device, o.rendezvous);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--print") == 0) return print_env();
    test_torchrun();
    test_torchrun_refused();
    test_long_address();
    test_mpi();
    test_nothing_set();
    test_init_env();
    return deft_check_finish();
}
