// The v5_hopper forward kernel: a CTA of one producer and two or three consumer warp groups
// computes 128- (or 192-) row query tiles.
//
//   warp group 0 (producer, 40 registers): one thread issues the TMA loads of K and V tile by
//     tile into two rings of kStages stages, each stage completing on an mbarrier (with
//     kv_producers 2, one thread the K ring and another the V ring); a thread of another warp
//     loads each query tile's Q (into one of kQBuffers buffers).
//   warp groups 1, 2 (consumers, 240 registers): 64 query rows each. Per key tile n:
//     S = Q K_n^T (wgmma, both operands in shared memory), mask, online softmax,
//     O += P V_n (wgmma, P from registers). The product of tile n is issued together with the
//     P V of tile n+1's predecessor, so P V runs under the softmax; with ping-pong the two
//     warp groups take turns issuing, so one's softmax runs under the other's products.
//
// With key_split, a small non-causal grid runs clusters of 2 or 4 CTAs per query tile, each over
// a share of its key tiles, merged in the owner of each warp's rows (cluster_merge.cuh); with
// split_block_m 64 those CTAs hold one consumer warp group, two to an SM (three where
// split_ctas_per_sm allows). Those kernels launch with programmatic dependent launch; where the
// grid leaves a slot on every SM, a thread of producer warp 3 asks L2 for the call's tiles before
// the wait (prefetch_inputs). In the D=128 split kernels thread 0 sends a CTA's first loads itself,
// before the CTA's first barrier (kEarlyLoads). With split_wide a D=64 split grid that would fill both
// slots of every SM runs 128-row CTAs of two consumer groups and no producer (Traits::kNoProducer):
// thread 0 sends the loads, each group runs as a 64-row split CTA's, and P is written as the P V
// operand at once (kPackedP).
//
// Key tiles are visited from the last (the masked ones) down to the first. With a persistent
// grid a CTA runs several query tiles: the rings' states, the barriers and the issue rotation
// carry over, and the producer loads the next tile's first K and V tiles (and, once the
// consumers have released a Q buffer, its Q) while the consumers finish the current one.
#pragma once

#include "tunables.cuh"  // first: it decides CuTe's wgmma shapes
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cluster_merge.cuh"
#include "epilogue.cuh"
#include "fragment_views.cuh"
#include "kernel_traits.cuh"
#include "mask.cuh"
#include "online_softmax.cuh"
#include "tile_scheduler.cuh"
#include "warpgroup_gemm.cuh"

namespace v5_hopper {

using namespace cute;

// Consumer warp groups issue their matrix products in turn (0, 1, [2,] 0, ...), so one group's
// softmax runs while another's products occupy the tensor cores. Named barrier g (past CUTLASS's
// reserved ids) means "group g may issue": group g syncs on it, its predecessor arrives on it.
template <int kGroups, bool kPingpong>
struct IssueTurn {
    static constexpr uint32_t kThreads = 2 * cutlass::NumThreadsPerWarpGroup;
    int group;

    __device__ void wait() const {
        if constexpr (kPingpong) cutlass::arch::NamedBarrier::sync(kThreads, group);
    }
    __device__ void pass() const {
        if constexpr (kPingpong) cutlass::arch::NamedBarrier::arrive(kThreads, (group + 1) % kGroups);
    }
    // Each group issues (tiles + 1) times and must be let through as often: group 0 by the last
    // group's opening pass, which that group makes up for by not passing after its own last issue.
    __device__ bool is_last() const { return group == kGroups - 1; }
};

// Programmatic dependent launch, in the split kernels only: the two instructions alone made the
// causal kernels about 2 us slower per call in eager timing, launched without it (NOTES.md, run 22).
// Only the loading threads wait for the previous grid, each just before its first load (at D=128
// thread 0 alone, before the CTA's first barrier: kEarlyLoads): what comes before (setmaxnreg, the
// pipelines, the tile's coordinates) reads nothing the previous grid writes, and runs while it
// finishes; the consumers touch global memory only through what those loads bring (NOTES.md,
// runs 31-32). The prefetch (prefetch_inputs) does not wait: it only asks L2
// for lines, which the previous grid's stores then update there.
template <class Traits>
constexpr bool kPdlKernel = Traits::kSplit && V5_HOPPER_PDL > 0;

// L2's hint on a kernel's loads of Q, K and V (EVICT_NORMAL is the copy's own default). A split
// grid's CTAs read each input line within the call, so with evict_first_inputs its lines go first
// when later calls need room, and o's lines, which the next call writes again, stay in L2 instead
// of being written back while that call's first loads come from DRAM (NOTES.md, run 249: -0.09 to
// -0.13 us on 2,8,512,64 under the bench's rotation, nothing with the inputs in L2).
template <class Traits>
__device__ __forceinline__ constexpr TMA::CacheHintSm90 input_hint() {
    return Traits::kSplit && V5_HOPPER_EVICT_FIRST_INPUTS ? TMA::CacheHintSm90::EVICT_FIRST
                                                          : TMA::CacheHintSm90::EVICT_NORMAL;
}

// The tile's Q as a TMA coordinate tensor: (M, D).
template <class Traits>
__device__ auto query_tile(typename Traits::Params const& params, TileCoord const& tile) {
    Tensor mQ = params.tma_q.get_tma_tensor(make_shape(params.seq_len, int(Traits::kHeadDim), params.heads, params.batch));
    return local_tile(mQ(_, _, tile.head, tile.batch), select<0, 2>(typename Traits::TileShapeQK{}),
                      make_coord(tile.m_block, _0{}));
}

// The Q thread (warp 1 of the producer group): loads each query tile's Q into buffer
// tile_count % kQBuffers once the consumers have released that buffer's previous tile. With two
// buffers that is the tile before the current one, so the next Q lands while this tile runs.
template <class Traits, bool kCausal>
__device__ void produce_q(typename Traits::Params const& params, typename Traits::SharedStorage& shared,
                          trace::Probe probe) {
    using BarrierQ = typename Traits::BarrierQ;
    using BarrierQEmpty = typename Traits::BarrierQEmpty;
    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});   // (M, D, buffers)
    const TileScheduler<Traits, kCausal> scheduler{params};
    int tile_count = 0;
    for (int t = scheduler.first(); scheduler.valid(t); t = scheduler.next(t), ++tile_count) {
        const TileCoord tile = scheduler.coord(t);
        Tensor gQ = query_tile<Traits>(params, tile);
        auto [tQg, tQs] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
        const auto [buffer, use] = Traits::q_slot(tile_count);
        if (use > 0) BarrierQEmpty::wait(&shared.barrier_q_empty[buffer], (use - 1) & 1);
        BarrierQ::arrive_and_expect_tx(&shared.barrier_q[buffer], Traits::kTmaBytesQ);
        if (kPdlKernel<Traits> && tile_count == 0) evo_sm90::wait_for_previous_grid();
        copy(params.tma_q.with(shared.barrier_q[buffer], 0, input_hint<Traits>()), tQg, tQs(_, buffer));
        if (tile_count == 0) probe.mark(trace::kQIssued);
    }
}

