/*
 * cmd_mkmodel.c — `tpinfer mkmodel`: write a synthetic Qwen2/Qwen3 GGUF model
 * (random weights, real formats) of any shape and file type; see loaders/synth.h.
 * Nothing goes to stdout; a summary goes to stderr.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loaders/synth.h"
#include "tpi.h"

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: tpinfer mkmodel -o FILE [options]\n"
        "  -o, --output FILE     the GGUF to write (through FILE.tmp)\n"
        "  --preset NAME         tiny (default) | qwen3-0.6b | qwen3-8b | qwen3-32b\n"
        "  --arch qwen2|qwen3    architecture (qwen2: q/k/v biases; qwen3: q/k norms)\n"
        "  --layers N --embd N --heads N --kv-heads N --head-dim N --ff N\n"
        "  --vocab N             vocabulary size (pads with [PADn] tokens)\n"
        "  --ctx N               context_length metadata (default 4096; the qwen3-* presets 40960)\n"
        "  --tied | --untied     share token_embd as the output projection or not\n"
        "  --type T              f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k_s q3_k_m\n"
        "                        q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k iq4_nl iq4_xs (q3_k/\n"
        "                        q4_k/q5_k = the _m mixes); mixes as llama-quantize makes them\n"
        "                        without an importance matrix (default q8_0)\n"
        "  --pure                every matrix in the base type, no mix\n"
        "  --seed S              random seed (default 42)\n"
        "  --vocab-from FILE     tokenizer.json, or a .gguf whose tokenizer.* keys are copied\n"
        "  --chat-template FILE  tokenizer.chat_template from this file (default: the\n"
        "                        vocabulary's own, plain ChatML for the built-in one)\n"
        "  --merges N            built-in vocabulary: BPE merges to learn (default 128;\n"
        "                        the built-in text gives at most ~200)\n"
        "  --name NAME           general.name\n"
        "  --rope-base F --eps F rope freq_base (1e6), rms norm epsilon (1e-6)\n"
        "  --rope-scaling linear|yarn --rope-scale F [--yarn-orig-ctx N]\n"
        "                        rope.scaling.type, .factor, .original_context_length\n"
        "                        (a long-context model's keys; run reads them)\n"
        "  --sampling K=V[,K=V]  recommended sampling as general.sampling.K (K: temp, top_k,\n"
        "                        top_p, min_p, penalty_repeat, penalty_last_n), which run\n"
        "                        takes as its defaults\n"
        "  -t, --threads N       threads (default: all cores)\n"
        "  -q, --quiet           no progress lines\n");
}

static int parse_int(const char *opt, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tpinfer mkmodel: %s '%s': expected an integer in [%ld, %ld]\n", opt, s, lo,
                hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cmd_mkmodel(int argc, char **argv) {
    struct synth_config cfg;
    synth_config_init(&cfg);
    struct tpi_error err;
    tpi_err_clear(&err);
    const char *out_path = NULL;
    bool quiet = false;
    cfg.verbose = true;
    /* The preset is applied first wherever it appears, so explicit options override it. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tpinfer mkmodel: --preset needs a value\n");
                return 2;
            }
            if (synth_apply_preset(&cfg, argv[i + 1], &err)) {
                fprintf(stderr, "tpinfer mkmodel: %s\n", err.msg);
                return 2;
            }
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--tied")) {
            cfg.tied = true;
            continue;
        }
        if (!strcmp(a, "--untied")) {
            cfg.tied = false;
            continue;
        }
        if (!strcmp(a, "--pure")) {
            cfg.pure = true;
            continue;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
            continue;
        }
        if (i + 1 >= argc || a[0] != '-') {
            fprintf(stderr, "tpinfer mkmodel: %s '%s'\n",
                    a[0] == '-' ? "missing value for" : "unexpected argument", a);
            usage(stderr);
            return 2;
        }
        const char *val = argv[++i];
        int bad = 0;
        const long big = 1L << 24;
        if (!strcmp(a, "-o") || !strcmp(a, "--output"))
            out_path = val;
        else if (!strcmp(a, "--preset"))
            continue; /* done above */
        else if (!strcmp(a, "--arch"))
            snprintf(cfg.arch, sizeof cfg.arch, "%s", val);
        else if (!strcmp(a, "--layers"))
            bad = parse_int(a, val, 1, 4096, &cfg.n_layer);
        else if (!strcmp(a, "--embd"))
            bad = parse_int(a, val, 1, big, &cfg.n_embd);
        else if (!strcmp(a, "--heads"))
            bad = parse_int(a, val, 1, 65536, &cfg.n_head);
        else if (!strcmp(a, "--kv-heads"))
            bad = parse_int(a, val, 1, 65536, &cfg.n_head_kv);
        else if (!strcmp(a, "--head-dim"))
            bad = parse_int(a, val, 1, 65536, &cfg.head_dim);
        else if (!strcmp(a, "--ff"))
            bad = parse_int(a, val, 1, big, &cfg.n_ff);
        else if (!strcmp(a, "--vocab"))
            bad = parse_int(a, val, 1, 1L << 26, &cfg.n_vocab);
        else if (!strcmp(a, "--ctx"))
            bad = parse_int(a, val, 1, 1L << 30, &cfg.n_ctx);
        else if (!strcmp(a, "--yarn-orig-ctx"))
            bad = parse_int(a, val, 1, 1L << 30, &cfg.yarn_orig_ctx);
        else if (!strcmp(a, "--rope-scaling")) {
            if (strcmp(val, "linear") && strcmp(val, "yarn")) {
                fprintf(stderr, "tpinfer mkmodel: --rope-scaling '%s': expected linear or yarn\n",
                        val);
                bad = 1;
            }
            snprintf(cfg.rope_scaling, sizeof cfg.rope_scaling, "%s", val);
        } else if (!strcmp(a, "--rope-scale")) {
            char *end;
            const float f = strtof(val, &end);
            if (end == val || *end || !(f > 0) || !isfinite(f)) {
                fprintf(stderr, "tpinfer mkmodel: --rope-scale '%s': expected a positive number\n",
                        val);
                bad = 1;
            }
            cfg.rope_scale = f;
        }
        else if (!strcmp(a, "--merges"))
            bad = parse_int(a, val, 0, 1L << 20, &cfg.n_merges);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            bad = parse_int(a, val, 1, 4096, &cfg.n_threads);
        else if (!strcmp(a, "--name"))
            snprintf(cfg.name, sizeof cfg.name, "%s", val);
        else if (!strcmp(a, "--sampling")) {
            struct tpi_error e;
            if (synth_parse_sampling(&cfg, val, &e)) {
                fprintf(stderr, "tpinfer mkmodel: %s\n", e.msg);
                return 2;
            }
        }
        else if (!strcmp(a, "--vocab-from"))
            snprintf(cfg.vocab_from, sizeof cfg.vocab_from, "%s", val);
        else if (!strcmp(a, "--chat-template"))
            snprintf(cfg.chat_template_from, sizeof cfg.chat_template_from, "%s", val);
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(val, &end, 0);
            if (errno || end == val || *end || val[strspn(val, " \t")] == '-') {
                fprintf(stderr, "tpinfer mkmodel: --seed '%s': expected an unsigned integer\n",
                        val);
                bad = 1;
            }
            cfg.seed = s;
        } else if (!strcmp(a, "--rope-base") || !strcmp(a, "--eps")) {
            char *end;
            float f = strtof(val, &end);
            if (end == val || *end || !(f > 0)) {
                fprintf(stderr, "tpinfer mkmodel: %s '%s': expected a positive number\n", a, val);
                bad = 1;
            }
            if (!strcmp(a, "--eps"))
                cfg.rms_eps = f;
            else
                cfg.rope_freq_base = f;
        } else if (!strcmp(a, "--type")) {
            int ft = synth_ftype_from_name(val);
            if (ft < 0) {
                fprintf(stderr,
                        "tpinfer mkmodel: --type '%s' is not known (f32 f16 bf16 q8_0 q4_0 q4_1 "
                        "q5_0 q5_1 q2_k q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k iq4_nl "
                        "iq4_xs)\n",
                        val);
                return 2;
            }
            cfg.ftype = ft;
        } else {
            fprintf(stderr, "tpinfer mkmodel: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!cfg.rope_scaling[0] != !(cfg.rope_scale > 0) ||
        (cfg.yarn_orig_ctx > 0 && strcmp(cfg.rope_scaling, "yarn"))) {
        fprintf(stderr, "tpinfer mkmodel: --rope-scaling and --rope-scale go together, and "
                        "--yarn-orig-ctx with --rope-scaling yarn\n");
        return 2;
    }
    if (!out_path) {
        fprintf(stderr, "tpinfer mkmodel: -o FILE is required\n");
        usage(stderr);
        return 2;
    }
    if (quiet) cfg.verbose = false;
    if (synth_check_config(&cfg, &err)) {
        fprintf(stderr, "tpinfer mkmodel: %s\n", err.msg);
        return 2;
    }
    struct synth_stats stats;
    if (synth_write(&cfg, out_path, &stats, &err)) {
        fprintf(stderr, "tpinfer mkmodel: %s\n", err.msg);
        return 1;
    }
    if (!quiet)
        fprintf(stderr,
                "tpinfer mkmodel: wrote %s: %s %s%s, %d layers, embd %d, heads %d/%d, ff %d, vocab "
                "%lld, "
                "%d tensors, %.3f B params, %.2f GiB in %.1f s (%d threads, %.0f MB/s)\n",
                out_path, cfg.arch, synth_ftype_name(cfg.ftype), cfg.pure ? " (pure)" : "",
                cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.n_ff,
                (long long)stats.n_vocab, stats.n_tensors, (double)stats.n_params / 1e9,
                (double)stats.n_bytes / (1u << 30), stats.seconds, stats.n_threads,
                stats.seconds > 0 ? (double)stats.n_bytes / 1e6 / stats.seconds : 0.0);
    return 0;
}
