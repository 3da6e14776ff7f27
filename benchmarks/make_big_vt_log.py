"""A big ``VT_SPEC_TRACE`` log for the import benchmark: a log repeated with new request ids.

Every repetition of the source log (default: the bundled ``traces/reference.vt.log``, 697
lines) renames its request ids ``req=X`` to ``req=rN.X`` (N the repetition), so the output is
one long run of distinct requests with the source's line families in the source's proportions.
The matching requests JSONL is written beside it when the source has one
(``reference.requests.jsonl``), renamed the same way.

Usage: ``python benchmarks/make_big_vt_log.py OUT.vt.log [--lines 1050000] [--source LOG]
[--requests REQ.jsonl]``. Prints the lines written; deterministic.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
_REQ = re.compile(r"\breq=(\S+)")


def make_log(out: Path, lines: int, source: Path, requests: Path | None) -> int:
    """Write ``out`` (and ``out`` with ``.requests.jsonl`` when ``requests`` is given);
    returns the number of log lines written (whole repetitions, at least ``lines``)."""
    src = source.read_text(encoding="utf-8").splitlines()
    reps = max(1, -(-lines // len(src)))
    # One template per repetition: {n} replaced by the repetition number.
    template = "\n".join(_REQ.sub(lambda m: f"req=r{{n}}.{m.group(1)}", s) for s in src)
    template = template.replace("{", "{{").replace("}", "}}").replace("{{n}}", "{n}") + "\n"
    with out.open("w", encoding="utf-8") as fh:
        for n in range(reps):
            fh.write(template.format(n=n))
    if requests is not None:
        recs = [json.loads(s) for s in requests.read_text(encoding="utf-8").splitlines() if s]
        req_out = out.with_name(out.name.removesuffix(".vt.log") + ".requests.jsonl")
        with req_out.open("w", encoding="utf-8") as fh:
            for n in range(reps):
                for r in recs:
                    fh.write(json.dumps({**r, "req_id": f"r{n}.{r['req_id']}"}) + "\n")
    return reps * len(src)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--lines", type=int, default=1_050_000)
    ap.add_argument("--source", type=Path, default=ROOT / "traces" / "reference.vt.log")
    ap.add_argument("--requests", type=Path, default=ROOT / "traces" / "reference.requests.jsonl")
    a = ap.parse_args()
    n = make_log(a.out, a.lines, a.source, a.requests if a.requests.exists() else None)
    print(f"{a.out}: {n} lines")


if __name__ == "__main__":
    main()