// Which rings one loading thread fills: K and V key tile by key tile, or one of the two (kv_producers).
enum class Rings { kBoth, kK, kV };

// K and V^T of the tile's head as TMA coordinate tensors, tiled by key tile: (N, D, key tiles) and
// (D, N, key tiles).
template <class Traits>
__device__ auto key_value_tiles(typename Traits::Params const& params, TileCoord const& tile) {
    const int S = params.seq_len;
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(S, int(Traits::kHeadDim), params.heads, params.batch));
    Tensor mVt = params.tma_v.get_tma_tensor(make_shape(int(Traits::kHeadDim), S, params.heads, params.batch));
    return cute::make_tuple(
        local_tile(mK(_, _, tile.head, tile.batch), select<1, 2>(typename Traits::TileShapeQK{}), make_coord(_, _0{})),
        local_tile(mVt(_, _, tile.head, tile.batch), select<1, 2>(typename Traits::TileShapePV{}), make_coord(_0{}, _)));
}

// The TMA partitions of the tile's K and V tiles, (TMA, key tiles), and of the rings' stages,
// (TMA, stages): what a loading thread copies from and to.
template <class Traits>
__device__ auto key_value_partitions(typename Traits::Params const& params, TileCoord const& tile,
                                     typename Traits::Element* k_ring, typename Traits::Element* v_ring) {
    auto [gK, gVt] = key_value_tiles<Traits>(params, tile);
    Tensor sK = make_tensor(make_smem_ptr(k_ring), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(v_ring), typename Traits::SmemLayoutVt{});
    auto [tKg, tKs] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVg, tVs] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sVt), group_modes<0, 2>(gVt));
    return cute::make_tuple(tKg, tKs, tVg, tVs);
}

// A split CTA's first loads: Q and this many key tiles, sent at once (the rest as produce_kv says).
constexpr int kFirstKeyTiles = 2;
__device__ __forceinline__ int first_key_tiles(evo_sm90::KeyShare const& span) {
    return span.end - span.begin < kFirstKeyTiles ? span.end - span.begin : kFirstKeyTiles;
}
// Where thread 0 sends them itself, before the CTA's first barrier (send_first_loads): in the D=128
// split kernels, whose next grid is let in only after the key loop and so enters as this one's CTAs
// leave (-0.26 to -0.29 us on 1,8,512,128). At D=64 the same change measured 0.04-0.10 us slower
// on every split shape (NOTES.md, run 181).
template <class Traits>
constexpr bool kEarlyLoads = Traits::kSplit && Traits::kHeadDim == 128;

// Where a D=64 split CTA's K/V thread splits its first burst (a four-stage ring, one thread for both
// rings): Q and K0 go out first, and V0, K1 after a wait of split_burst_gap cycles or until K0 lands,
// V1 split_burst_gap2 cycles after K1. At the release every CTA of the call sends its burst at once,
// and the copies come back about in the order they were sent, per SM and from DRAM, so a CTA's first
// product waited behind the other CTAs' V0, K1 and V1 (NOTES.md, runs 256-261).
template <class Traits, Rings kRings>
constexpr bool kBurstGaps = Traits::kSplit && Traits::kHeadDim == 64 && Traits::kStages > 2 && kRings == Rings::kBoth &&
                            (V5_HOPPER_SPLIT_BURST_GAP > 0 || V5_HOPPER_SPLIT_BURST_GAP2 > 0);

// Spins `cycles` on the SM's clock, ending early once `landed` (a full barrier, phase 0) completes.
__device__ __forceinline__ void burst_gap(long long cycles, uint64_t* landed) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
        if (landed != nullptr && cutlass::arch::ClusterBarrier::test_wait(landed, 0, 1)) return;
    }
}

