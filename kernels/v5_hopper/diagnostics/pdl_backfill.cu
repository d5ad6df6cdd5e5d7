// A micro-benchmark for kernels/v5_hopper/NOTES.md (runs 196-197); not part of the variant, whose
// sources variant.yaml lists. Does the next PDL grid take the slots a grid frees before its last
// exit, and which of the split kernel's traits stops it?
//
// 256 CTAs of 256 threads and 87 KB (two an SM), 32 launches a graph, PDL on, clusters of 2 or
// plain. Thread 0 stamps entry and spins a prologue of PRO ns. Each CTA then works for 2.0-4.0 us,
// longer with blockIdx (or with a scrambled cluster order), so its exits spread over 2 us. Traits,
// one flag each, added one at a time on the way from run 196's grid to the split kernel's:
//   trade   launched at 128 registers (the split kernel's two CTAs fill the register file),
//           the producer warp group released to 32 and the consumers raised to 224 (setmaxnreg);
//   roles   warp specialisation: one producer thread waits on the previous grid and signals an
//           mbarrier, the other producer warps leave at once, the consumer warp group lets the next
//           grid launch once signalled, works, then releases the producer thread (producer_tail);
//   loads   the producer thread's signal is 64 KB of bulk copies landing (the split CTA's Q, K, V);
//   dsmem   the cluster barrier at entry and a push of 18 KB into the other rank with st.async,
//           waited for before the exit (the cluster merge);
//   store   8 KB of global stores before the exit (O);
//   trexit  after the exit stamp, the old traced build's trace::finish: a PDL wait, a read of one
//           counter that every CTA of the grid advances with a reduction, 66 stores, the reduction;
//   scramble the exits in a scrambled cluster order (the split call's are only loosely in
//           blockIdx order) instead of blockIdx order;
//   3d      the split launch's grid, (16, 8, 2), instead of 256 along x.
// Reported per configuration (medians over calls 1-31, us from the previous call's last exit
// stamp): CTAs entering more than 0.2 us early, entries beside a previous-call CTA still running on
// the same SM (by its stamp), entry p50, last entry, first..last past the wait; SMs used.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o pdl_backfill pdl_backfill.cu && ./pdl_backfill
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

enum : unsigned { kTrade = 1, kRoles = 2, kLoads = 4, kDsmem = 8, kStore = 16, kTraceExit = 32, kScramble = 64 };
constexpr int kThreads = 256, kConsumers = 128, kSmem = 87 * 1024;
constexpr int kLoadBytes = 64 * 1024, kLoadPiece = 8 * 1024;           // smem [0, 64 KB): the loads
constexpr int kPushChunks = 9, kPushBytes = kConsumers * kPushChunks * 16;   // smem [64 KB, 82 KB): pushes in
constexpr size_t kSrcBytes = size_t(64) << 20;
static_assert(kLoadBytes + kPushBytes <= kSmem, "loads and pushes fit the dynamic shared memory");

struct Args {
    unsigned pro_ns, flags;
    int call;
    unsigned long long* stamps;    // (call, CTA, 4): entry, past the wait, exit, SM
    const unsigned char* src;      // kSrcBytes, read by the loads
    uint4* dst;                    // 16 KB a CTA: the stores' 8 KB, then trexit's row
    unsigned long long* counter;   // trexit's counter
};

__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bar_init(unsigned b, unsigned count) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory"); }
__device__ __forceinline__ void bar_arrive(unsigned b) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory"); }
__device__ __forceinline__ void bar_expect(unsigned b, unsigned bytes) { asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory"); }
__device__ __forceinline__ void bar_wait(unsigned b, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(b), "r"(parity) : "memory");
    }
}
__device__ __forceinline__ void spin_until(unsigned long long from, unsigned ns) { while (gt() - from < ns) { } }

