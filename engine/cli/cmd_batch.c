/*
 * cmd_batch.c — `tpinfer run -m M.gguf -f prompts.jsonl [-o results.jsonl]`:
 * load the model on every rank, read and tokenize the prompt file on rank 0,
 * run it through the continuous-batching scheduler (engine/sched), and write
 * one record per request as it completes (rank 0). Progress and the summary go
 * to stderr; records to -o or stdout.
 *
 * Signals: SIGINT/SIGTERM set a flag; rank 0 reads it once per step and the
 * scheduler's per-step broadcast stops every rank after the same step. A signal that
 * reaches another rank alone (a scheduler stopping one task) is sent on to rank 0 in a
 * one-int message after that rank's step, which rank 0 probes for at its next. What is
 * complete is on disk already (one write() per record), so --resume finishes
 * the rest.
 *
 * Exit status, the same on every rank: 0 every line ran; 4 the run completed but some
 * lines could not run (error records, the first ten named on stderr); 1 the run failed;
 * 128 + the signal when stopped.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli/cmd_batch.h"

#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli_common.h"
#include "model/model.h"
#include "model/sampling.h"
#include "parallel/grid.h"
#include "sched/output.h"
#include "sched/requests.h"
#include "sched/sched.h"
#include "text/tokenizer.h"

/* The one piece of process state: a signal handler can only set a flag. */
static volatile sig_atomic_t g_stop_signal = 0;

static void on_signal(int sig) { g_stop_signal = sig; }

/* The exit status of a run that completed with some lines as error records. */
#define BATCH_EXIT_LINE_ERRORS 4
/* At most this many of the lines that cannot run are named on stderr. */
#define BATCH_ERRORS_SHOWN 10

/* Names the first lines that cannot run on stderr, one line each ("FILE: line N: why"),
 * and how many more there are. */
static void report_error_lines(const char *file, const struct batch_input *in, int n_err) {
    int shown = 0;
    for (int i = 0; i < in->n_reqs && shown < BATCH_ERRORS_SHOWN; i++)
        if (in->reqs[i].error) {
            fprintf(stderr, "tpinfer run: %s: %s\n", file, in->reqs[i].error);
            shown++;
        }
    if (n_err > shown)
        fprintf(stderr, "tpinfer run: %s: %d more lines with errors (see their records)\n",
                file, n_err - shown);
}

void cmd_run_batch_options(FILE *out) {
    fprintf(out,
            "  -f, --file FILE       requests, one a line ('-' for stdin): JSONL of ours\n"
            "                        ({\"id\",\"prompt\"|\"messages\",...}) or OpenAI batch lines\n"
            "                        ({\"custom_id\",\"url\",\"body\"}), or plain text (a prompt a line)\n"
            "  -o, --output FILE     result records (JSONL); stdout when absent\n"
            "  --parallel N          sequences in flight (KV slots; default 8)\n"
            "  --ubatch N            token budget of one step (default 512)\n"
            "  --ordered             write records in input order (default: completion order)\n"
            "  --resume              skip requests already in -o, drop a torn last line\n"
            "  --fsync               fsync after every record\n"
            "  --progress            progress on stderr even when it is not a terminal\n"
            "  --chat                plain lines and \"prompt\" strings become user chat turns\n"
            "  --chat-template-kwargs JSON   e.g. '{\"enable_thinking\": false}' for the chats\n"
            "                        of lines without their own \"chat_template_kwargs\"\n"
            "  --no-prefix-share     prefill every prompt whole (default: a prompt that begins\n"
            "                        like one whose KV a slot still holds reuses that prefix)\n"
            "  -n, --max-tokens N    tokens to generate per request (N >= 1; default or -1: up\n"
            "                        to the context)\n"
            "  --seed S              run seed (default 0; -1 = random, printed); a request\n"
            "                        without \"seed\" uses S + its line\n"
            "  --logprobs K          top-K logprobs (0-20) per generated token for every request\n"
            "A line that cannot run gets an error record and is named on stderr; the others\n"
            "run, and the exit status is then 4 (0: every line ran; 1: the run failed).\n");
}

static void usage(FILE *out) {
    fprintf(out, "usage: tpinfer run -m MODEL.gguf -f PROMPTS [-o RESULTS] [options]\n");
    cmd_run_batch_options(out);
    fprintf(out, "Sampling defaults for the requests that do not set their own (OpenAI lines\n"
                 "take vLLM's, temperature 1 and no filter, where these are not given):\n");
    cli_sampling_usage(out);
    fprintf(out, "Model and parallel options (as tpinfer run -p):\n");
    cli_common_usage(out, true);
}

