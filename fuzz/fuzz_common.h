/* What the fuzz targets share: sanitizer defaults, scratch files for the loaders that take paths, and the seed mode.
 *
 * A target run as `fuzz_x --write-seeds DIR` writes its seed corpus into DIR (with the library's own writers) and
 * exits; any other command line is libFuzzer's. The sanitizer options below are compiled in, so that running a
 * target on a crash file alone (`fuzz_x crash-...`) reproduces the run that found it. */
#ifndef DEFT_FUZZ_COMMON_H
#define DEFT_FUZZ_COMMON_H

#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deft.h"

/* A malloc the library cannot get returns NULL (which it must turn into DEFT_ERR_OOM) instead of ending the run:
 * sizes read from a file or built from odd shapes are what is being tested. 256 MiB stays far below libFuzzer's
 * malloc and RSS limits (2 GiB), so a refused request is never mistaken for a crash. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1:max_allocation_size_mb=256:detect_leaks=1";
}
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) { return "print_stacktrace=1:halt_on_error=1"; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A directory of this process for scratch files, removed at exit (the files in it first). */
static char deft_fuzz_dir[256];
static const char *deft_fuzz_files[8];
static int deft_fuzz_n_files;

static inline void deft_fuzz_cleanup(void) {
    for (int i = 0; i < deft_fuzz_n_files; i++) remove(deft_fuzz_files[i]);
    if (deft_fuzz_dir[0]) rmdir(deft_fuzz_dir);
}

static inline void deft_fuzz_die(const char *what) {
    fprintf(stderr, "fuzz harness: %s\n", what);
    abort();
}

/* The scratch directory: in /dev/shm when there is one (no disk writes per input), else in TMPDIR or /tmp. */
static inline const char *deft_fuzz_scratch_dir(void) {
    if (deft_fuzz_dir[0]) return deft_fuzz_dir;
    struct stat st;
    const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : getenv("TMPDIR");
    snprintf(deft_fuzz_dir, sizeof deft_fuzz_dir, "%s/deft_fuzz_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(deft_fuzz_dir)) deft_fuzz_die("cannot make a scratch directory");
    atexit(deft_fuzz_cleanup);
    return deft_fuzz_dir;
}

/* A path in the scratch directory, the same for the same name (static storage, one per name). */
static inline const char *deft_fuzz_path(const char *name) {
    static char paths[8][512];
    for (int i = 0; i < deft_fuzz_n_files; i++)
        if (strcmp(strrchr(deft_fuzz_files[i], '/') + 1, name) == 0) return deft_fuzz_files[i];
    if (deft_fuzz_n_files == 8) deft_fuzz_die("too many scratch files");
    char *p = paths[deft_fuzz_n_files];
    snprintf(p, sizeof paths[0], "%s/%s", deft_fuzz_scratch_dir(), name);
    deft_fuzz_files[deft_fuzz_n_files++] = p;
    return p;
}

static inline void deft_fuzz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) deft_fuzz_die("cannot write a scratch file");
    if (n && fwrite(data, 1, n, f) != n) deft_fuzz_die("short write to a scratch file");
    if (fclose(f) != 0) deft_fuzz_die("cannot close a scratch file");
}

/* Copies the file at `from` into the seed directory as `name`. */
static inline void deft_fuzz_seed_file(const char *dir, const char *name, const char *from) {
    FILE *in = fopen(from, "rb");
    if (!in) deft_fuzz_die("cannot read back a seed");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *out = fopen(path, "wb");
    if (!out) deft_fuzz_die("cannot write a seed");
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, got, out) != got) deft_fuzz_die("short write of a seed");
    fclose(in);
    if (fclose(out) != 0) deft_fuzz_die("cannot close a seed");
}

static inline void deft_fuzz_seed_bytes(const char *dir, const char *name, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    deft_fuzz_write(path, data, n);
}

/* A property the library must keep failed: abort, so that libFuzzer keeps the input. */
#define FUZZ_ASSERT(cond)                                                                             \
    do {                                                                                              \
        if (!(cond)) {                                                                                \
            fprintf(stderr, "%s:%d: FUZZ_ASSERT failed: %s (last message: %s)\n", __FILE__, __LINE__, \
                    #cond, deft_errmsg());                                                            \
            abort();                                                                                  \
        }                                                                                             \
    } while (0)

/* The outcome of a load that returned s, with snapshots of what it may change taken before and after it (n bytes):
 * a refusal must be a status with a message and change nothing. Whether the load succeeded. */
static inline int deft_fuzz_loaded(deft_status s, const void *before, const void *after, size_t n) {
    if (s == DEFT_OK) return 1;
    FUZZ_ASSERT(s == DEFT_ERR_IO || s == DEFT_ERR_INVALID || s == DEFT_ERR_OOM);
    FUZZ_ASSERT(deft_errmsg()[0] != '\0');
    FUZZ_ASSERT(memcmp(before, after, n) == 0);
    return 0;
}

/* Weak: present only when the library was linked with OpenMP or OpenBLAS. Their runtimes read the environment when
 * they load, before any code of ours runs, so the thread counts are set through their calls instead. */
extern void omp_set_num_threads(int n) __attribute__((weak));
extern void openblas_set_num_threads(int n) __attribute__((weak));

/* One thread for OpenMP and OpenBLAS (fuzzers run side by side, one per core); then the seed mode, when asked for. */
static inline void deft_fuzz_start(int *argc, char ***argv, void (*write_seeds)(const char *dir)) {
    if (omp_set_num_threads) omp_set_num_threads(1);
    if (openblas_set_num_threads) openblas_set_num_threads(1);
    for (int i = 1; i + 1 < *argc; i++)
        if (strcmp((*argv)[i], "--write-seeds") == 0) {
            mkdir((*argv)[i + 1], 0755);
            write_seeds((*argv)[i + 1]);
            exit(0);
        }
}

#endif
