/* The caching allocator's counters, as PyTorch names them, and the summary table (torch.cuda.memory_summary).
 *
 * Each byte and count statistic keeps current, peak, allocated (the running total of increases) and freed (of
 * decreases), so that current == allocated - freed always holds and churn is visible next to the level. Their
 * moments follow PyTorch: allocated_bytes and requested_bytes move when the caller allocates and frees (requested
 * is the caller's size, so allocated - requested is what rounding costs); active_bytes also counts a freed block
 * until the other streams that used it are done; reserved_bytes moves when a segment is taken from or given back
 * to the device. */
#include <string.h>

#include "caching_internal.h"
#include "base.h"

void deft_stat_add(deft_memory_stat *s, int64_t delta) {
    s->current += delta;
    if (delta > 0) {
        s->allocated += delta;
        if (s->current > s->peak) s->peak = s->current;
    } else {
        s->freed -= delta;
    }
}

const char *deft_format_size(size_t bytes, char *buf, size_t n) {
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, n, "%zu bytes", bytes);
    else snprintf(buf, n, "%.2f %s", v, units[u]);
    return buf;
}

const char *deft_format_bytes(int64_t bytes, char *buf, size_t n) {
    if (bytes >= 0 || n < 2) return deft_format_size((size_t)bytes, buf, n);
    buf[0] = '-';   /* a counter's change may be negative; the magnitude is computed unsigned, INT64_MIN included */
    deft_format_size((size_t)0 - (size_t)bytes, buf + 1, n - 1);
    return buf;
}

deft_status deft_memory_stats_get(deft_device d, deft_memory_stats *out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "memory_stats_get: out is NULL");
    deft_pool *p;
    deft_status s = deft_pool_of(d, &p);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&p->mu);
    *out = p->stats;
    pthread_mutex_unlock(&p->mu);
    return DEFT_OK;
}

static void deft_stat_reset_peak(deft_memory_stat *s) { s->peak = s->current; }

deft_status deft_memory_reset_peak(deft_device d) {
    deft_pool *p;
    deft_status s = deft_pool_of(d, &p);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&p->mu);
    deft_memory_stats *st = &p->stats;
    deft_stat_reset_peak(&st->allocated_bytes);
    deft_stat_reset_peak(&st->reserved_bytes);
    deft_stat_reset_peak(&st->active_bytes);
    deft_stat_reset_peak(&st->requested_bytes);
    deft_stat_reset_peak(&st->allocation);
    deft_stat_reset_peak(&st->segment);
    pthread_mutex_unlock(&p->mu);
    return DEFT_OK;
}

/* The limit is checked whenever a segment is about to be taken; lowering it below what is reserved frees nothing
 * by itself (blocks in use cannot move) but makes every new segment fail until enough is given back. */
deft_status deft_memory_set_limit(deft_device d, size_t bytes) {
    deft_pool *p;
    deft_status s = deft_pool_of(d, &p);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&p->mu);
    p->limit = bytes;
    pthread_mutex_unlock(&p->mu);
    return DEFT_OK;
}

/* ---- the summary table ---- */

#define DEFT_SUMMARY_INNER 79   /* characters between the outer bars */

static void deft_summary_rule(FILE *f, char c) {
    char line[DEFT_SUMMARY_INNER + 1];
    memset(line, c, DEFT_SUMMARY_INNER);
    line[DEFT_SUMMARY_INNER] = '\0';
    fprintf(f, "|%s|\n", line);
}

static void deft_summary_title(FILE *f, const char *dev) {
    char title[DEFT_SUMMARY_INNER + 1];
    int n = snprintf(title, sizeof title, "deft memory summary, device %s", dev);
    int left = (DEFT_SUMMARY_INNER - n) / 2;
    fprintf(f, "|%*s%s%*s|\n", left, "", title, DEFT_SUMMARY_INNER - n - left, "");
}

static void deft_summary_pair(FILE *f, const char *name_a, int64_t a, const char *name_b, int64_t b) {
    char left[40], right[40];
    snprintf(left, sizeof left, "%s: %lld", name_a, (long long)a);
    snprintf(right, sizeof right, "%s: %lld", name_b, (long long)b);
    fprintf(f, "| %-37s | %-37s |\n", left, right);
}

static void deft_summary_bytes_row(FILE *f, const char *name, const deft_memory_stat *s) {
    char c[32], p[32], a[32], fr[32];
    fprintf(f, "| %-21s | %11s | %11s | %11s | %11s |\n", name, deft_format_bytes(s->current, c, sizeof c),
            deft_format_bytes(s->peak, p, sizeof p), deft_format_bytes(s->allocated, a, sizeof a),
            deft_format_bytes(s->freed, fr, sizeof fr));
}

static void deft_summary_count_row(FILE *f, const char *name, const deft_memory_stat *s) {
    fprintf(f, "| %-21s | %11lld | %11lld | %11lld | %11lld |\n", name, (long long)s->current, (long long)s->peak,
            (long long)s->allocated, (long long)s->freed);
}

static void deft_summary_write(FILE *f, const char *dev, const deft_memory_stats *st, size_t limit) {
    char lim[32];
    deft_summary_rule(f, '=');
    deft_summary_title(f, dev);
    deft_summary_rule(f, '-');
    deft_summary_pair(f, "OOMs", st->num_ooms, "Allocation retries", st->num_alloc_retries);
    deft_summary_pair(f, "Device allocs", st->num_device_alloc, "Device frees", st->num_device_free);
    fprintf(f, "| Memory limit: %-63s |\n", limit ? deft_format_size(limit, lim, sizeof lim) : "none");
    deft_summary_rule(f, '=');
    fprintf(f, "| %-21s | %11s | %11s | %11s | %11s |\n", "Metric", "Cur Usage", "Peak Usage", "Tot Alloc",
            "Tot Freed");
    deft_summary_rule(f, '-');
    deft_summary_bytes_row(f, "Allocated memory", &st->allocated_bytes);
    deft_summary_bytes_row(f, "Active memory", &st->active_bytes);
    deft_summary_bytes_row(f, "Requested memory", &st->requested_bytes);
    deft_summary_bytes_row(f, "Reserved memory", &st->reserved_bytes);
    deft_summary_rule(f, '-');
    deft_summary_count_row(f, "Allocations", &st->allocation);
    deft_summary_count_row(f, "Segments", &st->segment);
    deft_summary_rule(f, '=');
}

deft_status deft_memory_summary(deft_device d, void *file) {
    deft_pool *p;
    deft_status s = deft_pool_of(d, &p);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&p->mu);
    deft_memory_stats st = p->stats;
    size_t limit = p->limit;
    pthread_mutex_unlock(&p->mu);
    char dev[16];
    FILE *f = file ? (FILE *)file : stdout;
    deft_summary_write(f, deft_device_str(d, dev, sizeof dev), &st, limit);
    if (ferror(f)) return deft_set_error(DEFT_ERR_IO, "memory_summary: writing the table failed");
    return DEFT_OK;
}
