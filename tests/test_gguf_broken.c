/*
 * test_gguf_broken.c — the GGUF reader on broken and hostile files: a small
 * valid file truncated at every byte, then hand-built headers with bad magic,
 * versions, byte order, absurd counts and lengths, bad types, nesting, shapes,
 * offsets and alignments, duplicates, and split sets with a missing or
 * mismatched part. Each must be an error (status != 0) whose one-line message
 * names the file — never a crash, hang or huge allocation. A few also go
 * through the real `tpinfer info`: exit 1, no signal, one line on stderr.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf.h"
#include "kernels/quant.h"
#include "testutil.h"


static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(data, 1, n, fp), n);
    ck_assert_int_eq(fclose(fp), 0);
}

/* ---- a byte builder for hand-made files ------------------------------------------ */

struct bb {
    uint8_t p[8192];
    size_t n;
};

static void bb_put(struct bb *b, const void *src, size_t n) {
    ck_assert_uint_le(b->n + n, sizeof b->p);
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void bb_u32(struct bb *b, uint32_t v) {
    bb_put(b, &v, 4);
}
static void bb_u64(struct bb *b, uint64_t v) {
    bb_put(b, &v, 8);
}
static void bb_str(struct bb *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}
static void bb_header(struct bb *b, uint64_t n_tensors, uint64_t n_kv) {
    b->n = 0;
    bb_put(b, "GGUF", 4);
    bb_u32(b, 3);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
/* A tensor info: name, dims, type, relative offset. */
static void bb_tensor(struct bb *b, const char *name, int n_dims, const uint64_t *ne, uint32_t type,
                      uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, (uint32_t)n_dims);
    for (int d = 0; d < n_dims; d++)
        bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
/* Pad to 32 and append n_data zero bytes of tensor data. */
static void bb_data(struct bb *b, size_t n_data) {
    static const uint8_t zeros[4096];
    size_t pad = (32 - b->n % 32) % 32;
    bb_put(b, zeros, pad);
    bb_put(b, zeros, n_data);
}

/* Open `path`, expect an error naming the file and containing `want` (if not NULL). */
static void expect_fail_path(const char *label, const char *path, const char *want) {
    struct gguf_file *f = (struct gguf_file *)1;
    struct tpi_error err;
    tpi_err_clear(&err);
    int st = gguf_open(path, &f, &err);
    if (st == TPI_OK) {
        gguf_close(&f);
        ck_abort_msg("%s: opened without error", label);
    }
    ck_assert_ptr_null(f);
    ck_assert_msg(err.status == st, "%s: err.status %d, returned %d", label, err.status, st);
    ck_assert_msg(err.msg[0] != '\0', "%s: empty message", label);
    ck_assert_msg(strstr(err.msg, path) != NULL, "%s: message does not name the file: %s", label,
                  err.msg);
    ck_assert_msg(strchr(err.msg, '\n') == NULL, "%s: message is not one line: %s", label, err.msg);
    if (want)
        ck_assert_msg(strstr(err.msg, want) != NULL, "%s: message lacks '%s': %s", label, want,
                      err.msg);
}

static void expect_fail(const char *label, const struct bb *b, const char *want) {
    const char *path = tu_tmp_path("bad.gguf");
    write_bytes(path, b->p, b->n);
    expect_fail_path(label, path, want);
}

static void expect_ok(const char *label, const struct bb *b) {
    const char *path = tu_tmp_path("good.gguf");
    write_bytes(path, b->p, b->n);
    struct gguf_file *f = NULL;
    struct tpi_error err;
    tpi_err_clear(&err);
    int st = gguf_open(path, &f, &err);
    ck_assert_msg(st == TPI_OK, "%s: %s", label, err.msg);
    gguf_close(&f);
}

/* ---- truncation ----------------------------------------------------------------------- */

/* A small valid file from the writer whose last tensor ends exactly at the end of
 * the file, so every shorter prefix is broken somewhere. */
static char *small_valid_file(size_t *n_out) {
    struct gguf_writer *w = gguf_writer_new(0);
    ck_assert_int_eq(gguf_writer_set_str(w, "general.architecture", "qwen3"), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_str(w, "general.name", "broken"), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_u32(w, "qwen3.block_count", 1), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_f32(w, "qwen3.rope.freq_base", 1e6f), TPI_OK);
    const char *toks[] = {"a", "bc", "<|im_end|>"};
    ck_assert_int_eq(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3), TPI_OK);
    int32_t types[3] = {1, 1, 3};
    ck_assert_int_eq(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, types, 3),
                     TPI_OK);
    static uint8_t data[2][1024];
    for (int i = 0; i < 1024; i++)
        data[0][i] = data[1][i] = (uint8_t)i;
    int64_t ne_a[2] = {8, 4};   /* F32: 128 bytes */
    int64_t ne_b[2] = {32, 16}; /* Q8_0: 16 blocks of 34 = 544 bytes, padded to 576 */
    ck_assert_int_eq(gguf_writer_add_tensor(w, "a.weight", TPI_TYPE_F32, 2, ne_a, data[0]), 0);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "b.weight", TPI_TYPE_Q8_0, 2, ne_b, data[1]), 1);
    int64_t ne_c[1] = {32}; /* F32 128 bytes: the file ends at this tensor's end */
    ck_assert_int_eq(gguf_writer_add_tensor(w, "c.weight", TPI_TYPE_F32, 1, ne_c, data[0]), 2);
    const char *path = tu_tmp_path("valid.gguf");
    struct tpi_error err;
    ck_assert_int_eq(gguf_writer_write(w, path, &err), TPI_OK);
    gguf_writer_free(&w);
    char *bytes = tu_read_file(path, n_out);
    ck_assert_ptr_nonnull(bytes);
    return bytes;
}

