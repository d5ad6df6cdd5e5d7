"""FlashAttention-2 style forward pass in Triton.

One program computes BLOCK_M query rows of one (batch, head): it streams the keys and values
in blocks of BLOCK_N and keeps an online softmax in fp32 (running row max ``m_i``, running
row sum ``l_i``, unnormalised output ``acc``), so the S x S score matrix never exists.
Scores are taken in base 2: ``exp(x * scale) == exp2(x * scale * log2(e))``, so log2(e) is
folded into the scale once and the loop uses ``exp2`` (one MUFU.EX2 per score, no extra
multiply).

Layout: contiguous [B, H, S, D] tensors, query length == key length == S, fp16 or bf16,
head dim 64 or 128, causal (query i sees keys j <= i) or not, any S >= 1.

Entry points: ``forward(q, k, v, out, causal, scale, tunables=...)`` and ``compiled_resources()``.
Runs on a GPU, or on CPU tensors under the Triton interpreter (``TRITON_INTERPRET=1`` set
before ``import triton``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2_E = 1.4426950408889634  # exp(x) == exp2(x * LOG2_E)

# The launch configuration comes from variant.yaml (`tunables:`, the one home of its defaults):
# the runner passes it as forward's `tunables` (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA_D64,
# TMA_D128); no autotune, so every run times the same kernel. The defaults, 64x64 tiles, 4 warps (one
# warpgroup: one wgmma M=64 tile), 3 stages for both head dims, came from this hand sweep on one
# H200 (triton 3.6, fp16, do_bench; graph replay for S=512), us per call:
#   shape B,H,S,D,causal   128x64 4w  64x64 4w  128x64 8w  64x128 4w  128x128 8w   SDPA
#   1,8,512,64,no              10.4       6.5        9.1        6.6         9.5     9.0
#   8,16,1024,64,no           109.2      99.4       98.1      110.6       123.6    85.5
#   2,16,2048,64,yes           83.0      68.2       76.2       72.7        82.8    61.5
#   1,8,512,128,no             15.7*      9.0       12.5        8.8        13.7*   11.5
#   4,16,2048,128,yes         262.2*    192.9      204.6      244.5       212.7   155.0
#   1,8,4096,128,yes          156.3*    114.7      122.5      122.3       128.8    97.7
#   16,16,4096,128,no        5802*     5304       4832       5972        4850    3787
#   (* spills). 64-row tiles double the programs (small grids fill more SMs, the causal
#   triangle balances better) at 119-168 registers and 56 KiB (D=64) / 112 KiB (D=128) of
#   shared memory; 128x64 at 8 warps is 10% faster only on the largest non-causal D=128 shape.
TUNABLES = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "TMA_D64", "TMA_D128")
# Q, K and V through TMA tensor descriptors, chosen per head dim (NOTES.md, run 27: 1.09-1.19x the
# pointer loads on every D=128 shape of an H100, no gain at D=64).
TMA_KNOB = {64: "TMA_D64", 128: "TMA_D128"}
HEAD_DIMS = (64, 128)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)

# Two Triton-interpreter quirks with bf16 (it keeps bf16 as uint16 in numpy), worked around
# only when interpreted (the INTERPRETED constexpr), so the GPU code is the plain one:
#   * tl.dot multiplies the raw uint16 storage: the dot operands are widened to fp32 first;
#     bf16 x bf16 products are exact in fp32, so this is the tensor-core result up to the
#     order of the fp32 additions;
#   * fp32 -> bf16 casts truncate instead of rounding to nearest even as the GPU does:
#     the rounding is done on the fp32 bits first (_cast_rne).


@triton.jit
def _mma_operand(x, INTERPRETED: tl.constexpr):
    """A tile as tl.dot takes it: as is on the GPU, widened to fp32 under the interpreter."""
    if INTERPRETED:
        x = x.to(tl.float32)
    return x


@triton.jit
def _cast_rne(x, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 -> dtype, rounding to nearest even (the GPU's cvt; emulated for the interpreter's
    truncating bf16 cast: add half an ulp of bf16, ties to even, keep the high 16 bits)."""
    if INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


