/*
 * cmd_info.c — `tpinfer info FILE [--json]`: what a GGUF file holds, in the
 * spirit of gguf-tools' `show`: format facts, architecture, the `<arch>.*`
 * hyperparameters, a tokenizer summary, the remaining metadata and a tensor
 * table. `--json` prints the same as one JSON object for scripts.
 *
 * Opening goes through gguf_open, so a broken file is one line on stderr and
 * exit 1, never a crash. Results go to stdout only.
 */
#define _GNU_SOURCE /* strndup */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "gguf.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "text/json_py.h"

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: tpinfer info [-m] FILE.gguf [--json]\n"
        "\n"
        "Show a GGUF file: format version, architecture, hyperparameters (<arch>.*),\n"
        "tokenizer summary, other metadata, and the tensor table (name, type, shape\n"
        "with ne0 first, bytes, absolute offset in its file). For a split model give\n"
        "the first part (NAME-00001-of-0000N.gguf); every part is opened.\n"
        "\n"
        "  --json   print one JSON object instead:\n"
        "           {\"version\": 3, \"alignment\": 32, \"metadata\": {KEY: VALUE, ...},\n"
        "            \"metadata_types\": {KEY: \"u32\" | \"f32\" | \"string\" | ...},\n"
        "            \"tensors\": [{\"name\", \"type\", \"shape\", \"offset\", \"n_bytes\"}, "
        "...]}\n"
        "           Scalars are JSON numbers/booleans/strings (64-bit integers with all\n"
        "           their digits); every array is shortened to\n"
        "           {\"type\": \"array\", \"item_type\": \"string\", \"n\": 151936}. \"type\" is\n"
        "           ggml's name (Q4_K, BF16), \"shape\" ne0 first, \"offset\" absolute in the\n"
        "           file holding the tensor; split models add \"part\" (0-based).\n"
        "  --tp N --pp M  also show the shard plan of each of the N*M ranks: layers,\n"
        "           heads, KV heads, FFN columns, vocab rows and weight bytes (JSON:\n"
        "           \"shard_plan\": [{\"rank\", \"tp_rank\", \"pp_stage\", ...}])\n"
        "  -h, --help  this text\n"
        "\n"
        "Exit status: 0 ok, 1 the file cannot be read (one line on stderr), 2 usage.\n");
}

/* Options. With --tp/--pp the shard plan of every rank follows the tensor table. */
struct info_opts {
    const char *path;
    bool json;
    int tp, pp; /* 0: no shard plan */
};

/* ---- text output ------------------------------------------------------------- */

/* An F32 as the shortest decimal that reads back as the same float (1e-06,
 * not 9.99999997e-07). */
static double f32_as_short_double(float v) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if ((float)strtod(buf, NULL) == v) break;
    }
    return strtod(buf, NULL);
}

