#!/usr/bin/env python
"""Replay golden EATTA traces through eatta's public API and report every field.

Usage: python tools/replay_golden.py TRACE.pt [TRACE.pt ...]
Exits 1 if any field of any trace misses its tolerance (FORMAT.md: indices and history exact,
floats within 1e-5 relative + 1e-6 absolute).
"""

from __future__ import annotations

import argparse
import sys

from eatta.golden import replay_trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="golden trace files (.pt)")
    args = parser.parse_args(argv)
    failed = False
    for path in args.traces:
        report = replay_trace(path)
        print(f"{path}: {report.steps} steps, {'PASS' if report.ok else 'FAIL'}")
        print(f"  {'field':<18} {'kind':<6} {'worst err/tol':>14} {'at step':>8} {'failures':>9}")
        for f in report.fields.values():
            kind = "exact" if f.exact else "float"
            ratio = "-" if f.exact else f"{f.worst_ratio:.3g}"
            print(f"  {f.name:<18} {kind:<6} {ratio:>14} {f.worst_step:>8} {f.failures:>9}")
        failed |= not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
