#define _POSIX_C_SOURCE 200809L
/*
 * test_parallel.c — tensor and pipeline parallelism against the single-rank model.
 *
 * Under mpirun -np N:  test_parallel TPxPP[,TPxPP...] [MODEL...]
 *   For each (tp, pp) with tp*pp == N and each tiny model: load the sharded model on
 *   the grid and, on every rank, the unsharded model in-process (no grid); run the
 *   same tokens through both and compare the logits on the last-stage ranks; generate
 *   greedily with both and compare the tokens on every rank; count the all-reduces of
 *   a decode step (exactly 2 per layer of the stage when tp > 1); at tp = 2, pp = 1
 *   check each rank's weight bytes against the tensor table. Configurations that must
 *   fail (tp = 3 on 8 heads, pp > layers) are checked to fail on every rank with a
 *   clear message.
 *   Models that are not readable are skipped one by one (a clone without ../shared has
 *   six of the ten in tests/data); the run skips only when none of them is.
 * Without mpirun:      test_parallel cli MPIRUN
 *   Runs the tpinfer binary under `timeout 60 mpirun` for the failure modes that
 *   need separate processes: ranks given different model files, a missing file on
 *   one rank, plus an end-to-end greedy run at tp = 2 and pp = 2 against np = 1.
 *
 * With TPI_TEST_BACKEND=cuda (and TPI_TEST_COMM=nccl) the same checks run on the GPUs,
 * one per rank (skipped when the node has fewer GPUs than ranks).
 *
 * Logit tolerance: both sides compute in f32 with the same kernels; a row-parallel
 * matmul sums partial products per rank and then all-reduces them, so only the order
 * of additions differs: relative error ~1e-6 per layer, amplified through the layers
 * and the large lm_head of the tied qwen2 models to ~1e-4 of the logit scale. The
 * bound is atol 2e-3 + rtol 1e-3 on logits of magnitude 1..20 (measured max printed).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf.h"
#include "kernels/quant.h"
#include "model/generate.h"
#include "model/model.h"
#include "parallel/grid.h"
#include "testutil.h"

#define ATOL 2e-3
#define RTOL 1e-3
/* The CUDA backend (TPI_TEST_BACKEND=cuda) rounds activations to int8 (quantized GEMVs)
 * or bf16 (GEMMs): a different order of additions on the sharded side flips a rounding
 * now and then, which moves logits by the int8 error itself. So there each row's max
 * abs difference is bounded by this fraction of the reference row's logit range, the
 * bound test_model_gpu puts on CUDA against the CPU. */
#define REL_TOL_CUDA 0.02

static int g_argc;
static char **g_argv;
static int g_rank, g_size;
static int g_bad; /* failures on this rank; agreed at the end so no rank hangs */

#define CHECK(cond, ...) TU_CHECK_RANK(g_bad, g_rank, cond, __VA_ARGS__)

static const char *all_models[] = {"qwen2-tiny-f16",    "qwen2-tiny-q4_0",   "qwen2-tiny-q5_k_m",
                                   "qwen3-tiny-bf16",   "qwen3-tiny-q4_k_m", "qwen3-tiny-q6_k",
                                   "qwen3-tiny-q8_0",   "qwen3-tiny-q2_k",   "qwen2-tiny-q3_k_m",
                                   "qwen2-tiny-iq4_xs"};

/* TPI_TEST_BACKEND=cuda and TPI_TEST_COMM=nccl run the same checks on GPUs (one per
 * rank; the unsharded reference runs on the rank's own GPU). */
static const char *g_backend = "cpu";
static enum comm_kind g_comm = COMM_MPI;
static int g_device; /* the rank's GPU: node-local rank % GPUs */

