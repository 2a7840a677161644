"""AT201 fp32-gemm: GEMMs on FP32 CUDA cores where tensor cores could run."""

from __future__ import annotations

from typing import Any

import polars as pl

from attntrace.checks.base import Context, fmt_ms, steps_in

SDPA_MATH = "aten::_scaled_dot_product_attention_math"
LOW_PRECISION = {"c10::BFloat16", "c10::Half"}
FIXES = {
    "sdpa-math-upcast": "Let SDPA dispatch to a fused backend (remove the `sdpa_kernel(SDPBackend.MATH)` pin; "
                        "keep q/k/v in bf16/fp16), or keep the math backend in low precision with "
                        "`torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)` (PyTorch >= 2.5).",
    "fp32-inputs": "Allow TF32 tensor cores with `torch.set_float32_matmul_precision('high')` (or "
                   "`torch.backends.cuda.matmul.allow_tf32 = True`), or run the model under "
                   "`torch.autocast('cuda', dtype=torch.bfloat16)`.",
}
FIXES["sdpa-math-upcast-backward"] = FIXES["sdpa-math-upcast"]
FIXES["fp32-convolution"] = ("Run the convolutions in bf16/fp16 under `torch.autocast('cuda', dtype=torch.bfloat16)` "
                             "with `channels_last` memory format, and keep `torch.backends.cudnn.allow_tf32 = True` "
                             "(PyTorch's default) so that cuDNN may pick TF32 tensor-core algorithms.")
FIXES["unknown"] = FIXES["sdpa-math-fp32"] = FIXES["fp32-inputs"]
CONVOLUTION = ("aten::cudnn_convolution", "aten::convolution", "aten::_convolution", "aten::conv2d",
               "aten::conv1d", "aten::conv3d", "aten::cudnn_convolution_backward", "aten::convolution_backward")
# cuBLAS's matrix-vector kernels (gemv2N, gemv2T, gemvx: a batch-1 Linear) are bound by memory: neither tensor
# cores nor a lower precision made them faster on an H200 (8 Linear 4096x4096 on one token: fp32 0.181 ms, TF32
# allowed 0.183 ms, bf16 0.244 ms; bench/gpu/gemv_capture.py, sample_traces/gemv/). They are no GEMM this rule's fix
# speeds up.
GEMV = "gemv"
UNLINKED = "(no CPU op linked)"  # a GEMM whose launch the trace lacks (launched before the capture began)
# Before Ampere there is no TF32: the tensor cores of a V100 or T4 take fp16.
PRE_AMPERE_FIX = ("This GPU has no TF32 (compute capability < 8.0): its tensor cores run fp16. Use mixed "
                  "precision, `torch.autocast('cuda', dtype=torch.float16)` with a `torch.cuda.amp.GradScaler` "
                  "for training.")


def _cause(ctx: Context, op: int | None, math_dtype: str | None, no_tf32: bool) -> tuple[str, str]:
    ancestors = ctx.trace.op_ancestors(op)
    names = ctx.trace.op_names
    chain = [names[i] for i in ancestors]
    if any(name in CONVOLUTION for name in chain):
        return "fp32-convolution", "an fp32 cuDNN convolution on CUDA cores (an implicit SGEMM)"
    if math_dtype and any("Backward" in name for name in chain) and not any(n == SDPA_MATH for n in chain):
        # Autograd replays the math backend's fp32 bmm/matmul in backward: the upcast, not the user's fp32.
        return ("sdpa-math-upcast-backward", f"the backward of the SDPA math backend, which upcast {math_dtype} "
                "q/k/v to fp32 in forward")
    for idx in ancestors:
        if names[idx] == SDPA_MATH:
            types = set(ctx.op_types(idx))
            low = sorted(types & LOW_PRECISION)
            if low:
                dtype = low[0].removeprefix("c10::")
                return "sdpa-math-upcast", f"the SDPA math backend upcast {dtype} q/k/v to fp32"
            # A cause of its own, apart from the model's other fp32 GEMMs: AT202 claims the math backend's GPU
            # time, this one finding is then its consequence (one finding with both counted these GEMMs twice).
            return "sdpa-math-fp32", ("SDPA math ran on fp32 inputs" if no_tf32 else
                                      "SDPA math ran on fp32 inputs with TF32 off")
    types = ctx.op_types(op)
    if types and all(t in ("float", "Scalar", "") for t in types):
        return "fp32-inputs", ("fp32 inputs (this GPU has no TF32)" if no_tf32 else "fp32 inputs with TF32 off")
    return "unknown", "fp32 GEMM (the inputs' types are not in the trace)"


# The architecture cuBLAS/cuDNN kernels name ("volta_sgemm_128x64_nn", "sm80_xmma_gemm_...", "ampere_bf16_..."):
# a trace without deviceProperties (PyTorch 1.8-era) still says its GPU by them.
KERNEL_ARCH = r"(?:^|[\s_])(volta|turing|maxwell|pascal|kepler|ampere|hopper|sm[0-9]{2})_"
PRE_AMPERE_ARCHS = {"volta", "turing", "maxwell", "pascal", "kepler", "sm70", "sm72", "sm75", "sm60", "sm61",
                    "sm62", "sm50", "sm52", "sm53", "sm35", "sm37"}


