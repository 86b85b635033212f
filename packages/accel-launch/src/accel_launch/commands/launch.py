"""``accel launch``: read the config, merge the flags over it, run the plan."""

from __future__ import annotations

import argparse
import sys

from accel_launch.config.files import load_config
from accel_launch.plan import LaunchPlan, build_plan


def prepare_launch(args: argparse.Namespace) -> LaunchPlan:
    """Load the config named by ``args.config_file`` (or the default one) and build the plan.

    Warnings about the config file are printed to stderr; notes too, unless ``--quiet``.
    """
    warnings: list[str] = []
    config, location = load_config(args.config_file, warnings=warnings)
    quiet = bool(getattr(args, "quiet", False))
    for line in warnings:
        print(f"accel launch: warning: {line}", file=sys.stderr)
    if location.note and not quiet:
        print(f"accel launch: {location.note}", file=sys.stderr)
    plan = build_plan(args, config if location.path is not None else None)
    if not quiet:
        for note in plan.notes:
            print(f"accel launch: note: {note}", file=sys.stderr)
    return plan


def launch_command(args: argparse.Namespace) -> int:
    """Run ``accel launch``; return the job's exit code."""
    from accel_launch.runners import run_plan

    return run_plan(prepare_launch(args))
