// A micro-benchmark for kernels/v5_hopper/NOTES.md (runs 245-246); not part of the variant, whose sources
// variant.yaml lists. What merging the split CTAs' partial states costs a chain of PDL launches: through a
// cluster's shared memory (two ranks a query tile, the split kernel's way) or through global memory (four ranks
// a tile and no cluster, the last rank to finish folding the others' states), each against the same grid with
// no merge and the same bytes of O stored.
//
//   pairs   256 CTAs of 256 threads, 89,088 B (two an SM), clusters of 2. Warp group 1 holds the rows: with the
//           merge, warps 4-5 push their state (4,608 B a warp: nine chunks of 16 B a lane, the split kernel's
//           push) into the peer with st.async on the peer's barrier, and warps 6-7 wait on their own barrier for
//           the peer's two, fold them and store 4 KB; without it, warps 6-7 store the same 4 KB. The push's
//           chunks a lane are a parameter (9, the split kernel's; 5, the compact push's; 3; 1), on 256 CTAs
//           (two an SM) and 128 (one an SM, the mission shape's grid).
//   quads   512 CTAs of 128 threads, 56,320 B (four an SM), no cluster, ranks blockIdx % 4 of tile blockIdx / 4.
//           Modes: none (each CTA stores its 2 KB quarter of the tile); writes (each writes its state, 8 KB of
//           16-bit O and 512 B of head, to a scratch slot, and stops); counter (the CTA's barrier, one thread's
//           acq_rel atomic on the tile's counter, the last stores the tile's 8 KB); merge (writes, the CTA's
//           barrier, one thread's fence.acq_rel.gpu and acq_rel atomic as CUTLASS's generic barrier arrives, and
//           the last reads the three others' states from L2, folds them and stores the tile's 8 KB). The
//           counters sit 4 B apart (four 128-byte lines) or 128 B apart (a line each).
// Every CTA: the PDL wait, the trigger, SPIN cycles of work in every thread, then its part. 32 launches a graph,
// the period is the median of 30 replays (pdl_chain.cuh).
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o merge_cost merge_cost.cu && ./merge_cost
#include <cstdint>
#include <cstdio>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "pdl_chain.cuh"

namespace {

constexpr int kPairSmem = 89088, kQuadSmem = 56320;
constexpr int kTiles = 128;
constexpr int kSlotChunks = 8704 / 16;   // a quad rank's state: 512 chunks of O, 32 of head
constexpr int kWarpBytes = 4608;         // a pair warp's pushed state

__device__ __forceinline__ uint32_t smem_addr(void const* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A thread's stand-in state: 36 values (2 of head, 32 of O, 2 spare), changed by the work so none is constant.
__device__ __forceinline__ void make_state(float (&state)[36], int spin) {
    for (int i = 0; i < 36; ++i) state[i] = float(threadIdx.x * 36 + i + blockIdx.x);
    pdl_chain::spin_for(spin);
    for (int i = 0; i < 36; ++i) state[i] = state[i] * 1.0001f + 0.5f;
}

template <bool kMerge, int kChunks = 9>
__global__ void __launch_bounds__(256, 2) pairs(int spin, float* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    uint4* slots = reinterpret_cast<uint4*>(smem);   // the peer's two warps' states
    uint64_t* barrier = reinterpret_cast<uint64_t*>(smem + 2 * kWarpBytes);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(barrier)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    // The peer's pushes may land before this arrival: the phase cannot complete while it is pending.
    if (kMerge && threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(barrier)),
                     "r"(2 * kChunks * 512));
    }
    float state[36];
    make_state(state, spin);
    if (warp < 4) return;
    const int w = warp - 4;
    if (kMerge && w < 2) {
        uint32_t remote_slots, remote_barrier;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_slots) : "r"(smem_addr(slots)), "r"(rank ^ 1u));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_barrier) : "r"(smem_addr(barrier)), "r"(rank ^ 1u));
        for (int c = 0; c < kChunks; ++c) {
            const uint32_t dst = remote_slots + uint32_t(w * kWarpBytes + (c * 32 + lane) * 16);
            asm volatile(
                "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(dst),
                "f"(state[4 * c]), "f"(state[4 * c + 1]), "f"(state[4 * c + 2]), "f"(state[4 * c + 3]),
                "r"(remote_barrier)
                : "memory");
        }
        return;
    }
    if (w < 2) return;
    if (kMerge) {
        uint32_t ready = 0;
        while (!ready) {
            asm volatile(
                "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}"
                : "=r"(ready)
                : "r"(smem_addr(barrier))
                : "memory");
        }
        for (int c = 0; c < kChunks; ++c) {
            const uint4 v = slots[(w - 2) * (kWarpBytes / 16) + c * 32 + lane];
            state[4 * c] += __uint_as_float(v.x) * 0.5f;
            state[4 * c + 1] += __uint_as_float(v.y) * 0.5f;
            state[4 * c + 2] += __uint_as_float(v.z) * 0.5f;
            state[4 * c + 3] += __uint_as_float(v.w) * 0.5f;
        }
    }
    float4* rows = reinterpret_cast<float4*>(out) + (size_t(blockIdx.x) * 2 + (w - 2)) * 128;
    for (int c = 0; c < 4; ++c) {
        rows[c * 32 + lane] = make_float4(state[4 * c + 4], state[4 * c + 5], state[4 * c + 6], state[4 * c + 7]);
    }
}

