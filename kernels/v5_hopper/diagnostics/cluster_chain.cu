// A micro-benchmark for kernels/v5_hopper/NOTES.md (runs 244 and 244b); not part of the variant, whose
// sources variant.yaml lists. What a graph of PDL launches costs a call by grid size, CTA size and cluster
// size, and how many clusters of that size the device holds at once (cudaOccupancyMaxActiveClusters). It
// answers two questions before a kernel is built: does a grid of clusters of N all fit at once (a second
// wave doubles the call), and does the cluster launch itself cost the chain anything.
//
// Each launch: CTAs of 256 threads with SMEM bytes of dynamic shared memory (which sets how many share
// an SM); with clusters, a cluster barrier across the CTA's life as the split kernel has; the PDL wait,
// then the trigger; warp group 1 spins SPIN cycles (a call's work); 1 KB stored a CTA. 32 launches a
// graph, the period is the median of 30 replays and their 10th percentile (pdl_chain.cuh).
//
// With no arguments it runs the table of NOTES.md run 244b; with four, one configuration:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o cluster_chain cluster_chain.cu
//   ./cluster_chain                          # the table
//   ./cluster_chain CTAS SMEM CLUSTER SPIN   # e.g. ./cluster_chain 384 71680 3 8000
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "pdl_chain.cuh"

namespace {

template <bool kCluster>
__global__ void __launch_bounds__(256) step(int spin, float* out) {
    extern __shared__ float smem[];
    if constexpr (kCluster) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    smem[threadIdx.x] = float(threadIdx.x);
    if (threadIdx.x >= 128) pdl_chain::spin_for(spin);
    if constexpr (kCluster) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    __syncthreads();
    out[blockIdx.x * 256 + threadIdx.x] = smem[255 - threadIdx.x];
}

template <bool kCluster>
void measure(int ctas, int smem, int cluster, int spin) {
    auto kernel = step<kCluster>;
    float* out = nullptr;
    if (cudaMalloc(&out, sizeof(float) * ctas * 256) != cudaSuccess) {
        std::printf("cudaMalloc: %s\n", cudaGetErrorString(cudaGetLastError()));
        return;
    }
    int per_sm = 0;
    pdl_chain::configure(kernel, smem);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, size_t(smem));
    const int fit = kCluster ? pdl_chain::clusters_that_fit(kernel, 256, smem, cluster) : -1;
    const pdl_chain::Period period = pdl_chain::period(kernel, ctas, 256, smem, kCluster ? cluster : 1, spin, out);
    const int needed = (ctas + cluster - 1) / cluster;
    char fits[64] = "no cluster";
    if (kCluster) std::snprintf(fits, sizeof fits, "clusters of %d, %d of %d fit", cluster, fit, needed);
    std::printf("%4d CTAs x %6d B (%d an SM), %-28s spin %5d: period p10 %.3f p50 %.3f us%s\n", ctas, smem, per_sm,
                fits, spin, period.p10, period.p50, kCluster && fit >= 0 && fit < needed ? "  (more than one wave)" : "");
    cudaFree(out);
}

void run(int ctas, int smem, int cluster, int spin) {
    if (cluster > 1) {
        measure<true>(ctas, smem, cluster, spin);
    } else {
        measure<false>(ctas, smem, 1, spin);
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 5) {
        run(std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
        return 0;
    }
    if (argc != 1) {
        std::printf("usage: %s [CTAS SMEM CLUSTER SPIN]\n", argv[0]);
        return 2;
    }
    struct Config {
        int ctas, smem, cluster;
    };
    // Two CTAs an SM (the D=64 split kernel's 89,088 bytes), three (71,680) and four (56,320).
    const Config table[] = {
        {256, 89088, 1}, {256, 89088, 2}, {256, 89088, 4}, {128, 89088, 4}, {256, 56320, 4},
        {384, 56320, 1}, {384, 56320, 2}, {384, 56320, 3}, {384, 71680, 1}, {384, 71680, 2}, {384, 71680, 3},
    };
    for (int spin : {0, 8000}) {
        for (Config const& c : table) run(c.ctas, c.smem, c.cluster, spin);
    }
    return 0;
}
