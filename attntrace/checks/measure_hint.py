"""The command that measures a finding's alternatives at the trace's own shapes (`attntrace run --from-trace`),
added to the fix of the attention rules (AT102, AT202, AT203) whose saving it can measure."""

from __future__ import annotations

import shlex
from typing import Any

from attntrace.checks.base import Context


def point_to_measurement(ctx: Context, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings, each fix ending with the command, when the trace recorded shapes (without them there is
    nothing to size a measurement by)."""
    if not findings or not ctx.trace.has_shapes:
        return findings
    command = f"attntrace run --from-trace {shlex.quote(ctx.trace.path)}"
    for finding in findings:
        finding["fix"] = (f"{finding['fix'].rstrip()} Measure the alternatives at this trace's shapes on your GPU: "
                          f"`{command}` (`lint --measured DIR/run.json` then uses the measured saving).")
    return findings
