// A micro-benchmark for kernels/v5_hopper/NOTES.md (runs 238-239); not part of the variant, whose
// sources variant.yaml lists. What one key tile's pass of the 64-row D=64 split kernel costs on an SM,
// piece by piece, apart from the kernel's loads, merge and grid: its Q K^T (four SS m64n64k16 wgmmas)
// and P V (four RS ones) through the kernel's own traits and warpgroup_gemm, 32 ex2 a thread, the
// kernel's optimistic softmax, and its stage barriers. Every SM runs C CTAs of G warp groups for
// 2,000 passes over tiles already in shared memory; each warp group times its loop with clock64.
//
// Modes (what one pass holds):
//   0 products     Q K^T and P V issued, then waited for
//   1 ex2          32 exp2 a thread, alone
//   2 overlap      the products issued, 32 independent exp2, then the wait (the most the units can overlap)
//   3 bare pass    the kernel's order: S waited for, its 32 exp2 while P V runs, then P V waited for
//   4 + softmax    3 with the kernel's optimistic softmax (one vote), P in a fragment of its own
//                  converted under the next Q K^T
//   5 + barriers   4 with the K and V full-barrier waits before Q K^T and both releases: the tree's pass
//   6 waits only   4 with the two waits and no releases
//   7 releases     4 with the two releases and no waits
//   8 late V wait  4 with the K wait before Q K^T and the V wait between the two issues
//   9 early tests  4 with both stages tested under the softmax, waited for at the top only if not ready
// Reported per configuration: cycles a pass (median warp group), the products' MAC a clock an SM and the
// exp2 a clock an SM that gives. Branches on a value the compiler cannot know end the basic blocks where
// the pass's order needs it, and a clock read after the issue feeds the exp2 of modes 1-2, so ptxas
// keeps each mode's order (checked in the SASS, NOTES.md run 238).
//
// Built with the variant's tunable defines (tunables.cuh requires them) and the CUTLASS headers:
//   FLAGS=$(cd scripts && python3 -c "from evo_sdpa.variants import KERNELS_DIR, load_variant; \
//     from evo_sdpa.tunables import defaults, define_flags; v = load_variant(KERNELS_DIR / 'v5_hopper'); \
//     print(' '.join(define_flags(v, defaults(v))))")
//   CUTLASS=$(python3 -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))")/source/include
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr $FLAGS -I kernels/common -I kernels/v5_hopper -I $CUTLASS \
//     -gencode=arch=compute_90a,code=sm_90a -o pass_floor kernels/v5_hopper/diagnostics/pass_floor.cu && ./pass_floor
#include "tunables.cuh"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "fragment_views.cuh"
#include "kernel_traits.cuh"
#include "online_softmax.cuh"
#include "warpgroup_gemm.cuh"

namespace pass_floor {

using namespace cute;
using Element = cutlass::half_t;

template <int N>
using Traits = v5_hopper::KernelTraits<Element, 64, 64, N, 4, true>;

__device__ __forceinline__ bool test_wait(uint64_t* barrier, uint32_t phase) {
    uint32_t ready;
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ready)
                 : "r"(cute::cast_smem_ptr_to_uint(barrier)), "r"(phase)
                 : "memory");
    return ready != 0;
}

// Ends a basic block: never taken for a finite value.
__device__ __forceinline__ void block_end(float x) {
    if (__float_as_uint(x) == 0xffffffffu) __nanosleep(1);
}

