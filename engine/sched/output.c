/*
 * output.c — see output.h. Records are built with cJSON (escaping, exact
 * numbers) and written with a single write() each.
 */
#define _POSIX_C_SOURCE 200809L
#include "sched/output.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "text/json_py.h"
#include "text/tokenizer.h"

/* ---- resume ----------------------------------------------------------------- */

/* Request with this line number (requests are in line order), or NULL. */
static struct batch_req *by_line(struct batch_input *in, long line) {
    int lo = 0, hi = in->n_reqs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (in->reqs[mid].line == line) return &in->reqs[mid];
        if (in->reqs[mid].line < line) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

/* Mark the request a complete record belongs to; false when the line is not JSON. */
static bool mark_record(struct batch_input *in, const char *text, size_t len, int *n_done) {
    cJSON *j = tpi_json_parse(text, len);
    if (!j) return false;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    const cJSON *line = cJSON_GetObjectItemCaseSensitive(j, "line");
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(j, "custom_id");
    const cJSON *resp = cJSON_GetObjectItemCaseSensitive(j, "response");
    long ln = -1;
    const cJSON *key = id;
    const char *key_name = "id";
    if (cJSON_IsNumber(line)) {
        // a line number in range, else none (the cast would be undefined behaviour)
        if (line->valuedouble >= 1 && line->valuedouble <= (double)INT32_MAX)
            ln = (long)line->valuedouble;
    } else if (cid || resp) { // OpenAI shape: the line is in request_id
        const cJSON *rid = cJSON_GetObjectItemCaseSensitive(resp, "request_id");
        if (cJSON_IsString(rid)) sscanf(rid->valuestring, "tpinfer-batch-%ld", &ln);
        key = cid;
        key_name = "custom_id";
    }
    const char *vb = NULL, *ve = NULL; // the id as the request's is read: numbers unrounded
    char *k = key && json_member(text, text + len, key_name, &vb, &ve) ? req_id_text(vb, ve) : NULL;
    struct batch_req *r = ln > 0 ? by_line(in, ln) : NULL;
    if (!r && k && (cid || resp)) // no usable line: the first open request with this custom_id
        for (int i = 0; i < in->n_reqs && !r; i++)
            if (in->reqs[i].oai && !in->reqs[i].done && !strcmp(in->reqs[i].id_json, k))
                r = &in->reqs[i];
    if (r && k && !r->done && !strcmp(r->id_json, k)) {
        r->done = true;
        (*n_done)++;
    }
    free(k);
    cJSON_Delete(j);
    return true;
}

int batch_resume_scan(const char *path, struct batch_input *in, int *n_done,
                      struct tpi_error *err) {
    *n_done = 0;
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        if (errno == ENOENT) return TPI_OK;
        return tpi_err(err, TPI_ERR_IO, "--resume: cannot open %s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return tpi_err(err, TPI_ERR_IO, "--resume: cannot stat %s", path);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *data = malloc(n + 1);
    if (!data) {
        close(fd);
        return tpi_err(err, TPI_ERR_NOMEM, "--resume: out of memory for %s", path);
    }
    while (got < n) {
        ssize_t k = pread(fd, data + got, n - got, (off_t)got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    n = got;
    // The complete lines end at the last newline; after it, a torn last line (killed
    // mid-write).
    size_t end = n;
    while (end > 0 && data[end - 1] != '\n') end--;
    long line = 1;
    for (size_t i = 0; i < end; line++) {
        size_t e = i;
        while (e < end && data[e] != '\n') e++;
        size_t b = i;
        while (b < e && (data[b] == ' ' || data[b] == '\t' || data[b] == '\r')) b++;
        // A damaged line among the records: appending after it would leave a file that
        // no JSONL reader takes, so stop before any work (the file as it was) and say where.
        if (b < e && !mark_record(in, data + i, e - i, n_done)) {
            free(data);
            close(fd);
            return tpi_err(err, TPI_ERR_FORMAT,
                           "--resume: %s: line %ld is not a JSON record (damaged, or written by "
                           "something else): fix or remove it, then run again",
                           path, line);
        }
        i = e + 1;
    }
    free(data);
    // Cut the torn line so appended records start on a fresh line and the half record is
    // not mistaken for a result.
    if (end < n && ftruncate(fd, (off_t)end) != 0) {
        close(fd);
        return tpi_err(err, TPI_ERR_IO, "--resume: cannot truncate the torn last line of %s", path);
    }
    if (end < n) TPI_LOGW("--resume: dropped a torn last line (%zu bytes) of %s", n - end, path);
    close(fd);
    return TPI_OK;
}

/* ---- writing ------------------------------------------------------------------ */

/* The choices of one request with n > 1 finished so far. */
struct out_choices {
    cJSON **c;               /* (n_choices) finished choices, NULL while running */
    int n_got;
    long n_completion;       /* tokens of the finished choices */
    double ttft_s;           /* the first choice's time to first token */
    double decode_tokens, decode_s;
};

static void free_choices(struct out_choices *a, int n) {
    for (int k = 0; a->c && k < n; k++)
        cJSON_Delete(a->c[k]);
    free(a->c);
    memset(a, 0, sizeof *a);
}

static int write_line(struct batch_out *o, char *json, struct tpi_error *err) {
    size_t n = strlen(json);
    json[n] = '\n'; // the buffer has room: every record is printed with one spare byte
    size_t off = 0;
    while (off < n + 1) {
        ssize_t k = write(o->fd, json + off, n + 1 - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            json[n] = '\0';
            return tpi_err(err, TPI_ERR_IO, "cannot write a result record to %s: %s", o->path,
                           strerror(errno));
        }
        off += (size_t)k;
    }
    json[n] = '\0';
    /* --fsync: a record is on disk before the next is made, or the run stops (EINVAL: the
     * output is a pipe or terminal, which has no disk to reach) */
    if (o->sync && fsync(o->fd) != 0 && errno != EINVAL)
        return tpi_err(err, TPI_ERR_IO, "cannot fsync a result record of %s: %s", o->path,
                       strerror(errno));
    o->n_written++;
    return TPI_OK;
}

/* Print j compactly into a buffer with one spare byte for the newline. */
static char *print_record(cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *b = realloc(s, n + 2);
    if (!b) {
        free(s);
        return NULL;
    }
    b[n + 1] = '\0';
    return b;
}

/* Hand a finished record of request idx to the file (takes ownership of json). */
static int emit(struct batch_out *o, int idx, char *json, struct tpi_error *err) {
    if (!json) return tpi_err(err, TPI_ERR_NOMEM, "out of memory for a result record");
    int rc = TPI_OK;
    if (!o->ordered) {
        rc = write_line(o, json, err);
        o->in->reqs[idx].done = true;
        free(json);
        return rc;
    }
    o->pending[idx] = json;
    while (!rc && o->next < o->in->n_reqs) {
        struct batch_req *r = &o->in->reqs[o->next];
        char **p = &o->pending[o->next];
        if (*p) {
            rc = write_line(o, *p, err);
            free(*p);
            *p = NULL;
            r->done = true;
        } else if (!r->done) {
            break;
        }
        o->next++;
    }
    return rc;
}

int batch_out_open(struct batch_out *o, const char *path, bool append, bool ordered, bool sync,
                   struct batch_input *in, const struct tokenizer *tok, const char *model_name,
                   struct tpi_error *err) {
    memset(o, 0, sizeof *o);
    o->in = in;
    o->ordered = ordered;
    o->sync = sync;
    o->tok = tok;
    o->model_name = model_name;
    o->fd = 1;
    o->path = path ? path : "stdout";
    if (path) {
        o->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | (append ? 0 : O_TRUNC), 0644);
        if (o->fd < 0)
            return tpi_err(err, TPI_ERR_IO, "cannot open the output %s: %s", path, strerror(errno));
        o->own_fd = true;
    } else {
        fflush(stdout);
    }
    if (ordered && !(o->pending = calloc((size_t)in->n_reqs + 1, sizeof *o->pending)))
        return tpi_err(err, TPI_ERR_NOMEM, "out of memory for %d records", in->n_reqs);
    return TPI_OK;
}

int batch_out_close(struct batch_out *o, struct tpi_error *err) {
    int rc = TPI_OK;
    for (int i = 0; o->pending && i < o->in->n_reqs; i++) {
        if (o->pending[i] && !rc) {
            rc = write_line(o, o->pending[i], err);
            o->in->reqs[i].done = true;
        }
        free(o->pending[i]);
    }
    free(o->pending);
    o->pending = NULL;
    // Requests some of whose choices finished: no record; --resume runs them again.
    for (int i = 0; o->acc && i < o->in->n_reqs; i++)
        free_choices(&o->acc[i], o->in->reqs[i].n_choices);
    free(o->acc);
    o->acc = NULL;
    /* the file's last writes can fail only here (a full or remote file system) */
    if (o->own_fd && o->sync && fsync(o->fd) != 0 && errno != EINVAL && !rc)
        rc = tpi_err(err, TPI_ERR_IO, "cannot fsync the output: %s", strerror(errno));
    if (o->own_fd && close(o->fd) != 0 && !rc)
        rc = tpi_err(err, TPI_ERR_IO, "cannot close the output: %s", strerror(errno));
    o->fd = -1;
    return rc;
}

/* The request's id as a JSON value: its text as it is (a number keeps its spelling). */
static cJSON *id_value(const struct batch_req *r) {
    cJSON *v = cJSON_CreateRaw(r->id_json);
    return v ? v : cJSON_CreateNull();
}

/* Deterministic ids: a run and its resumed continuation name a request alike. */
static void hex_id(char *buf, size_t n, const char *prefix, const struct batch_req *r) {
    uint64_t h = tpi_fnv1a(TPI_FNV_INIT, r->id_json, strlen(r->id_json));
    h = tpi_fnv1a(h, &r->line, sizeof r->line);
    snprintf(buf, n, "%s%016llx", prefix, (unsigned long long)h);
}

static cJSON *oai_envelope(const struct batch_req *r, int status, cJSON *body, cJSON *error) {
    char id[64], rid[64];
    hex_id(id, sizeof id, "batch_req_", r);
    snprintf(rid, sizeof rid, "tpinfer-batch-%ld", r->line);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddItemToObject(j, "custom_id", id_value(r));
    cJSON *resp = cJSON_AddObjectToObject(j, "response");
    cJSON_AddNumberToObject(resp, "status_code", status);
    cJSON_AddStringToObject(resp, "request_id", rid);
    cJSON_AddItemToObject(resp, "body", body ? body : cJSON_CreateNull());
    cJSON_AddItemToObject(j, "error", error ? error : cJSON_CreateNull());
    return j;
}

int batch_out_errors(struct batch_out *o, struct tpi_error *err) {
    for (int i = 0; i < o->in->n_reqs; i++) {
        const struct batch_req *r = &o->in->reqs[i];
        if (!r->error || r->done) continue;
        cJSON *j;
        if (r->oai) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "code", "invalid_request");
            cJSON_AddStringToObject(e, "message", r->error);
            j = oai_envelope(r, 400, NULL, e);
        } else {
            j = cJSON_CreateObject();
            cJSON_AddItemToObject(j, "id", id_value(r));
            cJSON_AddNumberToObject(j, "line", (double)r->line);
            cJSON_AddStringToObject(j, "finish_reason", "error");
            cJSON *e = cJSON_AddObjectToObject(j, "error");
            cJSON_AddStringToObject(e, "message", r->error);
        }
        char *s = print_record(j);
        cJSON_Delete(j);
        o->n_errors++;
        int rc = emit(o, i, s, err);
        if (rc) return rc;
    }
    return TPI_OK;
}

/* The text of ids[0..n) as valid UTF-8, decoded as the generated text is (one stream,
 * control tokens rendered: bytes that do not form a character become U+FFFD), in a
 * malloc'd buffer of *len bytes plus a NUL; NULL when memory runs out. */
static char *valid_text(const struct tokenizer *tok, const int32_t *ids, int n, size_t *len) {
    struct tok_stream *ts = tok_stream_new(tok, true);
    char *buf = NULL;
    size_t cap = 0, o = 0;
    bool ok = ts != NULL;
    for (int i = 0; ok && i <= n; i++) {
        const char *b;
        size_t nb;
        struct tpi_error e = {0};
        if (i < n) ok = tok_stream_push(ts, ids[i], &b, &nb, &e) == TPI_OK;
        else tok_stream_flush(ts, &b, &nb);
        if (ok && o + nb + 1 > cap) {
            size_t nc = cap ? cap : 64;
            while (nc < o + nb + 1) nc *= 2;
            char *g = realloc(buf, nc);
            ok = g != NULL;
            if (ok) buf = g, cap = nc;
        }
        if (ok) memcpy(buf + o, b, nb), o += nb;
    }
    tok_stream_free(&ts);
    if (ok && !buf) ok = (buf = malloc(1)) != NULL;
    if (!ok) {
        free(buf);
        return NULL;
    }
    buf[o] = '\0';
    *len = o;
    return buf;
}

/* Characters in the n bytes of UTF-8 at b. */
static size_t utf8_chars(const char *b, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)b[i] & 0xc0) != 0x80;
    return c;
}

