"""The FLOP and byte formulas (attntrace/model/flops.py) against counts made another way: torch's FlopCounterMode on
ops recorded by the real profiler on the CPU (where torch is installed), and hand counts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from conftest import sample

from attntrace.model import flops
from attntrace.model.loading import load


# --- hand counts (no torch) ------------------------------------------------------------------------
def test_gemm_hand_counts() -> None:
    bf16 = "c10::BFloat16"
    mm = flops.op_cost("aten::mm", [[128, 64], [64, 32]], [bf16, bf16], ["", ""])
    assert mm is not None and mm.flops == 2 * 128 * 64 * 32 and mm.precision == "bf16"
    assert mm.bytes == (128 * 64 + 64 * 32 + 128 * 32) * 2
    addmm = flops.op_cost("aten::addmm", [[32], [128, 64], [64, 32], [], []], [bf16] * 3 + ["Scalar"] * 2, None)
    assert addmm is not None and addmm.flops == 2 * 128 * 64 * 32 and addmm.bytes == mm.bytes + 32 * 2
    bmm = flops.op_cost("aten::bmm", [[4, 16, 8], [4, 8, 2]], ["float", "float"], None)
    assert bmm is not None and bmm.flops == 2 * 4 * 16 * 8 * 2 and bmm.precision == "fp32"
    # matmul broadcasts a 3-D batch against a matrix; linear's weight is [out, in]
    assert flops.op_cost("aten::matmul", [[3, 5, 7], [7, 11]], [bf16, bf16], None).flops == 2 * 3 * 5 * 7 * 11
    assert flops.op_cost("aten::linear", [[2, 3, 7], [11, 7], [11]], [bf16] * 3, None).flops == 2 * 6 * 7 * 11
    assert flops.op_cost("aten::mm", [[3, 4, 5], [5, 6]], [bf16, bf16], None) is None  # mm takes matrices only


def test_attention_hand_counts() -> None:
    bf16 = "c10::BFloat16"
    q = [2, 8, 16, 64]
    full = flops.op_cost("aten::_scaled_dot_product_flash_attention", [q, q, q], [bf16] * 3,
                         ["", "", "", "0.", "False"])
    causal = flops.op_cost("aten::_scaled_dot_product_flash_attention", [q, q, q], [bf16] * 3,
                           ["", "", "", "0.", "True"])
    assert full is not None and causal is not None
    assert full.flops == 2 * (2 * 8 * 16 * 16) * (64 + 64)  # batch x heads x S x S pairs, 2*D for each matmul
    assert causal.flops == 2 * (2 * 8 * (16 * 17 // 2)) * (64 + 64)  # the diagonal and below
    # GQA: 8 query heads on 2 KV heads do the FLOPs of 8 heads, and read a quarter of the keys and values
    kv = [2, 2, 16, 64]
    gqa = flops.op_cost("aten::_scaled_dot_product_cudnn_attention", [q, kv, kv], [bf16] * 3,
                        ["", "", "", "", "True", "0.", "False"])
    assert gqa is not None and gqa.flops == full.flops and gqa.bytes < full.bytes
    assert gqa.bytes == (2 * 8 * 16 * 128 + 2 * 2 * 16 * 128) * 2
    # FlashAttention's own layout [batch, seq, heads, dim], causal at its index 8; and its backward
    bshd = [2, 16, 8, 64]
    own = flops.op_cost("aten::_flash_attention_forward", [bshd] * 3, [bf16] * 3, [""] * 8 + ["True"])
    assert own is not None and own.flops == causal.flops
    back = flops.op_cost("aten::_flash_attention_backward", [bshd] * 5, [bf16] * 5, [""] * 11 + ["True"])
    assert back is not None and back.flops == 2 * causal.flops and back.hw_flops == 2.5 * causal.flops
    # decode: one query sees the whole cache of 100 keys
    one = flops.op_cost("aten::_scaled_dot_product_flash_attention", [[1, 4, 1, 64], [1, 4, 100, 64],
                        [1, 4, 100, 64]], [bf16] * 3, ["", "", "", "0.", "False"])
    assert one is not None and one.flops == 2 * 4 * 100 * 128


def test_attended_pairs_closed_form_matches_the_loop() -> None:
    """The closed form of one sequence's pairs against a direct count of every (query, key) pair."""
    for kv in (1, 5, 17):
        for q in range(1, kv + 1):
            for causal in (False, True):
                for window in (None, 1, 3, 40):
                    want = 0
                    for row in range(q):
                        pos = kv - q + row
                        for key in range(kv):
                            seen = key <= pos if causal else True
                            if window:
                                seen = seen and pos - window < key if causal else pos - window < key
                            want += seen
                    assert flops._pairs_one(q, kv, causal, window) == want, (q, kv, causal, window)


