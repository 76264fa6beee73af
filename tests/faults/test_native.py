"""faults' native kernel (faults/native.cpp) against Python alone: the emulator's gate gives the same faults to
the bit, on real training with every kind of rule, while it keeps the calls no draw hits away from Python; the
scope's node labels are the same."""

from __future__ import annotations

import gc
import warnings
import weakref
from contextlib import nullcontext
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from faults import FaultEmulator, FaultProfile, emulator, load_profile, scope
from faults.abft import AbftChecker
from faults.native_kernel import NATIVE
from tests.support import small_config
from tracer import kernel
from tracer.errors import TraceWarning
from tracer.intercept import Interceptor
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.protocol import run_step
from workload.reference import build

# A rule with no site pattern, one with a pattern (the gate reads its modules off the scope's stack) and a
# persistent one, on the families the small workload runs; rates that hit a few times a step.
MIXED = """
seed = 5
[[fault]]
ops = ["elementwise"]
p_call = 0.004
kind = "bitflip"
bits = "mantissa"
[[fault]]
ops = ["reduction", "elementwise"]
sites = 'layers\\.0\\..*'
p_call = 0.02
kind = "scale"
factor = [0.5, 4.0]
[[fault]]
ops = ["matmul", "softmax"]
p_call = 0.01
persistent = true
elements = 2
kind = "stuck"
value = 3.0
"""


@pytest.fixture(scope="module")
def gate() -> ModuleType:
    built = kernel.load(NATIVE)
    if built is None:
        pytest.skip(
            f"faults' native kernel is not built here ({kernel.build_dir(NATIVE)}): `python -m faults.native_kernel`"
        )
    return built


def use(monkeypatch: pytest.MonkeyPatch, module: ModuleType | None) -> None:
    """Emulators and scopes made from now on use ``module`` (None: Python alone)."""
    monkeypatch.setattr(scope, "_native_state", [module])


class Counted(FaultEmulator):
    """The emulator, counting the calls that reach its Python side."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.seen = 0

    def intercept(self, func, args, kwargs, call):  # noqa: ANN001, ANN201
        self.seen += 1
        return super().intercept(func, args, kwargs, call)


def train(
    tmp_path: Path, name: str, profile: FaultProfile, *, steps: int = 3, abft: bool = False, attempts: int = 1
) -> tuple[list[dict], list[torch.Tensor], int]:
    """Train the small workload (two microbatches) under the emulator, and the checker entered second when
    ``abft``; each step ``attempts`` times, as the guard re-runs one. The faults logged, the final parameters, and
    the calls the emulator's Python side saw."""
    cfg = small_config("data.microbatches=2")
    w = build(cfg)
    faults: list[dict] = []
    attempt = [0]
    with Tracer(w.model, w.optimizer, out=tmp_path / name, run=RunInfo(name, config=cfg.to_dict())) as tracer:

        def clock() -> tuple[int, int, int]:
            return tracer.step_index, tracer.microbatch_index, attempt[0]

        def sink(kind: str, fields: dict) -> None:
            if kind == "fault":
                faults.append(fields | {"step": tracer.step_index, "attempt": attempt[0]})

        emulated = Counted(profile, w.model, clock=clock, sink=sink, seed=2)
        checker = AbftChecker(w.model, clock=clock, sink=lambda kind, fields: None) if abft else None
        with emulated, checker if checker is not None else nullcontext():
            for step in range(steps):
                for attempt[0] in range(attempts):
                    with tracer.step(step):
                        run_step(w, step, tracer)
    return faults, [p.detach().clone() for p in w.model.parameters()], emulated.seen


