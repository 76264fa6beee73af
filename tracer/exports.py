"""A package's public names, imported from their modules on first use (PEP 562), so importing the package is cheap.

A training process imports `tracer` before anything else; the modules behind its names import torch and more.
Each public package (``tracer``, ``faults``, ``replay``, ``workload``) lists its names once per defining module:

    if TYPE_CHECKING:                      # what type checkers and IDEs read
        from tracer.tracing import Tracer
    else:                                  # what runs: Tracer is imported when first asked for
        __getattr__, __dir__ = lazy_exports(__name__, {"tracer.tracing": ("Tracer",)})

tests/test_public_api.py checks that the two lists agree with each other and with the package's ``__all__``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, modules: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` that resolve each name from the module listed for it.

    A resolved name is stored in the package, so the next lookup is an ordinary attribute. An unknown name raises
    AttributeError, which lets ``from package import submodule`` fall back to importing the submodule.
    """
    owner: dict[str, str] = {}
    for module, names in modules.items():
        for name in names:
            if name in owner:
                raise ValueError(f"{package}: {name!r} is exported from both {owner[name]} and {module}")
            owner[name] = module

    def __getattr__(name: str) -> Any:
        module = owner.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(owner))

    return __getattr__, __dir__
