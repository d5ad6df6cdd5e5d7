// v4_pipelined: the K/V pipeline. A ring of kStages shared-memory stages, each a [K tile | V tile]
// pair of kStepKeys rows, filled with cp.async kStages-1 steps ahead of the step being multiplied.
// (A "step" is one key tile; with key groups, kKeyGroups consecutive tiles of kBlockN keys, key
// group g taking the g-th.)
//
// Commit-group protocol (cp.async groups complete in order, per thread):
//   group 0          Q (into the spare tile: the last stage, which no key tile uses before the loop)
//   groups 1..s-1    key tiles 0 .. s-2 (s = kStages), one group each
//   loop, tile t     wait until at most s-2 groups are in flight -> tile t's group is complete;
//                    one barrier -> every thread's copies are visible, and every warp has finished
//                    tile t-1, whose stage ((t-1) % s == (t+s-1) % s) is refilled right after
//                    with tile t+s-1, one more group.
// A group is committed even when there is no tile left to load (an empty group), so the count
// "s-2 in flight" always means "tile t done" and the loop needs no special last iterations.
//
// What it buys over v3_mma's single stage: the copy of tile t+1 (and t+2) is in flight during the
// whole of tile t (Q K^T, softmax and P V) instead of only one of its halves, and one barrier per
// key tile instead of three. Measured on an H200 (NOTES.md): long-scoreboard stalls 31% -> 14% and
// 10.6 -> 8.9 us on (2,8,512,64) under graph replay; no gain on the big causal shapes, where two
// CTAs per SM already hid v3's loads (there the run-time stage base costs ~7% more instructions).
#pragma once
#include <cstdint>

#include "sm80_mma_primitives.cuh"
#include "tile_layout.cuh"
#include "tile_traits.cuh"

namespace v4_pipelined {

template <class Tr>
struct KvPipeline {
    using T = typename Tr::elem_t;

    T* smem;          // kStages x [K tile | V tile], swizzled rows
    const T* k_head;  // this head's [S, D] slabs in global memory
    const T* v_head;
    int seq_len;
    int tile_end;     // steps this CTA attends: [0, tile_end), counted from first_tile
    int first_tile;   // the key tile of step 0: 0, or a cluster rank's share (cluster_split.cuh)

    static __device__ __forceinline__ int stage_of(int tile) { return tile % Tr::kStages; }

    __device__ __forceinline__ T* k_tile(int stage) const { return smem + stage * Tr::kStageElems; }
    __device__ __forceinline__ T* v_tile(int stage) const { return k_tile(stage) + Tr::kKvTileElems; }
    // Key group g's kBlockN rows of a stage: a whole number of 8-row swizzle periods further on,
    // so the swizzle pattern is the same as at the start of the tile.
    __device__ __forceinline__ T* k_tile(int stage, int key_group) const {
        return k_tile(stage) + key_group * Tr::kWarpKvElems;
    }
    __device__ __forceinline__ T* v_tile(int stage, int key_group) const {
        return v_tile(stage) + key_group * Tr::kWarpKvElems;
    }
    // The last stage: holds Q before the loop (its first key tile, kStages-1, is issued only
    // after every warp has copied Q to registers) and stages O after the loop.
    __device__ __forceinline__ T* spare_tile() const { return k_tile(Tr::kStages - 1); }

    // Issues key tile `tile` (K and V) into its stage if the CTA attends it, then closes one
    // commit group either way.
    __device__ __forceinline__ void issue(int tile) const {
        if (tile < tile_end) {
            const int stage = stage_of(tile);
            const int first_key = (first_tile + tile) * Tr::kStepKeys;
            load_tile_async<Tr, Tr::kStepKeys>(k_tile(stage), k_head, first_key, seq_len);
            load_tile_async<Tr, Tr::kStepKeys>(v_tile(stage), v_head, first_key, seq_len);
        }
        cp_async_commit();
    }

    // Prologue, after Q's group: key tiles 0 .. kStages-2.
    __device__ __forceinline__ void prime() const {
#pragma unroll
        for (int tile = 0; tile < Tr::kStages - 1; ++tile) issue(tile);
    }

    // Waits for Q (the first group) while the key tiles of the prologue may still fly.
    __device__ __forceinline__ void wait_for_q() const {
        cp_async_wait<Tr::kStages - 1>();
        __syncthreads();
    }

    // Top of key tile `tile`: returns once tile `tile` is in its stage for every thread. From
    // then on the stage of tile-1 is free: `refill(tile)` issues tile + kStages-1 into it.
    __device__ __forceinline__ void wait_for(int tile) const {
        (void)tile;
        cp_async_wait<Tr::kStages - 2>();  // this thread's copies of `tile` have landed
        __syncthreads();                   // everyone's have; every warp is done with tile-1
    }
    __device__ __forceinline__ void refill(int tile) const { issue(tile + Tr::kStages - 1); }

    // After the loop: every warp is done reading the stages (so the spare tile may be
    // overwritten). No copy is in flight then: the groups after the last tile are empty.
    __device__ __forceinline__ void drain() const {
        cp_async_wait<0>();
        __syncthreads();
    }
};

}  // namespace v4_pipelined