enum class Quad { kNone, kWrites, kCounter, kMerge };

__device__ __forceinline__ void store_tile(float4* out, int tile, float const (&state)[36]) {
    for (int c = 0; c < 4; ++c) {
        out[size_t(tile) * 512 + c * 128 + threadIdx.x] =
            make_float4(state[8 * c], state[8 * c + 2], state[8 * c + 4], state[8 * c + 6]);
    }
}

template <Quad kMode>
__global__ void __launch_bounds__(128, 4) quads(int spin, float* out, uint4* scratch, unsigned* counters, int stride) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned last;
    const int tile = blockIdx.x / 4, rank = blockIdx.x % 4;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    smem[threadIdx.x] = 0;
    float state[36];
    make_state(state, spin);
    float4* out4 = reinterpret_cast<float4*>(out);
    if constexpr (kMode == Quad::kNone) {
        out4[size_t(blockIdx.x) * 128 + threadIdx.x] = make_float4(state[0], state[1], state[2], state[3]);
        return;
    }
    if constexpr (kMode == Quad::kWrites || kMode == Quad::kMerge) {
        uint4* slot = scratch + (size_t(tile) * 4 + rank) * kSlotChunks;
        for (int c = 0; c < 4; ++c) {
            __half2 h[4];
            for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(state[8 * c + 2 * j], state[8 * c + 2 * j + 1]);
            __stcg(slot + c * 128 + threadIdx.x, *reinterpret_cast<uint4*>(h));
        }
        if (threadIdx.x < 32) {
            __stcg(slot + 512 + threadIdx.x, make_uint4(__float_as_uint(state[32]), __float_as_uint(state[33]), 0, 0));
        }
    }
    if constexpr (kMode == Quad::kWrites) return;
    if constexpr (kMode == Quad::kCounter || kMode == Quad::kMerge) {
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned* counter = counters + size_t(tile) * stride;
            unsigned before;
            if constexpr (kMode == Quad::kMerge) asm volatile("fence.acq_rel.gpu;" ::: "memory");
            asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
            last = before == 3u;
            if (before == 3u) *counter = 0;   // for the next call, which waits for this grid
        }
        __syncthreads();
        if (!last) return;
    }
    if constexpr (kMode == Quad::kMerge) {
        for (int other = 0; other < 4; ++other) {
            if (other == rank) continue;
            const uint4* theirs = scratch + (size_t(tile) * 4 + other) * kSlotChunks;
            const float weight = __uint_as_float(__ldcg(theirs + 512 + threadIdx.x % 32).x) * 1e-6f;
            for (int c = 0; c < 4; ++c) {
                const uint4 v = __ldcg(theirs + c * 128 + threadIdx.x);
                const __half2* h = reinterpret_cast<const __half2*>(&v);
                for (int j = 0; j < 4; ++j) {
                    const float2 f = __half22float2(h[j]);
                    state[8 * c + 2 * j] += f.x * weight;
                    state[8 * c + 2 * j + 1] += f.y * weight;
                }
            }
        }
    }
    store_tile(out4, tile, state);
}

