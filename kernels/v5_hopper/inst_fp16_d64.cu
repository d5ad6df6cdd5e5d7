// fp16, head dim 64: one instantiation per translation unit, compiled in parallel.
#include "launch.cuh"

V5_HOPPER_INSTANTIATE(cutlass::half_t, 64)
