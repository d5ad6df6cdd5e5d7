// The cluster key split (issue 8): on a grid that would leave SMs idle (the launch-bound shapes,
// e.g. (1,8,512,64): 32 query tiles of 128 rows on 132 SMs), the S CTAs of a cluster (2 or 4)
// take the same query tile and a contiguous share of its key tiles each (TileScheduler::key_span),
// so each ends its key loop with a partial softmax state (max, sum, unnormalised O) of every row.
//
// The merge is pushed: the rows of consumer warp w are finished by rank w % S, its owner; every
// other rank's warp w writes its state with st.async into the owner's receive slots, counted in
// bytes on the owner's two barriers for that warp (the head and the first half of O on one, the
// rest on the other), and is done. The owner waits on the first, folds that half of the S - 1
// states from its own shared memory while the rest is in flight, then waits on the second, folds
// it and stores its rows. No global scratch and no fence (v4_pipelined's NOTES.md, run 5: pulling
// through distributed shared memory cost ~1 us per rank).
//
// Ordering: thread 0 initialises the receive barriers at entry (each arrival made with the bytes it
// expects) and every thread arrives on the cluster barrier; every consumer warp waits on that
// barrier before the merge, so no push reaches a barrier before it exists. The slots lie apart from the
// rings, so a push may land while the owner is still in its key loop.
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <cute/tensor.hpp>

#include "sm90_cluster.cuh"
#include "online_softmax.cuh"
#include "trace.cuh"

namespace v5_hopper {

using namespace cute;

template <class Traits>
struct ClusterMerge {
    typename Traits::SharedStorage& shared;
    int splits;

    // splits is a power of two (cluster_splits halves from kMaxSplits): warp / splits and warp % splits
    // as a shift and a mask, no runtime division at entry or before the merge (NOTES.md, run 132).
    __device__ int shift() const { return evo_sm90::split_shift(splits); }

    __device__ uint32_t barrier(int owned, int landing) const {
        return cute::cast_smem_ptr_to_uint(&shared.receive_barrier[owned * Traits::kLandings + landing]);
    }
    // The slot of the owner's `other`-th other rank (ranks in order, the owner left out).
    __device__ int slot_offset(int owned, int other) const {
        return (owned * (splits - 1) + other) * Traits::kWarpStateBytes;
    }

    // A quad's four lanes hold the same two rows, so their heads (maxima and whole sums) are equal: only the
    // quad's first lane pushes its head, and the owner reads it there (NOTES.md, runs 248 and 263).
    static constexpr int kHeadLanes = 8;

    // The compact push: at D=64 a pusher sends O normalised by its rows' whole sums as pairs of the kernel's
    // 16-bit type, 1 + D/16 chunks of 16 bytes a lane where the float push sends 1 + D/8: (2,8,512,64) took
    // 0.05 us less on an H100 than with the float push (NOTES.md, runs 247 and 263). The price is one rounding of each
    // other state to the output's type before the fold: bf16's largest parity error went from 0.00165 to 0.00241
    // on (2,8,512,64), its bound 0.0146. D=128 keeps the float push. Compact chunk 1 + j holds values 8j..8j+7
    // (words: the pairs 8j+2k, 8j+2k+1, each of one row), so the first landing (head and compact chunks below
    // kCompactFirst) carries the same columns as the float one.
    static constexpr int kValues = (Traits::kSplitChunks - 1) * 4;   // O's values in a thread
    static constexpr bool kCompactPush = Traits::kHeadDim == 64;
    static constexpr int kCompactChunks = 1 + kValues / 8;
    static constexpr int kCompactFirst = 1 + kValues / 16;
    static_assert(!kCompactPush || (kCompactFirst - 1) * 8 == (Traits::kFirstLanding - 1) * 4,
                  "the compact first landing carries the float first landing's columns");
    // The chunks a push sends (the head's included), and those of them on the first landing.
    static constexpr int kPushChunks = kCompactPush ? kCompactChunks : Traits::kSplitChunks;
    static constexpr int kPushFirst = kCompactPush ? kCompactFirst : Traits::kFirstLanding;
    using Pair = cutlass::Array<typename Traits::Element, 2>;   // one 32-bit word of a compact chunk

    // The bytes an owned warp's landing receives: its chunks of the S - 1 other states.
    template <int kLanding>
    __device__ uint32_t landing_bytes() const {
        constexpr int kChunks = kLanding == 0 ? kPushFirst : kPushChunks - kPushFirst;
        constexpr int kBytes = kChunks * Traits::kChunkBytes - (kLanding == 0 ? (32 - kHeadLanes) * 16 : 0);
        return uint32_t((splits - 1) * kBytes);
    }