@pytest.mark.slow
@pytest.mark.parametrize("abft", [False, True], ids=["alone", "under-abft"])
def test_the_gate_gives_the_python_kernels_faults_bit_for_bit(
    gate, monkeypatch, tmp_path: Path, write_profile, abft: bool
) -> None:
    """Under the checker the matmuls go through both interceptors' Python kernels and the rest through the
    gate, drawing from one generator in call order."""
    profile = write_profile(MIXED)
    use(monkeypatch, None)
    expected, python_params, _ = train(tmp_path, "python", profile, abft=abft)
    use(monkeypatch, gate)
    got, gate_params, _ = train(tmp_path, "gate", profile, abft=abft)
    assert got == expected
    assert {f["op"].split(".")[1] for f in got} >= {"mm", "mul", "add"} and len({f["step"] for f in got}) == 3
    assert {f["kind"] for f in got} == {"bitflip", "scale", "stuck"}
    assert {f["phase"] for f in got if f["kind"] == "scale"} == {"forward", "backward"}  # the patterned rule
    assert all(torch.equal(a, b) for a, b in zip(gate_params, python_params))


def test_a_rerun_draws_what_the_python_kernel_draws(gate, monkeypatch, tmp_path: Path, write_profile) -> None:
    """Attempts 1 and 2 of a step (the guard's re-runs) draw in Python, attempt 0 in the gate."""
    profile = write_profile(MIXED)
    use(monkeypatch, None)
    expected, _, _ = train(tmp_path, "python", profile, steps=1, attempts=3)
    use(monkeypatch, gate)
    got, _, _ = train(tmp_path, "gate", profile, steps=1, attempts=3)
    assert got == expected and {f["attempt"] for f in got} == {0, 1, 2}


PATTERNED_MISSES = """
[[fault]]
ops = ["elementwise", "reduction"]
sites = 'layers\\.1\\..*'
p_call = 0.0
kind = "bitflip"
"""


