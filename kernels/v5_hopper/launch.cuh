// Host side: the TMA descriptors of one call, the shared-memory opt-in, the launch.
// Instantiated once per (dtype, head dim) in its own translation unit (inst_*.cu), so the four
// heavy CuTe instantiations compile in parallel.
#pragma once

#include <atomic>
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "attention_kernel.cuh"
#include "evo_sdpa_abi.h"
#include "kernel_traits.cuh"
#include "tail_split.cuh"

namespace v5_hopper {

constexpr int kUnsupported = EVO_SDPA_ERR_UNSUPPORTED;

template <class Element, int kHeadDim>
int launch(void const* q, void const* k, void const* v, void* o, int batch, int heads, int seq_len,
           bool causal, float scale, cudaStream_t stream);

namespace {
// Devices on which a kernel's shared-memory opt-in is done (bit d: device d < 64). Internal
// linkage on purpose: a static local of a function template is an STB_GNU_UNIQUE symbol, which
// the loader binds across every library of one process, so a second build of this variant
// loaded beside the first (the A/B sweep, an evolution run) skipped its own opt-in and every
// launch failed with "invalid argument" (seen on the H100, run 2 of NOTES.md).
template <class Traits, bool kCausal>
std::atomic<uint64_t> configured_devices{0};
// Clusters of S CTAs that fit on device d at once plus one, [d][S] (0: not read yet, so a device that
// fits none is read once too); internal for the same reason.
template <class Traits, bool kCausal>
std::atomic<int> active_clusters[64][Traits::kMaxSplits + 1] = {};
}  // namespace

namespace detail {

inline bool aligned16(void const* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <class Traits, bool kCausal>
cudaError_t configure_once() {
    int device = 0;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
    auto& configured = configured_devices<Traits, kCausal>;
    if (bit != 0 && (configured.load(std::memory_order_acquire) & bit)) return cudaSuccess;
    status = cudaFuncSetAttribute(v5_hopper_attention_fwd<Traits, kCausal>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
    // Several CTAs to an SM need the whole carveout as shared memory; the default is only a hint.
    if (status == cudaSuccess && Traits::kMinBlocksPerSm > 1) {
        status = cudaFuncSetAttribute(v5_hopper_attention_fwd<Traits, kCausal>,
                                      cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    }
    if (status == cudaSuccess) configured.fetch_or(bit, std::memory_order_release);
    return status;
}

template <class Traits, class Element>
typename Traits::Params make_params(Element const* q, Element const* k, Element const* v, void* o, int batch,
                                    int heads, int seq_len, float scale) {
    const int64_t row = Traits::kHeadDim, head = int64_t(seq_len) * Traits::kHeadDim, batch_stride = head * heads;
    const auto shape_qk = make_shape(seq_len, int(Traits::kHeadDim), heads, batch);
    const auto stride_qk = make_stride(row, _1{}, head, batch_stride);
    const auto shape_vt = make_shape(int(Traits::kHeadDim), seq_len, heads, batch);
    const auto stride_vt = make_stride(_1{}, row, head, batch_stride);
    return {
        make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(q), shape_qk, stride_qk),
                      take<0, 2>(typename Traits::SmemLayoutQ{}), select<0, 2>(typename Traits::TileShapeQK{}), _1{}),
        make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(k), shape_qk, stride_qk),
                      take<0, 2>(typename Traits::SmemLayoutK{}), select<1, 2>(typename Traits::TileShapeQK{}), _1{}),
        make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(v), shape_vt, stride_vt),
                      take<0, 2>(typename Traits::SmemLayoutVt{}), select<1, 2>(typename Traits::TileShapePV{}), _1{}),
        make_tma_copy(SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element*>(o)), shape_qk, stride_qk),
                      take<0, 2>(typename Traits::SmemLayoutO{}), typename Traits::SlabShapeO{}, _1{}),
        static_cast<Element*>(o),
        seq_len,
        heads,
        batch,
        scale * float(M_LOG2E),
        1,
    };
}

