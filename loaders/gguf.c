/*
 * gguf.c — GGUF reader (v2, v3, little-endian) behind loaders/gguf.h.
 *
 * Each part is mapped read-only and parsed once at open into arrays of views
 * (struct gguf_kv, struct gguf_tensor) that point into the mapping. Nothing in
 * the file is trusted: every read goes through a cursor that checks the bytes
 * are there, counts are checked against what the remaining bytes could hold
 * before anything is sized by them, and arrays grow as entries are actually
 * parsed, so no allocation is larger than a small multiple of the file size.
 * Names and keys are looked up through open-addressing hash indexes (FNV-1a
 * from a per-process random seed, then a 64-bit mix), which also find duplicates
 * at open in O(n): with a fixed hash a file could list keys that all land in one
 * slot and make opening it quadratic (hours for a 100 MB header).
 *
 * kv->n_bytes is the size of the payload that kv->data points at: the value
 * for scalars, the bytes for strings, and the items as stored for arrays (for
 * arrays of strings that is the (u64 length, bytes) sequence), so a writer can
 * copy a value verbatim.
 */
#define _GNU_SOURCE
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../engine/kernels/quant.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ARRAY_DEPTH 2  /* an array of arrays is allowed, one more level is not */
#define GGUF_MAX_NAME_LEN 65535 /* keys and tensor names (the spec caps keys at 2^16-1) */
#define GGUF_MAX_ALIGNMENT (1ull << 30)
#define GGUF_MAX_SPLITS 99999    /* the -%05d-of-%05d file name format */
#define GGUF_HEADER_BYTES 24     /* magic, version, n_tensors, n_kv */
#define GGUF_MIN_KV_BYTES 13     /* key length, 1-byte key, type, 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 24 /* name length, n_dims, type, offset (n_dims 0, empty name) */