def test_conv_hand_count_with_stride_padding_dilation_groups() -> None:
    # input [2, 8, 15, 15], weight [16, 4, 3, 3] (groups 2), stride 2, padding 1, dilation 2: output 7x7
    cost = flops.op_cost("aten::convolution", [[2, 8, 15, 15], [16, 4, 3, 3], []], ["float"] * 2 + [""],
                         ["", "", "", "[2, 2]", "[1, 1]", "[2, 2]", "False", "[0, 0]", "2"])
    out = (15 + 2 * 1 - 2 * (3 - 1) - 1) // 2 + 1
    assert out == 7
    assert cost is not None and cost.flops == 2 * 2 * 16 * out * out * 4 * 3 * 3


def test_bus_bytes_follow_nccl_tests() -> None:
    """nccl-tests' busBw factors: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n."""
    assert flops.bus_bytes("allreduce", 1000, 4) == 1500
    assert flops.bus_bytes("allgather", 1000, 4) == 750
    assert flops.bus_bytes("reducescatter", 800, 8) == 700
    assert flops.bus_bytes("allreduce", 1000, 1) is None
    cost = flops.op_cost("c10d::allreduce_", [[1024]], ["float"], None, ranks=2)
    assert cost is not None and cost.kind == "communication" and cost.bytes == 4096


def test_bytes_only_ops() -> None:
    add = flops.op_cost("aten::add", [[4, 8], [4, 8], []], ["c10::BFloat16", "c10::BFloat16", "Scalar"], None)
    assert add is not None and add.kind == "elementwise" and add.bytes == 3 * 32 * 2 and add.flops == 0
    norm = flops.op_cost("aten::native_layer_norm", [[4, 8], [], [8], [8], []],
                         ["float", "ScalarList", "float", "float", "Scalar"], None)
    assert norm is not None and norm.kind == "norm"
    assert flops.op_cost("aten::sum", [[4, 8]], ["float"], None).kind == "reduction"
    assert flops.op_cost("aten::fill_", [[8], []], ["float", "Scalar"], None).bytes == 32  # written, not read
    # A predicate writes one byte an element: isneginf of fp32 read 4 and wrote 4 bytes an element, and its bound
    # was 1.6x the time the sample's kernel took.
    assert flops.op_cost("aten::isneginf", [[4, 8]], ["float"], None).bytes == 32 * 4 + 32
    assert flops.op_cost("aten::eq", [[4, 8], [4, 8]], ["c10::BFloat16", "c10::BFloat16"], None).bytes == 2 * 64 + 32



def test_gathers_read_the_rows_they_select_and_reductions_write_little() -> None:
    # Shapes of a Qwen1.5 generate() trace of the corpus: the vocabulary lookup counted the whole 151,936-row table
    # and ran "3.6x past its roof"; a mean over the last dim, counted as written whole, 1.4x.
    lookup = flops.op_cost("aten::index_select", [[151936, 1024], [], [8944]], ["c10::BFloat16", "Scalar", "long int"],
                           ["", "0", ""])
    assert lookup is not None and lookup.bytes == 8944 * 8 + 2 * 8944 * 1024 * 2
    across = flops.op_cost("aten::index_select", [[4, 6], [], [3]], ["float", "Scalar", "long int"], ["", "1", ""])
    assert across is not None and across.bytes == 3 * 8 + 2 * 3 * 4 * 4  # three columns of four rows
    rows = flops.op_cost("aten::embedding", [[1000, 64], [2, 16], [], [], []],
                         ["c10::BFloat16", "long int", "Scalar", "Scalar", "Scalar"], None)
    assert rows is not None and rows.bytes == 32 * 8 + 2 * 32 * 64 * 2
    mean = flops.op_cost("aten::mean", [[16, 559, 1024], [], [], []], ["float", "ScalarList", "Scalar", ""],
                         ["", "[-1]", "True", ""])
    assert mean is not None and mean.bytes == 16 * 559 * 1024 * 4