static struct model *load(const char *path, const struct tpi_grid *g, struct tpi_error *err) {
    struct model_params p = {.path = path, .backend = g_backend, .n_threads = 1, .n_ctx = 256,
                             .n_ubatch = 16, .comm = g_comm, .comm_timeout_s = 30, .quiet = true};
    if (!g && strcmp(g_backend, "cuda") == 0) {
        p.cuda_device_set = true;
        p.cuda_device = g_device;
    }
    struct model *m = NULL;
    if (model_load(&m, &p, g, err)) return NULL;
    return m;
}

/* Expected weight bytes of rank (tp_rank of tp, one stage) from the tensor table. */
/* Bytes of a tensor of `type` taking `n` bytes in the file, as the CUDA backend holds it:
 * the file's bytes, or under TPI_HOLD=1 Q3_K's 110-byte blocks of 256 values as Q6_K's
 * 210, IQ4_XS's 136 as eight Q8_0 blocks of 34, IQ4_NL's 18 as one (ggml's block sizes;
 * gpu = false: the file's bytes). */
static size_t held(int type, size_t n, bool gpu) {
    if (quant_gpu_held_type(type) == type) return n;
    if (gpu && type == TPI_TYPE_Q3_K) return n / 110 * 210;
    if (gpu && type == TPI_TYPE_IQ4_XS) return n / 136 * 272;
    if (gpu && type == TPI_TYPE_IQ4_NL) return n / 18 * 34;
    return n;
}

static size_t expected_bytes(const struct model *m, size_t *replicated, bool gpu) {
    const struct model_plan *p = &m->plan;
    size_t n = 0, rep = 0;
    for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        const char *nm = t->name;
        bool vec = t->ne[1] == 1;
        const size_t tb = held(t->type, t->n_bytes, gpu);
        if (!strcmp(nm, "token_embd.weight")) {
            rep += tb; // replicated on stage 0
            if (m->cfg.tied_output) n += tb / p->tp; // lm_head slice
        } else if (strstr(nm, "_norm.weight")) {
            rep += sizeof(float) * t->ne[0];
        } else if (vec) { // biases: f32 slices
            n += sizeof(float) * t->ne[0] / p->tp;
        } else {
            n += tb / p->tp;
        }
    }
    *replicated = rep;
    return n + rep;
}

/* The readable path of tiny model `name` (../shared/data, else tests/data), or NULL: a
 * clone without ../shared has only some of them. */
static const char *model_path(const char *name) {
    char file[128];
    snprintf(file, sizeof file, "%s.gguf", name);
    return tu_data_path(file);
}

