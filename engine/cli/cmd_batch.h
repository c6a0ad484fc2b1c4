/*
 * cmd_batch.h — `tpinfer run -f FILE`: a batch prompt file through the
 * continuous-batching scheduler (engine/sched). cmd_run calls cmd_run_batch
 * when -f is given; argv is the same (argv[0] is the subcommand name).
 */
#ifndef CMD_BATCH_H
#define CMD_BATCH_H

#include <stdio.h>

/* Run the batch command; returns the exit code: 0 done (error records for bad
 * lines included), 1 error, 2 usage, 128 + signal when stopped by SIGINT/SIGTERM
 * (complete records kept; --resume finishes the rest). */
int cmd_run_batch(int argc, char **argv);

/* Print the options only the batch command has (-f, -o, --parallel, ...) to out. */
void cmd_run_batch_options(FILE *out);

#endif /* CMD_BATCH_H */
