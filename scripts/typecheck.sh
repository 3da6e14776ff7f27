#!/usr/bin/env bash
# mypy over the `spectrace` package. The package maps top-level folders (tracer/, hooks/, tui/,
# engine/) to `spectrace.*` and api/ to `spectrace` itself (pyproject's package-dir), which
# mypy cannot follow: build the same tree from symlinks under build/typecheck and check it
# as `-p spectrace`. MYPY names the mypy to run (default: .venv/bin/mypy).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T=build/typecheck
rm -rf "$T/spectrace" && mkdir -p "$T/spectrace"
for d in tracer hooks tui engine; do ln -s "$ROOT/$d" "$T/spectrace/$d"; done
for f in "$ROOT"/api/*.py; do ln -s "$f" "$T/spectrace/"; done
cd "$T"
exec "${MYPY:-$ROOT/.venv/bin/mypy}" --config-file "$ROOT/pyproject.toml" --cache-dir "$ROOT/build/mypy_cache" -p spectrace "$@"
