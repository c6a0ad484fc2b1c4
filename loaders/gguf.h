/*
 * gguf.h — GGUF reader (v2, v3) and writer (v3).
 *
 * The reader maps each file read-only and hands out zero-copy views into the
 * mapping (strings, arrays, tensor data), as gguf-tools does — but unlike
 * gguflib it trusts nothing in the file: every count, length, offset and size
 * is checked against the file size before use, so a truncated or hostile file
 * is an error naming the file and the field, never a crash, hang or huge
 * allocation. Split models (NAME-00001-of-0000N.gguf) open as one model: the
 * first part's path opens every part; metadata comes from part 1, tensors from
 * all parts.
 */
#ifndef GGUF_H
#define GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/tpi.h"

/* Metadata value types, as GGUF numbers them. */
enum gguf_vtype {
    GGUF_VT_U8 = 0,
    GGUF_VT_I8 = 1,
    GGUF_VT_U16 = 2,
    GGUF_VT_I16 = 3,
    GGUF_VT_U32 = 4,
    GGUF_VT_I32 = 5,
    GGUF_VT_F32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_U64 = 10,
    GGUF_VT_I64 = 11,
    GGUF_VT_F64 = 12,
    GGUF_VT_COUNT
};

/* A string view into the mapping: not NUL-terminated. */
struct gguf_str {
    uint64_t len;
    const char *data;
};

/* One metadata key/value. For arrays, `arr_type`/`arr_n` describe the items and
 * `data` points at the first item; for strings, `data` points at the bytes and
 * `str_len` is their length; for scalars, `data` points at the value (unaligned). */
struct gguf_kv {
    struct gguf_str key;
    enum gguf_vtype type;
    enum gguf_vtype arr_type; /* arrays only */
    uint64_t arr_n;           /* arrays only: item count */
    uint64_t str_len;         /* strings only */
    const uint8_t *data;
    uint64_t n_bytes;         /* bytes the value occupies in the file */
};

#define GGUF_MAX_DIMS 4

/* One tensor. `data` points into the mapping of the part that holds it. */
struct gguf_tensor {
    char *name;              /* NUL-terminated copy, owned by the gguf_file */
    int type;                /* ggml type id (see engine/kernels/quant.h) */
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is contiguous; unused dims are 1 */
    uint64_t offset;         /* absolute byte offset of the data in its part file */
    uint64_t n_bytes;
    int part;                /* index of the split part that holds it (0-based) */
    const uint8_t *data;
};

struct gguf_file; /* opaque */

/* Open `path` (the first part of a split model opens all parts) and validate it
 * completely. On success *out owns the mappings; free with gguf_close. On error
 * returns a status and err says e.g. "model.gguf: tensor 'blk.0.attn_q.weight':
 * data range [x, y) past end of file (size z)". */
int gguf_open(const char *path, struct gguf_file **out, struct tpi_error *err);

/* Close and unmap; sets *f to NULL. Accepts NULL. */
void gguf_close(struct gguf_file **f);

/* File format version (2 or 3), the path given to gguf_open, number of parts,
 * total bytes of all parts, and the data alignment (general.alignment or 32). */
uint32_t gguf_version(const struct gguf_file *f);
const char *gguf_path(const struct gguf_file *f);
int gguf_n_parts(const struct gguf_file *f);
uint64_t gguf_total_size(const struct gguf_file *f);
uint64_t gguf_alignment(const struct gguf_file *f);

/* 64-bit hash of the metadata section bytes of part 1 (for checking that ranks
 * opened the same model). */
uint64_t gguf_metadata_hash(const struct gguf_file *f);

/* 64-bit hash of every tensor's name, type, shape and offset and of the first and last
 * 64 bytes of its data: two pages a tensor, enough for ranks to tell different weights
 * apart in files of one size and metadata (another seed, another fine-tune). */
uint64_t gguf_data_sample_hash(const struct gguf_file *f);

/* Metadata: count, by index, and by key (NULL when absent). */
int64_t gguf_n_kv(const struct gguf_file *f);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, int64_t i);
const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);

/* Typed getters. Each returns true and sets *out when `key` exists with a
 * compatible type: gguf_get_int accepts every integer width (and bool) whose
 * value fits int64; gguf_get_f32 accepts F32, F64 and integers; gguf_get_str
 * returns a view. False when missing or of an incompatible type. */
bool gguf_get_int(const struct gguf_file *f, const char *key, int64_t *out);
bool gguf_get_f32(const struct gguf_file *f, const char *key, float *out);
bool gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
bool gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);

/* Array item `i` of a scalar-typed array kv as int64 / double (false when out of
 * range or not numeric). */
bool gguf_arr_int(const struct gguf_kv *kv, uint64_t i, int64_t *out);
bool gguf_arr_f64(const struct gguf_kv *kv, uint64_t i, double *out);

/* Views of every string of a string-array kv: *out is malloc'd (caller frees),
 * *n its count. The strings were bounds-checked at open. */
int gguf_arr_strings(const struct gguf_kv *kv, struct gguf_str **out, uint64_t *n,
                     struct tpi_error *err);

/* Tensors: count, by index, by name (NULL when absent). */
int64_t gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, int64_t i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* Name of a value type ("u32", "string", "array"). */
const char *gguf_vtype_name(int vt);

/* ---- writer -------------------------------------------------------------- */

struct gguf_writer; /* opaque */

/* New writer for a v3 file with the given alignment (0 means 32). Returns NULL on OOM. */
struct gguf_writer *gguf_writer_new(uint32_t alignment);
void gguf_writer_free(struct gguf_writer **w);

/* Metadata setters (key and string values are copied). Keys must be unique. */
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
/* Array of scalars: `data` holds n items of `item_type` (not STRING/ARRAY). */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype item_type,
                        const void *data, uint64_t n);
/* Array of strings: n NUL-terminated strings, or with `lens` non-NULL, n byte strings. */
int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n);
/* Copy every kv of an open file (used to keep a vocabulary from another GGUF). */
int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv);

/* Declare a tensor; `data` (n_bytes = quant_row_size(type, ne[0]) * rows) is either
 * given now (not copied: must live until gguf_writer_write) or NULL, in which case
 * the caller fills it later through the fd that gguf_writer_write_header returns.
 * Returns the tensor's index, or -1 on error (bad shape for the type, duplicate). */
int64_t gguf_writer_add_tensor(struct gguf_writer *w, const char *name, int type, int n_dims,
                               const int64_t *ne, const void *data);

/* Write the whole file to `path` (all tensors must have data). */
int gguf_writer_write(struct gguf_writer *w, const char *path, struct tpi_error *err);

/* Streaming variant: write header + tensor infos, size the file, and return an
 * open fd; the caller pwrite()s each tensor at gguf_writer_tensor_offset(), then
 * closes the fd. Lets many threads generate tensors straight into the file. */
int gguf_writer_write_header(struct gguf_writer *w, const char *path, int *fd_out,
                             struct tpi_error *err);
/* Absolute file offset of tensor `i`'s data (valid after write_header/write). */
uint64_t gguf_writer_tensor_offset(const struct gguf_writer *w, int64_t i);

#endif /* GGUF_H */