template <class Kernel, class... Args>
float period(Kernel kernel, int ctas, int threads, int smem, int cluster, Args... args) {
    return pdl_chain::period(kernel, ctas, threads, smem, cluster, args...).p50;
}

}  // namespace

int main() {
    float* out;
    uint4* scratch;
    unsigned* counters;
    cudaMalloc(&out, 8 << 20);
    cudaMalloc(&scratch, size_t(kTiles) * 4 * kSlotChunks * sizeof(uint4));
    cudaMalloc(&counters, size_t(kTiles) * 32 * sizeof(unsigned));
    cudaMemset(counters, 0, size_t(kTiles) * 32 * sizeof(unsigned));
    int per_sm[2] = {0, 0};
    pdl_chain::configure(quads<Quad::kMerge>, kQuadSmem);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[0], quads<Quad::kMerge>, 128, kQuadSmem);
    pdl_chain::configure(pairs<true>, kPairSmem);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[1], pairs<true>, 256, kPairSmem);
    std::printf("CTAs an SM: quads %d, pairs %d\n", per_sm[0], per_sm[1]);
    for (int spin : {0, 4000, 8000}) {
        const float n4 = period(quads<Quad::kNone>, 512, 128, kQuadSmem, 1, spin, out, scratch, counters, 1);
        const float w4 = period(quads<Quad::kWrites>, 512, 128, kQuadSmem, 1, spin, out, scratch, counters, 1);
        const float c4 = period(quads<Quad::kCounter>, 512, 128, kQuadSmem, 1, spin, out, scratch, counters, 1);
        const float c4p = period(quads<Quad::kCounter>, 512, 128, kQuadSmem, 1, spin, out, scratch, counters, 32);
        const float g4 = period(quads<Quad::kMerge>, 512, 128, kQuadSmem, 1, spin, out, scratch, counters, 1);
        const float g4p = period(quads<Quad::kMerge>, 512, 128, kQuadSmem, 1, spin, out, scratch, counters, 32);
        std::printf("quad CTAs, spin %5d: no merge %.3f; writes %+.3f, counter %+.3f (a line each %+.3f), global "
                    "merge %+.3f (a line each %+.3f) us\n",
                    spin, n4, w4 - n4, c4 - n4, c4p - n4, g4 - n4, g4p - n4);
    }
    // The cluster merge: the split kernel's push (9 chunks a lane) and smaller ones.
    for (int ctas : {256, 128}) {
        for (int spin : {0, 4000, 8000}) {
            const float n2 = period(pairs<false>, ctas, 256, kPairSmem, 2, spin, out);
            const float c9 = period(pairs<true, 9>, ctas, 256, kPairSmem, 2, spin, out);
            const float c5 = period(pairs<true, 5>, ctas, 256, kPairSmem, 2, spin, out);
            const float c3 = period(pairs<true, 3>, ctas, 256, kPairSmem, 2, spin, out);
            const float c1 = period(pairs<true, 1>, ctas, 256, kPairSmem, 2, spin, out);
            std::printf("%d pair CTAs, spin %5d: no merge %.3f; pushes of 9 chunks a lane %+.3f, 5 %+.3f, 3 %+.3f, "
                        "1 %+.3f us\n", ctas, spin, n2, c9 - n2, c5 - n2, c3 - n2, c1 - n2);
        }
    }
    unsigned h[kTiles * 32];
    cudaMemcpy(h, counters, sizeof h, cudaMemcpyDeviceToHost);
    int stuck = 0;
    for (unsigned c : h) stuck += c != 0;
    std::printf("counters left non-zero: %d (%s)\n", stuck, cudaGetErrorString(cudaGetLastError()));
    return 0;
}
