// v3_mma: the third rung of the ladder. FlashAttention-2 style forward on the tensor cores with
// mma.sync m16n8k16 (fp16 or bf16 in, fp32 accumulate):
//   - a CTA of 4 warps owns 64 query rows of one (batch, head); each warp owns 16 rows, so every
//     row's softmax statistics live in one warp (in the 4 lanes of a quad);
//   - Q is copied to shared memory once and kept in registers as mma A fragments;
//   - K and V tiles of kBlockN keys stream through swizzled shared memory (cp.async, one stage;
//     the next K tile loads under P*V, the next V tile under Q*K^T and the softmax);
//   - S = Q K^T in fp32 registers, online softmax in fp32, P reused from the S registers as the
//     A operand of O += P V, O normalised once at the end.
// Files: tile_traits.cuh (tile shape), tile_layout.cuh (indices, swizzle, copies),
// mma_primitives.cuh (PTX wrappers), main_loop.cuh (the two products), online_softmax.cuh,
// epilogue.cuh.
//
// Tunable: V3_MMA_BLOCK_N (keys per main-loop step, 32 or 64; default 64), set with -D.
#include <climits>
#include <cmath>
#include <cstdint>

#include "evo_sdpa_abi.h"

#include "sm80_epilogue.cuh"
#include "sm80_main_loop.cuh"
#include "sm80_mma_primitives.cuh"
#include "sm80_online_softmax.cuh"
#include "tile_layout.cuh"
#include "tile_traits.cuh"

namespace v3_mma {

constexpr float kLog2e = 1.4426950408889634f;

// What one warp carries through the main loop.
template <class Tr>
struct WarpState {
    uint32_t q_frag[Tr::kQkSteps][4];  // the warp's 16 query rows, as A fragments
    float o[Tr::kOutTiles][4];         // unnormalised output, fp32 C fragments
    OnlineSoftmax<Tr> softmax;
};

// One key tile: wait for K, S = Q K^T, mask (diagonal / ragged tile only), online softmax, wait
// for V, O += P V. Loads of the next tile are issued as soon as the buffer they overwrite is
// free: K_{t+1} right after every warp has finished reading K_t (it then flies under P*V), V_{t+1}
// after P*V (it flies under the next Q*K^T and softmax). One buffer each: v4 adds stages.
template <class Tr, typename T>
__device__ __forceinline__ void attend_key_tile(WarpState<Tr>& ws, int tile, int tile_end, T* smem_k, T* smem_v,
                                                const T* k_head, const T* v_head, int first_row, int first_row_of_warp,
                                                int seq_len, bool causal, float scale_log2, int lane) {
    const int first_key = tile * Tr::kBlockN;
    const bool has_next = tile + 1 < tile_end;

    cp_async_wait<1>();  // this thread's copies of K_tile have landed (V_tile may still fly)
    __syncthreads();     // ... and every thread's

    float s[Tr::kScoreTiles][4];
    compute_scores<Tr>(s, ws.q_frag, smem_k, lane);
    if (key_tile_needs_mask(first_key, Tr::kBlockN, first_row, seq_len, causal)) {
        mask_scores<Tr>(s, first_row_of_warp, first_key, seq_len, causal, lane);
    }
    uint32_t p_frag[Tr::kScoreTiles][2];
    ws.softmax.step(s, ws.o, p_frag, scale_log2);

    cp_async_wait<0>();  // V_tile has landed
    __syncthreads();     // every warp is done with K_tile, and sees all of V_tile
    if (has_next) {
        load_tile_async<Tr, Tr::kBlockN>(smem_k, k_head, first_key + Tr::kBlockN, seq_len);
        cp_async_commit();
    }

    accumulate_pv<Tr>(ws.o, p_frag, smem_v, lane);

    __syncthreads();  // every warp is done with V_tile
    if (has_next) {
        load_tile_async<Tr, Tr::kBlockN>(smem_v, v_head, first_key + Tr::kBlockN, seq_len);
        cp_async_commit();
    }
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinCtasPerSm)
v3_mma_attention_fwd(const typename Tr::elem_t* __restrict__ q, const typename Tr::elem_t* __restrict__ k,
                     const typename Tr::elem_t* __restrict__ v, typename Tr::elem_t* __restrict__ o, int seq_len,
                     bool causal, float scale_log2) {
    using T = typename Tr::elem_t;
    // Raw 16-byte words (no constructors run on __shared__), carved into the Q, K and V tiles.
    __shared__ uint4 smem_raw[Tr::kSmemBytes / 16];
    T* smem_q = reinterpret_cast<T*>(smem_raw);
    T* smem_k = smem_q + Tr::kQTileElems;
    T* smem_v = smem_k + Tr::kKvTileElems;

    const CtaCoords cta = cta_coords();
    const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
    const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
    const int first_row = cta.query_tile * Tr::kBlockM;
    const int first_row_of_warp = first_row + warp * Tr::kRowsPerWarp;
    const T* q_head = head_row_ptr<Tr::kHeadDim>(q, cta.head, seq_len, 0);
    const T* k_head = head_row_ptr<Tr::kHeadDim>(k, cta.head, seq_len, 0);
    const T* v_head = head_row_ptr<Tr::kHeadDim>(v, cta.head, seq_len, 0);
    const int tile_end = key_tile_end(first_row, Tr::kBlockM, Tr::kBlockN, seq_len, causal);

    // Three copy groups: Q, K_0, V_0.
    load_tile_async<Tr, Tr::kBlockM>(smem_q, q_head, first_row, seq_len);
    cp_async_commit();
    load_tile_async<Tr, Tr::kBlockN>(smem_k, k_head, 0, seq_len);
    cp_async_commit();
    load_tile_async<Tr, Tr::kBlockN>(smem_v, v_head, 0, seq_len);
    cp_async_commit();

    WarpState<Tr> ws;
    cp_async_wait<2>();  // Q has landed
    __syncthreads();
    load_q_fragments<Tr>(ws.q_frag, smem_q, warp, lane);
#pragma unroll
    for (int d = 0; d < Tr::kOutTiles; ++d) {
#pragma unroll
        for (int e = 0; e < 4; ++e) ws.o[d][e] = 0.0f;
    }

    for (int tile = 0; tile < tile_end; ++tile) {
        attend_key_tile<Tr>(ws, tile, tile_end, smem_k, smem_v, k_head, v_head, first_row, first_row_of_warp, seq_len,
                            causal, scale_log2, lane);
    }

    write_output<Tr>(ws.o, ws.softmax, smem_q, head_row_ptr<Tr::kHeadDim>(o, cta.head, seq_len, 0),
                     warp * Tr::kRowsPerWarp, first_row_of_warp, seq_len, lane);
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, int HEAD_DIM>
int launch(const void* q, const void* k, const void* v, void* o, int batch, int heads, int seq_len, bool causal,
           float scale, cudaStream_t stream) {
    using Tr = TileTraits<T, HEAD_DIM>;
    if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(o)) return EVO_SDPA_ERR_UNSUPPORTED;  // 16-byte copies
    if (!(scale > 0.0f) || !std::isfinite(scale)) return EVO_SDPA_ERR_UNSUPPORTED;  // softmax assumes scale > 0
    if (static_cast<int64_t>(seq_len) * HEAD_DIM > INT_MAX) return EVO_SDPA_ERR_UNSUPPORTED;  // 32-bit row offsets
    const int query_tiles = ceil_div(seq_len, Tr::kBlockM);
    const int64_t heads_total = static_cast<int64_t>(batch) * heads;
    if (query_tiles > 65535 || heads_total > INT_MAX) return EVO_SDPA_ERR_UNSUPPORTED;  // gridDim.y / gridDim.x limits
    const dim3 grid(static_cast<unsigned>(heads_total), static_cast<unsigned>(query_tiles));
    v3_mma_attention_fwd<Tr><<<grid, Tr::kThreads, 0, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o), seq_len,
        causal, scale * kLog2e);
    return static_cast<int>(cudaGetLastError());
}

