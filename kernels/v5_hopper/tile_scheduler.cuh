// Which query tiles a CTA computes, in the order tile_order.cuh gives: one tile per CTA with a
// grid of all tiles, or a persistent grid of one CTA per SM that keeps its barriers, rings and
// registers across the tiles of its stride. In a cluster key split the key_splits CTAs of a
// cluster share one query tile.
#pragma once

#include <climits>

#include "sm90_cluster.cuh"
#include "tile_order.cuh"

namespace v5_hopper {

// Reads the problem size from the kernel's parameters (constant memory) on every call instead of
// holding it: at 160 registers a consumer of the 192-row tile has none to spare across its loop.
template <class Traits, bool kCausal>
struct TileScheduler {
    static constexpr int kBlockM = Traits::kBlockM;
    typename Traits::Params const& params;

    __device__ int m_blocks() const { return (params.seq_len + kBlockM - 1) / kBlockM; }
    __device__ TileOrder order() const {
        return {m_blocks(), params.heads * params.batch, int(gridDim.x), Traits::kCausalOrder, kCausal};
    }
    __device__ int first() const { return Traits::kSplit ? 0 : order().first(int(blockIdx.x)); }
    __device__ int next(int tile) const { return Traits::kSplit ? INT_MAX : order().next(tile); }
    __device__ bool valid(int tile) const { return order().valid(tile); }

    // The key tiles [begin, end) of `keys` (a KeyTiles) this CTA visits: all of them, or in a
    // split its rank's share (the host splits no tile into more shares than it has key tiles).
    template <class KeyTiles>
    __device__ evo_sm90::KeyShare key_span(KeyTiles const& keys) const {
        if constexpr (Traits::kSplit) {
            // Split counts are powers of two: cluster_splits halves from kMaxSplits.
            static_assert((Traits::kMaxSplits & (Traits::kMaxSplits - 1)) == 0, "split counts: powers of two");
            return evo_sm90::key_share_pow2(keys.end(), evo_sm90::cluster_rank(), evo_sm90::split_shift(params.key_splits));
        } else {
            return {0, keys.end()};
        }
    }

    __device__ TileCoord coord(int tile) const {
        // A split grid is (query tiles x splits, heads, batch), one tile a cluster: its coordinates
        // are the CTA's indices. From a 1-D index they took three runtime divisions, on the loading
        // thread's path to its first load and again on the owner's after the merge (NOTES.md, run 132).
        if constexpr (Traits::kSplit) return {evo_sm90::cluster_id_x(), int(blockIdx.y), int(blockIdx.z)};
        int m_block, head_index;
        order().locate(tile, m_block, head_index);
        return {m_block, head_index % params.heads, head_index / params.heads};
    }
};

}  // namespace v5_hopper