START_TEST(test_truncated_everywhere) {
    tu_tmpdir_make("test_gguf_broken");
    size_t n;
    char *bytes = small_valid_file(&n);
    struct bb b;
    memcpy(b.p, bytes, n);
    b.n = n;
    expect_ok("the valid file", &b);
    for (size_t cut = 0; cut < n; cut++) {
        char label[64];
        snprintf(label, sizeof label, "truncated at %zu of %zu", cut, n);
        b.n = cut;
        expect_fail(label, &b, NULL);
    }
    free(bytes);
    tu_tmpdir_remove();
}
END_TEST

/* ---- header and metadata ------------------------------------------------------------------ */

START_TEST(test_bad_headers) {
    tu_tmpdir_make("test_gguf_broken");
    struct bb b;
    b.n = 0;
    expect_fail("empty file", &b, "not a GGUF file");
    bb_put(&b, "GG", 2);
    expect_fail("2 bytes", &b, "not a GGUF file");
    bb_header(&b, 0, 0);
    expect_ok("no tensors, no metadata", &b);
    memcpy(b.p, "GGML", 4);
    expect_fail("bad magic", &b, "not a GGUF file");
    bb_header(&b, 0, 0);
    uint32_t v1 = 1, v2 = 2, v99 = 99, v3be = 0x03000000u;
    memcpy(b.p + 4, &v1, 4);
    expect_fail("version 1", &b, "version 1");
    memcpy(b.p + 4, &v99, 4);
    expect_fail("version 99", &b, "version 99");
    memcpy(b.p + 4, &v3be, 4);
    expect_fail("big-endian", &b, "big-endian");
    memcpy(b.p + 4, &v2, 4);
    expect_ok("version 2", &b);
    bb_header(&b, 1ull << 40, 0);
    expect_fail("2^40 tensors", &b, "tensor count");
    bb_header(&b, 0, 1ull << 63);
    expect_fail("2^63 kvs", &b, "metadata count");
    bb_header(&b, UINT64_MAX, UINT64_MAX);
    expect_fail("2^64-1 of both", &b, "count");
    tu_tmpdir_remove();
}
END_TEST