/* A token as a JSON string node, its bytes made valid UTF-8 as valid_text makes them
 * (OpenAI's "token" fields; "bytes" keeps the truth in *raw); *n_chars (if not NULL) its
 * length in characters, as text_offset counts them. NULL when memory runs out. */
static cJSON *token_json(const struct tokenizer *tok, const struct batch_req *r, int32_t id,
                         struct tok_str *raw, size_t *n_chars) {
    *raw = tok_token_bytes(tok, id);
    size_t n = 0;
    char *s = tpi_utf8_fix(raw->data, raw->len, &n);
    if (!s) return NULL;
    if (n_chars) *n_chars = utf8_chars(s, n);
    cJSON *j;
    if (r->ids_as_tokens) { // vLLM's return_tokens_as_token_ids
        char name[32];
        snprintf(name, sizeof name, "token_id:%d", (int)id);
        j = cJSON_CreateString(name);
    } else {
        j = tpi_json_text(s, n);
    }
    free(s);
    return j;
}

/* A map key for a token's string: valid UTF-8 bytes (a NUL among them) in a malloc'd
 * buffer of *n bytes, or "token_id:N" (vLLM's return_tokens_as_token_ids). */
static char *token_key(const struct tokenizer *tok, const struct batch_req *r, int32_t id,
                       size_t *n) {
    if (r->ids_as_tokens) {
        char name[32];
        *n = (size_t)snprintf(name, sizeof name, "token_id:%d", (int)id);
        return tpi_strdup(name);
    }
    const struct tok_str raw = tok_token_bytes(tok, id);
    return tpi_utf8_fix(raw.data, raw.len, n);
}