template <int N, int G, int kMode>
__global__ void __launch_bounds__(128 * G) pass(long long* cycles, int passes, float* sink) {
    using T = Traits<N>;
    extern __shared__ __align__(1024) unsigned char smem[];
    Element* q = reinterpret_cast<Element*>(smem);
    Element* k = q + cosize_v<typename T::SmemLayoutQ>;
    Element* v = k + cosize_v<typename T::SmemLayoutK>;
    const int elements = cosize_v<typename T::SmemLayoutQ> + 2 * cosize_v<typename T::SmemLayoutK>;
    for (int i = threadIdx.x; i < elements; i += blockDim.x) q[i] = Element(float((i * 7) % 13) * 0.01f);

    const int thread = threadIdx.x % 128;
    typename T::TiledMmaQK mma_qk;
    typename T::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(thread);
    auto thr_pv = mma_pv.get_thread_slice(thread);
    Tensor tSrQ = thr_qk.partition_fragment_A(make_tensor(make_smem_ptr(q), typename T::SmemLayoutQ{}));
    Tensor tSrK = thr_qk.partition_fragment_B(make_tensor(make_smem_ptr(k), typename T::SmemLayoutK{}));
    Tensor tOrV = thr_pv.partition_fragment_B(make_tensor(make_smem_ptr(v), typename T::SmemLayoutVt{}));
    Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename T::TileShapeQK{}));
    Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(typename T::TileShapePV{}));
    Tensor tSrP = make_fragment_like(tSrS);
    Tensor s_rc = v5_hopper::rowcol_view(tSrS);
    Tensor p_rc = v5_hopper::rowcol_view(tSrP);
    Tensor o_rc = v5_hopper::rowcol_view(tOrO);
    clear(tOrO);
    for (int i = 0; i < size(tSrS); ++i) tSrS(i) = 0.01f * float(i % 5);
    Tensor tOrP = v5_hopper::convert_to_a_operand<Element>(tSrS);
    float held[decltype(size(tSrS))::value];
    for (int i = 0; i < size(tSrS); ++i) held[i] = -0.01f * float(i);
    v5_hopper::OnlineSoftmax<2, T::kMaxChains, T::kSumChains, true> softmax(0.125f * 1.4426950f);
    float o_scale[2] = {1.f, 1.f};
    bool rescaled_last = false, ready_k = false, ready_v = false;
    float acc = 0.f;
    softmax.first_update_into(s_rc, p_rc, o_scale);   // a first tile: the running maxima are set

    // The stages' barriers: full ones completed once (their tiles landed long ago), empty ones that
    // take every release and never complete.
    __shared__ uint64_t full[2], empty[2];
    if (threadIdx.x == 0) {
        for (int b = 0; b < 2; ++b) {
            cutlass::arch::ClusterBarrier::init(&full[b], 1);
            cutlass::arch::ClusterBarrier::init(&empty[b], (1 << 20) - 1);
        }
        cutlass::arch::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int b = 0; b < 2; ++b) cutlass::arch::ClusterBarrier::arrive(&full[b]);
    }
    __syncthreads();

    // Nothing is in flight here; without this wait ptxas cannot tell at the loop's head and injects one
    // before the rescale under Q K^T (C7517), which the kernel's loop does not have.
    warpgroup_wait<0>();
    constexpr bool kKernelSoftmax = kMode >= 4;
    constexpr bool kWaitK = kMode == 5 || kMode == 6 || kMode == 8;
    constexpr bool kWaitVFirst = kMode == 5 || kMode == 6;
    constexpr bool kRelease = kMode == 5 || kMode == 7;
    const long long start = clock64();
    for (int p = 0; p < passes; ++p) {
        const int stage = p & 3;
        if constexpr (kMode == 9) {
            if (!ready_k) cutlass::arch::ClusterBarrier::wait(&full[0], 0);
            if (!ready_v) cutlass::arch::ClusterBarrier::wait(&full[1], 0);
        }
        if constexpr (kWaitK) cutlass::arch::ClusterBarrier::wait(&full[0], 0);
        if constexpr (kWaitVFirst) cutlass::arch::ClusterBarrier::wait(&full[1], 0);
        if constexpr (kKernelSoftmax) {
            v5_hopper::warpgroup_gemm<true>(mma_qk, tSrQ(_, _, _, 0), tSrK(_, _, _, stage), tSrS);
            if (__any_sync(0xffffffff, rescaled_last)) v5_hopper::scale_rows(o_rc, o_scale);
            tOrP = v5_hopper::convert_to_a_operand<Element>(tSrP);
            if constexpr (kMode == 8) cutlass::arch::ClusterBarrier::wait(&full[1], 0);
            v5_hopper::warpgroup_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, stage), tOrO);
            warpgroup_wait<1>();
            warpgroup_fence_operand(tSrS);
            if constexpr (kRelease) cutlass::arch::ClusterBarrier::arrive(&empty[0]);
            if constexpr (kMode == 9) {
                ready_k = test_wait(&full[0], 0);
                ready_v = test_wait(&full[1], 0);
            }
            rescaled_last = softmax.template update_optimistic<true>(s_rc, p_rc, o_scale);
            acc += o_scale[0];
        } else if constexpr (kMode != 1) {
            v5_hopper::warpgroup_gemm<true>(mma_qk, tSrQ(_, _, _, 0), tSrK(_, _, _, stage), tSrS);
            v5_hopper::warpgroup_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, stage), tOrO);
        }
        if constexpr (kMode == 3) {
            warpgroup_wait<1>();
            warpgroup_fence_operand(tSrS);
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < size(tSrS); ++i) acc += v5_hopper::exp2_approx(fmaf(tSrS(i), -0.125f, held[i]));
        }
        block_end(acc);
        if constexpr (kMode == 1 || kMode == 2) {
            unsigned clock;
            asm volatile("mov.u32 %0, %%clock;" : "=r"(clock));
            const float tiny = __uint_as_float(clock & 1u);
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < size(tSrS); ++i) {
                const float e = v5_hopper::exp2_approx(held[i] + tiny);
                acc += e;
                held[i] = e * -0.5f;
            }
        }
        block_end(acc);
        if constexpr (kMode != 1) {
            warpgroup_wait<0>();
            warpgroup_fence_operand(tSrS);
            warpgroup_fence_operand(tOrO);
        }
        if constexpr (kRelease) cutlass::arch::ClusterBarrier::arrive(&empty[1]);
    }
    const long long stop = clock64();
    if (thread == 0) cycles[blockIdx.x * G + threadIdx.x / 128] = stop - start;
    const float keep = float(ready_k) + acc + tSrS(0) + tOrO(0) + tSrP(0) + softmax.row_sum[0];
    if (keep == 12345.f) sink[threadIdx.x] = keep;   // never: keeps every result live
}

