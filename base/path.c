/* Checked path building (path.h): snprintf says how long the whole path would have been, and anything that does
 * not fit is an error instead of the silently shorter path snprintf leaves. */
#include <stdarg.h>
#include <stdio.h>

#include "path.h"

/* How much of a refused path a message quotes: enough to recognise it, little enough to keep the message short. */
#define DEFT_PATH_QUOTE 80

deft_status deft_path_format(char *buf, size_t n, const char *who, const char *fmt, ...) {
    if (!buf || n == 0) return deft_set_error(DEFT_ERR_INVALID, "%s: no room for a path", who);
    va_list ap;
    va_start(ap, fmt);
    const int len = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    if (len >= 0 && (size_t)len < n) return DEFT_OK;
    deft_status s = len < 0 ? deft_set_error(DEFT_ERR_INVALID, "%s: the path could not be formatted", who)
                            : deft_set_error(DEFT_ERR_INVALID, "%s: path too long: \"%.*s...\" is %d bytes, at most "
                                             "%zu fit", who, DEFT_PATH_QUOTE, buf, len, n - 1);
    buf[0] = '\0';
    return s;
}
