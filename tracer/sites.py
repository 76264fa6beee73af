"""Which submodules of a model are traced sites.

The reference study compared each block's attention and feed-forward submodule,
so those are the defaults, found by structure and by name: the repeated blocks
(the children of an ``nn.ModuleList``, ``nn.Sequential`` or ``nn.ModuleDict`` of one class, such as
``encoder.layer.N``, ``h.N``, ``layers.N``) and in each block the children that
hold the attention (``attention``, ``attn``, ``self_attn``, ``crossattention``,
``multihead_attn``, an ``nn.MultiheadAttention``) and the feed-forward (``mlp``,
``ffn``, ``feed_forward``, a mixture of experts; in a block without one, the
children with parameters that are neither attention nor a norm, dropout or
embedding: BERT's ``intermediate`` and ``output``, ``nn.TransformerEncoderLayer``'s
``linear1`` and ``linear2``). A block whose parts sit in one list of their own,
T5's ``layer``, gives that list's children: ``layer.0`` (attention) and ``layer.1``
(``T5LayerFF``). Any ``N.attention``/``N.mlp``-style path is a site too, and a
model with none of these falls back to class names. Users override
with a regex over module paths or an explicit list of modules.

Paths are those of the model as written: the wrappers that training stacks put
around it, ``DistributedDataParallel``'s ``module``, FSDP's
``_fsdp_wrapped_module`` and ``torch.compile``'s ``_orig_mod``, are left out of
every site and parameter name (`named_modules`, `named_parameters`), so a wrapped
and an unwrapped run pair. ``module`` is left out only where DDP put it, at the top.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence

from torch import nn

from tracer.errors import ConfigError
from tracer.torch_internals import compiled_module_type

DEFAULT_NAME_PATTERN = r"(^|\.)\d+\.(attention|attn|self_attn|self_attention|feed_forward|mlp|ffn)$"
DEFAULT_CLASS_PATTERN = r"(Attention|MLP|FeedForward|FFN)$"
_ATTENTION = re.compile(r"att(n|ention)", re.IGNORECASE)  # a block child's name or class
_FEED_FORWARD = re.compile(r"mlp|ffn|feed_?forward|moe|expert", re.IGNORECASE)
_NOT_A_SITE = re.compile(r"Norm|Dropout|Embedding")  # classes of block children that are never sites

SiteSpec = str | Sequence[nn.Module] | None
_BLOCK_LISTS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)  # what holds a model's repeated blocks

# Segments only wrappers use: left out wherever they occur (a block compiled alone, FSDP's nested units).
_WRAPPER_SEGMENTS = ("_orig_mod", "_fsdp_wrapped_module")
_SEGMENTS = re.compile(r"(?:^|(?<=\.))(?:_orig_mod|_fsdp_wrapped_module)(?:\.|$)")


def wrappers(model: nn.Module) -> tuple[str, ...]:
    """The wrapper attributes at the top of ``model``, outermost first: ``("module",)`` under DDP,
    ``("_orig_mod", "module")`` for a compiled DDP model, ``()`` for a plain one."""
    chain: list[str] = []
    while (attr := _wrapper_attribute(model)) is not None:
        chain.append(attr)
        model = getattr(model, attr)
    return tuple(chain)


def _wrapper_attribute(m: nn.Module) -> str | None:
    if isinstance(m, nn.parallel.DistributedDataParallel):
        return "module"
    # No instance of these can exist before its module is imported: no import here.
    compiled, fsdp = compiled_module_type(), sys.modules.get("torch.distributed.fsdp")
    if compiled is not None and isinstance(m, compiled):
        return "_orig_mod"
    if fsdp is not None and isinstance(m, fsdp.FullyShardedDataParallel):
        return "_fsdp_wrapped_module"
    return None


def module_path(name: str, top: Sequence[str] = ()) -> str:
    """``name`` without the wrapper attributes ``top`` (`wrappers`) at its start and without
    ``_orig_mod``/``_fsdp_wrapped_module`` segments: ``module._orig_mod.h.0.attn`` -> ``h.0.attn``."""
    prefix = ".".join(top)
    if prefix and (name == prefix or name.startswith(prefix + ".")):
        name = name[len(prefix) + 1 :]
    return _SEGMENTS.sub("", name).rstrip(".") if any(w in name for w in _WRAPPER_SEGMENTS) else name


def named_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``model.named_modules()`` under the names of the model as written (`module_path`), the root left out; where
    a wrapper and what it wraps get one name (an FSDP unit around ``h.0``), the wrapper, which is called first."""
    top = wrappers(model)
    named: dict[str, nn.Module] = {}
    for n, m in model.named_modules():
        named.setdefault(module_path(n, top), m)
    named.pop("", None)
    return list(named.items())


