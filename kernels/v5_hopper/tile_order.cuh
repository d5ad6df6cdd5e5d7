// The order in which the CTAs of one launch walk the query tiles: plain integer arithmetic on
// the launch's sizes, with no CUDA or CuTe in it, so a host program can walk every CTA's list
// and check that each tile is visited once (tests/test_v5_hopper.py).
//
// Causal orders (tunables.causal_order):
//   0  head by head, each head's longest tile first;
//   1  on a grid of one CTA per tile, rank across heads: every head's longest tile, then every
//      head's next longest, ... (the hardware starts CTAs in index order, so the shortest start
//      last); a persistent grid keeps order 0;
//   2  rank across heads on persistent grids too;
//   3  as 1, and on a persistent grid each step of a CTA's stride is a pair of one head's tiles,
//      its k-th longest then its k-th shortest, whose key tiles add up to the same count for
//      every k: the static stride then balances by construction, and a pass of the grid spans
//      twice the heads of order 0 rather than all of them (NOTES.md, run 25).
#pragma once

#ifdef __CUDACC__
#define V5_TILE_ORDER_FN __host__ __device__ inline
#else
#define V5_TILE_ORDER_FN inline
#endif

namespace v5_hopper {

struct TileCoord {
    int m_block, head, batch;
};

// A walk index t names one tile. Unpaired walks number tiles 0, 1, ...; paired walks name the
// tiles of pair u as 2u (the longer) and 2u + 1 (the shorter; absent for a head's middle tile
// when its tile count is odd).
struct TileOrder {
    int m_blocks;      // query tiles per head
    int heads_total;   // heads x batch
    int grid;          // CTAs in the launch
    int order;         // causal_order
    bool causal;

    V5_TILE_ORDER_FN int tiles() const { return m_blocks * heads_total; }
    V5_TILE_ORDER_FN bool persistent() const { return grid < tiles(); }
    V5_TILE_ORDER_FN bool paired() const { return causal && order == 3 && persistent(); }
    V5_TILE_ORDER_FN bool ranked() const {
        return causal && (order == 2 || ((order == 1 || order == 3) && !persistent()));
    }
    V5_TILE_ORDER_FN int pairs_per_head() const { return (m_blocks + 1) / 2; }

    V5_TILE_ORDER_FN int first(int cta) const { return paired() ? 2 * cta : cta; }
    V5_TILE_ORDER_FN bool valid(int t) const {
        return paired() ? t / 2 < pairs_per_head() * heads_total : t < tiles();
    }
    V5_TILE_ORDER_FN int next(int t) const {
        if (!paired()) return t + grid;
        const int pair = t / 2;
        const int k = pair % pairs_per_head();
        const bool has_shorter = k != m_blocks - 1 - k;
        return (t % 2 == 0 && has_shorter) ? t + 1 : 2 * (pair + grid);
    }

    // (m_block, head index in [0, heads_total)) of walk index t.
    V5_TILE_ORDER_FN void locate(int t, int& m_block, int& head_index) const {
        if (paired()) {
            const int pair = t / 2;
            head_index = pair / pairs_per_head();
            const int k = pair - head_index * pairs_per_head();
            m_block = t % 2 == 0 ? m_blocks - 1 - k : k;
        } else if (ranked()) {
            const int rank = t / heads_total;
            head_index = t - rank * heads_total;
            m_block = m_blocks - 1 - rank;
        } else {
            head_index = t / m_blocks;
            const int within = t - head_index * m_blocks;
            m_block = causal ? m_blocks - 1 - within : within;
        }
    }
};

}  // namespace v5_hopper
