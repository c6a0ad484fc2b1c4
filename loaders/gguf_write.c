/*
 * gguf_write.c — GGUF v3 writer behind loaders/gguf.h.
 *
 * Metadata values are kept as the exact bytes they will have in the file
 * (scalars little-endian, strings raw, arrays as their item payload), so
 * copying a kv from an open file is a byte copy and serialisation is a walk.
 * Layout is computed once before writing: header, kvs, tensor infos, padding
 * to the alignment, then each tensor's data at an aligned offset, the file
 * padded to the alignment after the last one. The streaming path writes only
 * the header and sizes the file, so threads can pwrite() tensors into place.
 */
#define _GNU_SOURCE
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/kernels/quant.h"

static const uint8_t wvt_size[GGUF_VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

struct wkv {
    char *key;
    enum gguf_vtype type, arr_type;
    uint64_t arr_n;
    uint8_t *payload; /* value bytes as stored after the type (and array header) */
    uint64_t n_bytes;
};

struct wtensor {
    char *name;
    int type, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t n_bytes;
    const void *data;
    uint64_t rel_offset; /* from the start of the data section */
};

struct gguf_writer {
    uint32_t alignment;
    struct wkv *kvs;
    int64_t n_kv, cap_kv;
    struct wtensor *tensors;
    int64_t n_tensors, cap_tensors;
    uint64_t data_offset; /* valid once laid out */
    uint64_t file_size;
    bool laid_out;
};

struct gguf_writer *gguf_writer_new(uint32_t alignment) {
    if (alignment == 0) alignment = 32;
    if (alignment & (alignment - 1)) return NULL; /* must be a power of two */
    struct gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = alignment;
    return w;
}

void gguf_writer_free(struct gguf_writer **wp) {
    if (!wp || !*wp) return;
    struct gguf_writer *w = *wp;
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].payload);
    }
    for (int64_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->kvs);
    free(w->tensors);
    free(w);
    *wp = NULL;
}

static struct wkv *find_wkv(struct gguf_writer *w, const char *key) {
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kvs[i].key, key)) return &w->kvs[i];
    return NULL;
}

/* Add a kv whose payload is `n_bytes` bytes copied from `payload`. Duplicate
 * keys are TPI_ERR_INVALID (linear scan: writers hold tens of keys). */
static int add_kv(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                  enum gguf_vtype arr_type, uint64_t arr_n, const void *payload, uint64_t n_bytes) {
    if (!w || !key || !key[0] || strlen(key) > 65535) return TPI_ERR_INVALID;
    if (find_wkv(w, key)) return TPI_ERR_INVALID;
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        struct wkv *kvs = realloc(w->kvs, (size_t)cap * sizeof *kvs);
        if (!kvs) return TPI_ERR_NOMEM;
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    struct wkv *kv = &w->kvs[w->n_kv];
    kv->key = strdup(key);
    kv->payload = malloc(n_bytes ? (size_t)n_bytes : 1);
    if (!kv->key || !kv->payload) {
        free(kv->key);
        free(kv->payload);
        return TPI_ERR_NOMEM;
    }
    if (n_bytes) memcpy(kv->payload, payload, (size_t)n_bytes);
    kv->type = type;
    kv->arr_type = arr_type;
    kv->arr_n = arr_n;
    kv->n_bytes = n_bytes;
    w->n_kv++;
    w->laid_out = false;
    return TPI_OK;
}

int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v) {
    return add_kv(w, key, GGUF_VT_U32, GGUF_VT_COUNT, 0, &v, 4);
}
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v) {
    return add_kv(w, key, GGUF_VT_I32, GGUF_VT_COUNT, 0, &v, 4);
}
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v) {
    return add_kv(w, key, GGUF_VT_U64, GGUF_VT_COUNT, 0, &v, 8);
}
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v) {
    return add_kv(w, key, GGUF_VT_F32, GGUF_VT_COUNT, 0, &v, 4);
}
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return add_kv(w, key, GGUF_VT_BOOL, GGUF_VT_COUNT, 0, &b, 1);
}
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v) {
    if (!v) return TPI_ERR_INVALID;
    return add_kv(w, key, GGUF_VT_STRING, GGUF_VT_COUNT, 0, v, strlen(v));
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype item_type,
                        const void *data, uint64_t n) {
    if ((unsigned)item_type >= GGUF_VT_COUNT || wvt_size[item_type] == 0 || (n && !data))
        return TPI_ERR_INVALID;
    uint64_t n_bytes;
    if (__builtin_mul_overflow(n, (uint64_t)wvt_size[item_type], &n_bytes)) return TPI_ERR_INVALID;
    return add_kv(w, key, GGUF_VT_ARRAY, item_type, n, data, n_bytes);
}