// The K/V thread (warp 0 of the producer group): K and V tile by tile into their rings. With
// Traits::kSeparateV it fills the K ring alone and a thread of warp 2 the V ring, so a K load never
// waits behind the release of a V stage, which comes a step later.
template <class Traits, bool kCausal, Rings kRings>
__device__ void produce_kv(typename Traits::Params const& params, typename Traits::SharedStorage& shared,
                           typename Traits::Pipeline& pipeline_k, typename Traits::Pipeline& pipeline_v,
                           trace::Probe probe) {
    probe.mark(trace::kProducerStart);
    const int S = params.seq_len;

    const TileScheduler<Traits, kCausal> scheduler{params};
    auto write = cutlass::make_producer_start_state<typename Traits::Pipeline>();
    // With kEarlyLoads the first loads went out before this thread got here (send_first_loads).
    constexpr bool kFirstSent = kEarlyLoads<Traits>;
    bool first_load = !kFirstSent;
    for (int t = scheduler.first(); scheduler.valid(t); t = scheduler.next(t)) {
        const TileCoord tile = scheduler.coord(t);
        auto [tKg, tKs, tVg, tVs] = key_value_partitions<Traits>(params, tile, shared.k.data(), shared.v.data());

        const KeyTiles<Traits::kBlockM, Traits::kBlockN, kCausal> keys{tile.m_block, S};
        const evo_sm90::KeyShare span = scheduler.key_span(keys);
        if (first_load) probe.mark(trace::kKvScheduled);
        int first_n = span.end - 1;
        if constexpr (kFirstSent) {
            const int sent = first_key_tiles(span);
            for (int i = 0; i < sent; ++i) ++write;
            first_n -= sent;
        }
        for (int n = first_n; n >= span.begin; --n) {
            // A split ring deeper than two stages (a CTA's one query tile) sends two key tiles with
            // Q, then waits for the first K before the rest: sent at once, they made that K land
            // later (0.64 us, NOTES.md, run 38); sent as stages came free, the V refills landed
            // just as the steps needed them (runs 125-126).
            if constexpr (Traits::kSplit && Traits::kStages > 2 && kRings == Rings::kBoth) {
                if (n == span.end - 1 - kFirstKeyTiles) {
                    const auto first_stage = cutlass::make_producer_start_state<typename Traits::Pipeline>();
                    cutlass::arch::ClusterTransactionBarrier::wait(pipeline_k.producer_get_barrier(first_stage), 0);
                }
            }
            if constexpr (kRings != Rings::kV) {
                pipeline_k.producer_acquire(write);
                if (first_load) {
                    probe.mark(trace::kKAcquired);
                    if constexpr (kPdlKernel<Traits>) evo_sm90::wait_for_previous_grid();
                    probe.mark(trace::kPastWait);
                }
                copy(params.tma_k.with(*pipeline_k.producer_get_barrier(write), 0, input_hint<Traits>()), tKg(_, n),
                     tKs(_, write.index()));
                if constexpr (kBurstGaps<Traits, kRings>) {
                    if (first_load) burst_gap(V5_HOPPER_SPLIT_BURST_GAP, pipeline_k.producer_get_barrier(write));
                }
            }
            if constexpr (kRings != Rings::kK) {
                if constexpr (kBurstGaps<Traits, kRings>) {
                    if (n == span.end - 2) burst_gap(V5_HOPPER_SPLIT_BURST_GAP2, nullptr);
                }
                pipeline_v.producer_acquire(write);
                if constexpr (kRings == Rings::kV && kPdlKernel<Traits>) {
                    if (first_load) evo_sm90::wait_for_previous_grid();
                }
                copy(params.tma_v.with(*pipeline_v.producer_get_barrier(write), 0, input_hint<Traits>()), tVg(_, n),
                     tVs(_, write.index()));
            }
            ++write;
            if (first_load) probe.mark(trace::kKvIssued);
            first_load = false;
        }
    }
    // Do not leave while a consumer may still wait on a stage this thread filled.
    if constexpr (kRings != Rings::kV) pipeline_k.producer_tail(write);
    if constexpr (kRings != Rings::kK) pipeline_v.producer_tail(write);
}

// An idle producer warp asks L2 for this call's Q, K and V before the PDL wait, so DRAM's latency
// passes while the previous grid finishes (NOTES.md, runs 140-142: -0.17 us on 1,8,512,64). Each tile
// is asked for once per call: key tile n by the CTA of query tile n mod (query tiles) among those
// whose share holds it, Q by rank 0 of its cluster. A prefetch moves nothing into the CTA, and L2 is
// where every SM's stores land, so a line it brings in before the previous grid writes it is updated
// in place.
template <class Traits, bool kCausal>
__device__ void prefetch_inputs(typename Traits::Params const& params) {
    const int S = params.seq_len;
    const TileScheduler<Traits, kCausal> scheduler{params};
    const TileCoord tile = scheduler.coord(scheduler.first());
    auto [tKg, tKs, tVg, tVs] = key_value_partitions<Traits>(params, tile, nullptr, nullptr);
    const KeyTiles<Traits::kBlockM, Traits::kBlockN, kCausal> keys{tile.m_block, S};
    const evo_sm90::KeyShare span = scheduler.key_span(keys);
    const int m_blocks = scheduler.m_blocks();
    for (int n = span.end - 1; n >= span.begin; --n) {
        if (n % m_blocks != tile.m_block) continue;
        cute::prefetch(params.tma_k, tKg(_, n));
        cute::prefetch(params.tma_v, tVg(_, n));
    }
    if (evo_sm90::cluster_rank() == 0) {
        Tensor gQ = query_tile<Traits>(params, tile);
        Tensor sQ = make_tensor(make_smem_ptr(static_cast<typename Traits::Element*>(nullptr)), typename Traits::SmemLayoutQ{});
        auto [tQg, tQs] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
        cute::prefetch(params.tma_q, tQg);
    }
}

// Whether this grid's CTAs prefetch their inputs: only where the next call's CTAs find a free slot
// on every SM this grid uses. Where this grid fills an SM's slots they enter as these leave, and
// the prefetch came late and cost (+0.06 us on 2,8,512,64, run 140). A kernel of one CTA an SM
// never has one.
template <class Traits>
__device__ bool prefetches_inputs() {
    if constexpr (kPdlKernel<Traits> && Traits::kMinBlocksPerSm > 1) {
        constexpr unsigned kFreeSlots = Traits::kMinBlocksPerSm - 1;
        return gridDim.x * gridDim.y * gridDim.z <= evo_sm90::sm_id_count() * kFreeSlots;
    } else {
        return false;
    }
}

