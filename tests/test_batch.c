/*
 * test_batch.c — the batch prompt-file command end to end (through
 * `tpinfer run -f`, which hands prompt files to cmd_run_batch), on the
 * CPU backend with the tiny Qwen3 model. One mode per ctest test (argv[1]):
 *   inputs    every line shape and every error record, plain-text files
 *   parallel  --parallel 8 and --ubatch 4 give the records of --parallel 1
 *   resume    SIGKILL mid-run, then --resume: every id once, same texts
 *   ends      stop_token_ids, min_tokens, ignore_eos, stop_reason; logit_bias
 *   chat      a model with Qwen3's chat template: thinking on and off, history,
 *             what it cannot render
 *   sigterm   SIGTERM mid-run: exit 143, complete records, --resume finishes
 *   mpi_tp    mpirun -np 2 --tp 2 equals one rank (greedy)
 *   mpi_pp    mpirun -np 2 --pp 2 equals one rank (greedy)
 * Records are compared after dropping the timing fields (ttft_ms, decode_tps,
 * OpenAI "created"), keyed and sorted by line.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

static const char *g_mode = "inputs";
static const char *g_model;
static char g_dir[256];
static const char *g_stderr_to; /* when set, spawned runs write stderr there */
static const char *g_stdout_to; /* when set, spawned runs write stdout there */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* g_dir/name, malloc'd (a test's few paths are left to the process exit). */
static char *path_in(const char *name) {
    char *b = malloc(512);
    ck_assert_ptr_nonnull(b);
    snprintf(b, 512, "%s/%s", g_dir, name);
    return b;
}

/* Start the driver (or mpirun -np np driver) with args; returns the pid. */
static pid_t spawn(int np, const char *const *args) {
    const char *argv[64];
    int n = 0;
    if (np > 1) {
        argv[n++] = TPI_MPIEXEC;
        argv[n++] = "--oversubscribe";
        argv[n++] = "--allow-run-as-root";
        argv[n++] = "--bind-to";
        argv[n++] = "none";
        argv[n++] = "-np";
        argv[n++] = np == 2 ? "2" : "4";
    }
    argv[n++] = TPI_BATCH_DRIVER;
    argv[n++] = "run";
    argv[n++] = "-m";
    argv[n++] = g_model;
    argv[n++] = "--backend";
    argv[n++] = "cpu";
    argv[n++] = "-t";
    argv[n++] = "1";
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        if (g_stderr_to) { // keep the run's stderr (its summary line) for the test
            FILE *e = freopen(g_stderr_to, "w", stderr);
            if (!e) _exit(126);
        }
        if (g_stdout_to && !freopen(g_stdout_to, "w", stdout)) _exit(126);
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    ck_assert_int_gt(pid, 0);
    return pid;
}

static int wait_exit(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

static int run(int np, const char *const *args) { return wait_exit(spawn(np, args)); }

static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

/* Records of a JSONL file, timing fields dropped, sorted by line; one string each
 * line of the result. Also checks every line parses. *n_out: record count. */
static char *normalized(const char *path, int *n_out) {
    size_t n = 0;
    char *data = tu_read_file(path, &n);
    ck_assert_msg(data != NULL, "cannot read %s", path);
    ck_assert_msg(n == 0 || data[n - 1] == '\n', "%s does not end in a newline", path);
    char *lines[1024];
    long keys[1024];
    int k = 0;
    for (char *s = data, *e; *s; s = e + 1) {
        e = strchr(s, '\n');
        *e = '\0';
        cJSON *j = cJSON_Parse(s);
        ck_assert_msg(j != NULL, "%s: record %d is not JSON: %s", path, k + 1, s);
        cJSON_DeleteItemFromObject(j, "ttft_ms");
        cJSON_DeleteItemFromObject(j, "decode_tps");
        cJSON *resp = cJSON_GetObjectItem(j, "response");
        cJSON *body = resp ? cJSON_GetObjectItem(resp, "body") : NULL;
        if (body && cJSON_IsObject(body)) cJSON_DeleteItemFromObject(body, "created");
        cJSON *line = cJSON_GetObjectItem(j, "line");
        long key = line ? (long)line->valuedouble : 0;
        if (!line && resp) sscanf(cJSON_GetObjectItem(resp, "request_id")->valuestring,
                                  "tpinfer-batch-%ld", &key);
        ck_assert_int_lt(k, 1024);
        keys[k] = key;
        lines[k++] = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
    }
    for (int a = 1; a < k; a++) // insertion sort by line
        for (int b = a; b > 0 && keys[b - 1] > keys[b]; b--) {
            long t = keys[b]; keys[b] = keys[b - 1]; keys[b - 1] = t;
            char *p = lines[b]; lines[b] = lines[b - 1]; lines[b - 1] = p;
        }
    size_t total = 1;
    for (int i = 0; i < k; i++) total += strlen(lines[i]) + 1;
    char *out = malloc(total);
    out[0] = '\0';
    for (int i = 0; i < k; i++) {
        ck_assert_msg(i == 0 || keys[i] != keys[i - 1], "%s: line %ld has two records", path,
                      keys[i]);
        strcat(out, lines[i]);
        strcat(out, "\n");
        free(lines[i]);
    }
    free(data);
    *n_out = k;
    return out;
}

/* Equal record sets, or fail showing the first differing record. */
static void assert_same(const char *label, const char *got, const char *want) {
    if (!strcmp(got, want)) return;
    const char *g = got, *w = want;
    while (*g && *g == *w) g++, w++;
    while (g > got && g[-1] != '\n') g--, w--;
    const char *ge = strchr(g, '\n'), *we = strchr(w, '\n');
    ck_abort_msg("%s: records differ\n  got:  %.*s\n  want: %.*s", label,
                 ge ? (int)(ge - g) : (int)strlen(g), g, we ? (int)(we - w) : (int)strlen(w), w);
}

static cJSON *record_by_line(const char *norm, long line) {
    for (const char *s = norm; *s;) {
        const char *e = strchr(s, '\n');
        cJSON *j = cJSON_ParseWithLength(s, (size_t)(e - s));
        cJSON *l = cJSON_GetObjectItem(j, "line");
        cJSON *resp = cJSON_GetObjectItem(j, "response");
        long key = l ? (long)l->valuedouble : -1;
        if (!l && resp)
            sscanf(cJSON_GetObjectItem(resp, "request_id")->valuestring, "tpinfer-batch-%ld", &key);
        if (key == line) return j;
        cJSON_Delete(j);
        s = e + 1;
    }
    ck_abort_msg("no record for line %ld", line);
    return NULL;
}

/* Error records among the normalized records (ours: finish_reason "error"; OpenAI's:
 * a non-null "error"). */
static int count_error_records(const char *norm) {
    int n = 0;
    for (const char *s = norm; *s;) {
        const char *e = strchr(s, '\n');
        cJSON *j = cJSON_ParseWithLength(s, (size_t)(e - s));
        const cJSON *fr = cJSON_GetObjectItem(j, "finish_reason");
        const cJSON *er = cJSON_GetObjectItem(j, "error");
        n += (cJSON_IsString(fr) && !strcmp(fr->valuestring, "error")) ||
             (er && !cJSON_IsNull(er));
        cJSON_Delete(j);
        s = e + 1;
    }
    return n;
}

/* Run the driver (np ranks) with args, which write -o `out`; expect n_records records
 * and exit 0, or exit 4 when some of them are error records; returns them normalized
 * (caller frees). */
static char *run_records(int np, const char *const *args, const char *out, int n_records) {
    const int code = run(np, args);
    int n;
    char *norm = normalized(out, &n);
    ck_assert_int_eq(n, n_records);
    ck_assert_int_eq(code, count_error_records(norm) ? 4 : 0);
    return norm;
}

/* A file of n prompts of mixed length (deterministic). */
static void make_prompts(const char *path, int n, int max_tokens) {
    static const char *words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy",
                                  "dog", "while", "rain", "falls", "on", "green", "hills"};
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"id\": \"p%d\", \"max_tokens\": %d, \"prompt\": \"", i, max_tokens);
        int len = 1 + (i * 7) % 23;
        for (int w = 0; w < len; w++) fprintf(f, "%s%s", w ? " " : "", words[(i * 3 + w * 5) % 15]);
        fprintf(f, "\"}\n");
    }
    fclose(f);
}

