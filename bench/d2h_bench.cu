/*
 * d2h_bench.cu — how fast a copy of a step's logits (n rows x 151936 f32) reaches the host
 * on this machine, by the kind of host memory it lands in: cudaHostAlloc's pinned pages,
 * pages the process faulted in as transparent huge pages and then registered
 * (cudaHostRegister), and pageable malloc; each device-to-host and host-to-device, whole
 * and in pieces. bench/NOTES.md change 153 (run 258's traces put the batch command's
 * 19.4 MB logits copy at ~6 GB/s where the weight upload ran at ~52).
 *
 *   nvcc -O2 -o /tmp/d2h_bench bench/d2h_bench.cu && /tmp/d2h_bench [ROWS...]
 *
 * Not part of the build: a measuring tool for the device (bench/exp-batch.sh PART=H).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CHECK(x)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define HUGE_BYTES (2u << 20)

/* Host memory of n bytes: 0 cudaHostAlloc, 1 huge pages registered, 2 malloc. */
static void *host_mem(int kind, size_t n) {
    void *p = NULL;
    if (kind == 0) {
        CHECK(cudaHostAlloc(&p, n, cudaHostAllocDefault));
    } else if (kind == 1) {
        const size_t m = (n + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES;
        p = mmap(NULL, m + HUGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) exit(1);
        p = (void *)(((uintptr_t)p + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
        if (madvise(p, m, MADV_HUGEPAGE)) perror("madvise");
        memset(p, 0, m);
        CHECK(cudaHostRegister(p, m, cudaHostRegisterDefault));
    } else {
        p = malloc(n);
        memset(p, 0, n);
    }
    return p;
}

/* GB/s of `reps` copies of n bytes (pieces of `piece` bytes each) on stream s. */
static double rate(void *dst, const void *src, size_t n, size_t piece, cudaMemcpyKind k,
                   cudaStream_t s, int reps) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int warm = 0; warm < 2; warm++) {
        CHECK(cudaEventRecord(a, s));
        for (int r = 0; r < (warm ? reps : 1); r++)
            for (size_t o = 0; o < n; o += piece) {
                const size_t m = n - o < piece ? n - o : piece;
                CHECK(cudaMemcpyAsync((char *)dst + o, (const char *)src + o, m, k, s));
            }
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
    }
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return (double)n * reps / (ms * 1e-3) / 1e9;
}

int main(int argc, char **argv) {
    const size_t vocab = 151936, buf_rows = 96; /* the batch command's logits buffer */
    int rows[8] = {32, 4, 1};
    int n_rows = 3;
    if (argc > 1) {
        n_rows = 0;
        for (int i = 1; i < argc && n_rows < 8; i++) rows[n_rows++] = atoi(argv[i]);
    }
    const size_t cap = buf_rows * vocab * sizeof(float);
    void *dev = NULL;
    CHECK(cudaMalloc(&dev, cap));
    CHECK(cudaMemset(dev, 1, cap));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const char *names[3] = {"cudaHostAlloc", "huge pages + cudaHostRegister", "malloc (pageable)"};
    printf("%-32s %6s %10s %12s %10s %10s\n", "host memory", "rows", "MB", "piece", "D2H GB/s",
           "H2D GB/s");
    for (int kind = 0; kind < 3; kind++) {
        void *h = host_mem(kind, cap);
        for (int i = 0; i < n_rows; i++) {
            const size_t n = (size_t)rows[i] * vocab * sizeof(float);
            const size_t pieces[2] = {n, 1u << 20};
            for (int p = 0; p < 2; p++) {
                if (p == 1 && n <= pieces[1]) continue;
                const double d2h = rate(h, dev, n, pieces[p], cudaMemcpyDeviceToHost, s, 10);
                const double h2d = rate(dev, h, n, pieces[p], cudaMemcpyHostToDevice, s, 10);
                printf("%-32s %6d %10.1f %12s %10.1f %10.1f\n", names[kind], rows[i], n / 1e6,
                       p ? "1 MB" : "whole", d2h, h2d);
            }
        }
        if (kind == 0) CHECK(cudaFreeHost(h));
        else if (kind == 1) CHECK(cudaHostUnregister(h));
        else free(h);
    }
    return 0;
}
