/*
 * tokenizer.c — byte-level BPE with the qwen2 pre-tokenizer (see tokenizer.h).
 *
 * Layout: token strings live in one pool with a string->id hash; merges live in
 * a hash from the id pair (left, right) to (rank, merged id), so BPE never
 * builds strings at encode time — a word starts as one byte-token per byte and
 * merges ids. The merge loop is the lowest-rank-first, leftmost-on-ties order
 * of Hugging Face's BPE, run with a binary heap and lazy invalidation so a
 * pathological word (a megabyte of one letter) costs O(n log n), not O(n^2).
 * Nothing is cached across calls: memory stays bounded by the input.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "gguf.h"

/* The qwen2 pre-tokenizer of tokenizer.json:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
 *   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * run as written except that \s is spelled out as the Unicode White_Space set
 * (and \S as its complement). PCRE2's \s under UCP also matches U+180E
 * MONGOLIAN VOWEL SEPARATOR, which left White_Space in Unicode 6.3; Hugging
 * Face's regex does not, and a differential run of random strings against HF
 * disagreed only there. */
#define WS                                                                                         \
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"       \
    "\\x{202F}\\x{205F}\\x{3000}"
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";
#undef WS

struct merge_slot {
    uint64_t key;   /* (left << 32) | right */
    int32_t rank;   /* -1: empty slot */
    int32_t result; /* id of left+right */
};

struct tokenizer {
    int32_t n_vocab;
    char *str_pool;      /* stored strings, each NUL-terminated */
    size_t *str_off;     /* (n_vocab) */
    uint32_t *str_len;   /* (n_vocab) */
    char *bytes_pool;    /* decoded bytes of every token */
    size_t *bytes_off;   /* (n_vocab) */
    uint32_t *bytes_len; /* (n_vocab) */
    uint8_t *types;      /* (n_vocab) enum tok_type */

    int32_t *str_hash; /* open addressing, -1 empty; (str_mask + 1) */
    uint64_t str_mask;
    struct merge_slot *merges; /* (merge_mask + 1) */
    uint64_t merge_mask;

    int32_t byte_id[256]; /* token of each raw byte (its byte-level char) */

    int32_t *specials; /* added tokens, longest first; (n_specials) */
    int n_specials;
    bool special_first[256]; /* some added token starts with this byte */

    pcre2_code *re;

    int32_t bos, eos, pad;
    int32_t eog[TOK_MAX_EOG]; /* end-of-generation ids, each once (n_eog) */
    int n_eog;
    bool add_bos;
    char *chat_template;
};

/* ---- GPT-2 byte <-> unicode ------------------------------------------------
 * Printable Latin-1 bytes map to themselves; the other 68 bytes (controls,
 * space, 0x7f-0xa0, soft hyphen) map in order to U+0100.. so every byte has a
 * visible, non-space character and the vocabulary stores plain strings. */
static uint32_t byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return (uint32_t)b;
    int n = 0; /* rank of b among the remapped bytes */
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256u + (uint32_t)n;
}

/* Inverse table over code points 0..323; -1 for code points no byte maps to. */
static void build_cp_to_byte(int16_t table[324]) {
    for (int i = 0; i < 324; i++)
        table[i] = -1;
    for (int b = 0; b < 256; b++)
        table[byte_to_cp(b)] = (int16_t)b;
}

static size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Offset of the first invalid UTF-8 sequence in s[0..n), or n when valid;
 * *ascii says whether every byte is < 0x80 (then NFC is the identity). */
static size_t utf8_check(const char *s, size_t n, bool *ascii) {
    size_t i = 0;
    *ascii = true;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        *ascii = false;
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp < 0) return i;
        i += (size_t)k;
    }
    return n;
}

/* ---- hashes ---------------------------------------------------------------- */

static uint64_t str_hash(const char *s, size_t n) {
    return tpi_fnv1a(TPI_FNV_INIT, s, n);
}

static uint64_t pair_hash(uint64_t key) {
    /* splitmix64 finalizer: ids are small and dense, so mix before masking */
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ULL;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebULL;
    key ^= key >> 31;
    return key;
}

static int32_t lookup_str(const struct tokenizer *t, const char *s, size_t n) {
    for (uint64_t h = str_hash(s, n) & t->str_mask;; h = (h + 1) & t->str_mask) {
        int32_t id = t->str_hash[h];
        if (id < 0) return -1;
        if (t->str_len[id] == n && memcmp(t->str_pool + t->str_off[id], s, n) == 0) return id;
    }
}

static const struct merge_slot *lookup_pair(const struct tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint64_t h = pair_hash(key) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        const struct merge_slot *m = &t->merges[h];
        if (m->rank < 0) return NULL;
        if (m->key == key) return m;
    }
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* ---- construction ----------------------------------------------------------- */