START_TEST(test_inputs) {
    char long_prompt[4096] = "{\"id\": \"long\", \"prompt\": \"";
    for (int i = 0; i < 120; i++) strcat(long_prompt, "word ");
    strcat(long_prompt, "\"}\n");
    // Prompts of token ids at the context's edge (-c 64): 64 leave no room to generate,
    // 63 leave room for one token.
    char edge[2][512];
    for (int e = 0; e < 2; e++) {
        int k = snprintf(edge[e], sizeof edge[e], "{\"id\": \"edge%d\", \"prompt\": [", 64 - e);
        for (int t = 0; t < 64 - e; t++)
            k += snprintf(edge[e] + k, sizeof edge[e] - (size_t)k, "%s%d", t ? "," : "", 100 + t);
        snprintf(edge[e] + k, sizeof edge[e] - (size_t)k, "]}\n");
    }
    char text[8192];
    snprintf(text, sizeof text,
             "\xEF\xBB\xBF" // a UTF-8 byte order mark: still a JSON lines file
             "{\"id\": \"a\", \"prompt\": \"Hello world\"}\n"
             "{\"id\": 7, \"prompt\": [100, 200, 300], \"stop\": [\"zzzz\"]}\n"
             "{\"id\": \"num\", \"prompt\": 42}\n"
             "{\"id\": \"broken\", \"prompt\": \"no closing brace\"\n"
             "{\"id\": \"empty\", \"prompt\": \"\"}\n"
             "%s"
             "\n"
             "{\"id\": \"chat\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
             "{\"role\": \"user\", \"content\": \"Hi there\"}], \"logprobs\": 2}\n"
             "{\"custom_id\": \"oc\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", "
             "\"body\": {\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": "
             "\"Hey\"}], \"max_tokens\": 6}}\n"
             "{\"custom_id\": \"ot\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
             "\"body\": {\"prompt\": \"Once upon a time\", \"max_tokens\": 5, \"logprobs\": 1}}\n"
             "{\"custom_id\": \"bad\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", "
             "\"body\": {\"input\": \"x\"}}\n"
             "{\"prompt\": \"no id here\", \"temperature\": \"hot\"}\n"
             "{\"id\": \"bigseed\", \"prompt\": \"Hi\", \"seed\": 3.1e33}\n"
             "{\"id\": \"maxseed\", \"prompt\": \"Hi\", \"seed\": 18446744073709551615}\n"
             "{\"id\": \"minseed\", \"prompt\": \"Hi\", \"seed\": -9223372036854775808}\n"
             "{\"id\": \"two\", \"prompt\": \"Hi\"} {\"id\": \"more\"}\n"
             "%s%s",
             long_prompt, edge[0], edge[1]);
    write_file(path_in("in.jsonl"), text);
    const char *args[] = {"-f", path_in("in.jsonl"), "-o", path_in("out.jsonl"), "-n", "8",
                          "--temp", "0", "-c", "64", NULL};
    g_stderr_to = path_in("in.err");
    // Lines that cannot run: exit 4, each named on stderr, the others' records written.
    ck_assert_int_eq(run(1, args), 4);
    g_stderr_to = NULL;
    char *stderr_text = tu_read_file(path_in("in.err"), NULL);
    ck_assert_ptr_nonnull(stderr_text);
    int n = 0;
    char *norm = normalized(path_in("out.jsonl"), &n);
    ck_assert_int_eq(n, 17); // every non-blank line has one record
    ck_assert_int_eq(count_error_records(norm), 9);
    ck_assert_msg(strstr(stderr_text, "in.jsonl: 9 of 17 lines could not run"),
                  "no closing line: %s", stderr_text);
    ck_assert_msg(strstr(stderr_text, "in.jsonl: line 11: "), "line 11 unnamed: %s", stderr_text);

    struct { long line; const char *id; const char *err_part; } errs[] = {
        {3, "\"num\"", "line 3: \"prompt\" must be a string"},
        {4, "4", "line 4: not valid JSON"},
        {5, "\"empty\"", "line 5: the prompt is empty"},
        {6, "\"long\"", "line 6: the prompt has"},
        {12, "12", "line 12: \"temperature\" must be a number"},
        {13, "\"bigseed\"", "line 13: \"seed\" must be an integer in [-2^63, 2^64)"},
        {16, "16", "line 16: not valid JSON"}, // a value, then more: not one JSON line
        {17, "\"edge64\"", "line 17: the prompt has 64 tokens and the context 64 positions"},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        cJSON *j = record_by_line(norm, errs[i].line);
        char *id = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "id"));
        ck_assert_str_eq(id, errs[i].id);
        ck_assert_str_eq(cJSON_GetObjectItem(j, "finish_reason")->valuestring, "error");
        const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message")->valuestring;
        ck_assert_msg(strstr(msg, errs[i].err_part), "line %ld: message '%s' lacks '%s'",
                      errs[i].line, msg, errs[i].err_part);
        char named[128]; // the same message on stderr, after the file's name
        snprintf(named, sizeof named, "in.jsonl: %s", errs[i].err_part);
        ck_assert_msg(strstr(stderr_text, named), "stderr lacks '%s': %s", named, stderr_text);
        free(id);
        cJSON_Delete(j);
    }
    // Good lines of ours: text, tokens, finish reason, counts.
    long good[] = {1, 2, 8, 14, 15, 18}; // 14, 15: the ends of the seeds' range
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cJSON *j = record_by_line(norm, good[i]);
        const char *fr = cJSON_GetObjectItem(j, "finish_reason")->valuestring;
        ck_assert_msg(!strcmp(fr, "length") || !strcmp(fr, "stop"), "line %ld: %s", good[i], fr);
        int nt = cJSON_GetArraySize(cJSON_GetObjectItem(j, "tokens"));
        ck_assert_int_eq(nt, (int)cJSON_GetObjectItem(j, "completion_tokens")->valuedouble);
        ck_assert_int_gt(nt, 0);
        ck_assert_int_gt(strlen(cJSON_GetObjectItem(j, "text")->valuestring), 0);
        ck_assert_int_gt((int)cJSON_GetObjectItem(j, "prompt_tokens")->valuedouble, 0);
        if (good[i] == 2) ck_assert_int_eq((int)cJSON_GetObjectItem(j, "prompt_tokens")->valuedouble, 3);
        if (good[i] == 18) { // the last position of the context: one token, then "length"
            ck_assert_int_eq((int)cJSON_GetObjectItem(j, "prompt_tokens")->valuedouble, 63);
            ck_assert_int_eq(nt, 1);
            ck_assert_str_eq(fr, "length");
        }
        if (good[i] == 8) { // logprobs: per token, 2 [id, logprob] pairs, best first
            cJSON *lp = cJSON_GetObjectItem(j, "logprobs");
            ck_assert_int_eq(cJSON_GetArraySize(lp), nt);
            cJSON *row = cJSON_GetArrayItem(lp, 0);
            ck_assert_int_eq(cJSON_GetArraySize(row), 2);
            double l0 = cJSON_GetArrayItem(cJSON_GetArrayItem(row, 0), 1)->valuedouble;
            double l1 = cJSON_GetArrayItem(cJSON_GetArrayItem(row, 1), 1)->valuedouble;
            ck_assert(l0 <= 0 && l1 <= l0);
            // greedy: the chosen token is the best one
            ck_assert_int_eq((int)cJSON_GetArrayItem(cJSON_GetArrayItem(row, 0), 0)->valuedouble,
                             (int)cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tokens"), 0)->valuedouble);
        }
        cJSON_Delete(j);
    }
    // OpenAI lines: vLLM's shape.
    cJSON *j = record_by_line(norm, 9);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "custom_id")->valuestring, "oc");
    cJSON *resp = cJSON_GetObjectItem(j, "response");
    ck_assert_int_eq((int)cJSON_GetObjectItem(resp, "status_code")->valuedouble, 200);
    cJSON *body = cJSON_GetObjectItem(resp, "body");
    ck_assert_str_eq(cJSON_GetObjectItem(body, "object")->valuestring, "chat.completion");
    ck_assert_str_eq(cJSON_GetObjectItem(body, "model")->valuestring, "tiny");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(body, "choices"), 0);
    ck_assert_int_gt(strlen(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    cJSON *u = cJSON_GetObjectItem(body, "usage");
    ck_assert_int_eq((int)cJSON_GetObjectItem(u, "completion_tokens")->valuedouble, 6);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "error")));
    cJSON_Delete(j);
    j = record_by_line(norm, 10);
    body = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response"), "body");
    ck_assert_str_eq(cJSON_GetObjectItem(body, "object")->valuestring, "text_completion");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(body, "choices"), 0);
    ck_assert_int_gt(strlen(cJSON_GetObjectItem(c0, "text")->valuestring), 0);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"),
                                                            "token_logprobs")), 5);
    cJSON_Delete(j);
    j = record_by_line(norm, 11);
    ck_assert_int_eq((int)cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response"), "status_code")->valuedouble, 400);
    ck_assert(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message")->valuestring, "line 11"));
    cJSON_Delete(j);
    free(norm);
    free(stderr_text);

    // Plain text: a prompt a line, ids are line numbers; stdin works too.
    write_file(path_in("plain.txt"), "The cat sat\n\nOn the mat\n{not json but plain}\n");
    const char *pargs[] = {"-f", path_in("plain.txt"), "-o", path_in("plain.out"), "-n", "4",
                           "--temp", "0", "--ordered", NULL};
    ck_assert_int_eq(run(1, pargs), 0);
    norm = normalized(path_in("plain.out"), &n);
    ck_assert_int_eq(n, 3);
    long plines[] = {1, 3, 4};
    for (int i = 0; i < 3; i++) {
        j = record_by_line(norm, plines[i]);
        ck_assert_int_eq((long)cJSON_GetObjectItem(j, "id")->valuedouble, plines[i]);
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tokens")), 4);
        cJSON_Delete(j);
    }
    free(norm);

    // Many lines that cannot run: the first ten named, then how many more; the good line
    // still runs.
    char many[1024] = "";
    for (int i = 0; i < 12; i++) strcat(many, "{\"prompt\": 5}\n");
    strcat(many, "{\"prompt\": \"Good\", \"max_tokens\": 2}\n");
    write_file(path_in("many.jsonl"), many);
    const char *margs[] = {"-f", path_in("many.jsonl"), "-o", path_in("many.out"), NULL};
    g_stderr_to = path_in("many.err");
    ck_assert_int_eq(run(1, margs), 4);
    g_stderr_to = NULL;
    char *merr = tu_read_file(path_in("many.err"), NULL);
    ck_assert_ptr_nonnull(merr);
    ck_assert_msg(strstr(merr, "many.jsonl: line 10: \"prompt\" must be"), "%s", merr);
    ck_assert_msg(!strstr(merr, "many.jsonl: line 11: "), "line 11 named: %s", merr);
    ck_assert_msg(strstr(merr, "many.jsonl: 2 more lines with errors"), "%s", merr);
    ck_assert_msg(strstr(merr, "many.jsonl: 12 of 13 lines could not run"), "%s", merr);
    free(merr);
    norm = normalized(path_in("many.out"), &n);
    ck_assert_int_eq(n, 13);
    ck_assert_int_eq(count_error_records(norm), 12);
    free(norm);

    // An output that is the prompt file or the model, spelled another way: refused with
    // one line before anything is opened for writing, both files left as they were. The
    // model is a copy in the test's folder (root may write over a read-only file).
    const char *prompts = "{\"id\": \"k\", \"prompt\": \"Keep me\"}\n";
    write_file(path_in("keep.jsonl"), prompts);
    size_t n_model = 0;
    char *model = tu_read_file(g_model, &n_model);
    ck_assert_ptr_nonnull(model);
    FILE *mf = fopen(path_in("copy.gguf"), "wb");
    ck_assert_ptr_nonnull(mf);
    ck_assert_uint_eq(fwrite(model, 1, n_model, mf), n_model);
    fclose(mf);
    const char *model0 = g_model;
    g_model = path_in("copy.gguf");
    const char *same[2] = {path_in("./keep.jsonl"), path_in("sub/../copy.gguf")};
    const char *what[2] = {"is the prompt file", "is the model"};
    ck_assert_int_eq(mkdir(path_in("sub"), 0755), 0);
    for (int i = 0; i < 2; i++) {
        g_stderr_to = path_in("apart.err");
        const char *aargs[] = {"-f", path_in("keep.jsonl"), "-o", same[i], "-n", "2", NULL};
        const int st = run(1, aargs);
        g_stderr_to = NULL;
        char *e = tu_read_file(path_in("apart.err"), NULL);
        fprintf(stderr, "-o %s: exit %d: %s", same[i], st, e ? e : "(no stderr)\n");
        ck_assert_int_ne(st, 0);
        ck_assert_msg(e && strstr(e, what[i]) && strstr(e, same[i]), "unclear error: %s", e);
        free(e);
        char *kept = tu_read_file(path_in("keep.jsonl"), NULL);
        ck_assert_str_eq(kept, prompts);
        free(kept);
        size_t n_now = 0;
        char *now = tu_read_file(g_model, &n_now);
        ck_assert(now && n_now == n_model && memcmp(now, model, n_model) == 0);
        free(now);
    }
    g_model = model0;
    free(model);

    /* An output that cannot take the records (a full disk): exit 1 and one line that says
     * why and what is in the file, with or without --fsync. */
    if (access("/dev/full", W_OK) != 0) {
        fprintf(stderr, "test_inputs: no writable /dev/full here: the full-disk case skipped\n");
        return;
    }
    for (int sync = 0; sync < 2; sync++) {
        g_stderr_to = path_in("full.err");
        const char *opt = sync ? "--fsync" : NULL;
        const char *fargs[] = {"-f", path_in("keep.jsonl"), "-o", "/dev/full", "-n", "2", opt,
                               NULL};
        const int st = run(1, fargs);
        g_stderr_to = NULL;
        char *e = tu_read_file(path_in("full.err"), NULL);
        fprintf(stderr, "-o /dev/full%s: exit %d: %s", sync ? " --fsync" : "", st,
                e ? e : "(no stderr)\n");
        ck_assert_int_eq(st, 1);
        ck_assert_msg(e && strstr(e, "tpinfer run: cannot write a result record to /dev/full: ") &&
                          strstr(e, "0 records written this run; --resume finishes the rest"),
                      "unclear error: %s", e);
        free(e);
    }
}
END_TEST

START_TEST(test_parallel) {
    make_prompts(path_in("p.jsonl"), 14, 12);
    const char *a1[] = {"-f", path_in("p.jsonl"), "-o", path_in("p1.jsonl"), "--temp", "0",
                        "--parallel", "1", NULL};
    const char *a8[] = {"-f", path_in("p.jsonl"), "-o", path_in("p8.jsonl"), "--temp", "0",
                        "--parallel", "8", NULL};
    const char *au[] = {"-f", path_in("p.jsonl"), "-o", path_in("pu.jsonl"), "--temp", "0",
                        "--parallel", "5", "--ubatch", "4", "--ordered", NULL};
    // Sampling too: each request's own seed (run seed + line) makes it repeatable.
    const char *s1[] = {"-f", path_in("p.jsonl"), "-o", path_in("s1.jsonl"), "--temp", "0.9",
                        "--seed", "5", "--parallel", "1", NULL};
    const char *s8[] = {"-f", path_in("p.jsonl"), "-o", path_in("s8.jsonl"), "--temp", "0.9",
                        "--seed", "5", "--parallel", "8", "--ubatch", "16", NULL};
    ck_assert_int_eq(run(1, a1), 0);
    ck_assert_int_eq(run(1, a8), 0);
    ck_assert_int_eq(run(1, au), 0);
    ck_assert_int_eq(run(1, s1), 0);
    ck_assert_int_eq(run(1, s8), 0);
    int n1, n8, nu, ns1, ns8;
    char *r1 = normalized(path_in("p1.jsonl"), &n1);
    char *r8 = normalized(path_in("p8.jsonl"), &n8);
    char *ru = normalized(path_in("pu.jsonl"), &nu);
    char *q1 = normalized(path_in("s1.jsonl"), &ns1);
    char *q8 = normalized(path_in("s8.jsonl"), &ns8);
    ck_assert_int_eq(n1, 14);
    ck_assert_int_eq(n8, 14);
    ck_assert_int_eq(nu, 14);
    assert_same("--parallel 8 vs 1", r8, r1);
    assert_same("--ubatch 4 vs default", ru, r1);
    assert_same("sampled, --parallel 8 vs 1", q8, q1);
    ck_assert_msg(strcmp(q1, r1) != 0, "temperature 0.9 gave the greedy texts");
    // --ordered: the file itself is in input order.
    size_t nb;
    char *raw = tu_read_file(path_in("pu.jsonl"), &nb);
    long prev = 0;
    for (char *s = raw; *s;) {
        char *e = strchr(s, '\n');
        cJSON *j = cJSON_ParseWithLength(s, (size_t)(e - s));
        long l = (long)cJSON_GetObjectItem(j, "line")->valuedouble;
        ck_assert_int_gt(l, prev);
        prev = l;
        cJSON_Delete(j);
        s = e + 1;
    }
    free(raw);
    free(r1), free(r8), free(ru), free(q1), free(q8);
}
END_TEST

/* The "(N logits rows copied whole)" figure of a run's summary line in file err. */
static long whole_rows(const char *err) {
    size_t nb;
    char *text = tu_read_file(err, &nb);
    ck_assert_msg(text != NULL, "cannot read %s", err);
    const char *at = strstr(text, "batch summary");
    ck_assert_msg(at != NULL, "no summary in %s", err);
    at = strstr(at, " logits rows copied whole)");
    ck_assert_msg(at != NULL, "no whole-rows count in %s", err);
    while (at > text && at[-1] != '(') at--;
    const long n = strtol(at, NULL, 10);
    free(text);
    return n;
}

/* The logits left on the backend change nothing: every kind of sampler (greedy, top-k
 * with and without penalties, bans from min_tokens, a bias, logprobs, penalties that
 * raise logits, no top-k) gives the records the whole rows give, and only the rows whose
 * sampler needs the whole row are copied out (TPI_LOGITS_KEEP=0: every one). */
START_TEST(test_keep) {
    write_file(path_in("k.jsonl"),
               "{\"prompt\": \"the quick brown\", \"max_tokens\": 10, \"temperature\": 0}\n"
               "{\"prompt\": \"the quick brown\", \"max_tokens\": 10, \"temperature\": 0.8, "
               "\"top_k\": 40, \"seed\": 1}\n"
               "{\"prompt\": \"the the the quick\", \"max_tokens\": 10, \"temperature\": 0.7, "
               "\"top_k\": 20, \"top_p\": 0.9, \"min_p\": 0.05, \"repetition_penalty\": 1.3, "
               "\"presence_penalty\": 0.5, \"frequency_penalty\": 0.3, \"seed\": 2}\n"
               "{\"prompt\": \"a a a a\", \"max_tokens\": 10, \"temperature\": 0, "
               "\"repetition_penalty\": 1.5}\n"
               "{\"prompt\": \"hello\", \"max_tokens\": 8, \"min_tokens\": 6, \"temperature\": 0.9, "
               "\"top_k\": 5, \"seed\": 3}\n"
               "{\"prompt\": \"hello there\", \"max_tokens\": 6, \"temperature\": 0, "
               "\"logprobs\": 3}\n"
               "{\"prompt\": \"hello there\", \"max_tokens\": 6, \"temperature\": 1, "
               "\"top_k\": -1, \"seed\": 4}\n"
               "{\"prompt\": \"hello there\", \"max_tokens\": 6, \"temperature\": 0, "
               "\"logit_bias\": {\"77\": 5}}\n"
               "{\"prompt\": \"x y x y\", \"max_tokens\": 8, \"temperature\": 0.8, \"top_k\": 10, "
               "\"presence_penalty\": -1, \"seed\": 5}\n"
               "{\"prompt\": \"x y x y\", \"max_tokens\": 8, \"temperature\": 0.8, \"top_k\": 10, "
               "\"repetition_penalty\": 0.8, \"seed\": 6}\n");
    const char *kept[] = {"-f", path_in("k.jsonl"), "-o", path_in("k1.jsonl"), "--parallel", "6",
                          NULL};
    const char *whole[] = {"-f", path_in("k.jsonl"), "-o", path_in("k0.jsonl"), "--parallel",
                           "6", NULL};
    g_stderr_to = path_in("k1.err");
    ck_assert_int_eq(run(1, kept), 0);
    setenv("TPI_LOGITS_KEEP", "0", 1);
    g_stderr_to = path_in("k0.err");
    ck_assert_int_eq(run(1, whole), 0);
    unsetenv("TPI_LOGITS_KEEP");
    g_stderr_to = NULL;
    int n1, n0;
    char *r1 = normalized(path_in("k1.jsonl"), &n1);
    char *r0 = normalized(path_in("k0.jsonl"), &n0);
    ck_assert_int_eq(n1, 10);
    assert_same("logits kept vs copied whole", r1, r0);
    // Every record ran its max_tokens (no end of text here): 82 sampled rows. Whole rows
    // for logprobs (6), no top-k (6), the bias (6) and the two lines whose penalties
    // raise logits (8 + 8): 34; the other 48 from the candidates.
    long gen = 0;
    for (const char *s = strstr(r1, "\"completion_tokens\":"); s;
         s = strstr(s + 1, "\"completion_tokens\":"))
        gen += strtol(s + strlen("\"completion_tokens\":"), NULL, 10);
    ck_assert_int_eq(gen, 82);
    ck_assert_int_eq(whole_rows(path_in("k1.err")), 34);
    ck_assert_int_eq(whole_rows(path_in("k0.err")), 82);
    free(r1), free(r0);
}
END_TEST

/* The "choices" of a record as compact JSON strings, timing dropped. */
static char *choice_json(const cJSON *rec, int k) {
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(rec, "choices"), k);
    ck_assert_msg(c != NULL, "no choice %d", k);
    ck_assert_int_eq((int)cJSON_GetObjectItem(c, "index")->valuedouble, k);
    cJSON *d = cJSON_Duplicate(c, 1);
    cJSON_DeleteItemFromObject(d, "index");
    char *s = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    return s;
}