/* Bytes of one scalar of each value type (0: STRING and ARRAY are variable). */
static const uint8_t vt_size[GGUF_VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* Open-addressing table of indices (slot = index + 1, 0 = empty). */
struct name_index {
    int64_t *slots;
    uint64_t mask;
    uint64_t seed; /* hash_seed() */
};

struct gguf_part {
    char *path;
    const uint8_t *map;
    uint64_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t kv_begin, kv_end; /* the metadata section [kv_begin, kv_end) */
    uint64_t data_offset;      /* start of the tensor data section */
    int64_t n_kv;
    struct gguf_kv *kvs;
    struct name_index kv_index;
    int64_t n_tensors; /* declared in this part */
};

struct gguf_file {
    char *path;
    int n_parts;
    struct gguf_part *parts;
    uint64_t total_size;
    uint64_t meta_hash;
    int64_t n_tensors, cap_tensors;
    struct gguf_tensor *tensors; /* of all parts, in file order */
    struct name_index tensor_index;
};

/* ---- small helpers --------------------------------------------------------- */

/* Fill err with "PATH: message". */
__attribute__((format(printf, 4, 5))) static int ferr(struct tpi_error *err, int status,
                                                      const char *path, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tpi_err(err, status, "%s: %s", path, msg);
}

/* A printable copy of a name from the file for error messages: at most 80
 * bytes, non-printable bytes as '?', so a hostile name cannot garble the line. */
static const char *printable(char *buf, size_t buf_n, const char *s, uint64_t len) {
    size_t n = 0;
    for (uint64_t i = 0; i < len && n + 4 < buf_n && i < 80; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (len > 80 && n + 4 < buf_n) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

/* A seed for the indexes, random once a process (the kernel's, or the clock and pid
 * where getrandom fails), so that no file can be made to collide in them. */
static uint64_t hash_seed(void) {
    static uint64_t seed; /* 0: not drawn yet (a race draws twice: either value serves) */
    uint64_t v = __atomic_load_n(&seed, __ATOMIC_RELAXED);
    if (v) return v;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        v = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)ts.tv_sec ^
            (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&seed;
    }
    v |= 1;
    __atomic_store_n(&seed, v, __ATOMIC_RELAXED);
    return v;
}

static uint64_t name_hash(const struct name_index *ix, const char *s, uint64_t len) {
    uint64_t h = tpi_fnv1a(TPI_FNV_INIT ^ ix->seed, s, (size_t)len);
    h ^= h >> 30; /* splitmix64's finalizer: every bit of h reaches the slot bits */
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

/* Allocate a table for n entries (load factor <= 1/2). */
static int index_init(struct name_index *ix, int64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)n)
        cap <<= 1;
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    ix->seed = hash_seed();
    return ix->slots ? TPI_OK : TPI_ERR_NOMEM;
}

/* Find the slot holding `name` (via get_name(ctx, index)) or the empty slot where it goes. */
typedef void (*index_name_fn)(const void *ctx, int64_t i, const char **s, uint64_t *len);

static int64_t *index_slot(const struct name_index *ix, const char *s, uint64_t len,
                           index_name_fn get_name, const void *ctx) {
    uint64_t h = name_hash(ix, s, len) & ix->mask;
    for (;;) {
        int64_t *slot = &ix->slots[h];
        if (*slot == 0) return slot;
        const char *t;
        uint64_t tlen;
        get_name(ctx, *slot - 1, &t, &tlen);
        if (tlen == len && memcmp(t, s, (size_t)len) == 0) return slot;
        h = (h + 1) & ix->mask;
    }
}

static void kv_name(const void *ctx, int64_t i, const char **s, uint64_t *len) {
    const struct gguf_kv *kv = &((const struct gguf_kv *)ctx)[i];
    *s = kv->key.data;
    *len = kv->key.len;
}

static void tensor_name(const void *ctx, int64_t i, const char **s, uint64_t *len) {
    const struct gguf_tensor *t = &((const struct gguf_tensor *)ctx)[i];
    *s = t->name;
    *len = strlen(t->name);
}

/* Bounds-checked little-endian cursor over one mapping. */
struct rd {
    const uint8_t *base;
    uint64_t size, pos;
};

static bool rd_have(const struct rd *r, uint64_t n) {
    return n <= r->size - r->pos;
}

static bool rd_u32(struct rd *r, uint32_t *v) {
    if (!rd_have(r, 4)) return false;
    memcpy(v, r->base + r->pos, 4);
    r->pos += 4;
    return true;
}

static bool rd_u64(struct rd *r, uint64_t *v) {
    if (!rd_have(r, 8)) return false;
    memcpy(v, r->base + r->pos, 8);
    r->pos += 8;
    return true;
}

/* ---- metadata values ---------------------------------------------------------- */

/* Walk one value of type `vt` at the cursor (depth = arrays around it). On success
 * the cursor is past it; on failure `why` says what is wrong with it. */
static bool walk_value(struct rd *r, uint32_t vt, int depth, char *why, size_t why_n) {
    if (vt >= GGUF_VT_COUNT) {
        snprintf(why, why_n, "unknown value type %u", vt);
        return false;
    }
    uint64_t at = r->pos;
    if (vt == GGUF_VT_STRING) {
        uint64_t len;
        if (!rd_u64(r, &len)) {
            snprintf(why, why_n, "string length at offset %llu past end of file (size %llu)",
                     (unsigned long long)at, (unsigned long long)r->size);
            return false;
        }
        if (!rd_have(r, len)) {
            snprintf(why, why_n, "string length %llu at offset %llu past end of file (size %llu)",
                     (unsigned long long)len, (unsigned long long)at, (unsigned long long)r->size);
            return false;
        }
        r->pos += len;
        return true;
    }
    if (vt != GGUF_VT_ARRAY) {
        if (!rd_have(r, vt_size[vt])) {
            snprintf(why, why_n, "%s value at offset %llu past end of file (size %llu)",
                     gguf_vtype_name((int)vt), (unsigned long long)at, (unsigned long long)r->size);
            return false;
        }
        r->pos += vt_size[vt];
        return true;
    }
    /* An array: item type, count, items. */
    uint32_t item_vt;
    uint64_t n;
    if (!rd_u32(r, &item_vt) || !rd_u64(r, &n)) {
        snprintf(why, why_n, "array header at offset %llu past end of file (size %llu)",
                 (unsigned long long)at, (unsigned long long)r->size);
        return false;
    }
    if (item_vt >= GGUF_VT_COUNT) {
        snprintf(why, why_n, "array of unknown item type %u", item_vt);
        return false;
    }
    if (item_vt == GGUF_VT_ARRAY && depth + 1 >= GGUF_MAX_ARRAY_DEPTH) {
        snprintf(why, why_n, "arrays nested deeper than %d levels", GGUF_MAX_ARRAY_DEPTH);
        return false;
    }
    /* Smallest item: a scalar's size, an empty string (8), an empty array (12). */
    uint64_t min_item = item_vt == GGUF_VT_STRING  ? 8
                        : item_vt == GGUF_VT_ARRAY ? 12
                                                   : vt_size[item_vt];
    if (n > (r->size - r->pos) / min_item) {
        snprintf(why, why_n, "array of %llu %s items at offset %llu past end of file (size %llu)",
                 (unsigned long long)n, gguf_vtype_name((int)item_vt), (unsigned long long)at,
                 (unsigned long long)r->size);
        return false;
    }
    if (item_vt != GGUF_VT_STRING && item_vt != GGUF_VT_ARRAY) {
        r->pos += n * min_item;
        return true;
    }
    for (uint64_t i = 0; i < n; i++) {
        char inner[400];
        if (!walk_value(r, item_vt, depth + 1, inner, sizeof inner)) {
            snprintf(why, why_n, "array item %llu: %s", (unsigned long long)i, inner);
            return false;
        }
    }
    return true;
}

/* Parse metadata kv #i at the cursor into *kv. */
static int parse_kv(struct rd *r, const char *path, int64_t i, struct gguf_kv *kv,
                    struct tpi_error *err) {
    uint64_t at = r->pos, len;
    char name[128], why[600];
    if (!rd_u64(r, &len))
        return ferr(err, TPI_ERR_FORMAT, path,
                    "metadata key #%lld: key length at offset %llu past end of file (size %llu)",
                    (long long)i, (unsigned long long)at, (unsigned long long)r->size);
    if (len == 0)
        return ferr(err, TPI_ERR_FORMAT, path, "metadata key #%lld: empty key", (long long)i);
    if (len > GGUF_MAX_NAME_LEN || !rd_have(r, len))
        return ferr(err, TPI_ERR_FORMAT, path,
                    "metadata key #%lld: key length %llu %s (offset %llu, size %llu)", (long long)i,
                    (unsigned long long)len,
                    len > GGUF_MAX_NAME_LEN ? "over the 65535-byte limit" : "past end of file",
                    (unsigned long long)at, (unsigned long long)r->size);
    kv->key.len = len;
    kv->key.data = (const char *)r->base + r->pos;
    r->pos += len;
    printable(name, sizeof name, kv->key.data, len);
    if (memchr(kv->key.data, 0, (size_t)len))
        return ferr(err, TPI_ERR_FORMAT, path, "metadata key #%lld '%s': NUL byte in key",
                    (long long)i, name);
    uint32_t vt;
    if (!rd_u32(r, &vt))
        return ferr(err, TPI_ERR_FORMAT, path,
                    "metadata key #%lld '%s': value type past end of file (size %llu)",
                    (long long)i, name, (unsigned long long)r->size);
    if (vt >= GGUF_VT_COUNT)
        return ferr(err, TPI_ERR_FORMAT, path, "metadata key #%lld '%s': unknown value type %u",
                    (long long)i, name, vt);
    kv->type = (enum gguf_vtype)vt;
    kv->arr_type = GGUF_VT_COUNT;
    kv->arr_n = 0;
    kv->str_len = 0;
    uint64_t start = r->pos;
    if (!walk_value(r, vt, 0, why, sizeof why))
        return ferr(err, TPI_ERR_FORMAT, path, "metadata key #%lld '%s': %s", (long long)i, name,
                    why);
    /* The walk checked every byte; now record the view. */
    const uint8_t *p = r->base + start;
    if (vt == GGUF_VT_STRING) {
        memcpy(&kv->str_len, p, 8);
        kv->data = p + 8;
        kv->n_bytes = kv->str_len;
    } else if (vt == GGUF_VT_ARRAY) {
        uint32_t item_vt;
        memcpy(&item_vt, p, 4);
        memcpy(&kv->arr_n, p + 4, 8);
        kv->arr_type = (enum gguf_vtype)item_vt;
        kv->data = p + 12;
        kv->n_bytes = r->pos - start - 12;
    } else {
        kv->data = p;
        kv->n_bytes = vt_size[vt];
    }
    return TPI_OK;
}

/* ---- typed access -------------------------------------------------------------- */

/* Load a T from unaligned p into *out. */
#define LOAD_AS(T)                                                                                 \
    do {                                                                                           \
        T v_;                                                                                      \
        memcpy(&v_, p, sizeof v_);                                                                 \
        *out = v_;                                                                                 \
    } while (0)

/* One line per case: it reads as the table it is. */
/* clang-format off */
static bool scalar_int(enum gguf_vtype t, const uint8_t *p, int64_t *out) {
    uint64_t u;
    switch (t) {
    case GGUF_VT_U8: LOAD_AS(uint8_t); return true;
    case GGUF_VT_I8: LOAD_AS(int8_t); return true;
    case GGUF_VT_U16: LOAD_AS(uint16_t); return true;
    case GGUF_VT_I16: LOAD_AS(int16_t); return true;
    case GGUF_VT_U32: LOAD_AS(uint32_t); return true;
    case GGUF_VT_I32: LOAD_AS(int32_t); return true;
    case GGUF_VT_I64: LOAD_AS(int64_t); return true;
    case GGUF_VT_BOOL: *out = p[0] != 0; return true;
    case GGUF_VT_U64:
        memcpy(&u, p, 8);
        if (u > (uint64_t)INT64_MAX) return false; /* does not fit: not an int64 */
        *out = (int64_t)u;
        return true;
    default: return false;
    }
}

static bool scalar_f64(enum gguf_vtype t, const uint8_t *p, double *out) {
    int64_t iv;
    switch (t) {
    case GGUF_VT_F32: LOAD_AS(float); return true;
    case GGUF_VT_F64: LOAD_AS(double); return true;
    case GGUF_VT_U64: LOAD_AS(uint64_t); return true;
    default:
        if (!scalar_int(t, p, &iv)) return false;
        *out = (double)iv;
        return true;
    }
}
#undef LOAD_AS
/* clang-format on */

static const struct gguf_kv *part_find_kv(const struct gguf_part *pt, const char *key) {
    if (!pt->kv_index.slots || !key) return NULL;
    int64_t *slot = index_slot(&pt->kv_index, key, strlen(key), kv_name, pt->kvs);
    return *slot ? &pt->kvs[*slot - 1] : NULL;
}

static bool part_get_int(const struct gguf_part *pt, const char *key, int64_t *out) {
    const struct gguf_kv *kv = part_find_kv(pt, key);
    return kv && scalar_int(kv->type, kv->data, out);
}

/* ---- one part -------------------------------------------------------------------- */

static void part_free(struct gguf_part *pt) {
    if (pt->map) munmap((void *)pt->map, (size_t)pt->size);
    free(pt->kvs);
    free(pt->kv_index.slots);
    free(pt->path);
    memset(pt, 0, sizeof *pt);
}

/* Map `path` read-only. A missing file is TPI_ERR_IO naming the path. */
static int part_map(struct gguf_part *pt, const char *path, struct tpi_error *err) {
    pt->path = strdup(path);
    if (!pt->path) return tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", path);
    /* O_NONBLOCK: a named pipe would block open until a writer came, and could never be
     * mapped anyway; it is refused below as not a regular file (no effect on files) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ferr(err, TPI_ERR_IO, path, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ferr(err, TPI_ERR_IO, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ferr(err, TPI_ERR_IO, path, "not a regular file");
    }
    pt->size = (uint64_t)st.st_size;
    if (pt->size > 0) {
        void *m = mmap(NULL, (size_t)pt->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ferr(err, TPI_ERR_IO, path, "cannot mmap %llu bytes: %s",
                        (unsigned long long)pt->size, strerror(e));
        }
        pt->map = m;
    }
    close(fd); /* the mapping keeps the file */
    return TPI_OK;
}

/* Append a tensor slot to f, growing by doubling (bounded by what was parsed). */
static struct gguf_tensor *push_tensor(struct gguf_file *f) {
    if (f->n_tensors == f->cap_tensors) {
        int64_t cap = f->cap_tensors ? 2 * f->cap_tensors : 64;
        struct gguf_tensor *t = realloc(f->tensors, (size_t)cap * sizeof *t);
        if (!t) return NULL;
        f->tensors = t;
        f->cap_tensors = cap;
    }
    struct gguf_tensor *t = &f->tensors[f->n_tensors++];
    memset(t, 0, sizeof *t);
    return t;
}

/* One tensor's data range, for the overlap check. */
struct data_range {
    uint64_t begin, end;
    int64_t index;
};

static int by_begin(const void *a, const void *b) {
    const struct data_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* No two tensors of one part share a byte of data (empty ones aside): such a file is
 * malformed (no writer makes one, and llama.cpp refuses it). */
static int check_overlap(const struct gguf_file *f, int64_t first, const char *path,
                         struct tpi_error *err) {
    const int64_t n = f->n_tensors - first;
    if (n < 2) return TPI_OK;
    struct data_range *r = malloc(sizeof *r * (size_t)n);
    if (!r) return ferr(err, TPI_ERR_NOMEM, path, "out of memory checking %lld tensors' data",
                        (long long)n);
    int64_t m = 0;
    for (int64_t i = first; i < f->n_tensors; i++)
        if (f->tensors[i].n_bytes > 0)
            r[m++] = (struct data_range){f->tensors[i].offset,
                                         f->tensors[i].offset + f->tensors[i].n_bytes, i};
    qsort(r, (size_t)m, sizeof *r, by_begin);
    int rc = TPI_OK;
    for (int64_t i = 1; i < m && !rc; i++) {
        if (r[i - 1].end <= r[i].begin) continue;
        const char *a = f->tensors[r[i - 1].index].name, *b = f->tensors[r[i].index].name;
        char na[96], nb[96];
        printable(na, sizeof na, a, strlen(a));
        printable(nb, sizeof nb, b, strlen(b));
        rc = ferr(err, TPI_ERR_FORMAT, path,
                  "tensors '%s' and '%s' overlap: data [%llu, %llu) and [%llu, %llu)", na, nb,
                  (unsigned long long)r[i - 1].begin, (unsigned long long)r[i - 1].end,
                  (unsigned long long)r[i].begin, (unsigned long long)r[i].end);
    }
    free(r);
    return rc;
}

/* Parse the header, metadata and tensor infos of part `part_no`, appending its
 * tensors to f, and check every tensor's data range lies inside the part and shares no
 * byte with another's. */
static int part_parse(struct gguf_file *f, int part_no, struct tpi_error *err) {
    struct gguf_part *pt = &f->parts[part_no];
    const char *path = pt->path;
    struct rd r = {pt->map, pt->size, 0};
    char name[128];

    if (pt->size < 4 || memcmp(pt->map, "GGUF", 4) != 0) {
        if (pt->size < 4)
            return ferr(err, TPI_ERR_FORMAT, path,
                        "not a GGUF file: %llu bytes, too short for the magic",
                        (unsigned long long)pt->size);
        return ferr(err, TPI_ERR_FORMAT, path,
                    "not a GGUF file: magic %02x %02x %02x %02x, expected 'GGUF'", pt->map[0],
                    pt->map[1], pt->map[2], pt->map[3]);
    }
    r.pos = 4;
    uint32_t version;
    if (!rd_u32(&r, &version))
        return ferr(err, TPI_ERR_FORMAT, path, "header: version past end of file (size %llu)",
                    (unsigned long long)pt->size);
    if (version != 2 && version != 3) {
        /* A byte-swapped small version means the file was written big-endian. */
        uint32_t swapped = __builtin_bswap32(version);
        if (swapped >= 1 && swapped <= 3)
            return ferr(err, TPI_ERR_UNSUPPORTED, path,
                        "big-endian GGUF (version field reads 0x%08x): only little-endian files "
                        "are supported",
                        version);
        if (version == 1)
            return ferr(err, TPI_ERR_UNSUPPORTED, path,
                        "GGUF version 1 is not supported (only 2 and 3)");
        return ferr(err, TPI_ERR_UNSUPPORTED, path, "unsupported GGUF version %u (only 2 and 3)",
                    version);
    }
    pt->version = version;
    uint64_t n_tensors, n_kv;
    if (!rd_u64(&r, &n_tensors) || !rd_u64(&r, &n_kv))
        return ferr(err, TPI_ERR_FORMAT, path,
                    "header: tensor/kv counts past end of file (size %llu)",
                    (unsigned long long)pt->size);
    /* Each entry takes at least a few bytes, which bounds both counts. */
    uint64_t rest = pt->size - r.pos;
    if (n_kv > rest / GGUF_MIN_KV_BYTES)
        return ferr(err, TPI_ERR_FORMAT, path,
                    "header: metadata count %llu cannot fit in the file (size %llu)",
                    (unsigned long long)n_kv, (unsigned long long)pt->size);
    if (n_tensors > (rest - n_kv * GGUF_MIN_KV_BYTES) / GGUF_MIN_TENSOR_BYTES)
        return ferr(err, TPI_ERR_FORMAT, path,
                    "header: tensor count %llu cannot fit in the file (size %llu)",
                    (unsigned long long)n_tensors, (unsigned long long)pt->size);

    /* Metadata. The array grows as entries parse (each takes >= 13 bytes), so
     * memory follows what the file really holds, not what its header claims. */
    pt->kv_begin = r.pos;
    int64_t cap_kv = 0;
    for (int64_t i = 0; i < (int64_t)n_kv; i++) {
        if (i == cap_kv) {
            cap_kv = cap_kv ? 2 * cap_kv : 64;
            struct gguf_kv *kvs = realloc(pt->kvs, (size_t)cap_kv * sizeof *kvs);
            if (!kvs)
                return tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory for metadata entries", path);
            pt->kvs = kvs;
        }
        int st = parse_kv(&r, path, i, &pt->kvs[i], err);
        if (st) return st;
        pt->n_kv = i + 1;
    }
    /* Index by key; a repeated key is an error (which value would win is unclear). */
    if (index_init(&pt->kv_index, pt->n_kv) != TPI_OK)
        return tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory for metadata index", path);
    for (int64_t i = 0; i < pt->n_kv; i++) {
        const struct gguf_kv *kv = &pt->kvs[i];
        int64_t *slot = index_slot(&pt->kv_index, kv->key.data, kv->key.len, kv_name, pt->kvs);
        if (*slot)
            return ferr(err, TPI_ERR_FORMAT, path,
                        "metadata key #%lld '%s': duplicate of key #%lld", (long long)i,
                        printable(name, sizeof name, kv->key.data, kv->key.len),
                        (long long)(*slot - 1));
        *slot = i + 1;
    }
    pt->kv_end = r.pos;

    pt->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *akv = part_find_kv(pt, "general.alignment");
    if (akv) {
        int64_t a;
        if (!scalar_int(akv->type, akv->data, &a) || akv->type == GGUF_VT_BOOL)
            return ferr(err, TPI_ERR_FORMAT, path,
                        "metadata 'general.alignment': type %s, expected an integer",
                        gguf_vtype_name(akv->type));
        if (a <= 0 || (a & (a - 1)) != 0 || (uint64_t)a > GGUF_MAX_ALIGNMENT)
            return ferr(err, TPI_ERR_FORMAT, path,
                        "metadata 'general.alignment': %lld is not a power of two in [1, 2^30]",
                        (long long)a);
        pt->alignment = (uint64_t)a;
    }

    /* Tensor infos. */
    int64_t first = f->n_tensors;
    pt->n_tensors = (int64_t)n_tensors;
    for (int64_t i = 0; i < pt->n_tensors; i++) {
        uint64_t at = r.pos, len;
        if (!rd_u64(&r, &len))
            return ferr(err, TPI_ERR_FORMAT, path,
                        "tensor #%lld: name length at offset %llu past end of file (size %llu)",
                        (long long)i, (unsigned long long)at, (unsigned long long)pt->size);
        if (len == 0)
            return ferr(err, TPI_ERR_FORMAT, path, "tensor #%lld: empty name", (long long)i);
        if (len > GGUF_MAX_NAME_LEN || !rd_have(&r, len))
            return ferr(err, TPI_ERR_FORMAT, path,
                        "tensor #%lld: name length %llu %s (offset %llu, size %llu)", (long long)i,
                        (unsigned long long)len,
                        len > GGUF_MAX_NAME_LEN ? "over the 65535-byte limit" : "past end of file",
                        (unsigned long long)at, (unsigned long long)pt->size);
        const char *s = (const char *)r.base + r.pos;
        r.pos += len;
        printable(name, sizeof name, s, len);
        if (memchr(s, 0, (size_t)len))
            return ferr(err, TPI_ERR_FORMAT, path, "tensor #%lld '%s': NUL byte in name",
                        (long long)i, name);
        struct gguf_tensor *t = push_tensor(f);
        if (!t || !(t->name = strndup(s, (size_t)len)))
            return tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory reading tensor infos", path);
        t->part = part_no;
        uint32_t n_dims;
        if (!rd_u32(&r, &n_dims))
            return ferr(err, TPI_ERR_FORMAT, path,
                        "tensor '%s': n_dims past end of file (size %llu)", name,
                        (unsigned long long)pt->size);
        if (n_dims > GGUF_MAX_DIMS)
            return ferr(err, TPI_ERR_FORMAT, path, "tensor '%s': n_dims %u > %d", name, n_dims,
                        GGUF_MAX_DIMS);
        t->n_dims = (int)n_dims;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t ne;
            if (!rd_u64(&r, &ne))
                return ferr(err, TPI_ERR_FORMAT, path,
                            "tensor '%s': ne[%u] past end of file (size %llu)", name, d,
                            (unsigned long long)pt->size);
            if (ne > (uint64_t)INT64_MAX)
                return ferr(err, TPI_ERR_FORMAT, path, "tensor '%s': ne[%u] = %llu is negative",
                            name, d, (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
        }
        uint32_t type;
        uint64_t offset;
        if (!rd_u32(&r, &type) || !rd_u64(&r, &offset))
            return ferr(err, TPI_ERR_FORMAT, path,
                        "tensor '%s': type/offset past end of file (size %llu)", name,
                        (unsigned long long)pt->size);
        const struct quant_traits *tr = type > (uint32_t)INT32_MAX ? NULL : quant_traits((int)type);
        if (!tr || tr->blck_size <= 0 ||
            tr->type_size == 0) /* geometry guards the division below */
            return ferr(err, TPI_ERR_FORMAT, path, "tensor '%s': unknown type id %u", name, type);
        t->type = (int)type;
        t->offset = offset; /* relative for now; made absolute below */
    }

    /* Data section: after the infos, rounded up to the alignment. */
    pt->data_offset = (r.pos + pt->alignment - 1) & ~(pt->alignment - 1);
    for (int64_t i = first; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        const struct quant_traits *tr = quant_traits(t->type);
        char name[96];
        printable(name, sizeof name, t->name, strlen(t->name));
        /* Rows and elements are checked apart: with ne[0] = 0 the element count
         * is 0 whatever the other dimensions multiply to. */
        int64_t n_elems = 1, n_rows = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            if (__builtin_mul_overflow(n_elems, t->ne[d], &n_elems) ||
                (d > 0 && __builtin_mul_overflow(n_rows, t->ne[d], &n_rows)))
                return ferr(err, TPI_ERR_FORMAT, path,
                            "tensor '%s': shape [%lld, %lld, %lld, %lld] overflows 64 bits",
                            name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                            (long long)t->ne[3]);
        if (t->ne[0] % tr->blck_size != 0)
            return ferr(err, TPI_ERR_FORMAT, path,
                        "tensor '%s': ne[0] = %lld is not a multiple of the %s block size %d",
                        name, (long long)t->ne[0], tr->name, tr->blck_size);
        uint64_t row_bytes = (uint64_t)(t->ne[0] / tr->blck_size) * tr->type_size, n_bytes;
        if (__builtin_mul_overflow(row_bytes, (uint64_t)n_rows, &n_bytes))
            return ferr(err, TPI_ERR_FORMAT, path, "tensor '%s': byte size overflows 64 bits",
                        name);
        t->n_bytes = n_bytes;
        if (t->offset % pt->alignment != 0)
            return ferr(err, TPI_ERR_FORMAT, path,
                        "tensor '%s': data offset %llu is not a multiple of the alignment %llu",
                        name, (unsigned long long)t->offset, (unsigned long long)pt->alignment);
        uint64_t begin, end;
        if (__builtin_add_overflow(pt->data_offset, t->offset, &begin) ||
            __builtin_add_overflow(begin, n_bytes, &end) || end > pt->size)
            return ferr(err, TPI_ERR_FORMAT, path,
                        "tensor '%s': data range [%llu, %llu%s) past end of file (size %llu)",
                        name, (unsigned long long)(pt->data_offset + t->offset),
                        (unsigned long long)(pt->data_offset + t->offset + n_bytes),
                        (begin < pt->data_offset || end < begin) ? ", overflowing" : "",
                        (unsigned long long)pt->size);
        t->offset = begin;
        t->data = pt->map + begin;
    }
    return check_overlap(f, first, path, err);
}

/* ---- split sets ---------------------------------------------------------------------- */

/* When `path` ends in -NNNNN-of-MMMMM.gguf, set *prefix_len, *no (1-based) and
 * *count and return true. */
static bool split_name(const char *path, size_t *prefix_len, int *no, int *count) {
    static const char tail[] = "-00000-of-00000.gguf";
    size_t n = strlen(path), tn = sizeof tail - 1;
    if (n < tn) return false;
    const char *s = path + n - tn;
    for (size_t i = 0; i < tn; i++) {
        bool digit = tail[i] == '0';
        if (digit ? (s[i] < '0' || s[i] > '9') : s[i] != tail[i]) return false;
    }
    *prefix_len = n - tn;
    *no = atoi(s + 1);
    *count = atoi(s + 10);
    return true;
}

/* Read split.no / split.count of a part: 0 and 1 when absent. */
static int part_split_info(const struct gguf_part *pt, int64_t *no, int64_t *count,
                           struct tpi_error *err) {
    *no = 0;
    *count = 1;
    if (part_find_kv(pt, "split.count") && !part_get_int(pt, "split.count", count))
        return ferr(err, TPI_ERR_FORMAT, pt->path, "metadata 'split.count': not an integer");
    if (part_find_kv(pt, "split.no") && !part_get_int(pt, "split.no", no))
        return ferr(err, TPI_ERR_FORMAT, pt->path, "metadata 'split.no': not an integer");
    if (*count < 1 || *count > GGUF_MAX_SPLITS)
        return ferr(err, TPI_ERR_FORMAT, pt->path,
                    "metadata 'split.count' = %lld out of range [1, %d]", (long long)*count,
                    GGUF_MAX_SPLITS);
    if (*no < 0 || *no >= *count)
        return ferr(err, TPI_ERR_FORMAT, pt->path,
                    "metadata 'split.no' = %lld out of range [0, %lld)", (long long)*no,
                    (long long)*count);
    return TPI_OK;
}

/* ---- public API ------------------------------------------------------------------------ */

int gguf_open(const char *path, struct gguf_file **out, struct tpi_error *err) {
    *out = NULL;
    if (!path) return tpi_err(err, TPI_ERR_INVALID, "gguf_open: NULL path");
    struct gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path)) || !(f->parts = calloc(1, sizeof *f->parts))) {
        if (f) free(f->path);
        free(f);
        return tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", path);
    }
    f->n_parts = 1;
    int st = part_map(&f->parts[0], path, err);
    if (!st) st = part_parse(f, 0, err);
    int64_t no, count;
    if (!st) st = part_split_info(&f->parts[0], &no, &count, err);
    if (!st && no != 0)
        st =
            ferr(err, TPI_ERR_INVALID, path, "this is split part %lld of %lld; open the first part",
                 (long long)no + 1, (long long)count);
    if (!st && count > 1) {
        size_t prefix_len;
        int name_no, name_count;
        if (!split_name(path, &prefix_len, &name_no, &name_count) || name_no != 1 ||
            name_count != count) {
            st = ferr(err, TPI_ERR_FORMAT, path,
                      "split.count is %lld but the file name does not end in -00001-of-%05lld.gguf",
                      (long long)count, (long long)count);
        } else {
            struct gguf_part *parts = realloc(f->parts, (size_t)count * sizeof *parts);
            if (!parts)
                st = tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", path);
            else {
                f->parts = parts;
                memset(parts + 1, 0, (size_t)(count - 1) * sizeof *parts);
            }
            for (int64_t k = 1; !st && k < count; k++) {
                char part_path[4096];
                snprintf(part_path, sizeof part_path, "%.*s-%05lld-of-%05lld.gguf", (int)prefix_len,
                         path, (long long)k + 1, (long long)count);
                f->n_parts = (int)k + 1;
                st = part_map(&f->parts[k], part_path, err);
                if (st) {
                    tpi_err_wrap(err, "%s: split part %lld of %lld", path, (long long)k + 1,
                                 (long long)count);
                    break;
                }
                st = part_parse(f, (int)k, err);
                if (st)
                    tpi_err_wrap(err, "%s: split part %lld of %lld", path, (long long)k + 1,
                                 (long long)count);
                int64_t pno, pcount;
                if (!st) st = part_split_info(&f->parts[k], &pno, &pcount, err);
                if (!st && (pno != k || pcount != count))
                    st = ferr(
                        err, TPI_ERR_FORMAT, part_path,
                        "split.no %lld / split.count %lld, expected %lld / %lld (part %lld of %s)",
                        (long long)pno, (long long)pcount, (long long)k, (long long)count,
                        (long long)k + 1, path);
            }
        }
    }
    if (!st) {
        int64_t want;
        const struct gguf_kv *tkv = part_find_kv(&f->parts[0], "split.tensors.count");
        if (tkv && !scalar_int(tkv->type, tkv->data, &want))
            st = ferr(err, TPI_ERR_FORMAT, path, "metadata 'split.tensors.count': not an integer");
        else if (tkv && want != f->n_tensors)
            st = ferr(err, TPI_ERR_FORMAT, path,
                      "split.tensors.count says %lld tensors, the %d part(s) hold %lld",
                      (long long)want, f->n_parts, (long long)f->n_tensors);
    }
    /* Tensor index over all parts; duplicates are an error. */
    if (!st && index_init(&f->tensor_index, f->n_tensors) != TPI_OK)
        st = tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", path);
    for (int64_t i = 0; !st && i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        int64_t *slot =
            index_slot(&f->tensor_index, t->name, strlen(t->name), tensor_name, f->tensors);
        if (*slot) {
            const struct gguf_tensor *t0 = &f->tensors[*slot - 1];
            char name[96];
            printable(name, sizeof name, t->name, strlen(t->name));
            if (f->n_parts > 1)
                st = ferr(err, TPI_ERR_FORMAT, path,
                          "tensor '%s': duplicate name (tensors #%lld in part %d and #%lld in part "
                          "%d, %s)",
                          name, (long long)(*slot - 1), t0->part + 1, (long long)i, t->part + 1,
                          f->parts[t->part].path);
            else
                st = ferr(err, TPI_ERR_FORMAT, path,
                          "tensor '%s': duplicate name (tensors #%lld and #%lld)", name,
                          (long long)(*slot - 1), (long long)i);
            break;
        }
        *slot = i + 1;
    }
    if (st) {
        gguf_close(&f);
        return st;
    }
    for (int k = 0; k < f->n_parts; k++)
        f->total_size += f->parts[k].size;
    const struct gguf_part *p0 = &f->parts[0];
    /* Hash of the metadata section (every kv as stored) of part 1: ranks compare it
     * to know they opened the same model, whatever the path. */
    f->meta_hash =
        tpi_fnv1a(TPI_FNV_INIT, p0->map + p0->kv_begin, (size_t)(p0->kv_end - p0->kv_begin));
    *out = f;
    return TPI_OK;
}

