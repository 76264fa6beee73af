"""The fleet view of incidents: three real bundles (the emulator on the small workload: two nodes with the same
warp-periodic exponent-bit rule, one with another bit) loaded into one study database, and `signature_groups`
grouping them by node and incident; each bundle's signature shows the rule's period 32 and its flipped bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis import queries
from replay.bundle_reproduce import VERDICTS
from replay.bundle_reproduce import main as reproduce_main
from sdc.cli import main
from tests.replay.incident_support import stuck_bit

SITE = "layers.1.feed_forward"


def warp_rule(bit: int) -> str:
    """Bit ``bit`` of 8 elements, 32 apart (one lane of each of 8 warps), of the forward matmul of
    layers.1.feed_forward's last linear (w2, whose result is the site's output) at step 3: a stuck unit."""
    return stuck_bit(SITE + ".w2", step=3, bit=bit, elements=8, stride=32)


NODES = {"node-a": (27, 0), "node-b": (27, 1), "node-c": (25, 0)}  # label -> (bit, fault seed)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from faults import load_profile
    from jobs.record import record_run
    from tests.support import small_config

    root = tmp_path_factory.mktemp("fleet")
    config = small_config("run.checkpoint_every=2")
    record_run(config, root / "golden", node_label="golden", progress=False)
    found = {"root": root}
    for label, (bit, seed) in NODES.items():
        (root / f"bit{bit}.toml").write_text(warp_rule(bit), encoding="utf-8")
        record_run(
            config,
            root / label,
            node_label=label,
            progress=False,
            fault_profile=load_profile(root / f"bit{bit}.toml"),
            fault_seed=seed,
        )
        found[label] = root / f"INC-{label}"
        assert (
            main(
                [
                    "incident",
                    "--golden",
                    str(root / "golden"),
                    "--suspect",
                    str(root / label),
                    "--out",
                    str(found[label]),
                ]
            )
            == 0
        )
    return found


@pytest.mark.slow
def test_a_warp_periodic_rule_shows_period_32_and_its_bit(bundles: dict[str, Path]) -> None:
    for label, (bit, _) in NODES.items():
        manifest = json.loads((bundles[label] / "manifest.json").read_text())
        site = manifest["site"]
        assert (site["step"], site["microbatch"], site["name"], site["phase"]) == (3, 0, SITE, "forward")
        assert manifest["suspect"]["node_label"] == label
        (fault,) = manifest["faults"]
        (sig,) = manifest["signatures"]
        assert fault["site"] == SITE + ".w2" and fault["detail"]["bits"] == [bit] * 8
        assert sig["differing"] == 8 and sig["bits"] == {str(bit): 8} and sig["fields"]["exponent"] == 8
        assert sig["period"] == 32 and sig["offset"] == fault["index"][0] % 32
        assert sig["positions"] == fault["index"] and sig["op"] == "aten.mm.default"


@pytest.mark.slow
def test_signature_groups_count_nodes_and_incidents(bundles: dict[str, Path], tmp_path: Path, capsys) -> None:
    db = tmp_path / "study.duckdb"
    a, b, c = (bundles[label] for label in NODES)
    # node-a's bundle is reproduced twice here: plain torch (transient) and under its rule (persistent here)
    assert reproduce_main(["--repeats", "2", "--machine", "node-a"], a) == VERDICTS["transient"]
    assert (
        main(
            [
                "incident",
                "reproduce",
                str(a),
                "--fault-profile",
                str(bundles["root"] / "bit27.toml"),
                "--repeats",
                "2",
                "--machine",
                "node-a",
            ]
        )
        == VERDICTS["persistent here"]
    )
    capsys.readouterr()
    assert main(["incident", "load", str(a), str(b), "--db", str(db)]) == 0
    assert main(["incident", "load", str(c), str(a), "--db", str(db)]) == 0  # a again: its rows replaced, not doubled
    assert "2 verdict(s)" in capsys.readouterr().out
    rows = queries.run(db, "signature_groups").records()
    assert [(r["top_bit"], r["period"], r["nodes"], r["incidents"], r["node_labels"]) for r in rows] == [
        (27, 32, 2, 2, ["node-a", "node-b"]),
        (25, 32, 1, 1, ["node-c"]),
    ]
    first = rows[0]
    assert (first["op"], first["dtype"], first["shape_class"], first["first_step"], first["sites"]) == (
        "aten.mm.default",
        "float32",
        "2x32x128",
        3,
        [SITE],
    )
    assert first["reproductions"] == 2 and first["persistent_machines"] == []  # persistent only under emulation
    verdicts = queries.run(db, "SELECT machine, verdict, emulated FROM incident_verdicts ORDER BY unix").rows
    assert verdicts == [("node-a", "transient", None), ("node-a", "persistent here", "bit27")]
