/* Byte order for the file formats: idx is big-endian, parameter files little-endian. */
#ifndef DEFT_BYTE_ORDER_H
#define DEFT_BYTE_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline bool deft_host_is_little_endian(void) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

/* Converts elements of esize bytes between host order and the given file order in place (its own inverse). */
static inline void deft_elements_to_order(void *data, size_t bytes, size_t esize, bool file_little_endian) {
    if (deft_host_is_little_endian() == file_little_endian || esize < 2) return;
    unsigned char *p = data;
    for (size_t off = 0; off + esize <= bytes; off += esize)
        for (size_t i = 0; i < esize / 2; i++) {
            unsigned char t = p[off + i];
            p[off + i] = p[off + esize - 1 - i];
            p[off + esize - 1 - i] = t;
        }
}

#endif
