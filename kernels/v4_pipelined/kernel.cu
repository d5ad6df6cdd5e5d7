// v4_pipelined: the fourth rung of the ladder. v3_mma's FlashAttention-2 style forward on the
// tensor cores (mma.sync m16n8k16, fp16 or bf16 in, fp32 accumulate), with the K/V tiles fed by
// a multi-stage cp.async pipeline:
//   - a CTA of 4 warps owns 64 query rows of one (batch, head); each warp owns 16 rows, so every
//     row's softmax statistics live in one warp (in the 4 lanes of a quad);
//   - Q is copied to shared memory once and kept in registers as mma A fragments;
//   - K and V tiles of kBlockN keys stream through a ring of kStages swizzled shared-memory
//     stages, issued kStages-1 tiles ahead, one barrier per key tile (pipeline.cuh);
//   - S = Q K^T in fp32 registers, online softmax in fp32, P reused from the S registers as the
//     A operand of O += P V, O normalised once at the end;
//   - at D=64, grids of at most one CTA per SM run 8-warp CTAs: two key groups split each step
//     and merge their softmax states at the end (key_split.cuh);
//   - on sm_90, grids that leave CTA slots empty split each query tile's keys across the 2 or 4
//     CTAs of a cluster, merged by pushing states into the owning rank (cluster_split.cuh), and
//     every launch allows programmatic dependent launch.
// Files: tile_traits.cuh (tile shape, stages), tile_layout.cuh (indices, swizzle, copies),
// pipeline.cuh (the K/V ring and its commit-group protocol), mma_primitives.cuh (PTX wrappers),
// main_loop.cuh (the two products), online_softmax.cuh, key_split.cuh, cluster_split.cuh,
// epilogue.cuh.
//
// Tunables: variant.yaml declares each (values, default, what it addresses) and the build passes
// all of them as -D; tile_traits.cuh stops the compile if one is missing.
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>

#include "evo_sdpa_abi.h"

#include "cluster_split.cuh"
#include "sm80_epilogue.cuh"
#include "key_split.cuh"
#include "sm80_main_loop.cuh"
#include "sm80_mma_primitives.cuh"
#include "sm80_online_softmax.cuh"
#include "pipeline.cuh"
#include "tile_layout.cuh"
#include "tile_traits.cuh"

