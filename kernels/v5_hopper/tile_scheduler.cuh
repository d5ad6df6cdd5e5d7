// Which query tiles a CTA computes. Tiles are numbered head by head (batch-major), and within a
// head from the longest to the shortest when causal, so the CTAs running at any moment share a
// few heads' K and V in L2 and short causal tiles fill the end of the run. A CTA takes tiles
// blockIdx.x, blockIdx.x + gridDim.x, ...: one tile per CTA with a grid of all tiles, or a
// persistent grid of one CTA per SM that keeps its barriers, rings and registers across tiles.
// In a cluster key split the key_splits CTAs of a cluster share one query tile.
#pragma once

#include <climits>

#include "sm90_cluster.cuh"

namespace v5_hopper {

struct TileCoord {
    int m_block, head, batch;
};

// Reads the problem size from the kernel's parameters (constant memory) on every call instead of
// holding it: at 160 registers a consumer of the 192-row tile has none to spare across its loop.
template <class Traits, bool kCausal>
struct TileScheduler {
    static constexpr int kBlockM = Traits::kBlockM;
    typename Traits::Params const& params;

    __device__ int m_blocks() const { return (params.seq_len + kBlockM - 1) / kBlockM; }
    __device__ int first() const { return Traits::kSplit ? int(blockIdx.x) / params.key_splits : int(blockIdx.x); }
    __device__ int next(int tile) const { return Traits::kSplit ? INT_MAX : tile + int(gridDim.x); }
    __device__ bool valid(int tile) const { return tile < m_blocks() * params.heads * params.batch; }

    // The key tiles [begin, end) of `keys` (a KeyTiles) this CTA visits: all of them, or in a
    // split its rank's share (the host splits no tile into more shares than it has key tiles).
    template <class KeyTiles>
    __device__ evo_sm90::KeyShare key_span(KeyTiles const& keys) const {
        if constexpr (Traits::kSplit) {
            return evo_sm90::key_share(keys.end(), evo_sm90::cluster_rank(), params.key_splits);
        } else {
            return {0, keys.end()};
        }
    }

    __device__ TileCoord coord(int tile) const {
        if constexpr (kCausal && Traits::kCausalOrder != 0) {
            // Longest first across heads: rank r holds every head's r-th longest tile. The hardware
            // hands CTAs out in index order, so the last CTAs to start are the shortest.
            const int heads_total = params.heads * params.batch;
            if (Traits::kCausalOrder == 2 || int(gridDim.x) >= m_blocks() * heads_total) {
                const int rank = tile / heads_total;
                const int head_index = tile - rank * heads_total;
                return {m_blocks() - 1 - rank, head_index % params.heads, head_index / params.heads};
            }
        }
        const int head_index = tile / m_blocks();
        const int within = tile - head_index * m_blocks();
        return {kCausal ? m_blocks() - 1 - within : within, head_index % params.heads, head_index / params.heads};
    }
};

}  // namespace v5_hopper
