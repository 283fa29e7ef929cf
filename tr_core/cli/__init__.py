"""The command line, `token-recycling` or `python -m tr_core`: generate, bench and profile, with shared options."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import bench, generate, profile


def program_name() -> str:
    """How the user started this program: the console script's name or `python -m tr_core` (argv[0] __main__.py)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return "python -m tr_core" if name in ("", "__main__.py", "-c") else name


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog=program_name(), description="Token Recycling speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    generate.register(sub)
    bench.register(sub)
    profile.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)