def named_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``model.named_parameters()`` under the names of the model as written (`module_path`)."""
    top = wrappers(model)
    return [(module_path(n, top), p) for n, p in model.named_parameters()]


def stripped_wrappers(model: nn.Module) -> list[str]:
    """The wrapper attributes `module_path` leaves out of this model's names, in the order first met: what the run
    header records (``extra.wrappers``)."""
    found = dict.fromkeys(wrappers(model))
    for name, _ in model.named_modules():
        found.update(dict.fromkeys(s for s in name.split(".") if s in _WRAPPER_SEGMENTS))
    return list(found)


def find_sites(model: nn.Module, spec: SiteSpec = None) -> list[tuple[str, nn.Module]]:
    """Resolve ``spec`` to ``(path, module)`` pairs in the model's registration order.

    The one place a site pattern is compiled and matched: the Tracer matches once per model, and what else
    needs the sites (the fault emulator, the ABFT checker, replay) takes the matched names (`sites_named`)."""
    named = named_modules(model)
    if spec is None:
        return default_sites(named)
    if isinstance(spec, str):
        try:
            pattern = re.compile(spec)
        except re.error as exc:
            raise ConfigError(f"site pattern {spec!r} is not a valid regular expression: {exc}") from exc
        found = [(n, m) for n, m in named if pattern.fullmatch(n)]
        if not found:
            sample = ", ".join(n for n, _ in named[:8])
            unwrapped = wrappers(model)
            hint = f"; paths leave out the wrapper's {'.'.join(unwrapped)!r}" if unwrapped else ""
            raise ConfigError(
                f"site pattern {spec!r} matches no module path (it must match a whole path such as {sample}{hint})"
            )
        return found
    top = wrappers(model)
    ids = {id(m): p for n, m in model.named_modules() if (p := module_path(n, top))}  # a wrapped module too
    out = []
    for m in spec:
        if id(m) not in ids:
            raise ConfigError(f"site {type(m).__name__} is not a submodule of the traced model")
        out.append((ids[id(m)], m))
    return out


def sites_named(model: nn.Module, names: Iterable[str]) -> list[tuple[str, nn.Module]]:
    """The modules at ``names``, sites matched before (a Tracer's, a log's ``extra.sites``), as ``(path, module)``
    pairs in the model's registration order; no pattern is matched. A name the model lacks is a `ConfigError`."""
    wanted = set(names)
    found = [(n, m) for n, m in named_modules(model) if n in wanted]
    missing = sorted(wanted - {n for n, _ in found})
    if missing:
        raise ConfigError(
            f"{type(model).__name__} has no module {', '.join(map(repr, missing[:4]))}"
            f"{f' (and {len(missing) - 4} more)' if len(missing) > 4 else ''}: the sites were matched on another "
            "model; build the model the sites were recorded on"
        )
    return found


