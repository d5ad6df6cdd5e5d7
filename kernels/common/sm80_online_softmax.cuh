// The mma.sync rungs (v3_mma, v4_pipelined): the online softmax of the two query rows a lane holds, in fp32 and log2 units.
//
// In the mma C layout lane l holds rows l/4 and l/4 + 8 of its warp's 16 (2 columns of each
// n8 tile); the 4 lanes of a quad share those rows. So each row's statistics are owned by one
// warp, kept identical in the quad's 4 lanes by xor-shuffles: no shared memory, no races on m.
// The running sum l stays per lane (its partial over the lane's columns) and is summed over the
// quad once, in the epilogue: every lane rescales by the same alpha, so the partials stay exact.
//
// Per key tile, the three steps for each row:
//   1. running max:  m_new = max(m, scale_log2 * max_j s_j)            (quad max-reduce)
//   2. rescale:      alpha = exp2(m - m_new); l *= alpha; O_row *= alpha
//   3. accumulate:   p_j = exp2(scale_log2 * s_j - m_new); l += p_j; P = p as fp16/bf16
#pragma once
#include <cmath>  // INFINITY
#include <cstdint>

#include "sm80_mma_primitives.cuh"
#include "sm80_tile_layout.cuh"

namespace evo_sm80 {

// Masks a tile's scores: key past S, or (causal) key later than the query row -> -inf.
template <class Tr>
__device__ __forceinline__ void mask_scores(float (&s)[Tr::kScoreTiles][4], int first_row_of_warp, int first_key,
                                            int seq_len, bool causal, int lane) {
#pragma unroll
    for (int j = 0; j < Tr::kScoreTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = first_row_of_warp + frag_row(lane, e);
            const int key = first_key + 8 * j + frag_col(lane, e);
            if (key >= seq_len || (causal && key > row)) s[j][e] = -INFINITY;
        }
    }
}

template <class Tr>
struct OnlineSoftmax {
    static constexpr int kRows = 2;  // rows lane/4 and lane/4 + 8
    float running_max[kRows];        // log2 units (scaled by scale*log2(e)); -inf before any key
    float running_sum[kRows];        // this lane's partial sum, under running_max

    __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            running_max[r] = -INFINITY;
            running_sum[r] = 0.0f;
        }
    }

    // One key tile: the three steps. Takes the raw scores s (masked entries -inf), rescales the
    // output accumulator o, and returns P packed as the A fragments of P*V. scale_log2 > 0.
    __device__ __forceinline__ void step(const float (&s)[Tr::kScoreTiles][4], float (&o)[Tr::kOutTiles][4],
                                         uint32_t (&p_frag)[Tr::kScoreTiles][2], float scale_log2) {
        // max(scale * s) = scale * max(s) for scale > 0: one multiply per row, not per score.
        float max_base[kRows];  // the exponent base of step 3, per row
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            // Step 1: running max. Registers 2r, 2r+1 of each n8 tile belong to row r.
            float tile_max = -INFINITY;
#pragma unroll
            for (int j = 0; j < Tr::kScoreTiles; ++j) tile_max = fmaxf(tile_max, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
            tile_max = quad_allreduce_max(tile_max);
            const float new_max = fmaxf(running_max[r], tile_max * scale_log2);
            // A row with every key masked so far keeps max -inf; base 0 then gives p = exp2(-inf) = 0
            // and alpha = 1 instead of NaN from -inf - -inf.
            max_base[r] = new_max == -INFINITY ? 0.0f : new_max;
            // Step 2: rescale. alpha = exp2(-inf - finite) = 0 on the first tile: O and l are 0 then.
            const float alpha = fast_exp2(running_max[r] - max_base[r]);
            running_max[r] = new_max;
            running_sum[r] *= alpha;
#pragma unroll
            for (int d = 0; d < Tr::kOutTiles; ++d) {
                o[d][2 * r] *= alpha;
                o[d][2 * r + 1] *= alpha;
            }
        }
        // Step 3: probabilities (one FFMA + one MUFU.EX2 each), the sum, and P in 16 bits.
#pragma unroll
        for (int j = 0; j < Tr::kScoreTiles; ++j) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const float p0 = fast_exp2(fmaf(s[j][2 * r], scale_log2, -max_base[r]));
                const float p1 = fast_exp2(fmaf(s[j][2 * r + 1], scale_log2, -max_base[r]));
                running_sum[r] += p0 + p1;
                p_frag[j][r] = Tr::elem_traits::pack(p0, p1);
            }
        }
    }

    // 1/l per row for the epilogue: the quad's partial sums added. l >= 1 for every row that
    // attends at least one key (its max key gives exp2(0) = 1); 0 is returned otherwise
    // (only rows past S, which are never stored).
    __device__ __forceinline__ void inverse_sums(float (&inv)[kRows]) const {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const float total = quad_allreduce_sum(running_sum[r]);
            inv[r] = total > 0.0f ? 1.0f / total : 0.0f;
        }
    }
};

}  // namespace evo_sm80
