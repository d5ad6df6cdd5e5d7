// Which key tiles a query tile visits, and the mask of the few that need one. Tiles past the
// causal diagonal are never visited; only the diagonal tile(s) and the ragged last key tile pay
// for the per-element test.
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <cmath>

#include <cute/tensor.hpp>

namespace v5_hopper {

using namespace cute;

template <int kBlockM, int kBlockN, bool kCausal>
struct KeyTiles {
    int m_block;
    int seq_len;

    // One past the last key tile this query tile sees.
    __device__ int end() const {
        const int last_key = kCausal ? min(seq_len, (m_block + 1) * kBlockM) : seq_len;
        return (last_key + kBlockN - 1) / kBlockN;
    }

    // Whether some key of tile n is past S, or (causal) after some query of this tile.
    __device__ bool needs_mask(int n) const {
        const bool ragged = (n + 1) * kBlockN > seq_len;
        const bool crosses_diagonal = kCausal && (n + 1) * kBlockN - 1 > m_block * kBlockM;
        return ragged || crosses_diagonal;
    }

    // Scores (row/column view) whose key is past S or, causal, after its query become -inf.
    // `coord` is the matching view of the tile's (row, column) identity tensor.
    template <class ScoresRowCol, class CoordRowCol>
    __device__ void apply(ScoresRowCol& s, CoordRowCol const& coord, int n) const {
        const int row0 = m_block * kBlockM;
        const int col0 = n * kBlockN;
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < size<0>(s); ++r) {
            const int row = row0 + get<0>(coord(r, 0));
            const int key_end = kCausal ? min(seq_len, row + 1) : seq_len;
            CUTLASS_PRAGMA_UNROLL
            for (int c = 0; c < size<1>(s); ++c) {
                if (col0 + get<1>(coord(r, c)) >= key_end) s(r, c) = -INFINITY;
            }
        }
    }
};

}  // namespace v5_hopper
