/*
 * config.c — Qwen2/Qwen3 hyperparameters from GGUF metadata, and a check of
 * every tensor the forward pass reads (presence, shape, type) before any
 * weight is touched, so a bad file fails with the name of the first tensor
 * that is off instead of computing garbage.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels/quant.h"
#include "model.h"

/* Required integer key "<arch>.<name>". */
static int get_int_key(const struct gguf_file *f, const char *arch, const char *name, int *out,
                       bool required, int def, struct tpi_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    int64_t v;
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (kv && kv->type == GGUF_VT_BOOL) // the reader reads a bool as 0 or 1; a count is not one
        return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key '%s' is a bool, expected an integer",
                       gguf_path(f), key);
    if (!gguf_get_int(f, key, &v)) {
        if (gguf_find_kv(f, key))
            return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key '%s' is not an integer",
                           gguf_path(f), key);
        if (required)
            return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key '%s' is missing", gguf_path(f),
                           key);
        *out = def;
        return TPI_OK;
    }
    if (v <= 0 || v > (1 << 30))
        return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key '%s' = %lld is out of range",
                       gguf_path(f), key, (long long)v);
    *out = (int)v;
    return TPI_OK;
}

/* Number key "<arch>.<name>", finite and at least lo (above it when `above`). */
static int get_f32_key(const struct gguf_file *f, const char *arch, const char *name, float *out,
                       bool required, float def, float lo, bool above, struct tpi_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (kv && kv->type != GGUF_VT_BOOL && gguf_get_f32(f, key, out)) {
        if (!isfinite(*out) || *out < lo || (above && *out == lo))
            return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key '%s' = %g is out of range (%s %g)",
                           gguf_path(f), key, (double)*out, above ? "above" : "at least",
                           (double)lo);
        return TPI_OK;
    }
    if (kv)
        return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key '%s' is not a number",
                       gguf_path(f), key);
    if (required)
        return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key '%s' is missing", gguf_path(f),
                       key);
    *out = def;
    return TPI_OK;
}

/* Check tensor `name`: present (unless optional), ne0 x ne1, a computable type.
 * *found says whether it exists. 1-D tensors pass ne1 = 1. */
static int check_tensor(const struct gguf_file *f, const char *name, int64_t ne0, int64_t ne1,
                        bool optional, bool *found, struct tpi_error *err) {
    const struct gguf_tensor *t = gguf_find_tensor(f, name);
    if (found) *found = t != NULL;
    if (!t) {
        if (optional) return TPI_OK;
        return tpi_err(err, TPI_ERR_FORMAT, "%s: tensor '%s' is missing", gguf_path(f), name);
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return tpi_err(err, TPI_ERR_FORMAT,
                       "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                       gguf_path(f), name, (long long)t->ne[0], (long long)t->ne[1],
                       (long long)t->ne[2], (long long)t->ne[3], (long long)ne0, (long long)ne1);
    const struct quant_traits *tr = quant_traits(t->type);
    if (!tr || !tr->supported)
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has type %s, which tpinfer cannot compute with",
                       gguf_path(f), name, quant_type_name(t->type));
    if (ne0 % tr->blck_size != 0)
        return tpi_err(err, TPI_ERR_FORMAT,
                       "%s: tensor '%s' of type %s: row of %lld elements is not a whole number of "
                       "%d-element blocks",
                       gguf_path(f), name, tr->name, (long long)ne0, tr->blck_size);
    return TPI_OK;
}

