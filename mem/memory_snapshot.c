/* The allocation history and the JSON snapshot of every pool (like torch.cuda.memory._snapshot()).
 *
 * The history is one ring buffer for all devices, so that the order of events across devices is kept, bounded so
 * that a long run cannot grow it; its own mutex is only ever taken inside a pool's (or alone), never the other way.
 * The snapshot holds each pool's lock while its part is written, so a pool's segments, blocks and stats agree with
 * each other. Strings are escaped for JSON, and bytes that are not UTF-8 (a tag cut mid-character, or a caller's
 * odd bytes) become U+FFFD, so the file always parses. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "caching_internal.h"
#include "base.h"

typedef struct deft_history_entry {
    deft_history_action action;
    deft_device device;
    uintptr_t addr;
    size_t size;
    uintptr_t stream;
    int64_t time_us;
    char tag[DEFT_CACHING_TAG_MAX];
} deft_history_entry;

static pthread_mutex_t deft_hist_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool deft_hist_on;
static deft_history_entry *deft_hist;
static size_t deft_hist_cap, deft_hist_head, deft_hist_len;   /* head: the oldest entry */

/* Microseconds on a monotonic clock: differences and order are what a history is read for. */
static int64_t deft_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void deft_history_add(deft_history_action action, deft_device d, uintptr_t addr, size_t size, void *stream,
                      const char *tag) {
    if (!atomic_load_explicit(&deft_hist_on, memory_order_relaxed)) return;
    pthread_mutex_lock(&deft_hist_mu);
    if (deft_hist_cap) {
        size_t slot = (deft_hist_head + deft_hist_len) % deft_hist_cap;
        if (deft_hist_len == deft_hist_cap) deft_hist_head = (deft_hist_head + 1) % deft_hist_cap;
        else deft_hist_len++;
        deft_history_entry *e = &deft_hist[slot];
        *e = (deft_history_entry){action, d, addr, size, (uintptr_t)stream, deft_now_us(), ""};
        snprintf(e->tag, sizeof e->tag, "%s", tag ? tag : "");
    }
    pthread_mutex_unlock(&deft_hist_mu);
}

/* Keeps the newest entries that fit in the new size. */
deft_status deft_memory_record_history(size_t max_entries) {
    if (max_entries > SIZE_MAX / sizeof(deft_history_entry))
        return deft_set_error(DEFT_ERR_INVALID, "memory_record_history: %zu entries is too many", max_entries);
    deft_history_entry *n = NULL;
    if (max_entries && !(n = calloc(max_entries, sizeof *n)))
        return deft_set_error(DEFT_ERR_OOM, "memory_record_history: no host memory for %zu entries", max_entries);
    pthread_mutex_lock(&deft_hist_mu);
    size_t keep = deft_hist_len < max_entries ? deft_hist_len : max_entries;
    for (size_t i = 0; i < keep; i++)
        n[i] = deft_hist[(deft_hist_head + deft_hist_len - keep + i) % deft_hist_cap];
    free(deft_hist);
    deft_hist = n;
    deft_hist_cap = max_entries;
    deft_hist_head = 0;
    deft_hist_len = keep;
    atomic_store(&deft_hist_on, max_entries > 0);
    pthread_mutex_unlock(&deft_hist_mu);
    return DEFT_OK;
}

/* ---- JSON ---- */

/* Length of the valid UTF-8 sequence at s, or 0 (overlong forms, surrogates and values past U+10FFFF are invalid). */
static int deft_utf8_len(const unsigned char *s) {
    unsigned char c = s[0];
    int n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!n) return 0;
    unsigned char lo = 0x80, hi = 0xBF;   /* the allowed range of the second byte */
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

static void deft_json_string(FILE *f, const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    while (*s) {
        unsigned char c = *s;
        int n;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\u%04x", c);
        else if (c < 0x80) fputc(c, f);
        else if ((n = deft_utf8_len(s)) > 0) {
            fwrite(s, 1, (size_t)n, f);
            s += n;
            continue;
        } else fputs("\\ufffd", f);
        s++;
    }
    fputc('"', f);
}

static const char *deft_block_state_name(deft_block_state s) {
    switch (s) {
    case DEFT_BLOCK_ALLOCATED: return "active_allocated";
    case DEFT_BLOCK_PENDING: return "active_pending_free";
    case DEFT_BLOCK_FREE: break;
    }
    return "inactive";
}

static void deft_json_stat(FILE *f, const char *name, const deft_memory_stat *s, const char *after) {
    fprintf(f, "\"%s\":{\"current\":%lld,\"peak\":%lld,\"allocated\":%lld,\"freed\":%lld}%s", name,
            (long long)s->current, (long long)s->peak, (long long)s->allocated, (long long)s->freed, after);
}

