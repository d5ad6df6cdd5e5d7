// v4_pipelined: splitting the keys of one query tile across the CTAs of a thread-block cluster
// (sm_90). A launch-bound shape such as (1,8,512,64) gives 8 heads x 8 query tiles = 64 CTAs on
// 132 SMs, each walking all 8 key tiles in series. With a split of S (2 or 4), the S CTAs of a
// cluster take the same query tile and a contiguous 1/S of its key tiles each, so each holds a
// partial softmax state of every row over disjoint keys (key_split.cuh's merge applies).
//
// The merge is pushed, not pulled: the rows of warp w are finished by rank w % S (its owner);
// every other rank's warp w writes its state into the owner's receive slots with st.async, which
// counts the bytes on an mbarrier of the owner (complete_tx), and exits. The owner waits on that
// barrier, folds the states from its own shared memory and runs the epilogue. One kernel, no
// global scratch, no memory fence. (The first version pulled: rank 0 read each other rank's state
// through distributed shared memory after a release cluster barrier; on an H100 the reads cost
// ~1.0 us per remote rank, serialised, and the barrier's fence ~1.1 us at 8 ranks: NOTES.md, run 5.)
//
// Ordering: each CTA initialises its barriers, arrives (relaxed) on the cluster barrier at entry
// and waits on it only after its key loop, so no rank signals a barrier before it exists;
// the receive slots lie past the pipeline's stages, so a push can land while the owner is still
// in its key loop.
#pragma once
#include <cstdint>

#include "key_split.cuh"
#include "sm80_online_softmax.cuh"
#include "sm90_cluster.cuh"
#include "tile_traits.cuh"

#define V4_PIPELINED_HAS_CLUSTERS EVO_SM90_HAS_CLUSTERS

namespace v4_pipelined {

using evo_sm90::KeyShare;
using evo_sm90::key_share;

// The shared memory of a cluster-split CTA past the pipeline's stages: receive slots for the
// states other ranks push (at most kRowWarps - 1: each of the kRowWarps / S owned warps takes
// S - 1), then one mbarrier per owned warp. A warp's state is kChunks 16-byte chunks per lane,
// chunk c of lane l at chunk index c * 32 + l (a warp moves 512 contiguous bytes per chunk):
// chunk 0 = (max row 0, max row 1, sum row 0, sum row 1), chunk 1 + d = O's n8 tile d.
template <class Tr>
struct ClusterLayout {
    static_assert(OnlineSoftmax<Tr>::kRows == 2, "chunk 0 holds two rows' max and sum");
    static constexpr int kMaxSplits = Tr::kRowWarps < 4 ? Tr::kRowWarps : 4;
    static constexpr int kChunks = 1 + Tr::kOutTiles;
    static constexpr int kWarpBytes = kChunks * 16 * kWarpSize;
    static constexpr int kSlots = Tr::kRowWarps - Tr::kRowWarps / kMaxSplits;  // the most at S = kMaxSplits
    static constexpr int kSlotsOffset = Tr::kSmemBytes;
    static constexpr int kBarriersOffset = kSlotsOffset + kSlots * kWarpBytes;
    static constexpr int kSmemBytes = kBarriersOffset + Tr::kRowWarps * 8;

    // Owned warp j (the j-th of this rank's warps) receives source rank `src` (!= this rank) here.
    static __device__ __forceinline__ int slot_offset(int owned, int src, int rank, int splits) {
        return kSlotsOffset + (owned * (splits - 1) + (src < rank ? src : src - 1)) * kWarpBytes;
    }
    static __device__ __forceinline__ int barrier_offset(int owned) { return kBarriersOffset + owned * 8; }
    static __device__ __forceinline__ int bytes_per_owned_warp(int splits) { return (splits - 1) * kWarpBytes; }
    static_assert(kSlotsOffset % 16 == 0 && kBarriersOffset % 8 == 0, "16-byte chunks, 8-byte mbarriers");
};

#if V4_PIPELINED_HAS_CLUSTERS
using evo_sm90::cluster_rank;
using evo_sm90::map_to_rank;

// Entry: one thread initialises this CTA's barriers, each expecting the bytes of its owned warp
// (one arrival, made here); the fence publishes the initialisation to the cluster before the
// (relaxed) arrival on the cluster barrier that the other ranks wait on before they push.
template <class Tr>
__device__ __forceinline__ void cluster_split_enter(uint32_t smem_base, int splits) {
    using L = ClusterLayout<Tr>;
    if (threadIdx.x == 0) {
        for (int owned = 0; owned < Tr::kRowWarps / splits; ++owned) {
            evo_sm90::init_receive_barrier(smem_base + L::barrier_offset(owned), L::bytes_per_owned_warp(splits));
        }
        evo_sm90::fence_barrier_init();
    }
    evo_sm90::cluster_arrive_relaxed();
}

// After the key loop, every thread of the CTA: from here on every rank's barriers exist.
__device__ __forceinline__ void cluster_split_ready() { evo_sm90::cluster_wait(); }

// After cluster_split_ready, by the warps that hold the CTA's final state of their rows (key
// group 0). Returns true in the owner of the warp's rows, whose registers then hold the merged
// state (it runs the epilogue); false elsewhere: the warp has pushed its state and is done.
template <class Tr>
__device__ __forceinline__ bool merge_cluster_states(uint32_t smem_base, const char* smem, int splits, int row_warp,
                                                     OnlineSoftmax<Tr>& softmax, float (&o)[Tr::kOutTiles][4],
                                                     int lane) {
    using L = ClusterLayout<Tr>;
    const int rank = cluster_rank();
    const int owner = row_warp % splits;
    const int owned = row_warp / splits;
    if (owner != rank) {
        const uint32_t slot = map_to_rank(smem_base + L::slot_offset(owned, rank, owner, splits), owner);
        const uint32_t barrier = map_to_rank(smem_base + L::barrier_offset(owned), owner);
        const auto push = [&](int chunk, float a, float b, float c, float d) {
            evo_sm90::push_v4(slot + (chunk * kWarpSize + lane) * 16, a, b, c, d, barrier);
        };
        push(0, softmax.running_max[0], softmax.running_max[1], softmax.running_sum[0], softmax.running_sum[1]);
#pragma unroll
        for (int d = 0; d < Tr::kOutTiles; ++d) push(1 + d, o[d][0], o[d][1], o[d][2], o[d][3]);
        return false;
    }
    evo_sm90::wait_barrier<0>(smem_base + L::barrier_offset(owned));
    for (int src = 0; src < splits; ++src) {
        if (src == rank) continue;
        const float4* chunks = reinterpret_cast<const float4*>(smem + L::slot_offset(owned, src, rank, splits));
        const float4 head = chunks[lane];
        const float other_max[2] = {head.x, head.y};
        const float other_sum[2] = {head.z, head.w};
        fold_partial_state<Tr>(softmax, o, other_max, other_sum, [&](int d, int e) {
            const float4 tile = chunks[(1 + d) * kWarpSize + lane];
            return e == 0 ? tile.x : (e == 1 ? tile.y : (e == 2 ? tile.z : tile.w));
        });
    }
    return true;
}
#endif

}  // namespace v4_pipelined
