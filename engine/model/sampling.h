/*
 * sampling.h — choosing the next token from a row of logits, with llama.cpp's
 * semantics and order: OpenAI's logit bias, the repetition, frequency and presence
 * penalties over the last n tokens (prompt included), then top-k, top-p, min-p,
 * temperature, and a draw from the softmax (or, with temp_first, vLLM's: the frequency
 * and presence penalties over the generated tokens only, temperature, then min-p,
 * top-k, top-p on the tempered logits); temperature <= 0 is
 * greedy (argmax of the penalized logits). The random draw uses the sampler's
 * own PRNG (splitmix64), so a seed makes a run repeatable on any platform.
 * Also the log-softmax top-K of raw logits, for --logprobs.
 */
#ifndef SAMPLING_H
#define SAMPLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tpi.h"

struct sampler_params {
    float temp;           /* <= 0: greedy */
    int top_k;            /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off; > 1 discourages repeats (llama.cpp's formula) */
    int repeat_last_n;    /* tokens the penalties look back over (0: off; with temp_first
                             the repetition penalty's only) */
    float presence_penalty;  /* logit -= p if counted: in the last repeat_last_n tokens,
                                or with temp_first among the generated ones */
    float frequency_penalty; /* logit -= f * (times counted); both 0: off */
    uint64_t seed;
    bool temp_first;      /* vLLM's semantics: frequency and presence count the generated
                             tokens; temperature, then min-p, top-k, top-p (each on the
                             tempered distribution); false: llama.cpp's, top-k, top-p,
                             min-p on the raw logits, then temperature */
};

/* sampler_params' fields as bits, to say which ones a caller set itself. */
enum sampler_field {
    SP_TEMP = 1,
    SP_TOP_K = 2,
    SP_TOP_P = 4,
    SP_MIN_P = 8,
    SP_REPEAT_PENALTY = 16,
    SP_REPEAT_LAST_N = 32,
    SP_PRESENCE_PENALTY = 64,
    SP_FREQUENCY_PENALTY = 128,
};

/* One settable field of sampler_params: its command-line option, its GGUF key
 * (general.sampling.<gguf>; NULL: none), its bit, the values it takes and where it is. */
struct sampler_field_desc {
    const char *option, *gguf;
    unsigned bit; /* enum sampler_field */
    bool is_int;  /* an int field; else a float */
    double lo, hi;
    size_t off;
};

/* The fields the options and the model's recommended sampling set, n_sampler_fields. */
extern const struct sampler_field_desc sampler_fields[];
extern const int n_sampler_fields;

/* Whether v is a value field d takes: finite, in [lo, hi], whole where d is an int. */
bool sampler_field_ok(const struct sampler_field_desc *d, double v);

/* Store v (sampler_field_ok) in p's field d. */
void sampler_field_set(struct sampler_params *p, const struct sampler_field_desc *d, double v);

/* llama.cpp's defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05, penalty 1.0 over 64. */
void sampler_params_default(struct sampler_params *p);

/* OpenAI's and vLLM's defaults for a request that sets none: temperature 1, every filter
 * and penalty off, in vLLM's order (temp_first). */
void sampler_params_openai(struct sampler_params *p);

struct sampler_cand {
    int32_t id;
    float logit;
};

struct sampler {
    struct sampler_params p;
    int n_vocab;
    uint64_t rng;              /* splitmix64 state */
    int32_t *hist;             /* ring of the last repeat_last_n accepted tokens */
    int n_hist, hist_next;
    struct sampler_cand *cand; /* (n_vocab) scratch */
    uint8_t *seen;             /* (n_vocab) scratch: which ids the penalties touch */
    uint32_t *counts;          /* (n_vocab) times each id was counted (presence /
                                  frequency penalty on), else NULL */
    int32_t *gen_ids;          /* the distinct generated ids, n_gen of them */
    int n_gen;
    const int32_t *ban;        /* (n_ban) ids that cannot be sampled now (sampler_ban) */
    int n_ban;
    int32_t *bias_ids;         /* (n_bias) ascending, with bias_vals: sampler_set_bias */
    float *bias_vals;
    int n_bias;
};

/* Set up a sampler over n_vocab logits; free with sampler_free. Errors: OOM, bad params. */
int sampler_init(struct sampler *s, const struct sampler_params *p, int n_vocab,
                 struct tpi_error *err);
void sampler_free(struct sampler *s);

/* Record a token in the penalty history (prompt tokens too, as llama.cpp does). */
void sampler_accept(struct sampler *s, int32_t id);

/* Record a generated token: the history as sampler_accept, and with temp_first the
 * counts the presence and frequency penalties read (prompt tokens do not count there,
 * as in vLLM). */
void sampler_accept_output(struct sampler *s, int32_t id);

/* OpenAI's logit_bias: bias[i] is added to the logit of ids[i] (each in [0, n_vocab),
 * each once) before the penalties, at every draw of this sampler; -inf keeps the id from
 * being drawn; n = 0 clears. The logprobs functions below do not see it. Errors: OOM, an
 * id out of range or twice, a bias that is NaN or +inf. */
int sampler_set_bias(struct sampler *s, const int32_t *ids, const float *bias, int n,
                     struct tpi_error *err);

/* Until the next call, ids[0..n) (kept by pointer; n = 0 clears) cannot be sampled:
 * their logits count as -inf after the penalties (vLLM's min_tokens keeps the ends of
 * generation out this way). The logprobs functions below do not see it. */
void sampler_ban(struct sampler *s, const int32_t *ids, int n);

/* Choose a token from logits (n_vocab floats, not modified). Does not accept it. */
int32_t sampler_sample(struct sampler *s, const float *logits);

/* sampler_sample from a row's n best logits only: ids[0..n) and vals[0..n) in the order
 * of ops->row_top (value, then lower id; finite values, every logit of the row not listed
 * no larger than vals[n-1]). Returns the id sampler_sample would on the whole row, with
 * the same draws from the PRNG, or -1, nothing drawn, when the list cannot say: a logit
 * bias, a penalty that can raise logits, sampling without top-k, top-k above n, or
 * penalties that leave the k-th best not above vals[n-1]. Does not accept the token. */
int32_t sampler_sample_top(struct sampler *s, const int32_t *ids, const float *vals, int n);

/* Uniform double in [0, 1) from the sampler's PRNG. */
double sampler_uniform(struct sampler *s);

/* The k most likely tokens of log_softmax(logits), best first (ties: lower id first):
 * ids[0..k) and logprobs[0..k). Returns min(k, n_vocab). */
int sampler_top_logprobs(const float *logits, int n_vocab, int k, int32_t *ids, float *logprobs);

/* log_softmax(logits)[id]. */
float sampler_logprob_of(const float *logits, int n_vocab, int32_t id);

/* Both of the above with one pass over the exponentials: fills the top-k as
 * sampler_top_logprobs does (k clipped to n_vocab; k <= 0 fills nothing) and
 * returns log_softmax(logits)[id]. */
float sampler_logprobs(const float *logits, int n_vocab, int32_t id, int k, int32_t *ids,
                       float *logprobs);

#endif /* SAMPLING_H */
