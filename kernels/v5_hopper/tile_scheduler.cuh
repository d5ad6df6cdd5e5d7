// Which query tiles a CTA computes. Tiles are numbered head by head (batch-major), and within a
// head from the longest to the shortest when causal, so the CTAs running at any moment share a
// few heads' K and V in L2 and short causal tiles fill the end of the run.
//
// A CTA starts on tile blockIdx.x. With a grid of all tiles that is its only one. A persistent
// grid (one CTA per SM) walks on: statically to tile + gridDim.x, or, with a tile counter
// (`dynamic_tiles`), to whichever tile is next when it asks. Static round-robin leaves causal
// work unbalanced: on 4,16,2048,128 causal, 132 CTAs over 16-tile heads get 56 to 80 key tiles
// each (mean 66), and the grid waits for the 80. The counter hands out tiles in the same order,
// so L2 locality is kept and the short tiles still come last.
//
// Only the producer thread walks the schedule; it posts each tile index in shared memory before
// arming Q's barrier, and the consumers read it once that barrier completes (or stop on -1).
#pragma once

namespace v5_hopper {

struct TileCoord {
    int m_block, head, batch;
};

// A launch's tile counter: [0] tiles handed out past the first gridDim.x, [1] CTAs that have
// stopped asking. The last CTA to stop resets both, so the next launch on this slot finds zeros
// with no memset (none to capture in a graph, none to order on the stream).
struct TileCounter {
    unsigned int next, done;
};

// Reads the problem size from the kernel's parameters (constant memory) on every call instead of
// holding it: at 160 registers a consumer of the 192-row tile has none to spare across its loop.
template <int kBlockM, bool kCausal, class Params>
struct TileScheduler {
    Params const& params;

    __device__ int m_blocks() const { return (params.seq_len + kBlockM - 1) / kBlockM; }
    __device__ int tiles() const { return m_blocks() * params.heads * params.batch; }
    __device__ int first() const { return int(blockIdx.x); }
    __device__ bool valid(int tile) const { return tile < tiles(); }

    // The producer's next tile. Asked as soon as the current one starts: the atomic's latency
    // hides under that tile's loads.
    __device__ int next(int tile) const {
        if (params.tile_counter == nullptr) return tile + int(gridDim.x);
        return int(gridDim.x) + int(atomicAdd(&params.tile_counter->next, 1u));
    }

    // The producer has asked its last time (and was told no tile is left).
    __device__ void finish() const {
        TileCounter* counter = params.tile_counter;
        if (counter == nullptr) return;
        __threadfence();   // this CTA's last claim is ordered before its count of stopped CTAs
        if (atomicAdd(&counter->done, 1u) == gridDim.x - 1) {
            __threadfence();   // every CTA has stopped claiming: nobody touches `next` again
            counter->next = 0;
            counter->done = 0;
        }
    }

    __device__ TileCoord coord(int tile) const {
        const int head_index = tile / m_blocks();
        const int within = tile - head_index * m_blocks();
        return {kCausal ? m_blocks() - 1 - within : within, head_index % params.heads, head_index / params.heads};
    }
};

}  // namespace v5_hopper