static int check_tensors(const struct model_config *c, const struct gguf_file *f,
                         struct tpi_error *err) {
    const int64_t q_dim = (int64_t)c->n_head * c->head_dim;
    const int64_t k_dim = (int64_t)c->n_head_kv * c->head_dim;
    const int64_t v_dim = (int64_t)c->n_head_kv * c->head_dim_v;
    const int64_t o_in = (int64_t)c->n_head * c->head_dim_v;
    int rc;
    if ((rc = check_tensor(f, "token_embd.weight", c->n_embd, c->n_vocab, false, NULL, err)) ||
        (rc = check_tensor(f, "output_norm.weight", c->n_embd, 1, false, NULL, err)))
        return rc;
    if (!c->tied_output &&
        (rc = check_tensor(f, "output.weight", c->n_embd, c->n_vocab, false, NULL, err)))
        return rc;
    for (int l = 0; l < c->n_layer; l++) {
        struct {
            const char *suffix;
            int64_t ne0, ne1;
            bool want;
        } list[] = {
            {"attn_norm.weight", c->n_embd, 1, true},
            {"attn_q.weight", c->n_embd, q_dim, true},
            {"attn_k.weight", c->n_embd, k_dim, true},
            {"attn_v.weight", c->n_embd, v_dim, true},
            {"attn_q.bias", q_dim, 1, c->has_qkv_bias},
            {"attn_k.bias", k_dim, 1, c->has_qkv_bias},
            {"attn_v.bias", v_dim, 1, c->has_qkv_bias},
            {"attn_q_norm.weight", c->head_dim, 1, c->has_qk_norm},
            {"attn_k_norm.weight", c->head_dim, 1, c->has_qk_norm},
            {"attn_output.weight", o_in, c->n_embd, true},
            {"ffn_norm.weight", c->n_embd, 1, true},
            {"ffn_gate.weight", c->n_embd, c->n_ff, true},
            {"ffn_up.weight", c->n_embd, c->n_ff, true},
            {"ffn_down.weight", c->n_ff, c->n_embd, true},
        };
        for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
            if (!list[i].want) continue;
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s", l, list[i].suffix);
            if ((rc = check_tensor(f, name, list[i].ne0, list[i].ne1, false, NULL, err))) return rc;
        }
    }
    // A layer's tensors past block_count mean the count is wrong (a model cut short
    // would run without a word): refuse, as llama.cpp's tensor count check does.
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const char *name = gguf_tensor_at(f, i)->name;
        if (strncmp(name, "blk.", 4) || name[4] < '0' || name[4] > '9') continue;
        const long l = strtol(name + 4, NULL, 10);
        if (l >= c->n_layer)
            return tpi_err(err, TPI_ERR_FORMAT,
                           "%s: tensor 'blk.%ld...' is past %s.block_count %d: the count or the "
                           "tensors are wrong",
                           gguf_path(f), l, c->arch_name, c->n_layer);
    }
    return TPI_OK;
}

/* Rope scaling as llama.cpp reads it: <arch>.rope.scaling.type none, linear or yarn
 * (linear when absent), the factor from rope.scaling.factor (or the older
 * rope.scale_linear; 0 or absent: 1), YaRN's original_context_length (default the
 * context_length) and attn_factor (1). Other types (longrope, ...) are refused: running
 * without them would give wrong logits at every position. */
static int rope_scaling_from_gguf(struct model_config *cfg, const struct gguf_file *f,
                                  const char *a, struct tpi_error *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    const struct gguf_kv *skv = gguf_find_kv(f, key);
    if (skv && skv->type != GGUF_VT_STRING)
        return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key '%s' has type %s, expected a string",
                       gguf_path(f), key, gguf_vtype_name(skv->type));
    cfg->rope_scaling = MODEL_ROPE_LINEAR;
    struct gguf_str st;
    if (gguf_get_str(f, key, &st)) {
        const int kind = model_rope_scaling_from_name(st.data, st.len);
        if (kind < 0)
            return tpi_err(err, TPI_ERR_UNSUPPORTED,
                           "%s: rope scaling '%.*s' (%s) is not supported (tpinfer runs none, "
                           "linear and yarn)",
                           gguf_path(f), (int)TPI_MIN(st.len, 32), st.data, key);
        cfg->rope_scaling = (enum model_rope_scaling)kind;
    }
    float factor = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", a);
    const char *name = gguf_find_kv(f, key) ? "rope.scaling.factor" : "rope.scale_linear";
    int rc = get_f32_key(f, a, name, &factor, false, 0.0f, 0.0f, false, err);
    if (rc) return rc;
    cfg->rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    if (!isfinite(cfg->rope_freq_scale) || cfg->rope_freq_scale <= 0.0f)
        return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key '%s.%s' = %g is out of range",
                       gguf_path(f), a, name, (double)factor);
    // original_context_length 0 is "absent" to llama.cpp: the context_length then
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", a);
    int64_t orig;
    const bool orig_zero = gguf_get_int(f, key, &orig) && orig == 0 &&
                           gguf_find_kv(f, key)->type != GGUF_VT_BOOL;
    if (!orig_zero && (rc = get_int_key(f, a, "rope.scaling.original_context_length",
                                        &cfg->rope_n_ctx_orig, false, cfg->n_ctx_train, err)))
        return rc;
    if (orig_zero) cfg->rope_n_ctx_orig = cfg->n_ctx_train;
    if ((rc = get_f32_key(f, a, "rope.scaling.attn_factor", &cfg->rope_attn_factor, false, 1.0f,
                          0.0f, true, err)))
        return rc;
    if (cfg->rope_attn_factor > 1000.0f) // cos and sin times this: past it, logits overflow
        return tpi_err(err, TPI_ERR_FORMAT,
                       "%s: metadata key '%s.rope.scaling.attn_factor' = %g is out of range (at "
                       "most 1000)",
                       gguf_path(f), a, (double)cfg->rope_attn_factor);
    return TPI_OK;
}