/* n completions per request: greedy choices equal the n = 1 result, sampled choice 0
 * equals the n = 1 request with the same seed and the others differ, usage sums,
 * out-of-range n is an error record, and the records do not depend on --parallel,
 * --ubatch or --ordered; --resume skips requests whose record is there. OpenAI fields
 * that are not implemented refuse their line unless neutral. */
START_TEST(test_choices) {
    write_file(path_in("c.jsonl"),
               "{\"id\": \"g1\", \"prompt\": \"The cat sat\", \"max_tokens\": 6}\n"
               "{\"id\": \"g3\", \"prompt\": \"The cat sat\", \"max_tokens\": 6, \"n\": 3}\n"
               "{\"id\": \"s1\", \"prompt\": \"The cat sat\", \"max_tokens\": 6, "
               "\"temperature\": 1.0, \"seed\": 11, \"logprobs\": 2}\n"
               "{\"id\": \"s4\", \"prompt\": \"The cat sat\", \"max_tokens\": 6, "
               "\"temperature\": 1.0, \"seed\": 11, \"logprobs\": 2, \"n\": 4}\n"
               "{\"custom_id\": \"oc\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", "
               "\"body\": {\"messages\": [{\"role\": \"user\", \"content\": \"Hey\"}], "
               "\"max_tokens\": 5, \"temperature\": 1.0, \"seed\": 3, \"n\": 2}}\n"
               "{\"id\": \"n0\", \"prompt\": \"x\", \"n\": 0}\n"
               "{\"id\": \"n65\", \"prompt\": \"x\", \"n\": 65}\n"
               // OpenAI fields not implemented are refused unless neutral; penalties run
               "{\"id\": \"echo\", \"prompt\": \"x\", \"echo\": true}\n"
               "{\"custom_id\": \"pp\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
               "\"body\": {\"prompt\": \"x\", \"presence_penalty\": 0.5, \"max_tokens\": 4}}\n"
               "{\"id\": \"neutral\", \"prompt\": \"The cat sat\", \"max_tokens\": 2, "
               "\"presence_penalty\": 0, \"frequency_penalty\": 0, \"echo\": false, \"best_of\": 1, "
               "\"logit_bias\": {}, \"suffix\": \"\"}\n"
               "{\"id\": \"bo\", \"prompt\": \"x\", \"n\": 2, \"best_of\": 3}\n"
               "{\"id\": \"sfx\", \"prompt\": \"x\", \"suffix\": \"y\"}\n");
    const char *a1[] = {"-f", path_in("c.jsonl"), "-o", path_in("c1.jsonl"), "--temp", "0",
                        "--parallel", "1", NULL};
    const char *a3[] = {"-f", path_in("c.jsonl"), "-o", path_in("c3.jsonl"), "--temp", "0",
                        "--parallel", "3", "--ubatch", "4", "--ordered", NULL};
    char *r1 = run_records(1, a1, path_in("c1.jsonl"), 12);
    char *r3 = run_records(1, a3, path_in("c3.jsonl"), 12);
    assert_same("choices, --parallel 3 --ubatch 4 vs --parallel 1", r3, r1);

    // Greedy: the flat n = 1 record's completion, three times.
    cJSON *g1 = record_by_line(r1, 1), *g3 = record_by_line(r1, 2);
    ck_assert_ptr_null(cJSON_GetObjectItem(g1, "choices"));
    cJSON *flat = cJSON_CreateObject();
    cJSON_AddItemToObject(flat, "text", cJSON_Duplicate(cJSON_GetObjectItem(g1, "text"), 1));
    cJSON_AddItemToObject(flat, "tokens", cJSON_Duplicate(cJSON_GetObjectItem(g1, "tokens"), 1));
    cJSON_AddItemToObject(flat, "finish_reason",
                          cJSON_Duplicate(cJSON_GetObjectItem(g1, "finish_reason"), 1));
    char *want = cJSON_PrintUnformatted(flat);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(g3, "choices")), 3);
    for (int k = 0; k < 3; k++) {
        char *got = choice_json(g3, k);
        ck_assert_str_eq(got, want);
        free(got);
    }
    ck_assert_ptr_null(cJSON_GetObjectItem(g3, "text"));
    ck_assert_int_eq((int)cJSON_GetObjectItem(g3, "completion_tokens")->valuedouble,
                     3 * (int)cJSON_GetObjectItem(g1, "completion_tokens")->valuedouble);
    ck_assert_int_eq((int)cJSON_GetObjectItem(g3, "prompt_tokens")->valuedouble,
                     (int)cJSON_GetObjectItem(g1, "prompt_tokens")->valuedouble);
    free(want);
    cJSON_Delete(flat);

    // Sampled: choice 0 is the n = 1 request with the same seed; the others differ.
    cJSON *s1 = record_by_line(r1, 3), *s4 = record_by_line(r1, 4);
    cJSON *one = cJSON_CreateObject();
    const char *keys[] = {"text", "tokens", "finish_reason", "logprobs"};
    for (int i = 0; i < 4; i++)
        cJSON_AddItemToObject(one, keys[i], cJSON_Duplicate(cJSON_GetObjectItem(s1, keys[i]), 1));
    want = cJSON_PrintUnformatted(one);
    char *c[4];
    long total = 0;
    for (int k = 0; k < 4; k++) {
        c[k] = choice_json(s4, k);
        const cJSON *ck = cJSON_GetArrayItem(cJSON_GetObjectItem(s4, "choices"), k);
        int nt = cJSON_GetArraySize(cJSON_GetObjectItem(ck, "tokens"));
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(ck, "logprobs")), nt);
        total += nt;
    }
    ck_assert_str_eq(c[0], want);
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++)
            ck_assert_msg(strcmp(c[a], c[b]) != 0, "choices %d and %d are the same sample", a, b);
    ck_assert_int_eq((long)cJSON_GetObjectItem(s4, "completion_tokens")->valuedouble, total);
    for (int k = 0; k < 4; k++) free(c[k]);
    free(want);
    cJSON_Delete(one);

    // OpenAI: two choices in index order, usage summed.
    cJSON *oc = record_by_line(r1, 5);
    cJSON *body = cJSON_GetObjectItem(cJSON_GetObjectItem(oc, "response"), "body");
    cJSON *choices = cJSON_GetObjectItem(body, "choices");
    ck_assert_int_eq(cJSON_GetArraySize(choices), 2);
    long sum = 0;
    for (int k = 0; k < 2; k++) {
        cJSON *ck = cJSON_GetArrayItem(choices, k);
        ck_assert_int_eq((int)cJSON_GetObjectItem(ck, "index")->valuedouble, k);
        ck_assert_str_eq(cJSON_GetObjectItem(ck, "finish_reason")->valuestring, "length");
        sum += 5;
    }
    ck_assert_int_eq((long)cJSON_GetObjectItem(cJSON_GetObjectItem(body, "usage"),
                                               "completion_tokens")->valuedouble, sum);

    // Out of range.
    for (long line = 6; line <= 7; line++) {
        cJSON *e = record_by_line(r1, line);
        const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message")->valuestring;
        ck_assert_msg(strstr(msg, "\"n\" must be an integer in [1, 64]"), "line %ld: %s", line, msg);
        cJSON_Delete(e);
    }

    // Refused fields name themselves; neutral values run.
    struct { long line; const char *part; } refused[] = {
        {8, "only /v1/completions takes it"},
        {11, "\"best_of\" is not supported"},
        {12, "\"suffix\" is not supported"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        cJSON *e = record_by_line(r1, refused[i].line);
        const cJSON *err = cJSON_GetObjectItem(e, "error");
        const cJSON *msg = cJSON_GetObjectItem(err, "message");
        ck_assert_msg(cJSON_IsString(msg) && strstr(msg->valuestring, refused[i].part),
                      "line %ld: no error with '%s'", refused[i].line, refused[i].part);
        cJSON_Delete(e);
    }
    cJSON *pp = record_by_line(r1, 9); // presence_penalty is implemented: it runs
    ck_assert_int_eq(
        (int)cJSON_GetObjectItem(cJSON_GetObjectItem(pp, "response"), "status_code")->valuedouble,
        200);
    cJSON_Delete(pp);
    cJSON *neutral = record_by_line(r1, 10);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(neutral, "tokens")), 2);
    cJSON_Delete(neutral);

    // --resume from the first three records of the ordered run finishes the rest alike.
    size_t nb;
    char *raw = tu_read_file(path_in("c3.jsonl"), &nb);
    char *cut = raw;
    for (int k = 0; k < 3; k++) cut = strchr(cut, '\n') + 1;
    *cut = '\0';
    write_file(path_in("cr.jsonl"), raw);
    free(raw);
    const char *ar[] = {"-f", path_in("c.jsonl"), "-o", path_in("cr.jsonl"), "--temp", "0",
                        "--parallel", "2", "--resume", NULL};
    char *rr = run_records(1, ar, path_in("cr.jsonl"), 12);
    assert_same("choices, resumed vs whole", rr, r1);
    cJSON_Delete(g1), cJSON_Delete(g3), cJSON_Delete(s1), cJSON_Delete(s4), cJSON_Delete(oc);
    free(r1), free(r3), free(rr);
}
END_TEST

/* The prompt tokens fed and shared, from a run's summary line in `path`. */
static void summary_tokens(const char *path, long *fed, long *shared) {
    size_t n;
    char *text = tu_read_file(path, &n);
    ck_assert_ptr_nonnull(text);
    const char *line = strstr(text, "batch summary:");
    ck_assert_msg(line != NULL, "%s has no summary line", path);
    const char *p = strstr(line, "prompt tokens ");
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p, "prompt tokens %ld (+%ld shared)", fed, shared), 2);
    free(text);
}

/* Prompts that begin alike take the common prefix's KV from another slot (a
 * sequence in flight, or what a finished one left in its slot, even with one
 * slot): the records equal those of runs that prefill everything
 * (--no-prefix-share), with and without chunked prefill, and the prompt
 * positions add up (fed + shared with sharing = fed without). */
