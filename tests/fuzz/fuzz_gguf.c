/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader: each input is written to
 * an in-memory file (memfd) and opened through /proc/self/fd like any path;
 * when it opens, every metadata value and tensor is walked through the public
 * getters and every tensor byte is read, so a bounds bug that open missed
 * shows up as an ASan report. Build: CC=clang cmake -DTPI_FUZZ=ON (see the
 * end of CMakeLists.txt).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_memfile.h"
#include "gguf.h"

static volatile uint64_t g_sink; /* keeps the reads from being optimised away */

static void walk(const struct gguf_file *f) {
    uint64_t h = gguf_metadata_hash(f) ^ gguf_total_size(f) ^ gguf_alignment(f);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(kv->key.len < 255 ? kv->key.len : 255),
                 kv->key.data);
        int64_t iv;
        float fv;
        bool bv;
        struct gguf_str sv;
        h += gguf_get_int(f, key, &iv) ? (uint64_t)iv : 1;
        h += gguf_get_f32(f, key, &fv) ? (uint64_t)(fv == fv) : 2;
        h += gguf_get_bool(f, key, &bv) ? bv : 3;
        if (gguf_get_str(f, key, &sv))
            for (uint64_t k = 0; k < sv.len; k++)
                h += (uint8_t)sv.data[k];
        for (uint64_t k = 0; k < kv->n_bytes; k++)
            h += kv->data[k];
        if (kv->type == GGUF_VT_ARRAY) {
            double dv;
            for (uint64_t k = 0; k < kv->arr_n && k < 4096; k++) {
                if (gguf_arr_int(kv, k, &iv)) h += (uint64_t)iv;
                if (gguf_arr_f64(kv, k, &dv)) h += (uint64_t)(dv == dv);
            }
            struct gguf_str *strs;
            uint64_t n;
            if (gguf_arr_strings(kv, &strs, &n, NULL) == TPI_OK) {
                for (uint64_t k = 0; k < n; k++)
                    for (uint64_t c = 0; c < strs[k].len; c++)
                        h += (uint8_t)strs[k].data[c];
                free(strs);
            }
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (gguf_find_tensor(f, t->name) != t) abort(); /* the index must find every name */
        for (uint64_t k = 0; k < t->n_bytes; k++)
            h += t->data[k];
    }
    g_sink = h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    fuzz_memfile(&fd, path, "fuzz.gguf", data, size);
    struct gguf_file *f = NULL;
    struct tpi_error err;
    tpi_err_clear(&err);
    if (gguf_open(path, &f, &err) == TPI_OK) {
        walk(f);
        gguf_close(&f);
    } else if (err.msg[0] == '\0' || f != NULL) {
        abort(); /* every failure must say why */
    }
    return 0;
}
