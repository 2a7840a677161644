"""One verdict for a distributed job (`lint --group ranks`): a finding that appears on many ranks' traces is
reported once, "on K of N ranks", with the spread of its impact and the ranks where it is missing; the job
summary gives the step time per rank, so that a straggler shows."""

from __future__ import annotations

import statistics
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from attntrace.model.identity import RANK_IN_NAME
from attntrace.report import SEVERITY_RANK, TraceReport, sort_key

if TYPE_CHECKING:
    from attntrace.model import Trace

SLOWEST_SHOWN = 3
# A world size past this is no job's (the largest run on about 100,000 GPUs): the ranks without a trace are
# listed one by one, and 2**62 of them took all the memory of the machine.
MAX_WORLD_SIZE = 2**20


def identity(trace: Trace) -> dict[str, Any]:
    """Where the trace stands in its job: rank and world size from Kineto's `distributedInfo`, else the rank
    in the file name (rank3.pt.trace.json), and its step times for the per-rank spread."""
    info = trace.meta.distributed or {}
    rank, world_size, source = info.get("rank"), info.get("world_size"), "distributedInfo"
    known_size = _is_count(world_size, MAX_WORLD_SIZE + 1) and world_size > 0
    # A distributedInfo rank past its own world size is no rank of that job: the file name may still give one.
    if not _is_count(rank, world_size if known_size else 2**63):
        match = RANK_IN_NAME.search(PurePath(trace.path).name)
        named = int(match.group(1)) if match else None
        rank, source = (named, "name") if _is_count(named, 2**63) else (None, None)
    step_us = trace.step_table["step_us"].to_list() if trace.has_step_markers else []
    return {"rank": rank, "world_size": world_size if known_size else None, "rank_from": source,
            "step_us": [round(float(us), 3) for us in step_us]}


def _is_count(value: Any, limit: int) -> bool:
    """A whole number from 0 up to (not including) limit: what a rank or a world size can be."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit


def is_one_job(reports: list[TraceReport]) -> bool:
    """Two or more traces that each know their rank, with no rank twice and one world size."""
    ranks = [r.job.get("rank") for r in reports]
    sizes = {r.job.get("world_size") for r in reports} - {None}
    return len(reports) >= 2 and None not in ranks and len(set(ranks)) == len(ranks) and len(sizes) <= 1


def spans(ranks: list[int]) -> str:
    """0, 1, 2, 5, 7, 8 as '0-2, 5, 7-8': a list of 1,000 ranks stays readable."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