def test_an_out_buffer_is_written_not_read() -> None:
    # Shapes of HTA's negative_queue_length trace of the corpus: mul.out(self, scalar, out=) was counted as reading
    # its out= buffer too, and ran 1.3x past its roof.
    fp32 = 128 * 2862 * 4
    out = flops.op_cost("aten::mul", [[128, 2862], [], [128, 2862]], ["float", "double", "float"], None)
    assert out is not None and out.bytes == 2 * fp32
    plain = flops.op_cost("aten::mul", [[128, 2862], [128, 2862]], ["float", "float"], None)
    assert plain is not None and plain.bytes == 3 * fp32
    add_out = flops.op_cost("aten::add", [[4, 8], [4, 8], [], [4, 8]], ["float", "float", "Scalar", "float"], None)
    assert add_out is not None and add_out.bytes == 3 * 128
    # div's rounding mode is a third argument, not a tensor: no out= buffer.
    mode = flops.op_cost("aten::div", [[4, 8], [4, 8], []], ["float", "float", "c10::string_view"], None)
    assert mode is not None and mode.bytes == 3 * 128


def test_nll_loss_touches_one_class_a_sample() -> None:
    # The GPT-2 training samples' shapes: counted as reading the whole [4088, 8192] input, nll_loss ran 3.5x (forward)
    # and 6.5x (backward) past its roof.
    forward = flops.op_cost("aten::nll_loss_forward", [[4088, 8192], [4088], [], [], []],
                            ["float", "long int", "", "Scalar", "Scalar"], None)
    assert forward is not None and forward.bytes == 4088 * (4 + 8)
    backward = flops.op_cost("aten::nll_loss_backward", [[], [4088, 8192], [4088], [], [], [], []],
                             ["float", "float", "long int", "", "Scalar", "Scalar", "float"], None)
    assert backward is not None and backward.bytes == 4088 * (4 + 8)


def test_a_tensor_list_is_counted_at_the_element_size_its_kernel_names() -> None:
    # A `cat` records its inputs as a "TensorList" with no element type: counted at 4 bytes, the bf16 cat of the
    # GPT-2 SDPA workload ran 1.94x past its roof. CatArrayBatchedCopy<OpaqueType<2u>, ...> names the size.
    cat = flops.op_cost("aten::cat", [[[8, 1024], [8, 1024]], []], ["TensorList", "Scalar"], None)
    assert cat is not None and cat.bytes == 4 * 2 * (2 * 8 * 1024) and cat.assumed_list_bytes == cat.bytes
    bf16 = "void at::native::CatArrayBatchedCopy<at::native::OpaqueType<2u>, unsigned int, 4, 64, 64>(...)"
    assert flops.with_list_itemsize(cat, [bf16]).bytes == cat.bytes / 2
    assert flops.with_list_itemsize(cat, [bf16.replace("<2u>", "<8u>")]).bytes == cat.bytes * 2
    assert flops.with_list_itemsize(cat, ["elementwise_kernel"]) == cat  # no size named: 4 bytes stays
    assert flops.with_list_itemsize(cat, [bf16, bf16.replace("<2u>", "<4u>")]) == cat  # sizes disagree
    mul = flops.op_cost("aten::mul", [[8, 1024], [8, 1024]], ["c10::BFloat16", "c10::BFloat16"], None)
    assert mul is not None and flops.with_list_itemsize(mul, [bf16]) == mul  # no list: its types are recorded
    rows = {row["op"]: row for row in
            _roofline("sample_traces/workloads/gpt2_sdpa_train.pt.trace.json.gz")["ops"]}
    assert rows["aten::cat"]["share_of_bound"] < 1.0