def _pre_ampere(ctx: Context, device: int | None) -> bool:
    major = ctx.trace.meta.device(device).get("computeMajor")
    if isinstance(major, int):
        return major < 8
    # No device properties: the architectures the GPU's own kernels name, all before Ampere (a V100's
    # `volta_scudnn_*` trace was told to use bf16 autocast and allow_tf32, neither of which it has).
    kernels = ctx.trace.gpu_linked.filter((pl.col("kind") == "kernel")
                                          & (pl.col("device") == device if device is not None else pl.lit(True)))
    archs = set(kernels["name"].str.extract(KERNEL_ARCH, 1).drop_nulls().unique().to_list())
    return bool(archs) and archs <= PRE_AMPERE_ARCHS


def _math_upcast_dtype(ctx: Context) -> str | None:
    """bf16/fp16 when the trace ran the SDPA math backend on such inputs (it computes in fp32)."""
    maths = ctx.trace.ops.filter(pl.col("name") == SDPA_MATH)["idx"].to_list()
    for op in maths[:50]:
        low = sorted(set(ctx.op_types(op)) & LOW_PRECISION)
        if low:
            return low[0].removeprefix("c10::")
    return None


def check(ctx: Context) -> list[dict[str, Any]]:
    gemms = ctx.gpu.filter((pl.col("cls") == "gemm_fp32_simt") & ~pl.col("name").str.contains(GEMV, literal=True))
    groups: dict[str, list[dict[str, Any]]] = {}
    reasons: dict[str, set[str]] = {}
    math_dtype = _math_upcast_dtype(ctx) if gemms.height else None
    # Once per device: without device properties it reads every kernel's name.
    pre_ampere = {device: _pre_ampere(ctx, device) for device in gemms["device"].unique().to_list()}
    for row in gemms.iter_rows(named=True):
        cause, why = _cause(ctx, row["op"], math_dtype, pre_ampere[row["device"]])
        chain = " > ".join(ctx.trace.op_chain(row["op"])) or UNLINKED
        # One cause with one fix is one finding, however many layers' op chains show it: the chains go inside.
        groups.setdefault(cause, []).append({**row, "chain": chain})
        reasons.setdefault(cause, set()).add(why)
    # GEMMs whose input types the trace lacks, beside fp32 ones it shows, are the same cause with the same fix: one
    # finding (two warnings with one fix were one cause counted twice).
    if "unknown" in groups and "fp32-inputs" in groups:
        groups["fp32-inputs"].extend(groups.pop("unknown"))
        reasons["fp32-inputs"] |= reasons.pop("unknown")
    speedup = ctx.params["expected_speedup"]
    findings = []
    for cause, rows in sorted(groups.items()):
        # The most frequent linked chain first: GEMMs launched before the capture began have none, and they were
        # the most frequent "chain" of a copy-bound nsys window.
        chains = sorted({r["chain"] for r in rows},
                        key=lambda c: (c == UNLINKED, -sum(r["chain"] == c for r in rows), c))
        steps = ctx.steps_in(r["launch_pid"] for r in rows)
        us_per_step = sum(r["dur"] for r in rows) / steps
        # Shares of compute: the GEMMs compete with the other kernels, not with communication or copies running
        # beside or between them; of the devices they ran on.
        devices = {r["device"] for r in rows}
        # gpu_us_of is a mean over the devices and the GEMM time their sum: two H100s' GEMMs read 173% of compute.
        compute_us = (ctx.gpu_us_of(devices, "compute_kernel_us") or ctx.gpu_us_of(devices)) * max(
            1, len({d for d in devices if d is not None}))
        share = min(1.0, us_per_step / compute_us) if compute_us else 0.0  # of a union: see Context.share_of_gpu
        if share < ctx.params["min_share"]:
            continue
        saved = us_per_step * (1 - 1 / speedup)
        kernels = sorted({r["name"] for r in rows})
        why = "; ".join(sorted(reasons[cause]))
        where_from = f" in {len(chains)} op chains" if len(chains) > 1 else ""
        findings.append(ctx.finding(
            op=rows[0]["op"],
            key=cause,
            message=(f"{ctx.per_step(len(rows), 'FP32 GEMM', steps=steps)} on CUDA cores{where_from}, not tensor "
                     f"cores: {why}: "
                     f"{fmt_ms(us_per_step)} GPU {ctx.each_step} ({100 * share:.0f}% of compute); tensor cores "
                     f"would save ~{fmt_ms(saved)} if {speedup:g}x faster"),
            where={"op_chain": chains[0], "kernel": kernels[0], "steps": steps_in(rows)},
            evidence={"cause": cause, "gemms_per_step": len(rows) / steps, "kernels": kernels[:20],
                      "op_chains": chains[:20], "op_chain_count": len(chains),
                      "gpu_us_per_step": us_per_step, "share_of_compute": share, "compute_us_per_step": compute_us,
                      "share_of_step_gpu": ctx.share_of_gpu(us_per_step, devices),
                      "assumed_tensor_core_speedup": speedup},
            gpu_us_per_step=saved,
            wall_us_per_step=ctx.wall_saving(ctx.faster((r["idx"] for r in rows), speedup), devices),
            whatif=f"these GEMMs {speedup:g}x faster",
            assumption=f"if tensor cores run these GEMMs {speedup:g}x faster",
            device=rows[0]["device"],
            fix=PRE_AMPERE_FIX if pre_ampere[rows[0]["device"]] else FIXES[cause],
        ))
    return findings