// SMs of the current device, read once per device (0 if it cannot be read).
inline int sm_count() {
    static std::atomic<int> cached[64] = {};
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    if (device < 64) {
        const int known = cached[device].load(std::memory_order_relaxed);
        if (known > 0) return known;
    }
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    if (device < 64) cached[device].store(count, std::memory_order_relaxed);
    return count;
}

// The launch attribute of a one-dimensional cluster of `splits` CTAs.
inline cudaLaunchAttribute cluster_of(int splits) {
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = unsigned(splits);
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    return cluster;
}

// Clusters of `splits` CTAs of this kernel that fit on the device at once (0 if unknown), read
// once per device and split.
template <class Traits, bool kCausal>
int max_active_clusters(int splits) {
    auto& cached = active_clusters<Traits, kCausal>;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device >= 64 || splits > Traits::kMaxSplits) return 0;
    const int known = cached[device][splits].load(std::memory_order_relaxed);
    if (known > 0) return known - 1;
    if (configure_once<Traits, kCausal>() != cudaSuccess) return 0;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(splits));
    config.blockDim = dim3(Traits::kThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    cudaLaunchAttribute cluster = cluster_of(splits);
    config.attrs = &cluster;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, v5_hopper_attention_fwd<Traits, kCausal>, &config) != cudaSuccess) {
        cudaGetLastError();   // not sticky: clear it so the launch does not report it
        return 0;
    }
    cached[device][splits].store(clusters + 1, std::memory_order_relaxed);
    return clusters;
}

// CTAs per cluster for a grid of `tiles` query tiles whose keys come in `key_shares` shares at
// most (1: no split): the most of 4 and 2 that keeps the grid within the CTAs the SMs hold at once
// (one per SM, two or three for 64-row split CTAs), gives every rank a share, and whose clusters all
// fit on the device at once (a second wave of clusters would double the time).
template <class Traits, bool kCausal>
int cluster_splits(int64_t tiles, int key_shares) {
    const int64_t slots = int64_t(sm_count()) * Traits::kMinBlocksPerSm;
    for (int splits = Traits::kMaxSplits; splits >= 2; splits /= 2) {
        if (splits > key_shares || tiles * splits > slots) continue;
        if (tiles <= max_active_clusters<Traits, kCausal>(splits)) return splits;
    }
    return 1;
}

// Programmatic dependent launch for a launch of a split kernel: pdl 1 always, 2 only while the
// stream is being captured into a graph. Under graph replay it let each call start while the
// previous one finished (-1.2 us per call on the split shapes, NOTES.md, runs 20-21); in eager
// timing, with an L2 flush kernel before each call, run 20 measured every PDL launch 3.5-4 us
// slower and run 21 measured no difference, so eager launches go without it.
inline bool use_pdl(cudaStream_t stream) {
    if (V5_HOPPER_PDL == 1) return true;
    if (V5_HOPPER_PDL != 2) return false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return status == cudaStreamCaptureStatusActive;
}

// The fewest tiles an unsplit launch runs on a persistent grid (tunables.persistent).
inline int64_t persistent_min_tiles(int64_t sms) {
    return V5_HOPPER_PERSISTENT == 1 ? 0 : V5_HOPPER_PERSISTENT == 2 ? V5_HOPPER_PERSISTENT_MIN_WAVES * sms : INT64_MAX;
}