static cJSON *bytes_array(struct tok_str raw) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < raw.len; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw.data[i]));
    return a;
}

/* OpenAI chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}. */
static cJSON *chat_logprobs(const struct batch_out *o, const struct batch_req *r,
                            const struct sched_result *res) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(lp, "content");
    for (int t = 0; t < res->n_tokens; t++) {
        struct tok_str raw;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "token", token_json(o->tok, r, res->tokens[t], &raw, NULL));
        cJSON_AddNumberToObject(e, "logprob", res->lp_chosen[t]);
        cJSON_AddItemToObject(e, "bytes", bytes_array(raw));
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < r->n_top_out && k < res->lp_k; k++) {
            int32_t id = res->lp_ids[(size_t)t * res->lp_k + k];
            cJSON *a = cJSON_CreateObject();
            cJSON_AddItemToObject(a, "token", token_json(o->tok, r, id, &raw, NULL));
            cJSON_AddNumberToObject(a, "logprob", res->lp_vals[(size_t)t * res->lp_k + k]);
            cJSON_AddItemToObject(a, "bytes", bytes_array(raw));
            cJSON_AddItemToArray(top, a);
        }
        cJSON_AddItemToArray(content, e);
    }
    return lp;
}

/* The map being written by top_map: its text, and the keys so far (to keep the first of
 * equal strings). */
