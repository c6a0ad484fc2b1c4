/*
 * tpi.h — project-wide basics: status codes, the error record every library
 * call fills, logging to stderr, and small helpers (time, cores).
 *
 * Library code never exits: it returns an `int` status (TPI_OK == 0, or one of
 * enum tpi_status) and writes a one-line message into a `struct tpi_error`.
 * Only the CLI layer turns a status into an exit code.
 */
#ifndef TPI_H
#define TPI_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum tpi_status {
    TPI_OK = 0,
    TPI_ERR_IO = 1,          /* open/read/write/mmap failed */
    TPI_ERR_FORMAT = 2,      /* malformed file or input */
    TPI_ERR_INVALID = 3,     /* bad argument or configuration */
    TPI_ERR_NOMEM = 4,       /* allocation failed (host or device) */
    TPI_ERR_UNSUPPORTED = 5, /* valid but not supported (type, arch) */
    TPI_ERR_COMM = 6,        /* MPI/NCCL failure */
    TPI_ERR_CUDA = 7,        /* CUDA/cuBLAS failure */
    TPI_ERR_TIMEOUT = 8,     /* a peer did not answer in time */
    TPI_ERR_INTERRUPTED = 9, /* stopped by a signal */
};

/* One error: the status and a one-line message that says what and where. */
struct tpi_error {
    int status;
    char msg[1024];
};

/* Fill `err` (may be NULL) with status and a printf-style message; returns status. */
int tpi_err(struct tpi_error *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix the message already in `err` with "context: "; returns err->status. */
int tpi_err_wrap(struct tpi_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reset `err` to TPI_OK with an empty message. */
void tpi_err_clear(struct tpi_error *err);

/* A malloc'd copy of the NUL-terminated s; NULL when memory ran out. */
char *tpi_strdup(const char *s);

/* Short name of a status ("io", "format", ...); never NULL. */
const char *tpi_status_name(int status);

/* Log levels; messages go to stderr only. */
enum tpi_log_level { TPI_LOG_ERROR = 0, TPI_LOG_WARN = 1, TPI_LOG_INFO = 2, TPI_LOG_DEBUG = 3 };

/* Set the level at or below which messages print (default INFO) and the rank
 * that prefixes each line ("[rank N] "), -1 for no prefix. */
void tpi_log_set(int level, int rank);

/* Print one log line to stderr when `level` is enabled. */
void tpi_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define TPI_LOGE(...) tpi_log(TPI_LOG_ERROR, __VA_ARGS__)
#define TPI_LOGW(...) tpi_log(TPI_LOG_WARN, __VA_ARGS__)
#define TPI_LOGI(...) tpi_log(TPI_LOG_INFO, __VA_ARGS__)
#define TPI_LOGD(...) tpi_log(TPI_LOG_DEBUG, __VA_ARGS__)

/* Monotonic wall-clock time in seconds. */
double tpi_time_s(void);

/* Number of CPU cores this process may run on (sched_getaffinity), at least 1. */
int tpi_cpu_count(void);

/* FNV-1a 64-bit hash of `n` bytes, continuing from `h` (start with TPI_FNV_INIT). */
#define TPI_FNV_INIT 0xcbf29ce484222325ULL
uint64_t tpi_fnv1a(uint64_t h, const void *data, size_t n);

/* One JSON value that fills text[0, len) but for surrounding whitespace (cJSON's own
 * parse stops after the first value: `{"a":1} x` would pass), or NULL (also when memory
 * ran out); a repeated key keeps its first place and its last value, as Python's
 * json.loads (and so vLLM) reads it, where cJSON's lookups would find the first. Free
 * with cJSON_Delete. */
struct cJSON;
struct cJSON *tpi_json_parse(const char *text, size_t len);

/* UTF-8 at p (n >= 1 bytes): *len gets the length its first byte announces (0: not a
 * lead byte); returns how many bytes, 1 to *len, begin a well-formed character (Unicode's
 * table 3-7: E0 A0-BF, ED 80-9F, F0 90-BF, F4 80-8F, else 80-BF after the lead): *len for
 * a whole one, fewer for a cut-off or broken one (its maximal subpart), 1 for a non-lead. */
int tpi_utf8_scan(const unsigned char *p, size_t n, int *len);

/* The offset of the first byte of [s, s + n) that does not begin a well-formed UTF-8
 * character (as tpi_utf8_scan judges it), or n when all of it is UTF-8. */
size_t tpi_utf8_bad(const char *s, size_t n);

/* The value of hex digit c (0-9, a-f, A-F), or -1. */
int tpi_hex_digit(char c);

/* The n bytes at s with each maximal subpart of a broken character made one U+FFFD (as
 * Python's errors="replace" does), malloc'd and NUL-terminated, its length in *out_n;
 * NULL when memory runs out. */
char *tpi_utf8_fix(const char *s, size_t n, size_t *out_n);

/* A JSON string node of the n bytes at s (UTF-8; NULs allowed: cJSON's strings end at the
 * first NUL, so text holding one becomes a raw node, escaped as cJSON escapes, with
 * \u0000 for each NUL); NULL when memory runs out. */
struct cJSON *tpi_json_text(const char *s, size_t n);

/* All of stream f (to its end) in a NUL-terminated buffer of *n bytes (the NUL not
 * counted), free with free(); NULL with errno set: ENOMEM out of memory, else the read's
 * error (EIO when it gave none). f stays open. */
char *tpi_read_stream(FILE *f, size_t *n);

/* Half/bfloat16 conversions (round to nearest even), shared by every module. */
float tpi_f16_to_f32(uint16_t h);
uint16_t tpi_f32_to_f16(float f);
float tpi_bf16_to_f32(uint16_t h);
uint16_t tpi_f32_to_bf16(float f);

#define TPI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TPI_MAX(a, b) ((a) > (b) ? (a) : (b))

/* The CPU backend's hot loops (dequantize, dot products) built twice, for AVX2 and
 * for the baseline, the loader picking one at start (GNU ifunc). Same arithmetic in
 * the same order per lane, and ISO C mode keeps a*b+c unfused: results are bitwise
 * those of the baseline build, only wider vectors compute them. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && !defined(__CUDACC__)
#define TPI_CPU_CLONES __attribute__((target_clones("avx2", "default")))
/* Where a loop needs a different form for AVX2 (not only wider vectors), the file has
 * both bodies: TPI_CPU_AVX2 on the AVX2 one, chosen at run time by tpi_cpu_avx2(). */
#define TPI_CPU_AVX2 __attribute__((target("avx2")))
/* Whether the AVX2 bodies run: the CPU has AVX2 and TPI_CPU_BASELINE is unset or 0 (so
 * that tests run the baseline bodies too on any machine). */
int tpi_cpu_avx2(void);
#else
#define TPI_CPU_CLONES
#endif

#endif /* TPI_H */