    // Entry, thread 0: the most owned warps' receive barriers, each with its one arrival pending and
    // no bytes, so entry needs no split count (the caller fences). The owner's lane 0 arms its two at
    // the merge (arm_barriers); pushes that land before that take the transaction count below zero,
    // and the phase cannot complete while the arrival is pending.
    static __device__ void init_unarmed_barriers(typename Traits::SharedStorage& storage) {
        for (int i = 0; i < Traits::kMostOwnedWarps * Traits::kLandings; ++i) {
            evo_sm90::init_unarmed_barrier(cute::cast_smem_ptr_to_uint(&storage.receive_barrier[i]));
        }
    }
    __device__ void arm_barriers(int owned) const {
        static_assert(Traits::kLandings == 2, "an owned warp's states land in two halves");
        evo_sm90::arm_receive_barrier(barrier(owned, 0), landing_bytes<0>());
        evo_sm90::arm_receive_barrier(barrier(owned, 1), landing_bytes<1>());
    }

    // After the key loop, by every consumer warp (`warp` 0.. over the consumer warp groups), with the
    // rows' whole sums (`whole`, the quad's shares added): returns true in the owner of the warp's
    // rows, whose O then covers every key, normalised (it stores them); false elsewhere, where the
    // warp has pushed its state (maxima, whole sums, unnormalised O) and is done.
    // `first_half()` runs in the owner once the first half of O (chunks below kFirstLanding) is
    // final, before the second landing.
    template <class Softmax, class AccRowCol, class FirstHalf>
    __device__ bool merge(Softmax const& softmax, float const (&whole)[2], AccRowCol& o, int warp, int lane,
                          trace::Probe probe, FirstHalf&& first_half) const {
        static_assert(Softmax::kRowsPerThread == 2, "chunk 0 holds two rows' max and whole sum");
        // O travels in its registers' order: chunk 1 + i holds values 4i..4i+3, a column pair of row
        // 0 and the same pair of row 1 (the accumulator's order, checked here); in row/column order
        // each chunk gathered four registers that are not neighbours (NOTES.md, run 48).
        static_assert(decltype(size(o))::value == kValues && kValues % 8 == 0, "O as 16-byte chunks");
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
            const uint32_t slot = evo_sm90::map_to_rank(receive + slot_offset(owned, rank < owner ? rank : rank - 1), owner);
            const uint32_t first = evo_sm90::map_to_rank(barrier(owned, 0), owner);
            const uint32_t second = evo_sm90::map_to_rank(barrier(owned, 1), owner);
            const auto chunk_address = [&](int chunk) { return slot + (chunk * 32 + lane) * 16; };
            if ((lane & 3) == 0) {
                evo_sm90::push_v4(chunk_address(0), softmax.row_max[0], softmax.row_max[1], whole[0], whole[1], first);
            }
            if constexpr (kCompactPush) {
                // Normalised O is bounded by the largest |V|, so the 16-bit type cannot overflow; a row this
                // rank met no key of sends zeros.
                const float inverse[2] = {inverse_or_zero(whole[0]), inverse_or_zero(whole[1])};
                CUTLASS_PRAGMA_UNROLL
                for (int j = 0; j < kValues / 8; ++j) {
                    uint32_t word[4];
                    CUTLASS_PRAGMA_UNROLL
                    for (int k = 0; k < 4; ++k) {
                        const float scale = inverse[k & 1];   // value 8j + 2k is of row k & 1
                        const Pair pair = to_pair<typename Traits::Element>(values[8 * j + 2 * k] * scale,
                                                                            values[8 * j + 2 * k + 1] * scale);
                        word[k] = reinterpret_cast<uint32_t const&>(pair);
                    }
                    evo_sm90::push_v4(chunk_address(1 + j), __uint_as_float(word[0]), __uint_as_float(word[1]),
                                      __uint_as_float(word[2]), __uint_as_float(word[3]),
                                      1 + j < kPushFirst ? first : second);
                }
            } else {
                CUTLASS_PRAGMA_UNROLL
                for (int i = 0; i < kValues / 4; ++i) {
                    evo_sm90::push_v4(chunk_address(1 + i), values[4 * i], values[4 * i + 1], values[4 * i + 2],
                                      values[4 * i + 3], 1 + i < kPushFirst ? first : second);
                }
            }
            probe.mark(trace::kMergeLanded);
            return false;
        }
        if (lane == 0) arm_barriers(owned);
        evo_sm90::wait_barrier<0>(barrier(owned, 0));
        probe.mark(trace::kMergeLanded);
        // At D=64 the fold is compiled for the cluster's split count. At D=128 that moved ptxas's
        // schedule of the key loop and cost 0.1 us on (1,8,512,128) (NOTES.md, run 175), so there one
        // fold covers the most others, each guarded by the runtime count.
        if constexpr (Traits::kHeadDim == 64) {
            with_others<Traits::kMaxSplits>([&](auto others) {
                finish<decltype(others)::value>(softmax, values, whole, owned, lane, first_half, others);
            });
        } else {
            finish<Traits::kMaxSplits - 1>(softmax, values, whole, owned, lane, first_half, splits - 1);
        }
        return true;
    }

