// v4_pipelined: where things live. Index arithmetic only: the CTA's coordinates, the swizzled
// shared-memory layout, the ldmatrix lane addresses, the mma C-fragment coordinates, and the
// cooperative global -> shared tile copy.
#pragma once
#include <cstdint>

#include "sm80_tile_layout.cuh"
#include "tile_traits.cuh"

namespace v4_pipelined {

__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---- the CTA's work ------------------------------------------------------------------------

struct CtaCoords {
    int64_t head;     // flat batch*H + head index
    int query_tile;   // which kBlockM rows of the head
};

// grid = (B*H x key_splits, query tiles). Heads are the fast index and query tiles run in
// reverse, so the CTAs issued first are the longest causal ones (largest-first: a short tail),
// and the CTAs in flight together touch the same few query tiles of many heads. With a cluster
// key split, the key_splits consecutive CTAs of a cluster share one head and query tile.
__device__ __forceinline__ CtaCoords cta_coords(int key_splits) {
    return CtaCoords{static_cast<int64_t>(blockIdx.x / key_splits), static_cast<int>(gridDim.y - 1 - blockIdx.y)};
}

// A warp's place in the CTA: which 16 query rows (row_warp) and which kBlockN keys of each
// pipeline step (key_group) it multiplies. Warps 0..kRowWarps-1 form key group 0.
struct WarpRole {
    int row_warp;
    int key_group;
};

template <class Tr>
__device__ __forceinline__ WarpRole warp_role(int warp) {
    return WarpRole{warp % Tr::kRowWarps, warp / Tr::kRowWarps};
}

// One past the last key any of the warp's 16 rows attends (S, or causal: its last row + 1, at
// most S). A key tile starting at or past it is all masked for the warp and can be skipped.
__device__ __forceinline__ int warp_key_limit(int first_row_of_warp, int rows_per_warp, int seq_len, bool causal) {
    return causal ? min(seq_len, first_row_of_warp + rows_per_warp) : seq_len;
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

}  // namespace v4_pipelined
