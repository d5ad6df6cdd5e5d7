// The mma.sync rungs (v3_mma, v4_pipelined): the two matrix products of one key tile, per warp, on the tensor cores.
//   S = Q K^T : A = the warp's 16 query rows (registers, loaded once), B = K tile (ldmatrix)
//   O += P V  : A = P, straight from the S accumulators (registers), B = V tile (ldmatrix.trans)
#pragma once
#include <cstdint>

#include "sm80_mma_primitives.cuh"
#include "sm80_tile_layout.cuh"

namespace evo_sm80 {

// The warp's Q rows as mma A fragments for every k-step of the head dim, loaded once from the
// swizzled Q tile: Q is reused for every key tile without touching shared memory again.
template <class Tr, typename T>
__device__ __forceinline__ void load_q_fragments(uint32_t (&q_frag)[Tr::kQkSteps][4], const T* smem_q, int row_warp, int lane) {
    const uint32_t base = smem_address(smem_q);
#pragma unroll
    for (int ks = 0; ks < Tr::kQkSteps; ++ks) {
        const int offset = ldmatrix_lane_offset<Tr, true>(row_warp * Tr::kRowsPerWarp, 2 * ks, lane);
        ldmatrix_x4(q_frag[ks], base + offset * static_cast<uint32_t>(sizeof(T)));
    }
}

// S = Q K^T for the warp's 16 rows x kBlockN keys: kQkSteps x kScoreTiles mma, fp32 accumulators
// (raw scores, unscaled). One ldmatrix.x4 feeds two mma (two n8 key tiles).
template <class Tr, typename T>
__device__ __forceinline__ void compute_scores(float (&s)[Tr::kScoreTiles][4], const uint32_t (&q_frag)[Tr::kQkSteps][4],
                                               const T* smem_k, int lane) {
#pragma unroll
    for (int j = 0; j < Tr::kScoreTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
    }
    const uint32_t base = smem_address(smem_k);
#pragma unroll
    for (int ks = 0; ks < Tr::kQkSteps; ++ks) {
#pragma unroll
        for (int pair = 0; pair < Tr::kScoreTiles / 2; ++pair) {
            uint32_t k_frag[4];
            const int offset = ldmatrix_lane_offset<Tr, false>(16 * pair, 2 * ks, lane);
            ldmatrix_x4(k_frag, base + offset * static_cast<uint32_t>(sizeof(T)));
            mma_16x8x16<T>(s[2 * pair], q_frag[ks], k_frag[0], k_frag[1]);
            mma_16x8x16<T>(s[2 * pair + 1], q_frag[ks], k_frag[2], k_frag[3]);
        }
    }
}

// O += P V. The C layout of two adjacent n8 score tiles (rows g, g+8; columns 2t, 2t+1 of each)
// is exactly the A layout of one m16k16 step, so P goes from the fp32 S registers to packed
// 16-bit A fragments in registers: no round trip through shared memory.
template <class Tr, typename T>
__device__ __forceinline__ void accumulate_pv(float (&o)[Tr::kOutTiles][4], const uint32_t (&p_frag)[Tr::kScoreTiles][2],
                                              const T* smem_v, int lane) {
    const uint32_t base = smem_address(smem_v);
#pragma unroll
    for (int kk = 0; kk < Tr::kPvSteps; ++kk) {
        const uint32_t a[4] = {p_frag[2 * kk][0], p_frag[2 * kk][1], p_frag[2 * kk + 1][0], p_frag[2 * kk + 1][1]};
#pragma unroll
        for (int pair = 0; pair < Tr::kOutTiles / 2; ++pair) {
            uint32_t v_frag[4];
            const int offset = ldmatrix_lane_offset<Tr, true>(16 * kk, 2 * pair, lane);
            ldmatrix_x4_trans(v_frag, base + offset * static_cast<uint32_t>(sizeof(T)));
            mma_16x8x16<T>(o[2 * pair], a, v_frag[0], v_frag[1]);
            mma_16x8x16<T>(o[2 * pair + 1], a, v_frag[2], v_frag[3]);
        }
    }
}

}  // namespace evo_sm80