static void deft_json_stats(FILE *f, const deft_memory_stats *st) {
    fputs("\"stats\":{", f);
    deft_json_stat(f, "allocated_bytes", &st->allocated_bytes, ",");
    deft_json_stat(f, "reserved_bytes", &st->reserved_bytes, ",");
    deft_json_stat(f, "active_bytes", &st->active_bytes, ",");
    deft_json_stat(f, "requested_bytes", &st->requested_bytes, ",");
    deft_json_stat(f, "allocation", &st->allocation, ",");
    deft_json_stat(f, "segment", &st->segment, ",");
    fprintf(f, "\"num_alloc_retries\":%lld,\"num_ooms\":%lld,\"num_device_alloc\":%lld,\"num_device_free\":%lld}",
            (long long)st->num_alloc_retries, (long long)st->num_ooms, (long long)st->num_device_alloc,
            (long long)st->num_device_free);
}

static void deft_json_block(FILE *f, const deft_segment *seg, const deft_block *b) {
    fprintf(f, "{\"address\":%llu,\"offset\":%llu,\"size\":%zu,\"requested_size\":%zu,\"state\":\"%s\",\"tag\":",
            (unsigned long long)b->addr, (unsigned long long)(b->addr - seg->base), b->size, b->requested,
            deft_block_state_name(b->state));
    deft_json_string(f, b->tag);
    fputc('}', f);
}

static void deft_json_segment(FILE *f, const deft_segment *seg) {
    fprintf(f, "{\"address\":%llu,\"total_size\":%zu,\"stream\":%llu,\"pool\":\"%s\",\"blocks\":[",
            (unsigned long long)seg->base, seg->size, (unsigned long long)(uintptr_t)seg->stream,
            seg->small ? "small" : "large");
    for (const deft_block *b = seg->first; b; b = b->next) {
        fputs(b == seg->first ? "\n      " : ",\n      ", f);
        deft_json_block(f, seg, b);
    }
    fputs("]}", f);
}

/* Segments oldest first, as they were taken from the device (the pool's list is newest first). */
static void deft_json_segments(FILE *f, const deft_pool *p) {
    const deft_segment *last = p->segments;
    while (last && last->next) last = last->next;
    fputs("\"segments\":[", f);
    for (const deft_segment *seg = last; seg; seg = seg->prev) {
        fputs(seg == last ? "\n    " : ",\n    ", f);
        deft_json_segment(f, seg);
    }
    fputs("],\n   ", f);
}

static void deft_json_pool(FILE *f, const deft_pool *p) {
    char dev[16];
    fprintf(f, "{\"device\":\"%s\",\"limit\":%zu,", deft_device_str(p->device, dev, sizeof dev), p->limit);
    deft_json_segments(f, p);
    deft_json_stats(f, &p->stats);
    fputc('}', f);
}

/* The CPU pool always; a GPU's once something was asked of it (so a snapshot never starts the CUDA runtime). */
static void deft_json_devices(FILE *f) {
    fputs("\"devices\":[", f);
    bool first = true;
    for (int i = 0; i < deft_pool_count(); i++) {
        deft_pool *p = deft_pool_at(i);
        pthread_mutex_lock(&p->mu);
        if (i == 0 || p->used) {
            fputs(first ? "\n  " : ",\n  ", f);
            deft_json_pool(f, p);
            first = false;
        }
        pthread_mutex_unlock(&p->mu);
    }
    fputs("]", f);
}

static const char *deft_history_action_name(deft_history_action a) {
    switch (a) {
    case DEFT_HIST_ALLOC: return "alloc";
    case DEFT_HIST_FREE: return "free";
    case DEFT_HIST_SEGMENT_ALLOC: return "segment_alloc";
    case DEFT_HIST_SEGMENT_FREE: return "segment_free";
    case DEFT_HIST_OOM: return "oom";
    }
    return "unknown";
}

static void deft_json_history_entry(FILE *f, const deft_history_entry *e) {
    char dev[16];
    fprintf(f, "{\"action\":\"%s\",\"device\":\"%s\",\"address\":%llu,\"size\":%zu,\"stream\":%llu,\"time_us\":%lld,"
            "\"tag\":", deft_history_action_name(e->action), deft_device_str(e->device, dev, sizeof dev),
            (unsigned long long)e->addr, e->size, (unsigned long long)e->stream, (long long)e->time_us);
    deft_json_string(f, e->tag);
    fputc('}', f);
}

static void deft_json_history(FILE *f) {
    fputs("\"history\":[", f);
    pthread_mutex_lock(&deft_hist_mu);
    for (size_t i = 0; i < deft_hist_len; i++) {
        fputs(i ? ",\n  " : "\n  ", f);
        deft_json_history_entry(f, &deft_hist[(deft_hist_head + i) % deft_hist_cap]);
    }
    pthread_mutex_unlock(&deft_hist_mu);
    fputs("]", f);
}

deft_status deft_memory_snapshot(const char *path) {
    if (!path) return deft_set_error(DEFT_ERR_INVALID, "memory_snapshot: path is NULL");
    FILE *f = fopen(path, "w");
    if (!f) return deft_set_error(DEFT_ERR_IO, "memory_snapshot: cannot open %s: %s", path, strerror(errno));
    fputs("{", f);
    deft_json_devices(f);
    fputs(",\n", f);
    deft_json_history(f);
    fputs("}\n", f);
    bool failed = ferror(f) != 0;
    failed = fclose(f) != 0 || failed;
    if (failed) return deft_set_error(DEFT_ERR_IO, "memory_snapshot: writing %s failed", path);
    return DEFT_OK;
}
