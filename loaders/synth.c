/*
 * synth.c — synthetic Qwen2/Qwen3 GGUF writer (see synth.h).
 *
 * Three parts: the vocabulary (built in, from a Hugging Face tokenizer.json,
 * or copied from another GGUF), the tensor plan (names, shapes, order and the
 * per-tensor types llama-quantize's llama_tensor_get_type would choose), and
 * the streamed, threaded generation of the weights straight into the file:
 * the header is written first, then OpenMP threads each generate and quantize
 * a chunk of rows and pwrite() it at its final offset, so memory stays at a
 * few MiB per thread whatever the model size.
 */
#define _GNU_SOURCE
#include "synth.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/kernels/quant.h"
#include "gguf.h"

/* ---- configuration -------------------------------------------------------- */

void synth_config_init(struct synth_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->arch, sizeof c->arch, "qwen3");
    c->n_layer = 4;
    c->n_embd = 512;
    c->n_head = 8;
    c->n_head_kv = 4;
    c->head_dim = 64;
    c->n_ff = 1024;
    c->n_vocab = 2048;
    c->n_ctx = 4096;
    c->ftype = SYNTH_FT_Q8_0;
    c->rope_freq_base = 1e6f;
    c->rms_eps = 1e-6f;
    c->seed = 42;
    c->n_merges = 128;
}

struct preset {
    const char *name, *arch;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    bool tied;
};

/* Shapes of the real Qwen3 models (config.json of each), and the tiny test model. */
static const struct preset presets[] = {
    {"tiny", "qwen3", 4, 512, 8, 4, 64, 1024, 2048, 4096, false},
    {"qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, true},
    {"qwen3-8b", "qwen3", 36, 4096, 32, 8, 128, 12288, 151936, 40960, false},
    {"qwen3-32b", "qwen3", 64, 5120, 64, 8, 128, 25600, 151936, 40960, false},
};

int synth_apply_preset(struct synth_config *c, const char *name, struct tpi_error *err) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const struct preset *p = &presets[i];
        if (strcasecmp(name, p->name) != 0) continue;
        snprintf(c->arch, sizeof c->arch, "%s", p->arch);
        c->n_layer = p->n_layer;
        c->n_embd = p->n_embd;
        c->n_head = p->n_head;
        c->n_head_kv = p->n_head_kv;
        c->head_dim = p->head_dim;
        c->n_ff = p->n_ff;
        c->n_vocab = p->n_vocab;
        c->n_ctx = p->n_ctx;
        c->tied = p->tied;
        return TPI_OK;
    }
    return tpi_err(err, TPI_ERR_INVALID,
                   "unknown preset '%s' (known: tiny, qwen3-0.6b, qwen3-8b, qwen3-32b)", name);
}

struct ftype_info {
    const char *name;
    int ftype;
    int base;       /* the type most matrices get */
    bool quantized; /* llama-quantize output: mix rules and general.quantization_version */
};

static const struct ftype_info ftypes[] = {
    {"F32", SYNTH_FT_F32, TPI_TYPE_F32, false},
    {"F16", SYNTH_FT_F16, TPI_TYPE_F16, false},
    {"BF16", SYNTH_FT_BF16, TPI_TYPE_BF16, false},
    {"Q8_0", SYNTH_FT_Q8_0, TPI_TYPE_Q8_0, true},
    {"Q4_0", SYNTH_FT_Q4_0, TPI_TYPE_Q4_0, true},
    {"Q4_1", SYNTH_FT_Q4_1, TPI_TYPE_Q4_1, true},
    {"Q5_0", SYNTH_FT_Q5_0, TPI_TYPE_Q5_0, true},
    {"Q5_1", SYNTH_FT_Q5_1, TPI_TYPE_Q5_1, true},
    {"Q2_K", SYNTH_FT_Q2_K, TPI_TYPE_Q2_K, true},
    {"Q3_K_S", SYNTH_FT_Q3_K_S, TPI_TYPE_Q3_K, true},
    {"Q3_K_M", SYNTH_FT_Q3_K_M, TPI_TYPE_Q3_K, true},
    {"Q3_K_L", SYNTH_FT_Q3_K_L, TPI_TYPE_Q3_K, true},
    {"Q4_K_S", SYNTH_FT_Q4_K_S, TPI_TYPE_Q4_K, true},
    {"Q4_K_M", SYNTH_FT_Q4_K_M, TPI_TYPE_Q4_K, true},
    {"Q5_K_S", SYNTH_FT_Q5_K_S, TPI_TYPE_Q5_K, true},
    {"Q5_K_M", SYNTH_FT_Q5_K_M, TPI_TYPE_Q5_K, true},
    {"Q6_K", SYNTH_FT_Q6_K, TPI_TYPE_Q6_K, true},
    {"IQ4_NL", SYNTH_FT_IQ4_NL, TPI_TYPE_IQ4_NL, true},
    {"IQ4_XS", SYNTH_FT_IQ4_XS, TPI_TYPE_IQ4_XS, true},
};

static const struct ftype_info *ftype_info(int ftype) {
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (ftypes[i].ftype == ftype) return &ftypes[i];
    return NULL;
}

int synth_ftype_from_name(const char *name) {
    if (!name) return -1;
    /* llama-quantize's aliases: Q3_K means Q3_K_M, Q4_K Q4_K_M, Q5_K Q5_K_M. */
    if (!strcasecmp(name, "q3_k")) return SYNTH_FT_Q3_K_M;
    if (!strcasecmp(name, "q4_k")) return SYNTH_FT_Q4_K_M;
    if (!strcasecmp(name, "q5_k")) return SYNTH_FT_Q5_K_M;
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (!strcasecmp(name, ftypes[i].name)) return ftypes[i].ftype;
    return -1;
}

const char *synth_ftype_name(int ftype) {
    const struct ftype_info *f = ftype_info(ftype);
    return f ? f->name : "?";
}

static int head_dim_of(const struct synth_config *c) {
    return c->head_dim > 0 ? c->head_dim : (c->n_head > 0 ? c->n_embd / c->n_head : 0);
}

