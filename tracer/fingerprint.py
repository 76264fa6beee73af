"""Bit-exact tensor fingerprints and cheap stats, computed on the tensor's own device.

Algorithm ``lanes64-v1``
------------------------
The tensor's bytes (logical element order, i.e. as ``.contiguous()`` lays them out)
are read as signed 32-bit words ``x_p``; a final partial word is zero-padded. Words
are processed in chunks of ``CHUNK = 2**18`` through a reused product buffer. Word
``p = c*CHUNK + q`` gets the weight ``W[q] * R[c]`` (mod 2**64), where
``W`` and ``R`` are fixed tables of odd 64-bit values drawn from splitmix64 (with
``R[0] = 1``), so every weight is odd. The lane sum is

    h = sum_c R[c] * sum_q x_p * W[q]     (mod 2**64, two's complement)

and the fingerprint is ``mix64(h ^ mix64(meta))`` where ``meta`` encodes dtype and
shape. Only integer multiply-adds are used: every device computes the same bits,
whatever its reduction order, because addition mod 2**64 is associative. The device
returns one int64 plus the stats; only those cross to the host. On a lazy (XLA)
device `lazy_digest` adds the digest to the step's graph without reading it; the
Tracer reads it after the step mark (docs/xla.md).

Implementations (all give the same fingerprint bits; tests/tracer/test_fingerprint.py)
-----------------------------------------------------------------------------------
* CPU: the fused kernel (tracer/kernel/digest.cpp), one pass over each tensor's bytes
  for the fingerprint and the stats, several tensors per call (`digest_many`). Built
  once per machine (``python -m tracer.kernel``; ``make venv`` does it); without it the
  torch ops below run instead, at several times the cost, and a warning says so once.
  ``SDCTRACE_DIGEST=torch`` forces the torch ops.
* Accelerators: `digest_many` digests a step's tensors with a fixed number of batched
  torch ops over one flat layout (not a handful of launches per tensor) and reads all
  of them in one transfer.
* The stats are float arithmetic: across implementations they agree to rounding (the
  kernel accumulates in float64), not bit for bit. Nothing compares them for equality.

Collision bound (see also docs/log-format.md)
---------------------------------------------
Let ``d_p`` be the word differences between two tensors of the same dtype and shape
(|d_p| < 2**32). The lane sums collide iff ``sum_p d_p * w_p == 0 (mod 2**64)``.

* A change confined to one 32-bit word (any single bit flip, any corruption of one
  fp32 element or of one or two adjacent 16-bit elements) is **always** detected:
  ``d * w`` with ``w`` odd and ``0 < |d| < 2**32`` is never ``0 mod 2**64``.
* Any other change, with ``t`` the number of trailing zero bits shared by all
  ``d_p`` (``t <= 31``), collides with probability ``2**-(64 - t)`` over the choice
  of weights, if the weights were random; for two words it is at most ``2**-32``
  (two sign-bit flips, or a swap of two words that differ only in the sign bit) and
  about ``2**-64`` for typical corruption that touches low-order bits. The weights
  are fixed constants, so this is a model of "unrelated to the data", which hardware
  faults are; the bound is not a defence against an adversary.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

from tracer import kernel
from tracer.device import is_lazy, reinterpret

ALGORITHM = "lanes64-v1"
CHUNK = 1 << 18
_MASK64 = (1 << 64) - 1
_W_SEED = 0x5DC7_2ACE_0000_0001
_R_SEED = 0x5DC7_2ACE_0000_0002


@dataclass(frozen=True, slots=True)
class TensorDigest:
    """What a traced tensor leaves in the log: its fingerprint and a few stats."""

    fingerprint: int  # unsigned 64-bit
    l2: float
    absmax: float
    nan: int
    inf: int
    meta: str  # e.g. "float32[8,64,128]"


def mix64(z: int) -> int:
    """splitmix64's finaliser: a bijective avalanche on 64-bit integers."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _odd_table(seed: int, n: int, offset: int = 0) -> torch.Tensor:
    """``n`` odd 64-bit constants from splitmix64, ``mix64(seed + (offset + i + 1) * golden) | 1``, as int64 bit
    patterns (CPU). Computed with torch's int64 ops, which wrap modulo 2**64 as `mix64`'s masks do (a right shift
    is masked to make it logical): a Python loop took 0.2 s for the 262 144 weights, at the first digest."""
    i = torch.arange(offset + 1, offset + n + 1, dtype=torch.int64)
    z = i * _signed(0x9E3779B97F4A7C15) + _signed(seed)
    z = (z ^ _shift_right(z, 30)) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ _shift_right(z, 27)) * _signed(0x94D049BB133111EB)
    return (z ^ _shift_right(z, 31)) | 1


