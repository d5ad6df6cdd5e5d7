// v4_pipelined: the tile shape, the pipeline depth and the element type, in one traits struct,
// so one kernel template serves head dims 64 and 128 and both fp16 and bf16.
//
// A CTA of kWarps warps owns kBlockM = 16*kWarps query rows of one (batch, head); each warp owns
// 16 of them (one m16 row block of the mma). Keys stream through shared memory kBlockN at a
// time, in a ring of kStages [K tile | V tile] buffers filled by cp.async kStages-1 tiles ahead.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>  // memcpy

#include "sm80_mma_primitives.cuh"

#ifndef V4_PIPELINED_BLOCK_N
#error "V4_PIPELINED_BLOCK_N undefined: the build passes it from variant.yaml (tunables.block_n)"
#endif

// Shared-memory stages of the K/V ring (2 or 3): tiles t+1 .. t+kStages-1 load while tile t is
// multiplied.
#ifndef V4_PIPELINED_STAGES
#error "V4_PIPELINED_STAGES undefined: the build passes it from variant.yaml (tunables.stages)"
#endif

// 1: at D=64, grids of at most one CTA per SM run with two key groups (8 warps per CTA).
#ifndef V4_PIPELINED_KEY_SPLIT
#error "V4_PIPELINED_KEY_SPLIT undefined: the build passes it from variant.yaml (tunables.key_split)"
#endif

// Row warps per CTA at D=128: 4 (64 query rows) or 8 (128).
#ifndef V4_PIPELINED_ROW_WARPS_D128
#error "V4_PIPELINED_ROW_WARPS_D128 undefined: the build passes it from variant.yaml (tunables.row_warps_d128)"
#endif

// A/B knobs (see NOTES.md): 1 = ask for the max-shared carveout; 1 = issue the refill of the
// ring after S = Q K^T instead of before it.
#ifndef V4_PIPELINED_CARVEOUT_HINT
#error "V4_PIPELINED_CARVEOUT_HINT undefined: the build passes it from variant.yaml (tunables.carveout_hint)"
#endif
#ifndef V4_PIPELINED_ISSUE_AFTER_SCORES
#error "V4_PIPELINED_ISSUE_AFTER_SCORES undefined: the build passes it from variant.yaml (tunables.issue_after_scores)"
#endif

// 1: on sm_90, grids of fewer CTAs than SPLIT_CTAS_PER_SM per SM split each query tile's keys
// across the CTAs of a cluster (cluster_split.cuh).
#ifndef V4_PIPELINED_CLUSTER_SPLIT
#error "V4_PIPELINED_CLUSTER_SPLIT undefined: the build passes it from variant.yaml (tunables.cluster_split)"
#endif
#ifndef V4_PIPELINED_CLUSTER_KEY_GROUPS_D64
#error "V4_PIPELINED_CLUSTER_KEY_GROUPS_D64 undefined: the build passes it from variant.yaml (tunables.cluster_key_groups_d64)"
#endif
#ifndef V4_PIPELINED_SPLIT_CTAS_PER_SM
#error "V4_PIPELINED_SPLIT_CTAS_PER_SM undefined: the build passes it from variant.yaml (tunables.split_ctas_per_sm)"
#endif

// 1: on sm_90, launches allow programmatic dependent launch (the grid starts while the previous
// kernel on the stream drains and waits for it before reading anything).
#ifndef V4_PIPELINED_PDL
#error "V4_PIPELINED_PDL undefined: the build passes it from variant.yaml (tunables.pdl)"
#endif

#ifndef V4_PIPELINED_MIN_CTAS_D64
#error "V4_PIPELINED_MIN_CTAS_D64 undefined: the build passes it from variant.yaml (tunables.min_ctas_d64)"
#endif

