/*
 * model.h — the Qwen2/Qwen3 dense transformer of one rank: its configuration
 * (read from GGUF metadata), its shard plan (which heads, FFN columns, vocab
 * rows and layers this rank owns under tp x pp), its sharded weights in backend
 * memory, its KV cache, and the forward pass that shows the parallelism.
 *
 * The structs follow llama2.c: model_config (hyperparameters), model_plan (the
 * shard), model_weights (pointers with shape comments that include the shard),
 * model_state (activation buffers, allocated once for a micro-batch of
 * n_ubatch tokens). Shapes are written (rows, cols) row-major; for a weight
 * the pair is (ne1 = output features, ne0 = input features).
 *
 * A model may be built without a grid (NULL): a single rank, no communicators.
 * Tests use that to build the unsharded reference in-process under mpirun.
 */
#ifndef MODEL_H
#define MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "tpi.h"

struct gguf_file;
struct sampler_params;

enum model_arch { MODEL_ARCH_QWEN2 = 0, MODEL_ARCH_QWEN3 = 1 };

/* Rope scaling, llama.cpp's kinds (ops.h struct ops_rope has the arithmetic). */
enum model_rope_scaling { MODEL_ROPE_NONE = 0, MODEL_ROPE_LINEAR = 1, MODEL_ROPE_YARN = 2 };

/* Most pipeline stages a plan describes (a stage holds at least one layer). */
#define MODEL_MAX_STAGES 256

/* Largest head size the backends compute (the CPU rope rotates at most 512 pairs). */
#define MODEL_MAX_HEAD_DIM 1024

/* Widest step forward.c records as a graph (its shape key keeps a bit per token pair). */
#define MODEL_GRAPH_MAX_TOKENS 32

struct model_config {
    enum model_arch arch;
    char arch_name[16]; /* "qwen2" / "qwen3": the metadata key prefix */
    int n_layer;        /* <arch>.block_count */
    int n_embd;         /* <arch>.embedding_length */
    int n_ff;           /* <arch>.feed_forward_length */
    int n_head;         /* <arch>.attention.head_count */
    int n_head_kv;      /* <arch>.attention.head_count_kv */
    int head_dim;       /* <arch>.attention.key_length (default n_embd / n_head) */
    int head_dim_v;     /* <arch>.attention.value_length (default head_dim) */
    int n_rot;          /* <arch>.rope.dimension_count (default head_dim) */
    float rope_base;    /* <arch>.rope.freq_base (default 10000) */
    /* rope scaling: <arch>.rope.scaling.* or the run's options (model_params) */
    enum model_rope_scaling rope_scaling; /* .type (linear when absent: a no-op at factor 1) */
    float rope_freq_scale;  /* 1 / .factor (1: none) */
    int rope_n_ctx_orig;    /* YaRN: .original_context_length (default context_length) */
    float rope_attn_factor; /* .attn_factor (1) */
    float rms_eps;      /* <arch>.attention.layer_norm_rms_epsilon */
    int n_ctx_train;    /* <arch>.context_length */
    int n_vocab;        /* ne1 of token_embd.weight */
    bool has_qkv_bias;  /* qwen2: attn_{q,k,v}.bias */
    bool has_qk_norm;   /* qwen3: attn_{q,k}_norm per head */
    bool tied_output;   /* no output.weight: lm_head is token_embd */
};

/* What one rank owns. Ranges are [first, first + n). */
struct model_plan {
    int tp, pp, tp_rank, pp_stage;
    int stage_layer0[MODEL_MAX_STAGES + 1]; /* stage s owns layers [l0[s], l0[s+1]) */
    int layer0, n_layer_stage;              /* this stage's layers */
    bool is_first, is_last;                 /* stage 0 embeds; the last stage has lm_head */
    int head0, n_head_local;                /* query heads (n_head / tp each) */
    int kv_head0, n_kv_local;               /* KV heads (split, or 1 replicated) */
    bool kv_replicated;                     /* tp > n_head_kv: ranks share a KV head */
    int ff0, n_ff_local;                    /* FFN columns (n_ff / tp each) */
    int vocab0, n_vocab_local;              /* lm_head rows (uneven when tp ∤ n_vocab) */
    int n_vocab_pad;                        /* max n_vocab_local over the TP group */
};

