/*
 * rope.h — each rotated pair's angle per position, one formula for every backend: the
 * CPU op, the CUDA table made on the host and the CUDA kernels' own fall-back (a
 * header of inline functions that C and nvcc both compile).
 *
 * struct ops_rope (ops.h) says what is computed; rope_pairs is that struct resolved
 * once on the host (YaRN's correction range, the cos/sin scale), small enough to pass
 * to a kernel by value. The arithmetic is llama.cpp's (ggml's rope_yarn), in double:
 * the angle pos * inv_i reaches thousands of radians, where llama.cpp's float
 * recurrence is off by ~1e-4 (ops_cpu.c says more).
 */
#ifndef ROPE_H
#define ROPE_H

#include <math.h>

#include "ops.h"

#ifdef __CUDACC__
#define ROPE_HD __host__ __device__
#else
#define ROPE_HD
#endif

/* struct ops_rope, resolved: pair i's inverse frequency is rope_pair_inv(p, i) and cos,
 * sin are scaled by mscale. */
struct rope_pairs {
    int n_rot;
    double base, freq_scale, ext_factor;
    double lo, hi; /* YaRN's ramp: pairs below lo keep base^(-2i/n_rot), above hi are scaled */
    double mscale;
};

/* YaRN's correction dim: the pair that turns n_turns times over n_ctx_orig positions. */
static inline double rope_corr_dim(int n_rot, int n_ctx_orig, double n_turns, double base) {
    return n_rot * log(n_ctx_orig / (n_turns * 2.0 * 3.14159265358979323846)) / (2.0 * log(base));
}

/* r resolved for the pair loop (host). Plain rope gives freq_scale 1, ext_factor 0 and
 * mscale 1 exactly, so its angles are base^(-2i/n_rot) unchanged. YaRN's magnitude term
 * 1 + 0.1 ln(factor) applies only to a factor above 1 (as Hugging Face's get_mscale and
 * llama.cpp, which divides ggml's own term back out, have it). */
static inline struct rope_pairs rope_pairs_of(const struct ops_rope *r) {
    struct rope_pairs p;
    p.n_rot = r->n_rot;
    p.base = (double)r->freq_base;
    p.freq_scale = (double)r->freq_scale;
    p.ext_factor = (double)r->ext_factor;
    p.lo = 0.0;
    p.hi = 0.0;
    p.mscale = (double)r->attn_factor;
    if (r->ext_factor != 0.0f) {
        const double lo = floor(rope_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_fast, p.base));
        const double hi = ceil(rope_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_slow, p.base));
        p.lo = lo > 0.0 ? lo : 0.0;
        p.hi = hi < r->n_rot - 1 ? hi : (double)(r->n_rot - 1);
        if (p.freq_scale < 1.0) /* YaRN's get_mscale: 1 for a factor up to 1 */
            p.mscale *= 1.0 + 0.1 * log(1.0 / p.freq_scale);
    }
    return p;
}

/* Pair i's angle per position: base^(-2i/n_rot) times freq_scale, mixed back towards the
 * unscaled value by YaRN's ramp (1 below lo, 0 above hi) times ext_factor. */
static inline ROPE_HD double rope_pair_inv(const struct rope_pairs *p, int i) {
    const double e = pow(p->base, -2.0 * i / (double)p->n_rot);
    if (p->ext_factor == 0.0) return e * p->freq_scale;
    const double d = p->hi - p->lo > 0.001 ? p->hi - p->lo : 0.001;
    double y = (i - p->lo) / d;
    y = y < 0.0 ? 0.0 : y > 1.0 ? 1.0 : y;
    const double mix = (1.0 - y) * p->ext_factor;
    return e * p->freq_scale * (1.0 - mix) + e * mix;
}

/* Whether a and b give the same angles (field by field: the struct has padding). */
static inline int rope_pairs_equal(const struct rope_pairs *a, const struct rope_pairs *b) {
    return a->n_rot == b->n_rot && a->base == b->base && a->freq_scale == b->freq_scale &&
           a->ext_factor == b->ext_factor && a->lo == b->lo && a->hi == b->hi &&
           a->mscale == b->mscale;
}

#endif /* ROPE_H */