int synth_check_config(const struct synth_config *c, struct tpi_error *err) {
    if (strcmp(c->arch, "qwen2") && strcmp(c->arch, "qwen3"))
        return tpi_err(err, TPI_ERR_INVALID, "--arch '%s': expected qwen2 or qwen3", c->arch);
    if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->n_ff < 1 ||
        c->n_ctx < 1 || c->head_dim < 0 || c->n_vocab < 0)
        return tpi_err(
            err, TPI_ERR_INVALID,
            "sizes must be positive (layers %d, embd %d, heads %d, kv-heads %d, ff %d, ctx %d)",
            c->n_layer, c->n_embd, c->n_head, c->n_head_kv, c->n_ff, c->n_ctx);
    if (c->n_head % c->n_head_kv != 0)
        return tpi_err(err, TPI_ERR_INVALID, "--kv-heads %d does not divide --heads %d",
                       c->n_head_kv, c->n_head);
    if (c->head_dim == 0 && c->n_embd % c->n_head != 0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "--heads %d does not divide --embd %d (give --head-dim explicitly)",
                       c->n_head, c->n_embd);
    int hd = head_dim_of(c);
    if (hd < 2 || hd % 2 != 0)
        return tpi_err(err, TPI_ERR_INVALID, "head dim %d must be even (rope rotates pairs)", hd);
    if (!ftype_info(c->ftype))
        return tpi_err(err, TPI_ERR_INVALID, "unknown file type %d", c->ftype);
    if ((int64_t)c->n_layer * c->n_embd > (int64_t)1 << 40 || (int64_t)hd * c->n_head > (1 << 24) ||
        c->n_ff > (1 << 24) || c->n_embd > (1 << 24))
        return tpi_err(err, TPI_ERR_INVALID, "model shape too large");
    return TPI_OK;
}

/* ---- tensor plan and llama-quantize's type choice ------------------------- */

/* llama.cpp's use_more_bits: the first and last eighth of the layers, and every
 * third layer in between, get more bits in the _M mixes. */
static bool use_more_bits(int i_layer, int n_layer) {
    return i_layer < n_layer / 8 || i_layer >= 7 * n_layer / 8 || (i_layer - n_layer / 8) % 3 == 2;
}

static bool kind_is_matrix(enum synth_kind k) {
    switch (k) {
    case SYNTH_TOKEN_EMBD:
    case SYNTH_OUTPUT:
    case SYNTH_ATTN_Q:
    case SYNTH_ATTN_K:
    case SYNTH_ATTN_V:
    case SYNTH_ATTN_OUTPUT:
    case SYNTH_FFN_GATE:
    case SYNTH_FFN_UP:
    case SYNTH_FFN_DOWN:
        return true;
    default:
        return false;
    }
}

/* The type llama-quantize gives a matrix (llama_tensor_get_type and its shape
 * fall-back) for the file types synth writes; unquantized file types store
 * every matrix in their one type, as convert_hf_to_gguf.py does. */
static int matrix_type(const struct synth_config *c, const struct ftype_info *ft,
                       enum synth_kind kind, int layer, int64_t ne0, const char *name, int *type,
                       struct tpi_error *err) {
    int t = ft->base;
    if (!ft->quantized) {
        *type = t;
        return TPI_OK;
    }
    if (!c->pure) {
        bool k_m = c->ftype == SYNTH_FT_Q4_K_M || c->ftype == SYNTH_FT_Q5_K_M;
        bool iq4 = c->ftype == SYNTH_FT_IQ4_NL || c->ftype == SYNTH_FT_IQ4_XS;
        if (kind == SYNTH_OUTPUT || (c->tied && kind == SYNTH_TOKEN_EMBD)) {
            /* The output projection gets Q6_K, or Q8_0 when its rows do not
             * fit the base block or the file is Q8_0 already. */
            if (ne0 % quant_traits(t)->blck_size != 0)
                t = TPI_TYPE_Q8_0;
            else if (t != TPI_TYPE_Q8_0)
                t = TPI_TYPE_Q6_K;
        } else if (kind == SYNTH_ATTN_V) {
            if (c->ftype == SYNTH_FT_Q2_K)
                t = c->n_head / c->n_head_kv >= 4 ? TPI_TYPE_Q4_K : TPI_TYPE_Q3_K;
            else if (c->ftype == SYNTH_FT_Q3_K_M)
                t = layer < 2 ? TPI_TYPE_Q5_K : TPI_TYPE_Q4_K;
            else if (c->ftype == SYNTH_FT_Q3_K_L)
                t = TPI_TYPE_Q5_K;
            else if (iq4 && c->n_head / c->n_head_kv >= 4)
                t = TPI_TYPE_Q5_K;
            else if (k_m && use_more_bits(layer, c->n_layer))
                t = TPI_TYPE_Q6_K;
            else if (c->ftype == SYNTH_FT_Q4_K_S && layer < 4)
                t = TPI_TYPE_Q5_K;
            /* llama.cpp counts an 80-layer qwen2 as a 70B model, whose attn_v gets Q5_K. */
            if (!strcmp(c->arch, "qwen2") && c->n_layer == 80 &&
                (t == TPI_TYPE_Q3_K || t == TPI_TYPE_Q4_K))
                t = TPI_TYPE_Q5_K;
        } else if (kind == SYNTH_FFN_DOWN) {
            if (c->ftype == SYNTH_FT_Q2_K)
                t = TPI_TYPE_Q3_K;
            else if (c->ftype == SYNTH_FT_Q3_K_M)
                t = layer < c->n_layer / 16 ? TPI_TYPE_Q5_K : TPI_TYPE_Q4_K;
            else if (c->ftype == SYNTH_FT_Q3_K_L)
                t = TPI_TYPE_Q5_K;
            else if (k_m && use_more_bits(layer, c->n_layer))
                t = TPI_TYPE_Q6_K;
            else if (iq4 && layer < c->n_layer / 8) /* without an importance matrix */
                t = TPI_TYPE_Q5_K;
            else if (c->ftype == SYNTH_FT_Q4_K_S && layer < c->n_layer / 8)
                t = TPI_TYPE_Q5_K;
        } else if (kind == SYNTH_ATTN_OUTPUT) {
            if (c->ftype == SYNTH_FT_Q2_K)
                t = TPI_TYPE_Q3_K;
            else if (c->ftype == SYNTH_FT_Q3_K_M)
                t = TPI_TYPE_Q4_K;
            else if (c->ftype == SYNTH_FT_Q3_K_L)
                t = TPI_TYPE_Q5_K;
        }
    }
    /* Rows that do not fill a 256-element super-block fall back to a 32-element
     * type; when even that does not fit, llama.cpp uses F16 for K-types and
     * refuses for the 32-element types. */
    if (ne0 % quant_traits(t)->blck_size != 0) {
        int fb;
        switch (t) {
        case TPI_TYPE_Q2_K:
        case TPI_TYPE_Q3_K:
            fb = TPI_TYPE_Q4_0;
            break;
        case TPI_TYPE_IQ4_XS:
            fb = TPI_TYPE_IQ4_NL;
            break;
        case TPI_TYPE_Q4_K:
            fb = TPI_TYPE_Q5_0;
            break;
        case TPI_TYPE_Q5_K:
            fb = TPI_TYPE_Q5_1;
            break;
        case TPI_TYPE_Q6_K:
            fb = TPI_TYPE_Q8_0;
            break;
        default:
            return tpi_err(err, TPI_ERR_INVALID,
                           "tensor '%s': row length %lld is not a multiple of %d, required by %s",
                           name, (long long)ne0, quant_traits(t)->blck_size, quant_type_name(t));
        }
        t = ne0 % quant_traits(fb)->blck_size == 0 ? fb : TPI_TYPE_F16;
    }
    *type = t;
    return TPI_OK;
}