def _signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 with its bits."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 bit patterns (torch's ``>>`` is arithmetic on int64)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


class _Tables:
    """Per-device weight tables, built once and grown on demand."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._w_cpu: torch.Tensor | None = None
        self._r_cpu = torch.empty(0, dtype=torch.int64)
        self._by_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._local = threading.local()  # autograd may run hooks on its own threads

    def get(self, device: torch.device, chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
        hit = self._by_device.get(device)
        if hit is not None and hit[1].numel() >= chunks:
            return hit
        with self.lock:
            if self._w_cpu is None:
                self._w_cpu = _odd_table(_W_SEED, CHUNK)
            if self._r_cpu.numel() < chunks:
                grown = max(chunks, 2 * self._r_cpu.numel(), 64)
                extra = _odd_table(_R_SEED, grown - self._r_cpu.numel(), self._r_cpu.numel())
                self._r_cpu = torch.cat([self._r_cpu, extra])
                self._r_cpu[0] = 1  # a single-chunk tensor needs no chunk weight
                self._by_device.clear()
            if device not in self._by_device:
                self._by_device[device] = (self._w_cpu.to(device), self._r_cpu.to(device))
            return self._by_device[device]

    def buffer(self, device: torch.device) -> torch.Tensor:
        bufs = self._local.__dict__.setdefault("bufs", {})
        if device not in bufs:
            bufs[device] = torch.empty(CHUNK, dtype=torch.int64, device=device)
        return bufs[device]


_TABLES = _Tables()


def tensor_meta(t: torch.Tensor) -> tuple[str, int]:
    """The tensor's meta string and the 64-bit hash of dtype and shape, memoised."""
    key = (t.dtype, t.shape)
    hit = _META_CACHE.get(key)
    if hit is None:
        text = f"{str(t.dtype).removeprefix('torch.')}[{','.join(str(s) for s in t.shape)}]"
        h = 0xCBF29CE484222325  # FNV-1a over the dtype's name: stable across torch releases
        for b in str(t.dtype).encode():
            h = ((h ^ b) * 0x100000001B3) & _MASK64
        for dim in t.shape:
            h = mix64(h * 0x100000001B3 + dim + 1)
        hit = _META_CACHE[key] = (text, mix64(h ^ (t.dim() << 56)))
    return hit


_META_CACHE: dict[tuple[torch.dtype, torch.Size], tuple[str, int]] = {}


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in logical order as int32 words, the last one zero-padded."""
    if is_lazy(t.device):
        return _lazy_words(t)
    if t.is_contiguous() and t.element_size() == 4 and t.dtype != torch.bool:
        return t.view(torch.int32).reshape(-1)  # the common case: no copy, few ops
    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    raw = flat.view(torch.uint8)
    if raw.storage_offset() % 4:  # a 16-bit view may start mid-word; int32 needs alignment
        raw = raw.clone()
    whole = raw.numel() // 4 * 4
    if whole == raw.numel():
        return raw.view(torch.int32)
    tail = torch.zeros(4, dtype=torch.uint8, device=raw.device)
    tail[: raw.numel() - whole] = raw[whole:]
    return torch.cat([raw[:whole].view(torch.int32), tail.view(torch.int32)])


def _lazy_words(t: torch.Tensor) -> torch.Tensor:
    """`_words` as graph ops: XLA tensors have no storage to view, only values to bitcast."""
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    pad = -flat.numel() % max(1, 4 // flat.element_size())
    if pad:  # zero elements are zero bytes
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return reinterpret(flat, torch.int32)


def _lane_sum(words: torch.Tensor) -> torch.Tensor:
    """sum_c R[c] * sum_q x[c*CHUNK+q] * W[q] (mod 2**64) as a 0-d int64 tensor."""
    n = words.numel()
    chunks = max(1, -(-n // CHUNK))
    w, r = _TABLES.get(words.device, chunks)
    if is_lazy(words.device):
        # One functional expression for the graph; a reused buffer would become a graph output.
        x = words.to(torch.int64)
        if chunks == 1:
            return x.mul(w[:n]).sum()
        x = torch.cat([x, x.new_zeros(chunks * CHUNK - n)]).reshape(chunks, CHUNK)
        return x.mul(w).sum(dim=1).mul(r[:chunks]).sum()
    # A reused buffer: a fresh large temporary per call costs page faults on CPU.
    buf = _TABLES.buffer(words.device)
    if chunks == 1:
        # Widen, then multiply in place: much faster than a mixed int32 * int64 multiply.
        b = buf[:n]
        b.copy_(words)
        return b.mul_(w[:n]).sum()
    sums = torch.empty(chunks, dtype=torch.int64, device=words.device)
    for c in range(chunks):
        part = words[c * CHUNK : (c + 1) * CHUNK]
        b = buf[: part.numel()]
        b.copy_(part)
        torch.sum(b.mul_(w[: part.numel()]), dim=0, out=sums[c])
    return torch.mul(sums, r[:chunks]).sum()


def _finalise(lane_sum: int, meta_hash: int) -> int:
    return mix64((lane_sum & _MASK64) ^ meta_hash)


def fingerprint(t: torch.Tensor) -> int:
    """The unsigned 64-bit fingerprint of ``t``'s dtype, shape and bits."""
    if t.device.type == "cpu" and _fused() is not None and t.dtype in _FUSED_DTYPES:
        return digest(t).fingerprint
    return _finalise(int(_lane_sum(_words(t)).item()), tensor_meta(t)[1])