struct batch_opts {
    struct cli_common c; /* -m, --tp/--pp/--pp-layers, --backend, --comm, -c, -t, --ubatch, ... */
    const char *file, *output;
    int n_parallel, max_tokens, n_logprobs;
    int enable_thinking; /* --chat-template-kwargs (-1: unset) */
    struct sampler_params sp, sp_openai; /* ours; OpenAI lines (vLLM's defaults) */
    unsigned sp_set;                     /* the sampling options given (enum sampler_field) */
    bool ordered, resume, fsync, progress, chat, no_prefix_share;
};

static bool parse_int(const char *s, int *out) {
    char *e;
    long v = strtol(s, &e, 10);
    if (!*s || *e || v < -1000000000L || v > 1000000000L) return false;
    *out = (int)v;
    return true;
}

/* The request-line field that does with -f what single-prompt option a does with -p;
 * NULL when a is not one of those options. */
static const char *single_prompt_field(const char *a) {
    static const char *const map[][2] = {
        {"--stop", "\"stop\""},
        {"--logit-bias", "\"logit_bias\""},
        {"--ignore-eos", "\"ignore_eos\""},
        {"--system", "a system turn in \"messages\""},
        {"--prompt-logprobs", "\"echo\": true with \"logprobs\" (a /v1/completions line)"},
        {"--json", "nothing: records are JSON lines"},
        {"--no-escape", "nothing: lines are taken as written"},
        {"--prompt-ids", "\"prompt\" as an array of token ids"},
        {"-p", "\"prompt\" (or give a plain-text line)"},
        {"--prompt", "\"prompt\" (or give a plain-text line)"},
    };
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
        if (!strcmp(a, map[k][0])) return map[k][1];
    return NULL;
}

/* Returns 0, or 2 after printing a usage error. */
static int parse_args(int argc, char **argv, struct batch_opts *o) {
    memset(o, 0, sizeof *o);
    cli_common_init(&o->c);
    o->n_parallel = 8;
    o->max_tokens = -1;
    o->enable_thinking = -1;
    sampler_params_default(&o->sp);
    sampler_params_openai(&o->sp_openai);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        int common = cli_common_parse(&o->c, argc, argv, &i, "run");
        if (!common) { // a sampling option given sets both formats' defaults
            int j = i;
            common = cli_sampling_parse(&o->sp, &o->sp_set, argc, argv, &i, "run");
            if (common > 0) cli_sampling_parse(&o->sp_openai, &o->sp_set, argc, argv, &j, "run");
        }
        if (common < 0) return 2;
        if (common > 0) continue;
#define IS(s) (strcmp(a, s) == 0)
        if (IS("-h") || IS("--help")) {
            usage(stdout);
            return -1;
        } else if (IS("-f") || IS("--file")) o->file = v, ok = v;
        else if (IS("-o") || IS("--output")) o->output = v, ok = v;
        else if (IS("--parallel") || IS("-np")) ok = v && parse_int(v, &o->n_parallel) && o->n_parallel > 0;
        else if (IS("-n") || IS("--max-tokens") || IS("--n-predict"))
            ok = v && parse_int(v, &o->max_tokens) && o->max_tokens != 0 && o->max_tokens >= -1;
        else if (IS("--chat-template-kwargs")) {
            struct tpi_error e;
            if (v && req_parse_chat_kwargs(v, &o->enable_thinking, &e)) {
                fprintf(stderr, "tpinfer run: --chat-template-kwargs: %s, got '%s'\n", e.msg, v);
                return 2;
            }
            ok = v;
        } else if (IS("--logprobs"))
            ok = v && parse_int(v, &o->n_logprobs) && o->n_logprobs >= 0 && o->n_logprobs <= 20;
        else {
            takes = false;
            if (IS("--ordered")) o->ordered = true;
            else if (IS("--resume")) o->resume = true;
            else if (IS("--fsync")) o->fsync = true;
            else if (IS("--progress")) o->progress = true;
            else if (IS("--chat")) o->chat = true;
            else if (IS("--no-prefix-share")) o->no_prefix_share = true;
            else {
                const char *field = single_prompt_field(a);
                if (field)
                    fprintf(stderr, "tpinfer run: %s applies to -p; with -f a request line sets %s\n",
                            a, field);
                else
                    fprintf(stderr, "tpinfer run: unknown option '%s' (tpinfer run --help)\n", a);
                return 2;
            }
        }
#undef IS
        if (!ok) {
            fprintf(stderr, "tpinfer run: option %s needs a valid value%s%s\n", a,
                    v ? ", got " : "", v ? v : "");
            return 2;
        }
        if (takes) i++;
    }
    // Unlike a single prompt, a batch run repeats by default: seed 0 unless given.
    if (!o->c.seed_set && !o->c.seed_random) o->c.seed = 0;
    if (!o->c.model || !o->file) {
        fprintf(stderr, "tpinfer run: -m MODEL and -f FILE are required (tpinfer run --help)\n");
        return 2;
    }
    if (o->resume && !o->output) {
        fprintf(stderr, "tpinfer run: --resume needs -o FILE\n");
        return 2;
    }
    return 0;
}

