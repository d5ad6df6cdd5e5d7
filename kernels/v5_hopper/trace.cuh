// A timeline of each CTA's call, for the launch-bound shapes (issue 8): a diagnostic build only,
// `-DV5_HOPPER_TRACE=1` (scripts/trace_v5.py builds it and reads the timelines back; ab_sweep.py
// --flags takes it too). Everything here compiles to nothing in the pipeline's builds.
// `-DV5_HOPPER_TRACE=2` keeps the entry and exit stamps alone (the launch-time ones are taken anyway;
// only kEntry and kExit reach the buffer), so its call costs what the handover costs untraced if
// the per-step stamps and the row's copy are what make a traced call about 1 us longer (NOTES.md,
// run 199); trace_v5.py --lib reads it like the full trace, the steps left unrecorded.
// `-DV5_HOPPER_TRACE=3` keeps those two stamps and adds the SM's cycle count alone (no %globaltimer,
// and at entry only its own points' cycles cleared) at the points from entry to the first loads and a few after
// them (`cycles_only`): spans inside a CTA in cycles. Its call is not the untraced one: on the H100
// it made (2,8,512,64) 1.7 us longer, its CTAs released a microsecond later than the full trace's,
// for a reason not found (NOTES.md, run 205), so read its cycles, not its handover.
//
// Each probe stamps %globaltimer (ns, one clock for the whole card, so CTAs and consecutive calls
// line up) and clock64 (the SM's cycles, finer, for spans inside one CTA) into the CTA's shared
// memory: a probe costs two shared stores and may run before the PDL wait. At its end one thread
// copies the stamps to the call's row, which the host picked at launch (Params::trace_call: a
// launch counter modulo kCalls, baked into a captured graph's nodes), so the CTA's exit waits on
// no global read and no atomic. It used to find the row from a CTA counter every CTA advanced,
// read past the PDL wait: that read sat between each CTA's exit stamp and its real exit, on the
// handover being measured (a returned atomic there had cost about a microsecond a call).
#pragma once

#include <cstdint>

#ifndef V5_HOPPER_TRACE
#define V5_HOPPER_TRACE 0
#endif

namespace v5_hopper::trace {

enum Point : int {
    kEntry,          // thread 0, first instruction
    kPastWait,       // the K/V producer thread, past the PDL wait (just before its first load)
    kKvIssued,       // the K/V producer thread, its first K and V loads issued
    kQReady,         // consumer thread 0: Q has landed
    kFirstKReady,    // the first K stage has landed
    kFirstS,         // the first S = Q K^T has completed
    kFirstSoftmax,   // its softmax done
    kLastPv,         // the last P V has completed
    kMerged,         // past the cluster merge (owner: folded, its first half stored; pusher: pushed)
    kStoreIssued,    // O's store issued (a split owner: its second half)
    kExit,           // consumer thread 0 leaves (after the store drains)
    kProducerStart,  // the K/V producer thread enters produce_kv (past setmaxnreg and its pipelines);
                     // in a CTA without a producer, thread 0 has its rest loads' coordinates
    kKvScheduled,    // its first tile's coordinates and key share computed
    kKAcquired,      // its first K stage acquired (an empty ring: at once)
    kQIssued,        // the Q thread, its first Q load issued
    kConsumerStart,  // consumer thread 0 enters consume (past setmaxnreg and its pipelines)
    kInitDone,       // thread 0, its barriers initialised (before the CTA's first __syncthreads)
    kSynced,         // thread 0, past that __syncthreads (and the cluster arrive)
    // Consumer thread 0 in the key loop's first three passes (the tiles after the first), and at the
    // merge: what one step's fixed part is made of (NOTES.md, run 161).
    kStep1Top,       // the pass begins: before its K and V waits
    kStep1S,         // its S = Q K^T has landed
    kStep1Softmax,   // its softmax done
    kStep1Pv,        // the previous tile's P V has completed
    kStep2Top,
    kStep2S,
    kStep2Softmax,
    kStep2Pv,
    kStep3Top,
    kStep3S,
    kStep3Softmax,
    kStep3Pv,
    kLastPvIssued,   // the last P V issued (before its wait)
    kMergeReady,     // past the merge's cluster barrier
    kMergeLanded,    // the owner: the other ranks' first halves have landed (a pusher: its pushes issued)
    kPoints
};
constexpr int kSlots = 40;     // per probe row: kPoints timestamps, then the CTA's SM and cluster rank
constexpr int kCalls = 64;     // rows are reused modulo this many calls
constexpr int kCtas = 1024;    // CTAs past this are not recorded
static_assert(kPoints + 1 <= kSlots, "points and the SM slot fit a row");

struct Buffer {
    unsigned long long calls;       // the host's copy fills it in: traced launches since the reset
    unsigned long long unused;
    unsigned long long grid[kCalls];                        // CTAs in each call's row's launch
    unsigned long long global_ns[kCalls][kCtas][kSlots];
    unsigned long long cycles[kCalls][kCtas][kSlots];
};

// A CTA's probes in its own shared memory: the threads stamp them whenever they pass, before or
// after the PDL wait, and one thread copies the row out at the end.
struct Row {
    unsigned long long ns[kSlots];
    unsigned long long cycles[kSlots];
};

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The points level 3 stamps (cycles only; kEntry and kExit keep both clocks).
__host__ __device__ constexpr bool cycles_only(Point p) {
    return p == kInitDone || p == kSynced || p == kProducerStart || p == kKvScheduled || p == kKAcquired ||
           p == kPastWait || p == kKvIssued || p == kQIssued || p == kConsumerStart || p == kQReady ||
           p == kFirstKReady || p == kFirstS || p == kLastPv || p == kMergeReady || p == kMergeLanded ||
           p == kMerged || p == kStoreIssued;
}
// Whether a build of this level records the point at all.
__host__ __device__ constexpr bool recorded(Point p) {
    return V5_HOPPER_TRACE == 1 || p == kEntry || p == kExit || (V5_HOPPER_TRACE == 3 && cycles_only(p));
}

// One recording thread's handle on its CTA's row (null: this build or thread records nothing).
struct Probe {
    Row* row = nullptr;

