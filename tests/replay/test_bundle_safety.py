"""A bundle is data from elsewhere: no name in it runs code, and a bundle whose files or fields do not fit together
is refused in one line, never given a verdict. Both readers are checked: the installed `sdc incident reproduce`
(in this process, so a library it loaded would run its constructor here) and the bundle's own reproduce.py (in a
fresh, isolated interpreter)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from replay.bundle_check import op_of
from replay.bundle_reproduce import USAGE_ERROR, VERDICTS
from sdc.cli import main
from tests.replay.bundle_craft import edit_manifest, flip_byte, small_bundle, swap_for
from tests.replay.incident_support import reproduce_py

# Names a manifest can hold that reach something other than a torch operator by walking attributes.
HOSTILE_OP_NAMES = [
    "load_library.__self__.load_library",  # torch.ops.load_library: loads a shared library
    "aten.__self__.load_library",
    "prims.__self__.load_library",
    "ops.load_library.load_library",
    "classes.load_library.x",
    "_ops.load_library.x",
    "aten.__class__.__init__",
    "aten.__dict__.load_library",
    "aten.name.upper",
    "aten._dir.append",
    "aten.add.__call__",
    "aten.add._op",
    "aten.add.overloads",
    "aten.add.Tensor.__call__",
    "aten.from_file.default",
    "mkldnn._is_mkldnn_acl_supported.default",
    "profiler._record_function_enter.default",
    "aten.mm",
    "aten..default",
    " aten.mm.default",
    "aten.mm.default ",
    "ATEN.mm.default",
    "aten.mm.nosuch",
    "aten.nosuch.default",
    "torch.load.x",
    "builtins.exec.x",
    "",
]


def _shared_library(tmp_path: Path) -> tuple[Path, Path]:
    """A shared library whose constructor writes a marker file; (library, marker)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the test's shared library")
    marker = tmp_path / "constructor-ran"
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void ran(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}\n}}\n'
    )
    library = tmp_path / "libevil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library, marker


def _sdc_reproduce(bundle: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["incident", "reproduce", str(bundle), "--no-record", "--repeats", "2", *extra])
    captured = capsys.readouterr()
    return code, captured.err.strip()


def test_a_bundle_as_written_reproduces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = small_bundle(tmp_path / "INC")
    assert _sdc_reproduce(bundle, capsys)[0] == VERDICTS["transient"]
    plain = reproduce_py(bundle, repeats=2)
    assert plain.returncode == VERDICTS["transient"], plain.stderr