void gguf_close(struct gguf_file **fp) {
    if (!fp || !*fp) return;
    struct gguf_file *f = *fp;
    for (int k = 0; f->parts && k < f->n_parts; k++)
        part_free(&f->parts[k]);
    free(f->parts);
    for (int64_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->tensor_index.slots);
    free(f->path);
    free(f);
    *fp = NULL;
}

uint32_t gguf_version(const struct gguf_file *f) {
    return f->parts[0].version;
}
const char *gguf_path(const struct gguf_file *f) {
    return f->path;
}
int gguf_n_parts(const struct gguf_file *f) {
    return f->n_parts;
}
uint64_t gguf_total_size(const struct gguf_file *f) {
    return f->total_size;
}
uint64_t gguf_alignment(const struct gguf_file *f) {
    return f->parts[0].alignment;
}
uint64_t gguf_metadata_hash(const struct gguf_file *f) {
    return f->meta_hash;
}

uint64_t gguf_data_sample_hash(const struct gguf_file *f) {
    uint64_t h = TPI_FNV_INIT;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        const int64_t head[] = {t->type, t->n_dims, t->ne[0], t->ne[1], t->ne[2], t->ne[3],
                                (int64_t)t->offset, t->part};
        h = tpi_fnv1a(h, t->name, strlen(t->name) + 1);
        h = tpi_fnv1a(h, head, sizeof head);
        const size_t n = (size_t)TPI_MIN(t->n_bytes, (uint64_t)64);
        h = tpi_fnv1a(h, t->data, n);
        h = tpi_fnv1a(h, t->data + t->n_bytes - n, n);
    }
    return h;
}

