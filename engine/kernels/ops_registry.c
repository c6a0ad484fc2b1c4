/*
 * ops_registry.c — picks a backend of the op table by name ("cpu", "cuda",
 * "auto"), and, in builds without CUDA, the stubs that say CUDA is absent
 * (with CUDA the .cu files define ops_cuda_get / ops_cuda_available).
 */
#include <stdio.h>
#include <string.h>

#include "ops.h"

#ifdef TPI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

void ops_device_pci(const struct ops *ops, int device, char *buf, size_t n) {
    snprintf(buf, n, "-");
#ifdef TPI_HAVE_CUDA
    if (ops && strcmp(ops->name, "cuda") == 0 && n >= 16 &&
        cudaDeviceGetPCIBusId(buf, (int)n, device) != cudaSuccess)
        snprintf(buf, n, "?");
#else
    (void)ops;
    (void)device;
#endif
}

#ifndef TPI_HAVE_CUDA
const struct ops *ops_cuda_get(void) {
    return NULL;
}

bool ops_cuda_available(int *n_devices) {
    if (n_devices) *n_devices = 0;
    return false;
}
#endif

int ops_device_mem(const struct ops *ops, size_t *free_bytes, size_t *total_bytes) {
#ifdef TPI_HAVE_CUDA
    if (ops && strcmp(ops->name, "cuda") == 0) {
        size_t f = 0, t = 0;
        if (cudaMemGetInfo(&f, &t) != cudaSuccess) return -1;
        *free_bytes = f;
        *total_bytes = t;
        return 0;
    }
#endif
    (void)ops;
    (void)free_bytes;
    (void)total_bytes;
    return -1;
}

const struct ops *ops_by_name(const char *name, struct tpi_error *err) {
    if (!name || strcmp(name, "auto") == 0) {
        /* auto never fails: the CPU backend is always there */
        const struct ops *cuda = ops_cuda_get();
        int n_devices = 0;
        if (cuda && ops_cuda_available(&n_devices) && n_devices > 0) return cuda;
        return &ops_cpu;
    }
    if (strcmp(name, "cpu") == 0) return &ops_cpu;
    if (strcmp(name, "cuda") == 0) {
        const struct ops *cuda = ops_cuda_get();
        if (!cuda) {
            tpi_err(err, TPI_ERR_UNSUPPORTED,
                    "backend 'cuda' is not available: tpinfer was built without CUDA "
                    "(use --backend cpu, or rebuild with nvcc and -DTPI_CUDA=ON)");
            return NULL;
        }
        int n_devices = 0;
        if (!ops_cuda_available(&n_devices) || n_devices <= 0) {
            tpi_err(err, TPI_ERR_CUDA,
                    "backend 'cuda': no usable GPU (no CUDA driver or device visible; "
                    "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --backend cpu)");
            return NULL;
        }
        return cuda;
    }
    tpi_err(err, TPI_ERR_INVALID, "unknown backend '%s' (expected cpu, cuda or auto)", name);
    return NULL;
}
