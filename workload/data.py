"""Byte-level training data from a corpus that ships inside the package.

    data = TokenData(cfg.data)
    inputs, targets = data.batch(step, microbatch)  # (B, T) int64 each

No downloads, ever: every machine and Python version must see the same bytes, so
the corpus (stdlib docstrings, built by tools/build_corpus.py) is committed. Tokens
are the bytes themselves (0-255). The corpus is cut into windows of seq_len + 1
tokens (consecutive windows share one token, so every byte is a target once), and
each epoch visits them in a permutation seeded from (shuffle_seed, epoch).
`batch` is a pure function of (step, microbatch): a replay can rebuild any
microbatch without reading the ones before it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from importlib import resources

import torch

from tracer.errors import ConfigError
from workload.reference_config import DataConfig

CORPUS_FILE = "stdlib-docstrings.txt.gz"
# Names the windowing and shuffling scheme; change it whenever either changes, so
# old and new runs never claim the same data order.
ORDER_ALGORITHM = "bytes/windows-stride-seq_len/torch-randperm-per-epoch/sha256-seed/v1"


def load_corpus() -> bytes:
    """The embedded corpus, uncompressed."""
    packed = (resources.files("workload") / "corpus" / CORPUS_FILE).read_bytes()
    return gzip.decompress(packed)


class TokenData:
    """Deterministic microbatches of byte tokens; see the module docstring."""

    def __init__(self, cfg: DataConfig, corpus: bytes | None = None) -> None:
        self.cfg = cfg
        corpus = load_corpus() if corpus is None else corpus
        self.num_windows = (len(corpus) - 1) // cfg.seq_len
        if self.num_windows < 1:
            raise ConfigError(
                f"data.seq_len = {cfg.seq_len} needs a corpus of at least "
                f"{cfg.seq_len + 1} bytes, got {len(corpus)}; lower data.seq_len"
            )
        self.tokens = torch.frombuffer(bytearray(corpus), dtype=torch.uint8)  # (N,)
        self.corpus_sha256 = hashlib.sha256(corpus).hexdigest()
        self._permutations: dict[int, torch.Tensor] = {}

    @property
    def fingerprint(self) -> str:
        """sha256 of everything that fixes the data order, to compare runs without batches."""
        order = {
            "algorithm": ORDER_ALGORITHM,
            "corpus_sha256": self.corpus_sha256,
            "seq_len": self.cfg.seq_len,
            "batch_size": self.cfg.batch_size,
            "microbatches": self.cfg.microbatches,
            "shuffle_seed": self.cfg.shuffle_seed,
        }
        canonical = json.dumps(order, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def batch(self, step: int, microbatch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of one microbatch, each (batch_size, seq_len) int64 on the CPU."""
        B, L, M = self.cfg.batch_size, self.cfg.seq_len, self.cfg.microbatches
        if step < 0 or not 0 <= microbatch < M:
            raise ValueError(f"need step >= 0 and 0 <= microbatch < {M}, got step={step}, microbatch={microbatch}")
        first = (step * M + microbatch) * B  # index of this microbatch's first sample overall
        windows = torch.stack([self._window(i) for i in range(first, first + B)])  # (B,)
        offsets = windows[:, None] * L + torch.arange(L + 1)[None, :]  # (B, L+1)
        chunk = self.tokens[offsets].long()  # (B, L+1)
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()  # (B, L), (B, L)

    def _window(self, sample: int) -> torch.Tensor:
        epoch, position = divmod(sample, self.num_windows)
        return self._permutation(epoch)[position]

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch not in self._permutations:
            # Hash (shuffle_seed, epoch) rather than add them, so shuffle seed s+1 is
            # not seed s shifted by one epoch.
            digest = hashlib.sha256(f"{self.cfg.shuffle_seed}/{epoch}".encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
            if len(self._permutations) >= 2:  # the current and the previous epoch suffice
                self._permutations.pop(next(iter(self._permutations)))
            self._permutations[epoch] = torch.randperm(self.num_windows, generator=generator)
        return self._permutations[epoch]