constexpr const char* kModeNames[] = {"products",  "ex2",          "overlap",      "bare pass",    "+ softmax",
                                      "+ barriers", "waits only", "releases only", "late V wait", "early tests"};

template <int N, int G, int kMode>
void measure(int sms, int ctas_per_sm, int passes) {
    using T = Traits<N>;
    const int needed = (cosize_v<typename T::SmemLayoutQ> + 2 * cosize_v<typename T::SmemLayoutK>) * int(sizeof(Element));
    // Dynamic shared memory sized so that exactly ctas_per_sm CTAs fit an SM.
    const int smem = std::max(needed, 228 * 1024 / ctas_per_sm - 2048);
    if (needed > 228 * 1024 / ctas_per_sm - 2048) {
        printf("%-14s N=%3d C=%d G=%d: skipped, %d bytes a CTA do not fit %d an SM\n", kModeNames[kMode], N,
               ctas_per_sm, G, needed, ctas_per_sm);
        return;
    }
    auto kernel = pass<N, G, kMode>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const int grid = sms * ctas_per_sm;
    long long* cycles = nullptr;
    float* sink = nullptr;
    cudaMalloc(&cycles, grid * G * sizeof(long long));
    cudaMalloc(&sink, 128 * G * sizeof(float));
    kernel<<<grid, 128 * G, smem>>>(cycles, 8, sink);   // warm-up
    kernel<<<grid, 128 * G, smem>>>(cycles, passes, sink);
    const cudaError_t status = cudaDeviceSynchronize();
    std::vector<long long> per_group(size_t(grid) * G);
    cudaMemcpy(per_group.data(), cycles, per_group.size() * sizeof(long long), cudaMemcpyDeviceToHost);
    cudaFree(cycles);
    cudaFree(sink);
    if (status != cudaSuccess) {
        printf("%-14s N=%3d C=%d G=%d: %s\n", kModeNames[kMode], N, ctas_per_sm, G, cudaGetErrorString(status));
        return;
    }
    std::sort(per_group.begin(), per_group.end());
    const double per_pass = double(per_group[per_group.size() / 2]) / passes;
    const double groups = double(ctas_per_sm) * G;
    const double macs = 2.0 * 64 * N * 64;   // a group's Q K^T and P V
    const double ex2 = 128.0 * (64 * N / 128);
    printf("%-14s N=%3d C=%d G=%d: %7.1f cycles a pass", kModeNames[kMode], N, ctas_per_sm, G, per_pass);
    if (kMode != 1) printf(", %5.0f MAC/clk/SM", macs * groups / per_pass);
    if (kMode != 0) printf(", %5.2f ex2/clk/SM", ex2 * groups / per_pass);
    printf("\n");
}

template <int N, int G, int... kModes>
void measure_modes(int sms, int ctas_per_sm, int passes) {
    (measure<N, G, kModes>(sms, ctas_per_sm, passes), ...);
}

}  // namespace pass_floor

int main() {
    using namespace pass_floor;
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceProp properties;
    cudaGetDeviceProperties(&properties, device);
    printf("%s, %d SMs\n", properties.name, sms);
    constexpr int kPasses = 2000;
    // Two CTAs an SM, one group each: the tree's (2,8,512,64) layout, every mode.
    measure_modes<64, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9>(sms, 2, kPasses);
    // One and three CTAs an SM, two CTAs of two groups (the key-halves layout), 128-key tiles.
    measure_modes<64, 1, 0, 1, 3, 4, 5>(sms, 1, kPasses);
    measure_modes<64, 1, 0, 3, 5>(sms, 3, kPasses);
    measure_modes<64, 2, 0, 1, 3, 5>(sms, 2, kPasses);
    measure_modes<128, 1, 0, 3>(sms, 1, kPasses);
    return 0;
}