struct top_text {
    struct json_buf b;
    char *keys[REQ_MAX_LOGPROBS + 1];
    size_t n_keys[REQ_MAX_LOGPROBS + 1];
    int n;
};

/* Adds "token's string": v to the map unless a token of the same string is there already.
 * The key is written as a value is (tpi_json_text): a NUL in it stays \u0000, where an
 * object's key in cJSON would end at it. */
static void map_add(struct top_text *t, const struct batch_out *o, const struct batch_req *r,
                    int32_t id, float v) {
    size_t n = 0;
    char *ts = token_key(o->tok, r, id, &n);
    if (!ts || t->n == REQ_MAX_LOGPROBS + 1) {
        free(ts);
        return;
    }
    for (int i = 0; i < t->n; i++)
        if (t->n_keys[i] == n && !memcmp(t->keys[i], ts, n)) {
            free(ts);
            return;
        }
    cJSON *kj = tpi_json_text(ts, n), *vj = cJSON_CreateNumber(v);
    char *ks = kj ? cJSON_PrintUnformatted(kj) : NULL, *vs = vj ? cJSON_PrintUnformatted(vj) : NULL;
    if (ks && vs) {
        json_buf_put(&t->b, t->n ? "," : "", t->n ? 1 : 0);
        json_buf_put(&t->b, ks, strlen(ks));
        json_buf_put(&t->b, ":", 1);
        json_buf_put(&t->b, vs, strlen(vs));
        t->keys[t->n] = ts;
        t->n_keys[t->n++] = n;
        ts = NULL;
    }
    free(ks);
    free(vs);
    cJSON_Delete(kj);
    cJSON_Delete(vj);
    free(ts);
}

