/*
 * sampling.c — see sampling.h. The candidate filters keep llama.cpp's order
 * (penalties, top-k, top-p, min-p, temperature, draw) because the order matters:
 * top-p measured before temperature keeps a different set than after it.
 *
 * The filters and the draw read candidates best first, but a vocabulary of 152k
 * is too long to sort per token (24 ms here, against a 4 ms decode step): top-k
 * keeps a k-heap in one pass over the logits, and without top-k the candidates
 * are sorted only as far as the filters and the draw walk (a doubling prefix,
 * each step a selection pass). Every draw equals the full sort's (test_model).
 */
#include "sampling.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

// Ranges as a request line's fields have them (sched/requests.c), except the temperature:
// any value <= 0 is greedy, as llama.cpp's --temp.
const struct sampler_field_desc sampler_fields[] = {
    {"--temp", "temp", SP_TEMP, false, -HUGE_VAL, HUGE_VAL, offsetof(struct sampler_params, temp)},
    {"--top-k", "top_k", SP_TOP_K, true, -1, 1 << 30, offsetof(struct sampler_params, top_k)},
    {"--top-p", "top_p", SP_TOP_P, false, 0, 1, offsetof(struct sampler_params, top_p)},
    {"--min-p", "min_p", SP_MIN_P, false, 0, 1, offsetof(struct sampler_params, min_p)},
    {"--repeat-penalty", "penalty_repeat", SP_REPEAT_PENALTY, false, 1e-3, 100,
     offsetof(struct sampler_params, repeat_penalty)},
    {"--repeat-last-n", "penalty_last_n", SP_REPEAT_LAST_N, true, -1, 1 << 24,
     offsetof(struct sampler_params, repeat_last_n)},
    {"--presence-penalty", NULL, SP_PRESENCE_PENALTY, false, -2, 2,
     offsetof(struct sampler_params, presence_penalty)},
    {"--frequency-penalty", NULL, SP_FREQUENCY_PENALTY, false, -2, 2,
     offsetof(struct sampler_params, frequency_penalty)},
};
const int n_sampler_fields = (int)(sizeof sampler_fields / sizeof sampler_fields[0]);

bool sampler_field_ok(const struct sampler_field_desc *d, double v) {
    return isfinite(v) && v >= d->lo && v <= d->hi && (!d->is_int || v == floor(v));
}

void sampler_field_set(struct sampler_params *p, const struct sampler_field_desc *d, double v) {
    char *field = (char *)p + d->off;
    if (d->is_int) *(int *)field = (int)v;
    else *(float *)field = (float)v;
}

void sampler_params_default(struct sampler_params *p) {
    *p = (struct sampler_params){.temp = 0.8f,
                                 .top_k = 40,
                                 .top_p = 0.95f,
                                 .min_p = 0.05f,
                                 .repeat_penalty = 1.0f,
                                 .repeat_last_n = 64,
                                 .seed = 0};
}

void sampler_params_openai(struct sampler_params *p) {
    *p = (struct sampler_params){.temp = 1.0f,
                                 .top_k = 0,
                                 .top_p = 1.0f,
                                 .min_p = 0.0f,
                                 .repeat_penalty = 1.0f,
                                 .repeat_last_n = 64,
                                 .seed = 0,
                                 .temp_first = true};
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
    const float fields[] = {p->temp, p->top_p, p->min_p, p->repeat_penalty,
                            p->presence_penalty, p->frequency_penalty};
    static const char *const names[] = {"temperature", "top-p", "min-p", "repeat penalty",
                                        "presence penalty", "frequency penalty"};
    for (int i = 0; i < 6; i++)
        if (!isfinite(fields[i]))
            return tpi_err(err, TPI_ERR_INVALID, "sampler: %s %g is not a finite number",
                           names[i], (double)fields[i]);
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
    const bool occ = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (occ) {
        s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
        s->gen_ids = malloc(sizeof *s->gen_ids * (size_t)n_vocab);
    }
    if (!s->cand || !s->seen || !s->hist || (occ && (!s->counts || !s->gen_ids))) {
        sampler_free(s);
        return tpi_err(err, TPI_ERR_NOMEM, "sampler: out of memory for %d candidates", n_vocab);
    }
    return TPI_OK;
}