/* Print a string view quoted, escaping non-printables, cut at max_n bytes. */
static void print_str(const char *s, uint64_t len, uint64_t max_n) {
    putchar('"');
    for (uint64_t i = 0; i < len && i < max_n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('"');
    if (len > max_n) printf("... (%" PRIu64 " bytes)", len);
}

/* A key or tensor name from the file, its control bytes escaped as print_str escapes
 * them (a name cannot start a line of its own), padded to width columns. */
static void print_name(const char *s, size_t len, int width) {
    int n = 0;
    for (size_t i = 0; i < len && i < 200; i++) {
        unsigned char c = (unsigned char)s[i];
        n += c < 0x20 || c == 0x7f ? printf("\\x%02x", c) : (putchar(c), 1);
    }
    if (len > 200) n += printf("...");
    for (; n < width; n++) putchar(' ');
}

/* A float as gguf-dump (Python) shows one: the shortest digits, 1000000.0 not 1000000;
 * nan and inf as C prints them. */
static void print_float(double v) {
    if (!isfinite(v)) {
        printf("%g", v);
        return;
    }
    struct json_buf b = {0};
    json_py_put_float(&b, v);
    fputs(b.p && !b.failed ? b.p : "?", stdout);
    free(b.p);
}

static void print_scalar(enum gguf_vtype t, const uint8_t *p) {
    float f32;
    double f64;
    int64_t i64;
    uint64_t u64;
    switch (t) {
    case GGUF_VT_F32:
        memcpy(&f32, p, 4);
        print_float(f32_as_short_double(f32));
        break;
    case GGUF_VT_F64:
        memcpy(&f64, p, 8);
        print_float(f64);
        break;
    case GGUF_VT_BOOL:
        fputs(p[0] ? "true" : "false", stdout);
        break;
    case GGUF_VT_U64:
        memcpy(&u64, p, 8);
        printf("%" PRIu64, u64);
        break;
    default: {
        /* gguf_arr_int's scalar path: build a one-item view to reuse it. */
        struct gguf_kv one = {.type = GGUF_VT_ARRAY, .arr_type = t, .arr_n = 1, .data = p};
        if (gguf_arr_int(&one, 0, &i64))
            printf("%" PRId64, i64);
        else
            fputs("?", stdout);
    }
    }
}

/* One metadata value: scalars in full, strings cut at 120 bytes, arrays as their
 * type and length plus the first few numeric items. */
static void print_value(const struct gguf_kv *kv) {
    if (kv->type == GGUF_VT_STRING) {
        print_str((const char *)kv->data, kv->str_len, 120);
    } else if (kv->type == GGUF_VT_ARRAY) {
        printf("[%s x %" PRIu64 "]", gguf_vtype_name(kv->arr_type), kv->arr_n);
        if (kv->arr_type != GGUF_VT_STRING && kv->arr_type != GGUF_VT_ARRAY && kv->arr_n > 0) {
            double v;
            fputs(" {", stdout);
            for (uint64_t i = 0; i < kv->arr_n && i < 8; i++)
                if (gguf_arr_f64(kv, i, &v)) printf("%s%.9g", i ? ", " : "", v);
            fputs(kv->arr_n > 8 ? ", ...}" : "}", stdout);
        }
    } else {
        print_scalar(kv->type, kv->data);
    }
}

static bool has_prefix(const struct gguf_kv *kv, const char *prefix) {
    size_t n = strlen(prefix);
    return kv->key.len >= n && !memcmp(kv->key.data, prefix, n);
}

static void print_kv_line(const struct gguf_kv *kv) {
    fputs("  ", stdout);
    print_name(kv->key.data, (size_t)kv->key.len, 44);
    fputs(" = ", stdout);
    print_value(kv);
    putchar('\n');
}

/* Tokenizer: model, pre, vocabulary and merges counts, special token ids with
 * their text. */
static void print_tokenizer(const struct gguf_file *f) {
    struct gguf_str s;
    const struct gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const struct gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!gguf_find_kv(f, "tokenizer.ggml.model") && !tokens) return;
    printf("tokenizer:\n");
    if (gguf_get_str(f, "tokenizer.ggml.model", &s))
        printf("  model %.*s", (int)TPI_MIN(s.len, 200), s.data);
    if (gguf_get_str(f, "tokenizer.ggml.pre", &s))
        printf(", pre %.*s", (int)TPI_MIN(s.len, 200), s.data);
    if (tokens && tokens->type == GGUF_VT_ARRAY) printf(", %" PRIu64 " tokens", tokens->arr_n);
    if (merges && merges->type == GGUF_VT_ARRAY) printf(", %" PRIu64 " merges", merges->arr_n);
    putchar('\n');
    struct gguf_str *strs = NULL;
    uint64_t n_strs = 0;
    if (tokens && gguf_arr_strings(tokens, &strs, &n_strs, NULL) != TPI_OK) strs = NULL;
    static const char suffix[] = "_token_id";
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        size_t n = kv->key.len, sn = sizeof suffix - 1;
        int64_t id;
        if (!has_prefix(kv, "tokenizer.ggml.") || n < sn + 15 ||
            memcmp(kv->key.data + n - sn, suffix, sn) != 0)
            continue;
        printf("  %-12.*s ", (int)(n - sn - 15), kv->key.data + 15);
        if (!gguf_arr_int(
                &(struct gguf_kv){
                    .type = GGUF_VT_ARRAY, .arr_type = kv->type, .arr_n = 1, .data = kv->data},
                0, &id)) {
            print_value(kv);
        } else {
            printf("%" PRId64, id);
            if (strs && id >= 0 && (uint64_t)id < n_strs) {
                putchar(' ');
                print_str(strs[id].data, strs[id].len, 60);
            }
        }
        putchar('\n');
    }
    bool add;
    if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add))
        printf("  add_bos      %s\n", add ? "true" : "false");
    if (gguf_get_str(f, "tokenizer.chat_template", &s))
        printf("  chat_template (%" PRIu64 " bytes)\n", s.len);
    free(strs);
}

