// The mma.sync rungs (v3_mma, v4_pipelined): the warp-level hardware instructions, one small
// wrapper each (sm_80+ PTX; the same code assembles for sm_89 and sm_90a), and what differs
// between fp16 and bf16. Shared by both rungs, listed in each one's variant.yaml sources.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>  // memcpy
#include <type_traits>

namespace evo_sm80 {

constexpr int kWarpSize = 32;

// What differs between fp16 and bf16: packing two fp32 values into the 32-bit register the mma
// takes as a pair of 16-bit operands (round to nearest even).
template <typename T>
struct ElementTraits {
    static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value, "fp16 or bf16");
    static constexpr bool kIsBf16 = std::is_same<T, __nv_bfloat16>::value;
    using Pair = typename std::conditional<kIsBf16, __nv_bfloat162, __half2>::type;

    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        Pair pair;
        if constexpr (kIsBf16) {
            pair = __floats2bfloat162_rn(lo, hi);
        } else {
            pair = __floats2half2_rn(lo, hi);
        }
        uint32_t bits;
        memcpy(&bits, &pair, sizeof(bits));  // bit cast; a register move
        return bits;
    }
};

// Shared-window address of a generic pointer into shared memory: what ldmatrix and cp.async take.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses the register file and L1 (.cg); `valid == false`
// copies 0 source bytes and fills the 16 destination bytes with zeros (rows past S): no
// out-of-bounds read, and padded K/V rows hold finite zeros so 0 * V never makes NaN.
__device__ __forceinline__ void cp_async_16(uint32_t dst_smem, const void* src_global, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_smem), "l"(src_global), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices from shared memory in one instruction; lane l gives the row address of
// row l%8 of matrix l/8. Each lane receives, per matrix, row lane/4, columns 2*(lane%4)+{0,1}:
// exactly the A/B fragment layout of mma.m16n8k16, with no per-element shuffling.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The transposing form: lane gets column lane/4, rows 2*(lane%4)+{0,1}. Reads V stored [key][d]
// straight into the "col" B fragment of P*V, so V never needs a transposed copy.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// D = A(16x16, row) * B(16x8, col) + D, fp32 accumulators, on the tensor cores.
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (ElementTraits<T>::kIsBf16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// 2^x as one MUFU.EX2, flushing denormal results to 0 (probabilities under 2^-126 add nothing
// visible to a sum >= 1): saves the range fix-up instructions exp2f carries. ex2(-inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Reductions over the 4 lanes of a quad (lanes 4g..4g+3): in the mma C layout they hold the
// same two rows, so two xor-shuffles give every lane of the quad the row's value.
__device__ __forceinline__ float quad_allreduce_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}

__device__ __forceinline__ float quad_allreduce_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

}  // namespace evo_sm80
