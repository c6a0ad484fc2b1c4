/*
 * sampling.c — see sampling.h. The candidate filters keep llama.cpp's order
 * (penalties, top-k, top-p, min-p, temperature, draw) because the order matters:
 * top-p measured before temperature keeps a different set than after it.
 */
#include "sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sampler_params_default(struct sampler_params *p) {
    *p = (struct sampler_params){.temp = 0.8f,
                                 .top_k = 40,
                                 .top_p = 0.95f,
                                 .min_p = 0.05f,
                                 .repeat_penalty = 1.0f,
                                 .repeat_last_n = 64,
                                 .seed = 0};
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

double sampler_uniform(struct sampler *s) {
    return (double)(splitmix64(&s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

int sampler_init(struct sampler *s, const struct sampler_params *p, int n_vocab,
                 struct tpi_error *err) {
    memset(s, 0, sizeof *s);
    if (n_vocab <= 0) return tpi_err(err, TPI_ERR_INVALID, "sampler: vocabulary of %d", n_vocab);
    if (p->repeat_last_n < 0 || p->repeat_penalty <= 0.0f)
        return tpi_err(err, TPI_ERR_INVALID,
                       "sampler: repeat penalty %g over %d tokens (penalty must be > 0)",
                       (double)p->repeat_penalty, p->repeat_last_n);
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    s->cand = malloc(sizeof *s->cand * (size_t)n_vocab);
    s->seen = calloc((size_t)n_vocab, 1);
    s->hist = malloc(sizeof *s->hist * (size_t)(p->repeat_last_n > 0 ? p->repeat_last_n : 1));
    if (!s->cand || !s->seen || !s->hist) {
        sampler_free(s);
        return tpi_err(err, TPI_ERR_NOMEM, "sampler: out of memory for %d candidates", n_vocab);
    }
    return TPI_OK;
}

void sampler_free(struct sampler *s) {
    free(s->cand);
    free(s->seen);
    free(s->hist);
    s->cand = NULL;
    s->seen = NULL;
    s->hist = NULL;
}

void sampler_accept(struct sampler *s, int32_t id) {
    if (s->p.repeat_last_n <= 0) return;
    s->hist[s->hist_next] = id;
    s->hist_next = (s->hist_next + 1) % s->p.repeat_last_n;
    if (s->n_hist < s->p.repeat_last_n) s->n_hist++;
}

/* Descending logit, then ascending id, so equal logits sort the same everywhere. */
static int cand_cmp(const void *a, const void *b) {
    const struct sampler_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t sampler_sample(struct sampler *s, const float *logits) {
    const int n_vocab = s->n_vocab;
    struct sampler_cand *c = s->cand;
    for (int i = 0; i < n_vocab; i++) c[i] = (struct sampler_cand){i, logits[i]};

    // Repetition penalty (llama.cpp / CTRL): each distinct recent token once —
    // positive logits divided by the penalty, negative ones multiplied.
    if (s->p.repeat_penalty != 1.0f && s->n_hist > 0) {
        for (int i = 0; i < s->n_hist; i++) {
            int32_t id = s->hist[i];
            if (id < 0 || id >= n_vocab || s->seen[id]) continue;
            s->seen[id] = 1;
            float *l = &c[id].logit;
            *l = *l <= 0.0f ? *l * s->p.repeat_penalty : *l / s->p.repeat_penalty;
        }
        for (int i = 0; i < s->n_hist; i++)
            if (s->hist[i] >= 0 && s->hist[i] < n_vocab) s->seen[s->hist[i]] = 0;
    }

    if (s->p.temp <= 0.0f) { // greedy: the first of the largest
        int best = 0;
        for (int i = 1; i < n_vocab; i++)
            if (c[i].logit > c[best].logit) best = i;
        return c[best].id;
    }

    qsort(c, (size_t)n_vocab, sizeof *c, cand_cmp);
    int n = n_vocab;
    if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;

    if (s->p.top_p < 1.0f) { // smallest prefix whose probability reaches top_p
        double sum = 0.0, cum = 0.0;
        for (int i = 0; i < n; i++) sum += exp((double)c[i].logit - c[0].logit);
        for (int i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - c[0].logit) / sum;
            if (cum >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0.0f) { // p >= min_p * p_max  <=>  logit >= max + log(min_p)
        float thr = c[0].logit + logf(s->p.min_p);
        int keep = 1;
        while (keep < n && c[keep].logit >= thr) keep++;
        n = keep;
    }

    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp(((double)c[i].logit - c[0].logit) / s->p.temp);
    double u = sampler_uniform(s) * sum, cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += exp(((double)c[i].logit - c[0].logit) / s->p.temp);
        if (u < cum) return c[i].id;
    }
    return c[n - 1].id;
}

static double log_sum_exp(const float *logits, int n_vocab) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

float sampler_logprob_of(const float *logits, int n_vocab, int32_t id) {
    return (float)((double)logits[id] - log_sum_exp(logits, n_vocab));
}

int sampler_top_logprobs(const float *logits, int n_vocab, int k, int32_t *ids, float *logprobs) {
    if (k > n_vocab) k = n_vocab;
    if (k <= 0) return 0;
    // Insertion into a k-long list: k is small (a handful), the vocabulary large.
    int n = 0;
    for (int i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (n == k && !(l > logprobs[k - 1])) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && l > logprobs[j - 1]) {
            logprobs[j] = logprobs[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        logprobs[j] = l;
        ids[j] = i;
    }
    double lse = log_sum_exp(logits, n_vocab);
    for (int j = 0; j < k; j++) logprobs[j] = (float)((double)logprobs[j] - lse);
    return k;
}
