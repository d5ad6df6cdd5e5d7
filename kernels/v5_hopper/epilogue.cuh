// Writes a consumer warp group's normalised O rows, only rows that exist (row < S), one of three
// ways (tunable tma_epilogue, and the split kernels' own):
//   store_rows: straight from registers, two neighbouring columns per 4-byte store, so each
//     warp store fills half of every 32-byte sector it touches;
//   store_slab_tma: the warp group's 64-row slab to shared memory with stmatrix, then one TMA
//     store issued by one thread, which the warp group does not wait for: the next tile's work
//     overlaps it, and only the next epilogue waits until the copy has read the slab;
//   store_warp_rows_staged (split kernels): one warp's 16 rows through shared memory it has to
//     itself, then 16 bytes a lane, whole rows per warp store.
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>

#include "fragment_views.cuh"
#include "tile_scheduler.cuh"

namespace v5_hopper {

using namespace cute;

template <int kHeadDim, class AccRowCol, class CoordRowCol, class Element>
__device__ void store_rows(AccRowCol const& o, CoordRowCol const& coord, Element* o_tile, int rows) {
    cutlass::NumericArrayConverter<Element, float, 2> convert;
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
        for (int c = 0; c < size<1>(o); c += 2) {
            cutlass::Array<float, 2> pair;
            pair[0] = o(r, c);
            pair[1] = o(r, c + 1);
            *reinterpret_cast<cutlass::Array<Element, 2>*>(o_row + (get<1>(coord(r, c)) - get<1>(coord(r, 0)))) =
                convert(pair);
        }
    }
}

// A split owner warp's 16 rows of O through `stage` (16 rows x kHeadDim elements of shared memory
// the warp has to itself), so that each global store is 16 bytes a lane and a warp store writes
// whole rows. From registers, each warp store wrote 16-byte pieces of 8 rows, half of every sector
// it touched, and a grid of 128 CTAs draining 4 KB each that way took 0.4 µs a call longer than
// the same bytes coalesced (NOTES.md, run 150b). The 16-byte chunk j of row r sits at chunk
// j ^ (r mod 8) of its row in `stage`, so neither the 4-byte writes (8 rows, one chunk each) nor the
// 16-byte reads (a row a quarter-warp) meet a bank twice.
template <int kHeadDim, class AccRowCol, class CoordRowCol, class Element>
__device__ void store_warp_rows_staged(AccRowCol const& o, CoordRowCol const& coord, Element* o_tile, int rows,
                                       char* stage, int lane) {
    static_assert(sizeof(Element) == 2, "16-bit O");
    constexpr int kRowBytes = kHeadDim * 2;
    constexpr int kChunks = kRowBytes / 16;
    constexpr int kWarpRows = 16;
    static_assert(decltype(size<0>(o))::value == 2, "a thread holds rows l/4 and l/4 + 8 of its warp's 16");
    const int warp_row0 = get<0>(coord(0, 0)) & ~(kWarpRows - 1);
    cutlass::NumericArrayConverter<Element, float, 2> convert;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(o); ++r) {
        const int row = get<0>(coord(r, 0)) - warp_row0;
        const int lane_col = get<1>(coord(r, 0));   // the lane's column in each 8-column chunk
        char* stage_row = stage + row * kRowBytes + lane_col * 2;
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(o); c += 2) {
            const int chunk = (get<1>(coord(r, c)) - lane_col) / 8;   // a constant for each c
            cutlass::Array<float, 2> pair;
            pair[0] = o(r, c);
            pair[1] = o(r, c + 1);
            *reinterpret_cast<cutlass::Array<Element, 2>*>(stage_row + ((chunk ^ (row & 7)) * 16)) = convert(pair);
        }
    }
    __syncwarp();
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kWarpRows * kChunks / 32; ++i) {
        const int row = (i * 32 + lane) / kChunks;
        const int chunk = lane % kChunks;
        const uint4 value = *reinterpret_cast<uint4 const*>(stage + row * kRowBytes + ((chunk ^ (row & 7)) * 16));
        if (warp_row0 + row < rows) {
            *reinterpret_cast<uint4*>(o_tile + (warp_row0 + row) * kHeadDim + chunk * 8) = value;
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