/* Added-token order for matching: longest first, so the first hit at a position
 * is the longest; ties by id to keep the order deterministic. */
static bool special_before(const struct tokenizer *t, int32_t a, int32_t b) {
    if (t->str_len[a] != t->str_len[b]) return t->str_len[a] > t->str_len[b];
    return a < b;
}

/* Insertion sort: there are a few dozen added tokens, and qsort has no context. */
static void sort_specials(struct tokenizer *t) {
    for (int i = 1; i < t->n_specials; i++) {
        int32_t v = t->specials[i];
        int j = i - 1;
        while (j >= 0 && special_before(t, v, t->specials[j])) {
            t->specials[j + 1] = t->specials[j];
            j--;
        }
        t->specials[j + 1] = v;
    }
}

int tok_init_from_arrays(const struct tok_vocab_spec *spec, struct tokenizer **out,
                         struct tpi_error *err) {
    *out = NULL;
    const char *src = spec->source ? spec->source : "tokenizer";
    if (spec->n_tokens <= 0 || !spec->tokens)
        return tpi_err(err, TPI_ERR_FORMAT, "%s: empty vocabulary", src);
    if (spec->pre && strcmp(spec->pre, "qwen2") != 0)
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.pre '%s' is not supported (only 'qwen2')", src,
                       spec->pre);
    if (spec->n_merges < 0 || (spec->n_merges > 0 && !spec->merges))
        return tpi_err(err, TPI_ERR_INVALID, "%s: bad merges array", src);

    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", src);
    int n = spec->n_tokens;
    t->n_vocab = n;
    int rc = TPI_OK;

    /* strings: one pool, sized first */
    size_t pool_bytes = 0;
    for (int i = 0; i < n; i++) {
        if (!spec->tokens[i].data && spec->tokens[i].len) {
            rc = tpi_err(err, TPI_ERR_FORMAT, "%s: token %d has no data", src, i);
            goto fail;
        }
        if (spec->tokens[i].len > UINT32_MAX / 2) {
            rc = tpi_err(err, TPI_ERR_FORMAT, "%s: token %d is too long", src, i);
            goto fail;
        }
        pool_bytes += spec->tokens[i].len + 1;
    }
    t->str_pool = malloc(pool_bytes);
    t->bytes_pool = malloc(pool_bytes); /* decoded form is never longer */
    t->str_off = malloc((size_t)n * sizeof *t->str_off);
    t->bytes_off = malloc((size_t)n * sizeof *t->bytes_off);
    t->str_len = malloc((size_t)n * sizeof *t->str_len);
    t->bytes_len = malloc((size_t)n * sizeof *t->bytes_len);
    t->types = malloc((size_t)n);
    t->str_mask = pow2_at_least((uint64_t)n * 2) - 1;
    t->str_hash = malloc((t->str_mask + 1) * sizeof *t->str_hash);
    if (!t->str_pool || !t->bytes_pool || !t->str_off || !t->bytes_off || !t->str_len ||
        !t->bytes_len || !t->types || !t->str_hash) {
        rc = tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory for %d tokens", src, n);
        goto fail;
    }
    memset(t->str_hash, 0xff, (t->str_mask + 1) * sizeof *t->str_hash);

    int16_t cp_to_byte[324];
    build_cp_to_byte(cp_to_byte);
    size_t off = 0, boff = 0;
    for (int i = 0; i < n; i++) {
        const char *s = spec->tokens[i].data;
        size_t len = spec->tokens[i].len;
        int type = spec->types ? spec->types[i] : TOK_TYPE_NORMAL;
        if (type < 0 || type > TOK_TYPE_BYTE) type = TOK_TYPE_UNDEFINED;
        t->types[i] = (uint8_t)type;
        if (len) memcpy(t->str_pool + off, s, len);
        t->str_pool[off + len] = '\0';
        t->str_off[i] = off;
        t->str_len[i] = (uint32_t)len;
        off += len + 1;

        /* decoded bytes: added tokens are literal text; everything else is the
         * byte-level alphabet, with the raw string as fallback when a char is
         * outside it (as HF's ByteLevel decoder does) */
        char *dst = t->bytes_pool + boff;
        size_t nb = 0;
        bool literal = type == TOK_TYPE_CONTROL || type == TOK_TYPE_USER_DEFINED;
        if (!literal) {
            size_t j = 0;
            while (j < len) {
                utf8proc_int32_t cp;
                utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + j,
                                                      (utf8proc_ssize_t)(len - j), &cp);
                if (k <= 0 || cp < 0 || cp >= 324 || cp_to_byte[cp] < 0) {
                    literal = true;
                    break;
                }
                dst[nb++] = (char)cp_to_byte[cp];
                j += (size_t)k;
            }
        }
        if (literal) {
            if (len) memcpy(dst, s, len);
            nb = len;
        }
        t->bytes_off[i] = boff;
        t->bytes_len[i] = (uint32_t)nb;
        boff += nb;

        /* first id wins on a duplicate string, so lookups are stable */
        if (lookup_str(t, s ? s : "", len) < 0) {
            uint64_t h = str_hash(s ? s : "", len) & t->str_mask;
            while (t->str_hash[h] >= 0)
                h = (h + 1) & t->str_mask;
            t->str_hash[h] = i;
        }
    }

    /* every byte must have a token, or some input could not be encoded */
    for (int b = 0; b < 256; b++) {
        char buf[4];
        size_t k = utf8_put(byte_to_cp(b), buf);
        t->byte_id[b] = lookup_str(t, buf, k);
        if (t->byte_id[b] < 0) {
            rc = tpi_err(err, TPI_ERR_FORMAT,
                         "%s: vocabulary has no token for byte 0x%02x ('%.*s'); not a "
                         "byte-level BPE vocabulary",
                         src, b, (int)k, buf);
            goto fail;
        }
    }

    /* merges: pair of ids -> (rank, merged id) */
    t->merge_mask = pow2_at_least((uint64_t)spec->n_merges * 2 + 1) - 1;
    t->merges = malloc((t->merge_mask + 1) * sizeof *t->merges);
    if (!t->merges) {
        rc = tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory for %d merges", src, spec->n_merges);
        goto fail;
    }
    for (uint64_t i = 0; i <= t->merge_mask; i++)
        t->merges[i].rank = -1;
    char *cat = NULL;
    size_t cat_cap = 0;
    int n_skipped = 0;
    for (int r = 0; r < spec->n_merges; r++) {
        const char *m = spec->merges[r].data;
        size_t len = spec->merges[r].len;
        /* split at the first space after position 0: byte-level strings never
         * contain a space (it is stored as 'Ġ') */
        const char *sp = len > 1 && m ? memchr(m + 1, ' ', len - 1) : NULL;
        if (!sp) {
            free(cat);
            rc = tpi_err(err, TPI_ERR_FORMAT, "%s: merge %d '%.*s' has no space", src, r,
                         (int)TPI_MIN(len, 64), m ? m : "");
            goto fail;
        }
        size_t la = (size_t)(sp - m), lb = len - la - 1;
        int32_t a = lookup_str(t, m, la), b = lookup_str(t, sp + 1, lb);
        if (la + lb > cat_cap) {
            cat_cap = (la + lb) * 2;
            char *p = realloc(cat, cat_cap);
            if (!p) {
                free(cat);
                rc = tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", src);
                goto fail;
            }
            cat = p;
        }
        memcpy(cat, m, la);
        memcpy(cat + la, sp + 1, lb);
        int32_t ab = (a >= 0 && b >= 0) ? lookup_str(t, cat, la + lb) : -1;
        if (ab < 0) {
            n_skipped++; /* a merge whose parts or result are not tokens cannot fire */
            continue;
        }
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        uint64_t h = pair_hash(key) & t->merge_mask;
        while (t->merges[h].rank >= 0 && t->merges[h].key != key)
            h = (h + 1) & t->merge_mask;
        if (t->merges[h].rank < 0) { /* a repeated pair keeps its first (best) rank */
            t->merges[h].key = key;
            t->merges[h].rank = r;
            t->merges[h].result = ab;
        }
    }
    free(cat);
    if (n_skipped) TPI_LOGD("%s: %d merges name strings outside the vocabulary", src, n_skipped);

    /* added tokens, split out of the text before BPE */
    for (int i = 0; i < n; i++)
        if ((t->types[i] == TOK_TYPE_CONTROL || t->types[i] == TOK_TYPE_USER_DEFINED) &&
            t->str_len[i] > 0)
            t->n_specials++;
    t->specials = malloc((size_t)(t->n_specials ? t->n_specials : 1) * sizeof *t->specials);
    if (!t->specials) {
        rc = tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", src);
        goto fail;
    }
    t->n_specials = 0;
    for (int i = 0; i < n; i++)
        if ((t->types[i] == TOK_TYPE_CONTROL || t->types[i] == TOK_TYPE_USER_DEFINED) &&
            t->str_len[i] > 0) {
            t->specials[t->n_specials++] = i;
            t->special_first[(unsigned char)t->str_pool[t->str_off[i]]] = true;
        }
    sort_specials(t);

    /* the pre-tokenizer regex; JIT when available (the interpreter is the fallback) */
    int re_err;
    PCRE2_SIZE re_off;
    t->re = pcre2_compile((PCRE2_SPTR)QWEN2_REGEX, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &re_err, &re_off, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(re_err, msg, sizeof msg);
        rc = tpi_err(err, TPI_ERR_UNSUPPORTED, "%s: qwen2 regex does not compile at %zu: %s", src,
                     (size_t)re_off, (const char *)msg);
        goto fail;
    }
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);

    /* special ids */
    int32_t ids[3] = {spec->bos_id, spec->eos_id, spec->pad_id};
    const char *names[3] = {"bos_token_id", "eos_token_id", "padding_token_id"};
    for (int k = 0; k < 3; k++)
        if (ids[k] >= n) {
            rc = tpi_err(err, TPI_ERR_FORMAT,
                         "%s: tokenizer.ggml.%s = %d is outside the vocabulary (%d)", src, names[k],
                         ids[k], n);
            goto fail;
        }
    t->bos = spec->bos_id < 0 ? -1 : spec->bos_id;
    t->eos = spec->eos_id < 0 ? -1 : spec->eos_id;
    t->pad = spec->pad_id < 0 ? -1 : spec->pad_id;
    t->add_bos = spec->add_bos && t->bos >= 0;
    // llama.cpp's end-of-generation set (llama-vocab.cpp): EOS, EOT, EOM and these names.
    static const char *const eog_names[] = {
        "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
        "<|end_of_text|>", "<EOT>", "<|return|>", "<|call|>", "<|fim_pad|>", "<|repo_name|>",
        "<|file_sep|>"};
    int32_t cand[3 + sizeof eog_names / sizeof eog_names[0]];
    int n_cand = 0;
    cand[n_cand++] = t->eos;
    cand[n_cand++] = spec->eot_id > 0 && spec->eot_id < n ? spec->eot_id : -1;
    cand[n_cand++] = spec->eom_id > 0 && spec->eom_id < n ? spec->eom_id : -1;
    for (size_t k = 0; k < sizeof eog_names / sizeof eog_names[0]; k++)
        cand[n_cand++] = lookup_str(t, eog_names[k], strlen(eog_names[k]));
    for (int k = 0; k < n_cand && t->n_eog < TOK_MAX_EOG; k++) {
        bool seen = cand[k] < 0;
        for (int j = 0; j < t->n_eog; j++) seen |= t->eog[j] == cand[k];
        if (!seen) t->eog[t->n_eog++] = cand[k];
    }

    if (spec->chat_template) {
        t->chat_template = malloc(spec->chat_template_len + 1);
        if (!t->chat_template) {
            rc = tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", src);
            goto fail;
        }
        memcpy(t->chat_template, spec->chat_template, spec->chat_template_len);
        t->chat_template[spec->chat_template_len] = '\0';
    }
    *out = t;
    return TPI_OK;

