// v1_scalar: the element types, and how one lane moves its slice of a head-dim row.
//
// A lane owns HEAD_DIM/32 consecutive elements of a row (2 at D=64, 4 at D=128), held as
// pairs (__half2 / __nv_bfloat162) and moved in one vector access.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>  // memcpy

namespace v1_scalar {

template <typename T>
struct DtypeTraits;

template <>
struct DtypeTraits<__half> {
    using pair_t = __half2;
    static __device__ __forceinline__ float2 to_float2(pair_t x) { return __half22float2(x); }
    static __device__ __forceinline__ pair_t from_float2(float2 f) { return __float22half2_rn(f); }
};

template <>
struct DtypeTraits<__nv_bfloat16> {
    using pair_t = __nv_bfloat162;
    static __device__ __forceinline__ float2 to_float2(pair_t x) { return __bfloat1622float2(x); }
    static __device__ __forceinline__ pair_t from_float2(float2 f) { return __float22bfloat162_rn(f); }
};

// The raw bits of PAIRS element pairs, as one vector type (4, 8 or 16 bytes), so a lane's slice
// moves in one LDG/STG instruction: a warp covers a whole row in one coalesced 128/256-byte access.
template <int PAIRS> struct SliceBits;
template <> struct SliceBits<1> { using type = unsigned int; };
template <> struct SliceBits<2> { using type = uint2; };
template <> struct SliceBits<4> { using type = uint4; };

// Loads the lane's slice (2*PAIRS elements) and widens it to fp32.
template <typename T, int PAIRS>
__device__ __forceinline__ void load_slice_f32(const T* slice_ptr, float (&out)[2 * PAIRS]) {
    using Bits = typename SliceBits<PAIRS>::type;
    using Pair = typename DtypeTraits<T>::pair_t;
    const Bits bits = *reinterpret_cast<const Bits*>(slice_ptr);
    Pair pairs[PAIRS];
    memcpy(pairs, &bits, sizeof(bits));  // bit cast; compiles to register moves
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
        const float2 f = DtypeTraits<T>::to_float2(pairs[p]);
        out[2 * p] = f.x;
        out[2 * p + 1] = f.y;
    }
}

// Rounds fp32 to the element type (round to nearest even) and stores the lane's slice.
template <typename T, int PAIRS>
__device__ __forceinline__ void store_slice(T* slice_ptr, const float (&in)[2 * PAIRS]) {
    using Bits = typename SliceBits<PAIRS>::type;
    using Pair = typename DtypeTraits<T>::pair_t;
    Pair pairs[PAIRS];
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
        pairs[p] = DtypeTraits<T>::from_float2(make_float2(in[2 * p], in[2 * p + 1]));
    }
    Bits bits;
    memcpy(&bits, pairs, sizeof(bits));
    *reinterpret_cast<Bits*>(slice_ptr) = bits;
}

}  // namespace v1_scalar
