// v1_scalar: the first rung of the ladder. Scalar online-softmax attention forward: no tensor
// cores, no shared-memory tiling. One warp per query row; each lane owns HEAD_DIM/32 elements
// of q and of the fp32 output accumulator; every key's score is a warp-wide dot product.
//
// Tunable: V1_SCALAR_WARPS_PER_BLOCK (query rows per block, default 4), set with -D.
#include <cstdint>
#include <climits>

#include "evo_sdpa_abi.h"

#include "dtype_traits.cuh"
#include "online_softmax.cuh"
#include "row_indexing.cuh"

#ifndef V1_SCALAR_WARPS_PER_BLOCK
#error "V1_SCALAR_WARPS_PER_BLOCK undefined: the build passes it from variant.yaml (tunables.warps_per_block)"
#endif

namespace v1_scalar {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = V1_SCALAR_WARPS_PER_BLOCK;
static_assert(kWarpsPerBlock >= 1 && kWarpsPerBlock <= 32, "V1_SCALAR_WARPS_PER_BLOCK must be 1..32");

// Keys per step of the main loop. 4 independent dot products per step give the scheduler
// 4 shuffle-reduction chains to interleave (latency hiding) and pay the rescale once per 4 keys.
constexpr int kKeysPerStep = 4;

constexpr float kLog2e = 1.4426950408889634f;

// Sum over the 32 lanes, result in every lane. An xor butterfly adds the same two values in
// every lane pair at every level, so all lanes get bit-identical totals (and identical
// softmax state).
__device__ __forceinline__ float warp_allreduce_sum(float x) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    }
    return x;
}

template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarpSize)
v1_scalar_attention_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        T* __restrict__ o, int seq_len, int row_blocks_per_head, bool causal,
                        float scale_log2) {
    constexpr int kElems = HEAD_DIM / kWarpSize;  // elements per lane: 2 (D=64) or 4 (D=128)
    constexpr int kPairs = kElems / 2;
    static_assert(HEAD_DIM % (2 * kWarpSize) == 0, "each lane needs whole element pairs");

    const RowCoords coords = row_of_warp(kWarpsPerBlock, row_blocks_per_head);
    // Whole warp leaves together (the row is warp-uniform), so later full-mask shuffles are safe;
    // the kernel has no __syncthreads.
    if (coords.row >= seq_len) return;
    const int lane = threadIdx.x % kWarpSize;
    const int keys = key_count(coords.row, seq_len, causal);

    // q in fp32, pre-multiplied by scale*log2(e): the score needs no multiply per key.
    float q_f32[kElems];
    load_slice_f32<T, kPairs>(lane_slice<HEAD_DIM>(row_ptr<HEAD_DIM>(q, coords.head, seq_len, coords.row), lane), q_f32);
#pragma unroll
    for (int e = 0; e < kElems; ++e) q_f32[e] *= scale_log2;

    // Key offsets inside one head are 32-bit (launch() checks S*D < 2^31): one IMAD.WIDE per
    // key address instead of a chain of 64-bit integer ops.
    const T* k_lane = lane_slice<HEAD_DIM>(row_ptr<HEAD_DIM>(k, coords.head, seq_len, 0), lane);
    const T* v_lane = lane_slice<HEAD_DIM>(row_ptr<HEAD_DIM>(v, coords.head, seq_len, 0), lane);

    OnlineSoftmaxRow softmax;
    float acc[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[e] = 0.0f;

    for (int first_key = 0; first_key < keys; first_key += kKeysPerStep) {
        // Keys past `keys` (last step only) read the last attended key instead (clamped: always
        // in bounds) and get score -inf, hence p = 0, below.
        float score[kKeysPerStep];
        float v_f32[kKeysPerStep][kElems];
#pragma unroll
        for (int t = 0; t < kKeysPerStep; ++t) {
            const int key = min(first_key + t, keys - 1);
            float k_f32[kElems];
            load_slice_f32<T, kPairs>(k_lane + key * HEAD_DIM, k_f32);
            // V is loaded here, unconditionally, so its latency hides behind the reductions.
            load_slice_f32<T, kPairs>(v_lane + key * HEAD_DIM, v_f32[t]);
            float partial = 0.0f;
#pragma unroll
            for (int e = 0; e < kElems; ++e) partial = fmaf(q_f32[e], k_f32[e], partial);
            score[t] = partial;
        }
        float step_max = -INFINITY;
#pragma unroll
        for (int t = 0; t < kKeysPerStep; ++t) {
            score[t] = warp_allreduce_sum(score[t]);  // the scaled score s_t, log2 units
            if (first_key + t >= keys) score[t] = -INFINITY;  // mask: past S, or j > i when causal
            step_max = fmaxf(step_max, score[t]);
        }

        // Steps 1-2: running max and rescale. step_max is finite: key first_key < keys.
        const float alpha = softmax.advance_max(step_max);
#pragma unroll
        for (int e = 0; e < kElems; ++e) acc[e] *= alpha;

        // Step 3: accumulate. A masked key adds p = 0 times the V row of an attended key (the
        // clamped one), so it changes nothing and cannot bring in a non-finite value that the
        // attended keys do not already bring.
#pragma unroll
        for (int t = 0; t < kKeysPerStep; ++t) {
            const float p = softmax.probability(score[t]);
#pragma unroll
            for (int e = 0; e < kElems; ++e) acc[e] = fmaf(p, v_f32[t][e], acc[e]);
        }
    }

    // Epilogue: normalise by the softmax sum and write the lane's slice once.
    const float inv_sum = softmax.inverse_sum();
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[e] *= inv_sum;
    store_slice<T, kPairs>(lane_slice<HEAD_DIM>(row_ptr<HEAD_DIM>(o, coords.head, seq_len, coords.row), lane), acc);
}

// Bytes the vector loads/stores of one lane need the base pointers aligned to.
constexpr int slice_alignment_bytes(int head_dim) { return (head_dim / kWarpSize) * 2; }

inline bool aligned(const void* p, int bytes) {
    return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

template <typename T, int HEAD_DIM>
int launch(const void* q, const void* k, const void* v, void* o, int batch, int heads, int seq_len,
           bool causal, float scale, cudaStream_t stream) {
    const int align = slice_alignment_bytes(HEAD_DIM);
    if (!aligned(q, align) || !aligned(k, align) || !aligned(v, align) || !aligned(o, align)) {
        return EVO_SDPA_ERR_UNSUPPORTED;
    }
    if (static_cast<int64_t>(seq_len) * HEAD_DIM > INT_MAX) return EVO_SDPA_ERR_UNSUPPORTED;  // 32-bit key offsets
    const int row_blocks_per_head = ceil_div(seq_len, kWarpsPerBlock);
    const int64_t blocks = static_cast<int64_t>(row_blocks_per_head) * batch * heads;
    if (blocks > INT_MAX) return EVO_SDPA_ERR_UNSUPPORTED;  // gridDim.x limit is 2^31 - 1
    v1_scalar_attention_fwd<T, HEAD_DIM><<<static_cast<unsigned>(blocks), kWarpsPerBlock * kWarpSize, 0, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o),
        seq_len, row_blocks_per_head, causal, scale * kLog2e);
    return static_cast<int>(cudaGetLastError());
}