static void set_tensor(struct synth_tensor *t, const char *name, enum synth_kind kind, int layer,
                       int n_dims, int64_t ne0, int64_t ne1) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->layer = layer;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->type = TPI_TYPE_F32;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const struct synth_tensor *)a)->name, ((const struct synth_tensor *)b)->name);
}

int synth_plan(const struct synth_config *c, int64_t n_vocab, struct synth_tensor **out, int *n,
               struct tpi_error *err) {
    *out = NULL;
    *n = 0;
    int st = synth_check_config(c, err);
    if (st) return st;
    if (n_vocab < 1) return tpi_err(err, TPI_ERR_INVALID, "vocabulary is empty");
    const struct ftype_info *ft = ftype_info(c->ftype);
    bool qwen2 = !strcmp(c->arch, "qwen2");
    int64_t hd = head_dim_of(c), q_dim = hd * c->n_head, kv_dim = hd * c->n_head_kv;
    int per_layer = qwen2 ? 12 : 11;
    struct synth_tensor *ts = calloc((size_t)(3 + per_layer * c->n_layer), sizeof *ts);
    if (!ts) return tpi_err(err, TPI_ERR_NOMEM, "out of memory for the tensor plan");
    int k = 0;
    /* llama.cpp orders tensors outside the blocks first, then block by block
     * (by number), each group by name: what llama-quantize writes. */
    if (!c->tied) set_tensor(&ts[k++], "output.weight", SYNTH_OUTPUT, -1, 2, c->n_embd, n_vocab);
    set_tensor(&ts[k++], "output_norm.weight", SYNTH_OUTPUT_NORM, -1, 1, c->n_embd, 1);
    set_tensor(&ts[k++], "token_embd.weight", SYNTH_TOKEN_EMBD, -1, 2, c->n_embd, n_vocab);
    for (int il = 0; il < c->n_layer; il++) {
        struct synth_tensor *blk = &ts[k];
        int j = 0;
        char nm[64];
#define ADD(suffix, kind, nd, a, b)                                                                \
    do {                                                                                           \
        snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix);                                          \
        set_tensor(&blk[j++], nm, kind, il, nd, a, b);                                             \
    } while (0)
        ADD("attn_norm.weight", SYNTH_ATTN_NORM, 1, c->n_embd, 1);
        ADD("attn_q.weight", SYNTH_ATTN_Q, 2, c->n_embd, q_dim);
        ADD("attn_k.weight", SYNTH_ATTN_K, 2, c->n_embd, kv_dim);
        ADD("attn_v.weight", SYNTH_ATTN_V, 2, c->n_embd, kv_dim);
        if (qwen2) {
            ADD("attn_q.bias", SYNTH_ATTN_Q_BIAS, 1, q_dim, 1);
            ADD("attn_k.bias", SYNTH_ATTN_K_BIAS, 1, kv_dim, 1);
            ADD("attn_v.bias", SYNTH_ATTN_V_BIAS, 1, kv_dim, 1);
        } else {
            ADD("attn_q_norm.weight", SYNTH_ATTN_Q_NORM, 1, hd, 1);
            ADD("attn_k_norm.weight", SYNTH_ATTN_K_NORM, 1, hd, 1);
        }
        ADD("attn_output.weight", SYNTH_ATTN_OUTPUT, 2, q_dim, c->n_embd);
        ADD("ffn_norm.weight", SYNTH_FFN_NORM, 1, c->n_embd, 1);
        ADD("ffn_gate.weight", SYNTH_FFN_GATE, 2, c->n_embd, c->n_ff);
        ADD("ffn_up.weight", SYNTH_FFN_UP, 2, c->n_embd, c->n_ff);
        ADD("ffn_down.weight", SYNTH_FFN_DOWN, 2, c->n_ff, c->n_embd);
#undef ADD
        qsort(blk, (size_t)j, sizeof *blk, cmp_tensor_name);
        k += j;
    }
    for (int i = 0; i < k; i++) {
        if (!kind_is_matrix(ts[i].kind)) continue; /* norms and biases stay F32 */
        st = matrix_type(c, ft, ts[i].kind, ts[i].layer, ts[i].ne[0], ts[i].name, &ts[i].type, err);
        if (st) {
            free(ts);
            return st;
        }
    }
    *out = ts;
    *n = k;
    return TPI_OK;
}

/* ---- vocabulary ------------------------------------------------------------ */

enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5 };

struct vocab {
    char **tokens; /* NUL-terminated (byte-level BPE strings never contain NUL) */
    int32_t *types;
    int64_t n, cap;
    char **merges;
    int64_t n_merges, cap_merges;
    int64_t eos, pad, bos;
    char *chat_template;
    struct gguf_file *src; /* set when the tokenizer is copied from a GGUF */
};

static const char chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

