// Views of a warp group's wgmma accumulator: as rows and columns (for the softmax, the mask and
// the epilogue), and as the register A operand of the next wgmma (P in P V).
//
// A warp group's m64nNk16 accumulator gives each thread the layout ((2, 2, N/8), MMA_M, MMA_N):
// lane l holds columns 8j + 2(l%4) + {0,1} of rows l/4 and l/4 + 8 (16 rows per warp).
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace v5_hopper {

using namespace cute;

// ((2, 2, N/8), MMA_M, MMA_N) -> (rows (2, MMA_M), cols (2, N/8, MMA_N)).
template <class Layout>
__device__ constexpr auto rowcol_layout(Layout acc) {
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

template <class Tensor>
__device__ auto rowcol_view(Tensor&& t) {
    return make_tensor(t.data(), rowcol_layout(t.layout()));
}

// The register A operand of a 16-bit m64k16 wgmma wants, per k16 slice, the two n8 column
// blocks of the accumulator one after the other: ((2, 2, N/8), MMA_M, MMA_N) ->
// ((2, 2, 2), MMA_M, (N/16, MMA_N)). The storage order is unchanged, so converting element i
// of the accumulator to element i of P is the whole conversion.
template <class Layout>
__device__ constexpr auto a_operand_layout(Layout acc) {
    auto n8_pairs = logical_divide(get<0, 2>(acc), Tile<_2>{});   // (2, N/16)
    return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0, 0>(n8_pairs)),
                       get<1>(acc),
                       coalesce(make_layout(get<0, 1>(n8_pairs), get<2>(acc))));
}

// Two fp32 values as a pair of the 16-bit type (one cvt.rn.{f16x2,bf16x2}.f32), and back.
template <class Element>
__device__ __forceinline__ cutlass::Array<Element, 2> to_pair(float a, float b) {
    cutlass::NumericArrayConverter<Element, float, 2> convert;
    cutlass::Array<float, 2> pair;
    pair[0] = a;
    pair[1] = b;
    return convert(pair);
}
template <class Element>
__device__ __forceinline__ float2 from_pair(cutlass::Array<Element, 2> const& packed) {
    cutlass::NumericArrayConverter<float, Element, 2> convert;
    const cutlass::Array<float, 2> pair = convert(packed);
    return make_float2(pair[0], pair[1]);
}

// Converts fp32 values to 16-bit ones element for element (same storage order), two per
// conversion: P for the next product, O for the epilogue.
template <class Source, class Destination>
__device__ void convert_pairs(Source const& from, Destination& to) {
    using Element = typename Destination::value_type;
    static_assert(decltype(size(from))::value % 2 == 0);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(from); i += 2) {
        const cutlass::Array<Element, 2> packed = to_pair<Element>(from.data()[i], from.data()[i + 1]);
        to.data()[i] = packed[0];
        to.data()[i + 1] = packed[1];
    }
}

// The fp32 accumulator as the 16-bit A operand of the next wgmma.
template <class Element, class Accumulator>
__device__ auto convert_to_a_operand(Accumulator const& acc) {
    Tensor p = make_tensor<Element>(a_operand_layout(acc.layout()));
    convert_pairs(acc, p);
    return p;
}

}  // namespace v5_hopper
