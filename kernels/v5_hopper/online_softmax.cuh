// The online softmax of one consumer thread's rows (2 per thread: a quad of 4 lanes shares each
// row of a warp group's 64-row slab). Runs in the exp2 domain: scores are scaled by
// scale * log2(e) inside one FFMA per element.
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <cmath>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "fragment_views.cuh"

namespace v5_hopper {

using namespace cute;

__device__ __forceinline__ float exp2_approx(float x) {
#if V5_HOPPER_FAST_EXP2
    // One MUFU.EX2: exp2f adds a compare and two multiplies per call to keep subnormal results
    // (below 2^-126), which a probability this small never needs.
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// 1 / a row's whole sum; 0 for a row that met no key (a padding row past S). One MUFU.RCP
// (rcp.approx.ftz, within 1 ulp, far below O's 16-bit rounding) where the IEEE division is a
// range check, a branch and a called slow path on the tail every call waits for (NOTES.md,
// runs 134 and 136-137).
__device__ __forceinline__ float inverse_or_zero(float whole) {
    float rcp;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(rcp) : "f"(whole));
    return whole > 0.f ? rcp : 0.f;
}

// kMaxChains, kSumChains: independent FMNMX chains per row maximum and FADD chains per tile sum
// (1 or 4 each; tunables, the first per head dim). kLazy: lazy rescaling (below; lazy_rescale).
// kLeanFastPath: the optimistic fast path spends nothing on what it keeps (max_scaled, and o_scale
// left alone). Each keeps two more registers live across the key loop: with o_scale left alone the
// D=128 split kernels spilled 8 bytes, so only the D=64 kernels take it.
template <int kRows, int kMaxChains, int kSumChains, bool kLazy, bool kLeanFastPath = false>
struct OnlineSoftmax {
    static constexpr int kRowsPerThread = kRows;
    float row_max[kRows];   // running maximum score of each row (unscaled), -inf before any key
    float row_sum[kRows];   // this thread's share of each row's running sum; the quad adds them at the end
    // With kLeanFastPath, scaled_max(row_max[r]), set wherever row_max is: the optimistic fast path,
    // which keeps the maximum, then spends nothing on it (otherwise an FMUL, an FSETP and an FSEL a row
    // every pass).
    float max_scaled[kLeanFastPath ? kRows : 1];
    float scale_log2;

