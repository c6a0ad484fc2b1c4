/*
 * generate.h — one prompt in, one completion out, on every rank of the grid:
 * prefill, then decode token by token. Sampling is decided once, on the
 * decider rank (tp_rank 0 of the last stage, where the logits are), and the
 * chosen token (with its logprobs) is broadcast so every rank feeds the same
 * token next and keeps the same text; world rank 0 streams the text.
 * `tpinfer run -p` calls generate_one once; a batch prompt file calls it per
 * prompt (or replaces it with a batching scheduler over model_forward).
 */
#ifndef GENERATE_H
#define GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "sampling.h"

struct tokenizer;

struct gen_params {
    int n_predict;               /* most tokens to generate (>= 0) */
    struct sampler_params sp;
    int n_logprobs;              /* top-K logprobs per generated token (0: none) */
    int n_prompt_logprobs;       /* top-K logprobs after each prompt token (0: none) */
    const char *const *stop;     /* user stop strings (NUL-terminated), n_stop of them */
    int n_stop;
    const int32_t *bias_ids; /* (n_bias) ids whose logits get bias_vals added (each */
    const float *bias_vals;  /* once); -inf keeps the id from being sampled at all */
    int n_bias;
    bool ignore_eos;             /* the end-of-generation ids are never sampled (llama.cpp's
                                    --ignore-eos): the completion runs to n_predict */
    int slot;                    /* KV slot to use (0 for single-prompt runs) */
};

/* Everything a completion produced; the same on every rank. */
struct gen_result {
    int32_t *tokens;        /* (n_tokens) completion ids, without the EOG token */
    int n_tokens;
    char *text;             /* completion text, NUL-terminated, cut before a stop string */
    size_t n_text;
    const char *finish_reason; /* "stop" (EOG or stop string) or "length" */
    int lp_k;               /* K of the logprobs below (0: none) */
    int32_t *lp_ids;        /* (n_tokens, lp_k) top-K ids of the distribution that chose token j */
    float *lp_vals;         /* (n_tokens, lp_k) their log-probabilities */
    float *lp_chosen;       /* (n_tokens) with lp_k > 0: token j's own log-probability */
    int plp_k;
    int n_prompt;
    int32_t *plp_ids;       /* (n_prompt, plp_k) top-K after prompt token i */
    float *plp_vals;
    double t_prompt_s, t_gen_s; /* prefill time, decode time */
};

/* Called on world rank 0 with text that is complete (valid UTF-8, never part of a
 * stop string); bytes are not NUL-terminated. */
typedef void (*gen_text_fn)(const char *bytes, size_t n_bytes, void *user);

/* Generate a completion of prompt[0..n_prompt) (collective over the grid; all ranks
 * pass the same prompt and params). Errors (on every rank alike): an empty prompt,
 * n_prompt + n_predict over the context, forward or comm failures. */
int generate_one(struct model *m, const struct tokenizer *tok, const int32_t *prompt,
                 int n_prompt, const struct gen_params *gp, gen_text_fn on_text, void *user,
                 struct gen_result *res, struct tpi_error *err);

/* Free a result's arrays (the struct itself is the caller's). */
void gen_result_free(struct gen_result *r);

/* Offset of the earliest occurrence of any of the n_stop stop strings in
 * text[from..n) (the match may not start before `from`); -1 when none. *which (when
 * not NULL) gets the index of the string found there (the first listed of those that
 * begin there). */
long gen_find_stop(const char *text, size_t n, size_t from, const char *const *stop, int n_stop,
                   int *which);

/* vLLM's stop-string check after a step that appended text[before..n): the first stop
 * string in list order with an occurrence that ends past `before` (its first such
 * occurrence: Python's str.find from before + 1 - len); its offset, *which (when not
 * NULL) its index; -1 when none. Earlier text is not searched again, so a string that
 * lay in it (before min_tokens) does not end the sequence later. */
long gen_find_stop_listed(const char *text, size_t n, size_t before, const char *const *stop,
                          int n_stop, int *which);

#endif /* GENERATE_H */
