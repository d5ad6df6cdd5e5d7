// K/V multicast over query tiles (split_multicast, issue 8): in a split launch whose clusters hold
// `peers` (1 or 2) query tiles of one head x `splits` key shares, the peers that take the same key
// share read the same K and V tiles, so each tile leaves L2 once: peer 0 loads K, the last peer V,
// each by a TMA multicast into every peer's ring at the same offset, completing on each peer's own
// full barrier (each peer's producer still posts the bytes it expects, in order, so a multicast
// that lands first only runs that barrier's count negative within its phase).
//
// A multicast stage may be refilled only once every peer has read it: a consumer releases each
// stage to its own ring (its producer's order of expected bytes) and, one thread per warp group,
// to the issuing peer's ring, whose empty barrier counts those arrivals too (run 37: one remote
// arrival per consumer thread). Cluster rank = peer x splits + share.
#pragma once

#include <cstdint>

#include "sm90_cluster.cuh"

namespace v5_hopper {

struct KvPeers {
    int rank;     // in the cluster
    int splits;   // key shares per query tile
    int peers;    // query tiles per cluster: 1 or 2

    __device__ int share() const { return rank % splits; }
    __device__ int k_issuer() const { return share(); }
    __device__ int v_issuer() const { return share() + (peers - 1) * splits; }
    __device__ uint16_t mask() const {
        uint16_t bits = 0;
        for (int p = 0; p < peers; ++p) bits |= uint16_t(1u << (share() + p * splits));
        return bits;
    }
    // Arrivals that release a stage of a ring of this CTA: each of its own consumer threads', and for
    // the ring it issues one per consumer warp group of the other peer. One of two constants, so
    // CUTLASS's assertion that the count is nonzero folds away: a call to __assertfail left in the
    // kernel makes ptxas serialise every wgmma of it (C7510; run 39, +1.5 us on (1,8,512,64)).
    template <uint32_t kConsumers, uint32_t kWarpGroups>
    __device__ uint32_t releasers(int issuer) const {
        return rank == issuer && peers == 2 ? kConsumers + kWarpGroups : kConsumers;
    }
};

}  // namespace v5_hopper