// Thread 0's K/V copies of a split CTA's share, sent without a producer ring (one query tile, so no
// stage is refilled and none needs acquiring): share tiles [from, to), key tile span.end - 1 - i into
// stage i. `parts` is key_value_partitions' (TMA sources, stages) of K and V. Inlined by force: as a
// call-site choice of the compiler, the wide kernel's copies were unrolled differently (104 more
// instructions) from the code runs 209-219 measured.
template <class Traits, class Parts>
__device__ __forceinline__ void send_key_tiles(typename Traits::Params const& params,
                                               typename Traits::SharedStorage& shared, Parts const& parts,
                                               evo_sm90::KeyShare span, int from, int to) {
    auto [tKg, tKs, tVg, tVs] = parts;
    for (int i = from; i < to; ++i) {
        auto& full_k = shared.pipeline_k.full_barrier_[i];
        auto& full_v = shared.pipeline_v.full_barrier_[i];
        full_k.arrive_and_expect_tx(Traits::kTmaBytesK);
        copy(params.tma_k.with(reinterpret_cast<uint64_t&>(full_k), 0, input_hint<Traits>()), tKg(_, span.end - 1 - i),
             tKs(_, i));
        full_v.arrive_and_expect_tx(Traits::kTmaBytesV);
        copy(params.tma_v.with(reinterpret_cast<uint64_t&>(full_v), 0, input_hint<Traits>()), tVg(_, span.end - 1 - i),
             tVs(_, i));
    }
}

// kEarlyLoads (and a CTA without a producer, past its barrier): thread 0 of a split CTA sends the
// first loads itself: the prefetch, the PDL wait, then Q and the first key tiles into stages 0, 1
// (an empty ring: nothing to acquire). So the CTA's first __syncthreads, the producer's register
// release and its pipeline objects are off the path to its first load, which they were on for a
// CTA that enters only as one of the previous grid's leaves (NOTES.md, runs 180-181). The K/V
// thread then goes on from the third key tile, and the Q thread has nothing to do.
template <class Traits, bool kCausal>
__device__ void send_first_loads(typename Traits::Params const& params, typename Traits::SharedStorage& shared,
                                 trace::Probe probe) {
    static_assert(Traits::kSplit, "one query tile a CTA");
    if (prefetches_inputs<Traits>()) prefetch_inputs<Traits, kCausal>(params);
    const TileScheduler<Traits, kCausal> scheduler{params};
    const TileCoord tile = scheduler.coord(scheduler.first());
    auto parts = key_value_partitions<Traits>(params, tile, shared.k.data(), shared.v.data());
    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
    auto [tQg, tQs] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                    group_modes<0, 2>(query_tile<Traits>(params, tile)));
    const KeyTiles<Traits::kBlockM, Traits::kBlockN, kCausal> keys{tile.m_block, params.seq_len};
    const evo_sm90::KeyShare span = scheduler.key_span(keys);
    probe.mark(trace::kKvScheduled);
    probe.mark(trace::kKAcquired);
    if constexpr (kPdlKernel<Traits>) evo_sm90::wait_for_previous_grid();
    probe.mark(trace::kPastWait);
    Traits::BarrierQ::arrive_and_expect_tx(&shared.barrier_q[0], Traits::kTmaBytesQ);
    copy(params.tma_q.with(shared.barrier_q[0], 0, input_hint<Traits>()), tQg, tQs(_, 0));
    probe.mark(trace::kQIssued);
    send_key_tiles<Traits>(params, shared, parts, span, 0, first_key_tiles(span));
    probe.mark(trace::kKvIssued);
}

// A split CTA without a producer (Traits::kNoProducer, split_wide): thread 0, once the first K has
// landed, sends the rest of its share into the stages after the first burst's. The host runs that
// kernel only where a share fits the stages, so every stage is filled once and none is waited for.
// Its place is measured: sent later, under the first Q K^T, +0.5 us on 2,8,512,64; sent by thread 0
// before warp 0's set-up, +0.4; all in the first burst, +0.4; prepared before the landing and sent at
// it, +0.2; a tile from each group's thread 0 at the landing, +0.47 (NOTES.md, runs 213-218). The
// arithmetic takes about 30 cycles; issuing the four copies while the copy engine still serves the
// first burst holds warp 0 about 650 (run 217), which may keep the two groups usefully out of phase.
template <class Traits, bool kCausal>
__device__ void send_rest_loads(typename Traits::Params const& params, typename Traits::SharedStorage& shared,
                                trace::Probe probe) {
    static_assert(Traits::kNoProducer, "the producer's ring sends the rest elsewhere");
    const TileScheduler<Traits, kCausal> scheduler{params};
    const TileCoord tile = scheduler.coord(scheduler.first());
    auto parts = key_value_partitions<Traits>(params, tile, shared.k.data(), shared.v.data());
    const KeyTiles<Traits::kBlockM, Traits::kBlockN, kCausal> keys{tile.m_block, params.seq_len};
    const evo_sm90::KeyShare span = scheduler.key_span(keys);
    probe.mark(trace::kProducerStart);
    if (span.end - span.begin > Traits::kStages) __trap();   // the host's rule broken: fail, never hang
    send_key_tiles<Traits>(params, shared, parts, span, first_key_tiles(span), span.end - span.begin);
}

// A consumer releases a ring stage to its own CTA's producer. CUTLASS's PipelineTmaAsync, built for
// a cluster of one, sends every release to block 0 of the cluster: in a split cluster that is
// another CTA's ring, and this CTA's producer would wait for its stages forever (a hang on the
// H100, run 20). The arrival count is the same (every consumer thread, once per stage).
template <class Traits>
__device__ void release_stage(typename Traits::Pipeline& pipeline, typename Traits::Pipeline::SharedStorage& ring,
                              typename Traits::PipelineState const& state) {
    if constexpr (Traits::kSplit) {
        ring.empty_barrier_[state.index()].arrive();
    } else {
        pipeline.consumer_release(state);
    }
}