int64_t gguf_n_kv(const struct gguf_file *f) {
    return f->parts[0].n_kv;
}

const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, int64_t i) {
    return (i >= 0 && i < f->parts[0].n_kv) ? &f->parts[0].kvs[i] : NULL;
}

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key) {
    return part_find_kv(&f->parts[0], key);
}

bool gguf_get_int(const struct gguf_file *f, const char *key, int64_t *out) {
    return part_get_int(&f->parts[0], key, out);
}

bool gguf_get_f32(const struct gguf_file *f, const char *key, float *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    double v;
    if (!kv || kv->type == GGUF_VT_BOOL || !scalar_f64(kv->type, kv->data, &v)) return false;
    *out = (float)v;
    return true;
}

bool gguf_get_bool(const struct gguf_file *f, const char *key, bool *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_VT_BOOL) return false;
    *out = kv->data[0] != 0;
    return true;
}

bool gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_VT_STRING) return false;
    out->len = kv->str_len;
    out->data = (const char *)kv->data;
    return true;
}

bool gguf_arr_int(const struct gguf_kv *kv, uint64_t i, int64_t *out) {
    if (!kv || kv->type != GGUF_VT_ARRAY || i >= kv->arr_n || kv->arr_type >= GGUF_VT_COUNT ||
        vt_size[kv->arr_type] == 0)
        return false;
    return scalar_int(kv->arr_type, kv->data + i * vt_size[kv->arr_type], out);
}

