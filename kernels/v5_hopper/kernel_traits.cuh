// The traits of one v5_hopper instantiation: tile shape, warp-group roles, the shared-memory
// layouts the tensor cores and the copy engine agree on, the two matrix products and the three
// TMA copies. One template serves both head dims and both 16-bit types.
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "trace.cuh"

namespace v5_hopper {

using namespace cute;

// kSplit_: the kernel of a cluster key split (cluster_merge.cuh): the CTAs of a cluster share one
// query tile's key tiles and merge their states; one query tile per CTA, so one Q buffer.
// kFreeIssue_: the consumer warp groups issue without taking turns, and each one's softmax runs
// under its own P V (free_issue_d128_min_keys: the long D=128 non-causal shapes).
// kNoProducer_: a split CTA of consumer warp groups alone (split_wide), whose whole key share fits its
// stages; thread 0 sends every load, and no warp group trades registers.
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kSplit_ = false,
          bool kFreeIssue_ = false, bool kNoProducer_ = false>
struct KernelTraits {
    using Element = Element_;
    using ElementAccum = float;

    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;          // query rows per CTA: 64 per consumer warp group
    static constexpr int kBlockN = kBlockN_;          // keys per pipeline stage
    static constexpr int kStages = kStages_;
    static constexpr bool kSplit = kSplit_;
    static constexpr bool kFreeIssue = kFreeIssue_;
    static constexpr bool kNoProducer = kNoProducer_;
    static_assert(!kNoProducer || kSplit, "only a split CTA runs without a producer warp group");
    static_assert(!(kSplit && kFreeIssue), "a split CTA has one consumer warp group: nothing to take turns with");
    // kv_producers 2: the K ring and the V ring each have a loading thread of their own (not in the
    // split kernels, whose start-of-call burst is tuned as one thread issues it: NOTES.md, run 44).
    static_assert(V5_HOPPER_KV_PRODUCERS == 1 || V5_HOPPER_KV_PRODUCERS == 2, "kv_producers: 1 or 2");
    static constexpr bool kSeparateV = V5_HOPPER_KV_PRODUCERS == 2 && !kSplit;
    static constexpr int kConsumerWarpGroups = kBlockM / 64;
    static constexpr int kConsumerThreads = kConsumerWarpGroups * cutlass::NumThreadsPerWarpGroup;
    // + the producer group, unless kNoProducer
    static constexpr int kThreads = kConsumerThreads + (kNoProducer ? 0 : cutlass::NumThreadsPerWarpGroup);
    static_assert(kConsumerWarpGroups >= 1 && kConsumerWarpGroups <= 3 && kBlockM % 64 == 0,
                  "64, 128 or 192 query rows per CTA");
    static_assert(kConsumerWarpGroups > 1 || kSplit, "64-row tiles only for the split kernels (split_block_m)");
    static_assert(kHeadDim % 64 == 0, "head dim: whole 128-byte swizzle atoms");
    static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "keys per stage: a wgmma N (and P V K) of 16..256");

    using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;   // S = Q K^T: (M, N, K=D)
    using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;   // O += P V: (M, N=D, K=keys)
    using AtomLayoutMma = Layout<Shape<Int<kConsumerWarpGroups>, _1, _1>>;   // one 64-row slab per warp group