/* Rank 0's view of the run, shared with the scheduler callbacks. */
struct run_ctx {
    struct batch_input in;
    struct batch_out out;
    int next;             /* next request index to offer */
    int next_choice;      /* its next choice to offer */
    int n_todo;           /* requests this run executes */
    int n_todo_seq;       /* their sequences (n choices each) */
    bool progress, tty;
    double t_last_print;
    int rc;               /* first output error */
    struct tpi_error err;
    MPI_Comm world;       /* the signal's way to rank 0 */
    int rank;
    bool stop_sent;       /* this rank's signal went to rank 0 */
};

enum { TAG_STOP_SIGNAL = 0x7470 }; /* a non-root rank's SIGINT/SIGTERM, to rank 0 */

/* TPI_OK unless the output path names the prompt file or the model, however spelled (the
 * same device and inode): opening it for the results would truncate what the run reads. A
 * path that does not exist yet is apart from both. */
static int output_apart(const char *out, const char *prompts, const char *model,
                        struct tpi_error *err) {
    struct stat so, s;
    if (!out || stat(out, &so) != 0) return TPI_OK;
    const char *paths[2] = {prompts, model}, *what[2] = {"prompt file", "model"};
    for (int i = 0; i < 2; i++)
        if (paths[i] && stat(paths[i], &s) == 0 && s.st_dev == so.st_dev && s.st_ino == so.st_ino)
            return tpi_err(err, TPI_ERR_INVALID,
                           "the output %s is the %s %s: the results would overwrite it; give -o "
                           "another file",
                           out, what[i], paths[i]);
    return TPI_OK;
}

static int cb_next(void *user, struct sched_request *rq) {
    struct run_ctx *c = user;
    while (c->next < c->in.n_reqs) {
        struct batch_req *r = &c->in.reqs[c->next];
        if (r->done || r->error || c->next_choice >= r->n_choices) {
            c->next++;
            c->next_choice = 0;
            continue;
        }
        const int choice = c->next_choice++;
        rq->tag = (int64_t)c->next * REQ_MAX_CHOICES + choice;
        rq->prompt = r->prompt;
        rq->n_prompt = r->n_prompt;
        rq->max_tokens = r->max_tokens;
        rq->n_logprobs = r->n_logprobs;
        rq->score_prompt = r->echo && r->want_logprobs;
        rq->sp = r->sp;
        rq->sp.seed = req_choice_seed(r->sp.seed, choice);
        rq->stop = (const char *const *)r->stop;
        rq->n_stop = r->n_stop;
        rq->stop_ids = r->stop_ids;
        rq->n_stop_ids = r->n_stop_ids;
        rq->ignore_eos = r->ignore_eos;
        rq->keep_stop_string = r->keep_stop_string;
        rq->render_control = r->tools == REQ_TOOLS_AUTO; // a <tool_call> token kept for the parser
        rq->min_tokens = r->min_tokens;
        rq->bias_ids = r->bias_ids;
        rq->bias_vals = r->bias_vals;
        rq->n_bias = r->n_bias;
        return 1;
    }
    return 0;
}