template <bool kRegs128>
__global__ void __maxnreg__(128) k(const Args a) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ unsigned long long bars[3];   // loads landed (1 arrival), consumers done (128), pushes in (1 + bytes)
    __shared__ unsigned long long t_entry, t_pass;
    const unsigned f = a.flags;
    const unsigned ctas = gridDim.x * gridDim.y * gridDim.z;
    const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned full = smem_addr(&bars[0]), empty = smem_addr(&bars[1]), pushed = smem_addr(&bars[2]);
    unsigned cluster_ctas, rank;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(cluster_ctas));
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const bool dsmem = (f & kDsmem) && cluster_ctas == 2;
    if (threadIdx.x == 0) {
        t_entry = gt();
        bar_init(full, 1);
        bar_init(empty, kConsumers);
        bar_init(pushed, 1);
        bar_expect(pushed, kPushBytes);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        spin_until(t_entry, a.pro_ns);
    }
    __syncthreads();
    if (dsmem) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    // Exits spread over 2 us: in blockIdx order, or in a scrambled order of the clusters (both
    // ranks of one together; 37 is prime to the 128 clusters).
    const unsigned order = (f & kScramble) ? ((cta / 2) * 37 % (ctas / 2)) * 2 + (cta & 1) : cta;
    const unsigned work = 2000u + 2000u * order / ctas;
    unsigned long long t_work;
    if (!(f & kRoles)) {   // run 196's CTA: every thread works, thread 0 waits
        if constexpr (kRegs128) {
            if (f & kTrade) {
                if (threadIdx.x < 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 32;");
                else asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
            }
        }
        if (threadIdx.x == 0) {
            asm volatile("griddepcontrol.wait;" ::: "memory");
            t_pass = gt();
        }
        __syncthreads();
        t_work = gt();
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        spin_until(t_work, work);
    } else if (threadIdx.x < 128) {   // the producer warp group
        if constexpr (kRegs128) {
            if (f & kTrade) asm volatile("setmaxnreg.dec.sync.aligned.u32 32;");
        }
        if (threadIdx.x != 0) return;
        asm volatile("griddepcontrol.wait;" ::: "memory");
        t_pass = gt();
        if (f & kLoads) {
            bar_expect(full, kLoadBytes);
            const size_t base = (size_t(a.call) * ctas + cta) * kLoadBytes % kSrcBytes;
            for (int p = 0; p < kLoadBytes / kLoadPiece; ++p) {
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             ::"r"(smem_addr(smem + p * kLoadPiece)), "l"(a.src + base + p * kLoadPiece), "r"(kLoadPiece), "r"(full)
                             : "memory");
            }
        } else {
            bar_arrive(full);
        }
        bar_wait(empty, 0);   // as producer_tail: leave once the consumers are done
        return;
    } else {   // the consumer warp group
        if constexpr (kRegs128) {
            if (f & kTrade) asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
        }
        bar_wait(full, 0);
        t_work = gt();
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        spin_until(t_work, work);
        bar_arrive(empty);
        if (dsmem) {   // the merge: every consumer thread pushes 9 chunks into the other rank
            asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
            const unsigned other = rank ^ 1u, c = threadIdx.x - 128;
            unsigned slot, bar;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(slot) : "r"(smem_addr(smem + kLoadBytes + c * kPushChunks * 16)), "r"(other));
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(pushed), "r"(other));
            for (int j = 0; j < kPushChunks; ++j) {
                const float v = float(j + c);
                asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                             ::"r"(slot + j * 16), "f"(v), "f"(v), "f"(v), "f"(v), "r"(bar) : "memory");
            }
            bar_wait(pushed, 0);
        }
    }
    // Every thread of the consumer warp group here (all 256 without roles).
    if (f & kStore) {
        const unsigned t = threadIdx.x % 128;
        for (int j = 0; j < 4; ++j) a.dst[size_t(cta) * 1024 + j * 128 + t] = make_uint4(cta, j, t, a.call);
    }
    if (threadIdx.x == ((f & kRoles) ? 128u : 0u)) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        unsigned long long* s = a.stamps + ((size_t)a.call * ctas + cta) * 4;
        s[0] = t_entry; s[1] = t_pass; s[2] = gt(); s[3] = sm;
        if (f & kTraceExit) {   // the old trace::finish: PDL wait, the counter's read, a row of 66 stores, the reduction
            asm volatile("griddepcontrol.wait;" ::: "memory");
            const unsigned long long done = *reinterpret_cast<volatile unsigned long long*>(a.counter);
            unsigned long long* row = reinterpret_cast<unsigned long long*>(a.dst + size_t(cta) * 1024 + 512) + (done & 7ull);
            for (int i = 0; i < 66; ++i) row[i * 8] = done + i;
            atomicAdd(a.counter, 1ull);
        }
    }
}

struct Config { const char* name; bool regs128; unsigned flags; bool grid3d; bool cluster_only; };

