"""The attention sites of a trace, for `attntrace run --from-trace`: every attention call the trace ran (SDPA and
its backend, FlexAttention, FlashAttention/xFormers ops, unfused chains as AT102 finds them) with the shapes it
ran at, grouped by signature and ordered by GPU time. No torch: the plan runs where lint runs."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from attntrace.checks import at102_materialized_scores as at102
from attntrace.checks import at202_sdpa_math_fallback as at202
from attntrace.checks import at203_fp32_attention as at203
from attntrace.checks.base import Context
from attntrace.checks.catalog import load_rules
from attntrace.model import Trace
from attntrace.model.summary import SDPA_OPS

SDPA = "aten::scaled_dot_product_attention"
DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64"}
# Third-party fused attention ops (torch.library custom ops): name pattern -> (label, the run variant). Their
# tensors are [batch, seq, heads, head_dim].
THIRD_PARTY = [
    (re.compile(r"^flash_attn::_flash_attn_forward$"), "flash_attn2", "flash_attn2"),
    (re.compile(r"^flash_attn_3::(_flash_attn_forward|fwd)$"), "flash_attn3", "flash_attn3"),
    (re.compile(r"^xformers(_flash3?)?::(efficient_attention_forward\w*|flash_fwd)$"), "xformers", "xformers"),
]
FLEX_KERNEL = re.compile(r"^triton_tem_.*flex_(attention|decoding)")  # the template; pointwise kernels share the name
FLEX = "flex"  # the backward name of a FlexAttention call: its template's backward kernel
# The variant that runs what a site runs, by its SDPA backend (the CPU's flash is plain sdpa there): the
# like-for-like row of a measurement.
CURRENT = {"math": "sdpa_math", "flash": "sdpa_flash", "efficient": "sdpa_efficient", "cudnn": "sdpa_cudnn"}
# (dropout_p, is_causal) argument positions of SDPA's backend ops, as recorded in Concrete Inputs.
BACKEND_ARGS = {"aten::_scaled_dot_product_flash_attention": (3, 4),
                "aten::_scaled_dot_product_flash_attention_for_cpu": (3, 4),
                "aten::_scaled_dot_product_efficient_attention": (5, 6),
                "aten::_scaled_dot_product_cudnn_attention": (5, 6),
                "aten::_scaled_dot_product_attention_math": (4, 5),
                "aten::_flash_attention_forward": (7, 8),
                "aten::_efficient_attention_forward": (8, 9)}
BSHD_OPS = {"aten::_flash_attention_forward", "aten::_efficient_attention_forward"}
REPEAT_LOOK_BACK = 24  # ops before an attention call where Hugging Face's repeat_kv expands k and v


@dataclass
class Call:
    """One attention call in a step: what ran, at which shapes, and the ops (forward and backward) it owns."""
    kind: str  # sdpa, flex, fused (third-party), unfused
    implementation: str
    current: str | None  # the run variant that does the same
    op: int  # the call's first op
    step: int
    q: list[int]  # [batch, heads, queries, head_dim]
    kv_heads: int
    kv_len: int
    dtype: str
    causal: bool
    causal_source: str
    mask: list[int] | None
    dropout: float = 0.0
    enable_gqa: bool = False
    repeat_kv: bool = False
    op_chain: str = ""
    roots: set[int] = field(default_factory=set)  # forward ops whose subtrees are the call
    backward: set[int] = field(default_factory=set)  # backward nodes autograd linked to them
    keys: set[tuple[str, str]] = field(default_factory=set)  # (rule, key) of the findings it is part of
    # The op that runs this call's backward, by name, where no autograd flow links them (a compiled graph's)
    backward_name: str | None = None

    @property
    def decode(self) -> bool:
        return self.q[2] < self.kv_len


def _int_list(text: Any) -> list[int] | None:
    """A recorded int list ('[4, 2, 8, 2048, 64]') as a list."""
    if not isinstance(text, str) or not text.startswith("["):
        return None
    try:
        return [int(x) for x in text.strip("[]").split(",") if x.strip()]
    except ValueError:
        return None


def _dims4(dims: Any) -> list[int] | None:
    if isinstance(dims, list) and all(isinstance(d, int) for d in dims) and len(dims) in (3, 4):
        return dims if len(dims) == 4 else [1, *dims]  # [batch * heads, s, d] as one batch of heads
    return None


def _bhsd(bshd: Any) -> list[int] | None:
    if isinstance(bshd, list) and len(bshd) == 4 and all(isinstance(d, int) for d in bshd):
        return [bshd[0], bshd[2], bshd[1], bshd[3]]
    return None


def _flag(concrete: Any, index: int) -> bool:
    return bool(isinstance(concrete, list) and len(concrete) > index and str(concrete[index]).lower() == "true")


def _number(concrete: Any, index: int) -> float:
    try:
        return float(concrete[index]) if isinstance(concrete, list) and len(concrete) > index else 0.0
    except (TypeError, ValueError):
        return 0.0


def _mask_causal(mask: list[int] | None, q_len: int, kv_len: int) -> tuple[bool, str]:
    """What a mask whose values the trace cannot show most likely is, from its shape."""
    if q_len == 1:
        return False, "one query per sequence sees the whole cache"
    if mask and len(mask) >= 2 and mask[-2] == q_len and mask[-1] == kv_len:
        return True, f"a {q_len}x{kv_len} mask (values not in the trace): assumed causal"
    if mask:
        return False, "a padding mask (one row for every query)"
    return False, "no mask"


class _Finder:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        rules = load_rules()
        self.ctx = Context(trace, rules["AT102"], {p.name: p.default for p in rules["AT102"].parameters.values()},
                           rules["AT102"].severity)
        self.names = trace.op_names
        self.steady = set(trace.steady_steps)
        self.sequence, self.position = at102._thread_sequence(self.ctx)

    def calls(self) -> list[Call]:
        found = self._sdpa() + self._unfused() + self._third_party() + self._flex()
        for call in found:
            self._repeat_kv(call)
        self._link_backward(found)
        self._pair_backward(found)
        return found

    # --- SDPA -------------------------------------------------------------------------------------
    def _sdpa(self) -> list[Call]:
        names, trace = self.names, self.trace
        wanted = [SDPA, *SDPA_OPS]
        rows = trace.ops_stepped.filter(pl.col("step").is_not_null() & pl.col("name").is_in(wanted))
        calls = []
        for op, step in rows.select("idx", "step").iter_rows():
            if step not in self.steady:
                continue
            above = [names[a] for a in trace.op_ancestors(op)[:-1]]
            if any("autograd::engine" in a or a == SDPA or a in SDPA_OPS for a in above):
                continue  # a backend op inside an SDPA call, or the backward replaying it
            backend_op = self._first_below(op, SDPA_OPS) if names[op] == SDPA else op
            backend = SDPA_OPS.get(names[backend_op], "unknown") if backend_op is not None else "unknown"
            dims, types, concrete = trace.op_input(op)
            if not isinstance(dims, list) or len(dims) < 3:
                continue
            q, k = _dims4(dims[0]), _dims4(dims[1])
            if names[op] in BSHD_OPS:  # FlashAttention's and xFormers' own layout; 3-D is variable length
                q, k = (None, None) if len(dims[0]) != 4 else (_bhsd(dims[0]), _bhsd(dims[1]))
            if q is None or k is None or not types:
                continue
            mask = dims[3] if len(dims) > 3 and isinstance(dims[3], list) and dims[3] else None
            if names[op] == SDPA:
                causal, dropout, gqa = _flag(concrete, 5), _number(concrete, 4), _flag(concrete, 7)
            else:  # a backend op called directly (a CausalBias mask does that): its own argument order
                drop_at, causal_at = BACKEND_ARGS.get(names[op], (4, 5))
                causal, dropout, gqa = _flag(concrete, causal_at), _number(concrete, drop_at), False
                if names[op] == "aten::_efficient_attention_forward":  # custom_mask_type: 1 or 2 is causal
                    causal = str(concrete[causal_at] if len(concrete) > causal_at else "0") in ("1", "2")
            if causal:
                source = "is_causal=True"
            else:
                causal, source = _mask_causal(mask, q[2], k[2])
            chain = " > ".join(trace.op_chain(op))
            # The dtype the backend ran: under autocast the SDPA call records the inputs it was given (fp32 where a
            # model upcast q and k, as Hugging Face's rotary embeddings do) and the backend op the cast ones.
            ran = trace.op_input(backend_op)[1] if backend_op is not None and backend_op != op else None
            dtype = str((ran or types)[0])
            call = Call("sdpa", f"sdpa ({backend})", CURRENT.get(backend, "sdpa"), op, step,
                        q, k[1], k[2], DTYPES.get(dtype, dtype), causal, source, mask, dropout, gqa,
                        op_chain=chain, roots={op},
                        backward_name=f"{names[backend_op]}_backward" if backend_op is not None else None)
            if backend == "math":
                math_op = backend_op if backend_op is not None else op
                device = trace.meta.device(trace.devices[0] if trace.devices else None)
                reason, _ = at202._reason(self.ctx, op, math_op, device)
                call.keys.add(("AT202", f"{reason}|{' > '.join(trace.op_chain(math_op))}"))
            calls.append(call)
        return calls

    def _first_below(self, op: int, names: dict[str, str]) -> int | None:
        todo = list(self.trace.op_children.get(op, []))
        while todo:
            child = todo.pop(0)
            if self.names[child] in names:
                return child
            todo.extend(self.trace.op_children.get(child, []))
        return None

    # --- unfused chains ---------------------------------------------------------------------------
    def _unfused(self) -> list[Call]:
        """AT102's chains (S x S scores), and the same chain with fewer queries than keys (decode)."""
        groups, _, _ = at102.unfused_chains(self.ctx, 1)
        calls = []
        seen: set[int] = set()
        for pattern, hits in groups.items():
            for softmax, step, chain, _, _ in hits:
                seen.add(softmax)
                call = self._chain_call(chain, step, softmax)
                if call is not None:
                    call.keys.add(("AT102", pattern))
                    calls.append(call)
        candidates = self.trace.ops_stepped.filter(pl.col("step").is_not_null() & pl.col("name").is_in(
            list(at102.SOFTMAX)))
        for softmax, step in candidates.select("idx", "step").iter_rows():
            if softmax in seen or step not in self.steady:
                continue
            chain = self._decode_chain(softmax)
            if chain is not None:
                call = self._chain_call(chain, step, softmax)
                if call is not None:
                    calls.append(call)
        return calls

    def _decode_chain(self, softmax: int) -> list[int] | None:
        """AT102's chain search for scores of [.., queries, keys] with fewer queries than keys."""
        names = self.names
        if any(SDPA in names[a] or "autograd::engine" in names[a] for a in self.trace.op_ancestors(softmax)):
            return None
        dims, _ = at102._dims(self.ctx, softmax)
        scores = dims[0] if dims and isinstance(dims[0], list) and len(dims[0]) >= 2 else None
        at = self.position.get(softmax)
        if scores is None or at is None or not all(isinstance(d, int) for d in scores[-2:]) \
                or scores[-2] >= scores[-1]:
            return None
        q_len, kv_len = scores[-2:]
        start = end = None
        for i in range(at - 1, max(-1, at - at102.LOOK_BACK), -1):
            op = self.sequence[i]
            pair = at102._operands(self.ctx, op) if names[op] in at102.MATMUL else []
            if len(pair) == 2 and all(isinstance(p, list) for p in pair) and pair[0][-2:-1] == [q_len] \
                    and pair[1][-1:] == [kv_len]:
                start = i
                break
        for i in range(at + 1, min(len(self.sequence), at + at102.LOOK_AHEAD)):
            op = self.sequence[i]
            pair = at102._operands(self.ctx, op) if names[op] in at102.MATMUL else []
            if pair and isinstance(pair[0], list) and pair[0][-2:] == [q_len, kv_len]:
                end = i
                break
        return None if start is None or end is None else self.sequence[start:end + 1]

    def _chain_call(self, chain: list[int], step: int, softmax: int) -> Call | None:
        first = at102._operands(self.ctx, chain[0])
        last = at102._operands(self.ctx, chain[-1])
        if len(first) < 2 or len(last) < 2:
            return None
        q, kt, v = _dims4(first[0]), _dims4(first[1]), _dims4(last[1])
        if q is None or kt is None or v is None:
            return None
        _, types = at102._dims(self.ctx, chain[0])
        kv_len = kt[-1]
        mask = self._chain_mask(chain, softmax, q[2], kv_len)
        if at102._causal_mask_shown(self.ctx, chain, self.sequence, self.position) and q[2] > 1:
            causal, source = True, "a tril/triu mask built in the trace"
        else:
            causal, source = _mask_causal(mask, q[2], kv_len)
        names = [self.names[o] for o in chain]
        return Call("unfused", "eager (unfused)", "naive", chain[0], step, q, v[1], kv_len,
                    DTYPES.get(str(types[0]) if types else "", "unknown"), causal, source, mask,
                    op_chain=" > ".join(names), roots=set(chain))

    def _chain_mask(self, chain: list[int], softmax: int, q_len: int, kv_len: int) -> list[int] | None:
        """The shape of a mask the chain applies: an input of an op between the matmuls over [.., q or 1, kv]
        that is not the scores themselves (boolean, or broadcast over batch or heads)."""
        scores = at102._dims(self.ctx, softmax)[0][:1]
        for op in chain[1:-1]:
            dims, types = at102._dims(self.ctx, op)
            for shape, kind in zip(dims, types, strict=False):
                if isinstance(shape, list) and len(shape) >= 2 and shape[-1] == kv_len \
                        and shape[-2] in (q_len, 1) and (kind == "bool" or [shape] != scores):
                    return shape
        return None

    # --- FlexAttention and third-party kernels ----------------------------------------------------
    def _flex(self) -> list[Call]:
        """Compiled FlexAttention: the Triton template's launch op records the kernel's buffers, q, k, v first."""
        trace = self.trace
        rows = trace.ops_stepped.filter(pl.col("step").is_not_null()
                                        & pl.col("name").str.contains(FLEX_KERNEL.pattern)
                                        & ~pl.col("name").str.contains("backward|bwd"))
        calls = []
        for op, step in rows.select("idx", "step").iter_rows():
            if step not in self.steady:
                continue
            dims, types, _ = trace.op_input(op)
            q, k = (_dims4(dims[0]), _dims4(dims[1])) if isinstance(dims, list) and len(dims) >= 3 else (None, None)
            if q is None or k is None or not types:
                continue
            calls.append(Call("flex", "flex_attention", "flex", op, step, q, k[1], k[2],
                              DTYPES.get(str(types[0]), str(types[0])), q[2] > 1,
                              "FlexAttention's block mask is not in the trace: assumed causal" if q[2] > 1
                              else "one query per sequence sees the whole cache", None,
                              op_chain=" > ".join(trace.op_chain(op)), roots={op}, backward_name=FLEX))
        return calls

    def _third_party(self) -> list[Call]:
        trace, names = self.trace, self.names
        rows = trace.ops_stepped.filter(pl.col("step").is_not_null() & pl.col("name").str.contains("::"))
        calls = []
        for op, name, step in rows.select("idx", "name", "step").iter_rows():
            match = next(((label, variant) for pattern, label, variant in THIRD_PARTY if pattern.match(name)), None)
            if match is None or step not in self.steady:
                continue
            if any("autograd::engine" in names[a] for a in trace.op_ancestors(op)[:-1]):
                continue
            dims, types, concrete = trace.op_input(op)
            if not isinstance(dims, list) or len(dims) < 3 or not types:
                continue
            q, k = _bhsd(dims[0]), _bhsd(dims[1])
            if q is None or k is None:
                continue
            # flash_attn's _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, ...)
            told = match[0] == "flash_attn2" and isinstance(concrete, list) and len(concrete) > 5
            causal = _flag(concrete, 5) if told else q[2] > 1
            source = ("causal argument" if told else "the causal flag is not in the trace: assumed causal"
                      if q[2] > 1 else "one query per sequence sees the whole cache")
            calls.append(Call("fused", match[0], match[1], op, step, q, k[1], k[2],
                              DTYPES.get(str(types[0]), str(types[0])), causal, source, None,
                              dropout=_number(concrete, 3) if told else 0.0,
                              op_chain=" > ".join(trace.op_chain(op)), roots={op}))
        return calls

    # --- repeat_kv and backward -------------------------------------------------------------------
    def _repeat_kv(self, call: Call) -> None:
        """Hugging Face's repeat_kv before the call (expand of [b, kv_heads, 1, s, d] to n_rep, then reshape):
        the real number of k/v heads. Its ops become part of the call: a fused kernel with enable_gqa needs
        none of them."""
        at = self.position.get(call.op)
        if at is None:
            return
        heads = call.q[1]
        for i in range(at - 1, max(-1, at - REPEAT_LOOK_BACK), -1):
            op = self.sequence[i]
            name = self.names[op]
            if name in at102.SOFTMAX or name == SDPA:
                break  # the previous attention call
            if name != "aten::expand":
                continue
            dims, _, concrete = self.trace.op_input(op)
            source = dims[0] if isinstance(dims, list) and dims else None
            size = _int_list(concrete[1]) if isinstance(concrete, list) and len(concrete) > 1 else None
            if isinstance(source, list) and len(source) == 5 and source[2] == 1 and size and len(size) == 5 \
                    and source[1] * size[2] == heads and source[1] < heads:
                call.kv_heads, call.repeat_kv = source[1], True
                after = self.sequence[i:i + 3]  # the expand, then the reshape that copies
                call.roots.update(o for o in after if self.names[o] in ("aten::expand", "aten::reshape"))
        if call.repeat_kv and call.kind == "sdpa" and call.current != "sdpa_math":
            call.current = "sdpa_repeat_kv"  # the default backend after the copy

    def _link_backward(self, calls: list[Call]) -> None:
        """The backward nodes of each call's ops, through the trace's fwdbwd flows (forward op -> node)."""
        flows = self.trace.flows
        if not flows.height or not calls:
            return
        flows = flows.filter(pl.col("cat") == "fwdbwd")
        starts = {i: (tid, ts) for ph, i, tid, ts in flows.select("ph", "id", "tid", "ts").iter_rows() if ph == "s"}
        ends = {i: (tid, ts) for ph, i, tid, ts in flows.select("ph", "id", "tid", "ts").iter_rows() if ph == "f"}
        if not starts:
            return
        ops = self.trace.ops.select("idx", pl.col("tid").cast(pl.String), "ts").sort("ts")
        at: dict[tuple[str, float], int] = {}
        for idx, tid, ts in ops.iter_rows():
            at.setdefault((tid, ts), idx)  # the outermost op starting there
        backward_of: dict[int, list[int]] = defaultdict(list)
        for flow, start in starts.items():
            forward, node = at.get(start), at.get(ends.get(flow, ("", -1.0)))
            if forward is not None and node is not None:
                backward_of[forward].append(node)
        children = self.trace.op_children
        for call in calls:
            todo = list(call.roots)
            while todo:
                op = todo.pop()
                call.backward.update(backward_of.get(op, ()))
                todo.extend(children.get(op, ()))

    def _pair_backward(self, calls: list[Call]) -> None:
        """A compiled graph's backward (torch.compile, FlexAttention) is one autograd node for the whole graph, so
        no flow leads from an attention call to its backward op: pair them by name within a step, the backward
        ops in reverse order of the forward calls (autograd runs them last call first)."""
        unlinked = [call for call in calls if not call.backward and call.backward_name]
        if not unlinked:
            return
        wanted = {call.backward_name for call in unlinked}
        rows = self.trace.ops_stepped.filter(pl.col("step").is_not_null()
                                             & (pl.col("name").is_in(wanted - {FLEX})
                                                | (pl.col("name").str.contains(FLEX_KERNEL.pattern)
                                                   & pl.col("name").str.contains("backward|bwd"))))
        backward: dict[tuple[str, int], list[int]] = defaultdict(list)
        for op, name, step in rows.sort("ts", "idx").select("idx", "name", "step").iter_rows():
            if not any(a in backward.get((FLEX if FLEX_KERNEL.match(name) else name, step), ())
                       for a in self.trace.op_ancestors(op)[:-1]):
                backward[(FLEX if FLEX_KERNEL.match(name) else name, step)].append(op)
        forward: dict[tuple[str, int], list[Call]] = defaultdict(list)
        for call in sorted(unlinked, key=lambda c: c.op):
            forward[(str(call.backward_name), call.step)].append(call)
        for key, group in forward.items():
            for call, op in zip(group, reversed(backward.get(key, [])), strict=False):
                call.backward.add(op)