START_TEST(test_bad_metadata) {
    tu_tmpdir_make("test_gguf_broken");
    struct bb b;
    /* Key lengths. */
    bb_header(&b, 0, 1);
    bb_u64(&b, 1ull << 63);
    bb_put(&b, "general.name", 12);
    expect_fail("key length 2^63", &b, "key length");
    bb_header(&b, 0, 1);
    bb_u64(&b, 0);
    bb_u32(&b, GGUF_VT_U8);
    bb_u32(&b, 0);
    expect_fail("empty key", &b, "empty key");
    /* The example of the brief: a string length past the end. */
    bb_header(&b, 0, 4);
    bb_str(&b, "general.architecture"), bb_u32(&b, GGUF_VT_STRING), bb_str(&b, "qwen3");
    bb_str(&b, "a.u32"), bb_u32(&b, GGUF_VT_U32), bb_u32(&b, 7);
    bb_str(&b, "a.f32"), bb_u32(&b, GGUF_VT_F32), bb_u32(&b, 0);
    bb_str(&b, "general.name"), bb_u32(&b, GGUF_VT_STRING), bb_u64(&b, 9999999);
    bb_put(&b, "tiny", 4);
    expect_fail("string length 9999999", &b,
                "metadata key #3 'general.name': string length 9999999");
    b.n -= 12;
    bb_u64(&b, 1ull << 63);
    expect_fail("string length 2^63", &b, "past end of file");
    b.n -= 8;
    bb_u64(&b, UINT64_MAX);
    expect_fail("string length 2^64-1", &b, "past end of file");
    /* Value types. */
    bb_header(&b, 0, 1);
    bb_str(&b, "x"), bb_u32(&b, 13), bb_u64(&b, 0);
    expect_fail("value type 13", &b, "unknown value type 13");
    bb_header(&b, 0, 1);
    bb_str(&b, "x"), bb_u32(&b, 0xffffffffu), bb_u64(&b, 0);
    expect_fail("value type 2^32-1", &b, "unknown value type");
    bb_header(&b, 0, 1);
    bb_str(&b, "x"), bb_u32(&b, GGUF_VT_ARRAY), bb_u32(&b, 77), bb_u64(&b, 1), bb_u64(&b, 0);
    expect_fail("array item type 77", &b, "unknown item type 77");
    /* Array counts. */
    bb_header(&b, 0, 1);
    bb_str(&b, "x"), bb_u32(&b, GGUF_VT_ARRAY), bb_u32(&b, GGUF_VT_U32), bb_u64(&b, 1ull << 62);
    bb_u32(&b, 1);
    expect_fail("array of 2^62 u32", &b, "array of 4611686018427387904 u32 items");
    bb_header(&b, 0, 1);
    bb_str(&b, "x"), bb_u32(&b, GGUF_VT_ARRAY), bb_u32(&b, GGUF_VT_STRING), bb_u64(&b, 1000);
    bb_str(&b, "one");
    expect_fail("array of 1000 strings, 1 present", &b, "past end of file");
    bb_header(&b, 0, 1);
    bb_str(&b, "x"), bb_u32(&b, GGUF_VT_ARRAY), bb_u32(&b, GGUF_VT_STRING), bb_u64(&b, 2);
    bb_str(&b, "one"), bb_u64(&b, 1ull << 62);
    expect_fail("second string length 2^62", &b, "array item 1: string length");
    /* Nesting: an array of arrays is fine, one level more is not. */
    bb_header(&b, 0, 1);
    bb_str(&b, "x"), bb_u32(&b, GGUF_VT_ARRAY), bb_u32(&b, GGUF_VT_ARRAY), bb_u64(&b, 2);
    bb_u32(&b, GGUF_VT_U8), bb_u64(&b, 1), bb_put(&b, "\x05", 1);
    bb_u32(&b, GGUF_VT_STRING), bb_u64(&b, 1), bb_str(&b, "s");
    expect_ok("array of arrays", &b);
    bb_header(&b, 0, 1);
    bb_str(&b, "x"), bb_u32(&b, GGUF_VT_ARRAY), bb_u32(&b, GGUF_VT_ARRAY), bb_u64(&b, 1);
    bb_u32(&b, GGUF_VT_ARRAY), bb_u64(&b, 1);
    bb_u32(&b, GGUF_VT_U8), bb_u64(&b, 1), bb_put(&b, "\x05", 1);
    expect_fail("3 nested arrays", &b, "nested deeper than 2");
    bb_header(&b, 0, 1);
    bb_str(&b, "x"), bb_u32(&b, GGUF_VT_ARRAY), bb_u32(&b, GGUF_VT_ARRAY), bb_u64(&b, 1ull << 40);
    expect_fail("2^40 nested arrays", &b, "past end of file");
    /* Duplicates and general.alignment. */
    bb_header(&b, 0, 2);
    bb_str(&b, "k"), bb_u32(&b, GGUF_VT_U8), bb_put(&b, "\x01", 1);
    bb_str(&b, "k"), bb_u32(&b, GGUF_VT_U8), bb_put(&b, "\x02", 1);
    expect_fail("duplicate key", &b, "duplicate");
    bb_header(&b, 0, 1);
    bb_str(&b, "general.alignment"), bb_u32(&b, GGUF_VT_U32), bb_u32(&b, 48);
    expect_fail("alignment 48", &b, "power of two");
    bb_header(&b, 0, 1);
    bb_str(&b, "general.alignment"), bb_u32(&b, GGUF_VT_U32), bb_u32(&b, 0);
    expect_fail("alignment 0", &b, "power of two");
    bb_header(&b, 0, 1);
    bb_str(&b, "general.alignment"), bb_u32(&b, GGUF_VT_STRING), bb_str(&b, "32");
    expect_fail("alignment as a string", &b, "general.alignment");
    bb_header(&b, 0, 1);
    bb_str(&b, "general.alignment"), bb_u32(&b, GGUF_VT_U64), bb_u64(&b, 64);
    expect_ok("alignment 64 as u64", &b);
    tu_tmpdir_remove();
}
END_TEST

/* ---- tensor infos ---------------------------------------------------------------------------- */