template <class Traits, bool kCausal>
int launch_traits(typename Traits::Params const& params, cudaStream_t stream) {
    const cudaError_t configured = configure_once<Traits, kCausal>();
    if (configured != cudaSuccess) return int(configured);
    const int64_t m_blocks = (params.seq_len + Traits::kBlockM - 1) / Traits::kBlockM;
    const int64_t tiles = m_blocks * params.heads * params.batch;
    const int64_t sms = sm_count();
    // A CTA's walk index (tile_order.cuh) runs past the last tile by up to the heads plus twice the
    // grid (a paired walk's step) before it stops: all of it must fit an int.
    if (tiles * params.key_splits + int64_t(params.heads) * params.batch + 2 * sms > INT_MAX)
        return kUnsupported;
    // Persistent grid: one CTA per SM (shared memory and registers allow no second one) walks the
    // tiles, with no per-tile prologue and the short causal tiles packed behind the long ones.
    // Below a few waves of tiles the hardware's own block scheduling balances better than the
    // static round-robin (NOTES.md, run 6: 1,8,4096,128 causal, 1.9 waves).
    const bool persistent = !Traits::kSplit && sms > 0 && tiles >= persistent_min_tiles(sms);
    const int64_t ctas = persistent ? std::min(tiles, sms) : tiles * params.key_splits;

    cudaLaunchConfig_t config = {};
    // A split grid is (query tiles x splits, heads, batch): each CTA reads its tile off its indices
    // (TileScheduler::coord). It runs only where all its clusters fit the GPU at once, so its heads
    // and batch are far below the 65535 a grid's y and z allow.
    if constexpr (Traits::kSplit) {
        if (params.heads > 65535 || params.batch > 65535) return kUnsupported;
        config.gridDim = dim3(unsigned(m_blocks * params.key_splits), unsigned(params.heads), unsigned(params.batch));
    } else {
        config.gridDim = dim3(unsigned(ctas));
    }
    config.blockDim = dim3(Traits::kThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    config.stream = stream;
    cudaLaunchAttribute attributes[2];
    unsigned count = 0;
    if constexpr (Traits::kSplit) attributes[count++] = cluster_of(params.key_splits);
    if (kPdlKernel<Traits> && use_pdl(stream)) {
        attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attributes[count].val.programmaticStreamSerializationAllowed = 1;
        ++count;
    }
    config.attrs = count > 0 ? attributes : nullptr;
    config.numAttrs = count;
#if V5_HOPPER_TRACE
    typename Traits::Params traced = params;
    traced.trace = v5_hopper_trace_buffer();
    if (traced.trace == nullptr) return int(cudaErrorMemoryAllocation);
    traced.trace_call = v5_hopper_trace_next_call();
    const cudaError_t launched = cudaLaunchKernelEx(&config, v5_hopper_attention_fwd<Traits, kCausal>, traced);
#else
    const cudaError_t launched = cudaLaunchKernelEx(&config, v5_hopper_attention_fwd<Traits, kCausal>, params);
#endif
    return int(launched != cudaSuccess ? launched : cudaGetLastError());
}

// The kernels of one (dtype, head dim). Tile shapes per (head dim, causal): NOTES.md, runs 2-3.
template <class Element, int kHeadDim>
struct Kernels {
    static constexpr int kBlockMFull = kHeadDim == 64 ? V5_HOPPER_BLOCK_M_D64_FULL : 128;
    static constexpr int kBlockMCausal = kHeadDim == 64 ? V5_HOPPER_BLOCK_M_D64_CAUSAL : 128;
    static constexpr int kBlockNFull = kHeadDim == 128 ? V5_HOPPER_BLOCK_N_D128_FULL : V5_HOPPER_BLOCK_N;
    static constexpr int kStages = kHeadDim == 64 ? V5_HOPPER_STAGES_D64 : V5_HOPPER_STAGES;
    using Causal = KernelTraits<Element, kHeadDim, kBlockMCausal, V5_HOPPER_BLOCK_N, kStages>;
    using Full = KernelTraits<Element, kHeadDim, kBlockMFull, kBlockNFull, kStages>;
    // From free_issue_d128_min_keys keys the two groups issue freely and each softmax runs under its own P V
    // (NOTES.md, runs 53-59: with two Q buffers +1.3-2.5% at 1024 and 2048 keys, +1.5-2.5% from 4096).
    using FreeIssue = KernelTraits<Element, kHeadDim, kBlockMFull, kBlockNFull, kStages, false, true>;
    // A split CTA walks a share of one tile's keys. At D=128 two stages leave shared memory for the
    // receive slots; at D=64 four hold the mission shape's whole 256-key share (split_stages_d64).
    // Its stages may be narrower than the full kernel's (split_block_n, split_block_n_d128): a share
    // then runs as more, smaller steps.
    static constexpr int kSplitBlockN = kHeadDim == 64 ? V5_HOPPER_SPLIT_BLOCK_N : V5_HOPPER_SPLIT_BLOCK_N_D128;
    using Split = KernelTraits<Element, kHeadDim, V5_HOPPER_SPLIT_BLOCK_M, kSplitBlockN,
                               kHeadDim == 64 ? V5_HOPPER_SPLIT_STAGES_D64 : 2, true>;
    // split_wide: 128-row split CTAs of two consumer groups and no producer, at D=64 with four 64-key
    // stages (about 110 KB), two to an SM by their 128 registers a thread.
    using WideSplit = KernelTraits<Element, kHeadDim, 128, 64, 4, true, false, true>;
    static constexpr bool kFreeIssueKernel = kHeadDim == 128 && V5_HOPPER_FREE_ISSUE_D128_MIN_KEYS > 0;

    // The split never gives a CTA fewer than about 128 keys, whatever the stage: 4 CTAs of one 64-key
    // stage each cost more than 2 of one 128-key stage on (1,8,256,64), the merge being paid for less
    // work (NOTES.md, run 34).
    static int splits_for(int64_t split_tiles, int seq_len) {
        constexpr int kMinShareKeys = 128;
        return cluster_splits<Split, false>(split_tiles, (seq_len + kMinShareKeys - 1) / kMinShareKeys);
    }
    static int split_m_blocks(int seq_len) { return (seq_len + Split::kBlockM - 1) / Split::kBlockM; }

    static int split(Element const* q, Element const* k, Element const* v, void* o, int batch, int heads, int seq_len,
                     float scale, int splits, cudaStream_t stream) {
        auto params = make_params<Split>(q, k, v, o, batch, heads, seq_len, scale);
        params.key_splits = splits;
        return launch_traits<Split, false>(params, stream);
    }

    // Where the 64-row split grid (of `splits` ranks) has more CTAs than SMs and the wide one fits them
    // once over with every share in its stages: the wide kernel, so the next call finds a slot on every
    // SM, enters early and prefetches (NOTES.md, runs 209-210: -0.06 to -0.1 us on 2,8,512,64). Called
    // only where split_wide is on at D=64 (full), so no other build instantiates the wide kernel.
    static bool runs_wide(int64_t heads_total, int seq_len, int splits) {
        const int64_t sms = sm_count();
        const int64_t wide_tiles = (seq_len + WideSplit::kBlockM - 1) / WideSplit::kBlockM * heads_total;
        const int key_tiles = (seq_len + WideSplit::kBlockN - 1) / WideSplit::kBlockN;
        if (splits != 2 || split_m_blocks(seq_len) * heads_total * splits <= sms) return false;
        if (wide_tiles * splits > sms || (key_tiles + splits - 1) / splits > WideSplit::kStages) return false;
        return WideSplit::kMinBlocksPerSm >= 2 && wide_tiles <= max_active_clusters<WideSplit, false>(splits);
    }

    static int unsplit(Element const* q, Element const* k, Element const* v, void* o, int batch, int heads,
                       int seq_len, float scale, cudaStream_t stream) {
        if constexpr (kFreeIssueKernel) {
            if (seq_len >= V5_HOPPER_FREE_ISSUE_D128_MIN_KEYS) {
                return launch_traits<FreeIssue, false>(
                    make_params<FreeIssue>(q, k, v, o, batch, heads, seq_len, scale), stream);
            }
        }
        return launch_traits<Full, false>(make_params<Full>(q, k, v, o, batch, heads, seq_len, scale), stream);
    }

    // The last heads a non-causal call of `heads_total` heads gives a split launch (tail_split.cuh):
    // none below tail_split_min_keys keys.
    static TailPlan tail_plan(int64_t heads_total, int seq_len) {
        if (V5_HOPPER_TAIL_SPLIT_MIN_KEYS == 0 || seq_len < V5_HOPPER_TAIL_SPLIT_MIN_KEYS || heads_total > INT_MAX) {
            return {0, 1};
        }
        const int sms = sm_count();
        return plan_tail(int(heads_total), (seq_len + kBlockMFull - 1) / kBlockMFull, kBlockMFull, seq_len,
                         split_m_blocks(seq_len), Split::kBlockM, sms, persistent_min_tiles(sms),
                         [seq_len](int64_t tiles) { return splits_for(tiles, seq_len); });
    }

    // Non-causal: the split kernel where the whole grid's clusters fit at once (key_split); else
    // the unsplit kernels, and the call's last heads to a second, split launch where that empties
    // the unsplit grid's last round (tail_plan). The tensors are (B, H, S, D) and contiguous, so
    // the heads of all batches are one run of B x H heads and a slice of them is a call of batch 1.
    static int full(Element const* q, Element const* k, Element const* v, void* o, int batch, int heads, int seq_len,
                    float scale, cudaStream_t stream) {
        if constexpr (V5_HOPPER_KEY_SPLIT) {
            const int64_t heads_total = int64_t(heads) * batch;
            const int splits = splits_for(split_m_blocks(seq_len) * heads_total, seq_len);
            if constexpr (V5_HOPPER_SPLIT_WIDE && kHeadDim == 64) {
                if (runs_wide(heads_total, seq_len, splits)) {
                    auto params = make_params<WideSplit>(q, k, v, o, batch, heads, seq_len, scale);
                    params.key_splits = splits;
                    return launch_traits<WideSplit, false>(params, stream);
                }
            }
            if (splits > 1) return split(q, k, v, o, batch, heads, seq_len, scale, splits, stream);
            const TailPlan plan = tail_plan(heads_total, seq_len);
            if (plan.heads > 0) {
                const int head_count = int(heads_total) - plan.heads;
                const int status = unsplit(q, k, v, o, 1, head_count, seq_len, scale, stream);
                if (status != 0) return status;
                const int64_t offset = int64_t(head_count) * seq_len * kHeadDim;
                return split(q + offset, k + offset, v + offset, static_cast<Element*>(o) + offset, 1, plan.heads,
                             seq_len, scale, plan.splits, stream);
            }
        }
        return unsplit(q, k, v, o, batch, heads, seq_len, scale, stream);
    }
};

}  // namespace detail