@pytest.mark.parametrize("name", ["healthy-node", "patterned"])
def test_calls_no_draw_hits_stay_out_of_python(gate, monkeypatch, tmp_path: Path, write_profile, name: str) -> None:
    """healthy-node: every op of five families makes its draw, none hits; a rule with a site pattern draws inside
    the modules it matches, forward and backward. Python sees a step's first call in each microbatch (to arm the
    rules) and one call per refill of the pre-drawn draws."""
    profile = load_profile(name) if name == "healthy-node" else write_profile(PATTERNED_MISSES)
    use(monkeypatch, None)
    _, python_params, every = train(tmp_path, "python", profile, steps=2)
    use(monkeypatch, gate)
    faults, gate_params, seen = train(tmp_path, "gate", profile, steps=2)
    assert not faults and all(torch.equal(a, b) for a, b in zip(gate_params, python_params))
    assert every > 500 and seen <= 2 * 2 * (1 + every // (4 * emulator.PREDRAWN) + 1), (seen, every)


def ops_of_every_argument_kind(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Calls whose arguments a Python kernel receives in every form: dtypes, layouts, devices and memory formats
    (ints on the C++ stack), kwarg-only scalars, None, int lists, an out= tensor, in-place results, and ops with
    several results."""
    out = torch.empty_like(x)
    torch.add(x, y, alpha=2, out=out)
    values, indices = torch.max(x, dim=1)
    var, mean = torch.var_mean(x, dim=[0, 1], correction=0, keepdim=True)
    return [
        torch.sum(x, dim=0, dtype=torch.float64),
        x.to(torch.float64, memory_format=torch.preserve_format),
        x.clone(memory_format=torch.contiguous_format),
        torch.clamp(x, min=None, max=0.5),
        x.clone().mul_(y),
        out,
        values,
        indices,
        var,
        mean,
        torch.softmax(x, -1),
    ]


def test_calls_handed_to_python_keep_every_argument(gate, monkeypatch, write_profile) -> None:
    """Every call hits (p_call 1), so every one crosses from the gate's C++ stack into Python and back."""
    profile = write_profile(
        '[[fault]]\nops = ["elementwise", "reduction", "softmax", "clone", "_to_copy"]\n'
        'p_call = 1.0\nelements = 1\nkind = "stuck"\nvalue = 0.25\n'
    )
    model = nn.Linear(1, 1)  # the forward phase comes from grad mode; the model only names sites
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    y = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    results = {}
    for name, module in (("python", None), ("gate", gate)):
        use(monkeypatch, module)
        log: list[dict] = []
        with FaultEmulator(profile, model, clock=lambda: (0, 0), sink=lambda k, f, log=log: log.append(f)):
            results[name] = (ops_of_every_argument_kind(x, y), log)
    (expected, expected_log), (got, got_log) = results["python"], results["gate"]
    assert got_log == expected_log and len(got_log) >= 10
    assert {f["op"] for f in got_log} >= {
        "aten.add.out",
        "aten.max.dim",
        "aten.var_mean.correction",
        "aten.sum.dim_IntList",
        "aten._to_copy.default",
        "aten.clone.default",
        "aten.clamp.default",
        "aten.mul_.Tensor",
        "aten._softmax.default",
    }
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_without_the_gate_python_decides_and_says_so_once(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(kernel.DIR_ENV, str(tmp_path / "nothing-built-here"))
    monkeypatch.setattr(scope, "_native_state", [])
    model = nn.Linear(3, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with FaultEmulator(load_profile("healthy-node"), model, clock=lambda: (0, 0), sink=lambda k, f: None):
                model(torch.ones(2, 3))
    notes = [w for w in caught if issubclass(w.category, TraceWarning)]
    assert len(notes) == 1 and "python -m faults.native_kernel" in str(notes[0].message)
    assert emulator.emulator_implementation() == "python"


def test_the_environment_forces_python_without_a_warning(monkeypatch) -> None:
    monkeypatch.setenv(scope.NATIVE_ENV, "torch")
    monkeypatch.setattr(scope, "_native_state", [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert emulator.emulator_implementation() == "python"


class Matmuls(Interceptor):
    """A second interceptor naming ``mm``: while it is active, mm calls run both interceptors' Python kernels."""

    ops = frozenset({torch.ops.aten.mm})


def test_a_second_interceptor_on_an_op_takes_it_through_python_until_it_leaves(gate, monkeypatch) -> None:
    use(monkeypatch, gate)
    model = nn.Sequential(nn.Linear(4, 4, bias=False))
    x = torch.randn(3, 4, requires_grad=True)
    with Counted(load_profile("healthy-node"), model, clock=lambda: (0, 0), sink=lambda k, f: None) as emulated:
        model(x).sum().backward()  # arms the rules: the first call only
        alone = emulated.seen
        with Matmuls():
            model(x).sum().backward()
        shared = emulated.seen - alone
        model(x).sum().backward()
        after = emulated.seen - alone - shared
    assert alone == 1 and shared == 3 and after == 0  # mm: forward, and the input's and weight's gradients


def labels(model: nn.Module, x: torch.Tensor) -> list[tuple[str, tuple[str, ...]]]:
    """Every autograd node of a forward under the scope, in a fixed walk from the loss: (its kind, its label)."""
    named = [(path, m) for path, m in model.named_modules() if path]
    with scope.ModuleScope(named):
        loss = model(x).square().sum()
    out, todo, seen = [], [loss.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        out.append((type(node).__name__, node.metadata.get("sdctrace.scope")))
        todo.extend(n for n, _ in node.next_functions)
    return out


def test_the_native_labels_are_the_pythons(gate, monkeypatch) -> None:
    """Nested modules, a module called twice, and a node reachable from two modules' outputs."""
    torch.manual_seed(0)
    shared = nn.Linear(6, 6)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), shared), shared, nn.Sequential(nn.Linear(6, 2)))
    x = torch.randn(3, 4)
    use(monkeypatch, None)
    expected = labels(model, x)
    use(monkeypatch, gate)
    got = labels(model, x)
    assert got == expected
    assert ("AddmmBackward0", ("0", "0.0")) in got and sum(1 for _, at in got if at == ("0", "0.2")) >= 1


def test_an_emulator_with_its_gate_is_collected_after_use(gate, monkeypatch) -> None:
    """The gate is opaque to the garbage collector: a reference from it back to the emulator would keep the
    emulator, and the model its scope holds, alive for good."""
    use(monkeypatch, gate)
    model = nn.Linear(3, 3)
    emulated = FaultEmulator(load_profile("healthy-node"), model, clock=lambda: (0, 0), sink=lambda k, f: None)
    with emulated:
        model(torch.ones(2, 3)).sum().backward()
    gone = weakref.ref(emulated)
    del emulated
    gc.collect()
    assert gone() is None