START_TEST(test_prefix) {
    static const char *sys = "You are a careful assistant who answers in one short sentence "
                             "and never repeats the question back to the user";
    char text[8192];
    int o = 0;
    static const char *q[] = {"What is rain?", "Why is the sky blue?", "Name a green hill.",
                              "Who jumps over the lazy dog?"};
    for (int i = 0; i < 4; i++)
        o += snprintf(text + o, sizeof text - (size_t)o,
                      "{\"id\": \"s%d\", \"prompt\": \"%s. %s\", \"max_tokens\": 5}\n", i, sys,
                      q[i]);
    o += snprintf(text + o, sizeof text - (size_t)o,
                  "{\"id\": \"n4\", \"prompt\": \"%s. Tell a story.\", \"max_tokens\": 4, "
                  "\"temperature\": 0.9, \"seed\": 3, \"n\": 4}\n", sys);
    for (int i = 0; i < 2; i++)
        o += snprintf(text + o, sizeof text - (size_t)o,
                      "{\"custom_id\": \"c%d\", \"method\": \"POST\", \"url\": "
                      "\"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"system\", "
                      "\"content\": \"%s\"}, {\"role\": \"user\", \"content\": \"%s\"}], "
                      "\"max_tokens\": 4}}\n", i, sys, q[i]);
    o += snprintf(text + o, sizeof text - (size_t)o, "{\"id\": \"short\", \"prompt\": \"You are\"}\n");
    write_file(path_in("x.jsonl"), text);
    struct { const char *name; const char *opts[6]; } runs[] = {
        {"x1n", {"--parallel", "1", "--no-prefix-share", NULL}},
        {"x4", {"--parallel", "4", NULL}},
        {"x4n", {"--parallel", "4", "--no-prefix-share", NULL}},
        {"x3u", {"--parallel", "3", "--ubatch", "7", NULL}},
        {"x1", {"--parallel", "1", NULL}}, // one slot: what the last sequence left in it
    };
    enum { NR = sizeof runs / sizeof runs[0] };
    char *norm[NR];
    long fed[NR], shared[NR];
    for (int r = 0; r < NR; r++) {
        char out[64], errf[64];
        snprintf(out, sizeof out, "%s.jsonl", runs[r].name);
        snprintf(errf, sizeof errf, "%s.err", runs[r].name);
        const char *args[16] = {"-f", path_in("x.jsonl"), "-o", path_in(out), "--temp", "0",
                                "-n", "6"};
        int k = 8;
        for (int j = 0; runs[r].opts[j]; j++) args[k++] = runs[r].opts[j];
        args[k] = NULL;
        g_stderr_to = path_in(errf);
        norm[r] = run_records(1, args, path_in(out), 8);
        g_stderr_to = NULL;
        summary_tokens(path_in(errf), &fed[r], &shared[r]);
    }
    for (int r = 0; r < NR; r++)
        fprintf(stderr, "prefix %s: prompt tokens fed %ld, shared %ld\n", runs[r].name, fed[r],
                shared[r]);
    ck_assert_int_eq(shared[0], 0); // --no-prefix-share
    ck_assert_int_eq(shared[2], 0);
    for (int r = 1; r < NR; r++) {
        ck_assert_int_eq(fed[r] + shared[r], fed[0]);
        if (r != 2) ck_assert_int_gt(shared[r], 0);
    }
    // n = 4 of one prompt: three of them take all but its last token, at least.
    ck_assert_int_ge(shared[1], 3 * 8);
    // One slot in turn: every prompt after the first begins with the system text.
    ck_assert_int_ge(shared[4], 6 * 8);
    assert_same("prefix shared, --parallel 4 vs prefilling all", norm[1], norm[0]);
    assert_same("--no-prefix-share, --parallel 4 vs 1", norm[2], norm[0]);
    assert_same("prefix shared, --parallel 3 --ubatch 7 vs prefilling all", norm[3], norm[0]);
    assert_same("prefix kept in the one slot vs prefilling all", norm[4], norm[0]);
    for (int r = 0; r < NR; r++) free(norm[r]);
}
END_TEST

/* /v1/completions with "echo": the text starts with the prompt's, and with logprobs
 * every prompt token after the first is scored: its logprob and top alternatives
 * equal what `tpinfer run --prompt-logprobs` computes for the same prompt (the whole
 * vocabulary there, so the prompt token's own logprob is in it), also when the
 * prompt needs several steps of scored rows (--ubatch 8) and with a second request
 * of the same prompt in flight (scored prompts do not share). Elsewhere echo is an
 * error record. */
START_TEST(test_echo) {
    static const char prompt[] = "the quick brown fox jumps over a lazy dog while rain falls on "
                                 "green hills and the wind turns the mill; a slow grey cat "
                                 "watches from the wall until the evening bell rings twice";
    char text[4096];
    int o = 0;
    for (int i = 0; i < 2; i++)
        o += snprintf(text + o, sizeof text - (size_t)o,
                      "{\"custom_id\": \"e%d\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                      "\"body\": {\"prompt\": \"%s\", \"max_tokens\": %d, \"logprobs\": 2, "
                      "\"echo\": true}}\n", i, prompt, 1 + i);
    o += snprintf(text + o, sizeof text - (size_t)o,
                  "{\"custom_id\": \"t\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                  "\"body\": {\"prompt\": \"Hello there\", \"max_tokens\": 3, \"echo\": true}}\n"
                  "{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", "
                  "\"body\": {\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"echo\": true}}\n"
                  "{\"id\": \"ours\", \"prompt\": \"x\", \"echo\": true}\n");
    write_file(path_in("e.jsonl"), text);
    const char *a1[] = {"-f", path_in("e.jsonl"), "-o", path_in("e1.jsonl"), "--temp", "0",
                        "--parallel", "1", NULL};
    const char *a3[] = {"-f", path_in("e.jsonl"), "-o", path_in("e3.jsonl"), "--temp", "0",
                        "--parallel", "3", "--ubatch", "8", NULL};
    char *r1 = run_records(1, a1, path_in("e1.jsonl"), 5);
    char *r3 = run_records(1, a3, path_in("e3.jsonl"), 5);
    assert_same("echo, --parallel 3 --ubatch 8 vs --parallel 1", r3, r1);
    // The reference: the whole vocabulary's logprobs after every prompt token.
    const char *ref_args[] = {"-p", prompt, "--prompt-logprobs", "2048", "-n", "1", "--temp",
                              "0", "--json", NULL};
    g_stdout_to = path_in("ref.json");
    ck_assert_int_eq(run(1, ref_args), 0);
    g_stdout_to = NULL;
    cJSON *ref = tu_read_json(path_in("ref.json"));
    ck_assert_ptr_nonnull(ref);
    const cJSON *ptoks = cJSON_GetObjectItem(ref, "prompt_tokens");
    const cJSON *plp = cJSON_GetObjectItem(ref, "prompt_logprobs");
    const int n_prompt = cJSON_GetArraySize(ptoks);
    ck_assert_int_ge(n_prompt, 70); // more scored rows than one step takes (64)
    int n_outside = 0; // prompt tokens outside their row's top 2
    for (long line = 1; line <= 2; line++) {
        cJSON *rec = record_by_line(r1, line);
        const cJSON *c0 = cJSON_GetArrayItem(
            cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(rec, "response"), "body"),
                                "choices"), 0);
        ck_assert_int_eq(strncmp(cJSON_GetObjectItem(c0, "text")->valuestring, prompt,
                                 strlen(prompt)), 0);
        const cJSON *lp = cJSON_GetObjectItem(c0, "logprobs");
        const cJSON *tlp = cJSON_GetObjectItem(lp, "token_logprobs");
        const cJSON *top = cJSON_GetObjectItem(lp, "top_logprobs");
        ck_assert_int_eq(cJSON_GetArraySize(tlp), n_prompt + (int)line); // + generated
        ck_assert(cJSON_IsNull(cJSON_GetArrayItem(tlp, 0)));
        ck_assert(cJSON_IsNull(cJSON_GetArrayItem(top, 0)));
        for (int i = 1; i < n_prompt; i++) {
            const cJSON *row = cJSON_GetArrayItem(plp, i - 1); // after token i - 1
            const int id = cJSON_GetArrayItem(ptoks, i)->valueint;
            double want = 1.0;
            const cJSON *pair;
            cJSON_ArrayForEach(pair, row)
                if (cJSON_GetArrayItem(pair, 0)->valueint == id)
                    want = cJSON_GetArrayItem(pair, 1)->valuedouble;
            ck_assert_msg(want <= 0.0, "token %d: id %d not in the reference row", i, id);
            ck_assert_double_eq(cJSON_GetArrayItem(tlp, i)->valuedouble, want);
            // The top 2, then the prompt token itself when it is not among them (OpenAI's
            // and vLLM's logprobs + 1), with its own logprob.
            const cJSON *m = cJSON_GetArrayItem(top, i);
            const bool in_top = cJSON_GetArrayItem(cJSON_GetArrayItem(row, 0), 0)->valueint == id ||
                                cJSON_GetArrayItem(cJSON_GetArrayItem(row, 1), 0)->valueint == id;
            n_outside += !in_top;
            ck_assert_int_eq(cJSON_GetArraySize(m), in_top ? 2 : 3);
            ck_assert_double_eq(m->child->valuedouble,
                                cJSON_GetArrayItem(cJSON_GetArrayItem(row, 0), 1)->valuedouble);
            bool has_own = false;
            const cJSON *e;
            cJSON_ArrayForEach(e, m) has_own |= e->valuedouble == want;
            ck_assert_msg(has_own, "token %d: its own logprob is not in top_logprobs", i);
        }
        // The generated tokens' maps (greedy: the chosen token is the top one): 2 each.
        for (int i = n_prompt; i < cJSON_GetArraySize(top); i++)
            ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetArrayItem(top, i)), 2);
        cJSON_Delete(rec);
    }
    ck_assert_int_gt(n_outside, 0); // the + 1 case was met
    cJSON *t = record_by_line(r1, 3); // echo without logprobs: the text only
    const cJSON *c0 = cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(t, "response"), "body"),
                            "choices"), 0);
    ck_assert_int_eq(strncmp(cJSON_GetObjectItem(c0, "text")->valuestring, "Hello there", 11), 0);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(c0, "logprobs")));
    cJSON_Delete(t);
    for (long line = 4; line <= 5; line++) {
        cJSON *e = record_by_line(r1, line);
        const cJSON *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message");
        ck_assert_msg(cJSON_IsString(msg) && strstr(msg->valuestring, "only /v1/completions"),
                      "line %ld: echo not refused", line);
        cJSON_Delete(e);
    }
    cJSON_Delete(ref);
    free(r1);
    free(r3);
}
END_TEST

/* Run to a reference, then start again, stop it with `sig` once >= 3 records are
 * written, --resume, and compare. */
/* Finish the interrupted run of the 30 prompts in `in` with --resume on one rank (3
 * sequences in flight) and compare the records of `out` with the uninterrupted `want`
 * (normalized; freed here): each line once, the same texts. */
static void resume_and_compare(const char *in, const char *out, const char *label, char *want) {
    const char *res[] = {"-f", path_in(in), "-o", path_in(out), "--temp", "0", "--parallel", "3",
                         "--resume", NULL};
    ck_assert_int_eq(run(1, res), 0);
    int n_got;
    char *got = normalized(path_in(out), &n_got); // fails on a duplicate line
    ck_assert_int_eq(n_got, 30);
    assert_same(label, got, want);
    free(got);
    free(want);
}

static void interrupted_run(int sig) {
    make_prompts(path_in("k.jsonl"), 30, 24);
    const char *ref[] = {"-f", path_in("k.jsonl"), "-o", path_in("ref.jsonl"), "--temp", "0",
                         "--parallel", "2", NULL};
    ck_assert_int_eq(run(1, ref), 0);
    int n_ref;
    char *want = normalized(path_in("ref.jsonl"), &n_ref);
    ck_assert_int_eq(n_ref, 30);

    const char *args[] = {"-f", path_in("k.jsonl"), "-o", path_in("k.out"), "--temp", "0",
                          "--parallel", "2", NULL};
    unlink(path_in("k.out"));
    pid_t pid = spawn(1, args);
    struct timespec ts = {0, 1000000};
    for (int i = 0; i < 60000 && count_lines(path_in("k.out")) < 3; i++) nanosleep(&ts, NULL);
    kill(pid, sig);
    int code = wait_exit(pid);
    int n_first = count_lines(path_in("k.out"));
    fprintf(stderr, "%s after %d records: exit %d\n", sig == SIGKILL ? "SIGKILL" : "SIGTERM",
            n_first, code);
    if (sig == SIGKILL) ck_assert_int_eq(code, 128 + SIGKILL);
    if (sig == SIGTERM) {
        ck_assert_msg(code == 128 + SIGTERM || (code == 0 && n_first == 30),
                      "SIGTERM: exit %d with %d records", code, n_first);
        int n;
        free(normalized(path_in("k.out"), &n)); // every record complete and parseable
    }
    if (sig == SIGKILL) { // simulate the worst case as well: a torn last line
        FILE *f = fopen(path_in("k.out"), "a");
        fputs("{\"id\": \"p9\", \"line\": 10, \"te", f);
        fclose(f);
    }
    resume_and_compare("k.jsonl", "k.out", "resumed vs uninterrupted", want);
}

/* A record's prompt length: ours "prompt_tokens", OpenAI's usage; -1 for an error record
 * (whose message then goes to *msg when msg is not NULL). */
static int prompt_len(const char *norm, long line, char *msg, size_t n_msg) {
    cJSON *j = record_by_line(norm, line);
    const cJSON *resp = cJSON_GetObjectItem(j, "response");
    const cJSON *body = cJSON_GetObjectItem(resp, "body");
    const cJSON *pt = resp
                          ? cJSON_GetObjectItem(cJSON_GetObjectItem(body, "usage"), "prompt_tokens")
                          : cJSON_GetObjectItem(j, "prompt_tokens");
    int n = cJSON_IsNumber(pt) ? (int)pt->valuedouble : -1;
    const cJSON *e = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
    if (msg) snprintf(msg, n_msg, "%s", cJSON_IsString(e) ? e->valuestring : "");
    cJSON_Delete(j);
    return n;
}

/* A line's error record and a part of its message. */
struct line_error {
    long line;
    const char *err_part;
};

/* Each of errs[0..n) is an error record whose message holds its part. */
static void expect_errors(const char *norm, const struct line_error *errs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char msg[512];
        ck_assert_int_eq(prompt_len(norm, errs[i].line, msg, sizeof msg), -1);
        ck_assert_msg(strstr(msg, errs[i].err_part), "line %ld: '%s' lacks '%s'", errs[i].line,
                      msg, errs[i].err_part);
    }
}

/* Chats through a model with Qwen3's chat template (its vocabulary on a one-layer model
 * from mkmodel). enable_thinking false, from a line's "chat_template_kwargs" or from
 * --chat-template-kwargs for the lines without their own, closes an empty think block
 * after the generation prompt: "<think>", "\n\n", "</think>", "\n\n", 4 tokens. The
 * reasoning of an earlier turn is dropped whether it is in the content or apart. A final
 * assistant turn can be continued (continue_final_message). What the template cannot
 * render is that line's error. (test_tokenizer checks the bytes.) */