static void format_shape(const struct gguf_tensor *t, char *buf, size_t n) {
    size_t off = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->n_dims && off < n; d++)
        off += (size_t)snprintf(buf + off, n - off, "%s%" PRId64, d ? ", " : "", t->ne[d]);
    if (off < n) snprintf(buf + off, n - off, "]");
}

static void print_text(const struct gguf_file *f) {
    struct gguf_str arch = {0, ""};
    bool has_arch = gguf_get_str(f, "general.architecture", &arch);
    printf("%s: GGUF v%u, %d part%s, %" PRIu64 " bytes, alignment %" PRIu64 ", %" PRId64
           " metadata keys, %" PRId64 " tensors\n",
           gguf_path(f), gguf_version(f), gguf_n_parts(f), gguf_n_parts(f) == 1 ? "" : "s",
           gguf_total_size(f), gguf_alignment(f), gguf_n_kv(f), gguf_n_tensors(f));
    printf("architecture: %.*s\n", has_arch ? (int)TPI_MIN(arch.len, 200) : 1,
           has_arch ? arch.data : "?");

    /* "<arch>." prefix, the hyperparameters. */
    char prefix[256] = "";
    if (has_arch && arch.len < 200)
        snprintf(prefix, sizeof prefix, "%.*s.", (int)arch.len, arch.data);
    if (prefix[0]) {
        printf("hyperparameters:\n");
        for (int64_t i = 0; i < gguf_n_kv(f); i++)
            if (has_prefix(gguf_kv_at(f, i), prefix)) print_kv_line(gguf_kv_at(f, i));
    }
    print_tokenizer(f);
    printf("metadata:\n");
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if ((prefix[0] && has_prefix(kv, prefix))) continue;
        print_kv_line(kv);
    }

    uint64_t total = 0;
    int name_w = 4;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        total += t->n_bytes;
        name_w = TPI_MAX(name_w, (int)TPI_MIN(strlen(t->name), 64));
    }
    printf("tensors: %" PRId64 ", %" PRIu64 " bytes", gguf_n_tensors(f), total);
    bool any_unsupported = false;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct quant_traits *tr = quant_traits(gguf_tensor_at(f, i)->type);
        if (tr && !tr->supported) any_unsupported = true;
    }
    printf("%s\n", any_unsupported ? " (types marked * cannot be computed by tpinfer)" : "");
    bool split = gguf_n_parts(f) > 1;
    printf("  %5s  %-*s  %-8s  %-22s  %12s  %12s%s\n", "#", name_w, "name", "type", "shape",
           "bytes", "offset", split ? "  part" : "");
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        const struct quant_traits *tr = quant_traits(t->type);
        char shape[128], type[32];
        format_shape(t, shape, sizeof shape);
        snprintf(type, sizeof type, "%s%s", quant_type_name(t->type),
                 tr && !tr->supported ? "*" : "");
        printf("  %5" PRId64 "  ", i);
        print_name(t->name, strlen(t->name), name_w);
        printf("  %-8s  %-22s  %12" PRIu64 "  %12" PRIu64, type, shape, t->n_bytes, t->offset);
        if (split) printf("  %4d", t->part + 1);
        putchar('\n');
    }
}