namespace v4_pipelined {

constexpr float kLog2e = 1.4426950408889634f;

// What one warp carries through the main loop.
template <class Tr>
struct WarpState {
    uint32_t q_frag[Tr::kQkSteps][4];  // the warp's 16 query rows, as A fragments
    float o[Tr::kOutTiles][4];         // unnormalised output, fp32 C fragments
    OnlineSoftmax<Tr> softmax;
};

// One pipeline step: take it from the pipeline (which refills the stage freed by the previous
// step), then, if the warp's kBlockN keys of the step hold any key its rows attend, S = Q K^T,
// mask (diagonal / ragged tile only), online softmax, O += P V. No other barrier: the next steps
// are already in flight, issued kStages-1 steps ago.
template <class Tr>
__device__ __forceinline__ void attend_key_step(WarpState<Tr>& ws, const KvPipeline<Tr>& pipe, int step,
                                                const WarpRole& role, int first_row, int first_row_of_warp,
                                                int key_limit, int seq_len, bool causal, float scale_log2, int lane) {
    const int stage = KvPipeline<Tr>::stage_of(step);
    pipe.wait_for(step);  // every thread, every step: it holds the CTA's one barrier
    const int first_key = (pipe.first_tile + step) * Tr::kStepKeys + role.key_group * Tr::kBlockN;
    const bool attends = first_key < key_limit;  // else all masked for this warp (warp-uniform)

    float s[Tr::kScoreTiles][4];
#if V4_PIPELINED_ISSUE_AFTER_SCORES
    // A/B knob: the refill's cp.async burst after Q K^T's ldmatrix burst instead of before it.
    if (attends) compute_scores<Tr>(s, ws.q_frag, pipe.k_tile(stage, role.key_group), lane);
    pipe.refill(step);
    if (!attends) return;
#else
    pipe.refill(step);  // every thread: the copies and the commit group are per thread
    if (!attends) return;
    compute_scores<Tr>(s, ws.q_frag, pipe.k_tile(stage, role.key_group), lane);
#endif
    if (key_tile_needs_mask(first_key, Tr::kBlockN, first_row, seq_len, causal)) {
        mask_scores<Tr>(s, first_row_of_warp, first_key, seq_len, causal, lane);
    }
    uint32_t p_frag[Tr::kScoreTiles][2];
    ws.softmax.step(s, ws.o, p_frag, scale_log2);

    accumulate_pv<Tr>(ws.o, p_frag, pipe.v_tile(stage, role.key_group), lane);
}

// kClusterSplit: the CTAs of a cluster of key_splits split the query tile's keys (cluster_split.cuh).
template <class Tr, bool kClusterSplit>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinCtasPerSm)
v4_pipelined_attention_fwd(const typename Tr::elem_t* __restrict__ q, const typename Tr::elem_t* __restrict__ k,
                           const typename Tr::elem_t* __restrict__ v, typename Tr::elem_t* __restrict__ o,
                           int seq_len, bool causal, float scale_log2, int key_splits) {
    using T = typename Tr::elem_t;
    // Raw 16-byte words (dynamic: above 48 KB at D=128), carved by the pipeline into its stages.
    extern __shared__ uint4 smem_raw[];

#if V4_PIPELINED_HAS_CLUSTERS
    if constexpr (kClusterSplit) cluster_split_enter<Tr>(smem_address(smem_raw), key_splits);
#if V4_PIPELINED_PDL
    // Programmatic dependent launch: this grid may start while the previous kernel on the stream
    // finishes; nothing is read before that kernel is complete and its writes visible.
    evo_sm90::wait_for_previous_grid();
#endif
#endif
    const CtaCoords cta = cta_coords(kClusterSplit ? key_splits : 1);
    const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
    const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
    const WarpRole role = warp_role<Tr>(warp);
    const int first_row = cta.query_tile * Tr::kBlockM;
    const int first_row_of_warp = first_row + role.row_warp * Tr::kRowsPerWarp;
    const int key_limit = warp_key_limit(first_row_of_warp, Tr::kRowsPerWarp, seq_len, causal);
    const T* q_head = head_row_ptr<Tr::kHeadDim>(q, cta.head, seq_len, 0);
    const int steps = key_tile_end(first_row, Tr::kBlockM, Tr::kStepKeys, seq_len, causal);
    KeyShare share{0, steps};
    if constexpr (kClusterSplit) {
#if V4_PIPELINED_HAS_CLUSTERS
        share = key_share(steps, cluster_rank(), key_splits);
#else
        __trap();  // the host launches clusters only on sm_90 and later
#endif
    }
    const KvPipeline<Tr> pipe{reinterpret_cast<T*>(smem_raw), head_row_ptr<Tr::kHeadDim>(k, cta.head, seq_len, 0),
                              head_row_ptr<Tr::kHeadDim>(v, cta.head, seq_len, 0), seq_len,
                              share.end - share.begin, share.begin};

    // Copy groups: Q, then steps 0 .. kStages-2.
    load_tile_async<Tr, Tr::kBlockM>(pipe.spare_tile(), q_head, first_row, seq_len);
    cp_async_commit();
    pipe.prime();

    WarpState<Tr> ws;
    pipe.wait_for_q();
    load_q_fragments<Tr>(ws.q_frag, pipe.spare_tile(), role.row_warp, lane);
#pragma unroll
    for (int d = 0; d < Tr::kOutTiles; ++d) {
#pragma unroll
        for (int e = 0; e < 4; ++e) ws.o[d][e] = 0.0f;
    }

    for (int step = 0; step < pipe.tile_end; ++step) {
        attend_key_step<Tr>(ws, pipe, step, role, first_row, first_row_of_warp, key_limit, seq_len, causal,
                            scale_log2, lane);
    }

#if V4_PIPELINED_HAS_CLUSTERS && V4_PIPELINED_PDL
    // The next kernel may be launched once every CTA is here: it overlaps this grid's merge and
    // epilogue (a trigger at entry let it hold SM slots for the whole kernel: slower, NOTES.md).
    evo_sm90::allow_next_grid();
#endif
    pipe.drain();  // the stages are free: the spare tile stages O, the others hold partial states
#if V4_PIPELINED_HAS_CLUSTERS
    if constexpr (kClusterSplit) cluster_split_ready();
#endif
    if constexpr (Tr::kKeyGroups > 1) {
        float* partials = reinterpret_cast<float*>(pipe.k_tile(0));
        if (role.key_group > 0) {
            store_partial_state<Tr>(PartialState<Tr>::slot(partials, role.key_group, role.row_warp), ws.softmax, ws.o,
                                    lane);
        }
        __syncthreads();  // the partial states are written
        if (role.key_group > 0) return;  // key group 0 merges and writes; no barrier follows
#pragma unroll
        for (int g = 1; g < Tr::kKeyGroups; ++g) {
            merge_partial_state<Tr>(PartialState<Tr>::slot(partials, g, role.row_warp), ws.softmax, ws.o, lane);
        }
    }
#if V4_PIPELINED_HAS_CLUSTERS
    if constexpr (kClusterSplit) {
        if (!merge_cluster_states<Tr>(smem_address(smem_raw), reinterpret_cast<const char*>(smem_raw), key_splits,
                                      role.row_warp, ws.softmax, ws.o, lane)) {
            return;  // pushed to the owner of these rows
        }
    }
#endif
    write_output<Tr>(ws.o, ws.softmax, pipe.spare_tile(), head_row_ptr<Tr::kHeadDim>(o, cta.head, seq_len, 0),
                     role.row_warp * Tr::kRowsPerWarp, first_row_of_warp, seq_len, lane);
}

