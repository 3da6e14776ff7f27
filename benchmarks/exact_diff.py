"""Byte-exactness check of ``spectrace diff``: this tree's output against a baseline tree's.

Runs ``spectrace diff`` with ``--format json``, ``--format text`` and ``--format json
--by-request`` on every pair given, once with this environment's spectrace and once with
the checkout at ``--base`` (through ``exact/run_tree.py``), and compares stdout bytes and
exit codes. A pair is a directory holding ``ours/`` and ``theirs/`` (trace files, in name
order: what ``exact/hook/sitecustomize.py`` dumps from a test run) or ``ours.h5`` and
``theirs.h5`` (``synth.py`` / ``bench_diff.py`` pairs), or ``FILE_A:FILE_B``.

Usage: ``python benchmarks/exact_diff.py --base /path/to/baseline/checkout PAIR...``.
Prints one line per difference and a summary; exit status 1 when any output differs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
FORMATS = (("--format", "json"), ("--format", "text"), ("--format", "json", "--by-request"))


def sides(spec: str) -> tuple[list[str], list[str]] | None:
    """The ours and theirs file lists of one pair spec, or None when it is not a pair."""
    if ":" in spec and not Path(spec).is_dir():
        a, b = spec.split(":", 1)
        return [a], [b]
    d = Path(spec)
    if (d / "ours").is_dir():
        return tuple(  # type: ignore[return-value]
            sorted(str(p) for p in (d / s).iterdir() if p.is_file()) for s in ("ours", "theirs")
        )
    if (d / "ours.h5").exists():
        return [str(d / "ours.h5")], [str(d / "theirs.h5")]
    return None


def run(cmd: list[str]) -> tuple[int, bytes]:
    res = subprocess.run(cmd, capture_output=True, check=False, timeout=1800)
    return res.returncode, res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the baseline checkout (its root)")
    ap.add_argument("--json-only", action="store_true", help="compare --format json only")
    ap.add_argument("--extra", default="", help="more diff arguments, e.g. '--positions 0:400'")
    ap.add_argument("pairs", nargs="+")
    args = ap.parse_args()
    formats = FORMATS[:1] if args.json_only else FORMATS
    new = [str(Path(sys.executable).parent / "spectrace")]
    old = [sys.executable, str(HERE / "exact" / "run_tree.py"), args.base]
    checked = differ = 0
    for spec in args.pairs:
        s = sides(spec)
        if s is None:
            print(f"skip {spec}: not a pair", file=sys.stderr)
            continue
        a, b = s
        if len(a) != 1 or len(b) != 1:
            print(f"skip {spec}: multi-file sides", file=sys.stderr)
            continue
        for fmt in formats:
            argv = ["diff", a[0], b[0], *fmt, *args.extra.split()]
            (rc_o, out_o), (rc_n, out_n) = run(old + argv), run(new + argv)
            checked += 1
            if rc_o != rc_n or out_o != out_n:
                differ += 1
                print(
                    f"DIFFERS {spec} {' '.join(fmt)}: rc {rc_o} vs {rc_n}, "
                    f"{len(out_o)} vs {len(out_n)} bytes",
                    flush=True,
                )
        print(f"ok-so-far {checked - differ}/{checked} ({spec})", file=sys.stderr, flush=True)
    print(f"{checked} outputs compared, {differ} differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