/* One F32 tensor [ne...] of `type` at relative `offset`, with n_data bytes of data. */
static void one_tensor(struct bb *b, const char *name, int n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset, size_t n_data) {
    bb_header(b, 1, 0);
    bb_tensor(b, name, n_dims, ne, type, offset);
    bb_data(b, n_data);
}

START_TEST(test_bad_tensors) {
    tu_tmpdir_make("test_gguf_broken");
    struct bb b;
    uint64_t ne8[8] = {8, 1, 1, 1, 1, 1, 1, 1}, ne32[1] = {32}, ne256[1] = {256};
    one_tensor(&b, "t", 1, ne8, TPI_TYPE_F32, 0, 32);
    expect_ok("valid F32 tensor", &b);
    one_tensor(&b, "t", 7, ne8, TPI_TYPE_F32, 0, 32);
    expect_fail("n_dims 7", &b, "tensor 't': n_dims 7");
    uint64_t big[3] = {1ull << 32, 1ull << 32, 1ull << 32};
    one_tensor(&b, "t", 3, big, TPI_TYPE_F32, 0, 32);
    expect_fail("ne product overflows", &b, "overflows");
    uint64_t empty_big[3] = {0, 1ull << 32, 1ull << 32}; /* 0 elements, rows overflow */
    one_tensor(&b, "t", 3, empty_big, TPI_TYPE_F32, 0, 32);
    expect_fail("row count overflows with ne[0] = 0", &b, "overflows");
    uint64_t bytes_over[2] = {1ull << 31, 1ull << 31}; /* 2^62 elements * 4 bytes */
    one_tensor(&b, "t", 2, bytes_over, TPI_TYPE_F32, 0, 32);
    expect_fail("byte size overflows", &b, "overflows");
    uint64_t neg[1] = {(1ull << 63) + 1};
    one_tensor(&b, "t", 1, neg, TPI_TYPE_F32, 0, 32);
    expect_fail("negative ne", &b, "negative");
    one_tensor(&b, "t", 1, ne32, 99, 0, 32);
    expect_fail("type id 99", &b, "tensor 't': unknown type id 99");
    one_tensor(&b, "t", 1, ne32, 4, 0, 32); /* retired Q4_2 */
    expect_fail("type id 4", &b, "unknown type id 4");
    one_tensor(&b, "t", 1, ne32, 0xffffffffu, 0, 32);
    expect_fail("type id 2^32-1", &b, "unknown type id 4294967295");
    uint64_t ne33[1] = {33};
    one_tensor(&b, "t", 1, ne33, TPI_TYPE_Q8_0, 0, 64);
    expect_fail("Q8_0 ne0 33", &b, "block size");
    one_tensor(&b, "iq2xxs", 1, ne256, 16, 0, 96); /* IQ2_XXS: named, not computable */
    expect_ok("known but unsupported type", &b);
    one_tensor(&b, "t", 1, ne8, TPI_TYPE_F32, 1u << 20, 32);
    expect_fail("offset past end", &b, "data range");
    one_tensor(&b, "t", 1, ne8, TPI_TYPE_F32, UINT64_MAX - 31, 32);
    expect_fail("offset 2^64-32", &b, "past end of file");
    one_tensor(&b, "t", 1, ne8, TPI_TYPE_F32, 4, 64);
    expect_fail("misaligned offset", &b, "not a multiple of the alignment 32");
    uint64_t ne_large[1] = {1 << 20};
    one_tensor(&b, "t", 1, ne_large, TPI_TYPE_F32, 0, 64);
    expect_fail("data longer than the file", &b, "past end of file");
    one_tensor(&b, "", 1, ne8, TPI_TYPE_F32, 0, 32);
    expect_fail("empty tensor name", &b, "empty name");
    bb_header(&b, 1, 0);
    bb_u64(&b, 1ull << 62);
    bb_put(&b, "t", 1);
    bb_data(&b, 64); /* enough bytes that the count itself is plausible */
    expect_fail("tensor name length 2^62", &b, "name length");
    bb_header(&b, 2, 0);
    bb_tensor(&b, "same", 1, ne8, TPI_TYPE_F32, 0);
    bb_tensor(&b, "same", 1, ne8, TPI_TYPE_F32, 32);
    bb_data(&b, 64);
    expect_fail("duplicate tensor names", &b, "tensor 'same': duplicate name");
    /* A hostile name is printed safely. */
    one_tensor(&b, "bad\x01name", 7, ne8, TPI_TYPE_F32, 0, 32);
    expect_fail("control character in name", &b, "bad?name");
    /* also where the data's checks name it (after the infos) and as a duplicate */
    one_tensor(&b, "x\ntpinfer: fine\x1b[31m", 1, ne8, TPI_TYPE_F32, 4, 64);
    expect_fail("newline in a misaligned tensor's name", &b, "'x?tpinfer: fine?[31m': data offset");
    bb_header(&b, 2, 0);
    bb_tensor(&b, "du\np", 1, ne8, TPI_TYPE_F32, 0);
    bb_tensor(&b, "du\np", 1, ne8, TPI_TYPE_F32, 32);
    bb_data(&b, 64);
    expect_fail("newline in a duplicate name", &b, "tensor 'du?p': duplicate name");
    /* Data shared by two tensors, whole or in part, in either order of the infos; an
     * empty tensor may sit anywhere, and tensors out of file order are fine. */
    static const struct {
        const char *what, *names[3];
        uint64_t ne0[3], offset[3];
        size_t n_data;
        const char *want; /* NULL: opens */
    } overlap[] = {
        {"two tensors on the same data", {"a", "b", NULL}, {8, 8}, {0, 0}, 64,
         "tensors 'a' and 'b' overlap: data ["},
        {"the second half of one is the first of another", {"c", "late", "early"},
         {8, 16, 16}, {96, 32, 0}, 160, "tensors 'early' and 'late' overlap"},
        {"out of order, one empty tensor on another's data", {"second", "first", "none"},
         {8, 8, 0}, {32, 0, 0}, 64, NULL},
    };
    for (size_t k = 0; k < sizeof overlap / sizeof overlap[0]; k++) {
        const int n = overlap[k].names[2] ? 3 : 2;
        bb_header(&b, n, 0);
        for (int i = 0; i < n; i++)
            bb_tensor(&b, overlap[k].names[i], 1, &overlap[k].ne0[i], TPI_TYPE_F32,
                      overlap[k].offset[i]);
        bb_data(&b, overlap[k].n_data);
        if (overlap[k].want) expect_fail(overlap[k].what, &b, overlap[k].want);
        else expect_ok(overlap[k].what, &b);
    }
    /* Alignment from metadata applies to offsets. */
    bb_header(&b, 1, 1);
    bb_str(&b, "general.alignment"), bb_u32(&b, GGUF_VT_U32), bb_u32(&b, 64);
    bb_tensor(&b, "t", 1, ne8, TPI_TYPE_F32, 32);
    bb_data(&b, 128);
    expect_fail("offset 32 with alignment 64", &b, "alignment 64");
    tu_tmpdir_remove();
}
END_TEST

