#!/usr/bin/env bash
# Makes docs/lint-report.png and docs/run-report.png from the sample traces (needs the html extra and Debian's
# chromium). Run from the repository root: bash docs/screenshots.sh
set -euo pipefail
work=$(mktemp -d)
.venv/bin/attntrace lint sample_traces/bf16_causal_fwd/naive.pt.trace.json.gz \
  sample_traces/bf16_causal_fwd/sdpa_math.pt.trace.json.gz --format html -o "$work/lint.html" --fail-on never
# run's report.html, from the run.json and traces that `attntrace run --out bf16_causal_fwd` wrote on an H200.
cp -r sample_traces/bf16_causal_fwd "$work/run"
.venv/bin/python -c "import sys, orjson; from pathlib import Path; from attntrace.api import write_run_report
out = Path(sys.argv[1]); write_run_report(out, orjson.loads((out / 'run.json').read_bytes()))" "$work/run"
shoot() {
  chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
    --disable-sync --no-first-run --user-data-dir="$(mktemp -d)" --hide-scrollbars --window-size=1200,"$3" \
    --screenshot="$2" "$1" 2>/dev/null
}
shoot "$work/lint.html" docs/lint-report.png 1250
shoot "$work/run/report.html" docs/run-report.png 1500
rm -rf "$work"
