// v2_tiled: moving tiles between global and shared memory. Global traffic is 16-byte vector
// accesses (8 fp16/bf16 elements); tiles live in shared memory as fp32, widened once on the
// way in, so the inner loops are LDS.128 + FFMA with no conversion per reuse (each K/V value
// is reused by BLOCK_M/4 threads, each Q value by every key).
#pragma once
#include "dtype_traits.cuh"
#include "tile_config.cuh"

namespace v2_tiled {

// A ROWS x HEAD_DIM tile of one head, copied in two phases so that all of a thread's 16-byte
// global loads (for K and V together) are in flight before the first one is waited on:
//   fetch(): global -> registers (rows >= S read as zeros, never out of bounds)
//   stash(): registers -> fp32 shared memory
template <typename T, typename Cfg, int ROWS>
struct TileCopy {
    static constexpr int kChunks = ROWS * Cfg::kChunksPerRow;
    static constexpr int kChunksPerThread = kChunks / Cfg::kThreads;
    static constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kChunksPerRow;
    static_assert(kChunks % Cfg::kThreads == 0 && Cfg::kThreads % Cfg::kChunksPerRow == 0,
                  "a tile must split evenly into 16-byte chunks per thread");

    uint4 bits[kChunksPerThread];

    // The thread's chunk column is the same in every pass: 8*chunk_col is its first element.
    static __device__ __forceinline__ int chunk_col() { return static_cast<int>(threadIdx.x) % Cfg::kChunksPerRow; }
    static __device__ __forceinline__ int chunk_row(int pass) {
        return static_cast<int>(threadIdx.x) / Cfg::kChunksPerRow + pass * kRowsPerPass;
    }

    // Rows [first_row, first_row + ROWS) of the head at `head_base`; rows >= seq_len are zeros
    // (zero K gives finite masked scores, zero V adds 0 * 0 for a masked p = 0).
    __device__ __forceinline__ void fetch(const T* __restrict__ head_base, int first_row, int seq_len) {
#pragma unroll
        for (int pass = 0; pass < kChunksPerThread; ++pass) {
            const int row = first_row + chunk_row(pass);
            bits[pass] = make_uint4(0u, 0u, 0u, 0u);
            if (row < seq_len) {
                bits[pass] = *reinterpret_cast<const uint4*>(head_base + row * Cfg::HEAD_DIM +
                                                             chunk_col() * kElemsPerChunk);
            }
        }
    }

    // Widens to fp32 (times `scale`) and writes the padded shared tile (Cfg::kQkvStride floats a row).
    __device__ __forceinline__ void stash(float* __restrict__ tile, float scale) const {
        // A chunk is 32 bytes of fp32 written as two STS.128. Chunks 4-7 of each 8 store their
        // high half first: the 8 threads of a 128-bit store phase then cover all 32 banks
        // (in natural order chunks c and c+4 share banks: a 2-way conflict on every store).
        const int first_half = (chunk_col() / 4) & 1;  // 0: low half first, 1: high half first
        float4* tile4 = reinterpret_cast<float4*>(tile);
        constexpr int kStride4 = Cfg::kQkvStride / kFloatsPerLds;  // float4s per row
#pragma unroll
        for (int pass = 0; pass < kChunksPerThread; ++pass) {
            const ChunkF32 f = widen_chunk<T>(bits[pass], scale);
            float4* dst = tile4 + chunk_row(pass) * kStride4 + 2 * chunk_col();
            dst[first_half] = first_half ? f.hi : f.lo;
            dst[1 - first_half] = first_half ? f.lo : f.hi;
        }
    }
};

// Epilogue store of 4 output values (already normalised) of row `row`, dims [dim, dim+4): one
// 8-byte store; 8 lanes of a row group write 64 contiguous bytes per dim chunk.
template <typename T, int HEAD_DIM>
__device__ __forceinline__ void store_out4(T* __restrict__ head_base, int row, int dim, float4 value) {
    uint2* row4 = reinterpret_cast<uint2*>(head_base + row * HEAD_DIM);  // 4 elements per uint2
    row4[dim / 4] = narrow4<T>(value);
}

}  // namespace v2_tiled
