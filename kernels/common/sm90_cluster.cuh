// The sm_90 instructions of a cluster key split, one small wrapper each: the CTAs of a
// thread-block cluster take disjoint shares of one query tile's key tiles, and every rank but the
// owner of a warp's rows pushes its partial softmax state into the owner's shared memory with
// st.async, which counts the bytes on an mbarrier of the owner (complete_tx). Also programmatic
// dependent launch. Shared by v4_pipelined (mma.sync) and v5_hopper (wgmma), listed in each one's
// variant.yaml sources. The wrappers exist where the instructions do (device code for sm_90 and
// later) and in the host pass, which parses templates that name them; EVO_SM90_HAS_CLUSTERS says
// whether the device code being compiled has them.
#pragma once
#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define EVO_SM90_HAS_CLUSTERS 1
#else
#define EVO_SM90_HAS_CLUSTERS 0
#endif

namespace evo_sm90 {

// The key tiles [begin, end) that split `rank` of `splits` takes out of [0, steps): contiguous
// shares differing by at most one tile (with splits > steps a rank gets none).
struct KeyShare {
    int begin;
    int end;
};

__host__ __device__ __forceinline__ KeyShare key_share(int steps, int rank, int splits) {
    return KeyShare{rank * steps / splits, (rank + 1) * steps / splits};
}

// The same shares for 2^shift splits, the division as a shift: a runtime division is about twenty
// instructions on the path to a split CTA's first load (v5_hopper's NOTES.md, run 132).
__host__ __device__ __forceinline__ KeyShare key_share_pow2(int steps, int rank, int shift) {
    return KeyShare{(rank * steps) >> shift, ((rank + 1) * steps) >> shift};
}

#if EVO_SM90_HAS_CLUSTERS || !defined(__CUDA_ARCH__)
__device__ __forceinline__ int cluster_rank() {
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return static_cast<int>(rank);
}

// log2 of a split count that is a power of two.
__device__ __forceinline__ int split_shift(int splits) { return __ffs(splits) - 1; }

// The cluster's index along the grid's x (blockIdx.x / the cluster's x size, with no division).
__device__ __forceinline__ int cluster_id_x() {
    uint32_t id;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(id));
    return static_cast<int>(id);
}

// The number of SM identifiers (%nsmid), read from the launch's constant bank. PTX lets it exceed the
// SM count (identifiers need not be contiguous), so a grid of at most this many CTAs has, on most
// SMs, one of them: a bound for a heuristic, not for correctness.
__device__ __forceinline__ unsigned sm_id_count() {
    unsigned n;
    asm("mov.u32 %0, %%nsmid;" : "=r"(n));
    return n;
}

// The shared::cluster address of `local_smem` (a shared::cta address) in CTA `rank`.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t local_smem, int rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local_smem), "r"(rank));
    return remote;
}

// A receive barrier in two halves: initialised with its one arrival pending, and that arrival made
// with the bytes it expects (arm_receive_barrier), completed by the st.async pushes' byte counts.
// Pushes may land before the arrival: the transaction count may run negative within a phase, and
// the phase cannot complete while the arrival is pending.
__device__ __forceinline__ void init_unarmed_barrier(uint32_t barrier) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(barrier) : "memory");
}

__device__ __forceinline__ void arm_receive_barrier(uint32_t barrier, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(bytes) : "memory");
}

// Both halves at once, by a thread that knows the bytes at initialisation.
__device__ __forceinline__ void init_receive_barrier(uint32_t barrier, uint32_t bytes) {
    init_unarmed_barrier(barrier);
    arm_receive_barrier(barrier, bytes);
}

// Publishes this CTA's barrier initialisations to the cluster (before the relaxed arrival).
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Every thread of the CTA, warp-uniformly: arrive on the cluster barrier at entry (relaxed: the
// fence above orders the initialisations) and wait on it before the first push, so no rank
// signals a barrier of another before it exists.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// 16 bytes from registers into another CTA's shared memory (both addresses shared::cluster),
// counted on that CTA's barrier. No fence: the barrier's completion orders them for the reader.
__device__ __forceinline__ void push_v4(uint32_t remote, float a, float b, float c, float d, uint32_t remote_barrier) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                 ::"r"(remote), "f"(a), "f"(b), "f"(c), "f"(d), "r"(remote_barrier)
                 : "memory");
}

// Spins until phase kParity of a local mbarrier has completed.
template <uint32_t kParity>
__device__ __forceinline__ void wait_barrier(uint32_t barrier) {
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(barrier), "n"(kParity)
            : "memory");
    }
}

// Programmatic dependent launch: a grid launched with programmatic stream serialisation may start
// while the previous kernel on the stream finishes; nothing may be read (or overwritten) before
// `wait_for_previous_grid` returns. `allow_next_grid` lets the next such grid start launching.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
#endif

}  // namespace evo_sm90