/* ---- JSON output ------------------------------------------------------------------ */

static cJSON *json_value(const struct gguf_kv *kv) {
    if (kv->type == GGUF_VT_STRING) { // valid UTF-8 (U+FFFD for broken bytes), NULs kept
        size_t n = 0;
        char *s = tpi_utf8_fix((const char *)kv->data, (size_t)kv->str_len, &n);
        cJSON *j = s ? tpi_json_text(s, n) : NULL;
        free(s);
        return j;
    }
    if (kv->type == GGUF_VT_ARRAY) {
        cJSON *j = cJSON_CreateObject();
        if (!j) return NULL;
        cJSON_AddStringToObject(j, "type", "array");
        cJSON_AddStringToObject(j, "item_type", gguf_vtype_name(kv->arr_type));
        cJSON_AddNumberToObject(j, "n", (double)kv->arr_n);
        return j;
    }
    if (kv->type == GGUF_VT_BOOL) return cJSON_CreateBool(kv->data[0] != 0);
    if (kv->type == GGUF_VT_F32) {
        float v;
        memcpy(&v, kv->data, 4);
        return cJSON_CreateNumber(f32_as_short_double(v));
    }
    struct gguf_kv one = {
        .type = GGUF_VT_ARRAY, .arr_type = kv->type, .arr_n = 1, .data = kv->data};
    double v = 0;
    gguf_arr_f64(&one, 0, &v);
    if (kv->type == GGUF_VT_U64 || kv->type == GGUF_VT_I64) { // past 2^53 a double rounds
        char buf[32];
        uint64_t u;
        memcpy(&u, kv->data, 8);
        if (kv->type == GGUF_VT_U64) snprintf(buf, sizeof buf, "%" PRIu64, u);
        else snprintf(buf, sizeof buf, "%" PRId64, (int64_t)u);
        return cJSON_CreateRaw(buf); // the exact digits
    }
    return cJSON_CreateNumber(v);
}

static int print_json(const struct gguf_file *f, cJSON *plan) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject(),
          *types = cJSON_CreateObject(), *tensors = cJSON_CreateArray();
    if (!root || !meta || !types || !tensors) {
        cJSON_Delete(types);
        goto oom;
    }
    cJSON_AddNumberToObject(root, "version", gguf_version(f));
    cJSON_AddNumberToObject(root, "alignment", (double)gguf_alignment(f));
    cJSON_AddItemToObject(root, "metadata", meta);
    cJSON_AddItemToObject(root, "metadata_types", types);
    cJSON_AddItemToObject(root, "tensors", tensors);
    if (plan) cJSON_AddItemToObject(root, "shard_plan", plan);
    plan = NULL;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        size_t n_key = 0;
        char *key = tpi_utf8_fix(kv->key.data, (size_t)kv->key.len, &n_key); // keys hold no NUL
        cJSON *v = json_value(kv);
        if (!key || !v) {
            free(key);
            cJSON_Delete(v);
            goto oom;
        }
        cJSON_AddItemToObject(meta, key, v);
        cJSON_AddStringToObject(types, key, gguf_vtype_name(kv->type));
        free(key);
    }
    bool split = gguf_n_parts(f) > 1;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        cJSON *jt = cJSON_CreateObject(), *shape = cJSON_CreateArray();
        if (!jt || !shape) {
            cJSON_Delete(jt);
            cJSON_Delete(shape);
            goto oom;
        }
        cJSON_AddItemToArray(tensors, jt);
        size_t n_name = 0;
        char *name = tpi_utf8_fix(t->name, strlen(t->name), &n_name);
        if (!name) goto oom;
        cJSON_AddStringToObject(jt, "name", name);
        free(name);
        cJSON_AddStringToObject(jt, "type", quant_type_name(t->type));
        for (int d = 0; d < t->n_dims; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->ne[d]));
        cJSON_AddItemToObject(jt, "shape", shape);
        cJSON_AddNumberToObject(jt, "offset", (double)t->offset);
        cJSON_AddNumberToObject(jt, "n_bytes", (double)t->n_bytes);
        if (split) cJSON_AddNumberToObject(jt, "part", t->part);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) goto oom_printed;
    puts(text);
    free(text);
    return 0;