// Host helpers with function-local statics live in an unnamed namespace: as inline or template
// functions with external linkage their statics would be GNU "unique" symbols, shared by every
// library in the process that defines the same name (two builds of this variant loaded side by
// side: one would skip its shared-memory opt-in, seen in the A/B sweep's first run).
namespace {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The pipeline's stages, plus the receive slots and barriers of a cluster split.
template <class Tr, bool kClusterSplit>
constexpr int dynamic_smem_bytes() {
    if constexpr (kClusterSplit) {
        return ClusterLayout<Tr>::kSmemBytes;
    } else {
        return Tr::kSmemBytes;
    }
}

// Above 48 KB a kernel must opt in to its dynamic shared memory, once per device; the carveout
// hint asks for the largest shared-memory split so 2 (D=128) or 3 (D=64) CTAs fit per SM.
template <class Tr, bool kClusterSplit>
cudaError_t configure_kernel_once() {
    static std::atomic<uint64_t> configured_devices{0};  // bit d: done on device d (d < 64)
    int device = 0;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
    if (bit != 0 && (configured_devices.load(std::memory_order_acquire) & bit)) return cudaSuccess;
    status = cudaFuncSetAttribute(v4_pipelined_attention_fwd<Tr, kClusterSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  dynamic_smem_bytes<Tr, kClusterSplit>());
    if (status != cudaSuccess) return status;
#if V4_PIPELINED_CARVEOUT_HINT
    status = cudaFuncSetAttribute(v4_pipelined_attention_fwd<Tr, kClusterSplit>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared);
    if (status != cudaSuccess) return status;
#endif
    configured_devices.fetch_or(bit, std::memory_order_release);
    return cudaSuccess;
}

// What the launch needs to know of the current device, read once per device (zeros if it
// cannot be read: no key split then).
struct DeviceFacts {
    int sms;
    int cc_major;
};

inline DeviceFacts device_facts() {
    static std::atomic<int> cached_sms[64] = {};
    static std::atomic<int> cached_major[64] = {};
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return DeviceFacts{0, 0};
    if (device < 64) {
        const int sms = cached_sms[device].load(std::memory_order_acquire);
        if (sms > 0) return DeviceFacts{sms, cached_major[device].load(std::memory_order_relaxed)};
    }
    DeviceFacts facts{0, 0};
    if (cudaDeviceGetAttribute(&facts.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&facts.cc_major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        return DeviceFacts{0, 0};
    }
    if (device < 64) {
        cached_major[device].store(facts.cc_major, std::memory_order_relaxed);
        cached_sms[device].store(facts.sms, std::memory_order_release);  // publishes cc_major too
    }
    return facts;
}

// CTAs per cluster when the keys of each query tile are split across a cluster (1: no split).
// A grid that leaves CTA slots empty (fewer than SPLIT_CTAS_PER_SM per SM) is multiplied up to
// about that many per SM: by 2 or 4 (a split owns whole warps' rows), at most one key tile per CTA.
template <class Tr>
int cluster_key_splits(int64_t ctas, int seq_len) {
#if V4_PIPELINED_CLUSTER_SPLIT
    const DeviceFacts facts = device_facts();
    if (facts.cc_major < 9 || ctas <= 0) return 1;
    const int64_t by_grid = static_cast<int64_t>(facts.sms) * V4_PIPELINED_SPLIT_CTAS_PER_SM / ctas;
    const int64_t by_keys = ceil_div(seq_len, Tr::kStepKeys);
    const int64_t most = by_grid < by_keys ? by_grid : by_keys;
    int splits = 1;
    while (splits * 2 <= most && splits * 2 <= ClusterLayout<Tr>::kMaxSplits) splits *= 2;
    return splits;
#else
    (void)ctas;
    (void)seq_len;
    return 1;
#endif
}

template <class Tr, bool kClusterSplit>
int launch_traits(const void* q, const void* k, const void* v, void* o, int64_t heads_total, int query_tiles,
                  int seq_len, bool causal, float scale, int key_splits, cudaStream_t stream) {
    using T = typename Tr::elem_t;
    const cudaError_t configured = configure_kernel_once<Tr, kClusterSplit>();
    if (configured != cudaSuccess) return static_cast<int>(configured);
    const dim3 grid(static_cast<unsigned>(heads_total * key_splits), static_cast<unsigned>(query_tiles));
    cudaLaunchConfig_t launch_config = {};
    launch_config.gridDim = grid;
    launch_config.blockDim = dim3(Tr::kThreads);
    launch_config.dynamicSmemBytes = dynamic_smem_bytes<Tr, kClusterSplit>();
    launch_config.stream = stream;
    cudaLaunchAttribute attributes[2];
    unsigned count = 0;
    if constexpr (kClusterSplit) {
        attributes[count].id = cudaLaunchAttributeClusterDimension;
        attributes[count].val.clusterDim.x = static_cast<unsigned>(key_splits);
        attributes[count].val.clusterDim.y = 1;
        attributes[count].val.clusterDim.z = 1;
        ++count;
    }
#if V4_PIPELINED_PDL
    if (device_facts().cc_major >= 9) {
        attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attributes[count].val.programmaticStreamSerializationAllowed = 1;
        ++count;
    }
#endif
    launch_config.attrs = count > 0 ? attributes : nullptr;
    launch_config.numAttrs = count;
    const cudaError_t launched = cudaLaunchKernelEx(&launch_config, v4_pipelined_attention_fwd<Tr, kClusterSplit>,
                                                    static_cast<const T*>(q), static_cast<const T*>(k),
                                                    static_cast<const T*>(v), static_cast<T*>(o), seq_len, causal,
                                                    scale * kLog2e, key_splits);
    return static_cast<int>(launched != cudaSuccess ? launched : cudaGetLastError());
}

}  // namespace

template <typename T, int HEAD_DIM>
int launch(const void* q, const void* k, const void* v, void* o, int batch, int heads, int seq_len, bool causal,
           float scale, cudaStream_t stream) {
    using Tr = TileTraits<T, HEAD_DIM>;
    if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(o)) return EVO_SDPA_ERR_UNSUPPORTED;  // 16-byte copies
    if (!(scale > 0.0f) || !std::isfinite(scale)) return EVO_SDPA_ERR_UNSUPPORTED;  // softmax assumes scale > 0
    if (static_cast<int64_t>(seq_len) * HEAD_DIM > INT_MAX) return EVO_SDPA_ERR_UNSUPPORTED;  // 32-bit row offsets
    const int query_tiles = ceil_div(seq_len, Tr::kBlockM);
    const int64_t heads_total = static_cast<int64_t>(batch) * heads;
    if (query_tiles > 65535 || heads_total > INT_MAX) return EVO_SDPA_ERR_UNSUPPORTED;  // gridDim.y / gridDim.x limits
    // A split CTA walks a few key tiles: at D=128 two stages leave room for the receive slots with
    // two CTAs per SM.
    using ClusterTr = TileTraits<T, HEAD_DIM, Tr::kRowWarps, (HEAD_DIM > 64 ? 1 : V4_PIPELINED_CLUSTER_KEY_GROUPS_D64),
                                 Tr::kBlockN, (HEAD_DIM > 64 ? 2 : Tr::kStages)>;
    const int key_splits = cluster_key_splits<ClusterTr>(heads_total * query_tiles, seq_len);
    if (key_splits > 1) {
        return launch_traits<ClusterTr, true>(q, k, v, o, heads_total, query_tiles, seq_len, causal, scale, key_splits,
                                              stream);
    }
#if V4_PIPELINED_KEY_SPLIT
    // A grid of at most one 4-warp CTA per SM leaves each SM sub-partition one warp with a long
    // serial chain of key tiles; two key groups put two warps on the same rows, each half the chain.
    if constexpr (HEAD_DIM == 64) {
        using SplitTr = TileTraits<T, HEAD_DIM, Tr::kRowWarps, 2>;
        static_assert(SplitTr::kBlockM == Tr::kBlockM, "the same query tiles either way");
        if (heads_total * query_tiles <= device_facts().sms) {
            return launch_traits<SplitTr, false>(q, k, v, o, heads_total, query_tiles, seq_len, causal, scale, 1, stream);
        }
    }
#endif
    return launch_traits<Tr, false>(q, k, v, o, heads_total, query_tiles, seq_len, causal, scale, 1, stream);
}