@dataclass
class Site:
    """Calls of one signature: what a measurement runs once."""
    calls: list[Call]
    steps: int
    gpu_us: float = 0.0
    cpu_us: float = 0.0
    backward_gpu_us: float = 0.0
    kernels: dict[str, float] = field(default_factory=dict)

    @property
    def first(self) -> Call:
        return self.calls[0]

    @property
    def kv_lens(self) -> list[int]:
        return sorted(c.kv_len for c in self.calls)

    @property
    def kv_len(self) -> int:
        """The KV length a measurement runs at: the median of a decode loop's (per-step time grows linearly)."""
        return int(statistics.median_low(self.kv_lens))

    def as_dict(self) -> dict[str, Any]:
        c = self.first
        lens = self.kv_lens
        decode = c.decode
        return {
            "kind": c.kind, "implementation": c.implementation, "current_variant": c.current,
            "q": c.q, "kv_heads": c.kv_heads, "kv_len": self.kv_len,
            "kv_len_range": [lens[0], lens[-1]] if decode else None, "decode": decode, "dtype": c.dtype,
            "causal": c.causal, "causal_source": c.causal_source, "mask": c.mask, "dropout": c.dropout,
            "enable_gqa": c.enable_gqa, "repeat_kv": c.repeat_kv, "backward": any(x.backward for x in self.calls),
            "calls_per_step": round(len(self.calls) / self.steps, 3),
            "gpu_us_per_step": round(self.gpu_us / self.steps, 3),
            "backward_gpu_us_per_step": round(self.backward_gpu_us / self.steps, 3),
            "cpu_us_per_step": round(self.cpu_us / self.steps, 3),
            "op_chain": c.op_chain,
            "kernels": sorted(self.kernels, key=lambda k: (-self.kernels[k], k))[:3],
        }