oom:
    cJSON_Delete(root);
    cJSON_Delete(plan);
oom_printed:
    fprintf(stderr, "tpinfer info: %s: out of memory building JSON\n", gguf_path(f));
    return 1;
}

/* ---- shard plan --------------------------------------------------------------------- */

/* Plan of every rank under tp x pp, in text or as a JSON array (returned, or NULL on
 * error with err set). Bytes come from the loader's own counting pass. */
static int shard_plan(const struct gguf_file *f, int tp, int pp, bool json, cJSON **arr_out,
                      struct tpi_error *err) {
    struct model_config cfg;
    int rc = model_config_from_gguf(&cfg, f, err);
    if (rc) return rc;
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!json)
        printf("\nshard plan: tp %d x pp %d (%d ranks)\n%5s %3s %5s %9s %9s %9s %13s %15s %12s %10s\n",
               tp, pp, tp * pp, "rank", "tp", "stage", "layers", "heads", "kv heads",
               "ffn cols", "vocab rows", "weights", "f32 slices");
    double gpu_mib_max = 0; /* the most any rank holds on a GPU, when that differs */
    for (int r = 0; r < tp * pp && !rc; r++) {
        struct model_plan plan;
        struct model_weights w;
        rc = model_plan_make(&plan, &cfg, tp, pp, r % tp, r / tp, NULL, 0, err);
        if (!rc) rc = model_weights_count(f, &cfg, &plan, &w, err);
        if (rc) break;
        int l1 = plan.layer0 + plan.n_layer_stage;
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToArray(arr, o);
            cJSON_AddNumberToObject(o, "rank", r);
            cJSON_AddNumberToObject(o, "tp_rank", plan.tp_rank);
            cJSON_AddNumberToObject(o, "pp_stage", plan.pp_stage);
            cJSON_AddNumberToObject(o, "layer0", plan.layer0);
            cJSON_AddNumberToObject(o, "n_layer", plan.n_layer_stage);
            cJSON_AddNumberToObject(o, "head0", plan.head0);
            cJSON_AddNumberToObject(o, "n_head", plan.n_head_local);
            cJSON_AddNumberToObject(o, "kv_head0", plan.kv_head0);
            cJSON_AddNumberToObject(o, "n_kv_head", plan.n_kv_local);
            cJSON_AddBoolToObject(o, "kv_replicated", plan.kv_replicated);
            cJSON_AddNumberToObject(o, "ff0", plan.ff0);
            cJSON_AddNumberToObject(o, "n_ff", plan.n_ff_local);
            cJSON_AddNumberToObject(o, "vocab0", plan.is_last ? plan.vocab0 : 0);
            cJSON_AddNumberToObject(o, "n_vocab", plan.is_last ? plan.n_vocab_local : 0);
            cJSON_AddNumberToObject(o, "weight_bytes", (double)w.n_bytes);
            cJSON_AddNumberToObject(o, "weight_bytes_gpu", (double)w.n_bytes_gpu);
            cJSON_AddNumberToObject(o, "replicated_bytes", (double)w.n_bytes_replicated);
            cJSON_AddNumberToObject(o, "f32_slices", w.n_expanded_f32);
        } else {
            char layers[32], heads[32], kv[32], ff[32], vocab[32];
            snprintf(layers, sizeof layers, "%d-%d", plan.layer0, l1 - 1);
            snprintf(heads, sizeof heads, "%d-%d", plan.head0, plan.head0 + plan.n_head_local - 1);
            snprintf(kv, sizeof kv, "%d-%d%s", plan.kv_head0, plan.kv_head0 + plan.n_kv_local - 1,
                     plan.kv_replicated ? "*" : "");
            snprintf(ff, sizeof ff, "%d-%d", plan.ff0, plan.ff0 + plan.n_ff_local - 1);
            if (plan.is_last)
                snprintf(vocab, sizeof vocab, "%d-%d", plan.vocab0,
                         plan.vocab0 + plan.n_vocab_local - 1);
            else
                snprintf(vocab, sizeof vocab, "-");
            printf("%5d %3d %5d %9s %9s %9s %13s %15s %8.1f MiB %10d\n", r, plan.tp_rank,
                   plan.pp_stage, layers, heads, kv, ff, vocab, (double)w.n_bytes / 1048576.0,
                   w.n_expanded_f32);
            if (w.n_bytes_gpu != w.n_bytes && w.n_bytes_gpu / 1048576.0 > gpu_mib_max)
                gpu_mib_max = w.n_bytes_gpu / 1048576.0;
        }
    }
    if (!json && !rc)
        printf("(* KV head replicated on several ranks; f32 slices: row-parallel slices off the\n"
               " type's block edge, expanded to F32 exactly)\n");
    if (!json && !rc && gpu_mib_max > 0)
        printf("(on CUDA, up to %.1f MiB a rank: TPI_HOLD=1 holds Q3_K and IQ4 weights as\n"
               " Q6_K and Q8_0)\n",
               gpu_mib_max);
    if (rc) cJSON_Delete(arr);
    else if (arr_out) *arr_out = arr;
    return rc;
}