static int cb_stop(void *user) {
    struct run_ctx *c = user;
    int any = 0;
    MPI_Status ms;
    if (!g_stop_signal && c->world != MPI_COMM_NULL &&
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_STOP_SIGNAL, c->world, &any, &ms) == MPI_SUCCESS && any) {
        int sig = SIGTERM;
        MPI_Recv(&sig, 1, MPI_INT, ms.MPI_SOURCE, TAG_STOP_SIGNAL, c->world, MPI_STATUS_IGNORE);
        TPI_LOGW("rank %d was sent %s: stopping the run", ms.MPI_SOURCE,
                 sig == SIGINT ? "SIGINT" : "SIGTERM");
        g_stop_signal = sig == SIGINT ? SIGINT : SIGTERM;
    }
    return c->rc != TPI_OK ? SCHED_STOP_FAILED : g_stop_signal != 0 ? SCHED_STOP_SIGNAL : 0;
}

static void cb_done(void *user, int64_t tag, const struct sched_result *res) {
    struct run_ctx *c = user;
    if (c->rc) return;
    c->rc = batch_out_result(&c->out, (int)(tag / REQ_MAX_CHOICES), (int)(tag % REQ_MAX_CHOICES),
                             res, &c->err);
}

static void cb_step(void *user, const struct sched_stats *st) {
    struct run_ctx *c = user;
    if (c->rank != 0 && g_stop_signal && !c->stop_sent && c->world != MPI_COMM_NULL) {
        const int sig = g_stop_signal;
        c->stop_sent = MPI_Send(&sig, 1, MPI_INT, 0, TAG_STOP_SIGNAL, c->world) == MPI_SUCCESS;
    }
    if (!c->progress) return;
    const double dt = st->t_now_s - st->t_start_s;
    if (st->t_now_s - c->t_last_print < (c->tty ? 0.25 : 2.0)) return;
    c->t_last_print = st->t_now_s;
    double tps = dt > 0 ? st->n_gen_tokens / dt : 0.0;
    double eta = st->n_done > 0 ? dt / st->n_done * (c->n_todo_seq - st->n_done) : 0.0;
    fprintf(stderr, "%s[batch] %lld/%d done, %d in flight, %.1f tok/s, ETA %d:%02d%s",
            c->tty ? "\r" : "", (long long)st->n_done, c->n_todo_seq, st->n_active, tps,
            (int)eta / 60, (int)eta % 60, c->tty ? "   " : "\n");
}