// ptxas schedules a wgmma wait as early as its basic block allows: in the key loop, P V's wait
// came right after the first FMNMX of the softmax (NOTES.md, run 17). A branch on the softmax's
// last sum ends the block there, so the wait follows the whole softmax and P V runs under it.
// Never taken for a finite sum; taken, it would only sleep.
__device__ __forceinline__ void end_block_after(float last) {
    if (__float_as_uint(last) == 0xffffffffu) __nanosleep(1);
}

template <class Traits, bool kCausal>
__device__ void consume(typename Traits::Params const& params, typename Traits::SharedStorage& shared,
                        typename Traits::Pipeline& pipeline_k, typename Traits::Pipeline& pipeline_v,
                        int consumer_thread, trace::Probe probe) {
    probe.mark(trace::kConsumerStart);
    using Element = typename Traits::Element;
    using BarrierQ = typename Traits::BarrierQ;
    using BarrierQEmpty = typename Traits::BarrierQEmpty;
    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(consumer_thread);
    auto thr_pv = mma_pv.get_thread_slice(consumer_thread);

    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(shared.v.data()), typename Traits::SmemLayoutVt{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);     // wgmma descriptors (MMA, MMA_M, MMA_K, buffers)
    Tensor tSrK = thr_qk.partition_fragment_B(sK);     // (MMA, MMA_N, MMA_K, stages)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);    // (MMA, MMA_N, MMA_K, stages)

    Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));
    Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(typename Traits::TileShapePV{}));
    Tensor s_rc = rowcol_view(tSrS);
    // The optimistic softmax's probabilities (lazy_rescale 3 and 4): unused, and so absent, elsewhere.
    Tensor tSrP = make_fragment_like(tSrS);
    // The wide split kernel (kNoProducer) writes them as the next P V's 16-bit operand at once: at its
    // 128 registers a thread, a second fp32 fragment beside S, O and the P in flight spilled 64 bytes.
    constexpr bool kPackedP = Traits::kNoProducer && Traits::kOptimisticMax;
    Tensor tSrP16 = make_tensor<Element>(a_operand_layout(tSrS.layout()));
    auto p_rc = [&] {
        if constexpr (kPackedP) {
            return make_tensor(tSrP16.data(), rowcol_layout(tSrS.layout()));
        } else {
            return rowcol_view(tSrP);
        }
    }();
    const auto p_operand = [&] {
        if constexpr (kPackedP) {
            return tSrP16;
        } else {
            return convert_to_a_operand<Element>(tSrP);
        }
    };
    Tensor o_rc = rowcol_view(tOrO);
    Tensor coord_rc = rowcol_view(thr_qk.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShapeQK{}))));
    constexpr int kRows = decltype(size<0>(s_rc))::value;
    // One optimistic vote for both of a thread's rows (OnlineSoftmax::update_optimistic) in the split
    // kernels of one consumer warp group, where nothing else fills MUFU between the rows (the unsplit
    // kernels measured 1.4-2% slower with it, and 128-key tiles spill).
    constexpr bool kOneVote = Traits::kSplit && (Traits::kConsumerWarpGroups == 1 || Traits::kNoProducer);
    // Ping-pong per mask kind: on the long non-causal D=128 shape the two groups issuing freely
    // measured 5% faster, on the causal ones 1-3% slower (NOTES.md, run 10).
    // One group (a 64-row split CTA) has no one to take turns with.
    // A free-issue kernel's groups never take turns (free_issue_d128_min_keys).
    // A split CTA without a producer runs its groups as two 64-row split CTAs would, sharing K and V
    // (with turns it measured 0.55 us slower on 2,8,512,64: NOTES.md, run 219).
    constexpr bool kPingpong = Traits::kConsumerWarpGroups > 1 && !Traits::kFreeIssue &&
                               !Traits::kNoProducer && (kCausal ? V5_HOPPER_PINGPONG : V5_HOPPER_PINGPONG_FULL);
    const IssueTurn<Traits::kConsumerWarpGroups, kPingpong> turn{consumer_thread / cutlass::NumThreadsPerWarpGroup};

    const TileScheduler<Traits, kCausal> scheduler{params};
    typename Traits::PipelineState read_k;   // K and V stages advance together
    int tile_count = 0;
    for (int t = scheduler.first(); scheduler.valid(t); t = scheduler.next(t), ++tile_count) {
        const TileCoord tile = scheduler.coord(t);
        const KeyTiles<Traits::kBlockM, Traits::kBlockN, kCausal> keys{tile.m_block, params.seq_len};
        const evo_sm90::KeyShare span = scheduler.key_span(keys);
        OnlineSoftmax<kRows, Traits::kMaxChains, Traits::kSumChains, Traits::kLazyRescale, Traits::kHeadDim == 64>
            softmax(params.scale_log2);
        float o_scale[kRows];
        clear(tOrO);   // the first P V accumulates onto zeros
        if (turn.is_last()) turn.pass();   // group 0 issues first
        const auto [q_buffer, q_use] = Traits::q_slot(tile_count);
        BarrierQ::wait(&shared.barrier_q[q_buffer], q_use & 1);
        if (tile_count == 0) probe.mark(trace::kQReady);
        Tensor tSrQ_tile = tSrQ(_, _, _, q_buffer);

        int n = span.end - 1;
        // First key tile: S = Q K^T, softmax; its P V is issued with the next tile's Q K^T.
        pipeline_k.consumer_wait(read_k);
        if (tile_count == 0) probe.mark(trace::kFirstKReady);
        if constexpr (Traits::kNoProducer) {
            if (consumer_thread == 0) send_rest_loads<Traits, kCausal>(params, shared, probe);
        }
        turn.wait();
        warpgroup_gemm<true>(mma_qk, tSrQ_tile, tSrK(_, _, _, read_k.index()), tSrS);
        turn.pass();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        if (tile_count == 0) probe.mark(trace::kFirstS);
        release_stage<Traits>(pipeline_k, shared.pipeline_k, read_k);
        if (keys.needs_mask(n)) keys.apply(s_rc, coord_rc, n);
        // In the split kernels each tile's P waits in its own fragment until the next pass, which
        // converts it, with O's rescale vote, under its Q K^T (FA3's order within a warp group):
        // the pass's end then has only the P V wait (NOTES.md, runs 162-163).
        constexpr bool kConvertUnderQk = Traits::kSplit && Traits::kOptimisticMax && !kPingpong;
        if constexpr (kConvertUnderQk) {
            softmax.first_update_into(s_rc, p_rc, o_scale);
        } else {
            softmax.template update<true>(s_rc, o_scale);
        }
        if (tile_count == 0) probe.mark(trace::kFirstSoftmax);
        // At D=64 the next grid may start launching after the first softmax: there its CTAs' prologue,
        // not the previous grid's completion, gated the first load (0.08-0.17 us a call on the H200;
        // at entry, 0.2-0.4 us slower). At D=128 the longer tail gates it, and the earlier trigger
        // measured 0.05 us slower (NOTES.md, runs 120-121). The first invocation in a CTA counts.
        if constexpr (kPdlKernel<Traits> && Traits::kHeadDim == 64) evo_sm90::allow_next_grid();
        Tensor tOrP = convert_to_a_operand<Element>(tSrS);   // kConvertUnderQk: the first pass converts P
        auto read_v = read_k;
        ++read_k;
        bool rescaled_last = false;   // kConvertUnderQk: the previous softmax moved some row's maximum

#if V5_HOPPER_TRACE
        int pass = 0;   // the probes' step index: passes 1 to 3 are recorded
#define V5_STEP_PROBE(point) \
    if (tile_count == 0 && pass <= 3) probe.mark(trace::Point(trace::point + 4 * (pass - 1)))
#else
#define V5_STEP_PROBE(point)
#endif
        // The D=64 split kernels test the next pass's K stage and this pass's V stage once S has landed, so a pass's
        // top waits only where a stage was not yet full (NOTES.md, runs 233 and 263); the tokens hold those states
        // (WaitAgain: not tested).
        constexpr bool kEarlyProbe = Traits::kSplit && Traits::kHeadDim == 64 && Traits::kConsumerWarpGroups == 1 &&
                                     !Traits::kNoProducer;
        cutlass::ConsumerToken token_k{cutlass::BarrierStatus::WaitAgain};
        cutlass::ConsumerToken token_v{cutlass::BarrierStatus::WaitAgain};
        for (--n; n >= span.begin; --n) {
#if V5_HOPPER_TRACE
            ++pass;
#endif
            V5_STEP_PROBE(kStep1Top);
            if constexpr (kEarlyProbe) {
                pipeline_k.consumer_wait(read_k, token_k);
                pipeline_v.consumer_wait(read_v, token_v);
            } else {
                pipeline_k.consumer_wait(read_k);
                pipeline_v.consumer_wait(read_v);
            }
            turn.wait();
            warpgroup_gemm<true>(mma_qk, tSrQ_tile, tSrK(_, _, _, read_k.index()), tSrS);
            if constexpr (kConvertUnderQk) {
                // Under the Q K^T: the previous tile's rescale and conversion (its P V has completed).
                if (__any_sync(0xffffffff, rescaled_last)) scale_rows(o_rc, o_scale);
                tOrP = p_operand();
            }
            warpgroup_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, read_v.index()), tOrO);
            turn.pass();
            warpgroup_wait<1>();            // S of tile n has landed; P V of the previous tile may still run
            warpgroup_fence_operand(tSrS);
            V5_STEP_PROBE(kStep1S);
            release_stage<Traits>(pipeline_k, shared.pipeline_k, read_k);
            if constexpr (kEarlyProbe) {
                // The next pass waits for K at read_k + 1 and V at read_k: tested now, under the softmax.
                auto next_k = read_k;
                ++next_k;
                const uint32_t more = n > span.begin;
                token_k = {static_cast<cutlass::BarrierStatus>(
                    shared.pipeline_k.full_barrier_[next_k.index()].test_wait(next_k.phase(), more))};
                token_v = {static_cast<cutlass::BarrierStatus>(
                    shared.pipeline_v.full_barrier_[read_k.index()].test_wait(read_k.phase(), more))};
            }
            // Past the first key tile (the last, the only ragged one) only the causal diagonal masks.
            if (kCausal && keys.needs_mask(n)) keys.apply(s_rc, coord_rc, n);
            bool rescaled;
            if constexpr (Traits::kOptimisticMax) {
                rescaled = softmax.template update_optimistic<kOneVote>(s_rc, p_rc, o_scale);
            } else {
                rescaled = softmax.template update<false>(s_rc, o_scale);
            }
            if constexpr (Traits::kFreeIssue) end_block_after(softmax.row_sum[kRows - 1]);
            V5_STEP_PROBE(kStep1Softmax);
            warpgroup_wait<0>();            // P V done: O may be rescaled and P's registers reused
            warpgroup_fence_operand(tOrO);
            V5_STEP_PROBE(kStep1Pv);
            release_stage<Traits>(pipeline_v, shared.pipeline_v, read_v);
            if constexpr (kConvertUnderQk) {
                rescaled_last = rescaled;
            } else {
                // Lazy rescaling: the warp skips O's multiply when none of its rows moved its maximum.
                if (!Traits::kLazyRescale || __any_sync(0xffffffff, rescaled)) scale_rows(o_rc, o_scale);
                if constexpr (Traits::kOptimisticMax) {
                    tOrP = p_operand();
                } else {
                    tOrP = convert_to_a_operand<Element>(tSrS);
                }
            }
            read_v = read_k;
            ++read_k;
        }
