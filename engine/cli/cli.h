/*
 * cli.h — the subcommands of the one `tpinfer` binary. Each takes the argv that
 * follows its name (argv[0] is the subcommand) and returns the process exit
 * code: 0 success, 1 error (one line on stderr saying what and where), 2 usage.
 * Results go to stdout; everything else (logs, progress, summaries) to stderr.
 */
#ifndef CLI_H
#define CLI_H

int cmd_info(int argc, char **argv);       /* tpinfer info FILE [--json] */
int cmd_mkmodel(int argc, char **argv);    /* tpinfer mkmodel -o FILE [shape/type options] */
int cmd_tokenize(int argc, char **argv);   /* tpinfer tokenize -m FILE (--text T | --jsonl IN) */
int cmd_run(int argc, char **argv);        /* tpinfer run -m FILE (-p T | -f FILE) ... */
int cmd_perplexity(int argc, char **argv); /* tpinfer perplexity -m FILE -f TEXT [-c N] */
int cmd_bench(int argc, char **argv);      /* tpinfer bench -m FILE [-p 512 -n 128 ...] */
int cmd_comm(int argc, char **argv);       /* tpinfer comm [-b 8 -e 256M -f 2] */

/* The commit this binary was built from ("unknown" outside git). */
const char *cli_build_commit(void);
/* Commits up to that one, as llama.cpp numbers its builds (0 when unknown). */
long cli_build_number(void);

#endif /* CLI_H */