/* One layer's shard, backend memory. q_dim = n_head * head_dim. */
struct model_layer {
    float *attn_norm;         /* (n_embd) replicated */
    struct tpi_weight wq;     /* (q_dim/tp, n_embd) column-parallel by heads */
    struct tpi_weight wk;     /* (n_kv_local * head_dim, n_embd) */
    struct tpi_weight wv;     /* (n_kv_local * head_dim, n_embd) */
    float *bq, *bk, *bv;      /* qwen2: (q_dim/tp), (n_kv_local*head_dim) x 2; else NULL */
    float *q_norm, *k_norm;   /* qwen3: (head_dim) replicated; else NULL */
    struct tpi_weight wo;     /* (n_embd, q_dim/tp) row-parallel; F32 when not block-aligned */
    float *ffn_norm;          /* (n_embd) replicated */
    struct tpi_weight w_gate; /* (n_ff/tp, n_embd) column-parallel */
    struct tpi_weight w_up;   /* (n_ff/tp, n_embd) column-parallel */
    struct tpi_weight w_down; /* (n_embd, n_ff/tp) row-parallel */
};

struct model_weights {
    struct tpi_weight token_embd; /* (n_vocab, n_embd) replicated, stage 0 only */
    struct model_layer *layers;   /* (n_layer_stage) */
    float *output_norm;           /* (n_embd) last stage only */
    struct tpi_weight output;     /* (n_vocab_local, n_embd) vocab-parallel, last stage only */
    bool output_is_embd;          /* output shares token_embd's memory (tied, tp = pp = 1) */
    size_t n_bytes;               /* everything this rank uploaded, in the file's types */
    size_t n_bytes_gpu;           /* the same as the CUDA backend holds it (Q3_K as Q6_K, ...) */
    size_t n_bytes_replicated;    /* of which: norms, token_embd (copies every rank holds) */
    int n_expanded_f32;           /* row-parallel slices expanded to F32 (off block edges) */
};

/* Activations of one micro-batch (n_ubatch tokens), backend memory unless noted. */
struct model_state {
    int n_ubatch;          /* tokens per micro-batch the buffers hold */
    float *x;              /* (n_ubatch, n_embd) residual stream */
    float *h;              /* (n_ubatch, n_embd) normed input of a block */
    float *q;              /* (n_ubatch, n_head_local * head_dim) */
    float *k, *v;          /* (n_ubatch, n_kv_local * head_dim) */
    float *att;            /* (n_ubatch, n_head_local * head_dim) attention output */
    float *o;              /* (n_ubatch, n_embd) partial sums before the all-reduce */
    float *g, *u;          /* (n_ubatch, n_ff_local) */
    int32_t *tok;          /* (n_ubatch) token ids */
    int32_t *pos, *seq;    /* (n_ubatch) */
    float *xo;             /* (n_ubatch, n_embd) rows whose logits are wanted */
    float *logits_local;   /* (n_ubatch, n_vocab_pad) this rank's vocab slice */
    float *logits_gather;  /* (tp, n_ubatch, n_vocab_pad) after the all-gather */
    float *logits_host;    /* host: (tp, n_ubatch, n_vocab_pad) staging */
    int32_t *rows_host;    /* host: (n_ubatch) micro-batch rows whose logits are wanted */
};

/* Logits kept on the backend by model_forward_keep, so the host copies out only what
 * it needs: each row's best candidates, and whole rows on request. Last-stage ranks hold
 * the rows; the candidates' host arrays are the decider's. */
