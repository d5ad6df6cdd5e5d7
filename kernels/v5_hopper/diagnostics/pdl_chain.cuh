// The chain of PDL launches that cluster_chain.cu and merge_cost.cu time: kCalls launches of one kernel captured
// in a graph, each with programmatic stream serialisation and, for cluster > 1, clusters of that many CTAs along x.
#pragma once

#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

namespace pdl_chain {

// A call's work in the benchmarks' kernels: `cycles` of the SM's clock.
__device__ __forceinline__ void spin_for(int cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

constexpr int kCalls = 32;
constexpr int kReplays = 30;

struct Period {
    float p10 = -1.f;   // µs a call, over kReplays replays of the graph; -1 where the chain did not run
    float p50 = -1.f;
};

// The launch attributes of one call: PDL, and the cluster where cluster > 1.
struct Launch {
    cudaLaunchAttribute attrs[2];
    cudaLaunchConfig_t config = {};

    Launch(int ctas, int threads, int smem, int cluster, cudaStream_t stream) {
        attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[0].val.programmaticStreamSerializationAllowed = 1;
        attrs[1].id = cudaLaunchAttributeClusterDimension;
        attrs[1].val.clusterDim.x = unsigned(cluster);
        attrs[1].val.clusterDim.y = 1;
        attrs[1].val.clusterDim.z = 1;
        config.gridDim = dim3(unsigned(ctas));
        config.blockDim = dim3(unsigned(threads));
        config.dynamicSmemBytes = size_t(smem);
        config.stream = stream;
        config.attrs = attrs;
        config.numAttrs = cluster > 1 ? 2 : 1;
    }
};

// The kernel's dynamic shared memory and the whole carveout as shared memory, so `smem` sets CTAs an SM.
template <class Kernel>
bool configure(Kernel kernel, int smem) {
    const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (status != cudaSuccess) std::printf("shared memory %d: %s\n", smem, cudaGetErrorString(status));
    return status == cudaSuccess;
}

template <class Kernel, class... Args>
Period period(Kernel kernel, int ctas, int threads, int smem, int cluster, Args... args) {
    Period result;
    if (!configure(kernel, smem)) return result;
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    const Launch launch(ctas, threads, smem, cluster, stream);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    for (int c = 0; c < kCalls; ++c) cudaLaunchKernelEx(&launch.config, kernel, args...);
    cudaStreamEndCapture(stream, &graph);
    if (cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
        for (int i = 0; i < 3; ++i) cudaGraphLaunch(exec, stream);
        if (cudaStreamSynchronize(stream) == cudaSuccess) {
            cudaEvent_t begin, end;
            cudaEventCreate(&begin);
            cudaEventCreate(&end);
            std::vector<float> periods;
            for (int r = 0; r < kReplays; ++r) {
                cudaEventRecord(begin, stream);
                cudaGraphLaunch(exec, stream);
                cudaEventRecord(end, stream);
                cudaEventSynchronize(end);
                float ms = 0.f;
                cudaEventElapsedTime(&ms, begin, end);
                periods.push_back(ms * 1000.f / kCalls);
            }
            std::sort(periods.begin(), periods.end());
            result = {periods[kReplays / 10], periods[kReplays / 2]};
            cudaEventDestroy(begin);
            cudaEventDestroy(end);
        }
        cudaGraphExecDestroy(exec);
    }
    if (result.p50 < 0.f) std::printf("the chain did not run: %s\n", cudaGetErrorString(cudaGetLastError()));
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    return result;
}

// Clusters of `cluster` CTAs of this kernel that fit on the device at once (-1 if it cannot say).
template <class Kernel>
int clusters_that_fit(Kernel kernel, int threads, int smem, int cluster) {
    if (!configure(kernel, smem)) return -1;
    Launch launch(cluster, threads, smem, cluster, nullptr);
    launch.config.attrs = &launch.attrs[1];
    launch.config.numAttrs = 1;
    int fit = -1;
    if (cudaOccupancyMaxActiveClusters(&fit, kernel, &launch.config) != cudaSuccess) fit = -1;
    cudaGetLastError();
    return fit;
}

}  // namespace pdl_chain