static void check_config(const char *name, const char *path, int tp, int pp) {
    struct tpi_error err = {0};
    struct tpi_grid g;
    int rc = grid_init(&g, tp, pp, &err);
    CHECK(rc == TPI_OK, "grid_init: %s", err.msg);
    if (rc) return;
    struct model *m = load(path, &g, &err);
    struct model *ref = load(path, NULL, &err);
    const int n_layer = ref ? ref->cfg.n_layer : 0;
    const bool expect_fail = n_layer > 0 && (pp > n_layer || ref->cfg.n_head % tp != 0);
    if (expect_fail) {
        // Every rank must get the error, with the reason in it.
        CHECK(m == NULL, "%s tp=%d pp=%d: expected a load error", name, tp, pp);
        CHECK(strstr(err.msg, "--pp") != NULL, "%s: unclear error: %s", name, err.msg);
        if (g_rank == 0) fprintf(stderr, "%s tp=%d pp=%d: expected error: %s\n", name, tp, pp, err.msg);
        model_free(&m);
        model_free(&ref);
        grid_free(&g);
        return;
    }
    CHECK(m && ref, "%s tp=%d pp=%d: load failed: %s", name, tp, pp, err.msg);
    if (!m || !ref) {
        model_free(&m);
        model_free(&ref);
        grid_free(&g);
        return;
    }
    const int n_vocab = ref->cfg.n_vocab;

    // ---- logits of a 37-token prompt (3 micro-batches of 16 at pp = 1) ----
    enum { N = 37 };
    int32_t tok[N], pos[N], seq[N], rows[N];
    struct tu_rng rng;
    tu_rng_seed(&rng, 1234);
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)(tu_uniform(&rng, 0, 1) * (n_vocab - 3));
        pos[i] = rows[i] = i;
        seq[i] = 0;
    }
    float *got = malloc(sizeof(float) * N * n_vocab), *want = malloc(sizeof(float) * N * n_vocab);
    rc = model_forward(ref, tok, pos, seq, N, rows, N, want, &err);
    CHECK(rc == TPI_OK, "reference forward: %s", err.msg);
    rc = model_forward(m, tok, pos, seq, N, rows, N, got, &err);
    CHECK(rc == TPI_OK, "sharded forward: %s", err.msg);
    if (model_has_logits(m)) {
        char label[128];
        snprintf(label, sizeof label, "[rank %d] %s tp=%d pp=%d logits", g_rank, name, tp, pp);
        if (strcmp(g_backend, "cuda") == 0) {
            double worst = 0;
            for (int i = 0; i < N; i++) {
                const float *g = got + (size_t)i * n_vocab, *w = want + (size_t)i * n_vocab;
                float lo = w[0], hi = w[0], d = 0;
                for (int v = 0; v < n_vocab; v++) {
                    lo = fminf(lo, w[v]);
                    hi = fmaxf(hi, w[v]);
                    d = fmaxf(d, fabsf(g[v] - w[v]));
                }
                worst = fmax(worst, d / fmax(hi - lo, 1e-6));
            }
            fprintf(stderr, "%s: max abs diff / logit range %.4g (bound %g)\n", label, worst,
                    REL_TOL_CUDA);
            CHECK(worst <= REL_TOL_CUDA, "%s tp=%d pp=%d: logits off by %.4g of the range", name,
                  tp, pp, worst);
        } else {
            size_t bad = tu_compare(label, got, want, (size_t)N * n_vocab, ATOL, RTOL);
            CHECK(bad == 0, "%s tp=%d pp=%d: %zu logits off", name, tp, pp, bad);
        }
    }

    // ---- all-reduces of one decode step: exactly 2 per layer of this stage ----
    if (m->tp_comm) {
        uint64_t before = m->tp_comm->stats.calls[COMM_OP_ALLREDUCE];
        int32_t t1 = 5, p1 = N, s1 = 0, r1 = 0;
        rc = model_forward(m, &t1, &p1, &s1, 1, &r1, 1, got, &err);
        CHECK(rc == TPI_OK, "decode: %s", err.msg);
        uint64_t n_ar = m->tp_comm->stats.calls[COMM_OP_ALLREDUCE] - before;
        CHECK(n_ar == 2u * (uint64_t)m->plan.n_layer_stage,
              "%s tp=%d: %llu all-reduces for %d layers", name, tp, (unsigned long long)n_ar,
              m->plan.n_layer_stage);
    }

    // ---- per-rank weight bytes ----
    if (tp == 2 && pp == 1) {
        size_t rep, rep_gpu, want_bytes = expected_bytes(m, &rep, false);
        const size_t want_gpu = expected_bytes(m, &rep_gpu, true);
        size_t total = 0;
        for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++)
            total += gguf_tensor_at(m->gguf, i)->n_bytes;
        if (g_rank == 0)
            fprintf(stderr, "%s tp=2: rank weights %zu bytes, total %zu, total/tp %zu, replicated %zu\n",
                    name, m->w.n_bytes, total, total / 2, rep);
        CHECK(m->w.n_bytes == want_bytes, "%s: rank %d holds %zu weight bytes, expected %zu", name,
              g_rank, m->w.n_bytes, want_bytes);
        CHECK(m->w.n_bytes_replicated == rep, "%s: replicated %zu, expected %zu", name,
              m->w.n_bytes_replicated, rep);
        /* as the CUDA backend holds them (Q3_K as Q6_K, IQ4 as Q8_0): what its memory check
         * and the rank table count */
        CHECK(m->w.n_bytes_gpu == want_gpu, "%s: rank %d holds %zu bytes on a GPU, expected %zu",
              name, g_rank, m->w.n_bytes_gpu, want_gpu);
    }

    // ---- greedy generation: token-identical up to the first step where the reference's
    // top-2 logit margin is under 0.1 (there the two sides may pick either) ----
    struct gen_params gp = {.n_predict = 12, .n_logprobs = 2};
    sampler_params_default(&gp.sp);
    gp.sp.temp = 0;
    struct gen_result a, b;
    int rc_a = generate_one(ref, NULL, tok, 9, &gp, NULL, NULL, &a, &err);
    int rc_b = generate_one(m, NULL, tok, 9, &gp, NULL, NULL, &b, &err);
    CHECK(rc_a == TPI_OK && rc_b == TPI_OK, "generate: %s", err.msg);
    if (!rc_a && !rc_b) {
        bool tie = false;
        for (int i = 0; i < a.n_tokens && i < b.n_tokens; i++) {
            const float margin = a.lp_vals[2 * i] - a.lp_vals[2 * i + 1];
            if (a.tokens[i] != b.tokens[i] && margin < 0.1f) {
                if (g_rank == 0)
                    fprintf(stderr, "%s tp=%d pp=%d: greedy tokens agree up to step %d, where "
                            "the margin is %.4f\n", name, tp, pp, i, margin);
                tie = true;
                break;
            }
            CHECK(a.tokens[i] == b.tokens[i],
                  "%s tp=%d pp=%d: greedy token %d: got %d, want %d (margin %.4f)", name, tp, pp,
                  i, b.tokens[i], a.tokens[i], margin);
        }
        CHECK(tie || a.n_tokens == b.n_tokens, "greedy lengths %d vs %d", a.n_tokens, b.n_tokens);
    }
    if (!rc_a) gen_result_free(&a);
    if (!rc_b) gen_result_free(&b);
    free(got);
    free(want);
    model_free(&m);
    model_free(&ref);
    grid_free(&g);
}