/* The map {token: logprob} of OpenAI completion logprobs: the top n_top_out (first of
 * equal strings), then the chosen token when it is not among them, so a map holds up
 * to logprobs + 1 entries, as OpenAI's and vLLM's do ("logprobs": 0 gives the chosen
 * token alone). Written as text (a raw node), so a key may hold a NUL. */
static cJSON *top_map(const struct batch_out *o, const struct batch_req *r, const int32_t *ids,
                      const float *vals, int k, int32_t chosen, float chosen_lp) {
    struct top_text t = {0};
    json_buf_put(&t.b, "{", 1);
    bool listed = false;
    for (int j = 0; j < r->n_top_out && j < k; j++) {
        map_add(&t, o, r, ids[j], vals[j]);
        listed |= ids[j] == chosen;
    }
    if (!listed) map_add(&t, o, r, chosen, chosen_lp);
    json_buf_put(&t.b, "}", 1); // json_buf keeps the text NUL-terminated
    for (int i = 0; i < t.n; i++)
        free(t.keys[i]);
    cJSON *m = t.b.failed || !t.b.p ? NULL : cJSON_CreateRaw(t.b.p);
    free(t.b.p);
    return m;
}

/* Characters id adds to the text stream ts decodes (0 while a character is held back);
 * without a stream (memory ran out) the token's own string's, *fallback. */
static size_t stream_chars(struct tok_stream *ts, int32_t id, size_t fallback) {
    const char *b;
    size_t nb;
    struct tpi_error e = {0};
    if (!ts || tok_stream_push(ts, id, &b, &nb, &e) != TPI_OK) return fallback;
    return utf8_chars(b, nb);
}

/* OpenAI completion logprobs: tokens, token_logprobs, top_logprobs, text_offset; with
 * echo the prompt's tokens come first (the first with null logprobs, as OpenAI's). A
 * token's text_offset is where its text starts in the choice's "text", in characters:
 * the text decoded as the record's text is (the prompt, then the completion), so a token
 * that ends inside a character adds nothing until the character completes. */
static cJSON *completion_logprobs(const struct batch_out *o, const struct batch_req *r,
                                  const struct sched_result *res) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON *off = cJSON_AddArrayToObject(lp, "text_offset");
    size_t at = 0;
    struct tok_stream *ts = r->echo ? tok_stream_new(o->tok, true) : NULL;
    for (int i = 0; r->echo && i < r->n_prompt; i++) {
        const bool listed = res->plp_chosen && i < res->n_prompt;
        struct tok_str raw;
        size_t n_chars = 0;
        cJSON *tj = listed ? token_json(o->tok, r, r->prompt[i], &raw, &n_chars) : NULL;
        if (listed) {
            cJSON_AddItemToArray(toks, tj);
            cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        }
        at += stream_chars(ts, r->prompt[i], n_chars);
        if (!listed) continue;
        if (i == 0) { // nothing before the first token to score it
            cJSON_AddItemToArray(tlp, cJSON_CreateNull());
            cJSON_AddItemToArray(top, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(res->plp_chosen[i]));
        cJSON_AddItemToArray(top, top_map(o, r, res->plp_ids + (size_t)i * res->lp_k,
                                          res->plp_vals + (size_t)i * res->lp_k, res->lp_k,
                                          r->prompt[i], res->plp_chosen[i]));
    }
    if (ts) { // the prompt's text ends here: a character still held back is one U+FFFD
        const char *b;
        size_t nb;
        tok_stream_flush(ts, &b, &nb);
        at += utf8_chars(b, nb);
        tok_stream_free(&ts);
    }
    ts = tok_stream_new(o->tok, false); // as the scheduler decodes a completion's text
    for (int t = 0; t < res->n_tokens; t++) {
        struct tok_str raw;
        size_t n_chars = 0;
        cJSON_AddItemToArray(toks, token_json(o->tok, r, res->tokens[t], &raw, &n_chars));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(res->lp_chosen[t]));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        at += stream_chars(ts, res->tokens[t], n_chars);
        cJSON_AddItemToArray(top, top_map(o, r, res->lp_ids + (size_t)t * res->lp_k,
                                          res->lp_vals + (size_t)t * res->lp_k, res->lp_k,
                                          res->tokens[t], res->lp_chosen[t]));
    }
    tok_stream_free(&ts);
    return lp;
}