int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n) {
    if (n && !strs) return TPI_ERR_INVALID;
    /* Serialise as (u64 length, bytes) pairs, the array payload format. */
    uint64_t n_bytes = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) return TPI_ERR_INVALID;
        n_bytes += 8 + (lens ? lens[i] : strlen(strs[i]));
    }
    uint8_t *buf = malloc(n_bytes ? (size_t)n_bytes : 1);
    if (!buf) return TPI_ERR_NOMEM;
    uint8_t *p = buf;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = lens ? lens[i] : strlen(strs[i]);
        memcpy(p, &len, 8);
        memcpy(p + 8, strs[i], (size_t)len);
        p += 8 + len;
    }
    /* add_kv copies; one extra copy of a vocabulary is cheap next to a model. */
    int st = add_kv(w, key, GGUF_VT_ARRAY, GGUF_VT_STRING, n, buf, n_bytes);
    free(buf);
    return st;
}

int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv) {
    if (!kv || kv->key.len == 0 || kv->key.len > 65535 ||
        memchr(kv->key.data, 0, (size_t)kv->key.len))
        return TPI_ERR_INVALID;
    char *key = strndup(kv->key.data, (size_t)kv->key.len);
    if (!key) return TPI_ERR_NOMEM;
    /* The reader's n_bytes is exactly the payload after the type/array header. */
    int st = add_kv(w, key, kv->type, kv->type == GGUF_VT_ARRAY ? kv->arr_type : GGUF_VT_COUNT,
                    kv->type == GGUF_VT_ARRAY ? kv->arr_n : 0, kv->data, kv->n_bytes);
    free(key);
    return st;
}

int64_t gguf_writer_add_tensor(struct gguf_writer *w, const char *name, int type, int n_dims,
                               const int64_t *ne, const void *data) {
    if (!w || !name || !name[0] || strlen(name) > 65535 || n_dims < 1 || n_dims > GGUF_MAX_DIMS ||
        !ne)
        return -1;
    const struct quant_traits *tr = quant_traits(type);
    if (!tr) return -1;
    int64_t rows = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) return -1;
        if (d > 0 && __builtin_mul_overflow(rows, ne[d], &rows)) return -1;
    }
    if (ne[0] % tr->blck_size) return -1;
    uint64_t row_bytes = (uint64_t)(ne[0] / tr->blck_size) * tr->type_size, n_bytes;
    if (__builtin_mul_overflow(row_bytes, (uint64_t)rows, &n_bytes)) return -1;
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name)) return -1;
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        struct wtensor *t = realloc(w->tensors, (size_t)cap * sizeof *t);
        if (!t) return -1;
        w->tensors = t;
        w->cap_tensors = cap;
    }
    struct wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return -1;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->n_bytes = n_bytes;
    t->data = data;
    w->laid_out = false;
    return w->n_tensors++;
}

static uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) & ~(a - 1);
}

/* Add general.alignment when it is not the default, and check a given one agrees. */
static int check_alignment_kv(struct gguf_writer *w, const char *path, struct tpi_error *err) {
    struct wkv *kv = find_wkv(w, "general.alignment");
    if (!kv) {
        if (w->alignment == 32) return TPI_OK;
        int st = gguf_writer_set_u32(w, "general.alignment", w->alignment);
        return st ? tpi_err(err, st, "%s: cannot add general.alignment", path) : TPI_OK;
    }
    uint64_t v = 0;
    if (kv->type == GGUF_VT_U32 || kv->type == GGUF_VT_U64 || kv->type == GGUF_VT_I32)
        memcpy(&v, kv->payload, kv->type == GGUF_VT_U64 ? 8 : 4);
    if (v != w->alignment)
        return tpi_err(
            err, TPI_ERR_INVALID,
            "%s: metadata general.alignment (%llu) differs from the writer's alignment %u", path,
            (unsigned long long)v, w->alignment);
    return TPI_OK;
}

/* Serialise header, kvs and tensor infos into a malloc'd buffer padded to the
 * data offset; computes every tensor's offset and the file size. */
static int build_header(struct gguf_writer *w, const char *path, uint8_t **out, uint64_t *n_out,
                        struct tpi_error *err) {
    int st = check_alignment_kv(w, path, err);
    if (st) return st;
    uint64_t n = 24;
    for (int64_t i = 0; i < w->n_kv; i++) {
        const struct wkv *kv = &w->kvs[i];
        n += 8 + strlen(kv->key) + 4 + kv->n_bytes;
        if (kv->type == GGUF_VT_STRING) n += 8;
        if (kv->type == GGUF_VT_ARRAY) n += 12;
    }
    for (int64_t i = 0; i < w->n_tensors; i++)
        n += 8 + strlen(w->tensors[i].name) + 4 + 8 * (uint64_t)w->tensors[i].n_dims + 4 + 8;
    w->data_offset = align_up(n, w->alignment);
    uint64_t rel = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].rel_offset = rel;
        rel = align_up(rel + w->tensors[i].n_bytes, w->alignment);
    }
    w->file_size = w->data_offset + rel;

    uint8_t *buf = calloc(1, (size_t)w->data_offset);
    if (!buf) return tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory for the header", path);
    uint8_t *p = buf;