static void vocab_free(struct vocab *v) {
    for (int64_t i = 0; i < v->n; i++)
        free(v->tokens[i]);
    for (int64_t i = 0; i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    free(v->chat_template);
    gguf_close(&v->src);
    memset(v, 0, sizeof *v);
}

/* Set token `id` (growing the table; gaps become NULL until padded). */
static int vocab_set(struct vocab *v, int64_t id, const char *s, size_t len, int type) {
    if (id < 0 || id > (1 << 26)) return TPI_ERR_INVALID;
    if (id >= v->cap) {
        int64_t cap = v->cap ? v->cap : 1024;
        while (cap <= id)
            cap *= 2;
        char **t = realloc(v->tokens, (size_t)cap * sizeof *t);
        if (!t) return TPI_ERR_NOMEM;
        v->tokens = t;
        int32_t *ty = realloc(v->types, (size_t)cap * sizeof *ty);
        if (!ty) return TPI_ERR_NOMEM;
        v->types = ty;
        for (int64_t i = v->cap; i < cap; i++)
            v->tokens[i] = NULL;
        v->cap = cap;
    }
    char *copy = strndup(s, len);
    if (!copy) return TPI_ERR_NOMEM;
    free(v->tokens[id]);
    v->tokens[id] = copy;
    v->types[id] = type;
    if (id >= v->n) {
        for (int64_t i = v->n; i < id; i++)
            v->tokens[i] = NULL;
        v->n = id + 1;
    }
    return TPI_OK;
}

static int vocab_add_merge(struct vocab *v, const char *a, size_t a_len, const char *b,
                           size_t b_len) {
    if (v->n_merges == v->cap_merges) {
        int64_t cap = v->cap_merges ? 2 * v->cap_merges : 1024;
        char **m = realloc(v->merges, (size_t)cap * sizeof *m);
        if (!m) return TPI_ERR_NOMEM;
        v->merges = m;
        v->cap_merges = cap;
    }
    char *s = malloc(a_len + b_len + 2);
    if (!s) return TPI_ERR_NOMEM;
    memcpy(s, a, a_len);
    s[a_len] = ' ';
    memcpy(s + a_len + 1, b, b_len);
    s[a_len + 1 + b_len] = '\0';
    v->merges[v->n_merges++] = s;
    return TPI_OK;
}

/* Fill gaps and pad to n_vocab with "[PADn]" tokens of type UNUSED, as real
 * Qwen GGUFs do (their embedding matrices are larger than the vocabulary). */
static int vocab_pad(struct vocab *v, int64_t n_vocab) {
    for (int64_t i = 0; i < n_vocab || i < v->n; i++) {
        if (i < v->n && v->tokens[i]) continue;
        char buf[32];
        int len = snprintf(buf, sizeof buf, "[PAD%lld]", (long long)i);
        int st = vocab_set(v, i, buf, (size_t)len, TOK_UNUSED);
        if (st) return st;
    }
    return TPI_OK;
}

static int64_t vocab_find(const struct vocab *v, const char *s) {
    for (int64_t i = v->n - 1; i >= 0; i--) /* specials sit at the end */
        if (v->tokens[i] && !strcmp(v->tokens[i], s)) return i;
    return -1;
}

/* GPT-2's byte-level alphabet: printable bytes stand for themselves, the
 * others are shifted to U+0100 and up, in byte order. rank[b] is byte b's
 * token id (the printable ones come first, as in Qwen's vocabulary). */
static void byte_alphabet(uint32_t cp[256], int rank[256]) {
    int r = 0, shift = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (printable) {
            cp[b] = (uint32_t)b;
            rank[b] = r++;
        }
    }
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (!printable) {
            cp[b] = 256u + (uint32_t)shift++;
            rank[b] = r++;
        }
    }
}

static size_t utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* the alphabet stays below U+0800 */
}

/* A fixed English text the built-in merges are learned from (deterministic). */
static const char sample_text[] =
    "The quick brown fox jumps over the lazy dog. In the beginning the model reads the text one "
    "token at a time, and then it writes the next token after the last one. A language model "
    "assigns a probability to every token in its vocabulary, and the sampler chooses one of them. "
    "When the weights are random the output is noise, but the shapes and the formats are the same "
    "as those of a trained model, which is what a test of the engine needs. The tokenizer splits "
    "the input into words and merges the most frequent pairs of bytes into longer tokens; these "
    "merges are learned from a corpus of text such as this one. There is nothing in this "
    "paragraph that matters except that it is English and that it contains the common words of "
    "the language: the, of, and, to, in, is, that, it, for, on, with, as, was, at, by, this, "
    "which, from, be, or, are, an, not, have, has, had, but, they, their, there, these, those, "
    "were, will, would, can, could, should, may, might, must, shall, one, two, three, four, five, "
    "six, seven, eight, nine, ten, hundred, thousand, million, first, second, third, time, year, "
    "people, way, day, man, woman, child, world, life, hand, part, place, case, week, company, "
    "system, program, question, government, number, night, point, home, water, room, mother, "
    "area, money, story, fact, month, lot, right, study, book, eye, job, word, business, issue, "
    "side, kind, head, house, service, friend, father, power, hour, game, line, end, member, law, "
    "car, city, community, name, president, team, minute, idea, kid, body, information, back, "
    "parent, face, others, level, office, door, health, person, art, war, history, party, result, "
    "change, morning, reason, research, girl, guy, moment, air, teacher, force, education. "
    "Running, jumping, reading, writing, thinking, learning, computing, training, testing, "
    "building, working, playing, making, taking, giving, getting, going, coming, seeing, looking. "
    "The engine runs on many machines at once: each rank holds a slice of every matrix, and the "
    "ranks exchange their partial results after the attention and after the feed-forward layer.";

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Learn n_merges BPE merges from sample_text (words with their leading space,
 * the GPT-2 convention) and add the merged tokens after the 256 byte tokens.
 * Ties break on the lower pair of token ids, so the result is deterministic. */