fail:
    tok_free(&t);
    return rc;
}

void tok_free(struct tokenizer **pt) {
    if (!pt || !*pt) return;
    struct tokenizer *t = *pt;
    free(t->str_pool);
    free(t->bytes_pool);
    free(t->str_off);
    free(t->bytes_off);
    free(t->str_len);
    free(t->bytes_len);
    free(t->types);
    free(t->str_hash);
    free(t->merges);
    free(t->specials);
    if (t->re) pcre2_code_free(t->re);
    free(t->chat_template);
    free(t);
    *pt = NULL;
}

/* ---- GGUF ------------------------------------------------------------------- */

/* NUL-terminated copy of a GGUF string view (NULL on OOM). */
static char *dup_gstr(struct gguf_str s) {
    char *p = malloc(s.len + 1);
    if (p) {
        if (s.len) memcpy(p, s.data, s.len);
        p[s.len] = '\0';
    }
    return p;
}

int tok_load(const struct gguf_file *f, struct tokenizer **out, struct tpi_error *err) {
    *out = NULL;
    const char *path = gguf_path(f);
    struct gguf_str model, pre_s, tmpl;
    if (!gguf_get_str(f, "tokenizer.ggml.model", &model))
        return tpi_err(err, TPI_ERR_FORMAT,
                       "%s: no tokenizer.ggml.model (not a model with a vocabulary?)", path);
    if (model.len != 4 || memcmp(model.data, "gpt2", 4) != 0)
        return tpi_err(
            err, TPI_ERR_UNSUPPORTED,
            "%s: tokenizer.ggml.model '%.*s' is not supported (only 'gpt2' byte-level BPE)", path,
            (int)TPI_MIN(model.len, 64), model.data);
    char *pre = NULL;
    if (gguf_get_str(f, "tokenizer.ggml.pre", &pre_s)) {
        pre = dup_gstr(pre_s);
        if (!pre) return tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", path);
    } else {
        TPI_LOGW("%s: no tokenizer.ggml.pre; assuming 'qwen2'", path);
    }

    int rc = TPI_OK;
    struct gguf_str *toks = NULL, *merges = NULL;
    struct tok_str *tok_views = NULL, *merge_views = NULL;
    int32_t *types = NULL;
    uint64_t n_toks = 0, n_merges = 0;

    const struct gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING) {
        rc = tpi_err(err, TPI_ERR_FORMAT, "%s: tokenizer.ggml.tokens missing or not a string array",
                     path);
        goto done;
    }
    if ((rc = gguf_arr_strings(kv, &toks, &n_toks, err)) != TPI_OK) goto done;
    if (n_toks == 0 || n_toks > INT32_MAX) {
        rc = tpi_err(err, TPI_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", path,
                     (unsigned long long)n_toks);
        goto done;
    }
    // In a model file, one embedding row a token (llama.cpp refuses a mismatch too): ids
    // past the rows would read outside the embedding, rows past the ids could be sampled
    // and not decoded.
    const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (emb && (uint64_t)emb->ne[1] != n_toks) {
        rc = tpi_err(err, TPI_ERR_FORMAT,
                     "%s: tokenizer.ggml.tokens has %llu entries and token_embd.weight %lld rows; "
                     "they must be equal",
                     path, (unsigned long long)n_toks, (long long)emb->ne[1]);
        goto done;
    }
    kv = gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING) {
        rc = tpi_err(err, TPI_ERR_FORMAT, "%s: tokenizer.ggml.merges missing or not a string array",
                     path);
        goto done;
    }
    if ((rc = gguf_arr_strings(kv, &merges, &n_merges, err)) != TPI_OK) goto done;
    if (n_merges > INT32_MAX) {
        rc = tpi_err(err, TPI_ERR_FORMAT, "%s: tokenizer.ggml.merges is too large", path);
        goto done;
    }

    tok_views = malloc(n_toks * sizeof *tok_views);
    merge_views = malloc((n_merges ? n_merges : 1) * sizeof *merge_views);
    if (!tok_views || !merge_views) {
        rc = tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (uint64_t i = 0; i < n_toks; i++)
        tok_views[i] = (struct tok_str){toks[i].data, toks[i].len};
    for (uint64_t i = 0; i < n_merges; i++)
        merge_views[i] = (struct tok_str){merges[i].data, merges[i].len};

    kv = gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (kv) {
        if (kv->type != GGUF_VT_ARRAY || kv->arr_n != n_toks) {
            rc = tpi_err(err, TPI_ERR_FORMAT,
                         "%s: tokenizer.ggml.token_type is not an array of %llu entries", path,
                         (unsigned long long)n_toks);
            goto done;
        }
        types = malloc(n_toks * sizeof *types);
        if (!types) {
            rc = tpi_err(err, TPI_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (uint64_t i = 0; i < n_toks; i++) {
            int64_t v;
            if (!gguf_arr_int(kv, i, &v)) {
                rc = tpi_err(err, TPI_ERR_FORMAT,
                             "%s: tokenizer.ggml.token_type[%llu] is not an integer", path,
                             (unsigned long long)i);
                goto done;
            }
            types[i] = (int32_t)v;
        }
    }

    struct tok_vocab_spec spec = {
        .tokens = tok_views,
        .n_tokens = (int32_t)n_toks,
        .types = types,
        .merges = merge_views,
        .n_merges = (int32_t)n_merges,
        .pre = pre,
        .bos_id = -1,
        .eos_id = -1,
        .pad_id = -1,
        .eot_id = -1,
        .eom_id = -1,
        .source = path,
    };
    const char *id_keys[5] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                              "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id",
                              "tokenizer.ggml.eom_token_id"};
    int32_t *id_dst[5] = {&spec.bos_id, &spec.eos_id, &spec.pad_id, &spec.eot_id, &spec.eom_id};
    for (int k = 0; k < 5; k++) {
        int64_t v;
        if (gguf_get_int(f, id_keys[k], &v)) {
            if (v < 0 || v >= (int64_t)n_toks) {
                rc = tpi_err(err, TPI_ERR_FORMAT, "%s: %s = %lld is outside the vocabulary (%llu)",
                             path, id_keys[k], (long long)v, (unsigned long long)n_toks);
                goto done;
            }
            *id_dst[k] = (int32_t)v;
        }
    }
    bool add_bos = false;
    if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos)) spec.add_bos = add_bos;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl)) {
        spec.chat_template = tmpl.data;
        spec.chat_template_len = tmpl.len;
    }
    rc = tok_init_from_arrays(&spec, out, err);

