// v2_tiled: the element types, and how a 16-byte chunk (8 elements) is widened to fp32 and
// how 4 fp32 results are narrowed back.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>  // memcpy

namespace v2_tiled {

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

// 8 consecutive elements as fp32, in two float4 halves (elements 0-3 and 4-7).
struct ChunkF32 {
    float4 lo;
    float4 hi;
};

// Widens the raw bits of 8 elements (one 16-byte global load) to fp32, times `scale`.
template <typename T>
__device__ __forceinline__ ChunkF32 widen_chunk(uint4 bits, float scale) {
    using Pair = typename DtypeTraits<T>::pair_t;
    Pair pairs[4];
    memcpy(pairs, &bits, sizeof(bits));  // bit cast; compiles to register moves
    float2 f[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) f[p] = DtypeTraits<T>::to_float2(pairs[p]);
    return ChunkF32{make_float4(f[0].x * scale, f[0].y * scale, f[1].x * scale, f[1].y * scale),
                    make_float4(f[2].x * scale, f[2].y * scale, f[3].x * scale, f[3].y * scale)};
}

// Rounds 4 fp32 values to the element type (round to nearest even): 8 bytes.
template <typename T>
__device__ __forceinline__ uint2 narrow4(float4 x) {
    using Pair = typename DtypeTraits<T>::pair_t;
    Pair pairs[2] = {DtypeTraits<T>::from_float2(make_float2(x.x, x.y)),
                     DtypeTraits<T>::from_float2(make_float2(x.z, x.w))};
    uint2 bits;
    memcpy(&bits, pairs, sizeof(bits));
    return bits;
}

}  // namespace v2_tiled
