/* What the examples share: --help, progress lines, a monotonic clock for their rate figures and the predicted class
 * of a row of 10 logits. Include after defining _POSIX_C_SOURCE (clock_gettime, isatty, fileno). */
#ifndef DEFT_EXAMPLE_UTIL_H
#define DEFT_EXAMPLE_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --help or -h anywhere in argv: help (the usage line, what the example does, every option and its default) on
 * stdout and exit 0; bad usage stays on stderr with exit 2. */
static inline void example_help(int argc, char **argv, const char *help) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            exit(0);
        }
}

/* --trace FILE anywhere in argv: taken out of argv (so each example parses the rest as before) and returned; NULL
 * when absent. A --trace without its FILE is bad usage: *bad is set. */
static inline const char *example_trace_arg(int *argc, char **argv, int *bad) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--trace")) continue;
        if (i + 1 >= *argc) {
            *bad = 1;
            return NULL;
        }
        const char *path = argv[i + 1];
        for (int j = i + 2; j <= *argc; j++) argv[j - 2] = argv[j];   /* argv[argc] is NULL: moved down too */
        *argc -= 2;
        return path;
    }
    return NULL;
}

/* Progress lines redraw in place ('\r') only on a terminal: in a log or a pipe the '\r's would run them together
 * on one line, so there each is a line of its own. */
static inline int progress_in_place(void) { return isatty(fileno(stdout)); }

static inline double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int argmax10(const float *row) {
    int best = 0;
    for (int k = 1; k < 10; k++)
        if (row[k] > row[best]) best = k;
    return best;
}

#endif
