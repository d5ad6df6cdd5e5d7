// The mma.sync rungs (v3_mma, v4_pipelined): the epilogue. Normalise O by the softmax sum, round to the element type, and write
// the warp's rows that are inside S.
#pragma once
#include <cstdint>

#include "sm80_online_softmax.cuh"
#include "sm80_tile_layout.cuh"

namespace evo_sm80 {

// The warp stages its 16 rows of O in its own 16 rows of the (swizzled) Q tile, which only this
// warp has read, then stores them as whole 16-byte chunks: a warp writes 512 contiguous bytes
// per instruction instead of 4-byte pieces scattered over 8 rows (the C fragment layout).
template <class Tr, typename T>
__device__ __forceinline__ void write_output(const float (&o)[Tr::kOutTiles][4], const OnlineSoftmax<Tr>& softmax,
                                             T* smem_stage, T* o_head, int first_row_of_warp_in_tile,
                                             int first_row_of_warp, int seq_len, int lane) {
    float inv_sum[OnlineSoftmax<Tr>::kRows];
    softmax.inverse_sums(inv_sum);

    // C fragment -> shared: row frag_row, columns 8d + frag_col (chunk d of the row). The
    // swizzle puts the 8 rows x 4 lanes of one store in 32 different banks.
#pragma unroll
    for (int d = 0; d < Tr::kOutTiles; ++d) {
#pragma unroll
        for (int r = 0; r < OnlineSoftmax<Tr>::kRows; ++r) {
            const int row = first_row_of_warp_in_tile + frag_row(lane, 2 * r);
            const int offset = swizzled_offset<Tr>(row, d) + frag_col(lane, 0);
            const uint32_t packed = Tr::elem_traits::pack(o[d][2 * r] * inv_sum[r], o[d][2 * r + 1] * inv_sum[r]);
            *reinterpret_cast<uint32_t*>(smem_stage + offset) = packed;
        }
    }
    __syncwarp();  // the lanes below read chunks other lanes of this warp wrote

    // shared -> global: 16-byte chunks, rows past S never written.
    constexpr int kChunks = Tr::kRowsPerWarp * Tr::kChunksPerRow;
    static_assert(kChunks % kWarpSize == 0, "whole chunks per lane");
#pragma unroll
    for (int i = 0; i < kChunks / kWarpSize; ++i) {
        const int chunk_id = i * kWarpSize + lane;
        const int row = chunk_id / Tr::kChunksPerRow;
        const int chunk = chunk_id % Tr::kChunksPerRow;
        if (first_row_of_warp + row < seq_len) {
            const uint4 bits = *reinterpret_cast<const uint4*>(smem_stage + swizzled_offset<Tr>(first_row_of_warp_in_tile + row, chunk));
            *reinterpret_cast<uint4*>(o_head + (first_row_of_warp + row) * Tr::kHeadDim + chunk * Tr::kChunkElems) = bits;
        }
    }
}

}  // namespace evo_sm80