    __device__ explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) {
            row_max[r] = -INFINITY;
            row_sum[r] = 0.f;
            if constexpr (kLeanFastPath) max_scaled[r] = 0.f;   // scaled_max(-inf)
        }
    }

    // With lazy rescaling a row keeps its running maximum until a tile's maximum exceeds it by more
    // than this (in exp2 units), so most tiles leave O and the sums unscaled; probabilities then
    // reach at most 2^8, far inside fp16's and bf16's range, and the final 1/sum uses the same
    // maximum as every term, so the result is the same softmax.
    static constexpr float kLazyThresholdLog2 = 8.f;

    // One key tile: (1) the new running maximum of each row, (2) the factor that rescales what was
    // accumulated against the old maximum (returned in o_scale, for the O rows), (3) the scores
    // turned in place into unnormalised probabilities exp2((s - max) * scale_log2), added to the sum.
    // Returns whether some row of this thread changed its maximum (o_scale not all 1).
    template <bool kFirstTile, class ScoresRowCol>
    __device__ bool update(ScoresRowCol& s, float (&o_scale)[kRows]) {
        static_assert(decltype(size<0>(s))::value == kRows);
        bool rescaled = !kLazy;
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) {
            update_row<kFirstTile, kLazy>(s, r, o_scale, rescaled, row_writer(s, r));
        }
        return rescaled;
    }

    // update<true> with the probabilities written to p, a fragment of their own (S stays intact).
    template <class ScoresRowCol, class ProbsRowCol>
    __device__ void first_update_into(ScoresRowCol const& s, ProbsRowCol& p, float (&o_scale)[kRows]) {
        bool rescaled = false;
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) {
            update_row<true, kLazy>(s, r, o_scale, rescaled, row_writer(p, r));
        }
    }

    // Each thread's sum of a row's probabilities bounds every one of them.
    static constexpr float kOptimisticSumLimit = 256.f;   // 2^kLazyThresholdLog2

    // A tile after the first, optimistically (lazy_rescale 3 and 4): each row is exponentiated
    // against its running maximum before the tile's own maximum is known, so its 32 FMNMX and the
    // quad's shuffles are skipped. Where every thread of the warp has a sum of at most 2^8 for the row,
    // every probability is at most 2^8: the row is what lazy rescaling makes of it, maximum kept.
    // Otherwise (a new maximum more than a few powers of 2 up, an overflow, a NaN) the warp takes the
    // exact path for that row from the scores, still intact, and moves to the tile's maximum. Both
    // paths write the probabilities to p, a fragment of their own: written back into the scores'
    // fragment (the next Q K^T's accumulator), they cost 64 moves a step.
    // kOneVote: both rows' exponentials in one block and one vote for the thread's rows, where the
    // exact path then runs for both (the split kernels, one warp a sub-partition: MUFU stays busy
    // across the rows, and one vote and branch a tile instead of two; NOTES.md, run 162).
    template <bool kOneVote = false, class ScoresRowCol, class ProbsRowCol>
    __device__ bool update_optimistic(ScoresRowCol const& s, ProbsRowCol& p, float (&o_scale)[kRows]) {
        static_assert(kLazy, "the optimistic update keeps maxima as lazy rescaling does");
        bool rescaled = false;
        if constexpr (kOneVote) {
            float tile_sums[kRows];
            bool within = true;
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kRows; ++r) {
                tile_sums[r] = exponentiate_row(s, r, running_scaled_max(r), row_writer(p, r));
                within = within && tile_sums[r] <= kOptimisticSumLimit;
            }
            if (__all_sync(0xffffffff, within)) {
                // With kLeanFastPath o_scale is left as it was: the whole warp took this path, so it reports
                // no rescale, and o_scale is read only after one (every thread then took the exact path below).
                CUTLASS_PRAGMA_UNROLL
                for (int r = 0; r < kRows; ++r) {
                    if constexpr (!kLeanFastPath) o_scale[r] = 1.f;
                    row_sum[r] += tile_sums[r];
                }
                return false;
            }
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kRows; ++r) {
                update_row<false, false>(s, r, o_scale, rescaled, row_writer(p, r));
            }
            return true;
        } else {
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kRows; ++r) {
                const float tile_sum = exponentiate_row(s, r, running_scaled_max(r), row_writer(p, r));
                if (__all_sync(0xffffffff, tile_sum <= kOptimisticSumLimit)) {
                    o_scale[r] = 1.f;
                    row_sum[r] += tile_sum;
                } else {
                    update_row<false, false>(s, r, o_scale, rescaled, row_writer(p, r));
                    rescaled = true;
                }
            }
            return rescaled;
        }
    }

    // update's row r, its probabilities written to out(c); kKeep: keep the running maximum unless
    // the tile's exceeds it by more than kLazyThresholdLog2 (and set `rescaled` where it does).
    template <bool kFirstTile, bool kKeep, class ScoresRowCol, class Out>
    __device__ void update_row(ScoresRowCol const& s, int r, float (&o_scale)[kRows], bool& rescaled, Out&& out) {
        float m = quad_max(row_max_of<kFirstTile>(s, r, row_max[r]));
        bool kept = false;   // the running maximum stands: scale exactly 1 (an FFMA would leave its rounding)
        if constexpr (kKeep && !kFirstTile) {
            // Both -inf (a row that met only masked keys): NaN compares false, the row stays -inf.
            if ((m - row_max[r]) * scale_log2 > kLazyThresholdLog2) {
                rescaled = true;
            } else {
                m = row_max[r];
                kept = true;
            }
        }
        const float m_scaled = scaled_max(m);
        o_scale[r] = kFirstTile || kept ? 1.f : exp2_approx(row_max[r] * scale_log2 - m_scaled);
        row_max[r] = m;
        if constexpr (kLeanFastPath) max_scaled[r] = m_scaled;
        const float tile_sum = exponentiate_row(s, r, m_scaled, out);
        row_sum[r] = kFirstTile ? tile_sum : fmaf(row_sum[r], o_scale[r], tile_sum);
    }

    // A row's maximum in exp2 units; a row that has met only masked keys keeps max -inf: offset by
    // 0, so exp2 gives 0, not NaN.
    __device__ float scaled_max(float m) const { return m == -INFINITY ? 0.f : m * scale_log2; }

    __device__ float running_scaled_max(int r) const {
        if constexpr (kLeanFastPath) {
            return max_scaled[r];
        } else {
            return scaled_max(row_max[r]);
        }
    }

    // Row r of a row/column view as what exponentiate_row writes, one probability at a time. A 16-bit
    // view (P written straight into the next P V's operand: the wide split kernel) keeps an even
    // column's value until the odd one comes and stores the two as one converted pair; the sums
    // still add the fp32 values.
    template <class RowCol>
    struct RowWriter {
        using Element = typename std::remove_reference_t<RowCol>::value_type;
        RowCol& p;
        int r;
        float even = 0.f;

        __device__ void put(int c, float v) {
            if constexpr (std::is_same_v<Element, float>) {
                p(r, c) = v;
            } else if (c % 2 == 0) {
                even = v;
            } else {
                const cutlass::Array<Element, 2> packed = to_pair<Element>(even, v);
                p(r, c - 1) = packed[0];
                p(r, c) = packed[1];
            }
        }
    };
    template <class RowCol>
    __device__ static RowWriter<RowCol> row_writer(RowCol& p, int r) {
        return {p, r};
    }

    // out.put(c, exp2(s(r, c) * scale_log2 - m_scaled)) for row r (row_writer); returns their sum, as
    // kSumChains independent FADD chains (one chain of 32 dependent adds sits on each warp's softmax
    // path, like the row maximum's did). Each chain starts at its first value, not at an add to 0
    // (the same sum bit for bit: every value is at least +0).
    template <class ScoresRowCol, class Out>
    __device__ float exponentiate_row(ScoresRowCol const& s, int r, float m_scaled, Out&& out) const {
        constexpr int kCols = decltype(size<1>(s))::value;
        static_assert(kCols % 2 == 0, "16-bit writers store column pairs");
        constexpr int kSums = kCols % kSumChains == 0 ? kSumChains : 1;
        float sums[kSums];
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kCols; ++c) {
            const float v = exp2_approx(fmaf(s(r, c), scale_log2, -m_scaled));
            out.put(c, v);
            if (c < kSums) {
                sums[c] = v;
            } else {
                sums[c % kSums] += v;
            }
        }
        float tile_sum = sums[0];
        CUTLASS_PRAGMA_UNROLL
        for (int j = 1; j < kSums; ++j) tile_sum += sums[j];
        return tile_sum;
    }

    // The maximum of row r's scores (and the running maximum) as kMaxChains independent chains:
    // one chain of 32 dependent FMNMX per row was a tenth of the consumers' stall samples on the
    // H100 at D=128 (NOTES.md, run 12), where four chains pay; at D=64 one chain measured faster
    // (run 13). Max is exact in any order, so the output is the same bit for bit.
    template <bool kFirstTile, class ScoresRowCol>
    __device__ static float row_max_of(ScoresRowCol const& s, int r, float running) {
        constexpr int kCols = decltype(size<1>(s))::value;
        constexpr int kChains = kCols % kMaxChains == 0 ? kMaxChains : 1;
        float chain[kChains];
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kChains; ++j) chain[j] = s(r, j);
        CUTLASS_PRAGMA_UNROLL
        for (int c = kChains; c < kCols; ++c) chain[c % kChains] = fmaxf(chain[c % kChains], s(r, c));
        float m = kFirstTile ? chain[0] : fmaxf(chain[0], running);
        CUTLASS_PRAGMA_UNROLL
        for (int j = 1; j < kChains; ++j) m = fmaxf(m, chain[j]);
        return m;
    }

    // Each row's whole sum: the quad's shares added.
    __device__ void whole_sums(float (&whole)[kRows]) const {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) whole[r] = quad_sum(row_sum[r]);
    }

    // 1 / (each row's whole sum), inverse_or_zero.
    __device__ void inverse_sums(float (&inv)[kRows]) const {
        float whole[kRows];
        whole_sums(whole);
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) inv[r] = inverse_or_zero(whole[r]);
    }
};

// Multiplies each row of an accumulator (row/column view) by its factor.
template <int kRows, class AccRowCol>
__device__ void scale_rows(AccRowCol& acc, float const (&factor)[kRows]) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(acc); ++c) acc(r, c) *= factor[r];
    }
}

}  // namespace v5_hopper
