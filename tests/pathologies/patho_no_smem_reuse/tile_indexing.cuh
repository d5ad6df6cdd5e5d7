// v2_tiled: which (head, query-row block) a CTA owns, where a head's rows live, and how many
// key tiles a row block attends. Index arithmetic only.
#pragma once
#include <cstdint>

namespace v2_tiled {

__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

struct BlockCoords {
    int64_t head;    // flat batch*H + head index
    int row_block;   // query rows [row_block*BLOCK_M, (row_block+1)*BLOCK_M)
};

// Row blocks are the slow index and go in reverse: under causal masking the heaviest blocks
// (high rows, most keys) of every head are issued first and the grid's tail is the cheap
// blocks near the top of the triangle, so fewer SMs idle at the end.
__device__ __forceinline__ BlockCoords block_coords(int heads_total, int row_blocks) {
    const int row_block = row_blocks - 1 - static_cast<int>(blockIdx.x / static_cast<unsigned>(heads_total));
    const int64_t head = blockIdx.x % static_cast<unsigned>(heads_total);
    return BlockCoords{head, row_block};
}

// Row 0 of head `head` in a contiguous [B, H, S, D] tensor; 64-bit so B*H*S*D past 2^31 stays
// correct. Offsets inside one head are 32-bit (the host checks S*D < 2^31).
template <int HEAD_DIM, typename T>
__device__ __forceinline__ T* head_ptr(T* base, int64_t head, int seq_len) {
    return base + head * seq_len * HEAD_DIM;
}

// Key tiles the row block attends: every key below S, or, causal, up to its last row
// (min(S, end of block) keys), so no tile entirely above the diagonal is loaded.
template <int BLOCK_M, int BLOCK_N>
__device__ __forceinline__ int key_tile_count(int row_block, int seq_len, bool causal) {
    const int keys = causal ? min(seq_len, (row_block + 1) * BLOCK_M) : seq_len;
    return ceil_div(keys, BLOCK_N);
}

// Keys row `row` attends are [0, key_limit): all keys < S, and causal, j <= row. A padding row
// (row >= S) gets S, so its scores stay finite; it is never written.
__device__ __forceinline__ int key_limit(int row, int seq_len, bool causal) {
    return causal ? min(row + 1, seq_len) : seq_len;
}

}  // namespace v2_tiled