@pytest.mark.slow  # compiles a shared library with gcc and runs the reproducer three times
def test_no_op_name_loads_a_shared_library(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    library, marker = _shared_library(tmp_path)
    bundle = small_bundle(tmp_path / "INC")
    for name in HOSTILE_OP_NAMES:
        edit_manifest(bundle, lambda m, name=name: m["ops"][0].update(op=name, args=[str(library)], kwargs={}))
        code, err = _sdc_reproduce(bundle, capsys)
        assert code == 1 and err.count("\n") == 0 and "ops[0]" in err, (name, code, err)
        assert not marker.exists(), f"{name!r} loaded the library under sdc incident reproduce"
    # the bundle's own reproduce.py (as written by this sdctrace), on the name that once loaded the library
    for name in HOSTILE_OP_NAMES[:3]:
        edit_manifest(bundle, lambda m, name=name: m["ops"][0].update(op=name, args=[str(library)], kwargs={}))
        done = reproduce_py(bundle, repeats=1)
        assert done.returncode == USAGE_ERROR and done.stderr.count("\n") == 1, (name, done.stderr)
        assert not marker.exists(), f"{name!r} loaded the library under reproduce.py"


@pytest.mark.parametrize("name", ["aten.mm.default", "aten._to_copy.default", "aten.add.Tensor", "prims.log.default"])
def test_torch_operators_resolve_through_the_registry(name: str) -> None:
    namespace, packet, overload = name.split(".")
    import torch

    assert op_of(name) is getattr(getattr(getattr(torch.ops, namespace), packet), overload)


@pytest.mark.parametrize("kind", ["dtype", "layout", "memory_format"])
@pytest.mark.parametrize("value", ["load", "ops", "__class__", "Tensor", "float33", ""])
def test_torch_names_resolve_to_objects_of_their_kind_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, value: str
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    edit_manifest(bundle, lambda m: m["ops"][0]["kwargs"].update(x={kind: value}))
    code, err = _sdc_reproduce(bundle, capsys)
    assert code == 1 and f"no {kind} of torch" in err and err.count("\n") == 0, err


def test_tensors_that_do_not_match_their_recorded_hash_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    flip_byte(bundle / "tensors.safetensors", -1)  # an element of the suspect output: once "transient"
    code, err = _sdc_reproduce(bundle, capsys)
    assert code == 1 and "SHA-256" in err and "tensors.safetensors" in err and err.count("\n") == 0, err
    done = reproduce_py(bundle, repeats=1)
    assert done.returncode == USAGE_ERROR and "SHA-256" in done.stderr, done.stderr


@pytest.mark.parametrize("what", ["fifo", "directory", "dev-zero", "missing"])
def test_tensors_that_are_not_a_regular_file_are_refused_without_reading(
    tmp_path: Path, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    swap_for(bundle / "tensors.safetensors", what)
    code, err = _sdc_reproduce(bundle, capsys)
    assert code == 1 and "tensors.safetensors" in err and err.count("\n") == 0, err


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda m: m["ops"][1]["args"].__setitem__(0, {"t": "op.9.0"}), "which neither the bundle holds"),
        (lambda m: m["ops"][1]["results"][0].update(shape=[4, 17]), "made float32[4, 16]"),
        (lambda m: m.update(outputs=["input.0"]), "which is not golden's output"),
        (lambda m: m.update(outputs=["op.0.0"]), "where output_meta records float32[4, 8]"),
        (lambda m: m.update(outputs=["op.4.0", "op.4.0"]), "each output once"),
        (lambda m: m.update(outputs=[]), "each output once"),
        (lambda m: m["ops"][0].update(module="__class__"), "no module path"),
        (lambda m: m["site"].update(name="layers.0.__class__"), "no module path"),
        (lambda m: m["tensors"]["input.0"].update(stride=[1 << 39, 1]), "recorded strides"),
        (lambda m: m["tensors"]["input.0"].update(shape=[4, 9]), "records [4, 9]"),
        (lambda m: m.update(format="sdctrace-incident/0"), "format"),
    ],
)
def test_fields_that_do_not_fit_together_are_refused_before_a_verdict(
    tmp_path: Path, change, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    edit_manifest(bundle, change)
    code, err = _sdc_reproduce(bundle, capsys)
    assert code == 1 and words in err and err.count("\n") == 0, err


@pytest.mark.parametrize("device", ["meta", "nosuch", "cuda:7"])
def test_a_device_this_machine_cannot_use_is_one_line(
    tmp_path: Path, device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    code, err = _sdc_reproduce(bundle, capsys, "--device", device)
    assert code == 1 and f"device {device!r} is not usable here" in err and err.count("\n") == 0, err
    edit_manifest(bundle, lambda m: m.update(device=device))  # where it was captured, as the manifest says
    code, err = _sdc_reproduce(bundle, capsys)
    assert code == 1 and f"device {device!r} is not usable here" in err and err.count("\n") == 0, err


@pytest.mark.parametrize(
    "text", ['{"a": 1, "a": 2}', "[" * 100_000, '{"n": ' + "9" * 5000 + "}", '{"x": NaN}', '{"x": "\\ud800"}', "\xff"]
)
def test_a_manifest_that_is_no_bounded_json_object_is_one_line(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    (bundle / "manifest.json").write_bytes(text.encode("utf-8", "surrogatepass") if text != "\xff" else b"\xff")
    code, err = _sdc_reproduce(bundle, capsys)
    assert code == 1 and "manifest.json" in err and err.count("\n") == 0, err