done:
    free(pre);
    free(toks);
    free(merges);
    free(tok_views);
    free(merge_views);
    free(types);
    return rc;
}

/* ---- queries ------------------------------------------------------------------ */

int32_t tok_n_vocab(const struct tokenizer *t) {
    return t->n_vocab;
}
int32_t tok_bos(const struct tokenizer *t) {
    return t->bos;
}
int32_t tok_eos(const struct tokenizer *t) {
    return t->eos;
}
int32_t tok_pad(const struct tokenizer *t) {
    return t->pad;
}
bool tok_add_bos(const struct tokenizer *t) {
    return t->add_bos;
}
const char *tok_chat_template(const struct tokenizer *t) {
    return t->chat_template;
}

bool tok_is_eog(const struct tokenizer *t, int32_t id) {
    for (int i = 0; id >= 0 && i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

int tok_eog_ids(const struct tokenizer *t, int32_t ids[TOK_MAX_EOG]) {
    memcpy(ids, t->eog, sizeof *ids * (size_t)t->n_eog);
    return t->n_eog;
}

int tok_type_of(const struct tokenizer *t, int32_t id) {
    return (id >= 0 && id < t->n_vocab) ? t->types[id] : -1;
}

int32_t tok_id_of(const struct tokenizer *t, const char *text) {
    return text ? lookup_str(t, text, strlen(text)) : -1;
}

struct tok_str tok_piece(const struct tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return (struct tok_str){NULL, 0};
    return (struct tok_str){t->str_pool + t->str_off[id], t->str_len[id]};
}

struct tok_str tok_token_bytes(const struct tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return (struct tok_str){NULL, 0};
    return (struct tok_str){t->bytes_pool + t->bytes_off[id], t->bytes_len[id]};
}

/* ---- encode ----------------------------------------------------------------- */

/* Growable id list plus the BPE scratch, all owned by one encode call. */
struct enc {
    int32_t *ids;
    size_t n_ids, cap_ids;
    struct sym {
        int32_t id;
        int32_t prev, next; /* -1 at the ends */
    } * syms;
    size_t cap_syms;
    struct cand {
        int32_t rank, pos; /* heap order: rank, then leftmost */
        int32_t left, right, result;
    } * heap;
    size_t n_heap, cap_heap;
};

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static bool push_id(struct enc *e, int32_t id) {
    if (!grow((void **)&e->ids, &e->cap_ids, e->n_ids + 1, sizeof *e->ids)) return false;
    e->ids[e->n_ids++] = id;
    return true;
}

static bool cand_less(const struct cand *a, const struct cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct enc *e, struct cand c) {
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &e->heap[p])) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = c;
}

