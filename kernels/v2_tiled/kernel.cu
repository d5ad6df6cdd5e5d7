// v2_tiled: the second rung of the ladder. Online-softmax attention forward on CUDA cores
// (fp32 FFMA, no tensor cores) with Q, K, V tiles in shared memory.
//
// A block owns BLOCK_M query rows of one (batch, head) and keeps their Q tile in shared memory;
// it streams key tiles of BLOCK_N keys (K and V, 16-byte global loads, widened to fp32 once)
// through shared memory. Each thread computes a 4 x BLOCK_N/8 register tile of scores, so every
// K value read from shared memory feeds 4 query rows and every Q value BLOCK_N/8 keys; P goes
// through a per-warp slice of shared memory and each thread accumulates a 4 x HEAD_DIM/8 tile
// of the output. Thread layout and shared-memory layout: tile_config.cuh.
//
// Tunables (set with -D): V2_TILED_BLOCK_M (default 64), V2_TILED_BLOCK_N_D64 (default 64),
// V2_TILED_BLOCK_N_D128 (default 32: 64 would need 119 KB of shared memory, over an L4's 99 KB).
#include <climits>
#include <cstdint>

#include "evo_sdpa_abi.h"

#include "dtype_traits.cuh"
#include "online_softmax.cuh"
#include "tile_config.cuh"
#include "tile_indexing.cuh"
#include "tile_io.cuh"

#ifndef V2_TILED_BLOCK_M
#error "V2_TILED_BLOCK_M undefined: the build passes it from variant.yaml (tunables.BLOCK_M)"
#endif
#ifndef V2_TILED_BLOCK_N_D64
#error "V2_TILED_BLOCK_N_D64 undefined: the build passes it from variant.yaml (tunables.BLOCK_N_D64)"
#endif
#ifndef V2_TILED_BLOCK_N_D128
#error "V2_TILED_BLOCK_N_D128 undefined: the build passes it from variant.yaml (tunables.BLOCK_N_D128)"
#endif

namespace v2_tiled {

constexpr float kLog2e = 1.4426950408889634f;

template <int HEAD_DIM>
struct DefaultConfig;
template <>
struct DefaultConfig<64> { using type = TileConfig<64, V2_TILED_BLOCK_M, V2_TILED_BLOCK_N_D64>; };
template <>
struct DefaultConfig<128> { using type = TileConfig<128, V2_TILED_BLOCK_M, V2_TILED_BLOCK_N_D128>; };

__device__ __forceinline__ float4 lds128(const float* p) { return *reinterpret_cast<const float4*>(p); }

__device__ __forceinline__ float component(float4 x, int t) {  // t is a compile-time constant after unrolling
    return t == 0 ? x.x : t == 1 ? x.y : t == 2 ? x.z : x.w;
}

__device__ __forceinline__ void fma4(float4& acc, float a, float4 b) {
    acc.x = fmaf(a, b.x, acc.x);
    acc.y = fmaf(a, b.y, acc.y);
    acc.z = fmaf(a, b.z, acc.z);
    acc.w = fmaf(a, b.w, acc.w);
}

// Scores of the thread's 4 rows x BLOCK_N/8 keys: s[i][j] = q_row(i) . k_key(j), in log2 units.
// Per 4 dims: 4 Q reads (4 distinct rows per warp, broadcast over lane_in_row) and BLOCK_N/8 K
// reads (8 consecutive keys per warp, 4 banks apart: one conflict-free wavefront each), then
// 16 * BLOCK_N/8 FFMA.
template <typename Cfg>
__device__ __forceinline__ void tile_scores(const float* __restrict__ q_s, const float* __restrict__ k_s,
                                            const ThreadLayout& layout,
                                            float (&s)[kRowsPerThread][Cfg::kKeysPerThread]) {
    constexpr int kTN = Cfg::kKeysPerThread;
    constexpr int kRowStep = kRowsPerThread * Cfg::kQkvStride;  // floats between the thread's rows
    constexpr int kKeyStep = kLanesPerRow * Cfg::kQkvStride;    // floats between the thread's keys
    const float* q_rows = q_s + layout.tile_row(0) * Cfg::kQkvStride;
    const float* k_rows = k_s + layout.tile_key(0) * Cfg::kQkvStride;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
        for (int j = 0; j < kTN; ++j) s[i][j] = 0.0f;
    }
#pragma unroll 4
    for (int d = 0; d < Cfg::HEAD_DIM; d += kFloatsPerLds) {
        float4 q4[kRowsPerThread];
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) q4[i] = lds128(q_rows + i * kRowStep + d);
#pragma unroll
        for (int j = 0; j < kTN; ++j) {
            const float4 k4 = lds128(k_rows + j * kKeyStep + d);
#pragma unroll
            for (int i = 0; i < kRowsPerThread; ++i) {
                s[i][j] = fmaf(q4[i].x, k4.x, s[i][j]);
                s[i][j] = fmaf(q4[i].y, k4.y, s[i][j]);
                s[i][j] = fmaf(q4[i].z, k4.z, s[i][j]);
                s[i][j] = fmaf(q4[i].w, k4.w, s[i][j]);
            }
        }
    }
}

