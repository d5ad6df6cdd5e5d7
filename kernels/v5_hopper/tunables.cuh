// Compile-time knobs. Their defaults and ranges live in variant.yaml (`tunables:`), which the
// build passes as -D flags; the fallbacks here only keep a hand-run nvcc working.
#pragma once

#ifndef V5_HOPPER_BLOCK_N
#define V5_HOPPER_BLOCK_N 128            // keys per pipeline stage
#endif
#ifndef V5_HOPPER_BLOCK_N_D128_FULL
#define V5_HOPPER_BLOCK_N_D128_FULL 128  // keys per stage at D=128, non-causal
#endif
#ifndef V5_HOPPER_BLOCK_M_D64_FULL
#define V5_HOPPER_BLOCK_M_D64_FULL 128   // query rows per CTA at D=64, non-causal (192 spills: NOTES.md, run 4)
#endif
#ifndef V5_HOPPER_BLOCK_M_D64_CAUSAL
#define V5_HOPPER_BLOCK_M_D64_CAUSAL 128 // query rows per CTA at D=64, causal
#endif
#ifndef V5_HOPPER_STAGES
#define V5_HOPPER_STAGES 2               // K and V ring depth
#endif
#ifndef V5_HOPPER_STAGES_D64
#define V5_HOPPER_STAGES_D64 V5_HOPPER_STAGES   // ring depth at D=64 (tiles are half the bytes)
#endif
#ifndef V5_HOPPER_PINGPONG
#define V5_HOPPER_PINGPONG 1             // consumer warp groups take turns issuing their products
#endif
#ifndef V5_HOPPER_FAST_EXP2
#define V5_HOPPER_FAST_EXP2 1            // exp2 as one ex2.approx.ftz (no subnormal fix-up around it)
#endif
#ifndef V5_HOPPER_PERSISTENT
#define V5_HOPPER_PERSISTENT 0           // grid of one CTA per SM walking the tiles: 0 never, 1 always, 2 from MIN_WAVES
#endif
#ifndef V5_HOPPER_PERSISTENT_MIN_WAVES
#define V5_HOPPER_PERSISTENT_MIN_WAVES 3 // persistent once there are this many tiles per SM
#endif
