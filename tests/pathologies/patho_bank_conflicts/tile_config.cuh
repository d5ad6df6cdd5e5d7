// v2_tiled: the tile shape, which thread owns which scores / outputs, and the shared-memory
// layout. One traits struct serves both head dims. Index arithmetic only.
//
// A block owns BLOCK_M query rows of one (batch, head); warp w owns rows [16w, 16w+16) of the
// tile. Inside a warp, lane = 8*row_group + lane_in_row:
//   * row_group (0..3) picks the thread's 4 rows:  16w + row_group + 4i,  i = 0..3
//   * lane_in_row (0..7) picks its keys:           lane_in_row + 8j,      j = 0..BLOCK_N/8-1
//     and its output dims (4-float chunks):        4*lane_in_row + 32c,   c = 0..HEAD_DIM/32-1
// The 8 lanes of a row group hold a row's scores between them: row statistics are reduced
// with 3 xor-shuffles inside that group (owned by one warp, no shared state, no races).
#pragma once

namespace v2_tiled {

constexpr int kWarpSize = 32;
constexpr int kRowsPerWarp = 16;
constexpr int kRowsPerThread = 4;   // TM: each K/V value read from shared memory feeds 4 rows
constexpr int kLanesPerRow = 8;     // lanes sharing one row group
constexpr int kFloatsPerLds = 4;    // one LDS.128
constexpr int kElemsPerChunk = 8;   // one 16-byte global load of fp16/bf16

// PLANTED PATHOLOGY (patho_bank_conflicts): no padding. A Q/K/V row is D floats, a multiple of
// 32 banks (256 or 512 bytes), so every row starts at bank 0 and the 8 keys a warp reads at one
// column (tile_scores) all sit in the same 4-bank group: each 8-lane phase of an LDS.128 is an
// 8-way conflict and the warp's read takes 32 wavefronts, one per lane, instead of 4.
// The parent pads by 4 floats (16 bytes) so consecutive rows start 4 banks apart.
constexpr int kQkvRowPadFloats = 0;
// Padding of 8 floats per P row: the 4 row groups x 8 lanes of a warp write P at banks
// 8*row_group + lane_in_row, all 32 distinct (a 4-float pad would collide 2-way).
constexpr int kPRowPadFloats = 8;

template <int HEAD_DIM_, int BLOCK_M_, int BLOCK_N_>
struct TileConfig {
    static constexpr int HEAD_DIM = HEAD_DIM_;
    static constexpr int BLOCK_M = BLOCK_M_;
    static constexpr int BLOCK_N = BLOCK_N_;

    static constexpr int kWarps = BLOCK_M / kRowsPerWarp;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kKeysPerThread = BLOCK_N / kLanesPerRow;                 // TN
    static constexpr int kDimChunksPerThread = HEAD_DIM / (kLanesPerRow * kFloatsPerLds);

    static constexpr int kQkvStride = HEAD_DIM + kQkvRowPadFloats;  // floats per smem row
    static constexpr int kPStride = BLOCK_N + kPRowPadFloats;
    static constexpr int kChunksPerRow = HEAD_DIM / kElemsPerChunk;

    static constexpr int kQFloats = BLOCK_M * kQkvStride;
    static constexpr int kKFloats = BLOCK_N * kQkvStride;
    static constexpr int kVFloats = BLOCK_N * kQkvStride;
    static constexpr int kPFloats = BLOCK_M * kPStride;
    static constexpr int kSmemBytes = (kQFloats + kKFloats + kVFloats + kPFloats) * static_cast<int>(sizeof(float));

    static_assert(BLOCK_M % kRowsPerWarp == 0 && kWarps >= 1 && kWarps <= 8, "BLOCK_M: 16..128, multiple of 16");
    static_assert(BLOCK_N % (kLanesPerRow * kFloatsPerLds) == 0, "BLOCK_N: multiple of 32");
    static_assert(HEAD_DIM % (kLanesPerRow * kFloatsPerLds) == 0, "HEAD_DIM: multiple of 32");
    static_assert(kQkvStride % 32 == 0, "planted: Q/K/V rows all start at bank 0");
    static_assert(kPStride % 32 == kPRowPadFloats, "P rows must start 8 banks apart");
    // 99 KB is the most one block may opt into on an L4 (sm_89); the kernel must build and run there.
    static_assert(kSmemBytes <= 99 * 1024, "tiles exceed the 99 KB of shared memory an sm_89 block may use");
};

// Which rows, keys and output dims a thread owns (see the layout at the top of the file).
struct ThreadLayout {
    int warp;
    int row_group;    // 0..3
    int lane_in_row;  // 0..7

    static __device__ __forceinline__ ThreadLayout of_thread() {
        const int lane = threadIdx.x % kWarpSize;
        return ThreadLayout{static_cast<int>(threadIdx.x) / kWarpSize, lane / kLanesPerRow, lane % kLanesPerRow};
    }
    // Row of the tile (0..BLOCK_M-1) of the thread's i-th row.
    __device__ __forceinline__ int tile_row(int i) const {
        return warp * kRowsPerWarp + row_group + kRowsPerThread * i;
    }
    // Key of the key tile (0..BLOCK_N-1) of the thread's j-th score column.
    __device__ __forceinline__ int tile_key(int j) const { return lane_in_row + kLanesPerRow * j; }
    // First of the 4 output dims of the thread's c-th dim chunk; 8 lanes read 32 contiguous floats.
    __device__ __forceinline__ int first_dim(int c) const {
        return kFloatsPerLds * lane_in_row + kLanesPerRow * kFloatsPerLds * c;
    }
};

}  // namespace v2_tiled