struct model_keep {
    int cap;            /* rows it holds (0: not set up, model_keep_init) */
    int k;              /* candidates a row: min(OPS_TOP_MAX, n_vocab) */
    int n_rows;         /* rows of the last model_forward_keep */
    float *rows;        /* backend: rank r's vocabulary slice of row i at rows + r * cap *
                           n_vocab_pad + i * (that slice's width) */
    void *top_dev;      /* backend: ids (tp, cap, k), vals (tp, cap, k), bad (tp, cap) */
    void *top_host;     /* host: the same, copied out */
    int32_t *ids;       /* host: (cap, k) each row's best ids over the whole vocabulary */
    float *vals;        /* host: (cap, k) their logits, best first (ops->row_top's order) */
    bool *bad;          /* host: (cap) the row holds a NaN or an infinity */
    int *slice_k;       /* host: (tp) candidates of each rank's slice, merge_at the merge's */
    int *merge_at;
};

/* A run's rope scaling options, llama.cpp's; each unset one keeps the file's setting. */
struct model_rope_opts {
    const char *scaling; /* "none", "linear", "yarn", or NULL (--rope-scaling) */
    float scale;         /* scaling factor, or 0 (--rope-scale) */
    int orig_ctx;        /* YaRN's original context, or 0 (--yarn-orig-ctx) */
};

/* How to load. Zero-initialise, then set what differs from the defaults. */
struct model_params {
    const char *path;       /* GGUF file (first part of a split model) */
    const char *backend;    /* "cpu", "cuda", "auto" (NULL: cpu) */
    int n_threads;          /* CPU threads (0: all cores) */
    enum comm_kind comm;    /* communicator for tp/pp > 1 */
    double comm_timeout_s;  /* 0: 60 s */
    int n_ctx;              /* KV positions per sequence (0: min(4096, context_length)) */
    struct model_rope_opts rope; /* the run's rope scaling options (none set: the file's) */
    int n_slot;             /* sequences in the KV cache (0: 1) */
    int n_ubatch;           /* micro-batch capacity (0: 512) */
    const int *pp_layers;   /* layers per stage (n_pp_layers == pp), or NULL: balanced */
    int n_pp_layers;
    uint64_t seed;          /* part of the run identity ranks must share */
    bool quiet;             /* no load summary on stderr */
    bool cuda_device_set;   /* use cuda_device, not the node-local rank's GPU */
    int cuda_device;
};

struct model {
    struct model_config cfg;
    struct model_plan plan;
    struct model_weights w;
    struct model_state s;
    struct model_keep keep;     /* logits kept on the backend (model_keep_init) */
    struct ops_kv kv;           /* (n_layer_stage, n_slot, n_ctx, n_kv_local, head_dim) */
    const struct ops *ops;
    struct ops_ctx *octx;       /* owned */
    const struct tpi_grid *grid;/* NULL: single rank, no comms */
    struct comm *tp_comm;       /* NULL when tp == 1 */
    struct comm *pp_comm;       /* NULL when pp == 1 */
    struct tpi_watchdog *watchdog; /* stops the rank when a device wait outlasts
                                      TPI_COMM_OP_TIMEOUT (NCCL comms only), or NULL */
    struct gguf_file *gguf;     /* owned; the weights were copied out of its mapping */
    int n_ctx, n_slot;
    double t_forward_s;         /* time spent in model_forward */
    /* Decode steps as CUDA graphs (forward.c): on when the backend has graphs and
     * TPI_NO_GRAPH is unset or 0; callers may turn it off (or on again) between calls. */
    bool use_graphs;
    /* the widest step recorded as a graph (TPI_GRAPH_TOKENS, 1..32, default 32); callers
     * may change it between calls */
    int graph_max_tokens;
    bool logits_keep;       /* callers may keep logits on the backend (TPI_LOGITS_KEEP=0: no) */
    bool tp_skip_allreduce; /* TPI_TP_SKIP_ALLREDUCE=1: timing only, logits wrong */
    bool diag_skip_ffn;     /* TPI_DIAG_SKIP_FFN=1: decode steps without their FFN sub-layers
                             * (timing only, logits wrong) */
    struct model_graphs *graphs;  /* recorded steps (forward.c), owned */
    int64_t n_graph_launches;     /* steps run as one graph launch */
    int64_t n_graph_records;      /* graphs recorded (first use of a step shape, or stale) */
};

