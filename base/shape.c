/* Shape arithmetic shared by the builder and the kernels. */
#include <stdio.h>
#include <string.h>

#include "base.h"

int64_t deft_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

const char *deft_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t used = 0;
    if (n == 0) return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

void deft_shape_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

deft_status deft_shape_broadcast(int na, const int64_t *a, int nb, const int64_t *b, int *nout, int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[128], sb[128];
            return deft_set_error(DEFT_ERR_SHAPE,
                                  "shapes %s and %s do not broadcast: dimension %d is %lld against %lld",
                                  deft_shape_str(na, a, sa, sizeof sa), deft_shape_str(nb, b, sb, sizeof sb),
                                  i - n, (long long)da, (long long)db);
        }
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return DEFT_OK;
}

void deft_broadcast_strides(int ndim_in, const int64_t *in_shape, int ndim_out, const int64_t *out_shape,
                            int64_t *strides) {
    int64_t in_strides[DEFT_MAX_DIMS];
    deft_shape_strides(ndim_in, in_shape, in_strides);
    for (int i = 0; i < ndim_out; i++) {
        int j = ndim_in - ndim_out + i;
        strides[i] = (j >= 0 && in_shape[j] == out_shape[i] && in_shape[j] != 1) ? in_strides[j] : 0;
    }
}
