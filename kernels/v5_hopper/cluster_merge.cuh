// The cluster key split (issue 8): on a grid that would leave SMs idle (the launch-bound shapes,
// e.g. (1,8,512,64): 32 query tiles of 128 rows on 132 SMs), the S CTAs of a cluster (2 or 4)
// take the same query tile and a contiguous share of its key tiles each (TileScheduler::key_span),
// so each ends its key loop with a partial softmax state (max, sum, unnormalised O) of every row.
//
// The merge is pushed: the rows of consumer warp w are finished by rank w % S, its owner; every
// other rank's warp w writes its state with st.async into the owner's receive slots, counted in
// bytes on the owner's barrier for that warp, and is done. The owner waits on that barrier, folds
// the S - 1 states from its own shared memory and stores its rows. No global scratch and no fence
// (v4_pipelined's NOTES.md, run 5: pulling through distributed shared memory cost ~1 us per rank).
//
// Ordering: thread 0 initialises the receive barriers at entry (each arrival made with the bytes it
// expects) and every thread arrives on the cluster barrier; every consumer warp waits on that
// barrier before the merge, so no push reaches a barrier before it exists. The slots lie apart from the
// rings, so a push may land while the owner is still in its key loop.
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <cute/tensor.hpp>

#include "sm90_cluster.cuh"
#include "trace.cuh"
#include <cutlass/numeric_conversion.h>

namespace v5_hopper {

using namespace cute;

template <class Traits>
struct ClusterMerge {
    typename Traits::SharedStorage& shared;
    int splits;

    // splits is a power of two (cluster_splits halves from kMaxSplits): warp / splits and warp % splits
    // as a shift and a mask, no runtime division at entry or before the merge (NOTES.md, run 132).
    __device__ int shift() const { return evo_sm90::split_shift(splits); }

#if V5_DEV_COMPACT_PUSH
    // Development: a pusher sends O normalised by its rows' whole sums (bounded by the largest |V|)
    // as 16-bit pairs of the kernel's element type, and those sums in the head: 1 + D/16 chunks
    // where the float push takes 1 + D/8 (the push is bandwidth-paced: NOTES.md, run 163).
    static constexpr int kPushedBytes = (1 + Traits::kHeadDim / 16) * 16 * 32;
#else
    static constexpr int kPushedBytes = Traits::kWarpStateBytes;
#endif

    __device__ uint32_t barrier(int owned) const { return cute::cast_smem_ptr_to_uint(&shared.receive_barrier[owned]); }
    __device__ int slot_offset(int owned, int src, int owner) const {
        return (owned * (splits - 1) + (src < owner ? src : src - 1)) * Traits::kWarpStateBytes;
    }

    // Entry, thread 0: one receive barrier per owned warp, expecting S - 1 states (the caller
    // fences the initialisations).
    __device__ void init_barriers() const {
        for (int owned = 0; owned < Traits::kConsumerWarps >> shift(); ++owned) {
            evo_sm90::init_receive_barrier(barrier(owned), uint32_t((splits - 1) * kPushedBytes));
        }
    }

