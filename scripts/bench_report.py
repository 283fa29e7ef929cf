#!/usr/bin/env python3
"""Render a `python -m tr_core bench --json` file again: markdown tables to stdout, optionally the HTML report.

Used for GPU runs (plotly is not installed on the GPU machine): `python3 scripts/bench_report.py gpu_bench.json
--html bench/gpu_report.html`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tr_core.bench.bench import format_header, format_tables, write_html  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("json_file")
    p.add_argument("--html", default=None, help="also write the self-contained plotly report here")
    args = p.parse_args()
    try:
        result = json.loads(Path(args.json_file).read_text(encoding="utf-8"))
        result["methods"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        print(f"error: {args.json_file}: not a bench JSON file ({exc})", file=sys.stderr)
        return 2
    print(format_header(result))
    print()
    print(format_tables(result))
    if args.html:
        write_html(result, args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