int cmd_run_batch(int argc, char **argv) {
    struct batch_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) return prc < 0 ? 0 : prc;

    struct tpi_error err = {0};
    struct tpi_grid grid;
    memset(&grid, 0, sizeof grid);
    bool grid_ok = false;
    struct model *m = NULL;
    struct tokenizer *tok = NULL;
    struct run_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.world = MPI_COMM_NULL;
    int exit_code = 1, rc;

    grid_set_wait(o.c.comm_timeout_s);
    if ((rc = grid_mpi_init(&argc, &argv, &err))) goto fail;
    if ((rc = grid_init(&grid, o.c.tp, o.c.pp, &err))) goto fail;
    grid_ok = true;
    const bool root = grid.world_rank == 0;
    ctx.world = grid.world;
    ctx.rank = grid.world_rank;
    if (grid.world_size > 1) tpi_log_set(TPI_LOG_INFO, grid.world_rank);
    // Collective on every rank (a rank given --seed -1 alone must not wait for the rest).
    uint64_t seed0 = 0;
    if ((rc = cli_shared_seed(grid.world, o.c.seed_random, o.c.seed, &seed0, &err))) goto fail;
    if (o.c.seed_random) {
        o.c.seed = seed0;
        if (root)
            TPI_LOGI("batch: --seed -1 drew the run seed %llu (--seed %llu repeats this run)",
                     (unsigned long long)o.c.seed, (unsigned long long)o.c.seed);
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    struct model_params mp = {
        .path = o.c.model,
        .backend = o.c.backend,
        .n_threads = o.c.n_threads,
        .comm = COMM_MPI,
        .comm_timeout_s = o.c.comm_timeout_s,
        .n_ctx = o.c.n_ctx,
        .rope = o.c.rope,
        .n_slot = o.n_parallel,
        .n_ubatch = o.c.n_ubatch,
        .pp_layers = o.c.n_pp_layers ? o.c.pp_layers : NULL,
        .n_pp_layers = o.c.n_pp_layers,
        .seed = o.c.seed,
        .quiet = !o.c.verbose,
    };
    if (o.c.comm) { // cli_common_parse accepted only mpi or nccl
        mp.comm = (enum comm_kind)comm_kind_from_name(o.c.comm);
    } else if (strcmp(o.c.backend, "cpu") != 0 && ops_cuda_available(NULL)) {
        mp.comm = (enum comm_kind)comm_kind_from_name(cli_default_comm("cuda"));
    }
    if ((rc = model_load(&m, &mp, &grid, &err))) goto fail;
    rc = tok_load(m->gguf, &tok, &err);
    if ((rc = model_agree(m, rc, &err))) goto fail;
    // The model's recommended sampling for what the options leave: llama.cpp's reading
    // for our lines, vLLM's (its generation config) for OpenAI lines.
    cli_sampling_from_model(&o.sp, o.sp_set, m, root, "run");
    model_sampling_defaults(m->gguf, &o.sp_openai, o.sp_set, true, false);
    // The requests reach every rank from rank 0; what each rank's scheduler decides alone
    // must be alike (prefix copies are made by every rank from the same state).
    const struct grid_same same[] = {{"--no-prefix-share", (uint64_t)o.no_prefix_share, 0}};
    if ((rc = grid_check_same(&grid, same, 1, &err))) goto fail;

    // ---- rank 0: the requests, --resume, the output file ----
    const char *slash = strrchr(o.c.model, '/');
    const char *model_name = slash ? slash + 1 : o.c.model;
    int n_resumed = 0, n_err_lines = 0;
    const char *in_name = strcmp(o.file, "-") ? o.file : "stdin"; /* in the error lines */
    rc = TPI_OK;
    if (root) {
        struct req_defaults d = {.max_tokens = o.max_tokens,
                                 .sp = o.sp,
                                 .sp_openai = o.sp_openai,
                                 .seed = o.c.seed,
                                 .n_logprobs = o.n_logprobs,
                                 .chat = o.chat,
                                 .enable_thinking = o.enable_thinking,
                                 .n_ctx = m->n_ctx,
                                 .n_vocab = m->cfg.n_vocab};
        if (d.sp.repeat_last_n < 0) d.sp.repeat_last_n = m->n_ctx; // -1: the whole context
        if (d.sp_openai.repeat_last_n < 0) d.sp_openai.repeat_last_n = m->n_ctx;
        rc = output_apart(o.output, o.file, o.c.model, &err);
        if (!rc) rc = batch_input_load(o.file, tok, &d, &ctx.in, &err);
        if (!rc && o.resume) rc = batch_resume_scan(o.output, &ctx.in, &n_resumed, &err);
        if (!rc)
            rc = batch_out_open(&ctx.out, o.output, o.resume, o.ordered, o.fsync, &ctx.in, tok,
                                model_name, &err);
        if (!rc) rc = batch_out_errors(&ctx.out, &err);
        for (int i = 0; i < ctx.in.n_reqs; i++) {
            if (ctx.in.reqs[i].error) n_err_lines++;
            if (!ctx.in.reqs[i].done && !ctx.in.reqs[i].error) {
                ctx.n_todo++;
                ctx.n_todo_seq += ctx.in.reqs[i].n_choices;
            }
        }
        ctx.tty = isatty(2);
        ctx.progress = o.progress || ctx.tty;
        if (!rc)
            TPI_LOGI("batch: %d requests in %s (%d with errors, %d already done), %d to run, "
                     "--parallel %d --ubatch %d",
                     ctx.in.n_reqs, o.file, n_err_lines, n_resumed, ctx.n_todo, o.n_parallel,
                     o.c.n_ubatch);
        if (!rc) report_error_lines(in_name, &ctx.in, n_err_lines);
    }
    if ((rc = model_agree(m, rc, &err))) goto fail;
    if ((rc = grid_bcast(&grid, &n_err_lines, 1, MPI_INT, 0, &err))) /* one exit code */
        goto fail;

    struct sched_params sp = {.n_parallel = o.n_parallel, .n_ubatch = o.c.n_ubatch,
                              .no_prefix_share = o.no_prefix_share};
    struct sched_callbacks cb = {cb_next, cb_stop, cb_done, cb_step, &ctx};
    struct sched_stats st;
    rc = sched_run(m, tok, &sp, &cb, &st, &err);
    if (grid.world_size > 1 && (rc == TPI_ERR_COMM || rc == TPI_ERR_TIMEOUT)) {
        // A peer stuck, gone or failing: only the ranks that saw it know, so each says so
        // itself, and the job is aborted as a failed launch is (cli_fail_rank): a rank
        // left waiting in MPI_Finalize would never end. The records written are on disk.
        fprintf(stderr, "tpinfer run: error on rank %d: %s (the records written so far are "
                        "kept; --resume finishes the rest)\n", grid.world_rank, err.msg);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (root) {
        if (ctx.progress && ctx.tty && ctx.t_last_print > 0) fputc('\n', stderr);
        struct tpi_error cerr = {0};
        int crc = batch_out_close(&ctx.out, &cerr);
        if (!ctx.rc && crc) ctx.rc = crc, ctx.err = cerr;
        if (ctx.rc && o.output) /* the file failed: what is in it, how the rest gets there */
            fprintf(stderr,
                    "tpinfer run: %s (%ld records written this run; --resume finishes the rest)\n",
                    ctx.err.msg, ctx.out.n_written);
        else if (ctx.rc)
            fprintf(stderr, "tpinfer run: %s\n", ctx.err.msg);
        double wall = st.t_now_s - st.t_start_s;
        const double n_all = (double)(st.n_gen_tokens + st.n_prompt_tokens + st.n_prompt_shared);
        // Rows whose sampler needed the whole logits (the decider counts them: rank 0's
        // figure only where rank 0 decides).
        char whole[64] = "";
        if (m && model_decider_rank(m) == 0)
            snprintf(whole, sizeof whole, " (%lld logits rows copied whole)",
                     (long long)st.n_rows_whole);
        // Where steps may run as CUDA graphs: how many did (rank 0's), and the recordings.
        char graphs[96] = "";
        if (m && m->use_graphs)
            snprintf(graphs, sizeof graphs, ", %lld steps as graph launches (%lld recorded)",
                     (long long)m->n_graph_launches, (long long)m->n_graph_records);
        fprintf(stderr,
                "batch summary: %d requests (%lld completed now, %d resumed, %d errors), prompt "
                "tokens %lld (+%lld shared), generated %lld, wall %.2f s, %.1f generated tok/s, "
                "%.1f total tok/s, %lld steps (%lld decode only), forward %.2f s, sampling %.2f "
                "s%s%s\n",
                ctx.in.n_reqs, (long long)ctx.out.n_results, n_resumed, n_err_lines,
                (long long)st.n_prompt_tokens, (long long)st.n_prompt_shared,
                (long long)st.n_gen_tokens, wall,
                wall > 0 ? st.n_gen_tokens / wall : 0.0,
                wall > 0 ? n_all / wall : 0.0, (long long)st.n_steps,
                (long long)st.n_decode_steps, st.t_forward_s, st.t_sample_s, whole, graphs);
    }
    if (ctx.rc) goto out; // exit 1: the output failed, said above
    if (rc == TPI_ERR_INTERRUPTED) {
        const int sig = g_stop_signal ? (int)g_stop_signal : SIGTERM;
        if (root)
            fprintf(stderr,
                    "tpinfer run: stopped by %s: %lld of %d requests remain (%d sequences were "
                    "in flight); run again with --resume to finish them\n",
                    sig == SIGINT ? "SIGINT" : "SIGTERM",
                    (long long)(ctx.n_todo - ctx.out.n_results), ctx.n_todo, st.n_active);
        exit_code = 128 + sig;
        goto out;
    }
    if (rc) goto fail;
    exit_code = 0;
    if (n_err_lines) {
        if (root)
            fprintf(stderr,
                    "tpinfer run: %s: %d of %d lines could not run (their error records are in "
                    "%s); the other %d ran\n",
                    in_name, n_err_lines, ctx.in.n_reqs, o.output ? o.output : "the results",
                    ctx.in.n_reqs - n_err_lines);
        exit_code = BATCH_EXIT_LINE_ERRORS;
    }
    goto out;

fail:
    // An error every rank shares (agreed, or the grid's tp * pp against the ranks) is
    // printed once; a timeout by each rank that met one (rank 0 may be the one stuck), and
    // MPI's own failures to build the grid.
    if (rc == TPI_ERR_TIMEOUT)
        fprintf(stderr, "tpinfer run: error on rank %d: %s\n", grid.world_rank, err.msg);
    else if (grid.world_rank == 0 || (!grid_ok && rc != TPI_ERR_INVALID))
        fprintf(stderr, "tpinfer run: %s\n", err.msg);
    exit_code = 1;
out:
    if (grid.world_rank == 0 && ctx.out.fd > 0 && ctx.out.own_fd) batch_out_close(&ctx.out, &err);
    batch_input_free(&ctx.in);
    tok_free(&tok);
    model_free(&m);
    if (grid_ok) grid_free(&grid);
    grid_mpi_finalize();
    return exit_code;
}