@triton.jit
def _row_tile(base, row_start, seq_len, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Pointers to rows [row_start, row_start + BLOCK) of one [seq_len, HEAD_DIM] head,
    the row indices, and which of those rows exist (row < seq_len)."""
    rows = row_start + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    ptrs = base + rows[:, None] * HEAD_DIM + cols[None, :]
    return ptrs, rows, rows[:, None] < seq_len


@triton.jit
def _load_rows(base, desc, head, row_start, seq_len, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
               MASKED: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows [row_start, row_start + BLOCK) of one head, rows past seq_len as zeros: through the
    head's [B*H, S, D] tensor descriptor (the copy engine zero-fills past S), or by pointers
    (masked only where MASKED says a row may not exist)."""
    if USE_TMA:
        return desc.load([head, row_start, 0]).reshape(BLOCK, HEAD_DIM)
    ptrs, _, row_exists = _row_tile(base, row_start, seq_len, BLOCK, HEAD_DIM)
    if MASKED:
        return tl.load(ptrs, mask=row_exists, other=0.0)
    return tl.load(ptrs)


@triton.jit
def _attend_key_blocks(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, head, offs_m,
                       key_start, key_end, seq_len, qk_scale_log2,
                       HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK_KEYS: tl.constexpr,
                       IS_CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, INTERPRETED: tl.constexpr):
    """Fold keys [key_start, key_end) into the online softmax state of one query tile.

    MASK_KEYS is off for blocks that every row of the tile sees in full (no bounds checks,
    no select: the common case); on for the causal diagonal and the ragged tail.
    """
    for start_n in range(key_start, key_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, k_desc, head, start_n, seq_len, BLOCK_N, HEAD_DIM, MASK_KEYS, USE_TMA)
        v = _load_rows(v_base, v_desc, head, start_n, seq_len, BLOCK_N, HEAD_DIM, MASK_KEYS, USE_TMA)

        # scores in log2 units: s = (q . k) * scale * log2(e)
        s = tl.dot(q, tl.trans(_mma_operand(k, INTERPRETED))) * qk_scale_log2
        if MASK_KEYS:
            # padded key columns (and, for causal, keys after the query) get -inf before the max
            visible = offs_n[None, :] < seq_len
            if IS_CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))

        # online softmax: 1) running max, 2) rescale what was summed so far, 3) accumulate
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # P V runs on the tensor cores in the input dtype, as in SDPA's flash kernels
        p = _cast_rne(p, v.dtype, INTERPRETED)
        acc = acc * alpha[:, None] + tl.dot(_mma_operand(p, INTERPRETED),
                                            _mma_operand(v, INTERPRETED))
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _triton_flash_fwd(Q, K, V, Out, Q_desc, K_desc, V_desc, seq_len, qk_scale_log2,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      IS_CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, INTERPRETED: tl.constexpr):
    """Out[b, h, tile] = softmax(Q K^T * scale, masked) V for one tile of BLOCK_M query rows."""
    if IS_CAUSAL:
        # every head's heaviest query tile (most keys) first, then every head's next one: programs
        # start in index order, axis 0 fastest, so the last wave holds the light tiles of all heads
        head = tl.program_id(0)
        m_block = tl.cdiv(seq_len, BLOCK_M) - 1 - tl.program_id(1)
    else:
        m_block = tl.program_id(0)
        head = tl.program_id(1)
    q_start = m_block * BLOCK_M
    head_offset = head.to(tl.int64) * seq_len * HEAD_DIM
    q_base = Q + head_offset
    k_base = K + head_offset
    v_base = V + head_offset
    o_base = Out + head_offset

    offs_m = q_start + tl.arange(0, BLOCK_M)
    q = _mma_operand(_load_rows(q_base, Q_desc, head, q_start, seq_len, BLOCK_M, HEAD_DIM, True, USE_TMA),
                     INTERPRETED)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Every row's first key block holds a key it sees (key 0, or for causal the first key of
    # the diagonal block), so m_i is finite before any fully masked block and
    # exp2(m_i - m_new) never meets -inf - (-inf).
    if IS_CAUSAL:
        # keys before the diagonal block are seen by every row of the tile: unmasked; then
        # the diagonal block(s), masked; keys after the tile's last row are never loaded.
        diag_start = (q_start // BLOCK_N) * BLOCK_N
        diag_end = tl.minimum(q_start + BLOCK_M, seq_len)
        acc, m_i, l_i = _attend_key_blocks(acc, m_i, l_i, q, k_base, v_base, K_desc, V_desc, head, offs_m,
                                           0, diag_start, seq_len, qk_scale_log2,
                                           HEAD_DIM, BLOCK_N, False, IS_CAUSAL, USE_TMA, INTERPRETED)
        acc, m_i, l_i = _attend_key_blocks(acc, m_i, l_i, q, k_base, v_base, K_desc, V_desc, head, offs_m,
                                           diag_start, diag_end, seq_len, qk_scale_log2,
                                           HEAD_DIM, BLOCK_N, True, IS_CAUSAL, USE_TMA, INTERPRETED)
    else:
        # whole key blocks unmasked, then the ragged tail when S is not a multiple of BLOCK_N
        full_end = (seq_len // BLOCK_N) * BLOCK_N
        acc, m_i, l_i = _attend_key_blocks(acc, m_i, l_i, q, k_base, v_base, K_desc, V_desc, head, offs_m,
                                           0, full_end, seq_len, qk_scale_log2,
                                           HEAD_DIM, BLOCK_N, False, IS_CAUSAL, USE_TMA, INTERPRETED)
        acc, m_i, l_i = _attend_key_blocks(acc, m_i, l_i, q, k_base, v_base, K_desc, V_desc, head, offs_m,
                                           full_end, seq_len, seq_len, qk_scale_log2,
                                           HEAD_DIM, BLOCK_N, True, IS_CAUSAL, USE_TMA, INTERPRETED)

    # epilogue: normalise by the softmax denominator; rows past seq_len are never stored
    out = acc / l_i[:, None]
    o_ptrs, _, row_exists = _row_tile(o_base, q_start, seq_len, BLOCK_M, HEAD_DIM)
    tl.store(o_ptrs, _cast_rne(out, Out.dtype.element_ty, INTERPRETED), mask=row_exists)


# What @triton.jit made of the kernel decides it: TRITON_INTERPRET read when this module loaded.
_INTERPRETER = not isinstance(_triton_flash_fwd, triton.runtime.jit.JITFunction)
GRID_Y_MAX = 65535  # CUDA's limit on a grid's second dimension
KERNEL_PARAMS = ("Q", "K", "V", "Out", "Q_desc", "K_desc", "V_desc", "seq_len", "qk_scale_log2",
                 "HEAD_DIM", "BLOCK_M", "BLOCK_N", "IS_CAUSAL", "USE_TMA", "INTERPRETED")

# compiled kernels launched by this process, one per specialisation: keyed by (dtype, head dim,
# causal, compiled hash); the hash also tells apart Triton's own specialisations of seq_len
# (== 1, divisible by 16 or not)
_launched: dict[tuple, tuple[object, dict[str, int], int, bool]] = {}


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be [B, H, S, D], got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    if not (q.shape == k.shape == v.shape == out.shape):
        raise ValueError("q, k, v and out must have the same shape [B, H, S, D] (query length "
                         f"== key length); got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}, {tuple(out.shape)}")
    if not (q.dtype == k.dtype == v.dtype == out.dtype):
        raise ValueError(f"q, k, v and out must share a dtype; got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}, {out.dtype}")
    batch, heads, seq_len, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} unsupported; supported: {list(HEAD_DIMS)}")
    if batch < 1 or heads < 1 or seq_len < 1:
        raise ValueError(f"empty shape {tuple(q.shape)}")
    if q.device.type == "cpu" and not _INTERPRETER:
        raise ValueError("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1 before "
                         "importing triton)")


def launch_config(tunables: Mapping[str, int] | None) -> dict[str, int]:
    """The launch configuration forward() was given: exactly TUNABLES, tiles powers of two >= 16."""
    if tunables is None:
        raise ValueError("forward() needs tunables= (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA_D64, TMA_D128: "
                         "kernels/triton_flash/variant.yaml's `tunables`, which the runner passes)")
    if set(tunables) != set(TUNABLES):
        raise ValueError(f"tunables must be exactly {', '.join(TUNABLES)}; got {', '.join(sorted(tunables))}")
    config = {name: int(tunables[name]) for name in TUNABLES}
    for name in ("BLOCK_M", "BLOCK_N"):
        if config[name] < 16 or config[name] & (config[name] - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {config[name]}")
    for name in TMA_KNOB.values():
        if config[name] not in (0, 1):
            raise ValueError(f"{name} must be 0 or 1, got {config[name]}")
    return config


def takes_tma(config: Mapping[str, int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether forward loads through tensor descriptors: its head dim's TMA knob is on and every
    input's base is 16-byte aligned (a descriptor's requirement; others take the pointer loads)."""
    return bool(config[TMA_KNOB[q.shape[-1]]]) and not any(t.data_ptr() % 16 for t in (q, k, v))


def head_descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A TMA descriptor of a contiguous [B, H, S, D] tensor as [B*H, S, D], one box = `rows` rows of
    one head: a box reaching past S is zero-filled, never the next head's rows."""
    batch, heads, seq_len, head_dim = t.shape
    return TensorDescriptor(t, shape=[batch * heads, seq_len, head_dim],
                            strides=[seq_len * head_dim, head_dim, 1], block_shape=[1, rows, head_dim])


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            causal: bool, scale: float, tunables: Mapping[str, int] | None = None) -> None:
    """Write softmax(q k^T * scale, causal mask if causal) v into the preallocated ``out``,
    launched with ``tunables`` (variant.yaml's launch configuration)."""
    _check_inputs(q, k, v, out)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    batch, heads, seq_len, head_dim = q.shape
    config = launch_config(tunables)
    tiles = triton.cdiv(seq_len, config["BLOCK_M"])
    grid = (batch * heads, tiles) if causal else (tiles, batch * heads)
    if grid[1] > GRID_Y_MAX:
        what = f"{tiles} query tiles of {config['BLOCK_M']} rows (causal)" if causal else f"B*H = {batch * heads}"
        raise ValueError(f"{what} exceed the grid's second dimension ({GRID_Y_MAX})")
    use_tma = takes_tma(config, q, k, v)
    descriptors = ((head_descriptor(q, config["BLOCK_M"]), head_descriptor(k, config["BLOCK_N"]),
                    head_descriptor(v, config["BLOCK_N"])) if use_tma else (None, None, None))
    # every argument of the kernel, in its parameter order (the fast launch passes them positionally)
    bound = dict(zip(KERNEL_PARAMS, (
        q, k, v, out, *descriptors, seq_len, scale * LOG2_E,
        head_dim, config["BLOCK_M"], config["BLOCK_N"], bool(causal), use_tma, _INTERPRETER), strict=True))
    if _INTERPRETER:
        _triton_flash_fwd[grid](**bound, num_warps=config["num_warps"], num_stages=config["num_stages"])
        return
    device = triton.runtime.driver.active.get_current_device()
    key = specialisation_key(device, q, k, v, out, config, causal, use_tma)
    compiled = _compiled.get(key)
    if compiled is not None:
        _launch_compiled(compiled, device, grid, bound)
        return
    compiled = _triton_flash_fwd[grid](**bound, num_warps=config["num_warps"], num_stages=config["num_stages"])
    if compiled is None:
        return
    if _FAST_LAUNCH:
        _compiled[key] = compiled
    record = (str(q.dtype).removeprefix("torch."), head_dim, bool(causal), str(compiled.hash))
    if record not in _launched:
        _launched[record] = (compiled, dict(config), seq_len, use_tma)


# Most of a call's host time is Triton's JIT dispatch: binding the arguments and hashing the
# specialisation, then the launch (34-53 µs a call on an H100 host, NOTES.md run 30; the eager
# bench times the part the L2 flush does not hide). A specialisation launched once is launched
# again through its compiled launcher, the call JITFunction.run ends with (Triton 3.4 and later,
# where triton.knobs holds the launch hooks; older versions keep the JIT path). The key holds
# everything Triton specialises this kernel on: the current device (Triton loads a kernel per
# device), the pointers' dtype and 16-byte alignment, seq_len == 1 and seq_len % 16 (its integer
# specialisations), the constexprs and the launch options. The scale, a float, is not specialised.
_FAST_LAUNCH = hasattr(triton, "knobs")
_compiled: dict[tuple, object] = {}


def specialisation_key(device: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       config: Mapping[str, int], causal: bool, use_tma: bool) -> tuple:
    seq_len = q.shape[2]
    return (device, q.dtype, q.shape[3], bool(causal), use_tma,
            config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], config["num_stages"],
            seq_len == 1, seq_len % 16 == 0, seq_len < 2**31,
            tuple(t.data_ptr() % 16 == 0 for t in (q, k, v, out)))


def _launch_compiled(compiled, device: int, grid: tuple[int, int], bound: dict) -> None:
    stream = triton.runtime.driver.active.get_current_stream(device)
    args = bound.values()
    hooks = triton.knobs.runtime
    compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *args),
                 hooks.launch_enter_hook, hooks.launch_exit_hook, *args)