def test_a_broadcast_input_is_read_once() -> None:
    # Input Strides were recorded but never read: an expanded (stride 0) index was counted whole, and the gathers
    # of the GPT-2, Llama and BERT samples ran 1.1x to 3.0x past their roof.
    fp32 = ["float", "float"]
    whole = flops.op_bytes("aten::add", [[8, 1024], [8, 1024]], fp32)
    row = flops.op_bytes("aten::add", [[8, 1024], [8, 1024]], fp32, None, [[1024, 1], [0, 1]])
    assert whole == 3 * 8 * 1024 * 4 and row == (8 * 1024 + 1024 + 8 * 1024) * 4  # the output is written whole
    copied = flops.op_bytes("aten::copy_", [[4, 16, 128], [4, 16, 128]], fp32, None, [[2048, 128, 1], [512, 0, 1]])
    assert copied == (4 * 16 * 128 + 4 * 128) * 4  # GQA's repeat_kv: the key read once, written 16 times
    # Strides that do not fit the shape are not trusted.
    assert flops.op_bytes("aten::add", [[8, 1024], [8, 1024]], fp32, None, [[1024, 1], [0]]) == whole
    assert flops.op_bytes("aten::add", [[8, 1024], [8, 1024]], fp32, None, "junk") == whole
    index = flops.op_bytes("aten::gather", [[4, 50257], [], [4, 1, 50257]], ["float", "Scalar", "long int"], None,
                           [[50257, 1], [], [1, 0, 0]])
    assert index == 4 * 8 + 2 * 4 * 50257 * 4
    for path in ("sample_traces/calibration/llama_train_eager.shapes.pt.trace.json.gz",
                 "sample_traces/from_trace/bert_infer_eager.pt.trace.json.gz"):
        gathers = [r["share_of_bound"] for r in _roofline(path)["ops"] if r["op"] == "aten::gather"]
        assert gathers and max(gathers) < 1.05, (path, gathers)


def _roofline(path: str) -> dict[str, Any]:
    from attntrace.model import roofline

    found = roofline.analyse(load(str(Path(__file__).resolve().parent.parent / path)))
    assert found is not None
    return found


def test_no_op_of_the_samples_runs_past_its_memory_roof_by_more_than_the_roof_s_spread() -> None:
    from attntrace import api

    for name in ("bf16_causal_fwd/sdpa_math", "bf16_causal_fwd/naive"):
        ops = api.lint([sample(name)], fail_on="never").to_dict()["traces"][0]["roofline"]["ops"]
        past = [(o["op"], o["share_of_bound"]) for o in ops if o["bound"] == "memory" and o["share_of_bound"]]
        assert past and max(share for _, share in past) < 1.05, past


# --- against FlopCounterMode on ops the real profiler recorded -------------------------------------
@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Ops run once each under the CPU profiler with record_shapes, and FlopCounterMode's count of the same calls."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    a, b = torch.randn(24, 40), torch.randn(40, 56)
    x3, w3 = torch.randn(3, 24, 40), torch.randn(3, 40, 8)
    lin_x, lin = torch.randn(2, 5, 40), torch.nn.Linear(40, 24)
    img = torch.randn(2, 6, 17, 17, requires_grad=True)
    conv = torch.nn.Conv2d(6, 12, 3, stride=2, padding=1, dilation=2, groups=3)
    # FlopCounterMode counts a grouped conv's weight gradient `groups` times over (it drops the groups there):
    # the backward is checked on an ungrouped one, the grouped count by hand above.
    conv_one = torch.nn.Conv2d(6, 12, 3, stride=2, padding=1, dilation=2)
    q = torch.randn(2, 4, 32, 16, requires_grad=True)
    k = torch.randn(2, 4, 32, 16, requires_grad=True)
    v = torch.randn(2, 4, 32, 16, requires_grad=True)
    calls = {
        "aten::mm": lambda: torch.mm(a, b),
        "aten::bmm": lambda: torch.bmm(x3, w3),
        "aten::addmm": lambda: lin(lin_x[0]),
        "aten::baddbmm": lambda: torch.baddbmm(torch.zeros(3, 24, 8), x3, w3),
        "aten::convolution": lambda: conv(img),
        "aten::convolution_backward": lambda: conv_one(img).sum().backward(),
    }
    counts = {}
    for name, call in calls.items():
        with FlopCounterMode(display=False) as counter:
            call()
        counts[name] = counter.get_total_flops()
        if name == "aten::convolution_backward":
            with FlopCounterMode(display=False) as forward:
                conv_one(img)
            counts[name] -= forward.get_total_flops()  # the forward it ran first
    path = Path(tmp_path_factory.mktemp("prof")) / "cpu.pt.trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for call in calls.values():
            call()
        torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    prof.export_chrome_trace(str(path))
    return {"trace": load(str(path)), "counts": counts, "shape": list(q.shape)}