template <typename T>
int dispatch_head_dim(const void* q, const void* k, const void* v, void* o, int batch, int heads, int seq_len,
                      int head_dim, bool causal, float scale, cudaStream_t stream) {
    switch (head_dim) {
        case 64: return launch<T, 64>(q, k, v, o, batch, heads, seq_len, causal, scale, stream);
        case 128: return launch<T, 128>(q, k, v, o, batch, heads, seq_len, causal, scale, stream);
        default: return EVO_SDPA_ERR_UNSUPPORTED;
    }
}

}  // namespace v4_pipelined

extern "C" int evo_sdpa_abi_version(void) { return EVO_SDPA_ABI_VERSION; }

extern "C" int evo_sdpa_forward(const void* q, const void* k, const void* v, void* o, int B, int H, int S, int D,
                                int causal, float scale, int dtype, void* stream) {
    if (B < 1 || H < 1 || S < 1) return EVO_SDPA_ERR_UNSUPPORTED;
    const auto cuda_stream = static_cast<cudaStream_t>(stream);
    const bool is_causal = causal != 0;
    switch (dtype) {
        case EVO_SDPA_FP16:
            return v4_pipelined::dispatch_head_dim<__half>(q, k, v, o, B, H, S, D, is_causal, scale, cuda_stream);
        case EVO_SDPA_BF16:
            return v4_pipelined::dispatch_head_dim<__nv_bfloat16>(q, k, v, o, B, H, S, D, is_causal, scale, cuda_stream);
        default:
            return EVO_SDPA_ERR_UNSUPPORTED;
    }
}

extern "C" const char* evo_sdpa_error_string(int code) {
    if (code == 0) return "success";
    if (code == EVO_SDPA_ERR_UNSUPPORTED) {
        return "unsupported configuration (v4_pipelined: fp16/bf16, D in {64,128}, B,H,S >= 1, S <= 65535*64, scale > 0, "
               "q/k/v/o 16-byte aligned)";
    }
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