START_TEST(test_chat) {
    const char *vocab = tu_data_path("qwen3-vocab.gguf");
    char *model = path_in("qwen3-vocab-1layer.gguf");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' mkmodel -o '%s' --vocab-from '%s' --vocab 151936 --layers 1 --embd 64 "
             "--heads 2 --kv-heads 1 --head-dim 32 --ff 128 -q",
             TPI_BATCH_DRIVER, model, vocab);
    ck_assert_int_eq(system(cmd), 0);
    g_model = model;
    const char *q = "\"messages\": [{\"role\": \"user\", \"content\": \"What is 2 + 2?\"}";
    const char *oai = "{\"custom_id\": \"t\", \"url\": \"/v1/chat/completions\", \"body\": {";
    const char *oai_m = "{\"url\": \"/v1/chat/completions\", \"body\": {\"messages\": ";
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"clock\", "
                        "\"description\": \"The time\", \"parameters\": {\"type\": \"object\", "
                        "\"properties\": {\"tz\": {\"type\": \"number\", \"default\": 0.0}}}}}]";
    char text[8192];
    snprintf(
        text, sizeof text,
        "{\"id\": \"plain\", %s]}\n"
        "{\"id\": \"off\", %s], \"chat_template_kwargs\": {\"enable_thinking\": false}}\n"
        "{\"id\": \"on\", %s], \"chat_template_kwargs\": {\"enable_thinking\": true, "
        "\"other\": 1}}\n"
        "{\"custom_id\": \"oai\", \"url\": \"/v1/chat/completions\", \"body\": {%s], "
        "\"chat_template_kwargs\": {\"enable_thinking\": false}}}\n"
        "{\"id\": \"hist\", %s, {\"role\": \"assistant\", \"content\": "
        "\"<think>\\nhm\\n</think>\\n\\n4\"}, {\"role\": \"user\", \"content\": \"ok\"}]}\n"
        "{\"id\": \"apart\", %s, {\"role\": \"assistant\", \"content\": \"4\", "
        "\"reasoning_content\": \"hm\"}, {\"role\": \"user\", \"content\": \"ok\"}]}\n"
        "{\"id\": \"bare\", %s, {\"role\": \"assistant\", \"content\": \"4\"}, "
        "{\"role\": \"user\", \"content\": \"ok\"}]}\n"
        "{\"id\": \"dev\", \"messages\": [{\"role\": \"developer\", \"content\": \"x\"}]}\n"
        "{\"id\": \"tools\", %s], \"tools\": [{\"type\": \"function\"}]}\n"
        "{\"id\": \"calls\", %s, {\"role\": \"assistant\", \"tool_calls\": [{}]}]}\n"
        "{\"id\": \"kw\", %s], \"chat_template_kwargs\": {\"enable_thinking\": 0}}\n"
        "{\"id\": \"json\", %s], \"response_format\": {\"type\": \"json_object\"}}\n"
        "{\"id\": \"cont\", %s, {\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>"
        "\\n\\nIt is \"}], \"continue_final_message\": true, \"add_generation_prompt\": false}\n"
        "{\"id\": \"cont-gen\", %s, {\"role\": \"assistant\", \"content\": \"It is\"}], "
        "\"continue_final_message\": true}\n"
        "{\"id\": \"cont-lost\", %s, {\"role\": \"assistant\", \"content\": \"<think>x</think>"
        "\\n\\n<think>y\"}], \"continue_final_message\": true, \"add_generation_prompt\": "
        "false}\n"
        "%s%s], %s}}\n"
        "%s%s], %s, \"tool_choice\": \"none\", \"parallel_tool_calls\": false}}\n"
        "%s%s], %s, \"tool_choice\": \"required\"}}\n"
        "%s%s], \"tools\": [{\"function\": {\"name\": \"f\", \"strict\": true}}]}}\n"
        "%s%s, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"clock\", \"arguments\": \"{}\"}}]}, "
        "{\"role\": \"tool\", \"content\": \"12:00\"}], %s}}\n"
        "%s[{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": [{\"function\": "
        "{\"name\": \"f\", \"arguments\": \"{}\"}}]}]}}\n"
        "%s%s, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": "
        "{\"name\": \"f\", \"arguments\": \"{oops}\"}}]}]}}\n"
        "%s%s], %s, \"max_tokens\": 2, \"logit_bias\": {\"151644\": 100}}}\n"
        "%s%s], %s, \"tool_choice\": \"none\", \"max_tokens\": 2, \"logit_bias\": "
        "{\"151644\": 100}}}\n",
        q, q, q, q, q, q, q, q, q, q, q, q, q, q, oai, q, tools, oai, q, tools, oai, q, tools, oai,
        q, oai, q, tools, oai_m, oai, q, oai, q, tools, oai, q, tools);
    write_file(path_in("chat.jsonl"), text);
    const char *args[] = {
        "-f", path_in("chat.jsonl"), "-o", path_in("chat.out"), "-n", "1", "--temp", "0", NULL};
    char *norm = run_records(1, args, path_in("chat.out"), 24);
    const int plain = prompt_len(norm, 1, NULL, 0);
    ck_assert_int_gt(plain, 0);
    ck_assert_int_eq(prompt_len(norm, 2, NULL, 0), plain + 4);
    ck_assert_int_eq(prompt_len(norm, 3, NULL, 0), plain);
    ck_assert_int_eq(prompt_len(norm, 4, NULL, 0), plain + 4);
    const int bare = prompt_len(norm, 7, NULL, 0);
    ck_assert_int_gt(bare, plain);
    ck_assert_int_eq(prompt_len(norm, 5, NULL, 0), bare);
    ck_assert_int_eq(prompt_len(norm, 6, NULL, 0), bare);
    // The assistant's turn continued: the prompt ends inside it, its reasoning written out
    ck_assert_int_gt(prompt_len(norm, 13, NULL, 0), plain + 4);
    // Tools in the system turn: the same prompt whether the model may call them or not;
    // an earlier call and its result make the prompt longer still.
    const int with_tools = prompt_len(norm, 16, NULL, 0);
    ck_assert_int_gt(with_tools, plain + 100);
    ck_assert_int_eq(prompt_len(norm, 17, NULL, 0), with_tools);
    ck_assert_int_gt(prompt_len(norm, 20, NULL, 0), with_tools + 10);
    // A control token drawn (<|im_start|>, biased): in the text where the model may call
    // tools (vLLM's tool parsers keep special tokens), dropped where it may not.
    const char *const want_text[2] = {"<|im_start|><|im_start|>", ""};
    for (int k = 0; k < 2; k++) {
        cJSON *rec = record_by_line(norm, 23 + k);
        const cJSON *body = cJSON_GetObjectItem(cJSON_GetObjectItem(rec, "response"), "body");
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(body, "choices"), 0);
        const cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content");
        ck_assert_msg(cJSON_IsString(content) && !strcmp(content->valuestring, want_text[k]),
                      "line %d: content %s", 23 + k,
                      cJSON_IsString(content) ? content->valuestring : "(none)");
        cJSON_Delete(rec);
    }
    const struct line_error errs[] = {
        {8, "renders no 'developer' messages"},
        {9, "\"tools\" is not supported"},
        {10, "message 1: tool call 0 has no \"function\" with \"name\" and \"arguments\""},
        {11, "\"enable_thinking\" must be true or false"},
        {12, "\"response_format\" is not supported"},
        {14, "\"continue_final_message\" needs \"add_generation_prompt\": false"},
        {15, "the final message does not appear in the rendered chat"},
        {18, "\"tool_choice\" must be \"auto\" or \"none\""},
        {19, "tools[0]: a tool function's \"strict\" schema adherence is not supported"},
        {21, "message 0: only assistant messages carry \"tool_calls\""},
        {22, "message 1: tool call 0: the tool call's \"arguments\" are not JSON"},
    };
    expect_errors(norm, errs, sizeof errs / sizeof errs[0]);
    free(norm);

    // The run-wide setting: the lines without their own take it.
    const char *off[] = {"-f",
                         path_in("chat.jsonl"),
                         "-o",
                         path_in("chat-off.out"),
                         "-n",
                         "1",
                         "--temp",
                         "0",
                         "--chat-template-kwargs",
                         "{\"enable_thinking\": false}",
                         NULL};
    norm = run_records(1, off, path_in("chat-off.out"), 24);
    ck_assert_int_eq(prompt_len(norm, 1, NULL, 0), plain + 4);
    ck_assert_int_eq(prompt_len(norm, 2, NULL, 0), plain + 4);
    ck_assert_int_eq(prompt_len(norm, 3, NULL, 0), plain);
    free(norm);
    const char *bad[] = {"-f", path_in("chat.jsonl"), "--chat-template-kwargs", "[1]", NULL};
    ck_assert_int_eq(run(1, bad), 2);

    // run -p --chat renders the same prompt, and takes --chat-template-kwargs too.
    for (int off_think = 0; off_think < 2; off_think++) {
        const char *one[] = {"-p", "What is 2 + 2?", "--chat", "-n", "1", "--json",
                             off_think ? "--chat-template-kwargs" : NULL,
                             "{\"enable_thinking\": false}", NULL};
        g_stdout_to = path_in("one.json");
        ck_assert_int_eq(run(1, one), 0);
        g_stdout_to = NULL;
        cJSON *j = tu_read_json(path_in("one.json"));
        ck_assert_ptr_nonnull(j);
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "prompt_tokens")),
                         plain + 4 * off_think);
        cJSON_Delete(j);
    }
}
END_TEST

/* A record's generated ids (n of them) and finish reason; the record is freed. */
static int32_t *record_tokens(const char *norm, long line, int *n, char *finish, size_t n_fin) {
    cJSON *j = record_by_line(norm, line);
    const cJSON *t = cJSON_GetObjectItem(j, "tokens");
    ck_assert_msg(cJSON_IsArray(t), "line %ld: no tokens", line);
    *n = cJSON_GetArraySize(t);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(*n + 1));
    ck_assert_ptr_nonnull(ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(t, i)->valuedouble;
    snprintf(finish, n_fin, "%s", cJSON_GetObjectItem(j, "finish_reason")->valuestring);
    cJSON_Delete(j);
    return ids;
}

/* vLLM's ends of a sequence: stop_token_ids end it where the greedy run has those ids
 * (OpenAI records name what ended them in "stop_reason");
 * min_tokens keeps them (and the end-of-generation ids) from being drawn before; with
 * ignore_eos the end-of-generation ids are ordinary tokens. The last two need runs that
 * draw an end-of-generation id: near-uniform draws (temperature 100, no filters) over
 * 128 seeds find some (each of 64 draws is one of the tiny vocabulary's 2 end ids with
 * probability ~1/1000): with ignore_eos those runs go on past the end id, the same
 * draws; with min_tokens 64 no run of the 128 ends early (without the ban, all 128
 * running to the end has a chance of ~e^-8). */
