// v1_scalar: the online softmax of one query row, in fp32 and in log2 units.
//
// Scores arrive already multiplied by scale*log2(e), so exp(s - m) is exp2f(s' - m'): exp2f
// is the hardware's native exponential (MUFU.EX2), expf would add a multiply per call.
//
// Per chunk of keys, the three steps:
//   1. running max:  m_new = max(m, max_t s_t)
//   2. rescale:      alpha = exp2(m - m_new); l *= alpha; acc *= alpha   (caller scales acc)
//   3. accumulate:   p_t = exp2(s_t - m_new); l += p_t; acc += p_t * v_t (caller adds p*v)
// At the end the row's output is acc / l.
#pragma once
#include <cmath>  // INFINITY

namespace v1_scalar {

struct OnlineSoftmaxRow {
    // Starts at -inf, so the first rescale factor is exp2(-inf - finite) = 0: no special
    // case for the first chunk (acc and l are 0 then anyway). -inf - finite never makes NaN.
    float running_max = -INFINITY;
    float running_sum = 0.0f;

    // Steps 1 and 2: moves the running max to include `chunk_max` (which must be finite: every
    // chunk holds at least one unmasked key) and returns the factor acc must be multiplied by.
    __device__ __forceinline__ float advance_max(float chunk_max) {
        const float new_max = fmaxf(running_max, chunk_max);
        const float alpha = exp2f(running_max - new_max);
        running_max = new_max;
        running_sum *= alpha;
        return alpha;
    }

    // Step 3: the unnormalised probability of a score under the current max, added to the
    // sum. A masked score (-inf) gives exactly 0.
    __device__ __forceinline__ float probability(float score) {
        const float p = exp2f(score - running_max);
        running_sum += p;
        return p;
    }

    // 1/l for the epilogue. l >= 1: the key holding the max contributes exp2(0) = 1.
    __device__ __forceinline__ float inverse_sum() const { return 1.0f / running_sum; }
};

}  // namespace v1_scalar