// acc[i][c] += sum over the tile's keys of P[row i][key] * V[key][dims of chunk c].
// Per 4 keys: 4 P reads (4 rows per warp, broadcast over lane_in_row) and 4 * HEAD_DIM/32 V
// reads (the warp reads 32 contiguous floats of one key row: one wavefront, broadcast over
// row_group), then 64 * HEAD_DIM/32 FFMA.
template <typename Cfg>
__device__ __forceinline__ void accumulate_pv(const float* __restrict__ p_s, const float* __restrict__ v_s,
                                              const ThreadLayout& layout,
                                              float4 (&acc)[kRowsPerThread][Cfg::kDimChunksPerThread]) {
    constexpr int kDC = Cfg::kDimChunksPerThread;
    constexpr int kPRowStep = kRowsPerThread * Cfg::kPStride;
    constexpr int kChunkStep = kLanesPerRow * kFloatsPerLds;
    const float* p_rows = p_s + layout.tile_row(0) * Cfg::kPStride;
    const float* v_cols = v_s + layout.first_dim(0);
#pragma unroll 2
    for (int key = 0; key < Cfg::BLOCK_N; key += kFloatsPerLds) {
        float4 p4[kRowsPerThread];
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) p4[i] = lds128(p_rows + i * kPRowStep + key);
#pragma unroll
        for (int t = 0; t < kFloatsPerLds; ++t) {
#pragma unroll
            for (int c = 0; c < kDC; ++c) {
                const float4 v4 = lds128(v_cols + (key + t) * Cfg::kQkvStride + c * kChunkStep);
#pragma unroll
                for (int i = 0; i < kRowsPerThread; ++i) fma4(acc[i][c], component(p4[i], t), v4);
            }
        }
    }
}

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
v2_tiled_attention_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       T* __restrict__ o, int seq_len, int heads_total, int row_blocks, bool causal,
                       float scale_log2) {
    constexpr int kTN = Cfg::kKeysPerThread;
    constexpr int kDC = Cfg::kDimChunksPerThread;

    extern __shared__ float4 smem_f4[];  // float4: the tiles are read with 16-byte accesses
    float* q_s = reinterpret_cast<float*>(smem_f4);
    float* k_s = q_s + Cfg::kQFloats;
    float* v_s = k_s + Cfg::kKFloats;
    float* p_s = v_s + Cfg::kVFloats;

    const BlockCoords coords = block_coords(heads_total, row_blocks);
    const int first_row = coords.row_block * Cfg::BLOCK_M;
    const T* q_head = head_ptr<Cfg::HEAD_DIM>(q, coords.head, seq_len);
    const T* k_head = head_ptr<Cfg::HEAD_DIM>(k, coords.head, seq_len);
    const T* v_head = head_ptr<Cfg::HEAD_DIM>(v, coords.head, seq_len);
    const ThreadLayout layout = ThreadLayout::of_thread();

    // Q tile once, pre-multiplied by scale*log2(e): scores come out in log2 units, no multiply
    // per score. Made visible by the barrier before the first key tile is used.
    {
        TileCopy<T, Cfg, Cfg::BLOCK_M> q_copy;
        q_copy.fetch(q_head, first_row, seq_len);
        q_copy.stash(q_s, scale_log2);
    }

    int key_end[kRowsPerThread];  // row i attends keys [0, key_end[i])
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) key_end[i] = key_limit(first_row + layout.tile_row(i), seq_len, causal);

    OnlineSoftmaxRows<kRowsPerThread> softmax;
    float4 acc[kRowsPerThread][kDC];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
        for (int c = 0; c < kDC; ++c) acc[i][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }

    const int key_tiles = key_tile_count<Cfg::BLOCK_M, Cfg::BLOCK_N>(coords.row_block, seq_len, causal);
    for (int tile = 0; tile < key_tiles; ++tile) {
        const int first_key = tile * Cfg::BLOCK_N;

        // K and V tiles: the global loads are issued before the barrier, so their latency
        // overlaps other warps still finishing the previous tile.
        TileCopy<T, Cfg, Cfg::BLOCK_N> k_copy;
        TileCopy<T, Cfg, Cfg::BLOCK_N> v_copy;
        k_copy.fetch(k_head, first_key, seq_len);
        v_copy.fetch(v_head, first_key, seq_len);
        if (tile > 0) __syncthreads();  // every warp is done reading the previous K/V tile
        k_copy.stash(k_s, 1.0f);
        v_copy.stash(v_s, 1.0f);
        __syncthreads();  // the K/V tile (and Q, on the first pass) visible to every warp

        float s[kRowsPerThread][kTN];
        tile_scores<Cfg>(q_s, k_s, layout, s);

        // Mask: keys past S, and causal keys right of the diagonal, get -inf before the max.
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
            for (int j = 0; j < kTN; ++j) {
                if (first_key + layout.tile_key(j) >= key_end[i]) s[i][j] = -INFINITY;
            }
        }