START_TEST(test_ends) {
    const char *greedy = "\"prompt\": \"the quick\", \"max_tokens\": 6, \"temperature\": 0";
    char text[1 << 16];
    int k = snprintf(text, sizeof text, "{%s}\n", greedy);
    write_file(path_in("base.jsonl"), text);
    const char *base_args[] = {"-f", path_in("base.jsonl"), "-o", path_in("base.out"), NULL};
    char *norm = run_records(1, base_args, path_in("base.out"), 1);
    int n_base;
    char fin[32];
    int32_t *base = record_tokens(norm, 1, &n_base, fin, sizeof fin);
    free(norm);
    ck_assert_int_eq(n_base, 6);
    k = snprintf(text, sizeof text,
                 "{%s, \"stop_token_ids\": [%d]}\n"
                 "{%s, \"stop_token_ids\": [5, %d]}\n"
                 "{%s, \"stop_token_ids\": [%d], \"min_tokens\": 1}\n"
                 "{%s, \"min_tokens\": 7}\n"
                 "{%s, \"stop_token_ids\": [2048]}\n"
                 "{%s, \"ignore_eos\": 1}\n"
                 "{%s, \"stop\": [\"a\", \"\"]}\n",
                 greedy, base[0], greedy, base[2], greedy, base[0], greedy, greedy, greedy, greedy);
    write_file(path_in("ids.jsonl"), text);
    const char *ids_args[] = {"-f", path_in("ids.jsonl"), "-o", path_in("ids.out"), NULL};
    norm = run_records(1, ids_args, path_in("ids.out"), 7);
    int n;
    int32_t *t = record_tokens(norm, 1, &n, fin, sizeof fin);
    ck_assert_int_eq(n, 0); // the first greedy id ends it at once
    ck_assert_str_eq(fin, "stop");
    free(t);
    t = record_tokens(norm, 2, &n, fin, sizeof fin);
    ck_assert_int_eq(n, 2); // the third one: two tokens, then the end
    ck_assert(t[0] == base[0] && t[1] == base[1]);
    ck_assert_str_eq(fin, "stop");
    free(t);
    t = record_tokens(norm, 3, &n, fin, sizeof fin);
    ck_assert_int_ge(n, 1); // not drawn as the first token: another one is
    ck_assert_int_ne(t[0], base[0]);
    free(t);
    const struct line_error errs[] = {
        {4, "\"min_tokens\" 7 is more than \"max_tokens\" 6"},
        {5, "\"stop_token_ids\" entry 0 is not an id in [0, 2048)"},
        {6, "\"ignore_eos\" must be true or false"},
        {7, "\"stop\" entry 1 is an empty string"}, // as vLLM refuses it
    };
    expect_errors(norm, errs, sizeof errs / sizeof errs[0]);
    free(norm);

    // OpenAI records say what ended a "stop" in vLLM's "stop_reason": the stop_token_ids
    // id, the stop string (two letters of the greedy text), or null; with
    // include_stop_str_in_output the text keeps the stop string. Of several stop strings
    // the first listed that a step's text completes ends it, as vLLM looks (line 5: the
    // second letter before the pair, where the earliest match would be the pair's start).
    norm = normalized(path_in("base.out"), &n);
    cJSON *b = record_by_line(norm, 1);
    const char *bt = cJSON_GetObjectItem(b, "text")->valuestring;
    char two[3] = {0};
    for (const char *p = bt; p[0] && p[1] && !two[0]; p++)
        if (isalpha((unsigned char)p[0]) && isalpha((unsigned char)p[1]))
            two[0] = p[0], two[1] = p[1];
    ck_assert_msg(two[0], "no two letters in '%s'", bt);
    cJSON_Delete(b);
    free(norm);
    const char *oai =
        "{\"custom_id\": \"%s\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
        "\"the quick\", \"max_tokens\": 6, \"temperature\": 0%s}}\n";
    char extra[4][96];
    snprintf(extra[0], sizeof extra[0], ", \"stop_token_ids\": [%d]", base[2]);
    snprintf(extra[1], sizeof extra[1], ", \"stop\": [\"zzzz\", \"%s\"]", two);
    snprintf(extra[2], sizeof extra[2], "%s, \"include_stop_str_in_output\": true", extra[1]);
    snprintf(extra[3], sizeof extra[3], ", \"stop\": [\"%c\", \"%s\"]", two[1], two);
    k = snprintf(text, sizeof text, oai, "id", extra[0]);
    k += snprintf(text + k, sizeof text - (size_t)k, oai, "string", extra[1]);
    k += snprintf(text + k, sizeof text - (size_t)k, oai, "none", "");
    k += snprintf(text + k, sizeof text - (size_t)k, oai, "kept", extra[2]);
    k += snprintf(text + k, sizeof text - (size_t)k, oai, "listed", extra[3]);
    write_file(path_in("oai.jsonl"), text);
    const char *oai_args[] = {"-f", path_in("oai.jsonl"), "-o", path_in("oai.out"), NULL};
    norm = run_records(1, oai_args, path_in("oai.out"), 5);
    char cut[256] = "";
    for (int line = 1; line <= 5; line++) {
        cJSON *j = record_by_line(norm, line);
        const cJSON *c = cJSON_GetArrayItem(
            cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response"), "body"),
                                "choices"),
            0);
        const cJSON *sr = cJSON_GetObjectItem(c, "stop_reason");
        const char *fr = cJSON_GetObjectItem(c, "finish_reason")->valuestring;
        ck_assert_ptr_nonnull(sr);
        if (line == 1) ck_assert(cJSON_IsNumber(sr) && sr->valuedouble == base[2]);
        const char *txt = cJSON_GetObjectItem(c, "text")->valuestring;
        if (line == 2) {
            ck_assert(cJSON_IsString(sr) && !strcmp(sr->valuestring, two));
            ck_assert(!strstr(txt, two));
            snprintf(cut, sizeof cut, "%s%s", txt, two); // what include_stop_str_in_output keeps
        }
        if (line == 3) ck_assert(cJSON_IsNull(sr));
        if (line == 4) ck_assert_str_eq(txt, cut);
        if (line == 5) { // the greedy text up to its first second letter; that letter named
            const char second[2] = {two[1], 0};
            ck_assert(cJSON_IsString(sr) && !strcmp(sr->valuestring, second));
            ck_assert_int_eq((long)strlen(txt), (long)(strchr(cut, two[1]) - cut));
            ck_assert(!strncmp(txt, cut, strlen(txt)));
        }
        ck_assert_str_eq(fr, line == 3 ? "length" : "stop");
        cJSON_Delete(j);
    }
    free(norm);

    // Near-uniform draws until some runs end at an end-of-generation id.
    const char *flat = "\"prompt\": \"the quick\", \"max_tokens\": 64, \"temperature\": 100, "
                       "\"top_k\": 0, \"top_p\": 1, \"min_p\": 0";
    k = 0;
    for (int i = 0; i < 128; i++)
        k += snprintf(text + k, sizeof text - (size_t)k, "{%s, \"seed\": %d}\n", flat, i);
    write_file(path_in("flat.jsonl"), text);
    const char *flat_args[] = {"-f", path_in("flat.jsonl"), "-o", path_in("flat.out"),
                               "--parallel", "32", NULL};
    norm = run_records(1, flat_args, path_in("flat.out"), 128);
    int ended[128], at[128], n_ended = 0;
    int32_t *orig[128];
    for (int i = 0; i < 128; i++) {
        orig[i] = record_tokens(norm, i + 1, &n, fin, sizeof fin);
        if (!strcmp(fin, "stop")) ended[n_ended] = i, at[n_ended++] = n;
        else ck_assert_int_eq(n, 64);
    }
    free(norm);
    ck_assert_msg(n_ended > 0, "no run of 128 drew an end-of-generation id");
    k = 0;
    for (int e = 0; e < n_ended; e++)
        k += snprintf(text + k, sizeof text - (size_t)k,
                      "{%s, \"seed\": %d, \"ignore_eos\": true}\n", flat, ended[e]);
    write_file(path_in("again.jsonl"), text);
    const char *again_args[] = {"-f", path_in("again.jsonl"), "-o", path_in("again.out"), NULL};
    norm = run_records(1, again_args, path_in("again.out"), n_ended);
    for (int e = 0; e < n_ended; e++) {
        // the same draws, the end id kept as a token, on to max_tokens
        const int32_t *o = orig[ended[e]];
        const int a = at[e];
        t = record_tokens(norm, e + 1, &n, fin, sizeof fin);
        ck_assert_int_eq(n, 64);
        ck_assert_str_eq(fin, "length");
        ck_assert_msg(!memcmp(t, o, sizeof(int32_t) * (size_t)a), "seed %d", ended[e]);
        ck_assert_msg(t[a] == 2045 || t[a] == 2047, "seed %d: id %d where the end was",
                      ended[e], (int)t[a]);
        free(t);
    }
    free(norm);
    const char *min_args[] = {"-f", path_in("flat-min.jsonl"), "-o", path_in("flat-min.out"),
                              "--parallel", "32", NULL};
    k = 0;
    for (int i = 0; i < 128; i++)
        k += snprintf(text + k, sizeof text - (size_t)k, "{%s, \"seed\": %d, \"min_tokens\": 64}\n",
                      flat, i);
    write_file(path_in("flat-min.jsonl"), text);
    norm = run_records(1, min_args, path_in("flat-min.out"), 128);
    for (int i = 0; i < 128; i++) {
        t = record_tokens(norm, i + 1, &n, fin, sizeof fin);
        ck_assert_msg(n == 64 && !strcmp(fin, "length"), "seed %d: %d tokens, %s", i, n, fin);
        for (int x = 0; x < n; x++) ck_assert(t[x] != 2045 && t[x] != 2047);
        free(t);
    }
    fprintf(stderr, "ends: %d of 128 near-uniform runs drew an end id; ignore_eos checked "
                    "on them, min_tokens 64 on all 128\n", n_ended);
    for (int i = 0; i < 128; i++) free(orig[i]);
    free(norm);
    free(base);
}
END_TEST

/* OpenAI's logit_bias: -100 keeps the greedy first token out, +100 makes one id every
 * token (or two ids share every draw at temperature 1), a bias past 100 is clamped to
 * 100 as vLLM clamps it; a bad key or value is the line's error. */
START_TEST(test_bias) {
    const char *greedy = "\"prompt\": \"the quick\", \"max_tokens\": 6, \"temperature\": 0";
    char text[4096];
    snprintf(text, sizeof text,
             "{%s}\n"
             "{%s, \"logit_bias\": {\"487\": -100}}\n"
             "{%s, \"logit_bias\": {\"77\": 100}}\n"
             "{\"prompt\": \"the quick\", \"max_tokens\": 6, \"temperature\": 1, \"seed\": 3, "
             "\"logit_bias\": {\"77\": 100, \"78\": 100}}\n"
             "{%s, \"logit_bias\": {\"x\": 1}}\n"
             "{%s, \"logit_bias\": {\"5\": 1000}}\n"
             "{%s, \"logit_bias\": [1]}\n"
             "{%s, \"logit_bias\": {\"5\": \"high\"}}\n",
             greedy, greedy, greedy, greedy, greedy, greedy, greedy);
    write_file(path_in("bias.jsonl"), text);
    const char *args[] = {"-f", path_in("bias.jsonl"), "-o", path_in("bias.out"), NULL};
    char *norm = run_records(1, args, path_in("bias.out"), 8);
    int n;
    char fin[32];
    int32_t *base = record_tokens(norm, 1, &n, fin, sizeof fin);
    ck_assert_int_eq(base[0], 487); // the greedy first token the next line biases away
    int32_t *t = record_tokens(norm, 2, &n, fin, sizeof fin);
    ck_assert_int_eq(n, 6);
    ck_assert_int_ne(t[0], 487);
    free(t);
    for (int line = 3; line <= 4; line++) {
        t = record_tokens(norm, line, &n, fin, sizeof fin);
        ck_assert_int_eq(n, 6);
        int n78 = 0;
        for (int i = 0; i < n; i++) {
            ck_assert_msg(t[i] == 77 || (line == 4 && t[i] == 78), "line %d: id %d", line,
                          (int)t[i]);
            n78 += t[i] == 78;
        }
        if (line == 4) ck_assert_int_gt(n78, 0); // seed 3 draws both
        free(t);
    }
    t = record_tokens(norm, 6, &n, fin, sizeof fin); // 1000 ran as 100
    ck_assert_int_eq(n, 6);
    for (int i = 0; i < n; i++) ck_assert_int_eq(t[i], 5);
    free(t);
    const struct line_error errs[] = {
        {5, "\"logit_bias\" key \"x\" is not a token id in [0, 2048)"},
        {7, "\"logit_bias\" must be an object"},
        {8, "\"logit_bias\" of 5 must be a number"},
    };
    expect_errors(norm, errs, sizeof errs / sizeof errs[0]);
    free(base);
    free(norm);
}
END_TEST

/* An OpenAI line's response body (the record freed with *rec). */
static const cJSON *oai_body(const char *norm, long line, cJSON **rec) {
    *rec = record_by_line(norm, line);
    const cJSON *b = cJSON_GetObjectItem(cJSON_GetObjectItem(*rec, "response"), "body");
    ck_assert_msg(b, "line %ld: no response body", line);
    return b;
}

static int usage_of(const cJSON *body, const char *key) {
    return (int)cJSON_GetObjectItem(cJSON_GetObjectItem(body, "usage"), key)->valuedouble;
}

/* "token_id:N" (return_tokens_as_token_ids) to N; -1 when it is not that. */
static int token_id_of(const char *s) {
    int id = -1, n = 0;
    return sscanf(s, "token_id:%d%n", &id, &n) == 1 && !s[n] ? id : -1;
}

/* OpenAI lines run with vLLM's semantics (-c 128): a completion without max_tokens stops
 * at 16, null runs to the context's end (a chat without it too); max_tokens past the
 * context is the line's error; greedy n > 1, top_logprobs without logprobs and top_p 0
 * are refused; a line without sampling fields samples with vLLM's defaults (temperature 1,
 * no filter); truncate_prompt_tokens keeps the prompt's last tokens;
 * return_tokens_as_token_ids names tokens "token_id:N"; echo with max_tokens 0 is the
 * prompt alone; the end-of-generation token counts in the usage and, as the
 * max_tokens-th token, is a "length"; temperature applies before min-p (every draw at
 * temperature 2 and min-p 0.5 keeps p >= 0.25 p_max, and some fall below 0.5 p_max,
 * which llama.cpp's order would not draw); the repetition penalty covers the whole
 * prompt, not the last 64 tokens. */
