// Writes a consumer thread's normalised O rows: two neighbouring columns per 4-byte store, only
// rows that exist (row < S), straight from registers.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace v5_hopper {

using namespace cute;

template <int kHeadDim, class AccRowCol, class CoordRowCol, class Element>
__device__ void store_rows(AccRowCol const& o, CoordRowCol const& coord, Element* o_head, int row0, int seq_len) {
    cutlass::NumericArrayConverter<Element, float, 2> convert;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(o); ++r) {
        const int row = row0 + get<0>(coord(r, 0));
        if (row >= seq_len) continue;
        Element* o_row = o_head + int64_t(row) * kHeadDim;
        // Columns c and c + 1 of the row view are neighbours in memory (the accumulator's pairs).
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(o); c += 2) {
            cutlass::Array<float, 2> pair;
            pair[0] = o(r, c);
            pair[1] = o(r, c + 1);
            *reinterpret_cast<cutlass::Array<Element, 2>*>(o_row + get<1>(coord(r, c))) = convert(pair);
        }
    }
}

}  // namespace v5_hopper