def _first(trace: Any, name: str, nth: int = 0) -> flops.Cost | None:
    found = [i for i, n in enumerate(trace.op_names) if n == name]
    dims, types, concrete = trace.op_input(found[nth])
    return flops.op_cost(name, dims, types, concrete)


@pytest.mark.parametrize("name", ["aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::convolution",
                                  "aten::convolution_backward"])
def test_gemm_and_conv_match_flop_counter_mode(recorded: dict[str, Any], name: str) -> None:
    cost = _first(recorded["trace"], name)
    assert cost is not None, f"no model for the recorded {name}"
    assert cost.flops == recorded["counts"][name]


def test_sdpa_matches_torch_count_and_hand_count_for_causal(recorded: dict[str, Any]) -> None:
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    trace, shape = recorded["trace"], recorded["shape"]
    forward = _first(trace, "aten::_scaled_dot_product_flash_attention_for_cpu")
    assert forward is not None and forward.flops == sdpa_flop_count(shape, shape, shape)
    backward = _first(trace, "aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    # torch counts the backward's five matmuls (the scores recomputed): the hardware's FLOPs; the model's are
    # PaLM's MFU convention, four matmuls, twice the forward
    assert backward is not None and backward.hw_flops == sdpa_backward_flop_count(shape, shape, shape, shape)
    assert backward.flops == 2 * forward.flops
    causal = _first(trace, "aten::_scaled_dot_product_flash_attention_for_cpu", 1)
    batch, heads, seq, dim = shape
    assert causal is not None and causal.flops == 4 * batch * heads * dim * seq * (seq + 1) // 2
    assert math.isclose(causal.flops / forward.flops, (seq + 1) / (2 * seq))


def test_shapes_no_tensor_has_get_no_cost() -> None:
    """A hostile trace's sizes (negative, a stride of 0, a product past what a float holds) are no model, not
    an exception that would cost the whole report."""
    huge = [2**63 - 1] * 20
    assert flops.op_cost("aten::mm", [huge, [3, 4]], ["float", "float"], None) is None
    assert flops.op_cost("aten::add", [huge, huge], ["float", "float"], None) is None
    assert flops.op_cost("aten::mm", [[-1, 4], [4, 5]], ["float", "float"], None) is None
    assert flops.op_cost("aten::convolution", [[1, 3, 8, 8], [4, 3, 3, 3]], ["float", "float"],
                         ["", "", "", "[0, 0]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]) is None


def test_cutlass_fp32_tensor_op_gemms_are_tf32() -> None:
    # An A100 trace of the corpus ran fp32 mm/addmm on these at 43-55 TFLOP/s, "2.2-2.8x its fp32 roof": they run on
    # TF32 tensor cores (the name gives no input type), so their roof is TF32's.
    import polars as pl

    from attntrace.model import taxonomy

    names = ["void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_nt_align4>"
             "(cutlass_80_tensorop_s1688gemm_256x128_32x3_nt_align4::Params)",
             "cutlass_80_tensorop_s1684gemm_128x128_16x4_nn_align1",
             "cutlass_75_tensorop_s1688gemm_f16_256x128_32x2_nt_align8",  # fp16 inputs: not TF32
             "ampere_sgemm_128x64_nn"]
    classes = taxonomy.load().classify_all(pl.Series(names, dtype=pl.String))
    assert list(classes) == ["gemm_tf32", "gemm_tf32", "gemm_tensor_core", "gemm_fp32_simt"]
