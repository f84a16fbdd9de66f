/* Paths the library builds from a caller's string (a directory and a file name, a rendezvous file and a suffix):
 * built whole or refused, never cut short, so that a long directory can not turn into another, shorter path that
 * happens to exist. */
#ifndef DEFT_BASE_PATH_H
#define DEFT_BASE_PATH_H

#include <stddef.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Room for a path built by the library: Linux's PATH_MAX, the most open() takes (the NUL included). */
#define DEFT_PATH_MAX 4096

/* Formats the path into buf (n bytes). When it does not fit, buf is left empty and the result is DEFT_ERR_INVALID
 * with "<who>: path too long: ..." (its start quoted, its length and the room), never a truncated path. */
deft_status deft_path_format(char *buf, size_t n, const char *who, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
