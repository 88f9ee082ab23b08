"""``fastpipe memory SPEC``: the loader's memory (per worker, shared, pinned), its shared-memory budget, and copy-on-read growth named.

Exit code 1 when the loader would not fit its shared memory (the warning says why and how to fix it; nothing is run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fastpipe.commands.common import add_workload_arguments, check_output_paths, resolve_device, toy_options
from fastpipe.errors import ConfigError

EXIT_DOES_NOT_FIT = 1


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "memory", help="measure the loader's memory per worker and in /dev/shm; check its budget; name copy-on-read growth"
    )
    add_workload_arguments(parser)
    parser.add_argument("--samples", type=int, default=None, help="samples to read (default 2000, at least the batches in flight plus two)")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between memory samples (default 0.1)")
    parser.add_argument("--force", action="store_true", help="measure even when the budget check says the loader will not fit")
    parser.add_argument("--json", type=Path, default=None, help="write the measurement and findings as JSON here")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fastpipe.diagnosis.memory._copy_on_read import name_copy_on_read
    from fastpipe.diagnosis.memory._loader import measure_loader_memory
    from fastpipe.workloads._workload import load_workload

    check_output_paths(args)  # before any work: a bad path is one line now, not a traceback at the end
    if args.samples is not None and args.samples < 1:
        raise ConfigError(f"--samples must be >= 1. Got {args.samples}")
    if args.interval <= 0:
        raise ConfigError(f"--interval must be > 0. Got {args.interval}")
    device = resolve_device(args.device, args.spec)
    workload = load_workload(args.spec, device, **toy_options(args))
    memory = measure_loader_memory(
        workload.loader,
        samples=args.samples,
        device=device,
        interval_s=args.interval,
        check=not args.force,
        on_warning=lambda text: print(f"fastpipe: warning: {text}", file=sys.stderr),
    )
    finding = None if memory.skipped else name_copy_on_read(workload.loader.dataset, memory.growth_per_1000, memory.grows)
    print(memory.to_table())
    if finding is not None:
        print("\n".join(finding.lines()))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"workload": workload.name, "memory": memory.to_dict(), "copy_on_read": None if finding is None else finding.to_dict()}
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return EXIT_DOES_NOT_FIT if memory.skipped else 0
