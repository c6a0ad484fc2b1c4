/*
 * sched.h — the continuous-batching scheduler behind `tpinfer run -f`: up to
 * n_parallel sequences in flight, one per KV slot of the model; a new request
 * joins as soon as a slot frees; every step is ONE model_forward over the
 * concatenated tokens of all active sequences (one decode token each, plus
 * chunks of joining prompts up to the step's token budget n_ubatch), with
 * logits asked only for the rows that are due to sample.
 *
 * Multi-rank protocol (every rank runs sched_run with the same parameters and
 * advances identical state, so they issue the same model_forward calls):
 *   1. world rank 0 (which alone has the requests) broadcasts the step header
 *      {stop, n_admitted, n_bytes} and the admitted requests, serialized;
 *   2. every rank builds the same batch (copying shared prompt prefixes between KV
 *      slots alike) and runs model_forward;
 *   3. the decider rank (logits, tp_rank 0 of the last stage) samples each due
 *      row with that request's own sampler and broadcasts the chosen ids (and
 *      logprobs when asked);
 *   4. every rank appends the ids, decodes text, checks EOG / stop strings /
 *      the length limit with the same code, and frees finished slots; world
 *      rank 0 reports each finished request through the done callback.
 * Rows do not interact in the CPU ops, and each request has its own sampler
 * and seed, so results on the CPU backend do not depend on n_parallel or
 * n_ubatch.
 */
#ifndef SCHED_H
#define SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "model/sampling.h"

struct tokenizer;

/* One request as the engine runs it. On rank 0 the caller's arrays are only
 * read during the next-callback's step (the scheduler copies them). */
struct sched_request {
    int64_t tag;              /* caller's handle, given back in the done callback */
    const int32_t *prompt;    /* (n_prompt) token ids, 1 <= n_prompt < n_ctx */
    int n_prompt;
    int max_tokens;           /* most tokens to generate (>= 1); capped at n_ctx - n_prompt */
    int n_logprobs;           /* top-K logprobs per generated token (0: none) */
    bool score_prompt;        /* also the logprobs of every prompt token after the first
                                 (needs n_logprobs >= 1; its prompt is never shared) */
    struct sampler_params sp; /* the request's own sampler and seed */
    const char *const *stop;  /* NUL-terminated stop strings, n_stop of them */
    int n_stop;
    const int32_t *stop_ids;  /* (n_stop_ids) ids that end the sequence as EOG does */
    int n_stop_ids;
    bool ignore_eos;          /* EOG ids are ordinary tokens (vLLM's ignore_eos) */
    bool keep_stop_string;    /* the text ends after the stop string, not before it (vLLM's
                                 include_stop_str_in_output) */
    bool render_control;      /* CONTROL tokens are written into the text (vLLM's
                                 skip_special_tokens false, which its tool parsers set) */
    const int32_t *bias_ids;  /* (n_bias) OpenAI's logit_bias: ids, each once, */
    const float *bias_vals;   /* and what is added to their logits at every draw */
    int n_bias;
    int min_tokens;           /* tokens before the sequence may end (vLLM's min_tokens): the
                                 end ids cannot be sampled and stop strings are not looked
                                 for until then */
};

/* What a finished request produced (valid during the done callback only). */
struct sched_result {
    const int32_t *tokens;     /* (n_tokens) generated ids, without the EOG token */
    int n_tokens;
    const char *text;          /* NUL-terminated, cut before a stop string */
    size_t n_text;
    const char *finish_reason; /* "stop" (EOG or stop string) or "length" */
    const char *stop_string;   /* the stop string that ended it, or NULL */
    int32_t stop_id;           /* the stop_token_ids id that ended it, or -1 */
    int n_prompt;
    int lp_k;                  /* K of the logprobs below (0: none) */
    const int32_t *lp_ids;     /* (n_tokens, lp_k) top-K ids, best first */
    const float *lp_vals;      /* (n_tokens, lp_k) their log-probabilities */
    const float *lp_chosen;    /* (n_tokens) log-probability of the chosen id (lp_k > 0) */
    const int32_t *plp_ids;    /* score_prompt: (n_prompt, lp_k) top-K before prompt token i */
    const float *plp_vals;     /*   their log-probabilities (row 0 unused) */
    const float *plp_chosen;   /*   (n_prompt) log-probability of prompt token i (i >= 1) */
    double t_first_s;          /* admission to first sampled token */
    double t_decode_s;         /* first to last sampled token */
};