/* ---- split sets
 * ---------------------------------------------------------------------------------- */

/* One part of a split set: split.no, split.count, split.tensors.count (n_tensors_total, or
 * the string tc_str when it is not NULL) and one tensor tname. */
static void write_part_tc(const char *path, int no, int count, int n_tensors_total,
                          const char *tc_str, const char *tname) {
    struct gguf_writer *w = gguf_writer_new(0);
    uint16_t v_no = (uint16_t)no, v_count = (uint16_t)count;
    struct gguf_kv kno = {
        .key = {8, "split.no"}, .type = GGUF_VT_U16, .data = (void *)&v_no, .n_bytes = 2};
    struct gguf_kv kcount = {
        .key = {11, "split.count"}, .type = GGUF_VT_U16, .data = (void *)&v_count, .n_bytes = 2};
    ck_assert_int_eq(gguf_writer_copy_kv(w, &kno), TPI_OK);
    ck_assert_int_eq(gguf_writer_copy_kv(w, &kcount), TPI_OK);
    if (tc_str)
        ck_assert_int_eq(gguf_writer_set_str(w, "split.tensors.count", tc_str), TPI_OK);
    else
        ck_assert_int_eq(gguf_writer_set_i32(w, "split.tensors.count", n_tensors_total), TPI_OK);
    static const float data[32];
    int64_t ne[1] = {32};
    ck_assert_int_ge(gguf_writer_add_tensor(w, tname, TPI_TYPE_F32, 1, ne, data), 0);
    struct tpi_error err;
    ck_assert_int_eq(gguf_writer_write(w, path, &err), TPI_OK);
    gguf_writer_free(&w);
}
static void write_part(const char *path, int no, int count, int n_tensors_total,
                       const char *tname) {
    write_part_tc(path, no, count, n_tensors_total, NULL, tname);
}