    // f(Int<splits - 1>{}) for this cluster's split count, a power of two from 2 to kSplits, so the
    // owner's fold is compiled for the others it has. Unrolled over the most others, each guarded by
    // the runtime count, it issued every absent other's loads and products predicated off: 98 of the
    // owner's 291 instructions after the landing at D=64 with 2 splits (NOTES.md, run 175).
    template <int kSplits, class F>
    __device__ void with_others(F&& f) const {
        if constexpr (kSplits > 2) {
            if (splits != kSplits) return with_others<kSplits / 2>(f);
        }
        f(Int<kSplits - 1>{});
    }

    // The owner's fold of its `others` other ranks' states (at most kMostOthers; a compile-time count
    // takes the guards away) into its own, O left normalised. From the heads (the first landing): the
    // rows' maximum m over every state, then each state's weight 2^(its max - m) with 1/(the rows'
    // whole sum) taken into it, so O is read and written once (a fold, then the quad's sum and the
    // rows' scale, were three dependent steps after the states landed). The first half of O is
    // folded, and given to `first_half`, while the second is in flight (NOTES.md, runs 169-170).
    // Unrolled over the others: a loop over them, each weight taken again where it is needed, is 160
    // instructions shorter at D=64 and 0.07 us slower on the mission shape (run 168). `own_whole`:
    // this rank's whole sums.
    template <int kMostOthers, class Softmax, class FirstHalf>
    __device__ void finish(Softmax const& softmax, float* values, float const (&own_whole)[2], int owned,
                           int lane, FirstHalf& first_half, int others) const {
        const auto chunks = [&](int other) {   // the other's slots: chunk c of this lane at [c * 32]
            return reinterpret_cast<const float4*>(shared.receive.data() + slot_offset(owned, other)) + lane;
        };
        float4 head[kMostOthers];
        float m[2] = {softmax.row_max[0], softmax.row_max[1]};
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kMostOthers; ++i) {
            if (i < others) {
                head[i] = chunks(i)[-(lane & 3)];   // the quad's first lane's head
                m[0] = fmaxf(m[0], head[i].x);
                m[1] = fmaxf(m[1], head[i].y);
            }
        }
        float mine[2], other[kMostOthers][2];
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 2; ++r) {
            const float base = softmax.scaled_max(m[r]);   // a row no rank met a key of: weights 0, not NaN
            mine[r] = exp2_approx(fmaf(softmax.row_max[r], softmax.scale_log2, -base));
            float whole = own_whole[r] * mine[r];
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kMostOthers; ++i) {
                if (i < others) {
                    other[i][r] = exp2_approx(fmaf(r == 0 ? head[i].x : head[i].y, softmax.scale_log2, -base));
                    whole = fmaf(r == 0 ? head[i].z : head[i].w, other[i][r], whole);
                }
            }
            const float inverse = inverse_or_zero(whole);
            mine[r] *= inverse;
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kMostOthers; ++i) {
                // A compact push's O came normalised by its own whole sum: weighted back by it here.
                if (i < others) other[i][r] *= kCompactPush ? inverse * (r == 0 ? head[i].z : head[i].w) : inverse;
            }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < kValues; ++v) values[v] *= mine[(v >> 1) & 1];   // values 4i, 4i+1 row 0; 4i+2, 4i+3 row 1
        const auto fold = [&](int i, int c) {
            const float4 o = chunks(i)[(1 + c) * 32];
            values[4 * c] = fmaf(o.x, other[i][0], values[4 * c]);
            values[4 * c + 1] = fmaf(o.y, other[i][0], values[4 * c + 1]);
            values[4 * c + 2] = fmaf(o.z, other[i][1], values[4 * c + 2]);
            values[4 * c + 3] = fmaf(o.w, other[i][1], values[4 * c + 3]);
        };
        const auto fold_compact = [&](int i, int j) {
            const float4 o = chunks(i)[(1 + j) * 32];
            const uint32_t word[4] = {__float_as_uint(o.x), __float_as_uint(o.y), __float_as_uint(o.z),
                                      __float_as_uint(o.w)};
            CUTLASS_PRAGMA_UNROLL
            for (int k = 0; k < 4; ++k) {
                const float2 pair = from_pair(reinterpret_cast<Pair const&>(word[k]));
                values[8 * j + 2 * k] = fmaf(pair.x, other[i][k & 1], values[8 * j + 2 * k]);
                values[8 * j + 2 * k + 1] = fmaf(pair.y, other[i][k & 1], values[8 * j + 2 * k + 1]);
            }
        };
        // Chunk by chunk over every other, so the first half is final before the second wait.
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kPushChunks - 1; ++c) {
            if (1 + c == kPushFirst) {
                first_half();
                evo_sm90::wait_barrier<0>(barrier(owned, 1));
            }
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kMostOthers; ++i) {
                if (i < others) {
                    if constexpr (kCompactPush) {
                        fold_compact(i, c);
                    } else {
                        fold(i, c);
                    }
                }
            }
        }
    }
};

}  // namespace v5_hopper
