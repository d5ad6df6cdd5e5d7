// v5_hopper: the C ABI (kernels/common/evo_sdpa_abi.h) over the per-(dtype, head dim)
// instantiations in inst_*.cu. The kernel itself is attention_kernel.cuh.
// tunables.cuh first: a build with fewer threads than units compiles this file in one unit with the
// instantiations, and tunables.cuh must come before any CuTe header there.
#include "tunables.cuh"

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include <atomic>

#include "evo_sdpa_abi.h"
#include "trace.cuh"

namespace v5_hopper {

template <class Element, int kHeadDim>
int launch(void const* q, void const* k, void const* v, void* o, int batch, int heads, int seq_len,
           bool causal, float scale, cudaStream_t stream);

// Each is instantiated in its inst_*.cu only: where a build merges this file with some of them into
// one unit, launch's definition is visible here, and the others' kernels would be compiled twice.
#define V5_HOPPER_EXTERN_INSTANCE(ELEMENT, HEAD_DIM) \
    extern template int launch<ELEMENT, HEAD_DIM>(void const*, void const*, void const*, void*, int, int, int, bool, \
                                                  float, cudaStream_t);
V5_HOPPER_EXTERN_INSTANCE(cutlass::half_t, 64)
V5_HOPPER_EXTERN_INSTANCE(cutlass::half_t, 128)
V5_HOPPER_EXTERN_INSTANCE(cutlass::bfloat16_t, 64)
V5_HOPPER_EXTERN_INSTANCE(cutlass::bfloat16_t, 128)
#undef V5_HOPPER_EXTERN_INSTANCE

template <class Element>
int dispatch_head_dim(void const* q, void const* k, void const* v, void* o, int B, int H, int S, int D,
                      bool causal, float scale, cudaStream_t stream) {
    switch (D) {
        case 64: return launch<Element, 64>(q, k, v, o, B, H, S, causal, scale, stream);
        case 128: return launch<Element, 128>(q, k, v, o, B, H, S, causal, scale, stream);
        default: return EVO_SDPA_ERR_UNSUPPORTED;
    }
}

}  // namespace v5_hopper

extern "C" int evo_sdpa_abi_version(void) { return EVO_SDPA_ABI_VERSION; }

extern "C" int evo_sdpa_forward(void const* q, void const* k, void const* v, void* o, int B, int H, int S, int D,
                                int causal, float scale, int dtype, void* stream) {
    if (B < 1 || H < 1 || S < 1) return EVO_SDPA_ERR_UNSUPPORTED;
    const auto cuda_stream = static_cast<cudaStream_t>(stream);
    switch (dtype) {
        case EVO_SDPA_FP16:
            return v5_hopper::dispatch_head_dim<cutlass::half_t>(q, k, v, o, B, H, S, D, causal != 0, scale, cuda_stream);
        case EVO_SDPA_BF16:
            return v5_hopper::dispatch_head_dim<cutlass::bfloat16_t>(q, k, v, o, B, H, S, D, causal != 0, scale,
                                                                     cuda_stream);
        default:
            return EVO_SDPA_ERR_UNSUPPORTED;
    }
}

extern "C" const char* evo_sdpa_error_string(int code) {
    if (code == 0) return "success";
    if (code == EVO_SDPA_ERR_UNSUPPORTED) {
        return "unsupported configuration (v5_hopper: sm_90a, fp16/bf16, D in {64,128}, B,H,S >= 1, "
               "scale > 0, q/k/v/o 16-byte aligned)";
    }
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}

#if V5_HOPPER_TRACE
// The diagnostic build's timelines (trace.cuh): one zeroed buffer per process, allocated at the
// first traced launch; scripts/trace_v5.py copies it out and zeroes it between measurements.
extern "C" v5_hopper::trace::Buffer* v5_hopper_trace_buffer() {
    using Buffer = v5_hopper::trace::Buffer;
    static Buffer* const buffer = []() -> Buffer* {
        Buffer* b = nullptr;
        if (cudaMalloc(&b, sizeof(Buffer)) != cudaSuccess || cudaMemset(b, 0, sizeof(Buffer)) != cudaSuccess) {
            return nullptr;
        }
        return b;
    }();
    return buffer;
}

// Traced launches since the last reset. A graph captured after a reset bakes its launches' rows into
// its nodes, so its replays rewrite the same rows in the same order.
static std::atomic<unsigned long long> trace_launches{0};

extern "C" EVO_SDPA_EXPORT int v5_hopper_trace_next_call() {
    return int(trace_launches.fetch_add(1, std::memory_order_relaxed) % v5_hopper::trace::kCalls);
}

extern "C" EVO_SDPA_EXPORT unsigned long long v5_hopper_trace_launches(void) {
    return trace_launches.load(std::memory_order_relaxed);
}

extern "C" EVO_SDPA_EXPORT size_t v5_hopper_trace_bytes(void) { return sizeof(v5_hopper::trace::Buffer); }

// The buffer as the device holds it, with `calls` (its first word) set to the launches since the reset.
extern "C" EVO_SDPA_EXPORT int v5_hopper_trace_copy(void* host) {
    auto* buffer = v5_hopper_trace_buffer();
    if (buffer == nullptr) return int(cudaErrorMemoryAllocation);
    const cudaError_t copied = cudaMemcpy(host, buffer, sizeof(*buffer), cudaMemcpyDeviceToHost);
    if (copied == cudaSuccess) {
        static_cast<v5_hopper::trace::Buffer*>(host)->calls = trace_launches.load(std::memory_order_relaxed);
    }
    return int(copied);
}

extern "C" EVO_SDPA_EXPORT int v5_hopper_trace_reset(void) {
    auto* buffer = v5_hopper_trace_buffer();
    if (buffer == nullptr) return int(cudaErrorMemoryAllocation);
    trace_launches.store(0, std::memory_order_relaxed);
    return int(cudaMemset(buffer, 0, sizeof(*buffer)));
}
#endif