#undef V5_STEP_PROBE
        // Every Q K^T of this query tile has completed: the producer may load the next Q.
        BarrierQEmpty::arrive(&shared.barrier_q_empty[q_buffer]);

        // Last P V.
        if constexpr (kConvertUnderQk) {
            if (__any_sync(0xffffffff, rescaled_last)) scale_rows(o_rc, o_scale);
            tOrP = p_operand();
        }
        pipeline_v.consumer_wait(read_v);
        turn.wait();
        warpgroup_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, read_v.index()), tOrO);
        if (!turn.is_last()) turn.pass();
        if (tile_count == 0) probe.mark(trace::kLastPvIssued);
        // A split CTA's whole sums, for its push or its fold, under the last P V.
        [[maybe_unused]] float whole[kRows];
        if constexpr (Traits::kSplit) softmax.whole_sums(whole);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        if (tile_count == 0) probe.mark(trace::kLastPv);
        release_stage<Traits>(pipeline_v, shared.pipeline_v, read_v);
        // O's rows from registers (the split kernels, and tma_epilogue 0), columns [begin, end) of the
        // row view (end -1: to the last).
        Tensor coord_o = rowcol_view(thr_pv.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShapePV{}))));
        const int row0 = tile.m_block * Traits::kBlockM;
        Element* o_tile =
            params.o + ((int64_t(tile.batch) * params.heads + tile.head) * params.seq_len + row0) * Traits::kHeadDim;
        const auto store_columns = [&](auto begin, auto end) {
            store_rows<Traits::kHeadDim, decltype(begin)::value, decltype(end)::value>(o_rc, coord_o, o_tile,
                                                                                      params.seq_len - row0);
        };
        if constexpr (Traits::kSplit) {
            // The next grid may start launching once every CTA has passed its key loop (at D=64 it
            // was let in after the first softmax, above; at entry, its CTAs would wait on SMs this
            // grid still needs: v4_pipelined's NOTES.md, runs 6-7).
            if constexpr (kPdlKernel<Traits>) evo_sm90::allow_next_grid();
            const ClusterMerge<Traits> cluster{shared, params.key_splits};
            // The owner's O comes back normalised. It stores the first half of the columns between its
            // two landings, under the second half's flight (NOTES.md, run 170), and the rest after.
            constexpr int kFirstColumns = 2 * (Traits::kFirstLanding - 1);   // chunk 1 + i: columns 2i, 2i + 1
            const bool owner = cluster.merge(softmax, whole, o_rc, consumer_thread / 32, consumer_thread % 32,
                                              tile_count == 0 ? probe : trace::Probe{},
                                              [&] { store_columns(Int<0>{}, Int<kFirstColumns>{}); });
            if (tile_count == 0) probe.mark(trace::kMerged);
            if (!owner) return;
            store_columns(Int<kFirstColumns>{}, Int<-1>{});
        } else {
            float inv_sum[kRows];
            softmax.inverse_sums(inv_sum);
            scale_rows(o_rc, inv_sum);
            if constexpr (Traits::kTmaEpilogue) {
                store_slab_tma<Traits>(tOrO, params, shared, tile, turn.group,
                                       consumer_thread % cutlass::NumThreadsPerWarpGroup);
            } else {
                store_columns(Int<0>{}, Int<-1>{});
            }
        }
        if (tile_count == 0) probe.mark(trace::kStoreIssued);
    }
    if constexpr (Traits::kTmaEpilogue) store_slab_drain(consumer_thread % cutlass::NumThreadsPerWarpGroup);
}