static struct cand heap_pop(struct enc *e) {
    struct cand top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct cand *best = &last;
        if (l < n && cand_less(&e->heap[l], best)) m = l, best = &e->heap[l];
        if (r < n && cand_less(&e->heap[r], best)) m = r;
        if (m == i) break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* Push the merge candidate for symbols (pos, its next), if that pair merges. */
static void add_cand(const struct tokenizer *t, struct enc *e, int32_t pos) {
    int32_t nx = e->syms[pos].next;
    if (nx < 0) return;
    const struct merge_slot *m = lookup_pair(t, e->syms[pos].id, e->syms[nx].id);
    if (m) heap_push(e, (struct cand){m->rank, pos, e->syms[pos].id, e->syms[nx].id, m->result});
}

/* BPE one pre-tokenized word (raw bytes) and append its ids. */
static bool bpe_word(const struct tokenizer *t, struct enc *e, const unsigned char *w, size_t n) {
    if (n == 1) return push_id(e, t->byte_id[w[0]]);
    if (n > INT32_MAX / 2) return false;
    /* every merge removes one symbol and adds at most 2 candidates: n + 2n bound */
    if (!grow((void **)&e->syms, &e->cap_syms, n, sizeof *e->syms) ||
        !grow((void **)&e->heap, &e->cap_heap, 3 * n, sizeof *e->heap))
        return false;
    for (size_t i = 0; i < n; i++)
        e->syms[i] =
            (struct sym){t->byte_id[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    e->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++)
        add_cand(t, e, (int32_t)i);
    while (e->n_heap) {
        struct cand c = heap_pop(e);
        struct sym *s = &e->syms[c.pos];
        /* stale when either side changed since the candidate was pushed:
         * merged ids are always new (longer) strings, so id equality suffices */
        if (s->id != c.left || s->next < 0 || e->syms[s->next].id != c.right) continue;
        int32_t gone = s->next;
        s->id = c.result;
        s->next = e->syms[gone].next;
        if (s->next >= 0) e->syms[s->next].prev = c.pos;
        e->syms[gone].id = -1;
        if (s->prev >= 0) add_cand(t, e, s->prev);
        add_cand(t, e, c.pos);
    }
    for (int32_t i = 0; i >= 0; i = e->syms[i].next)
        if (!push_id(e, e->syms[i].id)) return false;
    return true;
}

/* Normalize, pre-tokenize and BPE one segment that holds no added token. */
static int encode_segment(const struct tokenizer *t, struct enc *e, pcre2_match_data *md,
                          const char *text, size_t len, size_t base, struct tpi_error *err) {
    if (len == 0) return TPI_OK;
    bool ascii;
    size_t bad = utf8_check(text, len, &ascii);
    if (bad < len)
        return tpi_err(err, TPI_ERR_INVALID, "invalid UTF-8 at byte %zu (0x%02x)", base + bad,
                       (unsigned char)text[bad]);
    utf8proc_uint8_t *nfc = NULL;
    const char *s = text;
    size_t n = len;
    if (!ascii) {
        /* NFC as HF's normalizer does it; STABLE keeps unassigned code points */
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len,
                                          &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (k < 0)
            return tpi_err(err, k == UTF8PROC_ERROR_NOMEM ? TPI_ERR_NOMEM : TPI_ERR_INVALID,
                           "NFC of text at byte %zu failed: %s", base, utf8proc_errmsg(k));
        s = (const char *)nfc;
        n = (size_t)k;
    }
    int rc = TPI_OK;
    uint32_t opts = PCRE2_NO_UTF_CHECK; /* validated above */
    size_t off = 0;
    while (off < n) {
        int m = pcre2_match(t->re, (PCRE2_SPTR)s, n, off, opts, md, NULL);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) {
            opts |= PCRE2_NO_JIT; /* a huge whitespace run: the interpreter copes */
            continue;
        }
        size_t m0 = n, m1 = n;
        if (m >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            m0 = ov[0];
            m1 = ov[1];
        } else if (m != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(m, msg, sizeof msg);
            rc = tpi_err(err, TPI_ERR_INVALID, "pre-tokenizer regex failed at byte %zu: %s",
                         base + off, (const char *)msg);
            break;
        }
        /* HF's Split(Isolated) keeps the text between matches as pieces too; the
         * qwen2 pattern covers every character, so this is only a safeguard */
        if (m0 > off && !bpe_word(t, e, (const unsigned char *)s + off, m0 - off)) goto nomem;
        if (m1 == m0) { /* cannot happen with this pattern; never loop forever */
            if (m0 >= n) break;
            size_t k = 1;
            while (m0 + k < n && ((unsigned char)s[m0 + k] & 0xc0) == 0x80)
                k++;
            m1 = m0 + k;
        }
        if (!bpe_word(t, e, (const unsigned char *)s + m0, m1 - m0)) goto nomem;
        off = m1;
    }
    free(nfc);
    return rc;
nomem:
    free(nfc);
    return tpi_err(err, TPI_ERR_NOMEM, "out of memory encoding %zu bytes", len);
}

/* Longest added token that starts at text[i], or -1. */
static int32_t match_special(const struct tokenizer *t, const char *text, size_t len, size_t i,
                             bool parse_special) {
    if (!t->special_first[(unsigned char)text[i]]) return -1;
    for (int k = 0; k < t->n_specials; k++) {
        int32_t id = t->specials[k];
        size_t sl = t->str_len[id];
        if (!parse_special && t->types[id] == TOK_TYPE_CONTROL) continue;
        if (sl <= len - i && memcmp(text + i, t->str_pool + t->str_off[id], sl) == 0) return id;
    }
    return -1;
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool parse_special,
               int32_t **ids, int *n_ids, struct tpi_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return tpi_err(err, TPI_ERR_INVALID, "tok_encode: NULL text");
    if (len > (size_t)INT32_MAX)
        return tpi_err(err, TPI_ERR_INVALID, "tok_encode: text of %zu bytes is too long", len);
    struct enc e = {0};
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    int rc = TPI_OK;
    if (!md || !grow((void **)&e.ids, &e.cap_ids, len / 3 + 8, sizeof *e.ids)) {
        rc = tpi_err(err, TPI_ERR_NOMEM, "out of memory encoding %zu bytes", len);
        goto done;
    }
    if (t->add_bos && !push_id(&e, t->bos)) {
        rc = tpi_err(err, TPI_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* Added tokens are found in the raw text (HF: they are not normalized);
     * leftmost match wins, and at one position the longest. */
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        int32_t sid = t->n_specials ? match_special(t, text, len, i, parse_special) : -1;
        if (sid < 0) {
            i++;
            continue;
        }
        if ((rc = encode_segment(t, &e, md, text + seg, i - seg, seg, err)) != TPI_OK) goto done;
        if (!push_id(&e, sid)) {
            rc = tpi_err(err, TPI_ERR_NOMEM, "out of memory");
            goto done;
        }
        i += t->str_len[sid];
        seg = i;
    }
    rc = encode_segment(t, &e, md, text + seg, len - seg, seg, err);

done:
    if (md) pcre2_match_data_free(md);
    free(e.syms);
    free(e.heap);
    if (rc != TPI_OK) {
        free(e.ids);
        return rc;
    }
    if (e.n_ids > (size_t)INT32_MAX) {
        free(e.ids);
        return tpi_err(err, TPI_ERR_INVALID, "tok_encode: too many tokens");
    }
    *ids = e.ids;
    *n_ids = (int)e.n_ids;
    return TPI_OK;
}

/* ---- decode ----------------------------------------------------------------- */

int tok_decode(const struct tokenizer *t, const int32_t *ids, int n_ids, char **out,
               size_t *n_bytes, struct tpi_error *err) {
    *out = NULL;
    *n_bytes = 0;
    size_t total = 0;
    for (int i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return tpi_err(err, TPI_ERR_INVALID, "tok_decode: id %d at index %d is outside [0, %d)",
                           ids[i], i, t->n_vocab);
        total += t->bytes_len[ids[i]];
    }
    char *buf = malloc(total + 1);
    if (!buf) return tpi_err(err, TPI_ERR_NOMEM, "tok_decode: out of memory for %zu bytes", total);
    size_t o = 0;
    for (int i = 0; i < n_ids; i++) {
        memcpy(buf + o, t->bytes_pool + t->bytes_off[ids[i]], t->bytes_len[ids[i]]);
        o += t->bytes_len[ids[i]];
    }
    buf[o] = '\0';
    *out = buf;
    *n_bytes = o;
    return TPI_OK;
}

struct tok_stream {
    const struct tokenizer *t;
    bool render_control;
    unsigned char pend[4]; /* start of an incomplete character */
    int n_pend;
    char *buf; /* output of the last call */
    size_t cap;
};

struct tok_stream *tok_stream_new(const struct tokenizer *t, bool render_control) {
    struct tok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->render_control = render_control;
    return s;
}

void tok_stream_free(struct tok_stream **ps) {
    if (!ps || !*ps) return;
    free((*ps)->buf);
    free(*ps);
    *ps = NULL;
}

static const char REPLACEMENT[3] = {(char)0xef, (char)0xbf, (char)0xbd}; /* U+FFFD */

int tok_stream_push(struct tok_stream *s, int32_t id, const char **bytes, size_t *n_bytes,
                    struct tpi_error *err) {
    *bytes = "";
    *n_bytes = 0;
    const struct tokenizer *t = s->t;
    if (id < 0 || id >= t->n_vocab)
        return tpi_err(err, TPI_ERR_INVALID, "tok_stream_push: id %d is outside [0, %d)", id,
                       t->n_vocab);
    if (!s->render_control && t->types[id] == TOK_TYPE_CONTROL) return TPI_OK;
    size_t nin = (size_t)s->n_pend + t->bytes_len[id];
    /* room for the joined input, then the output where each byte may become U+FFFD */
    if (!grow((void **)&s->buf, &s->cap, nin * 4 + 4, 1))
        return tpi_err(err, TPI_ERR_NOMEM, "tok_stream_push: out of memory");
    unsigned char *in = (unsigned char *)s->buf + nin * 3 + 4;
    memcpy(in, s->pend, (size_t)s->n_pend);
    memcpy(in + s->n_pend, t->bytes_pool + t->bytes_off[id], t->bytes_len[id]);
    s->n_pend = 0;
    char *o = s->buf;
    size_t no = 0, i = 0;
    while (i < nin) {
        int k;
        const int m = tpi_utf8_scan(in + i, nin - i, &k);
        if (k == 0) {
            memcpy(o + no, REPLACEMENT, 3), no += 3, i++;
            continue;
        }
        if (m < k && i + (size_t)m == nin) {
            /* the tail is the start of a character still arriving: hold it */
            memcpy(s->pend, in + i, (size_t)m);
            s->n_pend = m;
            break;
        }
        if (m < k) { /* a broken character: one U+FFFD for its maximal subpart */
            memcpy(o + no, REPLACEMENT, 3), no += 3, i += (size_t)m;
            continue;
        }
        memmove(o + no, in + i, (size_t)k);
        no += (size_t)k;
        i += (size_t)k;
    }
    *bytes = s->buf;
    *n_bytes = no;
    return TPI_OK;
}

void tok_stream_flush(struct tok_stream *s, const char **bytes, size_t *n_bytes) {
    *bytes = "";
    *n_bytes = 0;
    if (s->n_pend > 0) {
        s->n_pend = 0;
        *bytes = REPLACEMENT;
        *n_bytes = 3;
    }
}
