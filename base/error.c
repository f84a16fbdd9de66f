/* Status codes and the per-thread last message (SQLite style: one message you can always ask for). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base.h"

static _Thread_local char deft_last_message[1024];

const char *deft_errmsg(void) { return deft_last_message; }

/* Formats through a copy so that a message may quote the previous one (deft_errmsg() as an argument). */
static void deft_vset_message(const char *fmt, va_list ap) {
    char buf[sizeof deft_last_message];
    vsnprintf(buf, sizeof buf, fmt, ap);
    memcpy(deft_last_message, buf, sizeof buf);
}

deft_status deft_set_error(deft_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    deft_vset_message(fmt, ap);
    va_end(ap);
    return s;
}

const char *deft_status_name(deft_status s) {
    switch (s) {
    case DEFT_OK: return "DEFT_OK";
    case DEFT_ERR_INVALID: return "DEFT_ERR_INVALID";
    case DEFT_ERR_SHAPE: return "DEFT_ERR_SHAPE";
    case DEFT_ERR_DTYPE: return "DEFT_ERR_DTYPE";
    case DEFT_ERR_DEVICE: return "DEFT_ERR_DEVICE";
    case DEFT_ERR_NO_CUDA: return "DEFT_ERR_NO_CUDA";
    case DEFT_ERR_OOM: return "DEFT_ERR_OOM";
    case DEFT_ERR_STATE: return "DEFT_ERR_STATE";
    case DEFT_ERR_IO: return "DEFT_ERR_IO";
    case DEFT_ERR_RUNTIME: return "DEFT_ERR_RUNTIME";
    }
    return "DEFT_ERR_UNKNOWN";
}

const char *deft_version(void) { return "0.1.0"; }
