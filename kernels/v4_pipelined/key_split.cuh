// v4_pipelined: merging the key groups. With kKeyGroups > 1, the warps of group g saw only the
// keys of their own kBlockN columns of each step, so for the same query rows each group holds a
// partial online-softmax state over disjoint keys: a running max m_g, a (per-lane) running sum
// l_g and an unnormalised output O_g, all relative to 2^m_g. The merge is one more rescale step:
//   m = max_g m_g,   l = sum_g 2^(m_g - m) l_g,   O = sum_g 2^(m_g - m) O_g
// Groups 1.. write their state to shared memory, key group 0 folds it into its registers and
// alone runs the epilogue. What it buys (H200, NOTES.md): twice the warps on a grid of one CTA
// per SM; 8.9 -> 8.3 us on (2,8,512,64) and 8.4 -> 7.6 us on (1,8,512,64) under graph replay.
#pragma once
#include <cmath>  // INFINITY
#include <cstdint>

#include "sm80_mma_primitives.cuh"
#include "sm80_online_softmax.cuh"
#include "tile_traits.cuh"

namespace v4_pipelined {

// One warp's partial state, lane-major: float i of lane l at [i * 32 + l], so each store or
// load of one register across the warp is 128 contiguous bytes (no bank conflict).
template <class Tr>
struct PartialState {
    static constexpr int kRows = OnlineSoftmax<Tr>::kRows;
    static constexpr int kFloats = 2 * kRows + 4 * Tr::kOutTiles;  // max, sum, O per lane
    static constexpr int kWarpFloats = kFloats * kWarpSize;
    static constexpr int kBytes = (Tr::kKeyGroups - 1) * Tr::kRowWarps * kWarpFloats * 4;

    // Slot of (key group g >= 1, row warp): the buffer is the stages other than the spare one,
    // which key group 0 uses to stage O while other warps' slots may still be read.
    static __device__ __forceinline__ float* slot(float* buffer, int key_group, int row_warp) {
        return buffer + ((key_group - 1) * Tr::kRowWarps + row_warp) * kWarpFloats;
    }

    static_assert(kBytes <= (Tr::kStages - 1) * Tr::kStageElems * static_cast<int>(sizeof(typename Tr::elem_t)),
                  "the partial states must fit in the stages below the spare one");
};

template <class Tr>
__device__ __forceinline__ void store_partial_state(float* slot, const OnlineSoftmax<Tr>& softmax,
                                                    const float (&o)[Tr::kOutTiles][4], int lane) {
    using PS = PartialState<Tr>;
#pragma unroll
    for (int r = 0; r < PS::kRows; ++r) {
        slot[r * kWarpSize + lane] = softmax.running_max[r];
        slot[(PS::kRows + r) * kWarpSize + lane] = softmax.running_sum[r];
    }
#pragma unroll
    for (int d = 0; d < Tr::kOutTiles; ++d) {
#pragma unroll
        for (int e = 0; e < 4; ++e) slot[(2 * PS::kRows + 4 * d + e) * kWarpSize + lane] = o[d][e];
    }
}

// Folds another partial state of the same rows over other keys into this warp's: the other's
// max and sum of row r, and `other_o(d, e)` its output register e of n8 tile d (the same lane
// layout). A row none of whose keys either side has seen keeps max -inf: base 0 keeps the
// weights exp2(-inf) = 0 instead of NaN (only rows past S, never stored).
template <class Tr, class OtherO>
__device__ __forceinline__ void fold_partial_state(OnlineSoftmax<Tr>& softmax, float (&o)[Tr::kOutTiles][4],
                                                   const float (&other_max)[OnlineSoftmax<Tr>::kRows],
                                                   const float (&other_sum)[OnlineSoftmax<Tr>::kRows],
                                                   const OtherO& other_o) {
    constexpr int kRows = OnlineSoftmax<Tr>::kRows;
    float mine_scale[kRows], other_scale[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const float new_max = fmaxf(softmax.running_max[r], other_max[r]);
        const float base = new_max == -INFINITY ? 0.0f : new_max;
        mine_scale[r] = fast_exp2(softmax.running_max[r] - base);
        other_scale[r] = fast_exp2(other_max[r] - base);
        softmax.running_max[r] = new_max;
        softmax.running_sum[r] = softmax.running_sum[r] * mine_scale[r] + other_sum[r] * other_scale[r];
    }
    // Registers 2r, 2r+1 of each n8 tile belong to row r; one tile's four registers in a row, so
    // a source that reads them as one 16-byte chunk reads it once.
#pragma unroll
    for (int d = 0; d < Tr::kOutTiles; ++d) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[d][e] = o[d][e] * mine_scale[e / 2] + other_o(d, e) * other_scale[e / 2];
    }
}

// Folds the partial state in `slot` (the same rows, other keys; same lane layout) into this warp's.
template <class Tr>
__device__ __forceinline__ void merge_partial_state(const float* slot, OnlineSoftmax<Tr>& softmax,
                                                    float (&o)[Tr::kOutTiles][4], int lane) {
    using PS = PartialState<Tr>;
    float other_max[PS::kRows], other_sum[PS::kRows];
#pragma unroll
    for (int r = 0; r < PS::kRows; ++r) {
        other_max[r] = slot[r * kWarpSize + lane];
        other_sum[r] = slot[(PS::kRows + r) * kWarpSize + lane];
    }
    fold_partial_state<Tr>(softmax, o, other_max, other_sum, [&](int d, int e) {
        return slot[(2 * PS::kRows + 4 * d + e) * kWarpSize + lane];
    });
}

}  // namespace v4_pipelined