def _signature(call: Call) -> tuple[Any, ...]:
    decode = call.decode
    mask = None if call.mask is None else tuple(call.mask[:-1] if decode else call.mask)
    return (call.kind, call.implementation, call.current, tuple(call.q), call.kv_heads,
            None if decode else call.kv_len, decode, call.dtype, call.causal, mask, call.dropout, call.enable_gqa,
            call.repeat_kv, bool(call.backward), call.op_chain)


def find(trace: Trace) -> list[Site]:
    """The trace's attention sites, the most GPU time first (CPU time on a trace without GPU work)."""
    finder = _Finder(trace)
    calls = finder.calls()
    groups: dict[tuple[Any, ...], list[Call]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: c.op):
        groups[_signature(call)].append(call)
    steps = trace.step_count
    sites = [Site(group, steps) for group in groups.values()]
    _time(finder.ctx, sites)
    return sorted(sites, key=lambda s: (-s.gpu_us, -s.cpu_us, s.first.op))


def _time(ctx: Context, sites: list[Site]) -> None:
    """GPU time of each site's forward ops and backward nodes, and the kernels that ran."""
    owner: dict[int, tuple[int, bool]] = {}
    for number, site in enumerate(sites):
        for call in site.calls:
            owner.update({op: (number, False) for op in call.roots})
            owner.update({op: (number, True) for op in call.backward})
    ends, starts = ctx.trace.ops["end"].to_list(), ctx.trace.ops["ts"].to_list()
    for site in sites:
        for call in site.calls:
            own = call.roots | call.backward
            site.cpu_us += sum(ends[op] - starts[op] for op in own
                               if not any(a in own for a in ctx.trace.op_ancestors(op)[:-1]))
    if not ctx.trace.has_gpu or not owner:
        return
    rows = ctx.gpu_under(set(owner))
    for root, name, dur in rows.select("under", "name", "dur").iter_rows():
        number, backward = owner[root]
        site = sites[number]
        site.gpu_us += dur or 0.0
        site.backward_gpu_us += (dur or 0.0) if backward else 0.0
        site.kernels[name] = site.kernels.get(name, 0.0) + (dur or 0.0)
    for site in sites:
        for name in site.kernels:
            if re.search(at203.FP32_FUSED, name):  # AT203's kernels: its findings are keyed by name
                for call in site.calls:
                    call.keys.add(("AT203", name))