def compiled_resources() -> list[dict]:
    """Registers, spills and shared memory of each kernel specialisation launched so far.

    Empty under the interpreter (nothing is compiled). Triton 3.x fills ``n_regs`` and
    ``n_spills`` on the CompiledKernel when it loads the binary (at its first launch);
    ``metadata.shared`` is the static + dynamic shared memory in bytes.
    """
    resources = []
    for (dtype, head_dim, causal, _), (compiled, config, seq_len, use_tma) in sorted(_launched.items()):
        metadata = compiled.metadata
        n_spills = getattr(compiled, "n_spills", None)
        resources.append({
            "kernel": compiled.name,
            "registers": getattr(compiled, "n_regs", None),
            # n_spills is CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4 (driver.c): 32-bit words
            "spill_bytes": None if n_spills is None else 4 * n_spills,
            "shared_bytes": getattr(metadata, "shared", None),
            "num_warps": getattr(metadata, "num_warps", config["num_warps"]),
            "num_stages": getattr(metadata, "num_stages", config["num_stages"]),
            "config": {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "TMA": int(use_tma),
                       "HEAD_DIM": head_dim, "IS_CAUSAL": causal,
                       "dtype": dtype},
            # a sequence length that compiled it (Triton specialises S == 1 and S % 16 == 0)
            "first_seq_len": seq_len,
            "tunables": dict(config),  # the launch configuration it was compiled for
        })
    return resources
