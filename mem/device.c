/* Devices: parsing, the default, facts, and memory behind one interface for the CPU and CUDA. */
#define _DEFAULT_SOURCE /* sysconf(_SC_PHYS_PAGES) */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "caching_allocator.h"
#include "device_internal.h"
#include "base.h"

int deft_cuda_device_count(void) { return deft_cuda_count(); }

int deft_cuda_runtime_started(void) { return deft_cuda_started(); }

deft_status deft_device_check(deft_device d) {
    if (d.type == DEFT_CPU) return DEFT_OK;
    if (d.type != DEFT_CUDA) return deft_set_error(DEFT_ERR_DEVICE, "unknown device type %d", (int)d.type);
    if (!deft_has_cuda_build())
        return deft_set_error(DEFT_ERR_NO_CUDA, "cuda:%d was asked for, but deft was built without CUDA", d.index);
    int count = deft_cuda_count();
    if (count == 0)
        return deft_set_error(DEFT_ERR_NO_CUDA, "cuda:%d was asked for, but no CUDA GPU is usable here", d.index);
    if (d.index < 0 || d.index >= count)
        return deft_set_error(DEFT_ERR_DEVICE, "cuda:%d does not exist: %d CUDA device%s visible", d.index, count,
                              count == 1 ? " is" : "s are");
    return DEFT_OK;
}

deft_status deft_device_parse(const char *s, deft_device *out) {
    if (!s || !out) return deft_set_error(DEFT_ERR_INVALID, "device_parse: NULL argument");
    deft_device d;
    if (strcmp(s, "cpu") == 0) {
        *out = deft_cpu();
        return DEFT_OK;
    }
    if (strcmp(s, "cuda") == 0) {
        d = deft_cuda(0);
    } else if (strncmp(s, "cuda:", 5) == 0) {
        const char *p = s + 5;
        char *end = NULL;
        if (!isdigit((unsigned char)*p))
            return deft_set_error(DEFT_ERR_DEVICE, "unknown device \"%s\": expected cpu, cuda or cuda:N", s);
        long idx = strtol(p, &end, 10);
        if (*end != '\0' || idx > 1 << 20)
            return deft_set_error(DEFT_ERR_DEVICE, "unknown device \"%s\": expected cpu, cuda or cuda:N", s);
        d = deft_cuda((int)idx);
    } else {
        return deft_set_error(DEFT_ERR_DEVICE, "unknown device \"%s\": expected cpu, cuda or cuda:N", s);
    }
    deft_status st = deft_device_check(d);
    if (st != DEFT_OK) return st;
    *out = d;
    return DEFT_OK;
}

deft_device deft_device_default(void) {
    return deft_has_cuda_build() && deft_cuda_count() > 0 ? deft_cuda(0) : deft_cpu();
}

deft_status deft_device_name(deft_device d, char *buf, size_t n) {
    if (!buf || n == 0) return deft_set_error(DEFT_ERR_INVALID, "device_name: no buffer");
    deft_status s = deft_device_check(d);
    if (s != DEFT_OK) return s;
    if (d.type == DEFT_CPU) {
        snprintf(buf, n, "cpu");
        return DEFT_OK;
    }
    return deft_cuda_name(d.index, buf, n);
}

/* Host memory as the kernel sees it: physical pages, from sysconf. */
static deft_status deft_host_memory(size_t *free_bytes, size_t *total_bytes);

deft_status deft_device_memory(deft_device d, size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes) return deft_set_error(DEFT_ERR_INVALID, "device_memory: NULL argument");
    deft_status s = deft_device_check(d);
    if (s != DEFT_OK) return s;
    if (d.type == DEFT_CPU) return deft_host_memory(free_bytes, total_bytes);
    return deft_cuda_memory(d.index, free_bytes, total_bytes);
}

/* Every device byte goes through the caching allocator (mem/caching_allocator.c), so that the statistics,
 * snapshots and OOM messages see all of it; the default stream orders reuse. */
deft_status deft_mem_alloc(deft_device d, size_t bytes, void **out) {
    return deft_caching_alloc(d, bytes, NULL, NULL, out);
}

deft_status deft_mem_alloc_tagged(deft_device d, size_t bytes, const char *tag, void **out) {
    return deft_caching_alloc(d, bytes, NULL, tag, out);
}

/* A bad pointer is reported through deft_errmsg() and changes nothing. */
void deft_mem_free(deft_device d, void *ptr) { (void)deft_caching_free(d, ptr); }

deft_status deft_mem_copy(deft_device dst_dev, void *dst, deft_device src_dev, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return DEFT_OK;
    if (dst_dev.type == DEFT_CPU && src_dev.type == DEFT_CPU) {
        memcpy(dst, src, bytes);
        return DEFT_OK;
    }
    if (dst_dev.type == DEFT_CUDA && src_dev.type == DEFT_CPU) return deft_cuda_copy(dst_dev.index, dst, -1, src, bytes, 0);
    if (dst_dev.type == DEFT_CPU) return deft_cuda_copy(-1, dst, src_dev.index, src, bytes, 1);
    return deft_cuda_copy(dst_dev.index, dst, src_dev.index, src, bytes, 2);
}

deft_status deft_device_synchronize(deft_device d) {
    if (d.type == DEFT_CPU) return DEFT_OK;
    return deft_cuda_synchronize(d.index);
}

static deft_status deft_host_memory(size_t *free_bytes, size_t *total_bytes) {
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return deft_set_error(DEFT_ERR_RUNTIME, "cannot read the host's memory size");
    *total_bytes = (size_t)pages * (size_t)page;
    *free_bytes = avail > 0 ? (size_t)avail * (size_t)page : 0;
    return DEFT_OK;
}