/* ---- config.c ---- */

/* Read the hyperparameters of a qwen2/qwen3 GGUF into *cfg and check every tensor
 * the forward pass uses for presence, shape and type. Errors name the file and the
 * first key or tensor that is off; rope scaling other than none, linear or yarn, and other
 * archs, are UNSUPPORTED. */
int model_config_from_gguf(struct model_config *cfg, const struct gguf_file *f,
                           struct tpi_error *err);

/* One-line summary ("qwen3: 4 layers, n_embd 512, 8/4 heads x 64, n_ff 1024, vocab 2048"). */
void model_config_describe(const struct model_config *cfg, char *buf, size_t n);

/* The rope struct ops_rope that cfg's settings give (plain rope without scaling). */
struct ops_rope model_rope(const struct model_config *cfg);

/* Whether cfg's rope is scaled (YaRN, or linear by a factor other than 1). */
bool model_rope_scaled(const struct model_config *cfg);

/* enum model_rope_scaling of "none", "linear" or "yarn" (n bytes), or -1. */
int model_rope_scaling_from_name(const char *s, size_t n);

/* "none", "linear" or "yarn". */
const char *model_rope_scaling_name(enum model_rope_scaling s);

/* Apply a run's rope options (unset ones keep the file's) to cfg, as llama.cpp's
 * --rope-scaling, --rope-scale and --yarn-orig-ctx do. */
void model_config_rope_override(struct model_config *cfg, const struct model_rope_opts *o);

/* ---- plan.c ---- */

/* The shard of rank (tp_rank, pp_stage) under tp x pp. pp_layers (n_pp_layers == pp
 * counts summing to n_layer) overrides the balanced split. Errors: heads not
 * divisible by tp (suggests --pp), KV heads neither split nor replicable, n_ff not
 * divisible by tp, tp > n_vocab, pp > n_layer, bad pp_layers. */
int model_plan_make(struct model_plan *plan, const struct model_config *cfg, int tp, int pp,
                    int tp_rank, int pp_stage, const int *pp_layers, int n_pp_layers,
                    struct tpi_error *err);

/* Vocab range of TP rank r: rows [v0, v0 + n) of lm_head (balanced, uneven allowed). */
void model_vocab_range(int n_vocab, int tp, int r, int *v0, int *n);

/* ---- weights.c / model.c ---- */

/* Open the file, check the run identity across ranks, build config, plan, weights,
 * KV cache, activations and communicators for this rank of `grid` (NULL: one rank).
 * Every step ends in grid_agree, so a failure on any rank fails every rank with the
 * failing rank's message. *out is owned by the caller: free with model_free. */
int model_load(struct model **out, const struct model_params *p, const struct tpi_grid *grid,
               struct tpi_error *err);

/* The CPU threads a rank of `grid` (NULL: one rank) runs with for -t n_threads: n_threads
 * when > 0, else its share of the node's cores (the cores / the ranks on the node). */
int model_cpu_threads(int n_threads, const struct tpi_grid *grid);

/* The sampling the model's authors recommend, from the GGUF keys general.sampling.temp,
 * .top_k, .top_p, .min_p, .penalty_repeat and .penalty_last_n (llama.cpp reads these
 * keys as its defaults; vLLM reads the same settings from generation_config.json, less
 * the window: openai), into p for the fields not in `keep` (enum sampler_field bits).
 * A value out of the range the matching option takes is skipped (with a warning: warn).
 * Returns the bits of the fields it set. */
unsigned model_sampling_defaults(const struct gguf_file *f, struct sampler_params *p,
                                 unsigned keep, bool openai, bool warn);

/* Free everything; sets *m to NULL. Accepts NULL. */
void model_free(struct model **m);

/* Upload this rank's slices of every tensor (called by model_load). */
int model_weights_load(struct model *m, struct tpi_error *err);
void model_weights_free(struct model *m);

/* Count, without loading anything, the bytes rank `plan` would hold of file f:
 * out->n_bytes, n_bytes_replicated and n_expanded_f32 are set (pointers left NULL).
 * The same code path as loading, so `tpinfer info --tp/--pp` cannot disagree with it. */
