// v3_mma: where things live. Index arithmetic only: the CTA's coordinates, the swizzled
// shared-memory layout, the ldmatrix lane addresses, the mma C-fragment coordinates, and the
// cooperative global -> shared tile copy.
#pragma once
#include <cstdint>

#include "sm80_tile_layout.cuh"
#include "tile_traits.cuh"

namespace v3_mma {

__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---- the CTA's work ------------------------------------------------------------------------

struct CtaCoords {
    int64_t head;     // flat batch*H + head index
    int query_tile;   // which kBlockM rows of the head
};

// grid = (B*H, query tiles). Heads are the fast index and query tiles run in reverse, so the
// CTAs issued first are the longest causal ones (largest-first: a short tail), and the CTAs in
// flight together touch the same few query tiles of many heads.
__device__ __forceinline__ CtaCoords cta_coords() {
    return CtaCoords{static_cast<int64_t>(blockIdx.x), static_cast<int>(gridDim.y - 1 - blockIdx.y)};
}

// Key tiles the query tile [first_row, first_row + block_m) attends: [0, end). Causal: a tile
// whose first key is past the tile's last row is skipped whole.
__device__ __forceinline__ int key_tile_end(int first_row, int block_m, int block_n, int seq_len, bool causal) {
    const int all_tiles = ceil_div(seq_len, block_n);
    return causal ? min(all_tiles, ceil_div(first_row + block_m, block_n)) : all_tiles;
}

// A key tile needs the element mask when it reaches past S, or (causal) when some key in it is
// later than the tile's first query row: only the diagonal tile(s) and the ragged last tile.
__device__ __forceinline__ bool key_tile_needs_mask(int first_key, int block_n, int first_row, int seq_len, bool causal) {
    const int last_key = first_key + block_n - 1;
    return last_key >= seq_len || (causal && last_key > first_row);
}

// First element of row `row` of head `head` in a contiguous [B, H, S, D] tensor; the head
// offset is 64-bit, the offset inside a head 32-bit (the host checks S*D < 2^31).
template <int HEAD_DIM, typename T>
__device__ __forceinline__ T* head_row_ptr(T* base, int64_t head, int seq_len, int row) {
    return base + head * seq_len * HEAD_DIM + row * HEAD_DIM;
}

// The swizzled tiles, ldmatrix addresses, C-fragment coordinates and the tile copy:
// kernels/common/sm80_tile_layout.cuh.

}  // namespace v3_mma