static int vocab_builtin(struct vocab *v, int n_merges, struct tpi_error *err) {
    uint32_t cp[256];
    int rank[256];
    byte_alphabet(cp, rank);
    for (int b = 0; b < 256; b++) {
        char s[4];
        size_t len = utf8_put(s, cp[b]);
        if (vocab_set(v, rank[b], s, len, TOK_NORMAL))
            return tpi_err(err, TPI_ERR_NOMEM, "vocabulary: out of memory");
    }
    /* Split into pieces: an optional space followed by a run of letters, or any
     * other single byte. Each piece is a token-id sequence ended by -1. */
    size_t text_n = sizeof sample_text - 1;
    int *seq = malloc((2 * text_n + 1) * sizeof *seq);
    if (!seq) return tpi_err(err, TPI_ERR_NOMEM, "vocabulary: out of memory");
    size_t n_seq = 0;
    for (size_t i = 0; i < text_n;) {
        size_t j = i;
        if (sample_text[j] == ' ' && j + 1 < text_n && isalpha((unsigned char)sample_text[j + 1]))
            j++;
        if (isalpha((unsigned char)sample_text[j]))
            while (j < text_n && isalpha((unsigned char)sample_text[j]))
                j++;
        else
            j++;
        for (size_t k = i; k < j; k++)
            seq[n_seq++] = rank[(unsigned char)sample_text[k]];
        seq[n_seq++] = -1;
        i = j;
    }
    uint64_t *pairs = malloc((n_seq + 1) * sizeof *pairs);
    if (!pairs) {
        free(seq);
        return tpi_err(err, TPI_ERR_NOMEM, "vocabulary: out of memory");
    }
    int st = TPI_OK;
    for (int m = 0; m < n_merges; m++) {
        /* Count adjacent pairs by sorting them: the text is a few thousand bytes. */
        size_t n_pairs = 0;
        for (size_t i = 0; i + 1 < n_seq; i++)
            if (seq[i] >= 0 && seq[i + 1] >= 0)
                pairs[n_pairs++] = (uint64_t)seq[i] << 32 | (uint32_t)seq[i + 1];
        qsort(pairs, n_pairs, sizeof *pairs, cmp_u64);
        uint64_t best = 0;
        size_t best_count = 1;
        for (size_t i = 0; i < n_pairs;) {
            size_t j = i;
            while (j < n_pairs && pairs[j] == pairs[i])
                j++;
            if (j - i > best_count) { /* strictly more: ties keep the lower pair */
                best_count = j - i;
                best = pairs[i];
            }
            i = j;
        }
        if (best_count < 2) break; /* no pair occurs twice: the text is exhausted */
        int a = (int)(best >> 32), b = (int)(uint32_t)best, t = 256 + m;
        size_t la = strlen(v->tokens[a]), lb = strlen(v->tokens[b]);
        char *joined = malloc(la + lb + 1);
        if (!joined || vocab_add_merge(v, v->tokens[a], la, v->tokens[b], lb)) {
            free(joined);
            st = tpi_err(err, TPI_ERR_NOMEM, "vocabulary: out of memory");
            break;
        }
        memcpy(joined, v->tokens[a], la);
        memcpy(joined + la, v->tokens[b], lb + 1);
        st = vocab_set(v, t, joined, la + lb, TOK_NORMAL);
        free(joined);
        if (st) {
            st = tpi_err(err, st, "vocabulary: out of memory");
            break;
        }
        /* Replace the pair in place (compacting the sequence). */
        size_t w = 0;
        for (size_t i = 0; i < n_seq; i++) {
            if (i + 1 < n_seq && seq[i] == a && seq[i + 1] == b) {
                seq[w++] = t;
                i++;
            } else {
                seq[w++] = seq[i];
            }
        }
        n_seq = w;
    }
    free(pairs);
    free(seq);
    if (st) return st;
    static const char *specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    int64_t base = v->n;
    for (int i = 0; i < 3; i++)
        if (vocab_set(v, base + i, specials[i], strlen(specials[i]), TOK_CONTROL))
            return tpi_err(err, TPI_ERR_NOMEM, "vocabulary: out of memory");
    v->bos = v->pad = base;
    v->eos = base + 2;
    return TPI_OK;
}

/* Read a Hugging Face tokenizer.json: model.vocab, model.merges ("a b" strings
 * or [a, b] pairs), added_tokens (special -> CONTROL, else USER_DEFINED, as
 * llama.cpp's converter marks them); the chat template from the
 * tokenizer_config.json beside it when there is one. */
static int vocab_from_tokenizer_json(struct vocab *v, const char *path, struct tpi_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return tpi_err(err, TPI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? 2 * cap : (1u << 20);
            char *t = realloc(text, cap);
            if (!t) {
                free(text);
                fclose(f);
                return tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", path);
            }
            text = t;
        }
        size_t k = fread(text + n, 1, 65536, f);
        n += k;
        if (k < 65536) break;
    }
    fclose(f);
    text[n] = '\0';
    cJSON *root = tpi_json_parse(text, n);
    free(text);
    if (!root) return tpi_err(err, TPI_ERR_FORMAT, "%s: not valid JSON", path);
    int st = TPI_OK;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        cJSON_Delete(root);
        return tpi_err(err, TPI_ERR_FORMAT,
                       "%s: no model.vocab object / model.merges array (not a BPE tokenizer)",
                       path);
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > (1 << 26)) {
            st = tpi_err(err, TPI_ERR_FORMAT, "%s: model.vocab['%s']: bad id", path, it->string);
            break;
        }
        if ((st = vocab_set(v, (int64_t)it->valuedouble, it->string, strlen(it->string),
                            TOK_NORMAL))) {
            st = tpi_err(err, st, "%s: out of memory", path);
            break;
        }
    }
    int64_t i_merge = 0;
    if (!st) cJSON_ArrayForEach(it, merges) {
            const char *a = NULL, *b = NULL;
            size_t la = 0, lb = 0;
            if (cJSON_IsString(it)) {
                const char *sp = strchr(it->valuestring, ' ');
                if (sp) {
                    a = it->valuestring;
                    la = (size_t)(sp - a);
                    b = sp + 1;
                    lb = strlen(b);
                }
            } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                       cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                       cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
                a = cJSON_GetArrayItem(it, 0)->valuestring;
                b = cJSON_GetArrayItem(it, 1)->valuestring;
                la = strlen(a);
                lb = strlen(b);
            }
            if (!a) {
                st = tpi_err(err, TPI_ERR_FORMAT,
                             "%s: model.merges[%lld]: expected \"a b\" or [a, b]", path,
                             (long long)i_merge);
                break;
            }
            if ((st = vocab_add_merge(v, a, la, b, lb))) {
                st = tpi_err(err, st, "%s: out of memory", path);
                break;
            }
            i_merge++;
        }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!st) cJSON_ArrayForEach(it, added) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
            if (!cJSON_IsNumber(id) || !cJSON_IsString(content) || id->valuedouble < 0 ||
                id->valuedouble > (1 << 26)) {
                st = tpi_err(err, TPI_ERR_FORMAT, "%s: added_tokens: entry without id/content",
                             path);
                break;
            }
            int type = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"))
                           ? TOK_CONTROL
                           : TOK_USER_DEFINED;
            if ((st = vocab_set(v, (int64_t)id->valuedouble, content->valuestring,
                                strlen(content->valuestring), type))) {
                st = tpi_err(err, st, "%s: out of memory", path);
                break;
            }
        }
    cJSON_Delete(root);
    if (st) return st;
    /* Qwen's conventions: <|im_end|> ends a turn, <|endoftext|> pads (and is bos). */
    v->eos = vocab_find(v, "<|im_end|>");
    v->pad = vocab_find(v, "<|endoftext|>");
    if (v->eos < 0) v->eos = v->pad;
    v->bos = v->pad;
    /* The chat template lives in tokenizer_config.json next to tokenizer.json. */
    char cfg_path[1100];
    const char *slash = strrchr(path, '/');
    snprintf(cfg_path, sizeof cfg_path, "%.*stokenizer_config.json",
             slash ? (int)(slash - path + 1) : 0, path);
    FILE *cf = fopen(cfg_path, "rb");
    if (cf) {
        fseek(cf, 0, SEEK_END);
        long len = ftell(cf);
        fseek(cf, 0, SEEK_SET);
        char *ct = len > 0 ? malloc((size_t)len + 1) : NULL;
        if (ct && fread(ct, 1, (size_t)len, cf) == (size_t)len) {
            ct[len] = '\0';
            cJSON *cj = cJSON_Parse(ct);
            const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(cj, "chat_template");
            if (cJSON_IsString(tmpl) && !v->chat_template)
                v->chat_template = strdup(tmpl->valuestring);
            cJSON_Delete(cj);
        }
        free(ct);
        fclose(cf);
    }
    return TPI_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcasecmp(s + n - k, suffix);
}

