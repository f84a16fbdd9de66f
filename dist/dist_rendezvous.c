/* How the ranks of a deft_dist meet: rank 0 hands NCCL's unique id to the others through a file or a TCP socket,
 * and each side waits for the other only until a deadline, so a rank that never comes is an error naming it. Plain
 * POSIX: nothing here needs a GPU (tests/test_dist.c runs it on the CPU). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist.h"
#include "graph_internal.h"
#include "path.h"

#define DEFT_RDV_MAGIC 0x44525644u   /* "DVRD" */
#define DEFT_RDV_POLL_S 0.01

double deft_dist_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void deft_rdv_sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* "1, 3" for the ranks in [1, world) not marked in arrived. */
static void deft_rdv_missing(const bool *arrived, int world, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 1; r < world && used + 16 < n; r++)
        if (!arrived[r]) used += (size_t)snprintf(buf + used, n - used, "%s%d", used ? ", " : "", r);
}

/* ---- file:PATH ---- */

typedef struct deft_rdv_header {
    uint32_t magic, world, bytes, pad;
} deft_rdv_header;

static deft_status deft_rdv_file_publish(const char *path, int world, const void *blob, size_t bytes) {
    char tmp[DEFT_PATH_MAX];
    deft_status s = deft_path_format(tmp, sizeof tmp, "rendezvous", "%s.tmp%ld", path, (long)getpid());
    if (s != DEFT_OK) return s;
    FILE *f = fopen(tmp, "wb");
    if (!f) return deft_set_error(DEFT_ERR_IO, "rendezvous: cannot write %s: %s", tmp, strerror(errno));
    deft_rdv_header h = {DEFT_RDV_MAGIC, (uint32_t)world, (uint32_t)bytes, 0};
    bool ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(blob, 1, bytes, f) == bytes;
    ok = fclose(f) == 0 && ok;
    /* The rename makes the whole file appear at once: a reader never sees half of it. */
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return deft_set_error(DEFT_ERR_IO, "rendezvous: cannot publish %s: %s", path, strerror(errno));
    }
    return DEFT_OK;
}

static deft_status deft_rdv_ack_path(const char *path, int rank, char *buf, size_t n) {
    return deft_path_format(buf, n, "rendezvous", "%s.rank%d", path, rank);
}

/* Removes the published file and every rank's acknowledgement. */
static void deft_rdv_file_cleanup(const char *path, int world) {
    char ack[DEFT_PATH_MAX];
    remove(path);
    for (int r = 1; r < world; r++)
        if (deft_rdv_ack_path(path, r, ack, sizeof ack) == DEFT_OK) remove(ack);
}

static deft_status deft_rdv_file_rank0(const char *path, int world, const void *blob, size_t bytes,
                                       double timeout_s) {
    char ack[DEFT_PATH_MAX];
    /* The longest acknowledgement path is the last rank's: when it fits, every one does. */
    deft_status s = deft_rdv_ack_path(path, world - 1, ack, sizeof ack);
    if (s != DEFT_OK) return s;
    remove(path);
    s = deft_rdv_file_publish(path, world, blob, bytes);
    if (s != DEFT_OK) return s;
    bool arrived[DEFT_DIST_MAX_WORLD] = {false};
    const double deadline = deft_dist_now() + timeout_s;
    for (;;) {
        int missing = 0;
        for (int r = 1; r < world; r++) {
            struct stat st;   /* every rank's path fits: checked above */
            if (!arrived[r] && deft_rdv_ack_path(path, r, ack, sizeof ack) == DEFT_OK && stat(ack, &st) == 0)
                arrived[r] = true;
            missing += !arrived[r];
        }
        if (missing == 0) break;
        if (deft_dist_now() > deadline) {
            char who[256];
            deft_rdv_missing(arrived, world, who, sizeof who);
            deft_rdv_file_cleanup(path, world);
            return deft_set_error(DEFT_ERR_RUNTIME,
                                  "rendezvous file:%s: rank(s) %s of %d did not arrive within %.3g s", path, who,
                                  world, timeout_s);
        }
        deft_rdv_sleep(DEFT_RDV_POLL_S);
    }
    deft_rdv_file_cleanup(path, world);
    return DEFT_OK;
}