/* Counters, kept on every rank (timings meaningful on rank 0). */
struct sched_stats {
    int64_t n_done;            /* requests finished */
    int64_t n_prompt_tokens;   /* prompt tokens fed */
    int64_t n_prompt_shared;   /* prompt tokens taken from another sequence's KV instead */
    int64_t n_gen_tokens;      /* tokens sampled */
    int64_t n_steps;           /* model_forward calls */
    int64_t n_decode_steps;    /* ... of them with decode rows only (no prompt chunk) */
    int64_t n_rows_whole;      /* logits rows copied out whole (the decider's; the others were
                                  sampled from their best candidates on the backend) */
    double t_forward_s;        /* time in model_forward (each row's candidates included) */
    double t_sample_s;         /* time choosing tokens from the logits (and sending them) */
    int n_active;              /* sequences in flight now (at the end: abandoned by a stop) */
    double t_start_s, t_now_s;
};

/* Callbacks, rank 0's but step. next: fill *rq with the next request to run and return
 * 1, or return 0 when there are none left. stop: non-zero once the run must stop
 * admitting and return (checked once per step): SCHED_STOP_SIGNAL (sched_run then
 * returns TPI_ERR_INTERRUPTED on every rank) or SCHED_STOP_FAILED (rank 0 failed,
 * e.g. its results file: TPI_ERR_IO on every rank). done: a request finished.
 * step: after every step on every rank, for progress or to pass a rank's signal on to
 * rank 0 (may be NULL). */
enum { SCHED_STOP_SIGNAL = 1, SCHED_STOP_FAILED = 2 };
struct sched_callbacks {
    int (*next)(void *user, struct sched_request *rq);
    int (*stop)(void *user);
    void (*done)(void *user, int64_t tag, const struct sched_result *res);
    void (*step)(void *user, const struct sched_stats *st);
    void *user;
};

struct sched_params {
    int n_parallel;       /* sequences in flight (<= the model's n_slot) */
    int n_ubatch;         /* token budget of one step (decode tokens + prefill chunks) */
    bool no_prefix_share; /* prefill every prompt whole, even a prefix already in the KV */
};

/* Prefix sharing: every slot remembers the tokens its KV cache holds, also after
 * its sequence ends. A new prompt goes to the free slot whose cache begins most
 * like it and keeps that prefix; a prompt still prefilling copies a longer prefix
 * from any other slot (model_kv_copy), and waits while an older sequence is still
 * prefilling a longer common prefix. At least SCHED_SHARE_MIN tokens, never the
 * prompt's last token (its logits are needed). The n choices of one request and a
 * system prompt shared by many lines are the cases it serves. */
#define SCHED_SHARE_MIN 8

/* Scored prompt rows (score_prompt) one step computes logits for, at most. */
#define SCHED_SCORE_ROWS 64

/* Run requests until the source is empty and every sequence has finished
 * (TPI_OK), or until rank 0's stop callback says so (TPI_ERR_INTERRUPTED, with
 * stats->n_active sequences abandoned unfinished). Collective over the model's
 * grid: every rank calls it with the same params; cb is used on world rank 0
 * only (others may pass zeros). stats may be NULL. Errors: forward / comm
 * failures, OOM, a request that does not fit (every rank alike). */
int sched_run(struct model *m, const struct tokenizer *tok, const struct sched_params *sp,
              const struct sched_callbacks *cb, struct sched_stats *stats, struct tpi_error *err);

#endif /* SCHED_H */