// Entry, thread 0: a K or V ring's barriers, as CUTLASS's PipelineTmaAsync::init_barriers sets them
// for a cluster of one (a stage is full on the loading thread's arrival and its bytes, empty once
// every consumer thread has released it). That function ran in all 128 threads of warp group 0,
// each electing a thread and fencing, once per ring, before the CTA's first barrier; here the
// thread that initialises the other barriers does it, under their one fence (NOTES.md, run 134).
template <class Traits>
__device__ void init_ring_barriers(typename Traits::Pipeline::SharedStorage& ring) {
    CUTLASS_PRAGMA_UNROLL
    for (int stage = 0; stage < Traits::kStages; ++stage) {
        ring.full_barrier_[stage].init(1);
        ring.empty_barrier_[stage].init(Traits::kConsumerThreads);
    }
}

// The K or V ring's parameters for one role: the producer thread is the leader that posts each
// stage's expected TMA bytes; every consumer thread releases stages (arrival count = consumers).
template <class Traits>
__device__ typename Traits::Pipeline::Params pipeline_params(bool producer, bool leader, uint32_t stage_bytes) {
    typename Traits::Pipeline::Params p;
    p.role = producer ? Traits::Pipeline::ThreadCategory::Producer : Traits::Pipeline::ThreadCategory::Consumer;
    p.is_leader = leader;
    p.num_consumers = Traits::kConsumerThreads;
    p.transaction_bytes = stage_bytes;
    return p;
}