/* 1: read it; 0: not there (yet); -1: there but not ours (*err set, with the message). */
static int deft_rdv_file_read(const char *path, int world, void *blob, size_t bytes, deft_status *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    deft_rdv_header h;
    bool ok = fread(&h, sizeof h, 1, f) == 1;
    ok = ok && h.magic == DEFT_RDV_MAGIC && h.bytes == bytes && fread(blob, 1, bytes, f) == bytes;
    fclose(f);
    if (!ok) {
        *err = deft_set_error(DEFT_ERR_RUNTIME, "rendezvous file:%s: the file is not a deft rendezvous", path);
        return -1;
    }
    if ((int)h.world != world) {
        *err = deft_set_error(DEFT_ERR_INVALID, "rendezvous file:%s: rank 0 has a world of %u, this rank %d", path,
                              h.world, world);
        return -1;
    }
    return 1;
}

static deft_status deft_rdv_file_rank(const char *path, int rank, int world, void *blob, size_t bytes,
                                      double timeout_s) {
    char ack[DEFT_PATH_MAX];
    deft_status s = deft_rdv_ack_path(path, rank, ack, sizeof ack);
    if (s != DEFT_OK) return s;
    const double deadline = deft_dist_now() + timeout_s;
    int got;
    deft_status err = DEFT_OK;
    while ((got = deft_rdv_file_read(path, world, blob, bytes, &err)) == 0) {
        if (deft_dist_now() > deadline)
            return deft_set_error(DEFT_ERR_RUNTIME,
                                  "rendezvous file:%s: rank 0 did not publish the id within %.3g s (rank %d of %d "
                                  "waited)",
                                  path, timeout_s, rank, world);
        deft_rdv_sleep(DEFT_RDV_POLL_S);
    }
    if (got < 0) return err;
    FILE *f = fopen(ack, "wb");
    if (!f) return deft_set_error(DEFT_ERR_IO, "rendezvous: cannot write %s: %s", ack, strerror(errno));
    fclose(f);
    return DEFT_OK;
}

/* ---- tcp:HOST:PORT ---- */

typedef struct deft_rdv_hello {
    uint32_t magic, rank, world, pad;
} deft_rdv_hello;

/* Reads or writes all of buf on fd before the deadline; false on an error, a closed peer or the deadline. */
static bool deft_rdv_io(int fd, void *buf, size_t n, bool writing, double deadline) {
    char *p = buf;
    while (n > 0) {
        int wait_ms = (int)((deadline - deft_dist_now()) * 1000.0);
        if (wait_ms <= 0) return false;
        struct pollfd pfd = {fd, writing ? POLLOUT : POLLIN, 0};
        if (poll(&pfd, 1, wait_ms) <= 0) return false;
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

static deft_status deft_rdv_parse_tcp(const char *spec, char *host, size_t n, char *port, size_t pn) {
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec || !colon[1] || (size_t)(colon - spec) >= n || strlen(colon + 1) >= pn)
        return deft_set_error(DEFT_ERR_INVALID, "rendezvous tcp:%s: expected tcp:HOST:PORT", spec);
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = '\0';
    snprintf(port, pn, "%s", colon + 1);
    char *end;
    long v = strtol(port, &end, 10);
    if (*end || v < 1 || v > 65535)
        return deft_set_error(DEFT_ERR_INVALID, "rendezvous tcp:%s: the port must be in 1..65535", spec);
    return DEFT_OK;
}

static int deft_rdv_listen(const char *port) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    if (getaddrinfo(NULL, port, &hints, &ai) != 0) return -1;
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd >= 0 && (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0)) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

