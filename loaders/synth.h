/*
 * synth.h — write a synthetic Qwen2/Qwen3 GGUF model: the metadata keys,
 * tensor names, shapes, order and per-tensor quantization mix that real
 * llama.cpp-made Qwen files have, filled with seeded random weights at a
 * realistic scale. Used by `tpinfer mkmodel` to make test and benchmark models
 * of any shape (up to 32B) without downloading one.
 *
 * Weights are a pure function of (seed, tensor name, row), so a model is
 * byte-identical whatever the thread count, and the same seed gives the same
 * underlying weights in every file type.
 */
#ifndef SYNTH_H
#define SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "../engine/tpi.h"

/* llama.cpp's file types (the value of general.file_type) that synth writes. */
enum synth_ftype {
    SYNTH_FT_F32 = 0,
    SYNTH_FT_F16 = 1,
    SYNTH_FT_Q4_0 = 2,
    SYNTH_FT_Q4_1 = 3,
    SYNTH_FT_Q8_0 = 7,
    SYNTH_FT_Q5_0 = 8,
    SYNTH_FT_Q5_1 = 9,
    SYNTH_FT_Q2_K = 10,
    SYNTH_FT_Q3_K_S = 11,
    SYNTH_FT_Q3_K_M = 12,
    SYNTH_FT_Q3_K_L = 13,
    SYNTH_FT_Q4_K_S = 14,
    SYNTH_FT_Q4_K_M = 15,
    SYNTH_FT_Q5_K_S = 16,
    SYNTH_FT_Q5_K_M = 17,
    SYNTH_FT_Q6_K = 18,
    SYNTH_FT_IQ4_NL = 25,
    SYNTH_FT_IQ4_XS = 30,
    SYNTH_FT_BF16 = 32,
};

struct synth_config {
    char arch[16];  /* "qwen2" (q/k/v biases) or "qwen3" (q/k norms) */
    char name[128]; /* general.name */
    int n_layer, n_embd, n_head, n_head_kv;
    int head_dim; /* 0: n_embd / n_head */
    int n_ff;
    int n_vocab; /* 0: the vocabulary's size; larger pads with [PADn] tokens */
    int n_ctx;
    bool tied; /* no output.weight: the output projection is token_embd */
    int ftype; /* enum synth_ftype */
    bool pure; /* every matrix in the base type (llama-quantize --pure) */
    float rope_freq_base, rms_eps;
    /* rope.scaling.*: type ("": no keys; "linear" or "yarn"), factor, YaRN's original
       context (0: no key) */
    char rope_scaling[8];
    float rope_scale;
    int yarn_orig_ctx;
    uint64_t seed;
    int n_merges; /* built-in vocabulary: BPE merges learned from a built-in text */
    char
        vocab_from[1024]; /* "" (built-in), a tokenizer.json, or a .gguf to copy tokenizer.* from */
    char chat_template_from[1024]; /* "": the vocabulary's template (ChatML when it has none);
                                      else a file whose text is tokenizer.chat_template */
    int n_threads;        /* 0: every core */
    bool verbose;         /* progress lines on stderr */
    /* general.sampling.* (the recommended sampling llama.cpp's converter writes from a
       generation_config.json): key suffixes ("temp", "top_k", ...) and their values,
       n_sampling of them; top_k and penalty_last_n as i32, the others as f32. */
    struct {
        char key[32];
        double value;
    } sampling[8];
    int n_sampling;
};

/* Add "KEY=VALUE[,KEY=VALUE...]" (KEY: temp, top_k, top_p, min_p, penalty_repeat or
 * penalty_last_n, the last of a repeated KEY winning) to c->sampling. Errors name the
 * piece that is wrong. */
int synth_parse_sampling(struct synth_config *c, const char *list, struct tpi_error *err);

/* What a tensor is; decides its shape, scale and quantization type. */
enum synth_kind {
    SYNTH_TOKEN_EMBD,
    SYNTH_OUTPUT,
    SYNTH_OUTPUT_NORM,
    SYNTH_ATTN_NORM,
    SYNTH_ATTN_Q,
    SYNTH_ATTN_K,
    SYNTH_ATTN_V,
    SYNTH_ATTN_OUTPUT,
    SYNTH_ATTN_Q_BIAS,
    SYNTH_ATTN_K_BIAS,
    SYNTH_ATTN_V_BIAS,
    SYNTH_ATTN_Q_NORM,
    SYNTH_ATTN_K_NORM,
    SYNTH_FFN_NORM,
    SYNTH_FFN_GATE,
    SYNTH_FFN_UP,
    SYNTH_FFN_DOWN,
};

/* One tensor of the plan, in file order. */
struct synth_tensor {
    char name[64];
    enum synth_kind kind;
    int layer; /* -1 outside the blocks */
    int type;  /* ggml type id */
    int n_dims;
    int64_t ne[2];
};

/* Defaults: the "tiny" preset (qwen3, 4 layers, 512 wide, vocab 2048), Q8_0, seed 42. */
void synth_config_init(struct synth_config *c);

/* Apply a shape preset: "tiny", "qwen3-0.6b", "qwen3-8b", "qwen3-32b". Sets arch,
 * shape, vocab and tying; leaves type, seed and vocabulary source alone. */
int synth_apply_preset(struct synth_config *c, const char *preset, struct tpi_error *err);

/* File type for a name as llama-quantize spells it ("q4_k_m", "Q8_0", "bf16"; "q4_k"
 * and "q5_k" are llama-quantize's aliases of q4_k_m / q5_k_m), -1 when unknown. */
int synth_ftype_from_name(const char *name);
/* Name of a file type ("Q4_K_M"), "?" when unknown. */
const char *synth_ftype_name(int ftype);

/* Check a configuration: arch, positive sizes, heads divide, head_dim even, ftype
 * known, row lengths the chosen types can hold. The message names the option. */
int synth_check_config(const struct synth_config *c, struct tpi_error *err);

/* The tensor plan for a vocabulary of n_vocab tokens: *out (malloc'd, caller
 * frees) holds *n tensors in llama.cpp's file order with the type llama-quantize
 * would give each. Errors as synth_check_config. */
int synth_plan(const struct synth_config *c, int64_t n_vocab, struct synth_tensor **out, int *n,
               struct tpi_error *err);

/* What synth_write did. */
struct synth_stats {
    int n_tensors;
    int64_t n_vocab, n_merges;
    int64_t n_params;
    uint64_t n_bytes; /* file size */
    double seconds;
    int n_threads;
};

/* Write the model to `path` (through path.tmp, renamed on success, so a failed
 * run leaves no partial file; a link's file, and nothing but a regular file or a new
 * name: a device or a directory is refused). stats may be NULL. Errors say what and where
 * ("out.gguf: cannot create: Permission denied", "--heads 7 does not divide ..."). */
int synth_write(const struct synth_config *c, const char *path, struct synth_stats *stats,
                struct tpi_error *err);

#endif /* SYNTH_H */
