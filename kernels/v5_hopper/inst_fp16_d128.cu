// fp16, head dim 128: one instantiation per translation unit, compiled in parallel.
#include "launch.cuh"

V5_HOPPER_INSTANTIATE(cutlass::half_t, 128)
