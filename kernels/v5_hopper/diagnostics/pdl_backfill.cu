// Run 196's micro-benchmark (kernels/v5_hopper/NOTES.md); not part of the variant, whose sources
// variant.yaml lists. Does the next PDL grid take the slots a grid frees before its last exit? 256 CTAs
// of 256 threads and 87 KB (two an SM). Each CTA: thread 0 stamps entry, spins PRO ns (the prologue),
// waits on the previous grid; the CTA stamps, lets the next grid launch, spins 2000 + 2000 * blockIdx /
// grid ns (exits staggered in blockIdx order, as the split call's are) and stamps its exit. 32
// launches a graph, PDL on; clusters of 2 and plain CTAs; `rmin` (about 14 registers) ran on an H200,
// `r128` (the split kernel's full register file, traded with setmaxnreg) is the open question.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o pdl_backfill pdl_backfill.cu && ./pdl_backfill
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
struct Args { unsigned pro_ns; unsigned long long* stamps; int call; };
template <bool kFullRegs>
__global__ void __maxnreg__(128) k(const Args a) {
    __shared__ unsigned long long t_entry;
    // kFullRegs: the register file of two CTAs an SM, traded as the split kernel trades it (setmaxnreg).
    if (kFullRegs) {
        if (threadIdx.x < 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        else asm volatile("setmaxnreg.inc.sync.aligned.u32 216;");
    }
    const int cta = blockIdx.x;
    if (threadIdx.x == 0) {
        const unsigned long long t0 = gt();
        t_entry = t0;
        while (gt() - t0 < a.pro_ns) { }
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    __syncthreads();
    const unsigned long long t1 = gt();
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const unsigned work = 2000u + 2000u * cta / gridDim.x;
    while (gt() - t1 < work) { }
    if (threadIdx.x == 0) {
        unsigned sm; asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        unsigned long long* s = a.stamps + ((size_t)a.call * gridDim.x + cta) * 4;
        s[0] = t_entry; s[1] = t1; s[2] = gt(); s[3] = sm;
    }
}
int main() {
    const int G = 256, kCalls = 32, kSmem = 87 * 1024;
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0)); printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
    for (auto f : {k<false>, k<true>}) {
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
        CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    }
    unsigned long long* st; CK(cudaMalloc(&st, sizeof(unsigned long long) * kCalls * G * 4));
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    printf("regs grid       pro |  us/call | medians over calls 1-31, us from the previous call's last exit: early entries\n"
           "                                (> 0.2 us before), entry p50, last entry, first..last past the wait; SMs used\n");
    for (int regs : {0, 1}) for (int cluster : {2, 1}) for (unsigned pro : {0u, 900u}) {
        cudaGraph_t g; cudaGraphExec_t ex;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int c = 0; c < kCalls; ++c) {
            Args a{pro, st, c};
            cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(G); cfg.blockDim = dim3(256); cfg.dynamicSmemBytes = kSmem; cfg.stream = s;
            cudaLaunchAttribute at[2]; int n = 0;
            at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[n].val.programmaticStreamSerializationAllowed = 1; ++n;
            if (cluster > 1) { at[n].id = cudaLaunchAttributeClusterDimension; at[n].val.clusterDim.x = cluster; at[n].val.clusterDim.y = 1; at[n].val.clusterDim.z = 1; ++n; }
            cfg.attrs = at; cfg.numAttrs = n;
            CK(cudaLaunchKernelEx(&cfg, regs ? k<true> : k<false>, a));
        }
        CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ex, g, 0));
        for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ex, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaGetLastError());
        std::vector<float> per;
        for (int r = 0; r < 10; ++r) { CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ex, s)); CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); per.push_back(ms * 1000 / kCalls); }
        std::sort(per.begin(), per.end());
        std::vector<unsigned long long> h(kCalls * G * 4);
        CK(cudaMemcpy(h.data(), st, h.size() * 8, cudaMemcpyDeviceToHost));
        std::vector<double> early, entry50, lastentry, firstpass, lastpass, sms;
        for (int c = 1; c < kCalls; ++c) {
            unsigned long long prev_last = 0;
            for (int i = 0; i < G; ++i) prev_last = std::max(prev_last, h[((size_t)(c - 1) * G + i) * 4 + 2]);
            std::vector<double> en, pw; std::vector<int> smv;
            for (int i = 0; i < G; ++i) { const unsigned long long* r = &h[((size_t)c * G + i) * 4]; en.push_back((double)(long long)(r[0] - prev_last)); pw.push_back((double)(long long)(r[1] - prev_last)); smv.push_back((int)r[3]); }
            std::sort(en.begin(), en.end()); std::sort(pw.begin(), pw.end()); std::sort(smv.begin(), smv.end());
            early.push_back(std::count_if(en.begin(), en.end(), [](double x) { return x < -200; }));
            entry50.push_back(en[G / 2]); lastentry.push_back(en.back()); firstpass.push_back(pw.front()); lastpass.push_back(pw.back());
            sms.push_back(std::unique(smv.begin(), smv.end()) - smv.begin());
        }
        auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
        printf("%-4s %-8s %5u | %8.3f | early %4.0f, entry p50 %+6.2f, last entry %+6.2f, past wait %+5.2f..%+5.2f; %3.0f SMs\n",
               regs ? "r128" : "rmin", cluster > 1 ? "cl2" : "plain", pro, per[per.size() / 2], med(early), med(entry50) / 1000,
               med(lastentry) / 1000, med(firstpass) / 1000, med(lastpass) / 1000, med(sms));
        CK(cudaGraphExecDestroy(ex)); CK(cudaGraphDestroy(g));
    }
    return 0;
}