    Probe() = default;
    __device__ explicit Probe(Row* r) : row(V5_HOPPER_TRACE ? r : nullptr) {}
    __device__ void mark_at(Point p, unsigned long long at_ns, unsigned long long at_cycles) const {
        if (!V5_HOPPER_TRACE || row == nullptr) return;
        row->ns[p] = at_ns;
        row->cycles[p] = at_cycles;
    }
    __device__ void mark(Point p) const {
        if (!V5_HOPPER_TRACE || row == nullptr) return;   // before the reads: they are volatile
        if (V5_HOPPER_TRACE == 2 && p != kExit) return;
        if constexpr (V5_HOPPER_TRACE == 3) {
            if (!recorded(p)) return;
            if (p != kExit) {
                row->cycles[p] = clock64();
                return;
            }
        }
        mark_at(p, global_ns(), clock64());
    }
};

// Thread 0 at entry, before the CTA's first barrier: a row of zeros (unrecorded points read 0).
// Level 3 zeroes only the cycles of its own points (a point a rank never reaches, such as a pusher's
// store, must read 0, not what the shared memory held); run 205 measured it without this.
__device__ __forceinline__ void clear(Row& row) {
    if constexpr (V5_HOPPER_TRACE == 3) {
        for (int i = 0; i < kPoints; ++i) {
            if (recorded(Point(i))) row.cycles[i] = 0;
        }
    } else {
        for (int i = 0; i < kSlots; ++i) row.ns[i] = row.cycles[i] = 0;
    }
}

// One thread per CTA at its end: the row goes to the call's place (`call`, from the launch). The
// other threads' stamps were made microseconds before (the loads they issued have landed); the
// read is not ordered with them by a barrier, a liberty only this diagnostic build takes.
__device__ __forceinline__ void finish(Buffer* b, int call, Row const& row, int rank) {
    if (!V5_HOPPER_TRACE || b == nullptr) return;
    const unsigned long long ctas = static_cast<unsigned long long>(gridDim.x) * gridDim.y * gridDim.z;   // a split grid is 3-D
    const unsigned long long cta = blockIdx.x + gridDim.x * (blockIdx.y + static_cast<unsigned long long>(gridDim.y) * blockIdx.z);
    if (cta == 0) b->grid[call] = ctas;
    if (cta < kCtas) {
        for (int i = 0; i < kPoints; ++i) {
            if (V5_HOPPER_TRACE == 2 && i != kEntry && i != kExit) continue;
            if constexpr (V5_HOPPER_TRACE == 3) {
                if (!recorded(Point(i))) continue;
                b->global_ns[call][cta][i] = i == kEntry || i == kExit ? row.ns[i] : 0;
            } else {
                b->global_ns[call][cta][i] = row.ns[i];
            }
            b->cycles[call][cta][i] = row.cycles[i];
        }
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        b->global_ns[call][cta][kPoints] = (unsigned long long)sm | ((unsigned long long)rank << 32);
    }
}

}  // namespace v5_hopper::trace

// The host side (kernel.cu): one buffer per process, allocated at the first traced launch, and the
// row of each traced launch (a counter since the last reset, modulo kCalls).
#if V5_HOPPER_TRACE
extern "C" v5_hopper::trace::Buffer* v5_hopper_trace_buffer();
extern "C" int v5_hopper_trace_next_call();
#endif