/* ---- entry -------------------------------------------------------------------------- */

int cmd_info(int argc, char **argv) {
    struct info_opts o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            o.json = true;
        } else if (!strcmp(a, "--tp") || !strcmp(a, "--pp")) {
            char *end = NULL;
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || *end || v < 1 || v > 4096) {
                fprintf(stderr, "tpinfer info: %s expects a positive integer\n", a);
                return 2;
            }
            *(a[2] == 't' ? &o.tp : &o.pp) = (int)v;
            i++;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc && !o.path) {
            o.path = argv[++i]; // as the other commands name the model
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 >= argc) {
            fprintf(stderr, "tpinfer info: %s needs a value (the GGUF file)\n", a);
            return 2;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "tpinfer info: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!o.path) {
            o.path = a;
        } else {
            fprintf(stderr, "tpinfer info: more than one file given ('%s', '%s')\n", o.path, a);
            return 2;
        }
    }
    if (!o.path) {
        usage(stderr);
        return 2;
    }
    struct gguf_file *f = NULL;
    struct tpi_error err;
    tpi_err_clear(&err);
    if (gguf_open(o.path, &f, &err) != TPI_OK) {
        fprintf(stderr, "tpinfer info: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    cJSON *plan = NULL;
    if (o.tp || o.pp) {
        // The plan is checked before printing anything, so an impossible split is one
        // clear error (e.g. heads not divisible by tp) and no half-written output.
        if (!o.tp) o.tp = 1;
        if (!o.pp) o.pp = 1;
        if (!o.json) {
            FILE *null = fopen("/dev/null", "w");
            FILE *keep = stdout;
            stdout = null ? null : stdout;
            rc = shard_plan(f, o.tp, o.pp, false, NULL, &err);
            stdout = keep;
            if (null) fclose(null);
        } else {
            rc = shard_plan(f, o.tp, o.pp, true, &plan, &err);
        }
        if (rc) {
            // The config's errors name the file already; the plan's do not.
            const size_t n = strlen(o.path);
            const bool named = !strncmp(err.msg, o.path, n) && err.msg[n] == ':';
            fprintf(stderr, "tpinfer info: %s%s%s\n", named ? "" : o.path, named ? "" : ": ",
                    err.msg);
            gguf_close(&f);
            return 1;
        }
    }
    if (o.json) {
        rc = print_json(f, plan);
    } else {
        print_text(f);
        if (o.tp) shard_plan(f, o.tp, o.pp, false, NULL, &err);
    }
    gguf_close(&f);
    return rc; /* main checks that stdout took it all */
}