int model_rope_scaling_from_name(const char *s, size_t n) {
    static const char *const names[] = {"none", "linear", "yarn"};
    for (int k = 0; k < 3; k++)
        if (n == strlen(names[k]) && !memcmp(s, names[k], n)) return k;
    return -1;
}

const char *model_rope_scaling_name(enum model_rope_scaling s) {
    return s == MODEL_ROPE_NONE ? "none" : s == MODEL_ROPE_LINEAR ? "linear" : "yarn";
}

void model_config_rope_override(struct model_config *cfg, const struct model_rope_opts *o) {
    const int kind = o->scaling ? model_rope_scaling_from_name(o->scaling, strlen(o->scaling)) : -1;
    if (kind >= 0) cfg->rope_scaling = (enum model_rope_scaling)kind;
    if (o->scale > 0.0f) cfg->rope_freq_scale = 1.0f / o->scale;
    if (o->orig_ctx > 0) cfg->rope_n_ctx_orig = o->orig_ctx;
}

bool model_rope_scaled(const struct model_config *c) {
    return c->rope_scaling == MODEL_ROPE_YARN || c->rope_attn_factor != 1.0f ||
           (c->rope_scaling == MODEL_ROPE_LINEAR && c->rope_freq_scale != 1.0f);
}

struct ops_rope model_rope(const struct model_config *c) {
    struct ops_rope r = ops_rope_plain(c->n_rot, c->rope_base);
    r.attn_factor = c->rope_attn_factor; // llama.cpp applies it whatever the type
    if (c->rope_scaling == MODEL_ROPE_NONE) return r; // ... but never scales the angles
    r.freq_scale = c->rope_freq_scale;
    if (c->rope_scaling == MODEL_ROPE_YARN) {
        r.ext_factor = 1.0f;
        r.n_ctx_orig = c->rope_n_ctx_orig;
    }
    return r;
}