    // Q K^T: both operands in shared memory, K-major (D contiguous in Q and K).
    using TiledMmaQK = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, ElementAccum, TileShapeQK>(), AtomLayoutMma{}));
    // P V: P from registers (the S accumulator converted in place), V^T from shared memory,
    // MN-major (V is [keys, D] with D contiguous, so V^T's N = D is the contiguous mode).
    using TiledMmaPV = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, ElementAccum, TileShapePV, GMMA::Major::K, GMMA::Major::MN>(),
        AtomLayoutMma{}));
    // One wgmma spans the whole tile width. Without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
    // (tunables.cuh defines it for the 176-key build) CuTe's selectors know only N of 256, 192,
    // 128, 96, 64, ... and silently tile 176 keys as eleven 64x16 products: 0.70x of 128 keys
    // (NOTES.md, run 13).
    static_assert(size<1>(typename TiledMmaQK::AtomShape_MNK{}) == kBlockN, "Q K^T: one wgmma per key tile width");
    static_assert(size<1>(typename TiledMmaPV::AtomShape_MNK{}) == kHeadDim, "P V: one wgmma per head dim");

    static constexpr int kCausalOrder = V5_HOPPER_CAUSAL_ORDER;
    static constexpr int kMaxChains = kHeadDim == 64 ? V5_HOPPER_MAX_CHAINS_D64 : V5_HOPPER_MAX_CHAINS;
    static_assert(kMaxChains == 1 || kMaxChains == 4, "row maximum chains: 1 or 4");
    static constexpr int kSumChains = V5_HOPPER_SUM_CHAINS;
    static_assert(kSumChains == 1 || kSumChains == 4, "tile sum chains: 1 or 4");
    // Lazy rescaling: 1 in every kernel, 2 in the free-issue kernel only. There it skips O's rescale
    // on the path from P V's wait to the next issue (2.8-4.6% on the H100); in the ping-pong and D=64
    // kernels it measured 2-7% slower (NOTES.md, run 67).
    // 3: as 2, and the free-issue kernel exponentiates a tile against the running maximum before
    // its own maximum is known (OnlineSoftmax::update_optimistic): +9-10% there on the H200 (run 80).
    // 4: both in every kernel, +7-8.5% on the causal D=128 shapes (run 81); the default since run 83.
    static_assert(V5_HOPPER_LAZY_RESCALE >= 0 && V5_HOPPER_LAZY_RESCALE <= 4, "lazy_rescale: 0 to 4");
    static constexpr bool kLazyRescale = V5_HOPPER_LAZY_RESCALE == 1 || V5_HOPPER_LAZY_RESCALE == 4 ||
                                         (V5_HOPPER_LAZY_RESCALE >= 2 && kFreeIssue);
    static constexpr bool kOptimisticMax = V5_HOPPER_LAZY_RESCALE == 4 || (V5_HOPPER_LAZY_RESCALE == 3 && kFreeIssue);
    // 128-byte swizzled tiles: the layout wgmma descriptors and TMA boxes both accept, and the
    // one that keeps wgmma's shared-memory reads free of bank conflicts.
    template <int kBuffers>
    using SmemLayoutQFor = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                                  Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBuffers>>{}));
    using SmemLayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                               Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
    using SmemLayoutVt = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{},
                                                Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{},
                                                Step<_2, _1, _3>{}));

    // Global tensors as (S, D, H, B) for Q and K and (D, S, H, B) for V^T: four-dimensional
    // boxes, so a tile past the end of one head's rows is zero-filled, never the next head's.
    using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;
    using StrideQK = Stride<int64_t, _1, int64_t, int64_t>;
    using StrideVt = Stride<_1, int64_t, int64_t, int64_t>;

    using TmaQ = decltype(make_tma_copy(
        SM90_TMA_LOAD{},
        make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQK{}),
        take<0, 2>(SmemLayoutQFor<1>{}), select<0, 2>(TileShapeQK{}), _1{}));
    using TmaK = decltype(make_tma_copy(
        SM90_TMA_LOAD{},
        make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQK{}),
        take<0, 2>(SmemLayoutK{}), select<1, 2>(TileShapeQK{}), _1{}));
    using TmaV = decltype(make_tma_copy(
        SM90_TMA_LOAD{},
        make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideVt{}),
        take<0, 2>(SmemLayoutVt{}), select<1, 2>(TileShapePV{}), _1{}));

    // The epilogue's O: one 64-row slab per consumer warp group, each stored by its own TMA box,
    // so a warp group never waits for another to finish its tile (the ping-pong offset stays).
    static constexpr bool kTmaEpilogue = V5_HOPPER_TMA_EPILOGUE && !kSplit;   // a split stores from registers
    using SlabShapeO = Shape<_64, Int<kHeadDim>>;
    using SmemLayoutO = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                               Shape<_64, Int<kHeadDim>, Int<kConsumerWarpGroups>>{}));
    using TmaO = decltype(make_tma_copy(
        SM90_TMA_STORE{},
        make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), ShapeQKV{}, StrideQK{}),
        take<0, 2>(SmemLayoutO{}), SlabShapeO{}, _1{}));
    // One warp group's share of P V: partitions its O slab for the register-to-shared copy.
    using TiledMmaPVSlab = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, ElementAccum, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                             GMMA::Major::K, GMMA::Major::MN>()));

    static constexpr uint32_t kTmaBytesQ = sizeof(Element) * size(SmemLayoutQFor<1>{});
    static constexpr uint32_t kTmaBytesK = sizeof(Element) * size(take<0, 2>(SmemLayoutK{}));
    static constexpr uint32_t kTmaBytesV = sizeof(Element) * size(take<0, 2>(SmemLayoutVt{}));

    // The receive side of a cluster split of S (2 or 4) ranks: warp w's rows are finished by rank
    // w % S, which takes the other S - 1 ranks' states of them into slots of kWarpBytes each: chunk
    // 0 of a lane holds its two rows' maxima and whole sums, chunks 1.. its O accumulator, 16 bytes each,
    // chunk c of lane l at byte (c * 32 + l) * 16 of the slot. Sized for the most slots (S = 4) and
    // the most owned warps (S = 2).
    static constexpr int kConsumerWarps = kConsumerThreads / 32;
    static constexpr int kMaxSplits = 4;
    static constexpr int kSplitChunks = 1 + kHeadDim / 8;
    static constexpr int kChunkBytes = 16 * 32;   // a chunk: 16 bytes in each of a warp's lanes
    static constexpr int kWarpStateBytes = kSplitChunks * kChunkBytes;
    static constexpr int kReceiveSlots = kConsumerWarps - kConsumerWarps / kMaxSplits;
    static constexpr int kMostOwnedWarps = kConsumerWarps / 2;
    // An owned warp's states land on two barriers: chunks [0, kFirstLanding) (the head and the first
    // half of O) on the first, the rest on the second (ClusterMerge).
    static constexpr int kLandings = 2;
    static constexpr int kFirstLanding = 1 + (kSplitChunks - 1) / 2;

    using Pipeline = cutlass::PipelineTmaAsync<kStages>;
    using BarrierQ = cutlass::arch::ClusterTransactionBarrier;   // Q's TMA completes on it
    using BarrierQEmpty = cutlass::arch::ClusterBarrier;          // consumers release Q on it
    using PipelineState = typename Pipeline::PipelineState;

    // The CTA's shared memory with kBuffers Q buffers (kQBuffers below).
    template <int kBuffers>
    struct SharedStorageFor {
        // 1024-byte alignment: the period of the 128-byte swizzle pattern.
        cute::array_aligned<Element, cute::cosize_v<SmemLayoutQFor<kBuffers>>, 1024> q;
        cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
        cute::array_aligned<Element, cute::cosize_v<SmemLayoutVt>, 1024> v;
        cute::array_aligned<Element, kTmaEpilogue ? cute::cosize_v<SmemLayoutO> : 1, 1024> o;
        typename Pipeline::SharedStorage pipeline_k;
        typename Pipeline::SharedStorage pipeline_v;
        typename BarrierQ::ValueType barrier_q[kBuffers];              // Q landed (TMA bytes)
        typename BarrierQEmpty::ValueType barrier_q_empty[kBuffers];   // Q read by every consumer
        cute::array_aligned<char, kSplit ? kReceiveSlots * kWarpStateBytes : 16, 16> receive;
        uint64_t receive_barrier[kSplit ? kMostOwnedWarps * kLandings : 1];   // an owned warp's landings
#if V5_HOPPER_TRACE
        trace::Row trace_row;   // the diagnostic build's probes, copied out at the CTA's end
#endif
    };
    // Q buffers: with two, the Q thread loads the next query tile's Q while this one's is in use.
    // A free-issue kernel has two wherever they fit: its groups reach a tile's first Q K^T together,
    // and with one buffer that Q's load starts only after the previous tile's last Q K^T (two
    // measured 0.6-1.7% faster from 4096 keys, NOTES.md, run 56). They fit beside two 128-key
    // stages and the O slabs (224 KB at D=128), not beside three stages or 176-key ones: kTwoQFit
    // asks the storage itself.
    static constexpr bool kTwoQFit = sizeof(SharedStorageFor<2>) <= 227 * 1024;
    // In the ping-pong kernels two measured 1-7% faster at D=64 (run 62) and 3.4-5.5% on the short
    // D=128 non-causal loops of persistent grids (run 67), most where a tile's key loop is short.
    static constexpr int kQBuffers = kSplit                  ? 1
                                     : kFreeIssue && kTwoQFit ? 2
                                     : kHeadDim == 64         ? V5_HOPPER_Q_BUFFERS_D64
                                                              : V5_HOPPER_Q_BUFFERS;
    static_assert(kQBuffers == 1 || kQBuffers == 2, "one or two Q buffers");
    // The Q buffer of a CTA's tile_count-th query tile, and how often that buffer served before:
    // the Q thread waits for use - 1 to be released, the consumers for use to land (phase use & 1).
    struct QSlot {
        int buffer;
        int use;
    };
    static __device__ QSlot q_slot(int tile_count) { return {tile_count % kQBuffers, tile_count / kQBuffers}; }
    using SmemLayoutQ = SmemLayoutQFor<kQBuffers>;
    using SharedStorage = SharedStorageFor<kQBuffers>;
    static constexpr int kSmemBytes = sizeof(SharedStorage);
    static_assert(kSmemBytes <= 227 * 1024,
                  "an H100 CTA has at most 227 KB of shared memory (tma_epilogue=1 and stages=3 at D=128 exceed it)");
    // CTAs an SM holds: 64-row split CTAs as many as their shared memory fits in the SM's 228 KB
    // (1 KB of it reserved per CTA), up to split_ctas_per_sm: with two 64-key stages about 54 KB each
    // at D=64 (four, split_stages_d64: 87 KB) and 106 KB at D=128, with two 128-key stages 86 KB at
    // D=64 and 171 KB at D=128 (split_block_n_d128: one to an SM); one CTA of more warp groups.
    static constexpr int kSmemCtasPerSm = 228 * 1024 / (kSmemBytes + 1024);
    // A CTA without a producer: two to an SM where they fit (256 threads at 128 registers).
    static constexpr int kMinBlocksPerSm =
        kNoProducer                 ? (kSmemCtasPerSm < 2 ? kSmemCtasPerSm : 2)
        : kConsumerWarpGroups > 1   ? 1
        : kSmemCtasPerSm < V5_HOPPER_SPLIT_CTAS_PER_SM ? kSmemCtasPerSm
                                                       : V5_HOPPER_SPLIT_CTAS_PER_SM;
    // setmaxnreg budgets: the producer only issues copies; the consumers hold S, P and O. The
    // warp groups can only trade the registers the CTA was launched with (65536 / threads / CTAs
    // per SM, in steps of 8): 168 x 384 = 64512 for two consumer groups, 128 x 512 = 65536 for
    // three, 128 x 256 x 2 CTAs (or 80 x 256 x 3) for one. Asking for more than that makes setmaxnreg.inc wait
    // forever (a hang seen on the H100, run 4).
    static constexpr int kLaunchRegisters = (65536 / (kThreads * kMinBlocksPerSm)) / 8 * 8;
    // The producer at 24 registers spills; at 32 it does not since Q has a thread of its own (run 18),
    // which lets three consumer groups have 160 (at 152 the 192-row D=64 kernels spilled 48 bytes).
    static constexpr int kProducerRegisters = kConsumerWarpGroups == 2 ? 40 : 32;
    static constexpr int kConsumerRegisters =
        kConsumerWarpGroups == 2 ? 232
        : kConsumerWarpGroups == 3 ? 160
        : (2 * kLaunchRegisters - kProducerRegisters < 240 ? 2 * kLaunchRegisters - kProducerRegisters : 240);
    static_assert(kNoProducer || kProducerRegisters + kConsumerWarpGroups * kConsumerRegisters <=
                      (kConsumerWarpGroups + 1) * kLaunchRegisters,
                  "setmaxnreg budgets exceed the registers the CTA is launched with");

    struct Params {
        TmaQ tma_q;
        TmaK tma_k;
        TmaV tma_v;
        TmaO tma_o;
        Element* o;
        int seq_len;
        int heads;
        int batch;
        float scale_log2;   // softmax scale x log2(e): the softmax runs on exp2
        int key_splits;     // CTAs per cluster sharing a query tile's keys (1 unless kSplit)
#if V5_HOPPER_TRACE
        trace::Buffer* trace = nullptr;   // the diagnostic build's timelines (trace.cuh)
        int trace_call = 0;               // this launch's row in them
#endif
    };
};

}  // namespace v5_hopper