/* Build the vocabulary the configuration asks for; *n_vocab_out is the model's
 * vocabulary size (the embedding matrix's rows). */
static int vocab_load(const struct synth_config *c, struct vocab *v, int64_t *n_vocab_out,
                      struct tpi_error *err) {
    memset(v, 0, sizeof *v);
    int st;
    if (c->chat_template_from[0]) {
        FILE *f = fopen(c->chat_template_from, "rb");
        size_t n = 0;
        if (!f)
            return tpi_err(err, TPI_ERR_IO, "--chat-template %s: cannot open: %s",
                           c->chat_template_from, strerror(errno));
        v->chat_template = tpi_read_stream(f, &n);
        const bool bad = ferror(f) || !v->chat_template;
        fclose(f);
        if (bad || memchr(v->chat_template, '\0', n) || n == 0)
            return tpi_err(err, bad ? TPI_ERR_IO : TPI_ERR_INVALID,
                           "--chat-template %s: %s", c->chat_template_from,
                           bad ? "cannot read it" : n ? "holds a NUL byte" : "is empty");
    }
    if (c->vocab_from[0] && ends_with(c->vocab_from, ".gguf")) {
        if ((st = gguf_open(c->vocab_from, &v->src, err))) return tpi_err_wrap(err, "--vocab-from");
        const struct gguf_kv *toks = gguf_find_kv(v->src, "tokenizer.ggml.tokens");
        if (!toks || toks->type != GGUF_VT_ARRAY || toks->arr_type != GGUF_VT_STRING ||
            toks->arr_n == 0)
            return tpi_err(err, TPI_ERR_FORMAT, "%s: no tokenizer.ggml.tokens string array",
                           c->vocab_from);
        int64_t n = (int64_t)toks->arr_n;
        if (c->n_vocab > 0 && c->n_vocab != n)
            return tpi_err(
                err, TPI_ERR_INVALID,
                "--vocab %d differs from the %lld tokens of %s (a copied vocabulary is not padded)",
                c->n_vocab, (long long)n, c->vocab_from);
        *n_vocab_out = n;
        return TPI_OK;
    }
    if (c->vocab_from[0])
        st = vocab_from_tokenizer_json(v, c->vocab_from, err);
    else
        st = vocab_builtin(v, c->n_merges, err);
    if (st) return st;
    if (c->n_vocab > 0 && c->n_vocab < v->n)
        return tpi_err(err, TPI_ERR_INVALID,
                       "--vocab %d is smaller than the vocabulary (%lld tokens%s%s)", c->n_vocab,
                       (long long)v->n, c->vocab_from[0] ? " in " : "", c->vocab_from);
    if ((st = vocab_pad(v, c->n_vocab))) return tpi_err(err, st, "vocabulary: out of memory");
    *n_vocab_out = v->n;
    return TPI_OK;
}

/* ---- metadata -------------------------------------------------------------- */

static const char *const sampling_keys[] = {"temp",  "top_k",          "top_p",
                                            "min_p", "penalty_repeat", "penalty_last_n"};

static bool sampling_is_int(const char *k) {
    return !strcmp(k, "top_k") || !strcmp(k, "penalty_last_n");
}

int synth_parse_sampling(struct synth_config *c, const char *list, struct tpi_error *err) {
    const char *p = list;
    while (*p) {
        const size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        size_t k = 0;
        const size_t klen = eq ? (size_t)(eq - p) : 0;
        while (k < sizeof sampling_keys / sizeof sampling_keys[0] &&
               !(strlen(sampling_keys[k]) == klen && !strncmp(p, sampling_keys[k], klen)))
            k++;
        char val[64] = "";
        if (eq && len - klen - 1 < sizeof val) memcpy(val, eq + 1, len - klen - 1);
        char *end;
        const double v = strtod(val, &end);
        if (!eq || k == sizeof sampling_keys / sizeof sampling_keys[0] || !*val || *end ||
            !isfinite(v) || (sampling_is_int(sampling_keys[k]) && (v != floor(v) || fabs(v) > 2e9)))
            return tpi_err(err, TPI_ERR_INVALID,
                           "--sampling: '%.*s' is not KEY=VALUE with KEY one of temp, top_k, "
                           "top_p, min_p, penalty_repeat, penalty_last_n (integers for top_k "
                           "and penalty_last_n)",
                           (int)len, p);
        int i = 0;
        while (i < c->n_sampling && strcmp(c->sampling[i].key, sampling_keys[k])) i++;
        if (i == c->n_sampling) c->n_sampling++; // at most one entry a key: it fits
        snprintf(c->sampling[i].key, sizeof c->sampling[i].key, "%s", sampling_keys[k]);
        c->sampling[i].value = v;
        p += len;
        if (*p == ',') p++;
    }
    return TPI_OK;
}

