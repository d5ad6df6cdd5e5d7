// The last wave of a long non-causal call (tunables.tail_split_min_keys). A persistent grid of one
// CTA per SM runs T query tiles in ceil(T / SMs) rounds of one tile each; when T is a few tiles
// past a multiple of the SMs, the last round holds most SMs idle for a whole tile (16,16,4096,128:
// 8192 tiles on 132 SMs, a 63rd round of 8). The plan moves the call's last heads to a second
// launch of the split kernel, whose clusters share each 64-row half's keys and all fit on the
// device at once, so those heads cost a fraction of a round. The heads are whole attention
// problems (non-causal rows see every key): each launch is the kernel's ordinary call on a slice
// of the tensors, and the kernels themselves do not change.
//
// Plain integer arithmetic, no CUDA: tests/test_v5_hopper.py compiles it for the host.
#pragma once

#include <cstdint>

namespace v5_hopper {

struct TailPlan {
    int heads;    // the trailing heads the split kernel runs (0: the call is one launch)
    int splits;   // CTAs per cluster of that launch
};

// The split launch's cost against the model below, fitted on an H200 (NOTES.md, run 77): its CTAs
// take 1.8 times the unsplit kernel's time for a unit of work (64-row CTAs, the merge), and the
// launch with its prologue about 8 us, the time of an unsplit round over some 600 keys at D=128 or
// 800 at D=64.
constexpr double kSplitWorkCost = 2.0;
constexpr double kSplitLaunchKeys = 640.0;
// The plan must save this much of a round: below it the fit's error could turn the gain around.
constexpr double kTailMinSavedRounds = 0.15;

// `heads_total` heads of `m_blocks` unsplit tiles (`rows` query rows each, `keys` keys) and
// `split_m_blocks` split tiles (`split_rows` each) on `sms` SMs. The unsplit launch must keep at
// least `min_unsplit_tiles` tiles (below them its grid is no longer persistent: a CTA per tile, each
// with its prologue). `splits_for(tiles)` is the cluster size the split kernel would take for that
// many tiles, all resident at once, or 1 where none fits. Time is counted in rounds of the unsplit
// grid (one tile per SM): the unsplit launch takes whole rounds; a split CTA does split_rows / rows
// of a tile over 1 / splits of its keys, the CTAs that share an SM share its throughput, and the
// launch costs kSplitWorkCost times that plus kSplitLaunchKeys / keys of a round.
template <class SplitsFor>
TailPlan plan_tail(int heads_total, int m_blocks, int rows, int keys, int split_m_blocks, int split_rows, int sms,
                   int64_t min_unsplit_tiles, SplitsFor splits_for) {
    TailPlan plan{0, 1};
    const int64_t tiles = int64_t(m_blocks) * heads_total;
    if (sms <= 0 || rows <= 0 || keys <= 0 || tiles <= sms) return plan;
    const auto rounds = [sms](int64_t n) { return double((n + sms - 1) / sms); };
    double best = rounds(tiles) - kTailMinSavedRounds;
    for (int heads = 1; heads < heads_total; ++heads) {
        const int64_t unsplit_tiles = tiles - int64_t(m_blocks) * heads;
        if (unsplit_tiles < min_unsplit_tiles) break;
        const int64_t split_tiles = int64_t(split_m_blocks) * heads;
        const int splits = splits_for(split_tiles);
        if (splits < 2) break;   // more heads fit no better
        const double per_cta = double(split_rows) / (double(rows) * splits);
        const double split_time = kSplitWorkCost * rounds(split_tiles * splits) * per_cta + kSplitLaunchKeys / keys;
        const double time = rounds(unsplit_tiles) + split_time;
        if (time < best) {
            best = time;
            plan = {heads, splits};
        }
    }
    return plan;
}

}  // namespace v5_hopper