template <class Traits, bool kCausal>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocksPerSm)
v5_hopper_attention_fwd(CUTE_GRID_CONSTANT typename Traits::Params const params) {
    extern __shared__ __align__(1024) unsigned char smem[];
    auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
    using Pipeline = typename Traits::Pipeline;

    const int warp_group = __shfl_sync(0xffffffff, threadIdx.x / cutlass::NumThreadsPerWarpGroup, 0);
    const unsigned long long entry_ns = V5_HOPPER_TRACE ? trace::global_ns() : 0;
    const unsigned long long entry_cycles = V5_HOPPER_TRACE ? clock64() : 0;
#if V5_HOPPER_TRACE
    const trace::Probe probe{&shared.trace_row};
#else
    const trace::Probe probe{};
#endif

    // V5_DEV_KEEP_LAUNCH_REGISTERS: the split kernels' warp groups keep the registers they launch with
    // (no setmaxnreg), so every CTA holds the same allocation from entry to exit (NOTES.md, run 197).
    constexpr bool kKeepLaunchRegisters = Traits::kSplit && V5_DEV_KEEP_LAUNCH_REGISTERS > 0;
    const auto prefetch_descriptors = [&] {
        prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
        if constexpr (Traits::kTmaEpilogue) prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    };
    if (threadIdx.x == 0) {
        // A split CTA's barriers come before anything that reads the launch's constant bank (the
        // descriptors' address, the cluster's size), which its entry used to wait on (NOTES.md, run 199).
        if constexpr (!Traits::kSplit) prefetch_descriptors();
        for (int b = 0; b < Traits::kQBuffers; ++b) {
            Traits::BarrierQ::init(&shared.barrier_q[b], 1);
            Traits::BarrierQEmpty::init(&shared.barrier_q_empty[b], Traits::kConsumerThreads);
        }
        init_ring_barriers<Traits>(shared.pipeline_k);
        init_ring_barriers<Traits>(shared.pipeline_v);
        // Unarmed: their bytes depend on the split count, and %cluster_nctarank is a constant-bank load
        // (c[0x0][0x188] in the SASS); the owner arms its own at the merge.
        if constexpr (Traits::kSplit) ClusterMerge<Traits>::init_unarmed_barriers(shared);
        cutlass::arch::fence_barrier_init();   // one fence for every barrier above
        if constexpr (Traits::kSplit) prefetch_descriptors();
#if V5_HOPPER_TRACE
        trace::clear(shared.trace_row);
#endif
        if constexpr (kEarlyLoads<Traits>) send_first_loads<Traits, kCausal>(params, shared, probe);
    }
    const unsigned long long init_ns = V5_HOPPER_TRACE && V5_HOPPER_TRACE != 3 ? trace::global_ns() : 0;
    const unsigned long long init_cycles = V5_HOPPER_TRACE ? clock64() : 0;
    // Barriers first, pipeline objects later: built after setmaxnreg, inside each role's branch,
    // nothing but the kernel parameters stays live across the register reallocation (values that
    // did were spilled to local memory around it).
    __syncthreads();   // every barrier initialised before anyone arrives on or waits for one
    if constexpr (Traits::kSplit) evo_sm90::cluster_arrive_relaxed();
    const unsigned long long synced_ns = V5_HOPPER_TRACE && V5_HOPPER_TRACE != 3 ? trace::global_ns() : 0;
    const unsigned long long synced_cycles = V5_HOPPER_TRACE ? clock64() : 0;
    // Programmatic dependent launch: this grid may have started while the previous kernel on the
    // stream was finishing. The loading threads wait for it before their first load (kPdlKernel).
    if (threadIdx.x == 0) {
        probe.mark_at(trace::kEntry, entry_ns, entry_cycles);
        probe.mark_at(trace::kInitDone, init_ns, init_cycles);
        probe.mark_at(trace::kSynced, synced_ns, synced_cycles);
    }

    if (!Traits::kNoProducer && warp_group == 0) {
        if constexpr (!kKeepLaunchRegisters) cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
        const int warp_in_group = __shfl_sync(0xffffffff, (threadIdx.x / 32) % 4, 0);
        if (warp_in_group == 0 && cute::elect_one_sync()) {
            Pipeline pipeline_k(shared.pipeline_k, pipeline_params<Traits>(true, true, Traits::kTmaBytesK),
                                Shape<_1, _1, _1>{}, cute::false_type{});
            Pipeline pipeline_v(shared.pipeline_v, pipeline_params<Traits>(true, true, Traits::kTmaBytesV),
                                Shape<_1, _1, _1>{}, cute::false_type{});
            produce_kv<Traits, kCausal, Traits::kSeparateV ? Rings::kK : Rings::kBoth>(params, shared, pipeline_k,
                                                                                        pipeline_v, probe);
        } else if (!kEarlyLoads<Traits> && warp_in_group == 1 && cute::elect_one_sync()) {
            produce_q<Traits, kCausal>(params, shared, probe);
        } else if (!kEarlyLoads<Traits> && kPdlKernel<Traits> && Traits::kMinBlocksPerSm > 1 && warp_in_group == 3 &&
                   cute::elect_one_sync()) {
            if (prefetches_inputs<Traits>()) prefetch_inputs<Traits, kCausal>(params);
        } else if (Traits::kSeparateV && warp_in_group == 2 && cute::elect_one_sync()) {
            Pipeline pipeline_k(shared.pipeline_k, pipeline_params<Traits>(true, true, Traits::kTmaBytesK),
                                Shape<_1, _1, _1>{}, cute::false_type{});
            Pipeline pipeline_v(shared.pipeline_v, pipeline_params<Traits>(true, true, Traits::kTmaBytesV),
                                Shape<_1, _1, _1>{}, cute::false_type{});
            produce_kv<Traits, kCausal, Rings::kV>(params, shared, pipeline_k, pipeline_v, trace::Probe{});
        }
    } else {
        if constexpr (Traits::kNoProducer) {
            if (threadIdx.x == 0) send_first_loads<Traits, kCausal>(params, shared, probe);
        } else if constexpr (!kKeepLaunchRegisters) {
            cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
        }
        Pipeline pipeline_k(shared.pipeline_k, pipeline_params<Traits>(false, false, Traits::kTmaBytesK),
                            Shape<_1, _1, _1>{}, cute::false_type{});
        Pipeline pipeline_v(shared.pipeline_v, pipeline_params<Traits>(false, false, Traits::kTmaBytesV),
                            Shape<_1, _1, _1>{}, cute::false_type{});
        const int consumer_thread = int(threadIdx.x) - (Traits::kNoProducer ? 0 : cutlass::NumThreadsPerWarpGroup);
        consume<Traits, kCausal>(params, shared, pipeline_k, pipeline_v, consumer_thread,
                                 consumer_thread == 0 ? probe : trace::Probe{});
#if V5_HOPPER_TRACE
        if (consumer_thread == 0) {
            probe.mark(trace::kExit);
            trace::finish(params.trace, params.trace_call, shared.trace_row, Traits::kSplit ? evo_sm90::cluster_rank() : 0);
        }
#endif
    }
}

}  // namespace v5_hopper
