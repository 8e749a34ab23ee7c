"""``autoresearch health``: this machine's GPUs, checked now; ``--slurm-hc`` for Slurm's HealthCheckProgram.

Plain mode prints a table of the GPUs and the findings (exit 0 healthy, 1 unhealthy).
``--slurm-hc`` prints nothing on a healthy node and one reason line on an unhealthy one,
exiting 1; with ``--drain`` the node drains itself in Slurm with that reason. Slurm's
slurm.conf::

    HealthCheckProgram=/usr/local/bin/autoresearch-hc   # a wrapper: exec autoresearch health --slurm-hc --drain
    HealthCheckInterval=300

``AUTORESEARCH_NVML_FAKE=/path/state.json`` checks a recorded state instead of the driver.
Argparse only at import time (every ``autoresearch`` call imports this module).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    h = sub.add_parser("health", help="check this machine's GPUs now (NVML); --slurm-hc for Slurm's health program",
                       description="Check this machine's GPUs (ECC, Xid, retired pages, row remapping, thermal and "
                                   "power throttling, persistence, driver) with the thresholds of the home's "
                                   "config.yaml health: section. Exit 0 healthy, 1 unhealthy.")
    h.add_argument("--slurm-hc", action="store_true",
                   help="Slurm HealthCheckProgram mode: silent when healthy, one reason line and exit 1 when not")
    h.add_argument("--drain", action="store_true", help="on an unhealthy node, drain it in Slurm (scontrol) "
                                                        "with the reason; resume a node this program drained "
                                                        "itself once it passes (soft causes, after the cool-down)")
    h.add_argument("--expect-gpus", type=int, metavar="N", help="the node must have N GPUs (fewer is a fault)")
    h.add_argument("--json", action="store_true", help="print the GPUs and findings as JSON")
    h.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autoresearch.api import local_health

    view = local_health(args.home, drain=args.drain, expect_gpus=args.expect_gpus)
    if args.json:
        from autoresearch.cli._render import print_json

        print_json(view)
    elif args.slurm_hc:
        if not view.healthy:
            print(f"autoresearch health: {view.node}: {view.reason}")
        if view.action:
            print(view.action)
    else:
        from autoresearch.cli._render import render_health

        render_health(view)
    return 0 if view.healthy else 1
