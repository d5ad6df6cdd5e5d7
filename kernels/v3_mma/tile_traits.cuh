// v3_mma: the tile shape and the element type, in one traits struct, so one kernel template
// serves head dims 64 and 128 and both fp16 and bf16.
//
// A CTA of kWarps warps owns kBlockM = 16*kWarps query rows of one (batch, head); each warp owns
// 16 of them (one m16 row block of the mma). Keys stream through shared memory kBlockN at a time.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>  // memcpy

#include "sm80_mma_primitives.cuh"

#ifndef V3_MMA_BLOCK_N
#error "V3_MMA_BLOCK_N undefined: the build passes it from variant.yaml (tunables.block_n)"
#endif

#ifndef V3_MMA_MIN_CTAS_D64
#error "V3_MMA_MIN_CTAS_D64 undefined: the build passes it from variant.yaml (tunables.min_ctas_d64)"
#endif

namespace v3_mma {

// kWarpSize, ElementTraits and the instruction wrappers: kernels/common/sm80_mma_primitives.cuh.
using namespace evo_sm80;

template <typename T, int HEAD_DIM, int BLOCK_N = V3_MMA_BLOCK_N>
struct TileTraits {
    using elem_t = T;
    using elem_traits = ElementTraits<T>;

    static constexpr int kHeadDim = HEAD_DIM;
    static constexpr int kWarps = 4;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kRowsPerWarp = 16;                 // the mma's M
    static constexpr int kBlockM = kWarps * kRowsPerWarp;   // query rows per CTA
    static constexpr int kBlockN = BLOCK_N;                 // keys per main-loop step

    // Shared-memory rows are cut in 16-byte chunks: the unit of cp.async, of ldmatrix's row
    // reads and of the swizzle.
    static constexpr int kChunkElems = 16 / sizeof(T);      // 8
    static constexpr int kChunksPerRow = kHeadDim / kChunkElems;

    // Fragment counts per warp (m16n8k16: k = 16, n = 8).
    static constexpr int kQkSteps = kHeadDim / 16;   // k-steps of S = Q K^T (over the head dim)
    static constexpr int kScoreTiles = kBlockN / 8;  // n8 tiles of S (keys)
    static constexpr int kPvSteps = kBlockN / 16;    // k-steps of O += P V (over the keys)
    static constexpr int kOutTiles = kHeadDim / 8;   // n8 tiles of O (head dim)

    static constexpr int kQTileElems = kBlockM * kHeadDim;
    static constexpr int kKvTileElems = kBlockN * kHeadDim;
    // Register cap via __launch_bounds__: CTAs that must fit on one SM at once. D=64 needs
    // ~130 registers, so 3 CTAs (12 warps) fit; D=128 needs ~240 (Q 32 + O 64 + S 32 fragments
    // plus the K/V fragments in flight), and capping it to 168 for 3 CTAs spills: 2 CTAs.
    static constexpr int kMinCtasPerSm = kHeadDim <= 64 ? V3_MMA_MIN_CTAS_D64 : 2;

    static constexpr int kSmemBytes = (kQTileElems + 2 * kKvTileElems) * static_cast<int>(sizeof(T));

    static_assert(sizeof(T) == 2, "fp16/bf16 only");
    static_assert(kHeadDim % 16 == 0 && kHeadDim >= 64, "head dim: a multiple of 16, at least 64 (8 chunks for the swizzle)");
    static_assert(kBlockN % 16 == 0, "BLOCK_N: a multiple of 16");
    static_assert(kSmemBytes <= 48 * 1024, "static shared memory is capped at 48 KB");
};

}  // namespace v3_mma
