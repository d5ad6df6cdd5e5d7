// Compile-time knobs. Their values live in variant.yaml (`tunables:`), the one home of each
// default and range: the build passes every one as -D<define>=<value>, and a missing macro
// stops the compile here rather than falling back on a second copy of the default.
#pragma once

// cute/config.hpp, which every CuTe header includes, defines CUTE_HOST_DEVICE.
#ifdef CUTE_HOST_DEVICE
#error "tunables.cuh must be included before any CuTe header: it decides which wgmma shapes CuTe declares"
#endif

// keys per pipeline stage
#ifndef V5_HOPPER_BLOCK_N
#error "V5_HOPPER_BLOCK_N undefined: the build passes it from variant.yaml (tunables.block_n)"
#endif
// keys per stage at D=128, non-causal
#ifndef V5_HOPPER_BLOCK_N_D128_FULL
#error "V5_HOPPER_BLOCK_N_D128_FULL undefined: the build passes it from variant.yaml (tunables.block_n_d128_full)"
#endif
// query rows per CTA at D=64, non-causal (192 spills: NOTES.md, run 4)
#ifndef V5_HOPPER_BLOCK_M_D64_FULL
#error "V5_HOPPER_BLOCK_M_D64_FULL undefined: the build passes it from variant.yaml (tunables.block_m_d64_full)"
#endif
// query rows per CTA at D=64, causal
#ifndef V5_HOPPER_BLOCK_M_D64_CAUSAL
#error "V5_HOPPER_BLOCK_M_D64_CAUSAL undefined: the build passes it from variant.yaml (tunables.block_m_d64_causal)"
#endif
// K and V ring depth
#ifndef V5_HOPPER_STAGES
#error "V5_HOPPER_STAGES undefined: the build passes it from variant.yaml (tunables.stages)"
#endif
// ring depth at D=64 (tiles are half the bytes)
#ifndef V5_HOPPER_STAGES_D64
#error "V5_HOPPER_STAGES_D64 undefined: the build passes it from variant.yaml (tunables.stages_d64)"
#endif
// consumer warp groups take turns issuing their products (causal)
#ifndef V5_HOPPER_PINGPONG
#error "V5_HOPPER_PINGPONG undefined: the build passes it from variant.yaml (tunables.pingpong)"
#endif
// exp2 as one ex2.approx.ftz (no subnormal fix-up around it)
#ifndef V5_HOPPER_FAST_EXP2
#error "V5_HOPPER_FAST_EXP2 undefined: the build passes it from variant.yaml (tunables.fast_exp2)"
#endif
// grid of one CTA per SM walking the tiles: 0 never, 1 always, 2 from MIN_WAVES
#ifndef V5_HOPPER_PERSISTENT
#error "V5_HOPPER_PERSISTENT undefined: the build passes it from variant.yaml (tunables.persistent)"
#endif
// persistent once there are this many tiles per SM
#ifndef V5_HOPPER_PERSISTENT_MIN_WAVES
#error "V5_HOPPER_PERSISTENT_MIN_WAVES undefined: the build passes it from variant.yaml (tunables.persistent_min_waves)"
#endif
// normalised O through shared memory and a TMA store
#ifndef V5_HOPPER_TMA_EPILOGUE
#error "V5_HOPPER_TMA_EPILOGUE undefined: the build passes it from variant.yaml (tunables.tma_epilogue)"
#endif
// consumer warp groups take turns issuing their products (non-causal)
#ifndef V5_HOPPER_PINGPONG_FULL
#error "V5_HOPPER_PINGPONG_FULL undefined: the build passes it from variant.yaml (tunables.pingpong_full)"
#endif
// Q buffers at D=128 (2: a thread of its own loads the next tile's Q ahead)
#ifndef V5_HOPPER_Q_BUFFERS
#error "V5_HOPPER_Q_BUFFERS undefined: the build passes it from variant.yaml (tunables.q_buffers)"
#endif
// Q buffers at D=64
#ifndef V5_HOPPER_Q_BUFFERS_D64
#error "V5_HOPPER_Q_BUFFERS_D64 undefined: the build passes it from variant.yaml (tunables.q_buffers_d64)"
#endif
// keep a row's maximum until a tile exceeds it by 2^8, so most tiles skip O's rescale: 0 never,
// 1 in every kernel, 2 in the free-issue kernel only, 3 as 2 and optimistic there, 4 both everywhere
#ifndef V5_HOPPER_LAZY_RESCALE
#error "V5_HOPPER_LAZY_RESCALE undefined: the build passes it from variant.yaml (tunables.lazy_rescale)"
#endif
// independent FMNMX chains per row maximum, at D=128 and at D=64
#ifndef V5_HOPPER_MAX_CHAINS
#error "V5_HOPPER_MAX_CHAINS undefined: the build passes it from variant.yaml (tunables.max_chains)"
#endif
#ifndef V5_HOPPER_MAX_CHAINS_D64
#error "V5_HOPPER_MAX_CHAINS_D64 undefined: the build passes it from variant.yaml (tunables.max_chains_d64)"
#endif
// independent FADD chains per row's tile sum
#ifndef V5_HOPPER_SUM_CHAINS
#error "V5_HOPPER_SUM_CHAINS undefined: the build passes it from variant.yaml (tunables.sum_chains)"
#endif
// split a small grid's query tiles' keys across the CTAs of a cluster (non-causal)
#ifndef V5_HOPPER_KEY_SPLIT
#error "V5_HOPPER_KEY_SPLIT undefined: the build passes it from variant.yaml (tunables.key_split)"
#endif
// query rows of a split CTA: 128 (two consumer warp groups) or 64 (one)
#ifndef V5_HOPPER_SPLIT_BLOCK_M
#error "V5_HOPPER_SPLIT_BLOCK_M undefined: the build passes it from variant.yaml (tunables.split_block_m)"
#endif
// keys per pipeline stage of a D=64 split CTA
#ifndef V5_HOPPER_SPLIT_BLOCK_N
#error "V5_HOPPER_SPLIT_BLOCK_N undefined: the build passes it from variant.yaml (tunables.split_block_n)"
#endif
// keys per pipeline stage of a D=128 split CTA
#ifndef V5_HOPPER_SPLIT_BLOCK_N_D128
#error "V5_HOPPER_SPLIT_BLOCK_N_D128 undefined: the build passes it from variant.yaml (tunables.split_block_n_d128)"
#endif
// K and V ring depth of the D=64 split kernels (2, or 4: a 256-key share resident)
#ifndef V5_HOPPER_SPLIT_STAGES_D64
#error "V5_HOPPER_SPLIT_STAGES_D64 undefined: the build passes it from variant.yaml (tunables.split_stages_d64)"
#endif
// the most 64-row split CTAs an SM holds (2 or 3), where their shared memory fits
#ifndef V5_HOPPER_SPLIT_CTAS_PER_SM
#error "V5_HOPPER_SPLIT_CTAS_PER_SM undefined: the build passes it from variant.yaml (tunables.split_ctas_per_sm)"
#endif
// D=64 split grids that fill both slots of every SM: 128-row split CTAs without a producer (1) or not (0)
#ifndef V5_HOPPER_SPLIT_WIDE
#error "V5_HOPPER_SPLIT_WIDE undefined: the build passes it from variant.yaml (tunables.split_wide)"
#endif
// causal tile order: 0 head by head, 1 longest first across heads (non-persistent grids), 2 always,
// 3 as 1 plus long/short pairs of one head on persistent grids (tile_order.cuh)
#ifndef V5_HOPPER_CAUSAL_ORDER
#error "V5_HOPPER_CAUSAL_ORDER undefined: the build passes it from variant.yaml (tunables.causal_order)"
#endif
// D=128 non-causal, from this many keys (0: never): the free-issue kernel (no turns, the softmax
// under its own P V)
#ifndef V5_HOPPER_FREE_ISSUE_D128_MIN_KEYS
#error "V5_HOPPER_FREE_ISSUE_D128_MIN_KEYS undefined: the build passes it from variant.yaml (tunables.free_issue_d128_min_keys)"
#endif
// non-causal calls of at least this many keys (0: never): the last heads to a split launch where that
// empties the unsplit grid's last round (tail_split.cuh)
#ifndef V5_HOPPER_TAIL_SPLIT_MIN_KEYS
#error "V5_HOPPER_TAIL_SPLIT_MIN_KEYS undefined: the build passes it from variant.yaml (tunables.tail_split_min_keys)"
#endif
// loading threads of K and V: 1 (one thread, K then V per key tile) or 2 (one per ring)
#ifndef V5_HOPPER_KV_PRODUCERS
#error "V5_HOPPER_KV_PRODUCERS undefined: the build passes it from variant.yaml (tunables.kv_producers)"
#endif
// the split kernels' loads of Q, K and V carry L2's evict-first hint
#ifndef V5_HOPPER_EVICT_FIRST_INPUTS
#error "V5_HOPPER_EVICT_FIRST_INPUTS undefined: the build passes it from variant.yaml (tunables.evict_first_inputs)"
#endif
// the D=64 split CTA's first burst (four-stage ring): cycles its K/V thread waits after K0, or until K0
// lands, before V0, K1 (0: no wait); and cycles it waits between K1 and V1
#ifndef V5_HOPPER_SPLIT_BURST_GAP
#error "V5_HOPPER_SPLIT_BURST_GAP undefined: the build passes it from variant.yaml (tunables.split_burst_gap)"
#endif
#ifndef V5_HOPPER_SPLIT_BURST_GAP2
#error "V5_HOPPER_SPLIT_BURST_GAP2 undefined: the build passes it from variant.yaml (tunables.split_burst_gap2)"
#endif
// launch with programmatic dependent launch
#ifndef V5_HOPPER_PDL
#error "V5_HOPPER_PDL undefined: the build passes it from variant.yaml (tunables.pdl)"
#endif

// CuTe's wgmma atoms for N = 176 come only with CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, whose
// headers cost about 14 s of front end in every translation unit (the includes alone: 19.5 s with
// it, 5.8 s without; NOTES.md, "Build time"): defined for the 176-key build only. It must come
// before the first CuTe header, so every header of this folder that includes CuTe includes this
// file first, and the check at the top of this file stops a translation unit that did not.
#if V5_HOPPER_BLOCK_N_D128_FULL == 176 && !defined(CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif

// Development macro (off): the split kernels skip setmaxnreg, each warp group keeping the registers
// the CTA launches with (128 a thread at D=64 two to an SM), against run 197's question whether a
// register file traded by setmaxnreg keeps the next grid out of the slots this one frees.
#ifndef V5_DEV_KEEP_LAUNCH_REGISTERS
#define V5_DEV_KEEP_LAUNCH_REGISTERS 0
#endif