template <typename T>
int dispatch_head_dim(const void* q, const void* k, const void* v, void* o, int batch, int heads,
                      int seq_len, int head_dim, bool causal, float scale, cudaStream_t stream) {
    switch (head_dim) {
        case 64: return launch<T, 64>(q, k, v, o, batch, heads, seq_len, causal, scale, stream);
        case 128: return launch<T, 128>(q, k, v, o, batch, heads, seq_len, causal, scale, stream);
        default: return EVO_SDPA_ERR_UNSUPPORTED;
    }
}

}  // namespace v1_scalar

extern "C" int evo_sdpa_abi_version(void) { return EVO_SDPA_ABI_VERSION; }

extern "C" int evo_sdpa_forward(const void* q, const void* k, const void* v, void* o, int B, int H,
                                int S, int D, int causal, float scale, int dtype, void* stream) {
    if (B < 1 || H < 1 || S < 1) return EVO_SDPA_ERR_UNSUPPORTED;
    const auto cuda_stream = static_cast<cudaStream_t>(stream);
    const bool is_causal = causal != 0;
    switch (dtype) {
        case EVO_SDPA_FP16:
            return v1_scalar::dispatch_head_dim<__half>(q, k, v, o, B, H, S, D, is_causal, scale, cuda_stream);
        case EVO_SDPA_BF16:
            return v1_scalar::dispatch_head_dim<__nv_bfloat16>(q, k, v, o, B, H, S, D, is_causal, scale, cuda_stream);
        default:
            return EVO_SDPA_ERR_UNSUPPORTED;
    }
}

extern "C" const char* evo_sdpa_error_string(int code) {
    if (code == 0) return "success";
    if (code == EVO_SDPA_ERR_UNSUPPORTED) {
        return "unsupported configuration (v1_scalar: fp16/bf16, D in {64,128}, B,H,S >= 1, "
               "pointers aligned to the lane slice)";
    }
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