int model_config_from_gguf(struct model_config *cfg, const struct gguf_file *f,
                           struct tpi_error *err) {
    memset(cfg, 0, sizeof *cfg);
    struct gguf_str arch;
    const struct gguf_kv *akv = gguf_find_kv(f, "general.architecture");
    if (akv && akv->type != GGUF_VT_STRING)
        return tpi_err(err, TPI_ERR_FORMAT,
                       "%s: metadata key 'general.architecture' has type %s, expected a string",
                       gguf_path(f), gguf_vtype_name(akv->type));
    if (!gguf_get_str(f, "general.architecture", &arch))
        return tpi_err(err, TPI_ERR_FORMAT, "%s: metadata key 'general.architecture' is missing",
                       gguf_path(f));
    if (arch.len == 5 && !memcmp(arch.data, "qwen2", 5)) {
        cfg->arch = MODEL_ARCH_QWEN2;
        cfg->has_qkv_bias = true;
    } else if (arch.len == 5 && !memcmp(arch.data, "qwen3", 5)) {
        cfg->arch = MODEL_ARCH_QWEN3;
        cfg->has_qk_norm = true;
    } else {
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "%s: architecture '%.*s' is not supported (tpinfer runs dense qwen2 and "
                       "qwen3 models)",
                       gguf_path(f), (int)TPI_MIN(arch.len, 64), arch.data);
    }
    memcpy(cfg->arch_name, arch.data, arch.len);
    const char *a = cfg->arch_name;

    int rc;
    char key[128];
    if ((rc = get_int_key(f, a, "block_count", &cfg->n_layer, true, 0, err)) ||
        (rc = get_int_key(f, a, "embedding_length", &cfg->n_embd, true, 0, err)) ||
        (rc = get_int_key(f, a, "feed_forward_length", &cfg->n_ff, true, 0, err)) ||
        (rc = get_int_key(f, a, "attention.head_count", &cfg->n_head, true, 0, err)) ||
        (rc = get_int_key(f, a, "attention.head_count_kv", &cfg->n_head_kv, false, cfg->n_head,
                          err)) ||
        (rc = get_int_key(f, a, "context_length", &cfg->n_ctx_train, false, 4096, err)))
        return rc;
    // key_length is the real head size: Qwen3 has head_dim 128 with n_embd / n_head = 64
    // for some sizes, so n_embd / n_head is only a fall-back for files without the key.
    snprintf(key, sizeof key, "%s.attention.key_length", a);
    if (!gguf_find_kv(f, key) && cfg->n_embd % cfg->n_head != 0)
        return tpi_err(err, TPI_ERR_FORMAT,
                       "%s: metadata key '%s' is missing and embedding_length %d is not a multiple "
                       "of head_count %d",
                       gguf_path(f), key, cfg->n_embd, cfg->n_head);
    if ((rc = get_int_key(f, a, "attention.key_length", &cfg->head_dim, false,
                          cfg->n_embd / cfg->n_head, err)) ||
        (rc = get_int_key(f, a, "attention.value_length", &cfg->head_dim_v, false, cfg->head_dim,
                          err)) ||
        (rc = get_int_key(f, a, "rope.dimension_count", &cfg->n_rot, false, cfg->head_dim, err)))
        return rc;
    if (cfg->head_dim > MODEL_MAX_HEAD_DIM)
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "%s: a head size of %d (attention.key_length) is above the %d tpinfer "
                       "supports",
                       gguf_path(f), cfg->head_dim, MODEL_MAX_HEAD_DIM);
    if ((rc = get_f32_key(f, a, "rope.freq_base", &cfg->rope_base, false, 10000.0f, 0.0f, true,
                          err)) ||
        (rc = get_f32_key(f, a, "attention.layer_norm_rms_epsilon", &cfg->rms_eps, false, 1e-6f,
                          0.0f, false, err)))
        return rc;

    if ((rc = rope_scaling_from_gguf(cfg, f, a, err))) return rc;

    if (cfg->n_head % cfg->n_head_kv != 0)
        return tpi_err(err, TPI_ERR_FORMAT,
                       "%s: head_count %d is not a multiple of head_count_kv %d", gguf_path(f),
                       cfg->n_head, cfg->n_head_kv);
    if (cfg->head_dim_v != cfg->head_dim)
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "%s: key_length %d != value_length %d is not supported", gguf_path(f),
                       cfg->head_dim, cfg->head_dim_v);
    if (cfg->n_rot > cfg->head_dim || cfg->n_rot % 2 != 0)
        return tpi_err(err, TPI_ERR_FORMAT,
                       "%s: rope.dimension_count %d must be even and at most the head size %d",
                       gguf_path(f), cfg->n_rot, cfg->head_dim);

    const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb)
        return tpi_err(err, TPI_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing",
                       gguf_path(f));
    if (emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX)
        return tpi_err(err, TPI_ERR_FORMAT, "%s: token_embd.weight has %lld rows", gguf_path(f),
                       (long long)emb->ne[1]);
    cfg->n_vocab = (int)emb->ne[1];
    cfg->tied_output = gguf_find_tensor(f, "output.weight") == NULL;
    return check_tensors(cfg, f, err);
}

void model_config_describe(const struct model_config *c, char *buf, size_t n) {
    char scaling[96] = "";
    if (c->rope_scaling == MODEL_ROPE_YARN)
        snprintf(scaling, sizeof scaling, ", yarn x%g from %d", 1.0 / (double)c->rope_freq_scale,
                 c->rope_n_ctx_orig);
    else if (c->rope_scaling == MODEL_ROPE_LINEAR && c->rope_freq_scale != 1.0f)
        snprintf(scaling, sizeof scaling, ", linear x%g", 1.0 / (double)c->rope_freq_scale);
    if (c->rope_attn_factor != 1.0f)
        snprintf(scaling + strlen(scaling), sizeof scaling - strlen(scaling), ", attn factor %g",
                 (double)c->rope_attn_factor);
    snprintf(buf, n,
             "%s: %d layers, n_embd %d, %d/%d heads x %d, n_ff %d, vocab %d, rope base %g%s%s",
             c->arch_name, c->n_layer, c->n_embd, c->n_head, c->n_head_kv, c->head_dim, c->n_ff,
             c->n_vocab, (double)c->rope_base, scaling, c->tied_output ? ", tied output" : "");
}