template <class Element, int kHeadDim>
int launch(void const* q, void const* k, void const* v, void* o, int batch, int heads, int seq_len,
           bool causal, float scale, cudaStream_t stream) {
    using Kernels = detail::Kernels<Element, kHeadDim>;
    // TMA: 16-byte aligned bases (row strides are D x 2 bytes, multiples of 16 by construction).
    if (!detail::aligned16(q) || !detail::aligned16(k) || !detail::aligned16(v) || !detail::aligned16(o)) {
        return kUnsupported;
    }
    if (!(scale > 0.0f) || !std::isfinite(scale)) return kUnsupported;

    auto const* q_ptr = static_cast<Element const*>(q);
    auto const* k_ptr = static_cast<Element const*>(k);
    auto const* v_ptr = static_cast<Element const*>(v);
    if (causal) {
        using Causal = typename Kernels::Causal;
        return detail::launch_traits<Causal, true>(
            detail::make_params<Causal>(q_ptr, k_ptr, v_ptr, o, batch, heads, seq_len, scale), stream);
    }
    return Kernels::full(q_ptr, k_ptr, v_ptr, o, batch, heads, seq_len, scale, stream);
}

}  // namespace v5_hopper

// One explicit instantiation per translation unit.
#define V5_HOPPER_INSTANTIATE(ELEMENT, HEAD_DIM)                                                         \
    template int v5_hopper::launch<ELEMENT, HEAD_DIM>(void const*, void const*, void const*, void*, int, \
                                                      int, int, bool, float, cudaStream_t);
