// Which query tiles a CTA computes. Tiles are numbered head by head (batch-major), and within a
// head from the longest to the shortest when causal, so the CTAs running at any moment share a
// few heads' K and V in L2 and short causal tiles fill the end of the run. A CTA takes tiles
// blockIdx.x, blockIdx.x + gridDim.x, ...: one tile per CTA with a grid of all tiles, or a
// persistent grid of one CTA per SM that keeps its barriers, rings and registers across tiles.
#pragma once

namespace v5_hopper {

struct TileCoord {
    int m_block, head, batch;
};

// Reads the problem size from the kernel's parameters (constant memory) on every call instead of
// holding it: at 160 registers a consumer of the 192-row tile has none to spare across its loop.
template <int kBlockM, bool kCausal, class Params>
struct TileScheduler {
    Params const& params;

    __device__ int m_blocks() const { return (params.seq_len + kBlockM - 1) / kBlockM; }
    __device__ int first() const { return int(blockIdx.x); }
    __device__ int next(int tile) const { return tile + int(gridDim.x); }
    __device__ bool valid(int tile) const { return tile < m_blocks() * params.heads * params.batch; }

    __device__ TileCoord coord(int tile) const {
        const int head_index = tile / m_blocks();
        const int within = tile - head_index * m_blocks();
        return {kCausal ? m_blocks() - 1 - within : within, head_index % params.heads, head_index / params.heads};
    }
};

}  // namespace v5_hopper
