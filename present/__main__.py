"""`python -m present replay TRACE.json OUT.html`: a trace saved by `python -m tr_core generate --trace` (or the
studio's download) drawn as one self-contained HTML replay that works offline."""
from __future__ import annotations

import argparse
import sys

from tr_core.trace import Trace, TraceError

from .replay import replay_html


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and write the replay; 0, 1 on an unreadable trace or unwritable file, 2 on usage."""
    parser = argparse.ArgumentParser(prog="python -m present", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    replay = sub.add_parser("replay", help="draw a saved trace as one self-contained HTML replay")
    replay.add_argument("trace", help="a trace JSON file (python -m tr_core generate --trace FILE)")
    replay.add_argument("out", help="the HTML file to write")
    args = parser.parse_args(argv)
    try:
        trace = Trace.load(args.trace)
    except (TraceError, OSError) as exc:
        print(f"error: {args.trace}: {exc}", file=sys.stderr)
        return 1
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(replay_html(trace))
    except OSError as exc:
        print(f"error: cannot write the replay: {exc}", file=sys.stderr)
        return 1
    print(f"replay saved to {args.out} ({len(trace.steps)} steps)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
