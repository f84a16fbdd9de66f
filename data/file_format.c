/* CRC-32 and the reading and writing primitives of deft's binary files (file_format.h). */
#include <errno.h>
#include <string.h>

#include "file_format.h"

/* The table is built per call (2 KiB of work) so that no shared state needs a once-only initialisation. */
uint32_t deft_crc32_update(uint32_t crc, const void *data, size_t n) {
    uint32_t table[256];
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    const unsigned char *p = data;
    crc ^= 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

deft_status deft_file_read(deft_file_reader *r, void *p, size_t n, const char *what) {
    size_t got = n ? fread(p, 1, n, r->f) : 0;
    r->offset += got;
    if (got == n) return DEFT_OK;
    if (ferror(r->f))
        return deft_set_error(DEFT_ERR_IO, "%s: %s: read error in %s: %s", r->who, r->path, what, strerror(errno));
    return deft_set_error(DEFT_ERR_IO, "%s: %s: truncated: the file ends in %s, after %llu bytes", r->who, r->path,
                          what, (unsigned long long)r->offset);
}

deft_status deft_file_read_le(deft_file_reader *r, int n, uint64_t *v, const char *what) {
    unsigned char b[8];
    deft_status s = deft_file_read(r, b, (size_t)n, what);
    if (s == DEFT_OK) *v = deft_get_le(b, n);
    return s;
}

deft_status deft_file_check_crc(deft_file_reader *r, const void *p, size_t n, const char *what, const char *in) {
    uint64_t stored = 0;
    deft_status s = deft_file_read_le(r, 4, &stored, what);
    if (s != DEFT_OK) return s;
    const uint32_t computed = deft_crc32(p, n);
    if (stored != computed)
        return deft_set_error(DEFT_ERR_IO, "%s: %s: checksum mismatch in %s (the file says 0x%08llx, the bytes give "
                              "0x%08x); the file is corrupt", r->who, r->path, in, (unsigned long long)stored,
                              (unsigned)computed);
    return DEFT_OK;
}

deft_status deft_file_expect_end(deft_file_reader *r, const char *after) {
    if (fgetc(r->f) == EOF) return DEFT_OK;
    return deft_set_error(DEFT_ERR_IO, "%s: %s: trailing bytes after %s; the file is corrupt", r->who, r->path, after);
}

deft_status deft_file_write(deft_file_writer *w, const void *p, size_t n) {
    if (n == 0 || fwrite(p, 1, n, w->f) == n) return DEFT_OK;
    return deft_set_error(DEFT_ERR_IO, "%s: %s: write failed: %s; %s", w->who, w->path, strerror(errno),
                          w->after_failure);
}

deft_status deft_file_write_crc(deft_file_writer *w, const void *p, size_t n) {
    unsigned char b[4];
    deft_put_le(b, deft_crc32(p, n), 4);
    return deft_file_write(w, b, sizeof b);
}