int model_weights_count(const struct gguf_file *f, const struct model_config *cfg,
                        const struct model_plan *plan, struct model_weights *out,
                        struct tpi_error *err);

/* ---- forward.c ---- */

/* Run n_tokens tokens (token t at position pos[t] of KV slot seq[t]; host arrays, the
 * same on every rank) through this rank's layers, in micro-batches that overlap across
 * pipeline stages. On last-stage ranks, logits (host, n_out x n_vocab) receive the full
 * vocabulary logits of batch rows out_idx[0..n_out) (ascending); elsewhere logits is
 * not touched (may be NULL). Collective over the grid. Errors: positions outside the
 * cache, comm failures (naming the rank), backend failures. */
int model_forward(struct model *m, const int32_t *tokens, const int32_t *pos,
                  const int32_t *seq, int n_tokens, const int32_t *out_idx, int n_out,
                  float *logits, struct tpi_error *err);

/* Set up m->keep for model_forward_keep steps of up to n_rows output rows (a no-op on
 * ranks without logits; model_free frees it). Errors: out of memory. */
int model_keep_init(struct model *m, int n_rows, struct tpi_error *err);

/* model_forward with the logits left on the backend (n_out <= m->keep.cap): on the
 * decider, m->keep.ids/vals/bad receive each output row's best m->keep.k candidates
 * over the whole vocabulary, and model_keep_fetch copies whole rows out until the next
 * forward. Collective over the grid, as model_forward. */
int model_forward_keep(struct model *m, const int32_t *tokens, const int32_t *pos,
                       const int32_t *seq, int n_tokens, const int32_t *out_idx, int n_out,
                       struct tpi_error *err);

/* On the decider, copy the whole logits of output rows rows[0..n) (ascending) of the
 * last model_forward_keep to logits + rows[i] * n_vocab (host). Errors: a row out of
 * range, backend failures. */
int model_keep_fetch(struct model *m, const int *rows, int n, float *logits,
                     struct tpi_error *err);

/* Copy the KV cache of positions [0, n_pos) of slot src_slot into slot dst_slot
 * (this rank's layers and heads; stream-ordered before the next forward). Every rank
 * of the grid must make the same call: it is how a sequence takes over a prompt
 * prefix another one has already run. Errors: slots or n_pos out of range (alike on
 * every rank); a backend failure of the copy is reported by the next forward. */
int model_kv_copy(struct model *m, int src_slot, int dst_slot, int n_pos, struct tpi_error *err);

/* Free the recorded decode-step graphs (model_free calls it; safe to call any time:
 * later steps record again). */
void model_graphs_free(struct model *m);

/* World rank that holds logits and decides sampling: (tp_rank 0, last stage); 0
 * without a grid. */
int model_decider_rank(const struct model *m);

/* True when this rank gets logits from model_forward. */
bool model_has_logits(const struct model *m);

/* Host memory for n_rows rows of logits (model_forward's `logits`), from the backend's
 * host_alloc (pinned on CUDA: the copy out of the device is one DMA) or malloc; NULL
 * when out of memory. Free with model_logits_free before model_free. */
float *model_logits_alloc(const struct model *m, size_t n_rows);
/* Free memory from model_logits_alloc (NULL is fine). */
void model_logits_free(const struct model *m, float *logits);

/* Broadcast n int32 from world rank `root` to every rank (host memory; no-op
 * without a grid or with one rank). */
int model_bcast_i32(const struct model *m, int32_t *buf, int n, int root, struct tpi_error *err);
/* Same for floats. */
int model_bcast_f32(const struct model *m, float *buf, int n, int root, struct tpi_error *err);

/* Same for raw bytes (doubles, structs). */
int model_bcast_bytes(const struct model *m, void *buf, int n_bytes, int root,
                      struct tpi_error *err);

/* Agree on a status over the grid (grid_agree; returns status without a grid). */
int model_agree(const struct model *m, int status, struct tpi_error *err);

#endif /* MODEL_H */