    // After the key loop, by every consumer warp (`warp` 0.. over the consumer warp groups): returns
    // true in the owner of the warp's rows, whose softmax state and O then cover every key (it
    // stores them); false elsewhere, where the warp has pushed its state and is done.
    template <class Softmax, class AccRowCol>
    __device__ bool merge(Softmax& softmax, AccRowCol& o, int warp, int lane, trace::Probe probe = {}) const {
        static_assert(Softmax::kRowsPerThread == 2, "chunk 0 holds two rows' max and sum");
        // O travels in its registers' order: chunk 1 + i holds values 4i..4i+3, a column pair of row
        // 0 and the same pair of row 1 (the accumulator's order, checked here); in row/column order
        // each chunk gathered four registers that are not neighbours (NOTES.md, run 48).
        constexpr int kValues = decltype(size(o))::value;
        static_assert(kValues % 4 == 0 && 1 + kValues / 4 == Traits::kSplitChunks, "O as 16-byte chunks");
        using RowCol = decltype(o.layout());
        static_assert(is_static<RowCol>::value && RowCol{}(0, 1) == 1 && RowCol{}(1, 0) == 2 && RowCol{}(0, 2) == 4,
                      "a chunk is a column pair of row 0, then of row 1");
        auto* values = o.data();
        const int rank = evo_sm90::cluster_rank();
        const int owner = warp & (splits - 1);
        const int owned = warp >> shift();
        const uint32_t receive = cute::cast_smem_ptr_to_uint(shared.receive.data());
        // Every rank's barriers exist. Owners wait too, though on the card only a pusher needs to:
        // compute-sanitizer's racecheck follows a push only past the owner's own wait (NOTES.md,
        // runs 26-28). Not the producer warps: their wait after the loads hung the card (run 27).
        evo_sm90::cluster_wait();
        probe.mark(trace::kMergeReady);
        if (owner != rank) {
            const uint32_t slot = evo_sm90::map_to_rank(receive + slot_offset(owned, rank, owner), owner);
            const uint32_t remote_barrier = evo_sm90::map_to_rank(barrier(owned), owner);
            const auto chunk_address = [&](int chunk) { return slot + (chunk * 32 + lane) * 16; };
#if V5_DEV_COMPACT_PUSH
            float total[2], inverse[2];
            softmax.inverse_sums(inverse, total);   // a rank that met no key of a row sends 0 for it
            evo_sm90::push_v4(chunk_address(0), softmax.row_max[0], softmax.row_max[1], total[0], total[1],
                              remote_barrier);
            cutlass::NumericArrayConverter<typename Traits::Element, float, 2> to_pair;
            const auto pair = [&](int i) {   // values i and i + 1 (one row), normalised, as 32 bits
                cutlass::Array<float, 2> two;
                two[0] = values[i] * inverse[(i >> 1) & 1];
                two[1] = values[i + 1] * inverse[(i >> 1) & 1];
                const auto packed = to_pair(two);
                return __uint_as_float(reinterpret_cast<uint32_t const&>(packed));
            };
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kValues / 8; ++i) {
                evo_sm90::push_v4(chunk_address(1 + i), pair(8 * i), pair(8 * i + 2), pair(8 * i + 4), pair(8 * i + 6),
                                  remote_barrier);
            }
#else
            evo_sm90::push_v4(chunk_address(0), softmax.row_max[0], softmax.row_max[1], softmax.row_sum[0],
                              softmax.row_sum[1], remote_barrier);
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kValues / 4; ++i) {
                evo_sm90::push_v4(chunk_address(1 + i), values[4 * i], values[4 * i + 1], values[4 * i + 2],
                                  values[4 * i + 3], remote_barrier);
            }
#endif
            probe.mark(trace::kMergeLanded);
            return false;
        }
        evo_sm90::wait_barrier<0>(barrier(owned));
        probe.mark(trace::kMergeLanded);
        for (int src = 0; src < splits; ++src) {
            if (src == rank) continue;
            const float4* chunks =
                reinterpret_cast<const float4*>(shared.receive.data() + slot_offset(owned, src, rank)) + lane;
            const float4 head = chunks[0];
            const float other_max[2] = {head.x, head.y};
#if V5_DEV_COMPACT_PUSH
            // The head holds the other rank's whole sums: a quarter in each of the quad's four lanes
            // keeps this lane's sum a share that inverse_sums' quad sum completes (exact: a power of 2).
            const float other_sum[2] = {0.25f * head.z, 0.25f * head.w};
            float mine_weight[2], other_weight[2];
            softmax.fold(other_max, other_sum, mine_weight, other_weight);
            const float scale[2] = {head.z * other_weight[0], head.w * other_weight[1]};
            cutlass::NumericArrayConverter<float, typename Traits::Element, 2> from_pair;
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kValues / 8; ++i) {
                const float4 packed = chunks[(1 + i) * 32];
                const float words[4] = {packed.x, packed.y, packed.z, packed.w};
                CUTLASS_PRAGMA_UNROLL
                for (int w = 0; w < 4; ++w) {
                    const uint32_t bits = __float_as_uint(words[w]);
                    const auto two = from_pair(reinterpret_cast<cutlass::Array<typename Traits::Element, 2> const&>(bits));
                    const int v = 8 * i + 2 * w;   // values v, v + 1: row (v >> 1) & 1
                    values[v] = fmaf(values[v], mine_weight[w & 1], two[0] * scale[w & 1]);
                    values[v + 1] = fmaf(values[v + 1], mine_weight[w & 1], two[1] * scale[w & 1]);
                }
            }
#else
            const float other_sum[2] = {head.z, head.w};
            float mine_weight[2], other_weight[2];
            softmax.fold(other_max, other_sum, mine_weight, other_weight);
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kValues / 4; ++i) {
                const float4 other = chunks[(1 + i) * 32];
                values[4 * i] = fmaf(values[4 * i], mine_weight[0], other.x * other_weight[0]);
                values[4 * i + 1] = fmaf(values[4 * i + 1], mine_weight[0], other.y * other_weight[0]);
                values[4 * i + 2] = fmaf(values[4 * i + 2], mine_weight[1], other.z * other_weight[1]);
                values[4 * i + 3] = fmaf(values[4 * i + 3], mine_weight[1], other.w * other_weight[1]);
            }
#endif
        }
        return true;
    }
};

}  // namespace v5_hopper