#define PUT(src, len)                                                                              \
    do {                                                                                           \
        memcpy(p, (src), (size_t)(len));                                                           \
        p += (len);                                                                                \
    } while (0)
    uint32_t version = 3;
    uint64_t n_tensors = (uint64_t)w->n_tensors, n_kv = (uint64_t)w->n_kv;
    PUT("GGUF", 4);
    PUT(&version, 4);
    PUT(&n_tensors, 8);
    PUT(&n_kv, 8);
    for (int64_t i = 0; i < w->n_kv; i++) {
        const struct wkv *kv = &w->kvs[i];
        uint64_t klen = strlen(kv->key);
        uint32_t type = kv->type;
        PUT(&klen, 8);
        PUT(kv->key, klen);
        PUT(&type, 4);
        if (kv->type == GGUF_VT_STRING) PUT(&kv->n_bytes, 8);
        if (kv->type == GGUF_VT_ARRAY) {
            uint32_t at = kv->arr_type;
            PUT(&at, 4);
            PUT(&kv->arr_n, 8);
        }
        PUT(kv->payload, kv->n_bytes);
    }
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        uint64_t nlen = strlen(t->name);
        uint32_t n_dims = (uint32_t)t->n_dims, type = (uint32_t)t->type;
        PUT(&nlen, 8);
        PUT(t->name, nlen);
        PUT(&n_dims, 4);
        for (int d = 0; d < t->n_dims; d++)
            PUT(&t->ne[d], 8);
        PUT(&type, 4);
        PUT(&t->rel_offset, 8);
    }
#undef PUT
    w->laid_out = true;
    *out = buf;
    *n_out = w->data_offset;
    return TPI_OK;
}

/* Write all of buf at offset, retrying short writes. */
static int pwrite_all(int fd, const void *buf, uint64_t n, uint64_t offset) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n, (off_t)offset);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (uint64_t)k;
        offset += (uint64_t)k;
    }
    return 0;
}

int gguf_writer_write_header(struct gguf_writer *w, const char *path, int *fd_out,
                             struct tpi_error *err) {
    *fd_out = -1;
    if (!w || !path)
        return tpi_err(err, TPI_ERR_INVALID, "gguf_writer_write_header: NULL argument");
    uint8_t *hdr = NULL;
    uint64_t n_hdr = 0;
    int st = build_header(w, path, &hdr, &n_hdr, err);
    if (st) return st;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(hdr);
        return tpi_err(err, TPI_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    /* ftruncate sizes the file (zeros, sparse) so padding and unwritten tensors read as 0. */
    if (pwrite_all(fd, hdr, n_hdr, 0) != 0 || ftruncate(fd, (off_t)w->file_size) != 0) {
        int e = errno;
        free(hdr);
        close(fd);
        return tpi_err(err, TPI_ERR_IO, "%s: cannot write %llu bytes: %s", path,
                       (unsigned long long)w->file_size, strerror(e));
    }
    free(hdr);
    *fd_out = fd;
    return TPI_OK;
}

uint64_t gguf_writer_tensor_offset(const struct gguf_writer *w, int64_t i) {
    if (!w || !w->laid_out || i < 0 || i >= w->n_tensors) return 0;
    return w->data_offset + w->tensors[i].rel_offset;
}

int gguf_writer_write(struct gguf_writer *w, const char *path, struct tpi_error *err) {
    if (!w || !path) return tpi_err(err, TPI_ERR_INVALID, "gguf_writer_write: NULL argument");
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (!w->tensors[i].data && w->tensors[i].n_bytes)
            return tpi_err(err, TPI_ERR_INVALID, "%s: tensor '%s' has no data", path,
                           w->tensors[i].name);
    int fd;
    int st = gguf_writer_write_header(w, path, &fd, err);
    if (st) return st;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        if (pwrite_all(fd, t->data, t->n_bytes, w->data_offset + t->rel_offset) != 0) {
            int e = errno;
            close(fd);
            return tpi_err(err, TPI_ERR_IO, "%s: writing tensor '%s': %s", path, t->name,
                           strerror(e));
        }
    }
    if (close(fd) != 0) return tpi_err(err, TPI_ERR_IO, "%s: close: %s", path, strerror(errno));
    return TPI_OK;
}
