/*
 * bench_report.h — what `tpinfer bench` measured and how it is written out:
 * one struct per test (a row of llama-bench's table), the model's description
 * as llama-bench prints it ("qwen3 8B Q4_K - Medium"), the sample statistics,
 * and the four printers (markdown, csv, json, jsonl) that write llama-bench's
 * field names plus ours (tp, pp, comm, comm counters, weight-read bandwidth).
 *
 * Pure formatting: no MPI, no model; the test links it directly.
 */
#ifndef BENCH_REPORT_H
#define BENCH_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Most ranks whose bandwidth a result lists. */
#define BENCH_MAX_RANKS 256

enum bench_format { BENCH_MD = 0, BENCH_CSV, BENCH_JSON, BENCH_JSONL };

/* Communicator counters of one repetition, the busiest rank's (max over ranks). */
struct bench_comm_counts {
    uint64_t allreduce_calls, allreduce_bytes;
    uint64_t allgather_calls, allgather_bytes;
    uint64_t sendrecv_calls, sendrecv_bytes; /* send + recv */
    uint64_t bcast_calls, bcast_bytes;
};

/* One test: a (model, config, pp/tg/depth) combination and its samples. */
struct bench_result {
    const char *build_commit;
    long build_number;          /* commits up to the build's (llama.cpp's build number) */
    const char *cpu_info, *gpu_info;
    const char *backend;        /* ops name: "cpu" / "cuda" */
    const char *model_filename;
    const char *model_type;     /* "qwen3 8B Q4_K - Medium" */
    uint64_t model_size;        /* bytes of every tensor in the file */
    uint64_t model_n_params;
    int n_batch, n_ubatch, n_threads;
    int tp, pp;
    const char *comm;           /* "mpi" / "nccl" */
    int n_prompt, n_gen, n_depth;
    char test_time[32];         /* ISO 8601, UTC */
    int n_samples;
    const uint64_t *samples_ns; /* (n_samples) wall time of each repetition */
    struct bench_comm_counts comm_per_rep;
    /* Read bandwidth of generation (tg tests only: n_prompt == 0, n_gen > 0). */
    bool has_gbps;
    int n_ranks;
    double gbps_rank[BENCH_MAX_RANKS]; /* bytes of rank r's weights per token / s per token, GB/s */
    double gbps_sum;                   /* summed over ranks */
    double weight_bytes_per_token;     /* summed over ranks */
    double kv_bytes_per_token; /* KV cache read per token, averaged over the test, all ranks */
    double read_gbps;          /* (weight + KV bytes) per token / s per token: the GB/s column
                                  and the roofline fraction */
    double roofline_gbps;              /* per GPU, 0: not given */
    int roofline_devices;              /* GPUs working at once on one token: tp */
};

/* Mean and sample standard deviation (n - 1; 0 when n < 2) of x[0..n). */
void bench_mean_sd(const double *x, int n, double *mean, double *sd);

/* Tokens per second of each sample: (n_prompt + n_gen) / seconds, as llama-bench
 * (depth tokens are setup, not counted). ts has n_samples entries. */
void bench_samples_ts(const struct bench_result *r, double *ts);

/* llama.cpp's name of general.file_type ("Q4_K - Medium" for 15, "all F32" for 0),
 * "?" when unknown. Never NULL. */
const char *bench_ftype_name(int64_t ftype);

/* Size class of a model ("8B", "0.6B") as llama.cpp names it, from its layer count,
 * width and heads (so Qwen2.5-0.5B, 896 wide, is "1B" there too); "?B" when unknown. */
const char *bench_size_class(const char *arch, int n_layer, int n_embd, int n_head);

/* "ARCH CLASS FTYPE" into buf (llama-bench's model_type); ftype < 0: unknown. */
void bench_model_type(char *buf, size_t n, const char *arch, int n_layer, int n_embd, int n_head,
                      int64_t ftype);

/* "pp512", "tg128", "pp512+tg128", with " @ d8192" when n_depth > 0. */
void bench_test_name(char *buf, size_t n, int n_prompt, int n_gen, int n_depth);

/* Markdown columns shown only when they say something, as llama-bench shows them: threads
 * on a CPU backend or when set, n_batch and n_ubatch when set or swept. */
enum { BENCH_MD_THREADS = 1, BENCH_MD_BATCH = 2, BENCH_MD_UBATCH = 4 };

/* Printers: header once, one call per result (flushed), footer once; md_cols (BENCH_MD_*)
 * the same for the header and every result. */
void bench_print_header(FILE *f, enum bench_format fmt, bool roofline, unsigned md_cols);
void bench_print_result(FILE *f, enum bench_format fmt, const struct bench_result *r, bool first,
                        unsigned md_cols);
void bench_print_footer(FILE *f, enum bench_format fmt, const char *build_commit,
                        long build_number);

#endif /* BENCH_REPORT_H */