/* Ours: the per-completion fields of a record or of one of its "choices". */
static void ours_completion(cJSON *j, const struct sched_result *res) {
    cJSON_AddItemToObject(j, "text", tpi_json_text(res->text, res->n_text));
    cJSON *toks = cJSON_AddArrayToObject(j, "tokens");
    for (int t = 0; t < res->n_tokens; t++)
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(res->tokens[t]));
    cJSON_AddStringToObject(j, "finish_reason", res->finish_reason);
}

/* Ours: "logprobs", per token its top [id, logprob] pairs, best first. */
static void ours_logprobs(cJSON *j, const struct batch_req *r, const struct sched_result *res) {
    if (!r->want_logprobs) return;
    cJSON *lp = cJSON_AddArrayToObject(j, "logprobs");
    for (int t = 0; t < res->n_tokens; t++) {
        cJSON *row = cJSON_CreateArray();
        for (int k = 0; k < r->n_top_out && k < res->lp_k; k++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(res->lp_ids[(size_t)t * res->lp_k + k]));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(res->lp_vals[(size_t)t * res->lp_k + k]));
            cJSON_AddItemToArray(row, pair);
        }
        cJSON_AddItemToArray(lp, row);
    }
}

/* Ours: the timing fields (rounded: microseconds, centi-tokens per second). */
static void ours_timing(cJSON *j, double ttft_s, double decode_tokens, double decode_s) {
    cJSON_AddNumberToObject(j, "ttft_ms", round(ttft_s * 1e6) / 1e3);
    double tps = decode_tokens > 0 && decode_s > 0 ? decode_tokens / decode_s : 0.0;
    cJSON_AddNumberToObject(j, "decode_tps", round(tps * 100) / 100);
}

/* A chat choice's message "content" and, where the line's tools are "auto" and the text
 * holds <tool_call> blocks, its "tool_calls" (vLLM's hermes parser: the content is the
 * text before the first block, null when empty; *n_calls of them). False: out of memory. */
static bool add_message_body(cJSON *msg, const struct batch_req *r, int index,
                             const struct sched_result *res, int *n_calls) {
    struct tok_tool_call *calls = NULL;
    size_t n_content = 0;
    const int n =
        r->tools == REQ_TOOLS_AUTO ? tok_parse_tool_calls(res->text, &calls, &n_content) : 0;
    if (n < 0) return false;
    *n_calls = n > 0 && r->one_tool_call ? 1 : n;
    if (n == 0) {
        cJSON_AddItemToObject(msg, "content", tpi_json_text(res->text, res->n_text));
        return true;
    }
    bool ok = true;
    char *content = n_content ? malloc(n_content + 1) : NULL;
    if (content) {
        memcpy(content, res->text, n_content);
        content[n_content] = '\0';
        cJSON_AddStringToObject(msg, "content", content);
    } else {
        ok = n_content == 0;
        cJSON_AddNullToObject(msg, "content");
    }
    free(content);
    cJSON *arr = cJSON_AddArrayToObject(msg, "tool_calls");
    for (int k = 0; k < *n_calls; k++) {
        char id[64];
        uint64_t h = tpi_fnv1a(TPI_FNV_INIT, r->id_json, strlen(r->id_json));
        h = tpi_fnv1a(h, &r->line, sizeof r->line);
        h = tpi_fnv1a(h, &index, sizeof index);
        h = tpi_fnv1a(h, &k, sizeof k);
        const uint64_t h2 = tpi_fnv1a(h, "tool", 4);
        snprintf(id, sizeof id, "chatcmpl-tool-%016llx%016llx", (unsigned long long)h,
                 (unsigned long long)h2);
        cJSON *call = cJSON_CreateObject();
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(call, "function");
        cJSON_AddStringToObject(fn, "name", calls[k].name);
        cJSON_AddStringToObject(fn, "arguments", calls[k].arguments);
        cJSON_AddItemToArray(arr, call);
    }
    for (int k = 0; k < n; k++)
        tok_tool_call_free(&calls[k]);
    free(calls);
    return ok;
}

