/*
 * output.h — the result records of a batch run (JSONL, rank 0 only) and
 * --resume.
 *
 * Each record is written with ONE write() of the whole line, so a run killed at
 * any moment (kill -9) leaves complete lines plus at most one torn last line;
 * --resume truncates the torn line and skips every request whose record is
 * there (matched by line number and id), so nothing is lost or duplicated.
 *
 * Record shapes:
 *   ours:   {"id", "line", "text", "tokens", "finish_reason", "prompt_tokens",
 *            "completion_tokens", "ttft_ms", "decode_tps"[, "logprobs"]}; with n > 1
 *           the per-completion fields move into "choices": [{"index", "text",
 *           "tokens", "finish_reason"[, "logprobs"]}]; and
 *           {"id", "line", "finish_reason": "error", "error": {"message"}};
 *   OpenAI: vLLM run-batch's {"id", "custom_id", "response": {"status_code",
 *           "request_id", "body"}, "error"}; the body a chat.completion or
 *           text_completion object; request_id "tpinfer-batch-<line>" carries
 *           the line for --resume.
 */
#ifndef SCHED_OUTPUT_H
#define SCHED_OUTPUT_H

#include <stdbool.h>

#include "sched/requests.h"
#include "sched/sched.h"
#include "tpi.h"

struct tokenizer;

struct batch_out {
    int fd;                   /* output file, or 1 (stdout) */
    const char *path;         /* its name ("stdout"), for the errors */
    bool own_fd, ordered, sync;
    struct batch_input *in;   /* requests; `done` marks records already written */
    char **pending;           /* ordered: finished records waiting for predecessors */
    int next;                 /* ordered: first request not yet settled */
    const struct tokenizer *tok;
    const char *model_name;   /* for OpenAI bodies without "model" */
    struct out_choices *acc;  /* per request with n > 1: the choices finished so far */
    long n_written, n_errors;
    long n_results;           /* requests whose every choice finished (records made) */
};

/* --resume: read `path` (missing is fine: nothing done), truncate a torn last line,
 * refuse a file with a complete line that is not JSON (naming the line),
 * and mark the requests of `in` whose records are present as done. *n_done
 * receives how many. Errors: unreadable file, truncate failure (naming path). */
int batch_resume_scan(const char *path, struct batch_input *in, int *n_done,
                      struct tpi_error *err);

/* Open the output: path NULL means stdout; append when resuming, else truncate.
 * ordered: write in input order; sync: fsync after every record. */
int batch_out_open(struct batch_out *o, const char *path, bool append, bool ordered, bool sync,
                   struct batch_input *in, const struct tokenizer *tok, const char *model_name,
                   struct tpi_error *err);

/* Write (or, ordered, queue) the error record of every request with an error
 * that is not done yet. */
int batch_out_errors(struct batch_out *o, struct tpi_error *err);

/* Choice `choice` of request idx finished with res. The record is made once every
 * choice of the request has finished: with n = 1 ours is flat ({"text", "tokens",
 * ...}), with n > 1 it lists "choices" ({"index", "text", "tokens", "finish_reason"
 * [, "logprobs"]}) in index order and sums completion_tokens; OpenAI bodies always
 * list "choices". */
int batch_out_result(struct batch_out *o, int idx, int choice, const struct sched_result *res,
                     struct tpi_error *err);

/* Write whatever is queued, even out of order (used when a run stops early), and
 * close the file; a failed write, fsync (--fsync) or close of it is the error returned. */
int batch_out_close(struct batch_out *o, struct tpi_error *err);

#endif /* SCHED_OUTPUT_H */