template <typename T>
int dispatch_head_dim(const void* q, const void* k, const void* v, void* o, int batch, int heads, int seq_len,
                      int head_dim, bool causal, float scale, cudaStream_t stream) {
    switch (head_dim) {
        case 64: return launch<T, 64>(q, k, v, o, batch, heads, seq_len, causal, scale, stream);
        case 128: return launch<T, 128>(q, k, v, o, batch, heads, seq_len, causal, scale, stream);
        default: return EVO_SDPA_ERR_UNSUPPORTED;
    }
}

}  // namespace v3_mma

extern "C" int evo_sdpa_abi_version(void) { return EVO_SDPA_ABI_VERSION; }

extern "C" int evo_sdpa_forward(const void* q, const void* k, const void* v, void* o, int B, int H, int S, int D,
                                int causal, float scale, int dtype, void* stream) {
    if (B < 1 || H < 1 || S < 1) return EVO_SDPA_ERR_UNSUPPORTED;
    const auto cuda_stream = static_cast<cudaStream_t>(stream);
    const bool is_causal = causal != 0;
    switch (dtype) {
        case EVO_SDPA_FP16:
            return v3_mma::dispatch_head_dim<__half>(q, k, v, o, B, H, S, D, is_causal, scale, cuda_stream);
        case EVO_SDPA_BF16:
            return v3_mma::dispatch_head_dim<__nv_bfloat16>(q, k, v, o, B, H, S, D, is_causal, scale, cuda_stream);
        default:
            return EVO_SDPA_ERR_UNSUPPORTED;
    }
}

extern "C" const char* evo_sdpa_error_string(int code) {
    if (code == 0) return "success";
    if (code == EVO_SDPA_ERR_UNSUPPORTED) {
        return "unsupported configuration (v3_mma: fp16/bf16, D in {64,128}, B,H,S >= 1, S <= 65535*64, scale > 0, "
               "q/k/v/o 16-byte aligned)";
    }
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
