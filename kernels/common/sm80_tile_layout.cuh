// The mma.sync rungs (v3_mma, v4_pipelined): the swizzled shared-memory layout, the ldmatrix
// lane addresses, the mma C-fragment coordinates and the cooperative global -> shared tile copy.
#pragma once
#include <cstdint>

#include "sm80_mma_primitives.cuh"

namespace evo_sm80 {

// ---- swizzled shared-memory tiles ----------------------------------------------------------

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][HEAD_DIM] tile. The chunk
// index is XORed with row%8: the 8 rows one ldmatrix phase reads (same logical chunk, 8
// consecutive rows, 128 or 256 bytes apart, hence one bank group without it) land in 8
// different 16-byte bank groups, so ldmatrix, the cp.async writes and the O staging are
// bank-conflict free with no padding bytes.
template <class Tr>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
    return row * Tr::kHeadDim + ((chunk ^ (row & 7)) * Tr::kChunkElems);
}

// Lane `lane`'s row address for ldmatrix.x4 over a 16x16 block whose top-left is
// (row0, chunk0) (chunk0 counts 16-byte chunks). Matrix i = lane/8 is taken from rows
// row0 + lane%8 + 8*row_half(i) and chunk chunk0 + chunk_half(i).
//   A operand (Q):     matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
//                      -> a0..a3: row_half = i&1, chunk_half = i>>1.
//   B operand (K):     matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15)
//                      -> b0,b1 of n-tile 0 then of n-tile 1: row_half = i>>1, chunk_half = i&1.
//   B operand (V, .trans): (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15)
//                      -> b0,b1 of d-tile 0 then of d-tile 1: row_half = i&1, chunk_half = i>>1.
template <class Tr, bool kRowHalfIsLow>
__device__ __forceinline__ int ldmatrix_lane_offset(int row0, int chunk0, int lane) {
    const int matrix = lane >> 3;
    const int row_half = kRowHalfIsLow ? (matrix & 1) : (matrix >> 1);
    const int chunk_half = kRowHalfIsLow ? (matrix >> 1) : (matrix & 1);
    return swizzled_offset<Tr>(row0 + (lane & 7) + 8 * row_half, chunk0 + chunk_half);
}

// ---- the mma C fragment (16x8 fp32): which (row, column) a lane's register e holds ---------

// Registers 0,1 are row lane/4, registers 2,3 row lane/4 + 8 (rows of the warp's 16).
__device__ __forceinline__ int frag_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
// Registers 0,2 are column 2*(lane%4), registers 1,3 the next one (columns of the n8 tile).
__device__ __forceinline__ int frag_col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }

// ---- global -> shared copies ---------------------------------------------------------------

// Copies rows [first_row, first_row + ROWS) of one head (a [S, HEAD_DIM] slab) into a swizzled
// shared tile with 16-byte cp.async; consecutive threads take consecutive chunks of a row, so a
// warp reads 512 contiguous bytes. Rows at or past S are zero-filled and read nothing (their
// source address is clamped to row 0, which is always in bounds).
template <class Tr, int ROWS, typename T>
__device__ __forceinline__ void load_tile_async(T* smem_tile, const T* head_base, int first_row, int seq_len) {
    constexpr int kChunks = ROWS * Tr::kChunksPerRow;
    static_assert(kChunks % Tr::kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int i = 0; i < kChunks / Tr::kThreads; ++i) {
        const int chunk_id = i * Tr::kThreads + static_cast<int>(threadIdx.x);
        const int row = chunk_id / Tr::kChunksPerRow;
        const int chunk = chunk_id % Tr::kChunksPerRow;
        const int global_row = first_row + row;
        const bool in_bounds = global_row < seq_len;
        const T* src = head_base + (in_bounds ? global_row : 0) * Tr::kHeadDim + chunk * Tr::kChunkElems;
        cp_async_16(smem_address(smem_tile + swizzled_offset<Tr>(row, chunk)), src, in_bounds);
    }
}

}  // namespace evo_sm80