static int put_metadata(const struct synth_config *c, const struct vocab *v, struct gguf_writer *w,
                        struct tpi_error *err) {
    const struct ftype_info *ft = ftype_info(c->ftype);
    char key[128];
    int st = 0;
    int hd = head_dim_of(c);
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", c->arch, suffix), key)
    /* Same keys in the same order as the llama.cpp-made reference files. */
    st |= gguf_writer_set_str(w, "general.architecture", c->arch);
    st |= gguf_writer_set_str(w, "general.name", c->name[0] ? c->name : "synthetic");
    for (int i = 0; i < c->n_sampling; i++) {
        snprintf(key, sizeof key, "general.sampling.%s", c->sampling[i].key);
        if (sampling_is_int(c->sampling[i].key))
            st |= gguf_writer_set_i32(w, key, (int32_t)c->sampling[i].value);
        else
            st |= gguf_writer_set_f32(w, key, (float)c->sampling[i].value);
    }
    st |= gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)c->n_ctx);
    st |= gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c->n_embd);
    st |= gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->n_ff);
    st |= gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c->n_layer);
    st |= gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c->n_head);
    st |= gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_head_kv);
    st |= gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hd);
    st |= gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)hd);
    st |= gguf_writer_set_f32(w, KEY("rope.freq_base"), c->rope_freq_base);
    st |= gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->rms_eps);
    if (c->rope_scaling[0]) { /* as llama.cpp's converter writes a rope_scaling config */
        st |= gguf_writer_set_str(w, KEY("rope.scaling.type"), c->rope_scaling);
        st |= gguf_writer_set_f32(w, KEY("rope.scaling.factor"), c->rope_scale);
        if (c->yarn_orig_ctx > 0)
            st |= gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                                      (uint32_t)c->yarn_orig_ctx);
    }
#undef KEY
    if (st) return tpi_err(err, TPI_ERR_NOMEM, "metadata: out of memory");
    if (v->src) {
        /* Copy every tokenizer.* key of the source file byte for byte, in its order (the
         * chat template given apart instead of the source's). */
        static const char tmpl_key[] = "tokenizer.chat_template";
        for (int64_t i = 0; i < gguf_n_kv(v->src); i++) {
            const struct gguf_kv *kv = gguf_kv_at(v->src, i);
            if (v->chat_template && kv->key.len == strlen(tmpl_key) &&
                !memcmp(kv->key.data, tmpl_key, kv->key.len))
                continue;
            if (kv->key.len > 10 && !memcmp(kv->key.data, "tokenizer.", 10) &&
                gguf_writer_copy_kv(w, kv))
                return tpi_err(err, TPI_ERR_FORMAT, "%s: cannot copy key '%.*s'", c->vocab_from,
                               (int)kv->key.len, kv->key.data);
        }
        if (v->chat_template) st |= gguf_writer_set_str(w, tmpl_key, v->chat_template);
    } else {
        st |= gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
        st |= gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
        st |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens,
                                      NULL, (uint64_t)v->n);
        st |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, v->types,
                                  (uint64_t)v->n);
        st |= gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                                      NULL, (uint64_t)v->n_merges);
        if (v->eos >= 0)
            st |= gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
        if (v->pad >= 0)
            st |= gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad);
        if (v->bos >= 0)
            st |= gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
        st |= gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
        st |= gguf_writer_set_str(w, "tokenizer.chat_template",
                                  v->chat_template ? v->chat_template : chatml_template);
    }
    if (ft->quantized) st |= gguf_writer_set_u32(w, "general.quantization_version", 2);
    st |= gguf_writer_set_u32(w, "general.file_type", (uint32_t)c->ftype);
    if (st) return tpi_err(err, TPI_ERR_NOMEM, "metadata: out of memory");
    return TPI_OK;
}

/* ---- weights ----------------------------------------------------------------- */

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Fill x[0..n) with N(mean, sd) numbers from the stream `s` (Box-Muller, two
 * per pair of 32-bit uniforms drawn from one 64-bit output). */
static void fill_normal(uint64_t s, float *x, int64_t n, float mean, float sd) {
    const float two_pi = 6.28318530717958647692f;
    for (int64_t i = 0; i < n; i += 2) {
        uint64_t r = splitmix64(&s);
        /* (k + 0.5) / 2^32 lies in (0, 1): log never sees 0 */
        float u1 = ((float)(uint32_t)r + 0.5f) * 2.3283064e-10f;
        float u2 = ((float)(uint32_t)(r >> 32) + 0.5f) * 2.3283064e-10f;
        float rad = sd * sqrtf(-2.0f * logf(u1));
        float a = two_pi * u2;
        x[i] = mean + rad * cosf(a);
        if (i + 1 < n) x[i + 1] = mean + rad * sinf(a);
    }
}

/* Mean and spread of each kind of tensor: matrices N(0, 1/ne0) so each
 * projection keeps activations at unit scale, norms around 1, small biases,
 * embeddings of the size trained models have. */
static void kind_scale(const struct synth_tensor *t, float *mean, float *sd) {
    *mean = 0.0f;
    switch (t->kind) {
    case SYNTH_TOKEN_EMBD:
        *sd = 0.03f;
        break;
    case SYNTH_OUTPUT_NORM:
    case SYNTH_ATTN_NORM:
    case SYNTH_FFN_NORM:
    case SYNTH_ATTN_Q_NORM:
    case SYNTH_ATTN_K_NORM:
        *mean = 1.0f;
        *sd = 0.02f;
        break;
    case SYNTH_ATTN_Q_BIAS:
    case SYNTH_ATTN_K_BIAS:
    case SYNTH_ATTN_V_BIAS:
        *sd = 0.02f;
        break;
    default:
        *sd = 1.0f / sqrtf((float)t->ne[0]);
        break;
    }
}

/* One unit of work: rows [row0, row0 + n_rows) of tensor i. */
struct chunk {
    int tensor;
    int64_t row0, n_rows;
};

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