/* The models a configuration run covers: argv[2..], or all ten tiny models. */
static const char **run_models(int *n) {
    if (g_argc > 2) {
        *n = g_argc - 2;
        return (const char **)(g_argv + 2);
    }
    *n = (int)(sizeof all_models / sizeof all_models[0]);
    return all_models;
}

/* How many of them are readable (../shared/data, else tests/data). */
static int n_models_present(void) {
    int n = 0, k = 0;
    const char **models = run_models(&n);
    for (int i = 0; i < n; i++)
        k += model_path(models[i]) != NULL;
    return k;
}

START_TEST(test_configs) {
    // argv[1] = "2x1,1x2"; argv[2..] = models (default: all).
    char list[256];
    snprintf(list, sizeof list, "%s", g_argv[1]);
    int n_models = 0;
    const char **models = run_models(&n_models);
    for (char *c = strtok(list, ","); c; c = strtok(NULL, ",")) {
        int tp = 0, pp = 0;
        if (sscanf(c, "%dx%d", &tp, &pp) != 2 || tp * pp != g_size) continue;
        for (int i = 0; i < n_models; i++) {
            const char *path = model_path(models[i]);
            if (!path) {
                if (g_rank == 0) fprintf(stderr, "%s tp=%d pp=%d: skipped: not found\n", models[i], tp, pp);
                continue;
            }
            double t0 = tpi_time_s();
            check_config(models[i], path, tp, pp);
            if (g_rank == 0)
                fprintf(stderr, "%s tp=%d pp=%d: done in %.2f s\n", models[i], tp, pp,
                        tpi_time_s() - t0);
        }
    }
    int bad_all = 0;
    MPI_Allreduce(&g_bad, &bad_all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    ck_assert_int_eq(bad_all, 0);
}
END_TEST

/* ---- the binary under mpirun ---- */

static const char *g_mpirun;

/* Run a shell command with a 60 s timeout; return its exit status (124: timed out),
 * stdout and stderr in the given buffers. */
static int run_cmd(const char *cmd, char *out, size_t n_out, char *errb, size_t n_err) {
    char full[4096];
    snprintf(full, sizeof full, "timeout 60 %s >/tmp/tpi_tp_out.%d 2>/tmp/tpi_tp_err.%d", cmd,
             (int)getpid(), (int)getpid());
    int st = system(full);
    char path[64];
    snprintf(path, sizeof path, "/tmp/tpi_tp_out.%d", (int)getpid());
    char *s = tu_read_file(path, NULL);
    snprintf(out, n_out, "%s", s ? s : "");
    free(s);
    remove(path);
    snprintf(path, sizeof path, "/tmp/tpi_tp_err.%d", (int)getpid());
    s = tu_read_file(path, NULL);
    snprintf(errb, n_err, "%s", s ? s : "");
    free(s);
    remove(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

START_TEST(test_cli_failures) {
    /* two different files that tests/data holds too, so a clone without ../shared runs this */
    const char *a = tu_data_path("qwen3-tiny-q4_k_m.gguf"), *b = tu_data_path("qwen2-tiny-q4_0.gguf");
    ck_assert(a && b);
    static char out[1 << 16], errb[1 << 16], cmd[4096];
    const char *mr = "--oversubscribe --allow-run-as-root --bind-to none";
    const char *bin = tu_binary();

    // Ranks given different model files: identity check, every rank stops.
    double t0 = tpi_time_s();
    snprintf(cmd, sizeof cmd,
             "%s %s -np 1 %s run -m %s --prompt-ids 1,2,3 -n 2 --tp 2 --seed 1 : -np 1 %s run -m %s "
             "--prompt-ids 1,2,3 -n 2 --tp 2 --seed 1",
             g_mpirun, mr, bin, a, bin, b);
    int st = run_cmd(cmd, out, sizeof out, errb, sizeof errb);
    fprintf(stderr, "different files: exit %d in %.1f s, stderr:\n%s\n", st, tpi_time_s() - t0, errb);
    ck_assert_int_ne(st, 0);
    ck_assert_int_ne(st, 124);
    ck_assert_ptr_nonnull(strstr(errb, "differ"));

    // A missing file on rank 1.
    t0 = tpi_time_s();
    snprintf(cmd, sizeof cmd,
             "%s %s -np 1 %s run -m %s --prompt-ids 1,2,3 -n 2 --tp 2 : -np 1 %s run -m "
             "/nonexistent/model.gguf --prompt-ids 1,2,3 -n 2 --tp 2",
             g_mpirun, mr, bin, a, bin);
    st = run_cmd(cmd, out, sizeof out, errb, sizeof errb);
    fprintf(stderr, "missing file: exit %d in %.1f s, stderr:\n%s\n", st, tpi_time_s() - t0, errb);
    ck_assert_int_ne(st, 0);
    ck_assert_int_ne(st, 124);
    ck_assert_ptr_nonnull(strstr(errb, "/nonexistent/model.gguf"));
    ck_assert_ptr_nonnull(strstr(errb, "rank 1"));

    // Ranks given different requests (each reads its own command line): every rank stops
    // with rank 0's error naming the option, where they computed garbage or waited for a
    // step that never came.
    tu_tmpdir_make("tpi_tp_same");
    const char *txt_a = tu_tmp_path("a.txt"), *txt_b = tu_tmp_path("b.txt");
    FILE *fa = fopen(txt_a, "w"), *fb = fopen(txt_b, "w");
    ck_assert(fa && fb);
    for (int i = 0; i < 20; i++) {
        fprintf(fa, "The quick brown fox jumps over the lazy dog. ");
        fprintf(fb, "A slow green turtle walks under the busy cat. ");
    }
    fclose(fa);
    fclose(fb);
    // Two models of one size and metadata, other weights (mkmodel's seed): the identity's
    // sample of the data tells them apart (they ran together and wrote garbage).
    char m1[512], m2[512];
    snprintf(m1, sizeof m1, "%s", tu_tmp_path("s1.gguf"));
    snprintf(m2, sizeof m2, "%s", tu_tmp_path("s2.gguf"));
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%s mkmodel -q -o %s --seed %d", bin, k ? m2 : m1, k + 1);
        ck_assert_int_eq(run_cmd(cmd, out, sizeof out, errb, sizeof errb), 0);
    }
    snprintf(cmd, sizeof cmd,
             "%s %s -np 1 %s run -m %s -p hi -n 2 --tp 2 : -np 1 %s run -m %s -p hi -n 2 --tp 2",
             g_mpirun, mr, bin, m1, bin, m2);
    st = run_cmd(cmd, out, sizeof out, errb, sizeof errb);
    fprintf(stderr, "other weights: exit %d, stderr:\n%s\n", st, errb);
    ck_assert_int_ne(st, 0);
    ck_assert_int_ne(st, 124);
    ck_assert_ptr_nonnull(strstr(errb, "model weights differ (data_hash"));
    static char ppl_a[512], ppl_b[512];
    snprintf(ppl_a, sizeof ppl_a, "perplexity -m %s -f %s -c 16 --tp 2", a, txt_a);
    snprintf(ppl_b, sizeof ppl_b, "perplexity -m %s -f %s -c 16 --tp 2", a, txt_b);
    const struct {
        const char *r0, *r1, *want;
    } diff[] = {
        {"run -m %s --prompt-ids 1,2,3 -n 2 --tp 2", "run -m %s --prompt-ids 1,2,3 -n 3 --tp 2",
         "rank 1's -n is 3, rank 0's is 2"},
        {"run -m %s --prompt-ids 1,2,3 -n 2 --tp 2", "run -m %s --prompt-ids 1,2,4 -n 2 --tp 2",
         "rank 1's prompt (its tokens"},
        {"run -m %s --prompt-ids 1,2,3 -n 2 --pp 2 --json --logprobs 2",
         "run -m %s --prompt-ids 1,2,3 -n 2 --pp 2 --json", "rank 1's --logprobs is 0, rank 0's is 2"},
        {"run -m %s -p hello -n 2 --tp 2 --stop x", "run -m %s -p hello -n 2 --tp 2 --stop y",
         "rank 1's --stop strings does not match rank 0's"},
        {"bench -m %s -p 8 -n 2 -r 1 --tp 2", "bench -m %s -p 16 -n 2 -r 1 --tp 2",
         "rank 1's tests (-p, -n, -pg, -d, -b) does not match"},
    };
    for (size_t i = 0; i < sizeof diff / sizeof diff[0]; i++) {
        char c0[512], c1[512];
        snprintf(c0, sizeof c0, diff[i].r0, a);
        snprintf(c1, sizeof c1, diff[i].r1, a);
        snprintf(cmd, sizeof cmd, "%s %s -np 1 %s %s : -np 1 %s %s", g_mpirun, mr, bin, c0, bin, c1);
        t0 = tpi_time_s();
        st = run_cmd(cmd, out, sizeof out, errb, sizeof errb);
        fprintf(stderr, "%s | %s: exit %d in %.1f s, stderr:\n%s\n", c0, c1, st,
                tpi_time_s() - t0, errb);
        ck_assert_int_ne(st, 0);
        ck_assert_int_ne(st, 124);
        ck_assert_msg(strstr(errb, diff[i].want), "want '%s'", diff[i].want);
    }
    snprintf(cmd, sizeof cmd, "%s %s -np 1 %s %s : -np 1 %s %s", g_mpirun, mr, bin, ppl_a, bin,
             ppl_b);
    st = run_cmd(cmd, out, sizeof out, errb, sizeof errb);
    fprintf(stderr, "perplexity, other text: exit %d, stderr:\n%s\n", st, errb);
    ck_assert_int_ne(st, 0);
    ck_assert_int_ne(st, 124);
    ck_assert_ptr_nonnull(strstr(errb, "rank 1's text (-f)"));
    // The same text on both ranks, each its own copy: runs.
    snprintf(cmd, sizeof cmd, "%s %s -np 1 %s %s : -np 1 %s %s", g_mpirun, mr, bin, ppl_a, bin,
             ppl_a);
    st = run_cmd(cmd, out, sizeof out, errb, sizeof errb);
    ck_assert_msg(st == 0 && strstr(out, "PPL = "), "same text: exit %d: %s", st, errb);
    tu_tmpdir_remove();

    // Two ranks, no --tp: the grid's error once, from `run -p` and the batch alike.
    tu_tmpdir_make("tpi_tp_grid");
    const char *req = tu_tmp_path("req.jsonl");
    FILE *fr = fopen(req, "w");
    ck_assert(fr);
    fputs("{\"prompt\": \"hi\"}\n", fr);
    fclose(fr);
    for (int batch = 0; batch < 2; batch++) {
        snprintf(cmd, sizeof cmd, "%s %s -np 2 %s run -m %s %s%s", g_mpirun, mr, bin, a,
                 batch ? "-f " : "-p hi", batch ? req : "");
        st = run_cmd(cmd, out, sizeof out, errb, sizeof errb);
        ck_assert_int_ne(st, 0);
        ck_assert_int_ne(st, 124);
        const char *want = "needs 1 ranks (tp * pp), launched with 2";
        const char *hit = strstr(errb, want);
        ck_assert_msg(hit && !strstr(hit + strlen(want), want), "%s: want one line:\n%s",
                      batch ? "batch" : "run -p", errb);
        // --tp on one rank only: every rank stops, the difference named once (rank 0
        // waited in MPI_Comm_dup for the rank that had failed the check alone, forever).
        snprintf(cmd, sizeof cmd,
                 "%s %s -np 1 %s run -m %s %s%s --tp 2 --comm-timeout 20 : -np 1 %s run -m %s "
                 "%s%s --comm-timeout 20",
                 g_mpirun, mr, bin, a, batch ? "-f " : "-p hi", batch ? req : "", bin, a,
                 batch ? "-f " : "-p hi", batch ? req : "");
        st = run_cmd(cmd, out, sizeof out, errb, sizeof errb);
        ck_assert_int_ne(st, 0);
        ck_assert_int_ne(st, 124);
        want = "the ranks were given different --tp/--pp (--tp from 1 to 2, --pp from 1 to 1)";
        hit = strstr(errb, want);
        ck_assert_msg(hit && !strstr(hit + strlen(want), want), "%s, --tp on rank 0 only:\n%s",
                      batch ? "batch" : "run -p", errb);
    }
    tu_tmpdir_remove();

    // tp = 3 on 8 heads through the binary: one clear line.
    snprintf(cmd, sizeof cmd, "%s %s -np 3 %s run -m %s --prompt-ids 1,2,3 -n 2 --tp 3", g_mpirun,
             mr, bin, a);
    st = run_cmd(cmd, out, sizeof out, errb, sizeof errb);
    fprintf(stderr, "tp=3: exit %d, stderr:\n%s\n", st, errb);
    ck_assert_int_ne(st, 0);
    ck_assert_int_ne(st, 124);
    ck_assert_ptr_nonnull(strstr(errb, "attention heads"));
}
END_TEST

START_TEST(test_cli_end_to_end) {
    const char *a = tu_data_path("qwen3-tiny-q4_k_m.gguf");
    ck_assert(a);
    static char out1[1 << 16], out2[1 << 16], errb[1 << 16], cmd[4096];
    const char *mr = "--oversubscribe --allow-run-as-root --bind-to none";
    const char *args = "--prompt-ids 785,922,865,293,651,77,282 -n 10 --temp 0 --json -t 1";
    snprintf(cmd, sizeof cmd, "%s %s -np 1 %s run -m %s %s", g_mpirun, mr, tu_binary(), a, args);
    int st = run_cmd(cmd, out1, sizeof out1, errb, sizeof errb);
    ck_assert_msg(st == 0, "np 1: exit %d: %s", st, errb);
    const char *grids[] = {"--tp 2", "--pp 2"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s %s -np 2 %s run -m %s %s %s", g_mpirun, mr, tu_binary(), a,
                 args, grids[i]);
        st = run_cmd(cmd, out2, sizeof out2, errb, sizeof errb);
        ck_assert_msg(st == 0, "%s: exit %d: %s", grids[i], st, errb);
        cJSON *j1 = cJSON_Parse(out1), *j2 = cJSON_Parse(out2);
        ck_assert_msg(j1 && j2, "bad JSON: '%s' / '%s'", out1, out2);
        char *t1 = cJSON_PrintUnformatted(cJSON_GetObjectItem(j1, "tokens"));
        char *t2 = cJSON_PrintUnformatted(cJSON_GetObjectItem(j2, "tokens"));
        fprintf(stderr, "np 1: %s\n%s: %s\n", t1, grids[i], t2);
        ck_assert_str_eq(t1, t2);
        free(t1);
        free(t2);
        cJSON_Delete(j1);
        cJSON_Delete(j2);
    }
}
END_TEST

int main(int argc, char **argv) {
    g_argc = argc;
    g_argv = argv;
    if (argc < 2) {
        fprintf(stderr, "usage: test_parallel TPxPP[,...] [MODEL...] | test_parallel cli MPIRUN\n");
        return 2;
    }
    const bool cli = !strcmp(argv[1], "cli");
    if (cli && !(tu_data_or_skip("qwen3-tiny-q4_k_m.gguf") && tu_data_or_skip("qwen2-tiny-q4_0.gguf")))
        return TU_SKIP;
    if (!cli && n_models_present() == 0) {
        fprintf(stderr, "SKIP: none of this run's tiny models is in ../shared/data or tests/data\n");
        return TU_SKIP;
    }
    Suite *s = suite_create("parallel");
    TCase *tc = tcase_create("parallel");
    tcase_set_timeout(tc, 600);
    if (cli) {
        g_mpirun = argc > 2 ? argv[2] : "mpirun";
        tcase_add_test(tc, test_cli_failures);
        tcase_add_test(tc, test_cli_end_to_end);
        suite_add_tcase(s, tc);
        return tu_run_suite(s);
    }
    struct tpi_error err = {0};
    if (grid_mpi_init(&argc, &argv, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    tpi_log_set(TPI_LOG_WARN, g_rank);
    const char *be = getenv("TPI_TEST_BACKEND"), *cm = getenv("TPI_TEST_COMM");
    if (be && !strcmp(be, "cuda")) {
        int n_dev = 0;
        if (!ops_cuda_available(&n_dev) || n_dev < g_size) {
            if (g_rank == 0)
                fprintf(stderr, "SKIP: TPI_TEST_BACKEND=cuda needs %d GPUs on this node, it has %d\n",
                        g_size, n_dev);
            grid_mpi_finalize();
            return TU_SKIP;
        }
        MPI_Comm node;
        int local = 0;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local);
        MPI_Comm_free(&node);
        g_backend = "cuda";
        g_device = local % n_dev;
    }
    if (cm && !strcmp(cm, "nccl")) g_comm = COMM_NCCL;
    tcase_add_test(tc, test_configs);
    suite_add_tcase(s, tc);
    const int failed = tu_run_suite_rank(s, g_rank);
    grid_mpi_finalize();
    return failed ? 1 : 0;
}