/* One choice of a request as the record lists it (ours or OpenAI). */
static cJSON *make_choice(const struct batch_out *o, const struct batch_req *r, int index,
                          const struct sched_result *res) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    if (!r->oai) {
        ours_completion(c, res);
        ours_logprobs(c, r, res);
        return c;
    }
    const bool chat = r->fmt == REQ_OAI_CHAT;
    int n_calls = 0;
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        if (!add_message_body(msg, r, index, res, &n_calls)) {
            cJSON_Delete(c);
            return NULL;
        }
    } else if (r->echo) { // the prompt's text, then the completion's
        size_t n_prompt = 0;
        char *prompt = valid_text(o->tok, r->prompt, r->n_prompt, &n_prompt);
        if (!prompt) {
            cJSON_Delete(c);
            return NULL;
        }
        char *both = malloc(n_prompt + res->n_text + 1);
        if (both) {
            memcpy(both, prompt, n_prompt);
            memcpy(both + n_prompt, res->text, res->n_text + 1);
        }
        free(prompt);
        if (!both) {
            cJSON_Delete(c);
            return NULL;
        }
        cJSON_AddItemToObject(c, "text", tpi_json_text(both, n_prompt + res->n_text));
        free(both);
    } else {
        cJSON_AddItemToObject(c, "text", tpi_json_text(res->text, res->n_text));
    }
    cJSON_AddItemToObject(c, "logprobs",
                          !r->want_logprobs ? cJSON_CreateNull()
                          : chat            ? chat_logprobs(o, r, res)
                                            : completion_logprobs(o, r, res));
    cJSON_AddStringToObject(c, "finish_reason", n_calls > 0 ? "tool_calls" : res->finish_reason);
    // vLLM's: what ended a "stop": the stop string or the stop_token_ids id (null for the
    // end-of-generation token and for "length").
    cJSON_AddItemToObject(c, "stop_reason",
                          res->stop_string    ? cJSON_CreateString(res->stop_string)
                          : res->stop_id >= 0 ? cJSON_CreateNumber(res->stop_id)
                                              : cJSON_CreateNull());
    return c;
}

/* OpenAI: the envelope around a completion body listing `choices` (taken). */
static cJSON *oai_record(const struct batch_out *o, const struct batch_req *r, cJSON *choices,
                         int n_prompt, long n_completion) {
    const bool chat = r->fmt == REQ_OAI_CHAT;
    char id[64];
    hex_id(id, sizeof id, chat ? "chatcmpl-" : "cmpl-", r);
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "id", id);
    cJSON_AddStringToObject(body, "object", chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(body, "created", (double)time(NULL));
    cJSON_AddStringToObject(body, "model", r->model_name ? r->model_name : o->model_name);
    cJSON_AddItemToObject(body, "choices", choices);
    cJSON *u = cJSON_AddObjectToObject(body, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)n_completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(n_prompt + n_completion));
    return oai_envelope(r, 200, body, NULL);
}

/* Keep choice `choice` of request idx (n_counted: its tokens for the usage); *whole
 * receives the record once every choice is in (NULL before). */
