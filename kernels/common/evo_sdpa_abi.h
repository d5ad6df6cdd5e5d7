// The C ABI every CUDA variant exports. The pipeline compiles a variant with nvcc into a
// shared library and calls it through one ctypes binding (scripts/evo_sdpa/cuda_abi.py), so
// an edit to a kernel costs one nvcc run, never a torch extension rebuild.
//
// Tensors are contiguous [B, H, S, D] (SDPA's native layout), q/k/v/o share shape and dtype.
#pragma once
#include <cuda_runtime.h>

#define EVO_SDPA_ABI_VERSION 1

enum evo_sdpa_dtype { EVO_SDPA_FP16 = 0, EVO_SDPA_BF16 = 1 };

// Returned for a configuration the variant does not support (checked before any launch).
#define EVO_SDPA_ERR_UNSUPPORTED (-1)

// The ABI stays exported when a variant builds with -fvisibility=hidden (everything else of the
// library then stays private to it, so two builds of one variant can share a process).
#define EVO_SDPA_EXPORT __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

EVO_SDPA_EXPORT int evo_sdpa_abi_version(void);

// Launches the forward pass on `stream` (a cudaStream_t). Returns 0, EVO_SDPA_ERR_UNSUPPORTED,
// or the cudaError_t of the launch.
EVO_SDPA_EXPORT int evo_sdpa_forward(const void* q, const void* k, const void* v, void* o,
                     int B, int H, int S, int D, int causal, float scale,
                     int dtype, void* stream);

// Human-readable text for a code returned by evo_sdpa_forward.
EVO_SDPA_EXPORT const char* evo_sdpa_error_string(int code);

#ifdef __cplusplus
}
#endif
