// v1_scalar: where a warp's query row and its keys live. Index arithmetic only.
//
// Grid: one 1-D grid of ceil(S / WARPS_PER_BLOCK) * B*H blocks; block b handles
// WARPS_PER_BLOCK consecutive query rows of one (batch, head); each warp owns one row.
#pragma once
#include <cstdint>

namespace v1_scalar {

__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

struct RowCoords {
    int64_t head;  // flat batch*H + head index
    int row;       // query row inside the head, may be >= S in the last block
};

// Heads are the slow index, so the blocks in flight at once share a few heads' K/V in L2.
// Row blocks go in reverse: under causal masking the long rows (high i) start first and the
// grid's tail is short rows, so fewer SMs idle at the end.
__device__ __forceinline__ RowCoords row_of_warp(int warps_per_block, int row_blocks_per_head) {
    const int warp = threadIdx.x / 32;
    const int64_t head = blockIdx.x / row_blocks_per_head;
    const int row_block = row_blocks_per_head - 1 - static_cast<int>(blockIdx.x % row_blocks_per_head);
    return RowCoords{head, row_block * warps_per_block + warp};
}

// First element of row `row` of head `head` in a contiguous [B, H, S, D] tensor; 64-bit so
// B*H*S*D past 2^31 stays correct.
template <int HEAD_DIM, typename T>
__device__ __forceinline__ T* row_ptr(T* base, int64_t head, int seq_len, int row) {
    return base + (head * seq_len + row) * HEAD_DIM;
}

// The lane's slice inside a row: HEAD_DIM/32 consecutive elements.
template <int HEAD_DIM, typename T>
__device__ __forceinline__ T* lane_slice(T* row, int lane) {
    return row + lane * (HEAD_DIM / 32);
}

// Keys a query row attends: j in [0, key_count). Causal: j <= row.
__device__ __forceinline__ int key_count(int row, int seq_len, bool causal) {
    return causal ? row + 1 : seq_len;
}

}  // namespace v1_scalar