START_TEST(test_bad_split_sets) {
    tu_tmpdir_make("test_gguf_broken");
    const char *p1 = tu_tmp_path("m-00001-of-00003.gguf");
    const char *p2 = tu_tmp_path("m-00002-of-00003.gguf");
    const char *p3 = tu_tmp_path("m-00003-of-00003.gguf");
    write_part(p1, 0, 3, 3, "t0");
    write_part(p2, 1, 3, 3, "t1");
    write_part(p3, 2, 3, 3, "t2");
    struct gguf_file *f = NULL;
    struct tpi_error err;
    ck_assert_int_eq(gguf_open(p1, &f, &err), TPI_OK);
    ck_assert_int_eq(gguf_n_tensors(f), 3);
    gguf_close(&f);
    /* Part 3 missing: the error names its path. */
    ck_assert_int_eq(unlink(p3), 0);
    expect_fail_path("part 3 missing", p1, "m-00003-of-00003.gguf");
    /* Part 3 claims to be part 2. */
    write_part(p3, 1, 3, 3, "t2");
    expect_fail_path("part 3 says split.no 1", p1, "m-00003-of-00003.gguf");
    /* Part 3 belongs to a 4-part set. */
    write_part(p3, 2, 4, 3, "t2");
    expect_fail_path("part 3 says split.count 4", p1, "split.count");
    /* A tensor name repeated across parts. */
    write_part(p3, 2, 3, 3, "t1");
    expect_fail_path("duplicate across parts", p1, "duplicate");
    /* split.tensors.count disagrees. */
    write_part(p1, 0, 3, 5, "t0");
    write_part(p3, 2, 3, 3, "t2");
    expect_fail_path("split.tensors.count 5", p1, "split.tensors.count");
    /* split.tensors.count not an integer: said so, with no count made up. */
    write_part_tc(p1, 0, 3, 0, "three", "t0");
    expect_fail_path("split.tensors.count a string", p1, "split.tensors.count': not an integer");
    /* A split.count > 1 in a file not named like a split set. */
    const char *odd = tu_tmp_path("single.gguf");
    write_part(odd, 0, 3, 3, "t0");
    expect_fail_path("split.count 3, plain name", odd, "-00001-of-00003.gguf");
    /* split.no out of range. */
    write_part(p1, 5, 3, 3, "t0");
    expect_fail_path("split.no 5 of 3", p1, "split.no");
    tu_tmpdir_remove();
}
END_TEST

/* A path that names no regular file: refused with the path, at once (a named pipe would
 * block a plain open until some writer came). */
START_TEST(test_not_a_file) {
    tu_tmpdir_make("test_gguf_broken");
    const char *fifo = tu_tmp_path("pipe.gguf");
    ck_assert_int_eq(mkfifo(fifo, 0644), 0);
    expect_fail_path("a named pipe", fifo, "not a regular file");
    expect_fail_path("a directory", tu_tmpdir(), "not a regular file");
    unlink(fifo);
    tu_tmpdir_remove();
}
END_TEST

/* ---- the binary
 * ------------------------------------------------------------------------------------ */

/* Run `tpinfer info [--json] [--tp TP] PATH`; returns the wait status, stdout into
 * out_buf, stderr into err_buf. */
static int run_info(const char *path, bool json, const char *tp, char *out_buf, size_t out_n,
                    char *err_buf, size_t err_n) {
    char out_path[512], err_path[512];
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", tu_tmpdir());
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", tu_tmpdir());
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(120);
        dup2(fo, 1);
        dup2(fe, 2);
        const char *argv[8];
        int k = 0;
        argv[k++] = tu_binary();
        argv[k++] = "info";
        if (json) argv[k++] = "--json";
        if (tp) argv[k++] = "--tp", argv[k++] = tp;
        argv[k++] = path;
        argv[k] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(121);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    size_t n;
    char *s = tu_read_file(out_path, &n);
    snprintf(out_buf, out_n, "%s", s ? s : "");
    free(s);
    s = tu_read_file(err_path, &n);
    snprintf(err_buf, err_n, "%s", s ? s : "");
    free(s);
    return status;
}

/* `tpinfer info` on path, plain and --json (with --tp tp when not NULL): exit 1, stdout
 * empty, one line on stderr that names the file once. */
static void expect_cli_fail_tp(const char *label, const char *path, const char *tp) {
    static char out[1 << 16], errs[1 << 16];
    for (int json = 0; json < 2; json++) {
        int status = run_info(path, json, tp, out, sizeof out, errs, sizeof errs);
        ck_assert_msg(!WIFSIGNALED(status), "%s: tpinfer info died of signal %d", label,
                      WTERMSIG(status));
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "%s: exit %d, want 1", label,
                      WEXITSTATUS(status));
        size_t n = strlen(errs);
        ck_assert_msg(n > 0 && errs[n - 1] == '\n' && strchr(errs, '\n') == errs + n - 1,
                      "%s: stderr is not one line: '%s'", label, errs);
        const char *at = strstr(errs, path);
        ck_assert_msg(at != NULL, "%s: stderr does not name the file: %s", label, errs);
        ck_assert_msg(!strstr(at + strlen(path), path), "%s: the file named twice: %s", label,
                      errs);
        ck_assert_msg(out[0] == '\0', "%s: stdout not empty: %s", label, out);
    }
}