namespace v4_pipelined {

// kWarpSize, ElementTraits and the instruction wrappers: kernels/common/sm80_mma_primitives.cuh.
using namespace evo_sm80;

// An L4 (sm_89) lets one block opt in to 99 KB of shared memory; an H100/H200 to 227 KB.
constexpr int kMaxSmemBytesPerBlock = 99 * 1024;
// Above this a block must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize).
constexpr int kDefaultSmemBytesPerBlock = 48 * 1024;

// KEY_GROUPS > 1 splits each pipeline step's keys between that many groups of kRowWarps warps:
// group g multiplies the g-th kBlockN keys of the step for the same query rows, and the groups'
// partial softmax states are merged once at the end (key_split.cuh). Used only for grids that
// leave SMs idle: it puts twice the warps on the same rows, halving each warp's serial chain.
// ROW_WARPS x 16 query rows per CTA: 4 (64 rows) by default; 8 (128 rows) halves how often each
// K/V tile is fetched from L2 and written to shared memory (every query tile re-reads the head's
// keys), at one 8-warp CTA per SM instead of two 4-warp ones.
template <typename T, int HEAD_DIM, int ROW_WARPS = (HEAD_DIM > 64 ? V4_PIPELINED_ROW_WARPS_D128 : 4),
          int KEY_GROUPS = 1, int BLOCK_N = V4_PIPELINED_BLOCK_N, int STAGES = V4_PIPELINED_STAGES>
struct TileTraits {
    using elem_t = T;
    using elem_traits = ElementTraits<T>;

    static constexpr int kHeadDim = HEAD_DIM;
    static constexpr int kRowWarps = ROW_WARPS;               // warps along the query rows
    static constexpr int kKeyGroups = KEY_GROUPS;             // warps along the keys of one step
    static constexpr int kWarps = kRowWarps * kKeyGroups;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kRowsPerWarp = 16;                   // the mma's M
    static constexpr int kBlockM = kRowWarps * kRowsPerWarp;  // query rows per CTA
    static constexpr int kBlockN = BLOCK_N;                   // keys one warp multiplies per step
    static constexpr int kStepKeys = kKeyGroups * kBlockN;    // keys the CTA loads per step
    static constexpr int kStages = STAGES;                    // K/V ring depth

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
    static constexpr int kKvTileElems = kStepKeys * kHeadDim;    // one step's K (or V) rows
    static constexpr int kWarpKvElems = kBlockN * kHeadDim;      // one key group's part of them
    // Register cap via __launch_bounds__: CTAs that must fit on one SM at once. D=64 needs
    // ~165 registers, so 3 CTAs (12 warps) fit; D=128 needs ~250 (Q 32 + O 64 + S 32 fragments
    // plus the K/V fragments in flight), and capping it to 168 for 3 CTAs spills: 2 CTAs. An
    // 8-warp CTA (8 row warps, or 2 key groups) runs one per SM.
    static constexpr int kMinCtasPerSm = kWarps > 4 ? 1 : (kHeadDim <= 64 ? V4_PIPELINED_MIN_CTAS_D64 : 2);

    // One stage holds a K tile then a V tile. Q has no buffer of its own: it lands in the last
    // stage, is copied to registers before that stage is first refilled, and the same bytes stage
    // O in the epilogue. That keeps D=128 at 3 stages within the L4's 99 KB (96 KB, not 112).
    static constexpr int kStageElems = 2 * kKvTileElems;
    static constexpr int kSmemBytes = kStages * kStageElems * static_cast<int>(sizeof(T));

    static_assert(sizeof(T) == 2, "fp16/bf16 only");
    static_assert(kHeadDim % 16 == 0 && kHeadDim >= 64, "head dim: a multiple of 16, at least 64 (8 chunks for the swizzle)");
    static_assert(kBlockN % 16 == 0, "BLOCK_N: a multiple of 16");
    static_assert(kKeyGroups >= 1, "at least one key group");
    static_assert(kStages >= 2, "a pipeline needs at least two stages");
    static_assert(kQTileElems <= kStageElems, "Q (and the O staging) must fit in one stage");
    static_assert(kSmemBytes <= kMaxSmemBytesPerBlock, "shared memory above what an L4 allows a block");
};

}  // namespace v4_pipelined
