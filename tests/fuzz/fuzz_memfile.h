/*
 * fuzz_memfile.h — the fuzz targets' one shared piece: an input written to an
 * in-memory file (memfd) that the code under test opens by path, like any file.
 */
#ifndef FUZZ_MEMFILE_H
#define FUZZ_MEMFILE_H

/* memfd_create needs _GNU_SOURCE, defined by the including file before any header. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Make *fd (created on first use, named `name`) hold exactly data[0..size) and write
 * its /proc path into path (64 bytes). Aborts if the file cannot be made. */
static inline void fuzz_memfile(int *fd, char path[64], const char *name, const uint8_t *data,
                                size_t size) {
    if (*fd < 0) {
        *fd = memfd_create(name, 0);
        if (*fd < 0) abort();
    }
    snprintf(path, 64, "/proc/self/fd/%d", *fd);
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, data, size, 0) != (ssize_t)size) abort();
}

#endif /* FUZZ_MEMFILE_H */