/* Rank 0 answers every rank that says hello with the blob, until all have come or the deadline. */
static deft_status deft_rdv_tcp_rank0(const char *spec, const char *port, int world, const void *blob,
                                      size_t bytes, double timeout_s) {
    int lfd = deft_rdv_listen(port);
    if (lfd < 0)
        return deft_set_error(DEFT_ERR_IO, "rendezvous tcp:%s: cannot listen on port %s: %s", spec, port,
                              strerror(errno));
    bool arrived[DEFT_DIST_MAX_WORLD] = {false};
    int count = 1;
    const double deadline = deft_dist_now() + timeout_s;
    while (count < world) {
        int wait_ms = (int)((deadline - deft_dist_now()) * 1000.0);
        struct pollfd pfd = {lfd, POLLIN, 0};
        if (wait_ms <= 0 || poll(&pfd, 1, wait_ms) <= 0) break;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        deft_rdv_hello h;
        if (deft_rdv_io(fd, &h, sizeof h, false, deadline) && h.magic == DEFT_RDV_MAGIC && (int)h.world == world &&
            h.rank > 0 && (int)h.rank < world && !arrived[h.rank] && deft_rdv_io(fd, (void *)blob, bytes, true, deadline)) {
            arrived[h.rank] = true;
            count++;
        }
        close(fd);
    }
    close(lfd);
    if (count == world) return DEFT_OK;
    char who[256];
    deft_rdv_missing(arrived, world, who, sizeof who);
    return deft_set_error(DEFT_ERR_RUNTIME, "rendezvous tcp:%s: rank(s) %s of %d did not arrive within %.3g s", spec,
                          who, world, timeout_s);
}

/* One attempt to connect and take the blob; false (to retry) while rank 0 is not listening yet. */
static bool deft_rdv_tcp_try(const struct addrinfo *ai, int rank, int world, void *blob, size_t bytes,
                             double deadline) {
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) return false;
    deft_rdv_hello h = {DEFT_RDV_MAGIC, (uint32_t)rank, (uint32_t)world, 0};
    bool ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && deft_rdv_io(fd, &h, sizeof h, true, deadline) &&
              deft_rdv_io(fd, blob, bytes, false, deadline);
    close(fd);
    return ok;
}

static deft_status deft_rdv_tcp_rank(const char *spec, const char *host, const char *port, int rank, int world,
                                     void *blob, size_t bytes, double timeout_s) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    int e = getaddrinfo(host, port, &hints, &ai);
    if (e != 0) return deft_set_error(DEFT_ERR_INVALID, "rendezvous tcp:%s: %s", spec, gai_strerror(e));
    const double deadline = deft_dist_now() + timeout_s;
    bool ok = false;
    while (!ok && deft_dist_now() < deadline) {
        ok = deft_rdv_tcp_try(ai, rank, world, blob, bytes, deadline);
        if (!ok) deft_rdv_sleep(DEFT_RDV_POLL_S * 5);
    }
    freeaddrinfo(ai);
    if (ok) return DEFT_OK;
    return deft_set_error(DEFT_ERR_RUNTIME,
                          "rendezvous tcp:%s: rank 0 did not answer within %.3g s (rank %d of %d waited)", spec,
                          timeout_s, rank, world);
}

deft_status deft_rendezvous(const char *spec, int rank, int world, void *blob, size_t bytes, double timeout_s) {
    if (!spec) return deft_set_error(DEFT_ERR_INVALID, "rendezvous: no rendezvous given (file:PATH or tcp:HOST:PORT)");
    if (world < 1 || world > DEFT_DIST_MAX_WORLD || rank < 0 || rank >= world)
        return deft_set_error(DEFT_ERR_INVALID, "rendezvous: rank %d of a world of %d", rank, world);
    if (!(timeout_s > 0)) return deft_set_error(DEFT_ERR_INVALID, "rendezvous: the timeout must be > 0 s");
    if (world == 1) return DEFT_OK;
    if (strncmp(spec, "file:", 5) == 0 && spec[5]) {
        const char *path = spec + 5;
        if (strlen(path) > 4000) return deft_set_error(DEFT_ERR_INVALID, "rendezvous: the path is too long");
        return rank == 0 ? deft_rdv_file_rank0(path, world, blob, bytes, timeout_s)
                         : deft_rdv_file_rank(path, rank, world, blob, bytes, timeout_s);
    }
    if (strncmp(spec, "tcp:", 4) == 0) {
        char host[256], port[16];
        deft_status s = deft_rdv_parse_tcp(spec + 4, host, sizeof host, port, sizeof port);
        if (s != DEFT_OK) return s;
        return rank == 0 ? deft_rdv_tcp_rank0(spec + 4, port, world, blob, bytes, timeout_s)
                         : deft_rdv_tcp_rank(spec + 4, host, port, rank, world, blob, bytes, timeout_s);
    }
    return deft_set_error(DEFT_ERR_INVALID, "rendezvous \"%s\": expected file:PATH or tcp:HOST:PORT", spec);
}
