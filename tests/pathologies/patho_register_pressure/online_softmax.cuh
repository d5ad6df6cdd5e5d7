// v2_tiled: the online softmax of a thread's rows, in fp32 and in log2 units.
//
// Scores arrive multiplied by scale*log2(e) (folded into the Q tile), so exp(s - m) is
// exp2(s' - m'): one MUFU.EX2 per score.
//
// A row's BLOCK_N scores of a key tile are spread over the 8 lanes of its row group
// (BLOCK_N/8 each). Per key tile, the three steps:
//   1. running max:  m_new = max(m, max over the row's tile scores)   (lane max, then 3 xor-shuffles)
//   2. rescale:      alpha = exp2(m - m_new); l *= alpha; acc *= alpha (caller scales acc)
//   3. accumulate:   p = exp2(s - m_new); l += p; acc += p * v          (caller does P.V)
// m is bit-identical in the 8 lanes (max is exact and order-free). l is kept as each lane's
// share (the sum of its own p's), every share rescaled by the same alpha, and summed over the
// 8 lanes once, in the epilogue: no shuffle per tile for the sum.
#pragma once
#include <cmath>  // INFINITY

#include "tile_config.cuh"

namespace v2_tiled {

// Reductions over the 8 lanes of a row group (lanes 8g..8g+7: xor 1, 2, 4 stays inside).
__device__ __forceinline__ float row_group_max(float x) {
#pragma unroll
    for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    }
    return x;
}

__device__ __forceinline__ float row_group_sum(float x) {
#pragma unroll
    for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    }
    return x;
}

template <int ROWS>
struct OnlineSoftmaxRows {
    // -inf at the start: the first rescale factor is exp2(-inf - finite) = 0 (acc and l are 0
    // then anyway). Every row's first key tile holds key 0, which it attends, so m is finite
    // from the first tile on and exp2(-inf - (-inf)) = NaN never happens; a later tile in which
    // a row attends nothing (causal, right of the diagonal) gives alpha = 1 and p = 0.
    float running_max[ROWS];
    float lane_sum[ROWS];  // this lane's share of the row's running sum l

    __device__ __forceinline__ OnlineSoftmaxRows() {
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            running_max[i] = -INFINITY;
            lane_sum[i] = 0.0f;
        }
    }

    // Steps 1 and 2 for row i: moves the running max to include the row's tile max (given
    // this lane's part of it) and returns the factor the row's acc must be multiplied by.
    // Every lane of the row group must call it (it shuffles).
    __device__ __forceinline__ float advance_max(int i, float lane_tile_max) {
        const float new_max = fmaxf(running_max[i], row_group_max(lane_tile_max));
        const float alpha = exp2f(running_max[i] - new_max);
        running_max[i] = new_max;
        lane_sum[i] *= alpha;
        return alpha;
    }

    // Step 3: the unnormalised probability of a score under the current max, added to the
    // lane's share of the sum. A masked score (-inf) gives exactly 0.
    __device__ __forceinline__ float probability(int i, float score) {
        const float p = exp2f(score - running_max[i]);
        lane_sum[i] += p;
        return p;
    }

    // 1/l for the epilogue (every lane of the row group must call it: it shuffles).
    // l >= 1: the key holding the final max contributes exp2(0) = 1.
    __device__ __forceinline__ float inverse_sum(int i) const { return 1.0f / row_group_sum(lane_sum[i]); }
};

}  // namespace v2_tiled