static int gather_choice(struct batch_out *o, int idx, int choice, const struct sched_result *res,
                         long n_counted, cJSON **whole, struct tpi_error *err) {
    const struct batch_req *r = &o->in->reqs[idx];
    *whole = NULL;
    if (!o->acc && !(o->acc = calloc((size_t)o->in->n_reqs, sizeof *o->acc)))
        return tpi_err(err, TPI_ERR_NOMEM, "out of memory for the choices of %d requests",
                       o->in->n_reqs);
    struct out_choices *a = &o->acc[idx];
    if (!a->c && !(a->c = calloc((size_t)r->n_choices, sizeof *a->c)))
        return tpi_err(err, TPI_ERR_NOMEM, "out of memory for %d choices", r->n_choices);
    if (choice < 0 || choice >= r->n_choices || a->c[choice])
        return tpi_err(err, TPI_ERR_INVALID, "line %ld: choice %d finished twice or is out of "
                       "range", r->line, choice);
    if (!(a->c[choice] = make_choice(o, r, choice, res)))
        return tpi_err(err, TPI_ERR_NOMEM, "out of memory for a result record");
    a->ttft_s = a->n_got == 0 || res->t_first_s < a->ttft_s ? res->t_first_s : a->ttft_s;
    a->n_got++;
    a->n_completion += n_counted;
    if (res->n_tokens > 1) a->decode_tokens += res->n_tokens - 1, a->decode_s += res->t_decode_s;
    if (a->n_got < r->n_choices) return TPI_OK;
    cJSON *choices = cJSON_CreateArray();
    for (int k = 0; k < r->n_choices; k++) {
        cJSON_AddItemToArray(choices, a->c[k]);
        a->c[k] = NULL;
    }
    cJSON *j;
    if (r->oai) {
        j = oai_record(o, r, choices, res->n_prompt, a->n_completion);
    } else {
        j = cJSON_CreateObject();
        cJSON_AddItemToObject(j, "id", id_value(r));
        cJSON_AddNumberToObject(j, "line", (double)r->line);
        cJSON_AddItemToObject(j, "choices", choices);
        cJSON_AddNumberToObject(j, "prompt_tokens", res->n_prompt);
        cJSON_AddNumberToObject(j, "completion_tokens", (double)a->n_completion);
        ours_timing(j, a->ttft_s, a->decode_tokens, a->decode_s);
    }
    free_choices(a, r->n_choices);
    *whole = j;
    return TPI_OK;
}

/* What an OpenAI record says of a finished sequence, as vLLM says it: with "max_tokens":
 * 0 and echo, no completion (the one token generated is left out); an end-of-generation
 * or stop_token_ids id that came as the max_tokens-th token is a "length" (vLLM checks
 * the length first). */
static struct sched_result oai_view(const struct batch_req *r, const struct sched_result *res) {
    struct sched_result v = *res;
    if (r->echo_only) {
        v.n_tokens = 0;
        v.text = "";
        v.n_text = 0;
        v.finish_reason = "length";
        v.stop_string = NULL;
        v.stop_id = -1;
    } else if (!strcmp(v.finish_reason, "stop") && !v.stop_string &&
               v.n_tokens + 1 >= r->max_tokens) {
        v.finish_reason = "length";
        v.stop_id = -1;
    }
    return v;
}

/* Tokens an OpenAI record's usage counts for a finished sequence: vLLM counts the
 * end-of-generation or stop_token_ids id that ended it (not kept in its tokens). */
static long oai_completion_tokens(const struct batch_req *r, const struct sched_result *res) {
    if (r->echo_only) return 0;
    return res->n_tokens + (!strcmp(res->finish_reason, "stop") && !res->stop_string);
}

int batch_out_result(struct batch_out *o, int idx, int choice, const struct sched_result *res,
                     struct tpi_error *err) {
    const struct batch_req *r = &o->in->reqs[idx];
    const long n_counted = r->oai ? oai_completion_tokens(r, res) : res->n_tokens;
    struct sched_result view = r->oai ? oai_view(r, res) : *res;
    res = &view;
    cJSON *j = NULL;
    if (r->n_choices > 1) {
        int rc = gather_choice(o, idx, choice, res, n_counted, &j, err);
        if (rc || !j) return rc;
    } else if (!r->oai) {
        j = cJSON_CreateObject();
        cJSON_AddItemToObject(j, "id", id_value(r));
        cJSON_AddNumberToObject(j, "line", (double)r->line);
        ours_completion(j, res);
        cJSON_AddNumberToObject(j, "prompt_tokens", res->n_prompt);
        cJSON_AddNumberToObject(j, "completion_tokens", res->n_tokens);
        ours_timing(j, res->t_first_s, res->n_tokens - 1, res->t_decode_s);
        ours_logprobs(j, r, res);
    } else {
        cJSON *choice = make_choice(o, r, 0, res);
        if (!choice) return tpi_err(err, TPI_ERR_NOMEM, "out of memory for a result record");
        cJSON *choices = cJSON_CreateArray();
        cJSON_AddItemToArray(choices, choice);
        j = oai_record(o, r, choices, res->n_prompt, n_counted);
    }
    o->n_results++;
    char *s = print_record(j);
    cJSON_Delete(j);
    return emit(o, idx, s, err);
}