START_TEST(test_vllm_semantics) {
    static char text[16384];
    char rep[1024] = "";
    int k = snprintf(rep, sizeof rep, "[224");
    for (int i = 300; i < 370; i++) k += snprintf(rep + k, sizeof rep - (size_t)k, ",%d", i);
    snprintf(rep + k, sizeof rep - (size_t)k, "]");
#define CMPL "{\"custom_id\": \"c%d\", \"url\": \"/v1/completions\", \"body\": {"
#define CHAT "{\"custom_id\": \"c%d\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": " \
             "[{\"role\": \"user\", \"content\": \"hi\"}], "
    snprintf(text, sizeof text,
             CMPL "\"prompt\": \"the quick\", \"temperature\": 0, \"ignore_eos\": true}}\n"
             CMPL "\"prompt\": \"the quick\", \"temperature\": 0, \"ignore_eos\": true, "
             "\"max_tokens\": null}}\n"
             CMPL "\"prompt\": \"the quick\", \"max_tokens\": 127}}\n"
             CHAT "\"temperature\": 0, \"ignore_eos\": true}}\n"
             CMPL "\"prompt\": \"the quick\", \"temperature\": 0, \"n\": 2}}\n"
             CHAT "\"top_logprobs\": 2}}\n"
             CMPL "\"prompt\": \"one two three four five six seven eight\", "
             "\"truncate_prompt_tokens\": 2, \"echo\": true, \"max_tokens\": 1}}\n"
             CMPL "\"prompt\": \"the quick\", \"temperature\": 0, \"max_tokens\": 2, "
             "\"logprobs\": 1, \"return_tokens_as_token_ids\": true}}\n"
             CMPL "\"prompt\": \"The capital\", \"echo\": true, \"logprobs\": 1, "
             "\"max_tokens\": 0}}\n"
             CMPL "\"prompt\": \"the quick\", \"temperature\": 0, \"max_tokens\": 5, "
             "\"logit_bias\": {\"2047\": 100}}}\n"
             CMPL "\"prompt\": \"the quick\", \"temperature\": 0, \"max_tokens\": 1, "
             "\"logit_bias\": {\"2047\": 100}}}\n"
             CMPL "\"prompt\": \"the quick\", \"temperature\": 2.0, \"min_p\": 0.5, \"top_p\": 1, "
             "\"top_k\": -1, \"max_tokens\": 16, \"n\": 64, \"seed\": 1, \"logprobs\": 1, "
             "\"ignore_eos\": true}}\n"
             CMPL "\"prompt\": %s, \"temperature\": 0, \"max_tokens\": 1, \"repetition_penalty\": "
             "100, \"logprobs\": 0, \"return_tokens_as_token_ids\": true}}\n"
             CMPL "\"prompt\": \"the quick\", \"top_p\": 0}}\n"
             CMPL "\"prompt\": \"the quick\", \"max_tokens\": 12, \"seed\": 7}}\n"
             CMPL "\"prompt\": \"the quick\", \"max_tokens\": 12, \"seed\": 7, \"temperature\": 1, "
             "\"top_p\": 1, \"top_k\": -1, \"min_p\": 0}}\n"
             CMPL "\"prompt\": \"the quick\", \"max_tokens\": 12, \"seed\": 7, \"temperature\": "
             "0.8, \"top_p\": 0.95, \"top_k\": 40, \"min_p\": 0.05}}\n",
             1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, rep, 14, 15, 16, 17);
#undef CMPL
#undef CHAT
    write_file(path_in("v.jsonl"), text);
    const char *args[] = {"-f", path_in("v.jsonl"), "-o", path_in("v.out"), "-c", "128", NULL};
    char *norm = run_records(1, args, path_in("v.out"), 17);
    cJSON *rec;
    const cJSON *b = oai_body(norm, 1, &rec); // max_tokens absent: 16
    ck_assert_int_eq(usage_of(b, "completion_tokens"), 16);
    cJSON_Delete(rec);
    for (long line = 2; line <= 4; line += 2) { // null, and a chat without it: the context
        b = oai_body(norm, line, &rec);
        ck_assert_int_eq(usage_of(b, "total_tokens"), 128);
        cJSON_Delete(rec);
    }
    const struct line_error errs[] = {
        {3, "\"max_tokens\" 127 need "},
        {5, "\"n\" must be 1 when sampling greedily"},
        {6, "\"top_logprobs\" needs \"logprobs\": true"},
        {14, "\"top_p\" must be in (0, 1]"},
    };
    expect_errors(norm, errs, sizeof errs / sizeof errs[0]);
    // A line without sampling fields draws as vLLM's defaults do (the same seed, the same
    // text as temperature 1 with every filter off), not as llama.cpp's.
    char *texts[3];
    for (int k = 0; k < 3; k++) {
        b = oai_body(norm, 15 + k, &rec);
        texts[k] = strdup(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"),
                                                                 0), "text")->valuestring);
        cJSON_Delete(rec);
    }
    ck_assert_str_eq(texts[0], texts[1]);
    ck_assert_msg(strcmp(texts[0], texts[2]), "llama.cpp's defaults drew the same: '%s'", texts[2]);
    for (int k = 0; k < 3; k++) free(texts[k]);
    b = oai_body(norm, 7, &rec); // truncate_prompt_tokens 2: the last two
    ck_assert_int_eq(usage_of(b, "prompt_tokens"), 2);
    const char *t7 = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0),
                                         "text")->valuestring;
    ck_assert_msg(!strncmp(t7, " seven eight", 12) || !strncmp(t7, "seven eight", 11) ||
                      !strncmp(t7, " eight", 6) || strstr(t7, "eight"),
                  "echo of the truncated prompt: '%s'", t7);
    ck_assert_ptr_null(strstr(t7, "one"));
    cJSON_Delete(rec);
    b = oai_body(norm, 8, &rec); // token ids as the tokens, in the list and the maps
    const cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0),
                                          "logprobs");
    const cJSON *toks = cJSON_GetObjectItem(lp, "tokens");
    ck_assert_int_eq(cJSON_GetArraySize(toks), 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_ge(token_id_of(cJSON_GetArrayItem(toks, i)->valuestring), 0);
        const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), i);
        ck_assert_int_ge(token_id_of(m->child->string), 0);
    }
    cJSON_Delete(rec);
    b = oai_body(norm, 9, &rec); // echo, max_tokens 0: the prompt alone
    const cJSON *c9 = cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(c9, "text")->valuestring, "The capital");
    ck_assert_str_eq(cJSON_GetObjectItem(c9, "finish_reason")->valuestring, "length");
    ck_assert_int_eq(usage_of(b, "completion_tokens"), 0);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(c9, "logprobs"),
                                                            "tokens")),
                     usage_of(b, "prompt_tokens"));
    cJSON_Delete(rec);
    for (long line = 10; line <= 11; line++) { // the end token first: counted; 1 is a length
        b = oai_body(norm, line, &rec);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0);
        ck_assert_str_eq(cJSON_GetObjectItem(c, "text")->valuestring, "");
        ck_assert_str_eq(cJSON_GetObjectItem(c, "finish_reason")->valuestring,
                         line == 10 ? "stop" : "length");
        ck_assert_int_eq(usage_of(b, "completion_tokens"), 1);
        cJSON_Delete(rec);
    }
    b = oai_body(norm, 12, &rec); // temperature before min-p
    int n_draws = 0, n_wide = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(b, "choices")) {
        const cJSON *l = cJSON_GetObjectItem(c, "logprobs");
        const cJSON *tl = cJSON_GetObjectItem(l, "token_logprobs");
        for (int i = 0; i < cJSON_GetArraySize(tl); i++) {
            double best = -1e30;
            const cJSON *e;
            cJSON_ArrayForEach(e, cJSON_GetArrayItem(cJSON_GetObjectItem(l, "top_logprobs"), i))
                best = e->valuedouble > best ? e->valuedouble : best;
            const double d = cJSON_GetArrayItem(tl, i)->valuedouble - best;
            ck_assert_msg(d >= 2 * log(0.5) - 1e-4, "a draw at p/p_max = %g", exp(d));
            n_wide += d < log(0.5);
            n_draws++;
        }
    }
    ck_assert_int_eq(n_draws, 64 * 16);
    fprintf(stderr, "temperature 2, min-p 0.5: %d of %d draws below 0.5 p_max\n", n_wide, n_draws);
    ck_assert_int_gt(n_wide, 0);
    cJSON_Delete(rec);
    b = oai_body(norm, 13, &rec); // the penalty reaches the prompt's first token
    const cJSON *t13 = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0), "logprobs"),
        "tokens");
    const int id13 = token_id_of(cJSON_GetArrayItem(t13, 0)->valuestring);
    ck_assert_msg(id13 != 224 && (id13 < 300 || id13 >= 370), "chose %d, a prompt token", id13);
    cJSON_Delete(rec);
    free(norm);
}
END_TEST

/* Whether [s, s + n) is well-formed UTF-8 (Unicode's table 3-7). */
static bool utf8_ok(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const unsigned c = s[i];
        const int k = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                                   : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!k || i + (size_t)k > n) return false;
        for (int j = 1; j < k; j++) {
            unsigned lo = 0x80, hi = 0xbf;
            if (j == 1 && c == 0xe0) lo = 0xa0;
            if (j == 1 && c == 0xed) hi = 0x9f;
            if (j == 1 && c == 0xf0) lo = 0x90;
            if (j == 1 && c == 0xf4) hi = 0x8f;
            if (s[i + j] < lo || s[i + j] > hi) return false;
        }
        i += (size_t)k;
    }
    return true;
}

/* Run the file `in` on one rank into `out`, expecting n records, which must be UTF-8:
 * their normalized form, and their bytes in *raw (both for the caller to free). */
static char *utf8_records(const char *in, const char *out, int n, char **raw) {
    const char *args[] = {"-f", path_in(in), "-o", path_in(out), NULL};
    char *norm = run_records(1, args, path_in(out), n);
    size_t n_raw = 0;
    *raw = tu_read_file(path_in(out), &n_raw);
    ck_assert_msg(*raw && utf8_ok((const unsigned char *)*raw, n_raw), "%s is not UTF-8", out);
    return norm;
}

/* A record's first choice (OpenAI lines). */
static cJSON *first_choice(cJSON *rec) {
    return cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(rec, "response"), "body"),
                            "choices"), 0);
}

/* Text that is not plain characters, on the tiny model's byte tokens (378: E2 80, the
 * start of a 3-byte character; 188: the byte 00; 9: "*"): a completion's text is valid
 * UTF-8 however the tokens cut its characters (each broken one U+FFFD, echoed prompt
 * and completion alike), a NUL the model writes stays in the text as \u0000, and
 * text_offset indexes the text in characters. A \u0000 in a request is that line's
 * error (the JSON reader's strings end at a NUL), a list of one prompt is that prompt,
 * and a chat message's text parts are joined by "\n", as vLLM joins them. */