int synth_write(const struct synth_config *c, const char *path, struct synth_stats *stats,
                struct tpi_error *err) {
    double t0 = tpi_time_s();
    struct vocab v;
    int64_t n_vocab = 0;
    struct synth_tensor *ts = NULL;
    int n_ts = 0;
    struct gguf_writer *w = NULL;
    struct chunk *chunks = NULL;
    int64_t *tensor_index = NULL;
    char tmp_path[4200], real[4096];
    int fd = -1;
    bool tmp_made = false;
    /* The rename below replaces whatever path names: a link is followed to its file, and
     * anything but a regular file (a device, a directory, a pipe) is refused, not replaced. */
    struct stat pst;
    if (lstat(path, &pst) == 0 && S_ISLNK(pst.st_mode) && realpath(path, real)) path = real;
    if (stat(path, &pst) == 0 && !S_ISREG(pst.st_mode))
        return tpi_err(err, TPI_ERR_INVALID, "%s: not a regular file (mkmodel writes a GGUF file)",
                       path);
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", path);

    int st = synth_check_config(c, err);
    if (st) return st;
    memset(&v, 0, sizeof v);
    if ((st = vocab_load(c, &v, &n_vocab, err))) goto done;
    if ((st = synth_plan(c, n_vocab, &ts, &n_ts, err))) goto done;
    if (!(w = gguf_writer_new(32))) {
        st = tpi_err(err, TPI_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = put_metadata(c, &v, w, err))) goto done;
    tensor_index = calloc((size_t)n_ts, sizeof *tensor_index);
    if (!tensor_index) {
        st = tpi_err(err, TPI_ERR_NOMEM, "out of memory");
        goto done;
    }
    int64_t n_chunks = 0, n_params = 0;
    for (int i = 0; i < n_ts; i++) {
        tensor_index[i] =
            gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne, NULL);
        if (tensor_index[i] < 0) {
            st = tpi_err(err, TPI_ERR_INVALID, "tensor '%s': the writer refused %s [%lld, %lld]",
                         ts[i].name, quant_type_name(ts[i].type), (long long)ts[i].ne[0],
                         (long long)ts[i].ne[1]);
            goto done;
        }
        n_params += ts[i].ne[0] * ts[i].ne[1];
    }
    /* Chunks of about 4 MiB of output: big enough for efficient pwrite, small
     * enough to balance threads and bound memory. */
    const size_t chunk_bytes = (size_t)4 << 20;
    for (int pass = 0; pass < 2; pass++) {
        int64_t k = 0;
        for (int i = 0; i < n_ts; i++) {
            size_t row_bytes = quant_row_size(ts[i].type, ts[i].ne[0]);
            int64_t rows_per = (int64_t)(chunk_bytes / row_bytes);
            if (rows_per < 1) rows_per = 1;
            for (int64_t r = 0; r < ts[i].ne[1]; r += rows_per) {
                if (pass == 1) {
                    chunks[k].tensor = i;
                    chunks[k].row0 = r;
                    chunks[k].n_rows = TPI_MIN(rows_per, ts[i].ne[1] - r);
                }
                k++;
            }
        }
        if (pass == 0) {
            n_chunks = k;
            if (!(chunks = malloc((size_t)n_chunks * sizeof *chunks))) {
                st = tpi_err(err, TPI_ERR_NOMEM, "out of memory");
                goto done;
            }
        }
    }
    if ((st = gguf_writer_write_header(w, tmp_path, &fd, err))) goto done;
    tmp_made = true;

    int n_threads = c->n_threads > 0 ? c->n_threads : tpi_cpu_count();
    int64_t max_ne0 = 0;
    for (int i = 0; i < n_ts; i++)
        max_ne0 = TPI_MAX(max_ne0, ts[i].ne[0]);
    int io_errno = 0, fail = 0;
    int64_t n_done = 0;
    int next_report = 1;
#pragma omp parallel num_threads(n_threads)
    {
        float *row = malloc((size_t)max_ne0 * sizeof *row);
        uint8_t *buf = malloc(chunk_bytes + (size_t)max_ne0 * 4);
        if (!row || !buf) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t k = 0; k < n_chunks; k++) {
            int failed;
#pragma omp atomic read
            failed = fail;
            if (failed) continue;
            const struct chunk *ch = &chunks[k];
            const struct synth_tensor *t = &ts[ch->tensor];
            const struct quant_traits *tr = quant_traits(t->type);
            size_t row_bytes = quant_row_size(t->type, t->ne[0]);
            float mean, sd;
            kind_scale(t, &mean, &sd);
            /* The stream of row r depends only on (seed, tensor name, r). */
            uint64_t name_seed = tpi_fnv1a(TPI_FNV_INIT, t->name, strlen(t->name));
            for (int64_t r = 0; r < ch->n_rows; r++) {
                uint64_t s = c->seed ^ 0x5DEECE66DULL;
                s = splitmix64(&s) ^ name_seed;
                s = splitmix64(&s) + (uint64_t)(ch->row0 + r) * 0xD1B54A32D192ED03ULL;
                splitmix64(&s);
                fill_normal(s, row, t->ne[0], mean, sd);
                tr->from_f32(row, buf + (size_t)r * row_bytes, t->ne[0]);
            }
            uint64_t off = gguf_writer_tensor_offset(w, tensor_index[ch->tensor]) +
                           (uint64_t)ch->row0 * row_bytes;
            if (pwrite_all(fd, buf, (size_t)ch->n_rows * row_bytes, off) != 0) {
#pragma omp critical(synth_err)
                {
                    if (!fail) io_errno = errno;
                    fail = 1;
                }
            }
            if (c->verbose && n_params >= 100000000) {
                int64_t done_now;
#pragma omp atomic capture
                done_now = n_done += ch->n_rows * t->ne[0];
#pragma omp critical(synth_progress)
                while (next_report <= 10 && done_now * 10 >= n_params * next_report) {
                    TPI_LOGI("mkmodel: %d%% (%.1f s)", next_report * 10, tpi_time_s() - t0);
                    next_report++;
                }
            }
        }
        free(row);
        free(buf);
    }
    if (fail) {
        st = io_errno
                 ? tpi_err(err, TPI_ERR_IO, "%s: write failed: %s", tmp_path, strerror(io_errno))
                 : tpi_err(err, TPI_ERR_NOMEM, "out of memory for the row buffers");
        goto done;
    }
    if (close(fd) != 0) {
        fd = -1;
        st = tpi_err(err, TPI_ERR_IO, "%s: close: %s", tmp_path, strerror(errno));
        goto done;
    }
    fd = -1;
    if (rename(tmp_path, path) != 0) {
        st = tpi_err(err, TPI_ERR_IO, "%s: cannot rename to %s: %s", tmp_path, path,
                     strerror(errno));
        goto done;
    }
    tmp_made = false;
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->n_tensors = n_ts;
        stats->n_vocab = n_vocab;
        stats->n_merges = v.src ? -1 : v.n_merges;
        stats->n_params = n_params;
        struct stat sb;
        stats->n_bytes = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        stats->seconds = tpi_time_s() - t0;
        stats->n_threads = n_threads;
    }
done:
    if (fd >= 0) close(fd);
    if (tmp_made) unlink(tmp_path);
    free(chunks);
    free(tensor_index);
    free(ts);
    gguf_writer_free(&w);
    vocab_free(&v);
    return st;
}
