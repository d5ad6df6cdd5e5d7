// Writes a consumer warp group's normalised O rows, only rows that exist (row < S), one of two
// ways (tunable tma_epilogue):
//   store_rows: straight from registers, two neighbouring columns per 4-byte store, so each
//     warp store fills half of every 32-byte sector it touches;
//   store_slab_tma: the warp group's 64-row slab to shared memory with stmatrix, then one TMA
//     store issued by one thread, which the warp group does not wait for: the next tile's work
//     overlaps it, and only the next epilogue waits until the copy has read the slab.
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>

#include "fragment_views.cuh"
#include "tile_scheduler.cuh"

namespace v5_hopper {

using namespace cute;

// Columns [kBegin, kEnd) of the row view (kEnd -1: to the last).
template <int kHeadDim, int kBegin = 0, int kEnd = -1, class AccRowCol, class CoordRowCol, class Element>
__device__ void store_rows(AccRowCol const& o, CoordRowCol const& coord, Element* o_tile, int rows) {
    constexpr int kStop = kEnd < 0 ? int(decltype(size<1>(o))::value) : kEnd;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(o); ++r) {
        const int row = get<0>(coord(r, 0));
        if (row >= rows) continue;
        // One address per row; every column a constant offset from the thread's first (the
        // difference of two coordinates sharing the lane's term), so each store takes an immediate
        // offset instead of a 64-bit address of its own (NOTES.md, run 48).
        Element* o_row = o_tile + row * kHeadDim + get<1>(coord(r, 0));
        // Columns c and c + 1 of the row view are neighbours in memory (the accumulator's pairs).
        CUTLASS_PRAGMA_UNROLL
        for (int c = kBegin; c < kStop; c += 2) {
            *reinterpret_cast<cutlass::Array<Element, 2>*>(o_row + (get<1>(coord(r, c)) - get<1>(coord(r, 0)))) =
                to_pair<Element>(o(r, c), o(r, c + 1));
        }
    }
}

// Named barriers of the slab epilogue: one per warp group, after the ping-pong's ids (0..2).
constexpr uint32_t kEpilogueBarrier = 3;

// `acc` is the warp group's O accumulator (wgmma C layout), already normalised; `thread` is the
// thread's index within its warp group (0..127). The thread that issues the store also waits
// for the group's previous one, so every CTA's last call must be followed by store_slab_drain.
template <class Traits, class Accumulator>
__device__ void store_slab_tma(Accumulator const& acc, typename Traits::Params const& params,
                               typename Traits::SharedStorage& shared, TileCoord tile, int group, int thread) {
    using Element = typename Traits::Element;
    constexpr uint32_t kGroupThreads = cutlass::NumThreadsPerWarpGroup;
    // NamedBarrier adds CUTLASS's reserved ids to ours; the hardware has 16.
    static_assert(uint32_t(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier) + kEpilogueBarrier +
                      Traits::kConsumerWarpGroups <= 16,
                  "the epilogue's named barriers run past the hardware's 16");
    Tensor sO = make_tensor(make_smem_ptr(shared.o.data()), typename Traits::SmemLayoutO{});   // (64, D, groups)

    typename Traits::TiledMmaPVSlab mma;
    auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
    auto thr_copy = copy_o.get_thread_slice(thread);
    Tensor o16 = make_tensor_like<Element>(acc);
    convert_pairs(acc, o16);
    Tensor src = thr_copy.retile_S(o16);
    Tensor dst = thr_copy.partition_D(sO);   // (CPY, CPY_M, CPY_N, groups)

    const bool issuer = thread == 0;
    if (issuer) tma_store_wait<0>();   // the previous tile's store has read this slab
    cutlass::arch::NamedBarrier::sync(kGroupThreads, kEpilogueBarrier + group);
    copy(copy_o, src, dst(_, _, _, group));
    cutlass::arch::fence_view_async_shared();   // the generic-proxy writes, visible to the TMA unit
    cutlass::arch::NamedBarrier::sync(kGroupThreads, kEpilogueBarrier + group);
    if (issuer) {
        const auto shape = make_shape(params.seq_len, int(Traits::kHeadDim), params.heads, params.batch);
        Tensor mO = params.tma_o.get_tma_tensor(shape);
        Tensor gO = local_tile(mO(_, _, tile.head, tile.batch), typename Traits::SlabShapeO{},
                               make_coord(tile.m_block * Traits::kConsumerWarpGroups + group, _0{}));
        auto [tOg, tOs] = tma_partition(params.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
        copy(params.tma_o, tOs(_, group), tOg);   // rows past S are outside the tensor: not written
        tma_store_arrive();
    }
}

// Before the CTA exits: its last stores have finished reading shared memory.
__device__ inline void store_slab_drain(int thread) {
    if (thread == 0) tma_store_wait<0>();
}

}  // namespace v5_hopper