void sampler_free(struct sampler *s) {
    free(s->cand);
    free(s->seen);
    free(s->hist);
    free(s->counts);
    free(s->gen_ids);
    free(s->bias_ids);
    free(s->bias_vals);
    s->bias_ids = NULL;
    s->bias_vals = NULL;
    s->n_bias = 0;
    s->cand = NULL;
    s->seen = NULL;
    s->hist = NULL;
    s->counts = NULL;
    s->gen_ids = NULL;
}

void sampler_accept(struct sampler *s, int32_t id) {
    if (s->p.repeat_last_n <= 0) return;
    s->hist[s->hist_next] = id;
    s->hist_next = (s->hist_next + 1) % s->p.repeat_last_n;
    if (s->n_hist < s->p.repeat_last_n) s->n_hist++;
}

void sampler_accept_output(struct sampler *s, int32_t id) {
    sampler_accept(s, id);
    // llama.cpp's counts are the window's, made at each draw (mark_penalized).
    if (!s->p.temp_first || !s->counts || id < 0 || id >= s->n_vocab) return;
    if (s->counts[id]++ == 0) s->gen_ids[s->n_gen++] = id;
}

/* Descending logit, then ascending id, so equal logits sort the same everywhere. */
static int cand_cmp(const void *a, const void *b) {
    const struct sampler_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static inline bool cand_before(struct sampler_cand x, struct sampler_cand y) {
    return x.logit > y.logit || (x.logit == y.logit && x.id < y.id);
}

static inline void cand_swap(struct sampler_cand *a, struct sampler_cand *b) {
    struct sampler_cand t = *a;
    *a = *b;
    *b = t;
}

/* Move the m first candidates of c[0..n) in cand_cmp order to c[0..m), sorted; the
 * rest stay in c[m..n) in no order. cand_cmp is a total order (ids differ), so the
 * prefix is exactly that of a full sort: a selection pass (expected O(n)) and a sort
 * of m instead of a sort of the whole vocabulary. */
static void best_prefix(struct sampler_cand *c, int n, int m) {
    if (m <= 0) return;
    if (m < n) {
        int lo = 0, hi = n - 1;
        while (lo < hi) { // quickselect: c[m-1] in its sorted place, better ones left of it
            const int mid = lo + (hi - lo) / 2;
            // Median of three as the pivot, kept at hi.
            if (cand_before(c[mid], c[lo])) cand_swap(&c[mid], &c[lo]);
            if (cand_before(c[hi], c[lo])) cand_swap(&c[hi], &c[lo]);
            if (cand_before(c[mid], c[hi])) cand_swap(&c[mid], &c[hi]);
            const struct sampler_cand pv = c[hi];
            int store = lo;
            for (int i = lo; i < hi; i++)
                if (cand_before(c[i], pv)) {
                    cand_swap(&c[i], &c[store]);
                    store++;
                }
            cand_swap(&c[store], &c[hi]);
            if (store == m - 1) break;
            if (store < m - 1) lo = store + 1;
            else hi = store - 1;
        }
    } else {
        m = n;
    }
    qsort(c, (size_t)m, sizeof *c, cand_cmp);
}

/* Grow the sorted prefix c[0..*sorted) of c[0..n) to at least `want` (doubling). */
static void extend_sorted(struct sampler_cand *c, int n, int *sorted, int want) {
    if (want > n) want = n;
    while (*sorted < want) {
        int add = *sorted ? *sorted : 256;
        if (add > n - *sorted) add = n - *sorted;
        best_prefix(c + *sorted, n - *sorted, add);
        *sorted += add;
    }
}

/* seen[] flags: the id is in the repetition window / was generated / is banned / has a
 * logit bias. */
enum { PEN_REPEAT = 1, PEN_OUTPUT = 2, PEN_BAN = 4, PEN_BIAS = 8 };

/* The logit bias of id (flagged PEN_BIAS, so present): a binary search of the sorted ids. */
static float bias_of(const struct sampler *s, int32_t id) {
    int lo = 0, hi = s->n_bias - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (s->bias_ids[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return s->bias_ids[lo] == id ? s->bias_vals[lo] : 0.0f;
}

/* The penalties of id (flags from seen[]), in the order both llama.cpp and vLLM apply
 * them: repetition (CTRL's: positive logits divided by the penalty, negative ones
 * multiplied), then frequency (times counted) and presence (counted at all). */
static inline float penalize_logit(const struct sampler *s, int32_t id, uint8_t flags, float l) {
    if (flags & PEN_BAN) return -INFINITY;
    if (flags & PEN_BIAS) l += bias_of(s, id);
    if (flags & PEN_REPEAT) l = l <= 0.0f ? l * s->p.repeat_penalty : l / s->p.repeat_penalty;
    if (flags & PEN_OUTPUT) {
        l = l - s->p.frequency_penalty * (float)s->counts[id];
        l = l - s->p.presence_penalty;
    }
    return l;
}

/* The k best of logits[0..n) (0 < k <= n) into c[0..k), sorted by cand_cmp, the
 * logits of ids flagged in pen->seen penalized first (pen may be NULL): one pass
 * keeping a min-heap of the k best so far (root: the worst of them), so most logits
 * cost one comparison. A later id never beats an equal logit, so ">" suffices. */
static inline __attribute__((always_inline)) void
heap_top_k_pass(const float *logits, int n, int k, struct sampler_cand *c,
                const struct sampler *pen, const bool with_penalty) {
    for (int i = 0; i < n; i++) {
        struct sampler_cand x = {i, logits[i]};
        if (with_penalty && pen->seen[i]) x.logit = penalize_logit(pen, i, pen->seen[i], x.logit);
        int j;
        if (i < k) { // sift up: the parent is no worse than the child
            j = i;
            while (j > 0 && cand_before(c[(j - 1) / 2], x)) {
                c[j] = c[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            c[j] = x;
            continue;
        }
        if (!(x.logit > c[0].logit)) continue;
        j = 0; // replace the root, sift down
        for (;;) {
            int w = 2 * j + 1;
            if (w >= k) break;
            if (w + 1 < k && cand_before(c[w], c[w + 1])) w++; // the worse child
            if (!cand_before(x, c[w])) break;
            c[j] = c[w];
            j = w;
        }
        c[j] = x;
    }
}

static void heap_top_k(const float *logits, int n, int k, struct sampler_cand *c,
                       const struct sampler *pen) {
    if (pen) heap_top_k_pass(logits, n, k, c, pen, true);
    else heap_top_k_pass(logits, n, k, c, NULL, false); // the plain loop
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
}

static int32_t sample_sorted(struct sampler *s, struct sampler_cand *c, int n_cand, int sorted);

/* Set (on) or clear the seen[] flags of the ids the penalties and the ban touch. With
 * llama.cpp's semantics (!temp_first) the frequency and presence penalties count the
 * repetition window (the last repeat_last_n tokens, prompt included): on counts them
 * into counts[], off zeroes those entries again. */
static void mark_penalized(struct sampler *s, bool rep, bool occ, bool on) {
    const int n_vocab = s->n_vocab;
    for (int i = 0; i < s->n_ban; i++)
        if (s->ban[i] >= 0 && s->ban[i] < n_vocab)
            s->seen[s->ban[i]] = on ? s->seen[s->ban[i]] | PEN_BAN : 0;
    for (int i = 0; i < s->n_bias; i++)
        s->seen[s->bias_ids[i]] = on ? s->seen[s->bias_ids[i]] | PEN_BIAS : 0;
    if (rep)
        for (int i = 0; i < s->n_hist; i++)
            if (s->hist[i] >= 0 && s->hist[i] < n_vocab)
                s->seen[s->hist[i]] = on ? s->seen[s->hist[i]] | PEN_REPEAT : 0;
    if (occ && s->p.temp_first)
        for (int i = 0; i < s->n_gen; i++)
            s->seen[s->gen_ids[i]] = on ? s->seen[s->gen_ids[i]] | PEN_OUTPUT : 0;
    if (occ && !s->p.temp_first)
        for (int i = 0; i < s->n_hist; i++) {
            const int32_t h = s->hist[i];
            if (h < 0 || h >= n_vocab) continue;
            if (on) {
                s->counts[h]++;
                s->seen[h] |= PEN_OUTPUT;
            } else {
                s->counts[h] = 0;
                s->seen[h] = 0;
            }
        }
}

/* The first index of the largest of l[0..n) (NaNs never win; a NaN at 0 gives 0, as a
 * plain scan from l[0] with > does). The largest is found in 16 independent lanes (a
 * vectorizable max; the scan's compare chain ran at ~1 ns a value on 152k-entry rows),
 * then its first position. */
static int32_t argmax_first(const float *l, int n) {
    if (n <= 0 || isnan(l[0])) return 0;
    float m[16];
    for (int j = 0; j < 16; j++) m[j] = l[0];
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) m[j] = l[i + j] > m[j] ? l[i + j] : m[j];
    float best = m[0];
    for (int j = 1; j < 16; j++) best = m[j] > best ? m[j] : best;
    for (; i < n; i++) best = l[i] > best ? l[i] : best;
    for (int k = 0; k < n; k++)
        if (l[k] == best) return k;
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int sampler_set_bias(struct sampler *s, const int32_t *ids, const float *bias, int n,
                     struct tpi_error *err) {
    free(s->bias_ids);
    free(s->bias_vals);
    s->bias_ids = NULL;
    s->bias_vals = NULL;
    s->n_bias = 0;
    if (n <= 0) return TPI_OK;
    int32_t *order = malloc(sizeof *order * (size_t)n * 2); // (id, index) pairs
    s->bias_ids = malloc(sizeof *s->bias_ids * (size_t)n);
    s->bias_vals = malloc(sizeof *s->bias_vals * (size_t)n);
    if (!order || !s->bias_ids || !s->bias_vals) {
        free(order);
        return tpi_err(err, TPI_ERR_NOMEM, "sampler: out of memory for %d logit biases", n);
    }
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->n_vocab) {
            free(order);
            return tpi_err(err, TPI_ERR_INVALID,
                           "logit bias: token %d is outside the vocabulary of %d", (int)ids[i],
                           s->n_vocab);
        }
        if (isnan(bias[i]) || bias[i] == INFINITY) {
            free(order);
            return tpi_err(err, TPI_ERR_INVALID, "logit bias %g for token %d", (double)bias[i],
                           (int)ids[i]);
        }
        order[2 * i] = ids[i], order[2 * i + 1] = i;
    }
    qsort(order, (size_t)n, sizeof(int32_t) * 2, cmp_i32); // by id: the pair's first int
    for (int i = 0; i < n; i++) {
        if (i > 0 && order[2 * i] == order[2 * i - 2]) {
            const int id = order[2 * i];
            free(order);
            return tpi_err(err, TPI_ERR_INVALID, "sampler: logit bias for id %d twice", id);
        }
        s->bias_ids[i] = order[2 * i];
        s->bias_vals[i] = bias[order[2 * i + 1]];
    }
    free(order);
    s->n_bias = n;
    return TPI_OK;
}

void sampler_ban(struct sampler *s, const int32_t *ids, int n) {
    s->ban = n > 0 ? ids : NULL;
    s->n_ban = n > 0 ? n : 0;
}

int32_t sampler_sample(struct sampler *s, const float *logits) {
    const int n_vocab = s->n_vocab;
    const bool rep = s->p.repeat_penalty != 1.0f && s->n_hist > 0;
    const bool occ = s->counts && (s->p.temp_first ? s->n_gen > 0 : s->n_hist > 0);
    const bool ban = s->n_ban > 0 || s->n_bias > 0;
    if (s->p.temp <= 0.0f && !rep && !occ && !ban) return argmax_first(logits, n_vocab);
    // Each distinct penalized id is flagged once, whatever its repeats in the history.
    mark_penalized(s, rep, occ, true);
    const struct sampler *pen = rep || occ || ban ? s : NULL;
    struct sampler_cand *c = s->cand;
    // Greedy is the top 1; top-k draws from a sorted top k; otherwise every candidate
    // is kept and sorted only as far as the filters look (sample_sorted).
    const int k = s->p.temp <= 0.0f ? 1
                  : (s->p.top_k > 0 && s->p.top_k < n_vocab) ? s->p.top_k : 0;
    int n_cand = k, sorted = k;
    if (k > 0) {
        heap_top_k(logits, n_vocab, k, c, pen);
    } else {
        for (int i = 0; i < n_vocab; i++) {
            c[i] = (struct sampler_cand){i, logits[i]};
            if (pen && s->seen[i]) c[i].logit = penalize_logit(s, i, s->seen[i], c[i].logit);
        }
        n_cand = n_vocab;
        sorted = 0;
        extend_sorted(c, n_vocab, &sorted, 1); // the best first: the filters measure from it
    }
    mark_penalized(s, rep, occ, false);
    if (s->p.temp <= 0.0f) return c[0].id;
    return sample_sorted(s, c, n_cand, sorted);
}

int32_t sampler_sample_top(struct sampler *s, const int32_t *ids, const float *vals, int n) {
    const int n_vocab = s->n_vocab;
    const bool rep = s->p.repeat_penalty != 1.0f && s->n_hist > 0;
    const bool occ = s->counts && (s->p.temp_first ? s->n_gen > 0 : s->n_hist > 0);
    const bool ban = s->n_ban > 0;
    // A bias, or a penalty that raises logits, can bring an id from outside the list.
    if (n <= 0 || s->n_bias > 0 || (rep && s->p.repeat_penalty < 1.0f) ||
        (occ && (s->p.frequency_penalty < 0.0f || s->p.presence_penalty < 0.0f)))
        return -1;
    if (s->p.temp <= 0.0f && !rep && !occ && !ban) return ids[0]; // argmax_first's id
    // sampler_sample's candidates: the top 1 (greedy) or the top k, else all of them.
    const int k = s->p.temp <= 0.0f ? 1
                  : (s->p.top_k > 0 && s->p.top_k < n_vocab) ? s->p.top_k : 0;
    if (k == 0 || k > n) return -1;
    struct sampler_cand *c = s->cand;
    for (int i = 0; i < n; i++) c[i] = (struct sampler_cand){ids[i], vals[i]};
    if (rep || occ || ban) {
        mark_penalized(s, rep, occ, true);
        for (int i = 0; i < n; i++)
            if (s->seen[c[i].id])
                c[i].logit = penalize_logit(s, c[i].id, s->seen[c[i].id], c[i].logit);
        mark_penalized(s, rep, occ, false);
        best_prefix(c, n, k);
        // Every id outside the list has a raw logit, so a penalized one, <= vals[n-1]:
        // the k best are all here when the k-th beats that strictly (a tie could lose
        // to a lower id outside).
        if (n < n_vocab && !(c[k - 1].logit > vals[n - 1])) return -1;
    }
    if (s->p.temp <= 0.0f) return c[0].id;
    return sample_sorted(s, c, k, k);
}

/* The candidates of c[0..n) min-p keeps: p >= min_p * p_max, that is logit >= max +
 * log(min_p) at temperature 1 and >= max + t * log(min_p) on logits tempered by t. */
static int min_p_keep(struct sampler_cand *c, int n_cand, int *sorted, int n, float thr) {
    int keep = 1;
    while (keep < n) {
        if (keep == *sorted) extend_sorted(c, n_cand, sorted, 2 * *sorted);
        if (c[keep].logit < thr) break;
        keep++;
    }
    return keep;
}

/* Top-p, min-p, temperature and the draw over candidates c[0..n_cand), of which
 * c[0..sorted) are in cand_cmp order (at least the best one, and all of the top-k
 * when top-k applies: then n_cand is k or the sort covers it). The filters read the
 * candidates in order but only as far as they look, so the sort grows only that far.
 * Top-k and min-p keep prefixes of the sorted order, so theirs commute; top-p measures
 * what they left, with (temp_first) or without the temperature. */
static int32_t sample_sorted(struct sampler *s, struct sampler_cand *c, int n_cand, int sorted) {
    int n = n_cand;
    if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
    const float top = c[0].logit;
    const bool tf = s->p.temp_first;
    const double inv_t = tf ? 1.0 / s->p.temp : 1.0; // top-p's scale

    if (tf && s->p.min_p > 0.0f)
        n = min_p_keep(c, n_cand, &sorted, n, top + s->p.temp * logf(s->p.min_p));
    if (s->p.top_p < 1.0f) { // smallest prefix whose probability reaches top_p
        double sum = 0.0, cum = 0.0;
        for (int i = 0; i < n; i++) sum += exp(((double)c[i].logit - top) * inv_t); // any order
        for (int i = 0; i < n; i++) {
            if (i == sorted) extend_sorted(c, n_cand, &sorted, 2 * sorted);
            cum += exp(((double)c[i].logit - top) * inv_t) / sum;
            if (cum >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (!tf && s->p.min_p > 0.0f) n = min_p_keep(c, n_cand, &sorted, n, top + logf(s->p.min_p));
    // The draw: the total in any order, then the walk in sorted order as far as u.
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp(((double)c[i].logit - top) / s->p.temp);
    double u = sampler_uniform(s) * sum, cum = 0.0;
    for (int i = 0; i < n; i++) {
        if (i == sorted) extend_sorted(c, n_cand, &sorted, 2 * sorted);
        cum += exp(((double)c[i].logit - top) / s->p.temp);
        if (u < cum) return c[i].id;
    }
    extend_sorted(c, n_cand, &sorted, n); // u fell past the last by rounding: the last
    return c[n - 1].id;
}

/* mx + log(sum exp(logits - mx)), mx the largest logit. */
static double lse_from(const float *logits, int n_vocab, float mx) {
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

static double log_sum_exp(const float *logits, int n_vocab) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    return lse_from(logits, n_vocab, mx);
}

float sampler_logprob_of(const float *logits, int n_vocab, int32_t id) {
    return (float)((double)logits[id] - log_sum_exp(logits, n_vocab));
}

/* The k (1 <= k <= n_vocab) largest raw logits, best first (ties: lower id first),
 * by insertion into a k-long list: k is small (a handful), the vocabulary large. */
static void top_raw(const float *logits, int n_vocab, int k, int32_t *ids, float *vals) {
    int n = 0;
    for (int i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (n == k && !(l > vals[k - 1])) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && l > vals[j - 1]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = l;
        ids[j] = i;
    }
}

int sampler_top_logprobs(const float *logits, int n_vocab, int k, int32_t *ids, float *logprobs) {
    if (k > n_vocab) k = n_vocab;
    if (k <= 0) return 0;
    top_raw(logits, n_vocab, k, ids, logprobs);
    const double lse = lse_from(logits, n_vocab, logprobs[0]); // the list starts at the max
    for (int j = 0; j < k; j++) logprobs[j] = (float)((double)logprobs[j] - lse);
    return k;
}

float sampler_logprobs(const float *logits, int n_vocab, int32_t id, int k, int32_t *ids,
                       float *logprobs) {
    if (k > n_vocab) k = n_vocab;
    if (k <= 0) return sampler_logprob_of(logits, n_vocab, id);
    top_raw(logits, n_vocab, k, ids, logprobs);
    const double lse = lse_from(logits, n_vocab, logprobs[0]);
    for (int j = 0; j < k; j++) logprobs[j] = (float)((double)logprobs[j] - lse);
    return (float)((double)logits[id] - lse);
}