int main() {
    const int G = 256, kCalls = 32;
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0)); printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
    for (auto f : {k<false>, k<true>}) {
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
        CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
        cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, f)); printf("kernel: %d registers a thread\n", fa.numRegs);
    }
    unsigned long long *st, *counter; unsigned char* src; uint4* dst;
    CK(cudaMalloc(&st, sizeof(unsigned long long) * kCalls * G * 4));
    CK(cudaMalloc(&counter, 8)); CK(cudaMemset(counter, 0, 8));
    CK(cudaMalloc(&src, kSrcBytes)); CK(cudaMemset(src, 1, kSrcBytes));
    CK(cudaMalloc(&dst, size_t(G) * 16384));
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    const Config configs[] = {
        {"base", false, 0, false, false},                     // run 196's first call
        {"r128", true, 0, false, false},                      // the register file full, not traded
        {"trade", true, kTrade, false, false},                // run 196's second call
        {"roles", false, kRoles, false, false},
        {"roles+loads+store", false, kRoles | kLoads | kStore, false, false},
        {"roles+dsmem", false, kRoles | kDsmem, false, true},
        {"trexit", false, kTraceExit, false, false},
        {"scramble", false, kScramble, false, false},
        {"3d", false, 0, true, false},
        {"split", true, kTrade | kRoles | kLoads | kDsmem | kStore | kScramble, true, false},   // all but trexit
        {"split+trexit", true, kTrade | kRoles | kLoads | kDsmem | kStore | kScramble | kTraceExit, true, false},
    };
    printf("config               grid   pro |  us/call | medians over calls 1-31, us from the previous call's last exit stamp\n");
    for (const Config& cf : configs) for (int cluster : {2, 1}) for (unsigned pro : {0u, 900u}) {
        if (cf.cluster_only && cluster == 1) continue;
        cudaGraph_t g; cudaGraphExec_t ex;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int c = 0; c < kCalls; ++c) {
            Args a{pro, cf.flags, c, st, src, dst, counter};
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = cf.grid3d ? dim3(16, 8, 2) : dim3(G);
            cfg.blockDim = dim3(kThreads); cfg.dynamicSmemBytes = kSmem; cfg.stream = s;
            cudaLaunchAttribute at[2]; int n = 0;
            at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[n].val.programmaticStreamSerializationAllowed = 1; ++n;
            if (cluster > 1) { at[n].id = cudaLaunchAttributeClusterDimension; at[n].val.clusterDim.x = cluster; at[n].val.clusterDim.y = 1; at[n].val.clusterDim.z = 1; ++n; }
            cfg.attrs = at; cfg.numAttrs = n;
            CK(cudaLaunchKernelEx(&cfg, cf.regs128 ? k<true> : k<false>, a));
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
        auto row = [&](int c, int i) { return &h[((size_t)c * G + i) * 4]; };
        std::vector<double> early, beside, entry50, lastentry, firstpass, lastpass, sms;
        for (int c = 1; c < kCalls; ++c) {
            unsigned long long prev_last = 0;
            for (int i = 0; i < G; ++i) prev_last = std::max(prev_last, row(c - 1, i)[2]);
            std::vector<double> en, pw; std::vector<int> smv; int side = 0;
            for (int i = 0; i < G; ++i) {
                const unsigned long long* r = row(c, i);
                const int sm = int(r[3] & 0xFFFFFFFFull);
                en.push_back((double)(long long)(r[0] - prev_last)); pw.push_back((double)(long long)(r[1] - prev_last)); smv.push_back(sm);
                for (int j = 0; j < G; ++j) {   // a previous-call CTA on this SM whose exit stamp is later
                    const unsigned long long* q = row(c - 1, j);
                    if (int(q[3] & 0xFFFFFFFFull) == sm && q[2] > r[0]) { ++side; break; }
                }
            }
            std::sort(en.begin(), en.end()); std::sort(pw.begin(), pw.end()); std::sort(smv.begin(), smv.end());
            early.push_back(std::count_if(en.begin(), en.end(), [](double x) { return x < -200; }));
            beside.push_back(side);
            entry50.push_back(en[G / 2]); lastentry.push_back(en.back()); firstpass.push_back(pw.front()); lastpass.push_back(pw.back());
            sms.push_back(std::unique(smv.begin(), smv.end()) - smv.begin());
        }
        auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
        printf("%-20s %-5s %4u | %8.3f | early %3.0f, beside %3.0f, entry p50 %+5.2f, last entry %+5.2f, past wait %+5.2f..%+5.2f; %3.0f SMs\n",
               cf.name, cluster > 1 ? "cl2" : "plain", pro, per[per.size() / 2], med(early), med(beside), med(entry50) / 1000,
               med(lastentry) / 1000, med(firstpass) / 1000, med(lastpass) / 1000, med(sms));
        CK(cudaGraphExecDestroy(ex)); CK(cudaGraphDestroy(g));
    }
    return 0;
}