def group(report: dict[str, Any], results: list[Any], mode: str) -> dict[str, Any]:
    """The report with findings and skipped rules merged across ranks and a `job` section, when `mode` is
    "ranks", or "auto" and the traces are one job's ranks; otherwise the report as it is. Traces keep their
    own entries (each rank's summary stays in the JSON)."""
    reports = [r for r in results if isinstance(r, TraceReport)]
    if mode == "none" or not reports or (mode == "auto" and not is_one_job(reports)):
        return report
    rank_of, guessed = _ranks(reports)
    all_ranks = sorted(rank_of.values())

    members: dict[str, list[dict[str, Any]]] = {}
    for finding in report["findings"]:
        # The same problem on every rank: one identity (rule and names), each rank's trace its own fingerprint.
        members.setdefault(finding.get("identity") or finding["fingerprint"], []).append(finding)
    findings = []
    for same in members.values():
        same.sort(key=lambda f: rank_of[f["trace"]])
        on = sorted({rank_of[f["trace"]] for f in same})
        missing = sorted(set(all_ranks) - set(on))
        impact_us = [f["impact"]["gpu_us_per_step"] for f in same]
        shares = [f["impact"]["share_of_step"] for f in same]
        worst = max(same, key=lambda f: (f["impact"]["gpu_us_per_step"], -rank_of[f["trace"]]))
        where = f"on {len(on)} of {len(all_ranks)} ranks" + (f" (missing on {spans(missing)})" if missing else "")
        grouped = {**same[0], "message": f"{same[0]['message']} [{where}]",
                   "impact": {**same[0]["impact"], "gpu_us_per_step": _spread(impact_us)["median"],
                              "share_of_step": _spread(shares)["median"]},
                   "ranks": {"on": len(on), "of": len(all_ranks), "missing": missing,
                             "gpu_us_per_step": _spread(impact_us), "share_of_step": _spread(shares),
                             "worst_rank": rank_of[worst["trace"]]}}
        findings.append(grouped)
    findings.sort(key=sort_key)

    skipped: dict[tuple[str, str], dict[str, Any]] = {}
    for skip in report["skipped"]:
        entry = skipped.setdefault((skip["rule"], skip["reason"]), {**skip, "ranks": 0})
        entry["ranks"] += 1

    per_rank = []
    for r in reports:
        steps = r.job.get("step_us") or []
        per_rank.append({"rank": rank_of[r.path], "trace": r.path, "steps": len(steps),
                         "step_us": _spread(steps) if steps else None})
    per_rank.sort(key=lambda row: row["rank"])
    timed = [row for row in per_rank if row["step_us"]]
    slowest = sorted(timed, key=lambda row: (-row["step_us"]["median"], row["rank"]))[:SLOWEST_SHOWN]
    world_sizes = {r.job.get("world_size") for r in reports} - {None}
    world_size = world_sizes.pop() if len(world_sizes) == 1 else None
    sources = sorted({r.job["rank_from"] for r in reports if r.path not in guessed} - {None})
    job = {
        "ranks": len(all_ranks),
        "rank_from": ", ".join(sources + (["input order"] if guessed else [])),
        "world_size": world_size,
        "ranks_without_trace": (sorted(set(range(world_size)) - set(all_ranks)) if world_size and not guessed
                                else []),
        # Ranks numbered here: their trace had no rank of its own, or one that another trace had first.
        "ranks_from_input_order": sorted(rank_of[path] for path in guessed),
        # Ranks whose trace has no steps to time: the spread above does not see them.
        "ranks_without_steps": [row["rank"] for row in per_rank if not row["step_us"]],
        "unreadable": [t["path"] for t in report["traces"] if t["error"]],
        "step_us": _spread([row["step_us"]["median"] for row in timed]) if timed else None,
        "slowest_ranks": [{"rank": row["rank"], "trace": row["trace"], "step_us": row["step_us"]["median"]}
                          for row in slowest],
        "per_rank": per_rank,
    }
    counts = {s: sum(1 for f in findings if f["severity"] == s) for s in SEVERITY_RANK}
    return {**report, "findings": findings, "skipped": list(skipped.values()), "job": job,
            "summary": {**report["summary"], "findings": counts}}


def _ranks(reports: list[TraceReport]) -> tuple[dict[str, int], set[str]]:
    """Each trace's rank: its own (distributedInfo or file name) where no earlier trace took it, else the lowest
    number no trace has, in input order; and the traces numbered so. (All of them were numbered by input order
    when one rank was unknown: the file named rank 3, the straggler, was reported as rank 0.)"""
    taken: set[int] = set()
    rank_of: dict[str, int] = {}
    for r in reports:
        rank = r.job.get("rank")
        if rank is not None and rank not in taken:
            rank_of[r.path] = rank
            taken.add(rank)
    guessed = [r.path for r in reports if r.path not in rank_of]
    free = (n for n in range(len(reports) + len(taken) + 1) if n not in taken)
    rank_of.update(zip(guessed, free, strict=False))
    return rank_of, set(guessed)


def render_job(job: dict[str, Any]) -> list[str]:
    """The job summary as text lines, for the terminal report."""
    size = job["world_size"]
    of_size = ("" if not size else f" of world size {size}" if job["ranks"] <= size
               else f", more than its world size of {size}")
    lines = [f"job: {job['ranks']} ranks{of_size} (rank from {job['rank_from']})"]
    if job["ranks_without_trace"]:
        lines.append(f"  ranks without a trace: {spans(job['ranks_without_trace'])}")
    if job.get("ranks_from_input_order"):
        lines.append(f"  ranks numbered by input order (no rank of their own, or one taken): "
                     f"{spans(job['ranks_from_input_order'])}")
    if job["unreadable"]:
        lines.append(f"  unreadable: {len(job['unreadable'])} trace(s)")
    if job.get("ranks_without_steps"):
        lines.append(f"  ranks without step markers, not in the step times: {spans(job['ranks_without_steps'])}")
    if job["step_us"]:
        spread = job["step_us"]
        lines.append(f"  step time per rank (median of its steps): min {spread['min'] / 1000:.3f} ms, "
                     f"median {spread['median'] / 1000:.3f} ms, max {spread['max'] / 1000:.3f} ms")
        slow = ", ".join(f"rank {row['rank']} {row['step_us'] / 1000:.3f} ms" for row in job["slowest_ranks"])
        lines.append(f"  slowest: {slow}")
    return lines
