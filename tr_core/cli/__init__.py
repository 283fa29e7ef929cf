"""The command line, `token-recycling` or `python -m tr_core`: generate, bench and profile, with shared options."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import bench, generate, profile


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand, named as the user started it (`python -m tr_core` or the console script)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    parser = argparse.ArgumentParser(prog="python -m tr_core" if name in ("", "__main__.py", "-c") else name,
                                     description="Token Recycling speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (generate, bench, profile):
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    return args.func(args)
