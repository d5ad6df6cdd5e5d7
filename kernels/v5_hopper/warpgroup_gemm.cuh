// One warp group's matrix product C (+)= A B over every K slice, issued as one wgmma batch and
// not waited for: the caller decides when to `warpgroup_wait`, so a product can run under the
// softmax of the previous tile.
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

namespace v5_hopper {

using namespace cute;

template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorC>
__device__ __forceinline__ void warpgroup_gemm(TiledMma& mma, TensorA const& a, TensorB const& b, TensorC& c) {
    // A is either wgmma shared-memory descriptors (Q) or 16-bit values in registers (P).
    constexpr bool kARegisters =
        !std::is_same_v<typename TensorA::engine_type::iterator, GMMA::DescriptorIterator>;
    // The fences pin the register operands: no read or write of them moves across the issue.
    if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TensorA&>(a));
    warpgroup_fence_operand(c);
    warpgroup_arrive();
    mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < size<2>(a); ++k) {
        cute::gemm(mma, a(_, _, k), b(_, _, k), c);
        mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(c);
    if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TensorA&>(a));
}

}  // namespace v5_hopper