START_TEST(test_text) {
    write_file(path_in("tx.jsonl"),
               "{\"custom_id\": \"cut\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
               "[378, 9, 378], \"echo\": true, \"logprobs\": 1, \"max_tokens\": 3, "
               "\"temperature\": 0, \"logit_bias\": {\"378\": 100}}}\n"
               "{\"id\": \"nul\", \"prompt\": [65, 66], \"max_tokens\": 3, \"temperature\": 0, "
               "\"logit_bias\": {\"188\": 100}}\n"
               "{\"id\": \"in\", \"prompt\": \"a\\u0000b\", \"max_tokens\": 1}\n"
               "{\"custom_id\": \"one\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
               "[\"the quick\"], \"max_tokens\": 3, \"temperature\": 0}}\n"
               "{\"custom_id\": \"str\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
               "\"the quick\", \"max_tokens\": 3, \"temperature\": 0}}\n"
               "{\"custom_id\": \"two\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
               "[\"a\", \"b\"]}}\n"
               "{\"custom_id\": \"parts\", \"url\": \"/v1/chat/completions\", \"body\": "
               "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
               "\"the\"}, {\"type\": \"text\", \"text\": \"quick\"}]}], \"max_tokens\": 3, "
               "\"temperature\": 0}}\n"
               "{\"custom_id\": \"nl\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": "
               "[{\"role\": \"user\", \"content\": \"the\\nquick\"}], \"max_tokens\": 3, "
               "\"temperature\": 0}}\n"
               "{\"custom_id\": \"off\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
               "\"\\u00e9vent \\u00e9t\\u00e9 \\u65e5\\u672c\", \"echo\": true, \"logprobs\": 0, "
               "\"max_tokens\": 4, \"temperature\": 0}}\n");
    char *raw;
    char *norm = utf8_records("tx.jsonl", "tx.out", 9, &raw);
    ck_assert_msg(strstr(raw, "\"text\":\"\\u0000\\u0000\\u0000\""), "the NULs are not kept");
    free(raw);

    cJSON *rec = record_by_line(norm, 1);
    const cJSON *c = first_choice(rec);
    ck_assert_str_eq(cJSON_GetObjectItem(c, "text")->valuestring,
                     "\xef\xbf\xbd*\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    const cJSON *off = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "text_offset");
    static const int want_off[] = {0, 0, 2, 3, 3, 4}; // a held-back lead adds nothing yet
    ck_assert_int_eq(cJSON_GetArraySize(off), 6);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(cJSON_GetArrayItem(off, i)->valueint, want_off[i]);
    cJSON_Delete(rec);

    const struct line_error errs[] = {{3, "\\u0000"}, {6, "\"prompt\" lists 2 prompts"}};
    expect_errors(norm, errs, sizeof errs / sizeof errs[0]);
    for (long line = 4; line <= 7; line += 3) { // the same prompt, the same record
        cJSON *a = record_by_line(norm, line), *b = record_by_line(norm, line + 1);
        ck_assert_int_eq(prompt_len(norm, line, NULL, 0), prompt_len(norm, line + 1, NULL, 0));
        cJSON *ca = cJSON_Duplicate(first_choice(a), true), *cb = first_choice(b);
        ck_assert(cJSON_Compare(ca, cb, true));
        cJSON_Delete(ca);
        cJSON_Delete(a);
        cJSON_Delete(b);
    }

    rec = record_by_line(norm, 9); // each whole token's string stands at its offset
    c = first_choice(rec);
    const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
    const cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
    const cJSON *toks = cJSON_GetObjectItem(lp, "tokens");
    off = cJSON_GetObjectItem(lp, "text_offset");
    int n_checked = 0;
    for (int i = 0; i < cJSON_GetArraySize(toks); i++) {
        const char *tok = cJSON_GetArrayItem(toks, i)->valuestring;
        const int at = cJSON_GetArrayItem(off, i)->valueint;
        const char *p = text;
        for (int ch = 0; *p && ch < at; ch++) // character `at` of the text
            for (p++; (*p & 0xc0) == 0x80; p++) {}
        if (strstr(tok, "\xef\xbf\xbd")) continue; // a piece of a character
        ck_assert_msg(!strncmp(p, tok, strlen(tok)), "token %d '%s' is not at offset %d of '%s'",
                      i, tok, at, text);
        n_checked++;
    }
    ck_assert_int_ge(n_checked, 4);
    // "logprobs": 0: each map holds the token itself alone, with its logprob.
    const cJSON *tlp = cJSON_GetObjectItem(lp, "token_logprobs");
    const cJSON *top = cJSON_GetObjectItem(lp, "top_logprobs");
    ck_assert(cJSON_IsNull(cJSON_GetArrayItem(top, 0)));
    for (int i = 1; i < cJSON_GetArraySize(toks); i++) {
        const cJSON *m = cJSON_GetArrayItem(top, i);
        ck_assert_int_eq(cJSON_GetArraySize(m), 1);
        ck_assert_str_eq(m->child->string, cJSON_GetArrayItem(toks, i)->valuestring);
        ck_assert_double_eq(m->child->valuedouble, cJSON_GetArrayItem(tlp, i)->valuedouble);
    }
    cJSON_Delete(rec);
    free(norm);
}
END_TEST

/* What a line holds comes back whole and as UTF-8: a number id keeps its spelling (past
 * 2^53, 17 digits, "1.0") in the records and --resume finds it again; a JSON line that is
 * not UTF-8 is that line's error (in the line's shape; a broken id gives way to the line
 * number); an error quoting a cut piece of the line (a "logit_bias" key, %.32s) stays
 * UTF-8; a stop string that the last, held-back partial character completes (U+FFFD, 378
 * is E2 80) ends the text there; a completion's top_logprobs map keeps a NUL token's key
 * (188 is the byte 00) as "\u0000". */
START_TEST(test_ids) {
    const char *gen = "\"prompt\": [65], \"max_tokens\": 1, \"temperature\": 0";
    char text[4096];
    snprintf(text, sizeof text,
             "{\"id\": 12345678901234567890, %s}\n"
             "{\"id\": 0.30000000000000004, %s}\n"
             "{\"id\": 1.0, %s}\n"
             "{\"id\": \"caf\xc3\", %s}\n"
             "{\"id\": \"lb\", %s, \"logit_bias\": {\"a%s\": 1}}\n"
             "{\"custom_id\": \"m\", \"url\": \"/v1/completions\", \"body\": {\"model\": "
             "\"m\xff\", %s}}\n"
             "{\"id\": \"fffd\", %s, \"logit_bias\": {\"378\": 100}, \"stop\": [\"\\ufffd\"]}\n"
             "{\"custom_id\": \"nul\", \"url\": \"/v1/completions\", \"body\": {%s, "
             "\"logprobs\": 1, \"logit_bias\": {\"188\": 100}}}\n",
             gen, gen, gen, gen, gen,
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", gen, gen, gen);
    write_file(path_in("ids.jsonl"), text);
    char *raw;
    char *norm = utf8_records("ids.jsonl", "ids.out", 8, &raw);
    ck_assert_msg(strstr(raw, "{\"id\":12345678901234567890,"), "the id past 2^53 changed");
    ck_assert_msg(strstr(raw, "{\"id\":0.30000000000000004,"), "the 17-digit id changed");
    ck_assert_msg(strstr(raw, "{\"id\":1.0,"), "the id 1.0 changed");
    ck_assert_msg(strstr(raw, "{\"id\":4,"), "the broken id is not the line number");
    ck_assert_msg(strstr(raw, "\"custom_id\":\"m\""), "the OpenAI line lost its id");
    ck_assert_msg(strstr(raw, ",\"\\u0000\":-"), "the NUL token's key is lost"); // after the top 1
    free(raw);
    const struct line_error errs[] = {{4, "line 4: byte 12 (0xc3) is not UTF-8"},
                                      {5, "\"logit_bias\" key \"a"},
                                      {6, "(0xff) is not UTF-8"}};
    expect_errors(norm, errs, sizeof errs / sizeof errs[0]);
    cJSON *rec = record_by_line(norm, 7);
    ck_assert_str_eq(cJSON_GetObjectItem(rec, "text")->valuestring, "");
    ck_assert_str_eq(cJSON_GetObjectItem(rec, "finish_reason")->valuestring, "stop");
    cJSON_Delete(rec);
    free(norm);

    // --resume over the whole file: every record is found again, none is written twice
    const char *rargs[] = {"-f", path_in("ids.jsonl"), "-o", path_in("ids.out"), "--resume", NULL};
    run(1, rargs);
    ck_assert_int_eq(count_lines(path_in("ids.out")), 8);
}
END_TEST

START_TEST(test_resume) { interrupted_run(SIGKILL); }
END_TEST

START_TEST(test_sigterm) { interrupted_run(SIGTERM); }
END_TEST

/* The pid of world rank `rank` of the run spawned with TPI_TEST_MARK=g_dir in its
 * environment (mpirun passes it on to the ranks it starts here), or -1. */
static pid_t rank_pid(int rank) {
    char want_rank[48], want_mark[300];
    snprintf(want_rank, sizeof want_rank, "OMPI_COMM_WORLD_RANK=%d", rank);
    snprintf(want_mark, sizeof want_mark, "TPI_TEST_MARK=%s", g_dir);
    DIR *d = opendir("/proc");
    if (!d) return -1;
    pid_t found = -1;
    for (struct dirent *e; found < 0 && (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        FILE *f = fopen(path, "rb"); // /proc's files say size 0: read to the end
        static char env[1 << 16];
        const size_t n = f ? fread(env, 1, sizeof env - 1, f) : 0;
        if (f) fclose(f);
        env[n] = '\0';
        bool r = false, m = false;
        for (size_t i = 0; i < n; i += strlen(env + i) + 1) {
            r |= !strcmp(env + i, want_rank);
            m |= !strcmp(env + i, want_mark);
        }
        if (r && m) found = (pid_t)atol(e->d_name);
    }
    closedir(d);
    return found;
}

static void mpi_run(const char *flag) {
    make_prompts(path_in("m.jsonl"), 6, 10);
    // Three more that begin alike, one asking for two completions: prefix sharing
    // copies KV on every rank (each its own layers and heads) the same way.
    FILE *f = fopen(path_in("m.jsonl"), "a");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 3; i++)
        fprintf(f, "{\"id\": \"shared%d\", \"max_tokens\": 6, \"n\": %d, \"prompt\": \"the quick "
                   "brown fox jumps over a lazy dog while rain falls on green hills and %s\"}\n",
                i, i == 2 ? 2 : 1, i == 0 ? "then" : i == 1 ? "so" : "yet");
    // And a scored prompt: the decider's prompt logprobs reach every rank alike. Under
    // tp the all-reduce sums in another order (logits move by ~1e-6), so the logprobs
    // are compared bit for bit under pp only; tp compares the echoed text.
    fprintf(f, "{\"custom_id\": \"echo\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
               "\"body\": {\"prompt\": \"the quick brown fox jumps over a lazy dog\", "
               "\"max_tokens\": 3, %s\"echo\": true}}\n",
            strcmp(flag, "--pp") == 0 ? "\"logprobs\": 2, " : "");
    // vLLM's ends travel to every rank with the request (340 is the greedy third token),
    // and a logit bias to the decider.
    fprintf(f,
            "{\"id\": \"ends\", \"max_tokens\": 6, \"prompt\": \"the quick\", \"min_tokens\": 2, "
            "\"stop_token_ids\": [5, 340], \"ignore_eos\": true}\n"
            "{\"id\": \"bias\", \"max_tokens\": 4, \"prompt\": \"the quick\", "
            "\"logit_bias\": {\"77\": 100}}\n");
    fclose(f);
    const char *one[] = {"-f", path_in("m.jsonl"), "-o", path_in("m1.jsonl"), "--temp", "0",
                         "--parallel", "4", "--no-prefix-share", NULL};
    const char *two[] = {"-f", path_in("m.jsonl"), "-o", path_in("m2.jsonl"), "--temp", "0",
                         "--parallel", "4", "--ubatch", "8", flag, "2", NULL};
    char *r1 = run_records(1, one, path_in("m1.jsonl"), 12);
    char *r2 = run_records(2, two, path_in("m2.jsonl"), 12);
    assert_same(flag, r2, r1);
    // The logits kept on the decider (with --tp each rank's slice copied there, the
    // slices' candidates merged; the bias row copied out whole in slices) give the records
    // every row copied whole gives on the same grid, sampled rows (top-k, penalties) too.
    size_t nm;
    char *lines = tu_read_file(path_in("m.jsonl"), &nm);
    ck_assert_ptr_nonnull(lines);
    f = fopen(path_in("mk.jsonl"), "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s{\"id\": \"topk\", \"max_tokens\": 8, \"prompt\": \"the quick brown\", "
               "\"temperature\": 0.8, \"top_k\": 20, \"repetition_penalty\": 1.2, "
               "\"seed\": 4}\n",
            lines);
    fclose(f);
    free(lines);
    const char *kept[] = {"-f", path_in("mk.jsonl"), "-o", path_in("k2.jsonl"), "--temp", "0",
                          "--parallel", "4", "--ubatch", "8", flag, "2", NULL};
    const char *whole[] = {"-f", path_in("mk.jsonl"), "-o", path_in("w2.jsonl"), "--temp", "0",
                           "--parallel", "4", "--ubatch", "8", flag, "2", NULL};
    char *rk = run_records(2, kept, path_in("k2.jsonl"), 13);
    setenv("TPI_LOGITS_KEEP", "0", 1);
    char *rw = run_records(2, whole, path_in("w2.jsonl"), 13);
    unsetenv("TPI_LOGITS_KEEP");
    assert_same("logits kept vs copied whole on the grid", rk, rw);
    free(rk), free(rw);
    // A results file that fails on rank 0 fails the run on every rank: exit 1 (the other
    // ranks once took it for SIGTERM and exited 143).
    const char *full[] = {"-f", path_in("m.jsonl"), "-o", "/dev/full", flag, "2", NULL};
    if (access("/dev/full", W_OK) == 0) ck_assert_int_eq(run(2, full), 1);
    // Options that differ between ranks (mpirun's "-np 1 A : -np 1 B"): --seed -1 on one
    // rank only is a clear error on every rank, not a wait for ever (the seed was chosen by
    // a broadcast only the ranks drawing one took part in); --no-prefix-share on one rank
    // too (each rank's scheduler copies prefixes alone). -c 4096 on one rank and the
    // default on the other (the tiny model's 4096 too) are one run.
    static const struct { const char *a, *b; int code; const char *says; } cases[] = {
        {"--seed -1", "", 1, "--seed differs"},
        {"", "--no-prefix-share", 1, "rank 1's --no-prefix-share is 1, rank 0's is 0"},
        {"", "-c 4096", 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd,
                 "timeout 60 %s --oversubscribe --allow-run-as-root --bind-to none -np 1 %s run "
                 "-m %s --backend cpu -t 1 -f %s -o %s %s 2 %s : -np 1 %s run -m %s --backend cpu "
                 "-t 1 -f %s -o %s %s 2 %s 2>%s >/dev/null",
                 TPI_MPIEXEC, TPI_BATCH_DRIVER, g_model, path_in("m.jsonl"), path_in("m3.jsonl"),
                 flag, cases[i].a, TPI_BATCH_DRIVER, g_model, path_in("m.jsonl"),
                 path_in("m3.jsonl"), flag, cases[i].b, path_in("m3.err"));
        const int st = system(cmd);
        char *e = tu_read_file(path_in("m3.err"), NULL);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == cases[i].code &&
                          (!cases[i].says || (e && strstr(e, cases[i].says))),
                      "'%s' : '%s': status %d, stderr %s", cases[i].a, cases[i].b, st, e ? e : "");
        free(e);
    }

    // SIGTERM to rank 1 alone (a scheduler stopping one task) stops the run as it does on
    // rank 0: every rank exits 143 with its records complete, and --resume finishes the
    // rest as one rank would have run them.
    make_prompts(path_in("s.jsonl"), 30, 24);
    const char *ref[] = {"-f", path_in("s.jsonl"), "-o", path_in("s1.jsonl"), "--temp", "0", NULL};
    char *want = run_records(1, ref, path_in("s1.jsonl"), 30);
    setenv("TPI_TEST_MARK", g_dir, 1);
    const char *sargs[] = {"-f", path_in("s.jsonl"), "-o", path_in("s2.jsonl"), "--temp", "0",
                           "--parallel", "2", flag, "2", NULL};
    pid_t pid = spawn(2, sargs);
    struct timespec ts = {0, 1000000};
    for (int i = 0; i < 60000 && count_lines(path_in("s2.jsonl")) < 3; i++) nanosleep(&ts, NULL);
    const pid_t r1pid = rank_pid(1);
    ck_assert_msg(r1pid > 0, "rank 1's process not found");
    const int n_before = count_lines(path_in("s2.jsonl"));
    kill(r1pid, SIGTERM);
    const int code = wait_exit(pid);
    unsetenv("TPI_TEST_MARK");
    const int n_first = count_lines(path_in("s2.jsonl"));
    fprintf(stderr, "%s: SIGTERM to rank 1 after %d records: exit %d with %d\n", flag, n_before,
            code, n_first);
    // far from the end when it was sent: the run must have stopped (it once ran on)
    ck_assert_msg(code == 128 + SIGTERM || (n_before >= 25 && code == 0 && n_first == 30),
                  "SIGTERM to rank 1 after %d records: exit %d with %d", n_before, code, n_first);
    resume_and_compare("s.jsonl", "s2.jsonl", "SIGTERM to rank 1, resumed", want);
    free(r1);
    free(r2);
}

START_TEST(test_mpi_tp) { mpi_run("--tp"); }
END_TEST

START_TEST(test_mpi_pp) { mpi_run("--pp"); }
END_TEST

int main(int argc, char **argv) {
    if (argc > 1) g_mode = argv[1];
    g_model = tu_data_or_skip("qwen3-tiny-q4_k_m.gguf");
    if (!g_model) return TU_SKIP;
    snprintf(g_dir, sizeof g_dir, "/tmp/tpi-batch-%s-XXXXXX", g_mode);
    if (!mkdtemp(g_dir)) return 1;
    Suite *s = suite_create("batch");
    TCase *tc = tcase_create(g_mode);
    tcase_set_timeout(tc, 120);
    if (!strcmp(g_mode, "inputs")) tcase_add_test(tc, test_inputs);
    else if (!strcmp(g_mode, "parallel")) {
        tcase_add_test(tc, test_parallel);
        tcase_add_test(tc, test_keep);
    }
    else if (!strcmp(g_mode, "choices")) tcase_add_test(tc, test_choices);
    else if (!strcmp(g_mode, "prefix")) tcase_add_test(tc, test_prefix);
    else if (!strcmp(g_mode, "echo")) tcase_add_test(tc, test_echo);
    else if (!strcmp(g_mode, "ends")) {
        tcase_add_test(tc, test_ends);
        tcase_add_test(tc, test_bias);
        tcase_add_test(tc, test_vllm_semantics);
        tcase_add_test(tc, test_text);
        tcase_add_test(tc, test_ids);
    }
    else if (!strcmp(g_mode, "chat")) {
        if (!tu_data_or_skip("qwen3-vocab.gguf")) return TU_SKIP;
        tcase_add_test(tc, test_chat);
    } else if (!strcmp(g_mode, "resume"))
        tcase_add_test(tc, test_resume);
    else if (!strcmp(g_mode, "sigterm")) tcase_add_test(tc, test_sigterm);
    else if (!strcmp(g_mode, "mpi_tp")) tcase_add_test(tc, test_mpi_tp);
    else if (!strcmp(g_mode, "mpi_pp")) tcase_add_test(tc, test_mpi_pp);
    else return 2;
    suite_add_tcase(s, tc);
    int rc = tu_run_suite(s);
    if (rc == 0) { // keep the files of a failing run for a look
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    }
    return rc;
}
