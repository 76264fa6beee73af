"""Which submodules of a model are traced sites.

The reference study compared each block's attention and feed-forward submodule,
so those are the defaults, found by name first (``layers.3.attention``,
``h.0.mlp``, ...) and by class name as a fallback. Users override with a regex
over module paths or an explicit list of modules.

Paths are those of the model as written: ``torch.compile`` wraps a model as
``_orig_mod``, and those segments are left out of every site and parameter name
(`module_path`), so a compiled and an eager run pair.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torch import nn

from tracer.errors import ConfigError

DEFAULT_NAME_PATTERN = r"(^|\.)\d+\.(attention|attn|self_attn|self_attention|feed_forward|mlp|ffn)$"
DEFAULT_CLASS_PATTERN = r"(Attention|MLP|FeedForward|FFN)$"

SiteSpec = str | Sequence[nn.Module] | None


_COMPILED = re.compile(r"(?:^|(?<=\.))_orig_mod(?:\.|$)")


def module_path(name: str) -> str:
    """``name`` without torch.compile's ``_orig_mod`` segments: ``_orig_mod.h.0.attn`` -> ``h.0.attn``."""
    return _COMPILED.sub("", name).rstrip(".") if "_orig_mod" in name else name


def find_sites(model: nn.Module, spec: SiteSpec = None) -> list[tuple[str, nn.Module]]:
    """Resolve ``spec`` to ``(path, module)`` pairs in the model's registration order."""
    named = [(p, m) for n, m in model.named_modules() if (p := module_path(n))]
    if spec is None:
        by_name = [(n, m) for n, m in named if re.search(DEFAULT_NAME_PATTERN, n)]
        if by_name:
            return by_name
        by_class = [(n, m) for n, m in named if re.search(DEFAULT_CLASS_PATTERN, type(m).__name__)]
        return _outermost(by_class)
    if isinstance(spec, str):
        try:
            pattern = re.compile(spec)
        except re.error as exc:
            raise ConfigError(f"site pattern {spec!r} is not a valid regular expression: {exc}") from exc
        found = [(n, m) for n, m in named if pattern.fullmatch(n)]
        if not found:
            sample = ", ".join(n for n, _ in named[:8])
            raise ConfigError(
                f"site pattern {spec!r} matches no module path (it must match a whole path such as {sample})"
            )
        return found
    ids = {id(m): n for n, m in named}
    out = []
    for m in spec:
        if id(m) not in ids:
            raise ConfigError(f"site {type(m).__name__} is not a submodule of the traced model")
        out.append((ids[id(m)], m))
    return out


def _outermost(pairs: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Drop matches nested inside another match (an MLP inside an Attention, say)."""
    keep: list[tuple[str, nn.Module]] = []
    for n, m in pairs:
        if not any(n.startswith(k + ".") for k, _ in keep):
            keep.append((n, m))
    return keep


def module_tree(model: nn.Module, lines: int = 8) -> str:
    """The top of the model's module tree, one indented ``path ClassName`` per line, for error messages."""
    rows = [f"{type(model).__name__}"]
    named = [(p, m) for n, m in model.named_modules() if (p := module_path(n))]
    for path, m in named[: lines - 1]:
        rows.append(f"{'  ' * (path.count('.') + 1)}{path} {type(m).__name__}")
    if len(named) > lines - 1:
        rows.append(f"  ... and {len(named) - (lines - 1)} more modules")
    return "\n".join(rows)
