"""``sdc incident``: a divergence turned into a bundle for the hardware vendor, and its reproduction.

    sdc incident --golden G --suspect S --out INC [--at STEP:MB:SITE:forward]    # capture, write the bundle
    sdc incident reproduce INC [--fault-profile P --fault-seed N] [--repeats N]  # its verdict on this machine
    sdc incident load INC [INC ...] --db study.duckdb    # signatures and verdicts into the study database

The command parses its arguments, builds the `IncidentRequest` and prints what the incident job (jobs/incident.py)
returns: the site, the defect signature of each output that differs, and how to reproduce it (docs/incident.md).
``load`` reads bundles (analysis/incident_signatures.py) into the tables `incident_signatures` and
`incident_verdicts`, which the query `signature_groups` groups across incidents and nodes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sdc.commands import Command
from sdc.commands._common import seed
from tracer.errors import UsageError


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Rebuild the golden state at the pair's first divergence (or --at) from the nearest checkpoint, record "
            "the site's forward (inputs, parameters, RNG state, aten op sequence, output) and the suspect's output "
            "of it on the same inputs (lockstep, under the suspect's fault emulator when it is emulated), and write "
            "a bundle: tensors.safetensors, manifest.json (with the defect signature) and reproduce.py, which needs "
            "only torch. `sdc incident reproduce BUNDLE` runs the reproduction here, under an emulated fault "
            "profile if given: transient (exit 0), persistent here (4), nondeterministic (5), unexplained (6), "
            "and appends its verdict to the bundle's verdicts.jsonl. `sdc incident load BUNDLE... --db DB` puts "
            'bundles\' signatures and verdicts in a study database (docs/incident.md, "Fleet view").'
        ),
    )
    p.add_argument("--golden", type=Path, metavar="RUN", help="the healthy run (with checkpoints)")
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--suspect", type=Path, metavar="RUN", help="the suspect node's recorded run (pairs with --golden)"
    )
    who.add_argument(
        "--fault-profile",
        metavar="PROFILE",
        help="emulate the suspect with this fault profile (needs --at); with `reproduce`: run the "
        "reproduction under it",
    )
    p.add_argument("--fault-seed", type=seed, default=0, metavar="S", help="seed for --fault-profile (default 0)")
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="the bundle's folder: new, empty, or a bundle sdctrace wrote (with --overwrite)",
    )
    p.add_argument(
        "--at",
        metavar="STEP:MB:SITE:PHASE",
        help="the site to capture (default: the first divergence of --golden and --suspect); forward only",
    )
    p.add_argument(
        "--workload", metavar="MODULE:FACTORY", help="the factory that rebuilds the golden run (as for `sdc replay`)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a bundle already in --out")
    actions = p.add_subparsers(dest="action", metavar="{reproduce,load}")
    r = actions.add_parser(
        "reproduce",
        help="run a bundle's reproduction on this machine and print its verdict",
        description="Run the bundle's op sequence --repeats times here (as its reproduce.py does), "
        "under --fault-profile's emulator when given (each run a later attempt of the incident's "
        "step), and print the verdict; the exit code is the verdict's (reproduce.py's docstring).",
    )
    r.add_argument("bundle", type=Path, metavar="BUNDLE", help="the folder `sdc incident` wrote")
    r.add_argument(
        "--fault-profile",
        dest="reproduce_profile",
        metavar="PROFILE",
        help="run under this emulated fault profile (a shipped name or a TOML path)",
    )
    r.add_argument(
        "--fault-seed",
        dest="reproduce_seed",
        type=seed,
        default=0,
        metavar="S",
        help="seed for --fault-profile (default 0)",
    )
    r.add_argument("--repeats", type=int, default=5, metavar="N", help="identical runs (default 5)")
    r.add_argument(
        "--device",
        dest="reproduce_device",
        metavar="DEVICE",
        help="where to run (default: the device the bundle was captured on)",
    )
    r.add_argument("--json", action="store_true", help="print the result as JSON")
    r.add_argument(
        "--machine",
        metavar="NAME",
        help="the name the bundle's verdicts.jsonl gives this machine (default: its host name)",
    )
    r.add_argument("--no-record", action="store_true", help="do not append the verdict to the bundle's verdicts.jsonl")
    ld = actions.add_parser(
        "load",
        help="load bundles' defect signatures and verdicts into a study database",
        description="Read each bundle's manifest.json (its defect signatures) and verdicts.jsonl "
        "(the reproductions run so far) into --db's tables incident_signatures and "
        "incident_verdicts (a bundle loaded again: its signature rows replaced, its new verdicts "
        "added); `sdc query signature_groups --db DB` groups them across incidents and nodes "
        "(analysis/SCHEMA.md).",
    )
    ld.add_argument("bundles", type=Path, nargs="+", metavar="BUNDLE", help="folders `sdc incident` wrote")
    ld.add_argument(
        "--db",
        dest="load_db",
        type=Path,
        required=True,
        metavar="DB",
        help="the study database (a new path, or one `sdc diff` wrote)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.action in ("reproduce", "load"):
        if args.golden is not None or args.suspect is not None or args.out is not None or args.at is not None:
            raise UsageError(
                f"`sdc incident {args.action}` takes bundles alone (its options after the word "
                f"{args.action}); --golden, --suspect, --out and --at are for a capture"
            )
        return _reproduce(args) if args.action == "reproduce" else _load(args)
    from jobs.incident import IncidentRequest, incident
    from jobs.replay import golden_header
    from replay.capture import SiteKey
    from replay.request import suspect_from_profile, suspect_from_run

    if args.golden is None or args.out is None or (args.suspect is None and args.fault_profile is None):
        raise UsageError(
            "give --golden RUN, --suspect RUN (or --fault-profile P with --at) and --out DIR, "
            "or `sdc incident reproduce BUNDLE`"
        )
    golden = golden_header(args.golden)
    if args.suspect is not None:
        suspect = suspect_from_run(args.suspect, golden, args.golden)
    else:
        suspect = suspect_from_profile(args.fault_profile, args.fault_seed)
    at = SiteKey.parse(args.at) if args.at is not None else None
    manifest = incident(IncidentRequest(args.golden, args.out, suspect, at, args.workload, args.overwrite))
    site = manifest["site"]
    print(
        f"incident at step {site['step']}, microbatch {site['microbatch']}, {site['phase']} {site['name']} "
        f"({manifest['module']}, {len(manifest['ops'])} aten ops, rebuilt from checkpoint {manifest['checkpoint']})"
    )
    if not manifest["suspect"]["inputs_were_golden"]:
        print(
            "  note: the suspect's site did not see the golden inputs bit for bit (an op outside every site "
            "differed before it)"
        )
    if not manifest["golden_reexecution_matched_log"]:
        print(
            "  note: re-executing golden here gave other bits at this site than golden's log: the site may not be "
            "deterministic here (reproduce.py's repeats tell; `sdc verify-determinism` audits the whole step)"
        )
    if manifest["golden_reexecution_differed_after"]:
        print(
            f"  note: re-executing golden here differed from its log after this site, first at "
            f"{manifest['golden_reexecution_differed_after']}: the bundle holds nothing computed after the site, "
            "but the step may not be deterministic here (`sdc verify-determinism` audits it)"
        )
    if manifest["generators"]["drawn_afresh"]:
        print(
            f"  note: {manifest['generators']['drawn_afresh']} op(s) draw from a generator the model seeds anew on "
            "each run (golden's and the suspect's seeds differ): reproduce.py draws them anew too, so its runs vary "
            "as the model's do"
        )
    if manifest["suspect"]["output_from"] == "this machine":
        print("  note: the suspect plays no emulated fault: its output here is this machine's")
    from replay.signature import describe_json

    for sig in manifest["signatures"]:
        print(f"  output {sig['output']}: " + describe_json(sig).replace("\n", "\n  "))
    if not manifest["signatures"]:
        print("  the golden and suspect outputs are bit-identical here")
    print(f"bundle -> {args.out}\nnext: python {args.out / 'reproduce.py'}   (on the suspect and on a healthy machine)")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from faults import load_profile
    from jobs.incident import reproduce_bundle
    from replay.bundle_check import VERDICTS_FILE, BundleError
    from replay.bundle_reproduce import describe, record_verdict

    profile = load_profile(args.reproduce_profile) if args.reproduce_profile else None
    try:
        result = reproduce_bundle(
            args.bundle, profile, fault_seed=args.reproduce_seed, repeats=args.repeats, device=args.reproduce_device
        )
    except BundleError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(result) if args.json else describe(result))
    if not args.no_record:
        try:
            record_verdict(args.bundle, result, args.machine)
        except OSError as exc:
            print(f"note: the verdict was not added to {args.bundle / VERDICTS_FILE} ({exc})", file=sys.stderr)
    return result["exit_code"]


def _load(args: argparse.Namespace) -> int:
    from analysis.incident_signatures import load_incidents
    from tracer.printable import printable

    loaded = load_incidents(args.load_db, args.bundles)
    for incident in loaded:
        print(
            printable(f"{incident.bundle}: {incident.node_label}, step {incident.step} {incident.site}: ")
            + f"{len(incident.signatures)} signature(s), {len(incident.verdicts)} verdict(s)"
        )
    print(f"-> {args.load_db}; next: sdc query signature_groups --db {args.load_db}")
    return 0