bool gguf_arr_f64(const struct gguf_kv *kv, uint64_t i, double *out) {
    if (!kv || kv->type != GGUF_VT_ARRAY || i >= kv->arr_n || kv->arr_type >= GGUF_VT_COUNT ||
        vt_size[kv->arr_type] == 0)
        return false;
    return scalar_f64(kv->arr_type, kv->data + i * vt_size[kv->arr_type], out);
}

int gguf_arr_strings(const struct gguf_kv *kv, struct gguf_str **out, uint64_t *n,
                     struct tpi_error *err) {
    *out = NULL;
    *n = 0;
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING)
        return tpi_err(err, TPI_ERR_INVALID, "metadata '%.*s': not an array of strings",
                       kv ? (int)TPI_MIN(kv->key.len, 200) : 4, kv ? kv->key.data : "NULL");
    /* Open checked that n_bytes holds arr_n (length, bytes) pairs, so arr_n <= n_bytes / 8. */
    struct gguf_str *v = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof *v);
    if (!v)
        return tpi_err(err, TPI_ERR_NOMEM, "metadata '%.*s': out of memory for %llu strings",
                       (int)TPI_MIN(kv->key.len, 200), kv->key.data, (unsigned long long)kv->arr_n);
    const uint8_t *p = kv->data;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        memcpy(&v[i].len, p, 8);
        v[i].data = (const char *)p + 8;
        p += 8 + v[i].len;
    }
    *out = v;
    *n = kv->arr_n;
    return TPI_OK;
}

int64_t gguf_n_tensors(const struct gguf_file *f) {
    return f->n_tensors;
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, int64_t i) {
    return (i >= 0 && i < f->n_tensors) ? &f->tensors[i] : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name) {
    if (!name || !f->tensor_index.slots) return NULL;
    int64_t *slot = index_slot(&f->tensor_index, name, strlen(name), tensor_name, f->tensors);
    return *slot ? &f->tensors[*slot - 1] : NULL;
}

const char *gguf_vtype_name(int vt) {
    static const char *names[GGUF_VT_COUNT] = {"u8",  "i8",  "u16",  "i16",    "u32",
                                               "i32", "f32", "bool", "string", "array",
                                               "u64", "i64", "f64"};
    return (vt >= 0 && vt < GGUF_VT_COUNT) ? names[vt] : "unknown";
}
