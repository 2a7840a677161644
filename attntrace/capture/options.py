"""The variant names and argument checks of `attntrace run`, importable without torch so that a bad
argument is refused at once instead of after torch's import."""

from __future__ import annotations

from dataclasses import dataclass

# Runs on any shape the options describe (each variant skips, with its reason, what it cannot take).
CORE = ("naive", "naive_inplace", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "sdpa", "compiled",
        "flex", "triton")
# Only meaningful in one scenario, so `all` lists them only there.
GQA_ONLY = ("sdpa_repeat_kv",)
VARLEN_ONLY = ("sdpa_nested",)
# Third-party kernels: run when their package is installed, skipped with a one-line reason otherwise.
THIRD_PARTY = ("flash_attn2", "flash_attn3", "xformers", "transformer_engine")
ALL_VARIANTS = CORE + GQA_ONLY + VARLEN_ONLY + THIRD_PARTY


@dataclass(frozen=True)
class Shape:
    """Attention sizes. `seq` is the key/value length (the KV cache in decode) and also the query length
    unless `query_len` is set; queries are the last `query_len` positions, so causal masks align
    bottom-right. `lengths` (variable length) gives each sequence's valid length, padded to `seq`."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    kv_heads: int | None = None
    query_len: int | None = None
    window: int | None = None
    lengths: tuple[int, ...] | None = None

    @property
    def q_len(self) -> int:
        return self.query_len or self.seq

    @property
    def kv_len(self) -> int:
        return self.seq

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def gqa(self) -> bool:
        return self.n_kv_heads != self.heads

    @property
    def decode(self) -> bool:
        return self.q_len != self.kv_len

    def scenario(self) -> str:
        parts = [name for name, on in (("gqa" if self.n_kv_heads > 1 else "mqa", self.gqa),
                                       ("decode", self.decode), ("window", bool(self.window)),
                                       ("varlen", self.lengths is not None)) if on]
        return "+".join(parts) or "dense"


def variant_names(value: str, shape: Shape) -> tuple[str, ...]:
    """The variants `--variants` asks for; ValueError naming the unknown ones."""
    if value == "all":
        extra = (GQA_ONLY if shape.gqa else ()) + (VARLEN_ONLY if shape.lengths is not None else ())
        return CORE + extra + THIRD_PARTY
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [n for n in names if n not in ALL_VARIANTS]
    if unknown or not names:
        raise ValueError(f"unknown variant(s) {', '.join(unknown) or repr(value)}; known: all, "
                         f"{', '.join(ALL_VARIANTS)}")
    return names


def check_shape(shape: Shape, causal: bool, backward: bool, steps: int, warmup: int) -> str | None:
    """Why these options cannot describe one attention call, or None when they can."""
    if min(shape.batch, shape.heads, shape.seq, shape.head_dim, steps) < 1 or warmup < 0:
        return "sizes and --steps must be positive, --warmup non-negative"
    if shape.kv_heads is not None and not (1 <= shape.kv_heads <= shape.heads and shape.heads % shape.kv_heads == 0):
        return f"--kv-heads {shape.kv_heads} must divide --heads {shape.heads}"
    if shape.query_len is not None and not 1 <= shape.query_len <= shape.seq:
        return f"--query-len {shape.query_len} must be between 1 and the KV length {shape.seq}"
    if shape.decode and backward:
        return "--backward with --query-len shorter than the KV length: decode has no backward"
    if shape.window is not None:
        if shape.window < 1:
            return "--window must be positive"
        if not causal:
            return "--window is a causal sliding window; drop --no-causal"
    if shape.lengths is not None and shape.decode:
        return "--varlen needs queries as long as keys (no --query-len)"
    if shape.lengths is not None and shape.window is not None:
        return "--varlen with --window is not supported (padded rows would attend to nothing)"
    return None


def varlen_lengths(batch: int, seq: int) -> tuple[int, ...]:
    """Valid lengths of a padded batch, spread evenly from a quarter of `seq` to all of it (the longest is
    the padded length), so the waste of padding is known: deterministic, no random draw."""
    if batch == 1:
        return (seq,)
    low = max(1, seq // 4)
    return tuple(sorted((low + (seq - low) * i // (batch - 1) for i in range(batch)), reverse=True))