def digest(t: torch.Tensor) -> TensorDigest:
    """Fingerprint plus L2 norm, absmax and NaN/Inf counts; only scalars leave the device."""
    return digest_many([t])[0]


def digest_many(tensors: Sequence[torch.Tensor]) -> list[TensorDigest]:
    """The digests of many tensors at once: a step's gradients or parameters cost one kernel call on
    CPU, and one batched computation and one transfer on an accelerator, instead of one per tensor."""
    fused = _fused()
    if fused is not None and all(t.device.type == "cpu" and t.dtype in _FUSED_DTYPES and own_bytes(t) for t in tensors):
        return _fused_digests(fused, tensors)  # the training loop's common case, kept short
    out: list[TensorDigest | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.device.type == "cpu" and (fused is None or t.dtype not in _FUSED_DTYPES or not own_bytes(t)):
            out[i] = _torch_digest(t)
        else:
            by_device.setdefault(t.device, []).append(i)
    for device, idx in by_device.items():
        group = [tensors[i].detach() for i in idx]
        if device.type == "cpu":
            assert fused is not None
            digests = _fused_digests(fused, group)
        else:
            digests = resolve_rows(batched_parts(group).cpu(), [tensor_meta(t) for t in group])  # the one transfer
        for i, d in zip(idx, digests):
            out[i] = d
    return out  # type: ignore[return-value]  # every slot filled: by a CPU digest or its device's


def own_bytes(t: torch.Tensor) -> bool:
    """Whether the fused kernel may read ``t``'s bytes: not a tensor subclass that dispatches its ops in Python (a
    wrapper may hold no storage of its own), which torch ops digest through its dispatch instead."""
    return type(t).__torch_dispatch__ is _PLAIN_DISPATCH


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def _fused_digests(fused: ModuleType, tensors: Sequence[torch.Tensor]) -> list[TensorDigest]:
    metas = [tensor_meta(t) for t in tensors]
    w, r = _TABLES.get(_CPU, max(_chunks(t) for t in tensors) if tensors else 1)
    rows = fused.digest_many(tensors, w, r, [h for _, h in metas])
    return [TensorDigest(fp, l2, absmax, nan, inf, meta) for (fp, nan, inf, l2, absmax), (meta, _) in zip(rows, metas)]


HeldRow = tuple[int, int, int, float, float, str]
"""One tensor's digest as a hook keeps it: (fingerprint, NaN count, Inf count, L2, absmax, meta)."""


@dataclass(frozen=True, slots=True)
class HeldDigesters:
    """The fused kernel's digests for the Tracer's hot paths. They compute `tensor_meta` themselves and return
    plain tuples: a hook runs between a pass's large ops, where each line of Python costs several microseconds out
    of cache. Each returns None for what it does not take (a tensor that is not a contiguous CPU tensor of a kernel
    dtype, or longer than the tables registered here cover), which the caller digests as usual."""

    one: Callable[[torch.Tensor], HeldRow | None]
    many: Callable[[Sequence[torch.Tensor]], list[HeldRow] | None]  # None unless it takes every tensor


def held_digesters() -> HeldDigesters | None:
    """The fused kernel's `HeldDigesters`, or None without the kernel."""
    fused = _fused()
    if fused is None:
        return None
    fused.use_tables(*_TABLES.get(_CPU, 1))
    return HeldDigesters(fused.digest_held, fused.digest_held_many)


_CPU = torch.device("cpu")


def resolve_rows(parts: torch.Tensor, metas: Sequence[tuple[str, int]]) -> list[TensorDigest]:
    """`PendingDigest.resolve` for every row of host ``parts`` (int64[n, 6]) at once: two list conversions
    for the whole batch instead of a few per tensor, which matters at a hundred tensors a step."""
    ints, floats = parts.tolist(), parts.view(torch.float64).tolist()
    out = []
    for (lane, _, _, _, nan, inf), (_, l2, lo, hi, _, _), (meta, meta_hash) in zip(ints, floats, metas):
        absmax = float("nan") if nan else _absmax(lo, hi)
        out.append(TensorDigest(_finalise(lane, meta_hash), l2, absmax, nan, inf, meta))
    return out


def _chunks(t: torch.Tensor) -> int:
    words = (t.numel() * t.element_size() + 3) // 4
    return max(1, -(-words // CHUNK))


# -- the fused CPU kernel -------------------------------------------------------------------
DIGEST_ENV = "SDCTRACE_DIGEST"  # "torch": use torch ops even where the fused kernel is built
_FUSED_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    }
)
_fused_state: list[ModuleType | None] = []  # [] until the first digest looks


def _fused() -> ModuleType | None:
    """The built kernel, loaded at the first CPU digest; None (said once) when it is not there."""
    if _fused_state:
        return _fused_state[0]
    return kernel.load_once(
        kernel.DIGEST,
        _fused_state,
        _TABLES.lock,
        DIGEST_ENV,
        "sdctrace's fused digest kernel is not built for this torch and Python, so fingerprints are computed with "
        "torch ops: the same bits, several times the cost per traced step. Build it once with `python -m "
        "tracer.kernel` (needs a C++ compiler and ninja; `make venv` does it).",
    )


def prepare_digests() -> None:
    """Load the kernel and build the CPU weight tables now (the Tracer calls this when it starts), so that the first
    traced step costs what the others do."""
    _fused()
    _TABLES.get(_CPU, 1)


def digest_implementation() -> str:
    """Which implementation CPU digests use here: "fused" or "torch"; benchmarks and reports print it."""
    return "fused" if _fused() is not None else "torch"


# -- batched torch ops, for accelerators ------------------------------------------------------
_GROUP_WORDS = 1 << 23  # words digested together: bounds the temporaries (about 48 bytes a word)


def batched_parts(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The digest parts (as `PendingDigest.parts`) of tensors on one device, int64[n, 6], computed with a fixed
    number of torch ops per group of tensors rather than per tensor, and not read."""
    if is_lazy(tensors[0].device):
        return torch.stack([lazy_digest(t).parts for t in tensors])
    rows: list[torch.Tensor] = []
    group: list[torch.Tensor] = []
    words = 0
    for t in tensors:
        size = (t.numel() * t.element_size() + 3) // 4
        if group and words + size > _GROUP_WORDS:
            rows.append(_segmented_parts(group))
            group, words = [], 0
        group.append(t.detach())
        words += size
    rows.append(_segmented_parts(group))
    return torch.cat(rows)


def _segmented_parts(group: list[torch.Tensor]) -> torch.Tensor:
    """`batched_parts` of one group: the lanes64-v1 sums and the stats as segment reductions over the
    concatenated words and values."""
    device = group[0].device
    words = [_words(t) for t in group]
    sizes = [w.numel() for w in words]
    chunks = [max(1, -(-n // CHUNK)) for n in sizes]
    w, r = _TABLES.get(device, max(chunks))
    total = sum(sizes)
    sizes_t = torch.tensor(sizes, device=device)
    starts = torch.cumsum(sizes_t, 0) - sizes_t
    local = torch.arange(total, device=device) - starts.repeat_interleave(sizes_t, output_size=total)
    chunks_t = torch.tensor(chunks, device=device)
    first_bin = torch.cumsum(chunks_t, 0) - chunks_t
    bins = first_bin.repeat_interleave(sizes_t, output_size=total) + local // CHUNK
    x = torch.cat(words).to(torch.int64).mul_(w[local % CHUNK])
    nbins = sum(chunks)
    sums = torch.zeros(nbins, dtype=torch.int64, device=device).index_add_(0, bins, x)
    bin_owner = torch.arange(len(group), device=device).repeat_interleave(chunks_t, output_size=nbins)
    bin_chunk = torch.arange(nbins, device=device) - first_bin.repeat_interleave(chunks_t, output_size=nbins)
    lane = torch.zeros(len(group), dtype=torch.int64, device=device).index_add_(0, bin_owner, sums * r[bin_chunk])
    values = [_stat_values(t) for t in group]
    lengths = torch.tensor([v.numel() for v in values], device=device)
    v = torch.cat(values)
    sumsq = torch.segment_reduce(v * v, "sum", lengths=lengths, unsafe=True)
    empty = lengths == 0
    lo = torch.segment_reduce(v, "min", lengths=lengths, unsafe=True).masked_fill_(empty, 0.0)
    hi = torch.segment_reduce(v, "max", lengths=lengths, unsafe=True).masked_fill_(empty, 0.0)
    nan = torch.segment_reduce(torch.isnan(v).double(), "sum", lengths=lengths, unsafe=True)
    inf = torch.segment_reduce(torch.isinf(v).double(), "sum", lengths=lengths, unsafe=True)
    floats = reinterpret(torch.stack([sumsq.sqrt(), lo, hi], dim=1), torch.int64)
    return torch.cat([lane[:, None], floats, nan.long()[:, None], inf.long()[:, None]], dim=1)


def _stat_values(t: torch.Tensor) -> torch.Tensor:
    """The values the stats are taken over, flat float64 (a complex tensor's real and imaginary parts)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1).to(torch.float64)


def _torch_digest(t: torch.Tensor) -> TensorDigest:
    """A CPU tensor's digest by torch ops: the fallback and the kernel's reference."""
    t = t.detach()
    meta, meta_hash = tensor_meta(t)
    lane = _lane_sum(_words(t))
    if t.numel() == 0:
        return TensorDigest(_finalise(int(lane.item()), meta_hash), 0.0, 0.0, 0, 0, meta)
    x, l2, lo, hi = _stats(t)
    lane_v, l2_v, absmax_v = lane.item(), l2.item(), _absmax(lo.item(), hi.item())
    nan = inf = 0
    if not absmax_v < float("inf"):
        # Rare: only pay for the counting passes when something is not finite.
        nan = int(torch.isnan(x).sum().item())
        inf = int(torch.isinf(x).sum().item())
    return TensorDigest(_finalise(int(lane_v), meta_hash), l2_v, absmax_v, nan, inf, meta)


@dataclass(frozen=True, slots=True)
class PendingDigest:
    """A digest still on the device: ``parts`` holds lane sum, L2, min and max (float64
    bits) and NaN/Inf counts as int64[6], so one small transfer reads all of it."""

    parts: torch.Tensor
    meta: str
    meta_hash: int

    def resolve(self, host_parts: torch.Tensor) -> TensorDigest:
        """The digest, from ``parts`` once it is on the host."""
        return resolve_rows(host_parts.reshape(1, 6), [(self.meta, self.meta_hash)])[0]


def lazy_digest(t: torch.Tensor) -> PendingDigest:
    """The digest as device ops, nothing read: on XLA they join the step's graph."""
    t = t.detach()
    meta, meta_hash = tensor_meta(t)
    lane = _lane_sum(_words(t))
    if t.numel() == 0:
        parts = torch.cat([lane.reshape(1), torch.zeros(5, dtype=torch.int64, device=t.device)])
        return PendingDigest(parts, meta, meta_hash)
    x, l2, lo, hi = _stats(t)
    floats = reinterpret(torch.cat([v.double().reshape(1) for v in (l2, lo, hi)]), torch.int64)
    counts = [torch.isnan(x).sum().reshape(1), torch.isinf(x).sum().reshape(1)]
    return PendingDigest(torch.cat([lane.reshape(1), floats, *counts]), meta, meta_hash)


def _stats(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``t`` as a real floating tensor, its L2 norm, min and max (0-d, on its device)."""
    x = torch.view_as_real(t) if t.is_complex() else t
    x = x if x.is_floating_point() else x.to(torch.float64)
    if is_lazy(x.device) and x.element_size() < 4:
        x = x.float()  # torch_xla's vector_norm ignores its dtype argument
    l2 = torch.linalg.vector_norm(x, dtype=torch.float32 if x.element_size() < 4 else None)
    if is_lazy(x.device):  # XLA has no aminmax lowering (it would run on the host), and its amin keeps dims
        lo, hi = x.min(), x.max()
    else:
        lo, hi = torch.aminmax(x)  # one pass, far faster than an inf-norm on CPU
    return x, l2, lo, hi


def _absmax(lo: float, hi: float) -> float:
    # A NaN count decides NaN (XLA's min and max skip NaNs); this only sees finite or infinite bounds.
    return max(abs(lo), abs(hi)) if lo == lo and hi == hi else float("nan")