def default_sites(named: Sequence[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Every block's attention and feed-forward (`block_parts`) and every ``N.attention``-style path, in
    registration order; where there are none, the outermost modules whose class is named like one."""
    by_name = [(n, m) for n, m in named if re.search(DEFAULT_NAME_PATTERN, n)]
    taken = {n for n, _ in by_name}
    by_structure = {n for n, _ in block_parts(named) if not _overlaps(n, taken)}
    found = [(n, m) for n, m in named if n in taken or n in by_structure]
    if found:
        return found
    by_class = [(n, m) for n, m in named if re.search(DEFAULT_CLASS_PATTERN, type(m).__name__)]
    return _outermost(by_class)


def blocks(named: Sequence[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """The repeated blocks: children of an ``nn.ModuleList``/``nn.Sequential``/``nn.ModuleDict`` (torchtitan's
    ``layers``) whose children are all of one class with submodules of their own (``h.0``, ``encoder.layer.3``),
    outermost only."""
    found: list[tuple[str, nn.Module]] = []
    for path, m in named:
        if not isinstance(m, _BLOCK_LISTS) or any(path.startswith(b + ".") for b, _ in found):
            continue
        kids = list(m.named_children())
        if kids and len({type(k) for _, k in kids}) == 1 and next(kids[0][1].children(), None) is not None:
            found += [(f"{path}.{name}", k) for name, k in kids]
    return found


def block_parts(named: Sequence[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """In each block that has an attention child, that attention and the feed-forward: the children named or
    classed like an MLP, or, where none is, every other child with parameters that is no norm, dropout or
    embedding (BERT's ``intermediate`` and ``output``, ``nn.TransformerEncoderLayer``'s ``linear1/2``)."""
    out: list[tuple[str, nn.Module]] = []
    for path, block in blocks(named):
        while (attr := _wrapper_attribute(block)) is not None:  # an FSDP unit or a compiled block: what it wraps
            block = getattr(block, attr)
        attention, feed_forward, rest = [], [], []
        for name, child in _parts(block):
            kind = type(child).__name__
            if next(child.parameters(), None) is None or _NOT_A_SITE.search(kind) or "norm" in name.lower():
                continue
            part = (f"{path}.{name}", child)
            if isinstance(child, nn.MultiheadAttention) or _ATTENTION.search(name) or _ATTENTION.search(kind):
                attention.append(part)
            elif _FEED_FORWARD.search(name) or _FEED_FORWARD.search(kind):
                feed_forward.append(part)
            else:
                rest.append(part)
        if attention:
            chosen = {n for n, _ in attention + (feed_forward or rest)}
            out += [(f"{path}.{name}", c) for name, c in _parts(block) if f"{path}.{name}" in chosen]
    return out


def _parts(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """A block's children; where none is an attention and they are one ``nn.ModuleList``/``nn.Sequential`` of
    parts (T5's ``layer``: ``T5LayerSelfAttention``, ``T5LayerFF``), that list's children (``layer.0``)."""
    kids = list(block.named_children())
    if any(_ATTENTION.search(n) or _ATTENTION.search(type(c).__name__) for n, c in kids):
        return kids
    lists = [(n, c) for n, c in kids if isinstance(c, (nn.ModuleList, nn.Sequential))]
    if len(lists) != 1:
        return kids
    (name, parts), *_ = lists
    return [(n, c) for n, c in kids if c is not parts] + [(f"{name}.{k}", c) for k, c in parts.named_children()]


def _overlaps(path: str, others: Iterable[str]) -> bool:
    return any(path == o or path.startswith(o + ".") or o.startswith(path + ".") for o in others)


def describe_sites(paths: Sequence[str]) -> list[str]:
    """Site paths in a few lines: ``layer.{0..11}.{attention,intermediate,output}``, one per group of blocks
    with the same parts; paths without a block index as they are."""
    groups: dict[str, dict[str, list[int]]] = {}  # head -> tail -> block indices; a path alone: path -> {}
    for p in paths:
        m = re.fullmatch(r"(?:(.*)\.)?(\d+)\.([^.]+)", p)
        if m is None:
            groups.setdefault(p, {})
            continue
        head = f"{m[1]}." if m[1] is not None else ""
        groups.setdefault(head, {}).setdefault(m[3], []).append(int(m[2]))
    lines = []
    for head, tails in groups.items():
        if not tails:
            lines.append(head)
            continue
        by_indices: dict[tuple[int, ...], list[str]] = {}
        for tail, indices in tails.items():
            by_indices.setdefault(tuple(indices), []).append(tail)
        for shared, names in by_indices.items():
            parts = names[0] if len(names) == 1 else "{" + ",".join(names) + "}"
            lines.append(f"{head}{_indices(shared)}.{parts}")
    return lines


def _indices(indices: Sequence[int]) -> str:
    if len(indices) == 1:
        return str(indices[0])
    if list(indices) == list(range(indices[0], indices[0] + len(indices))):
        return f"{{{indices[0]}..{indices[-1]}}}"
    return "{" + ",".join(map(str, indices)) + "}"


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
    named = named_modules(model)
    for path, m in named[: lines - 1]:
        rows.append(f"{'  ' * (path.count('.') + 1)}{path} {type(m).__name__}")
    if len(named) > lines - 1:
        rows.append(f"  ... and {len(named) - (lines - 1)} more modules")
    return "\n".join(rows)


def no_default_sites(model: nn.Module) -> str:
    """Why a model has no default sites, and how to choose some: the error a Tracer raises."""
    weighted = [n for n, m in named_modules(model) if list(m.parameters(recurse=False))]
    example = "|".join(re.escape(n) for n in weighted[:2]) or ".*"
    return (
        f"the Tracer found no default sites in {type(model).__name__} (no attention or MLP submodule of a "
        f"numbered block, by path or class name): pass TraceOptions(sites=...) a regex over the module paths "
        f'below (e.g. sites=r"{example}") or a list of modules, or TraceOptions(activations=False) to trace '
        f"only gradients and parameters. The model's modules:\n{module_tree(model)}"
    )


def sites_said(paths: Sequence[str], *, defaults: bool, wrappers: Sequence[str] = ()) -> str:
    """The traced sites in a few lines, said once, so that a part of the model left out is seen at the start;
    ``defaults``: found by the default rule rather than chosen, ``wrappers``: those left out of the names."""
    chosen = "the defaults" if defaults else "as chosen"
    left_out = f"; names leave out the wrappers' {', '.join(wrappers)}" if wrappers else ""
    lines = "".join(f"\n  {line}" for line in describe_sites(paths))
    return (
        f"sdctrace: tracing {len(paths)} sites ({chosen}: TraceOptions(sites=...) or sdc record --sites "
        f"to change them{left_out}):{lines}"
    )