#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
            // Steps 1-2: running max over the row's tile scores, rescale l and acc.
            float lane_max = s[i][0];
#pragma unroll
            for (int j = 1; j < kTN; ++j) lane_max = fmaxf(lane_max, s[i][j]);
            const float alpha = softmax.advance_max(i, lane_max);
#pragma unroll
            for (int c = 0; c < kDC; ++c) {
                acc[i][c].x *= alpha;
                acc[i][c].y *= alpha;
                acc[i][c].z *= alpha;
                acc[i][c].w *= alpha;
            }
            // Step 3 (first half): p = exp2(s - m) into the warp's own rows of the P tile.
            float* p_row = p_s + layout.tile_row(i) * Cfg::kPStride;
#pragma unroll
            for (int j = 0; j < kTN; ++j) p_row[layout.tile_key(j)] = softmax.probability(i, s[i][j]);
        }
        // P rows are private to the warp that owns them: a warp barrier suffices. The next
        // overwrite of P comes after the next tile's __syncthreads.
        __syncwarp();

        // Step 3 (second half): acc += P V.
        accumulate_pv<Cfg>(p_s, v_s, layout, acc);
    }

    // Epilogue: normalise by the softmax sum; rows >= S are never written.
    T* o_head = head_ptr<Cfg::HEAD_DIM>(o, coords.head, seq_len);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
        const float inv_sum = softmax.inverse_sum(i);  // all lanes: it shuffles
        const int row = first_row + layout.tile_row(i);
        if (row < seq_len) {
#pragma unroll
            for (int c = 0; c < kDC; ++c) {
                const float4 a = acc[i][c];
                store_out4<T, Cfg::HEAD_DIM>(o_head, row, layout.first_dim(c),
                                            make_float4(a.x * inv_sum, a.y * inv_sum, a.z * inv_sum, a.w * inv_sum));
            }
        }
    }
}

// The 16-byte global loads need every base pointer 16-byte aligned (torch allocations are
// 256-byte aligned; only an odd storage offset could trip this). Rows are D*2 >= 128 bytes.
constexpr uintptr_t kVectorAlignBytes = 16;

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorAlignBytes == 0; }

template <typename T, int HEAD_DIM>
int launch(const void* q, const void* k, const void* v, void* o, int batch, int heads, int seq_len,
           bool causal, float scale, cudaStream_t stream) {
    using Cfg = typename DefaultConfig<HEAD_DIM>::type;
    if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(o)) return EVO_SDPA_ERR_UNSUPPORTED;
    if (static_cast<int64_t>(seq_len) * HEAD_DIM > INT_MAX) return EVO_SDPA_ERR_UNSUPPORTED;  // 32-bit offsets in a head
    const int64_t heads_total = static_cast<int64_t>(batch) * heads;
    const int row_blocks = ceil_div(seq_len, Cfg::BLOCK_M);
    const int64_t blocks = heads_total * row_blocks;
    if (blocks > INT_MAX) return EVO_SDPA_ERR_UNSUPPORTED;  // gridDim.x limit is 2^31 - 1

    const auto kernel = v2_tiled_attention_fwd<T, Cfg>;
    // Tiles over 48 KB need the opt-in; set once per kernel (host-only call, so it never runs
    // inside a CUDA-graph capture after the first, eager, call).
    static const cudaError_t attr_status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (attr_status != cudaSuccess) return static_cast<int>(attr_status);

    kernel<<<static_cast<unsigned>(blocks), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o),
        seq_len, static_cast<int>(heads_total), row_blocks, causal, scale * kLog2e);
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

}  // namespace v2_tiled

extern "C" int evo_sdpa_abi_version(void) { return EVO_SDPA_ABI_VERSION; }

extern "C" int evo_sdpa_forward(const void* q, const void* k, const void* v, void* o, int B, int H,
                                int S, int D, int causal, float scale, int dtype, void* stream) {
    if (B < 1 || H < 1 || S < 1) return EVO_SDPA_ERR_UNSUPPORTED;
    const auto cuda_stream = static_cast<cudaStream_t>(stream);
    const bool is_causal = causal != 0;
    switch (dtype) {
        case EVO_SDPA_FP16:
            return v2_tiled::dispatch_head_dim<__half>(q, k, v, o, B, H, S, D, is_causal, scale, cuda_stream);
        case EVO_SDPA_BF16:
            return v2_tiled::dispatch_head_dim<__nv_bfloat16>(q, k, v, o, B, H, S, D, is_causal, scale, cuda_stream);
        default:
            return EVO_SDPA_ERR_UNSUPPORTED;
    }
}

extern "C" const char* evo_sdpa_error_string(int code) {
    if (code == 0) return "success";
    if (code == EVO_SDPA_ERR_UNSUPPORTED) {
        return "unsupported configuration (v2_tiled: fp16/bf16, D in {64,128}, B,H,S >= 1, "
               "pointers 16-byte aligned, S*D < 2^31)";
    }
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