static void expect_cli_fail(const char *label, const char *path) {
    expect_cli_fail_tp(label, path, NULL);
    expect_cli_fail_tp(label, path, "2");
}

START_TEST(test_cli_info) {
    if (access(tu_binary(), X_OK) != 0)
        ck_abort_msg("%s not built (the gguf tests depend on it)", tu_binary());
    tu_tmpdir_make("test_gguf_broken");
    static char out[1 << 20], errs[1 << 16];
    size_t n;
    char *bytes = small_valid_file(&n);
    char good[512], bad[512], missing[512];
    snprintf(good, sizeof good, "%s", tu_tmp_path("valid.gguf"));
    snprintf(bad, sizeof bad, "%s", tu_tmp_path("broken.gguf"));
    snprintf(missing, sizeof missing, "%s", tu_tmp_path("does-not-exist.gguf"));
    /* --json on the valid file: exactly one object with the tensor table. */
    int status = run_info(good, true, NULL, out, sizeof out, errs, sizeof errs);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "info --json: status %d, %s",
                  status, errs);
    cJSON *j = cJSON_Parse(out);
    ck_assert_ptr_nonnull(j);
    ck_assert(cJSON_IsObject(j));
    const cJSON *ts = cJSON_GetObjectItem(j, "tensors");
    ck_assert_int_eq(cJSON_GetArraySize(ts), 3);
    const cJSON *t1 = cJSON_GetArrayItem(ts, 1);
    ck_assert_str_eq(cJSON_GetObjectItem(t1, "name")->valuestring, "b.weight");
    ck_assert_str_eq(cJSON_GetObjectItem(t1, "type")->valuestring, "Q8_0");
    ck_assert_int_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(t1, "shape"), 0)->valueint, 32);
    ck_assert_int_eq(cJSON_GetObjectItem(t1, "n_bytes")->valueint, 544);
    const cJSON *meta = cJSON_GetObjectItem(j, "metadata");
    ck_assert_str_eq(cJSON_GetObjectItem(meta, "general.architecture")->valuestring, "qwen3");
    ck_assert_int_eq(cJSON_GetObjectItem(meta, "qwen3.block_count")->valueint, 1);
    const cJSON *toks = cJSON_GetObjectItem(meta, "tokenizer.ggml.tokens");
    ck_assert_str_eq(cJSON_GetObjectItem(toks, "item_type")->valuestring, "string");
    ck_assert_int_eq(cJSON_GetObjectItem(toks, "n")->valueint, 3);
    cJSON_Delete(j);
    /* Text output mentions the tensors. */
    status = run_info(good, false, NULL, out, sizeof out, errs, sizeof errs);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "info: status %d, %s", status,
                  errs);
    ck_assert_ptr_nonnull(strstr(out, "b.weight"));
    ck_assert_ptr_nonnull(strstr(out, "Q8_0"));
    /* -m FILE, as the other commands take the model: the same table. */
    char cmd_m[1024];
    snprintf(cmd_m, sizeof cmd_m, "%s info -m %s 2>/dev/null", tu_binary(), good);
    int st_m = -1;
    char *out_m = tu_run_capture(cmd_m, &st_m);
    ck_assert_msg(st_m == 0 && out_m && !strcmp(out_m, out), "info -m: status %d", st_m);
    free(out_m);

    /* Broken files: exit 1, one line naming the file. */
    write_bytes(bad, bytes, n / 2);
    expect_cli_fail("truncated", bad);
    char copy[4096];
    memcpy(copy, bytes, n);
    memcpy(copy, "GGML", 4);
    write_bytes(bad, copy, n);
    expect_cli_fail("bad magic", bad);
    memcpy(copy, bytes, n);
    uint32_t be = 0x03000000u;
    memcpy(copy + 4, &be, 4);
    write_bytes(bad, copy, n);
    expect_cli_fail("big-endian", bad);
    memcpy(copy, bytes, n);
    uint64_t huge = 1ull << 62;
    memcpy(copy + 24, &huge, 8); /* first key's length */
    write_bytes(bad, copy, n);
    expect_cli_fail("key length 2^62", bad);
    expect_cli_fail("missing file", missing);
    /* A valid file that is no whole model: its shard plan cannot be made. */
    expect_cli_fail_tp("no model in it, --tp 2", good, "2");
    /* Names and strings that are not plain text: the text table escapes a key's and a
     * tensor's control bytes (no line of its own), the JSON is valid UTF-8 with the NUL
     * kept as \u0000 and a broken byte as U+FFFD. Scalars keep their type: an integral
     * f32 prints 1000000.0 (as gguf-dump), a u64 all its digits (JSON too, where
     * "metadata_types" names each key's type). */
    struct gguf_writer *w = gguf_writer_new(0);
    ck_assert_int_eq(gguf_writer_set_str(w, "general.odd\nforged = 1", "x"), TPI_OK);
    static const char val[] = "ab\0c\xe9";
    const struct gguf_kv sv = {.key = {12, "general.odd2"}, .type = GGUF_VT_STRING,
                               .data = (const void *)val, .n_bytes = 5, .str_len = 5};
    ck_assert_int_eq(gguf_writer_copy_kv(w, &sv), TPI_OK);
    // scalars whose type a plain print would lose: an integral f32, a u64 past 2^53
    ck_assert_int_eq(gguf_writer_set_f32(w, "general.f32", 1e6f), TPI_OK);
    ck_assert_int_eq(gguf_writer_set_u64(w, "general.u64", UINT64_MAX), TPI_OK);
    static const float zero[8];
    int64_t ne8[1] = {8};
    ck_assert_int_ge(gguf_writer_add_tensor(w, "t\nforged", TPI_TYPE_F32, 1, ne8, zero), 0);
    struct tpi_error werr;
    const char *odd = tu_tmp_path("odd.gguf");
    ck_assert_int_eq(gguf_writer_write(w, odd, &werr), TPI_OK);
    gguf_writer_free(&w);
    status = run_info(odd, false, NULL, out, sizeof out, errs, sizeof errs);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "info: %s", errs);
    ck_assert_msg(strstr(out, "general.odd\\x0aforged = 1") && strstr(out, "t\\x0aforged") &&
                      !strstr(out, "\nforged"),
                  "text: %s", out);
    ck_assert_msg(strstr(out, "= 1000000.0\n") && strstr(out, "= 18446744073709551615\n"),
                  "text: %s", out);
    status = run_info(odd, true, NULL, out, sizeof out, errs, sizeof errs);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "info --json: %s", errs);
    ck_assert_msg(strstr(out, "\"general.odd2\":\"ab\\u0000c\xef\xbf\xbd\""), "json: %s", out);
    ck_assert_ptr_nonnull(strstr(out, "\"general.odd\\nforged = 1\""));
    ck_assert_msg(strstr(out, "\"general.u64\":18446744073709551615") &&
                      strstr(out, "\"general.f32\":\"f32\"") && strstr(out, "{\"version\":3,"),
                  "json: %s", out);
    /* The shard plan says what a rank holds on a GPU where that is more than the file's
     * bytes (under TPI_HOLD=1, the Q2_K model's Q3_K as Q6_K), and only there. */
    const char *q2 = tu_data_path("qwen3-tiny-q2_k.gguf"), *q4 = tu_data_path("qwen3-tiny-q4_k_m.gguf");
    if (q2 && q4) {
        char q2c[1024];
        snprintf(q2c, sizeof q2c, "%s", q2);
        const char *hold = getenv("TPI_HOLD");
        char hold_was[8];
        snprintf(hold_was, sizeof hold_was, "%s", hold ? hold : "");
        unsetenv("TPI_HOLD");
        status = run_info(q2c, false, "2", out, sizeof out, errs, sizeof errs);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "info --tp 2: %s", errs);
        ck_assert_msg(!strstr(out, "on CUDA"), "text: %s", out);
        setenv("TPI_HOLD", "1", 1);
        status = run_info(q2c, false, "2", out, sizeof out, errs, sizeof errs);
        if (hold) setenv("TPI_HOLD", hold_was, 1);
        else unsetenv("TPI_HOLD");
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "info --tp 2: %s", errs);
        ck_assert_msg(strstr(out, "(on CUDA, up to 3.1 MiB a rank"), "text: %s", out);
        status = run_info(q4, false, "2", out, sizeof out, errs, sizeof errs);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "info --tp 2: %s", errs);
        ck_assert_msg(!strstr(out, "on CUDA"), "text: %s", out);
    }
    free(bytes);
    tu_tmpdir_remove();
}
END_TEST

int main(void) {
    Suite *s = suite_create("gguf_broken");
    TCase *tc = tcase_create("gguf_broken");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_truncated_everywhere);
    tcase_add_test(tc, test_bad_headers);
    tcase_add_test(tc, test_bad_metadata);
    tcase_add_test(tc, test_bad_tensors);
    tcase_add_test(tc, test_bad_split_sets);
    tcase_add_test(tc, test_not_a_file);
    tcase_add_test(tc, test_cli_info);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
