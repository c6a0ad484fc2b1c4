/*
 * quant.h — the tensor types tpinfer reads from GGUF files, in one traits
 * table: block size, bytes per block, dequantize to f32 and quantize from f32.
 *
 * Type ids are ggml's (the values GGUF stores). Block layouts match ggml's
 * exactly (Q8_0: f16 d + 32 x int8; Q4_K: f16 d, dmin, 12 bytes of 6-bit
 * scales/mins, 128 nibbles; ...), so data from any GGUF file is read as is.
 * This is the one place that switches on the weight type (STYLE habit 7).
 */
#ifndef QUANT_H
#define QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../tpi.h"

enum tpi_type {
    TPI_TYPE_F32 = 0,
    TPI_TYPE_F16 = 1,
    TPI_TYPE_Q4_0 = 2,
    TPI_TYPE_Q4_1 = 3,
    TPI_TYPE_Q5_0 = 6,
    TPI_TYPE_Q5_1 = 7,
    TPI_TYPE_Q8_0 = 8,
    TPI_TYPE_Q2_K = 10,
    TPI_TYPE_Q3_K = 11,
    TPI_TYPE_Q4_K = 12,
    TPI_TYPE_Q5_K = 13,
    TPI_TYPE_Q6_K = 14,
    TPI_TYPE_IQ4_NL = 20,
    TPI_TYPE_IQ4_XS = 23,
    TPI_TYPE_BF16 = 30,
    TPI_TYPE_COUNT = 40, /* ids below this are named (supported or not) */
};

/* Bytes per block of each block type (ggml's layouts). */
#define QK4_0 32
#define QK8_0 32
#define QK_K 256

/* Dequantize `n_elems` values (a multiple of the block size) from `src` into `dst`. */
typedef void (*quant_to_f32_fn)(const void *src, float *dst, int64_t n_elems);
/* Quantize `n_elems` values (a multiple of the block size) from `src` into `dst`. */
typedef void (*quant_from_f32_fn)(const float *src, void *dst, int64_t n_elems);

struct quant_traits {
    const char *name;        /* ggml's name: "F32", "Q4_K", "BF16" */
    int blck_size;           /* elements per block (1 for F32/F16/BF16) */
    size_t type_size;        /* bytes per block */
    bool supported;          /* false for types tpinfer names but cannot compute */
    quant_to_f32_fn to_f32;  /* NULL when unsupported */
    quant_from_f32_fn from_f32;
};

/* Traits of type id `type`, or NULL when the id is unknown (any value, even negative). */
const struct quant_traits *quant_traits(int type);

/* ggml's name of `type` ("Q4_K"), or "type<N>" for unknown ids (static buffer per call site). */
const char *quant_type_name(int type);

/* Type id for a ggml name ("q4_k" or "Q4_K", case-insensitive), -1 when unknown. */
int quant_type_from_name(const char *name);

/* Bytes of a row of `n_elems` elements; 0 when n_elems is not a multiple of the block size. */
size_t quant_row_size(int type, int64_t n_elems);

/* Dequantize rows [row0, row0+n_rows) of a 2-D tensor (ne0 elements per row) into dst
 * (n_rows * ne0 floats). Returns TPI_OK, or an error for an unsupported type. */
int quant_dequant_rows(int type, const void *data, int64_t ne0, int64_t row0, int64_t n_rows,
                       float *dst, struct tpi_error *err);

/* Copy the block-aligned column range [col0, col0+n_cols) of every row of a 2-D tensor
 * (ne0 x ne1) into dst, which then holds an (n_cols x ne1) tensor of the same type.
 * col0 and n_cols must be multiples of the block size; otherwise TPI_ERR_INVALID. */
int quant_extract_cols(int type, const void *data, int64_t ne0, int64_t ne1, int64_t col0,
                       int64_t n_cols, void *dst, struct tpi_error *err);

/* The type quant_convert_held writes for `type`: Q6_K for Q3_K, Q8_0 for IQ4_NL and
 * IQ4_XS, `type` itself for every other type. */
int quant_held_form(int type);

/* The type the CUDA backend holds a weight of `type` in: itself, unless the environment
 * has TPI_HOLD=1, which holds Q3_K and IQ4 in quant_held_form's types (1.9-2x the memory;
 * their decode ran faster on the H200 before change 149, slower on an H100: bench/NOTES.md
 * changes 148-149). */
int quant_gpu_held_type(int type);

/* Whether quant_convert_held keeps `type`'s values bitwise (true for Q3_K and IQ4_NL and
 * the types held as themselves; IQ4_XS's sub-block scales are rounded to f16: a relative
 * change of at most 2^-11). */
bool quant_held_is_exact(int type);

/* Convert n_elems values (whole blocks) of `type` into quant_held_form(type)'s layout
 * at dst (quant_row_size(held, n_elems) bytes). TPI_OK; TPI_ERR_UNSUPPORTED with *bad the
 * index of the first value the held type cannot hold (beyond f16's range); TPI_ERR_INVALID
 * for an unsupported type or a size off the block. */
int quant_convert_held(int type, const void *src, void *dst, int64_t n_elems, int64_t *bad);

#endif /* QUANT_H */
