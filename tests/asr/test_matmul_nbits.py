"""Weight-only 8-bit MatMulNBits: the quantized weights stand for the fp32 ones, and a
row's result does not depend on the other rows of its batch, as MatMulInteger's batch-wide activation
scale made it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.asr.build import BuildResult
from pipeline.asr.matmul_nbits import dequantize_weight, quantize_model, quantize_weight
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.config import Settings
from pipeline.eval.dataset import EvalUtterance


def test_weights_round_trip_within_half_a_step_of_their_block() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 24)).astype(np.float32)
    w[:32, 3] = 0.0  # an all-zero block
    b, scales = quantize_weight(w, 32)
    assert b.shape == (24, 2, 32) and b.dtype == np.uint8 and scales.shape == (48,)
    back = dequantize_weight(b, scales)
    step = np.repeat(scales.reshape(24, 2), 32, axis=1).T  # each weight's block scale, [K, N]
    assert np.all(np.abs(back - w) <= step / 2 + 1e-7)
    assert np.all(back[:32, 3] == 0.0)
    with pytest.raises(ValueError, match="multiple of the block size"):
        quantize_weight(w[:40], 32)


def _matmul_model(path: Path, w: np.ndarray) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "t", w.shape[0]])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "t", w.shape[1]])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g", [x], [y],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.parametrize("steps", [1, 5])  # a decoder step's one token per row, and several frames per row
def test_a_row_s_result_is_the_same_alone_and_in_a_batch_of_16(tmp_path: Path, steps: int) -> None:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((384, 256)) * 0.05).astype(np.float32)
    _matmul_model(tmp_path / "fp32.onnx", w)
    assert quantize_model(tmp_path / "fp32.onnx", tmp_path / "q8.onnx") == 1
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q8.onnx")).graph.node]
    assert ops == ["MatMulNBits"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    q8 = ort.InferenceSession(str(tmp_path / "q8.onnx"), options, providers=["CPUExecutionProvider"])
    # Rows of very different magnitudes: one activation scale for the batch would change the small ones.
    batch = (rng.standard_normal((16, steps, 384)) * np.geomspace(0.01, 100, 16)[:, None, None]).astype(np.float32)
    together = q8.run(None, {"x": batch})[0]
    for i in range(16):
        alone = q8.run(None, {"x": batch[i:i + 1]})[0]
        np.testing.assert_array_equal(alone[0], together[i])
    # ... and close to the fp32 product (int8 weights and per-block int8 activations)
    exact = batch @ w
    error = np.abs(together - exact).max(axis=(1, 2)) / np.abs(exact).max(axis=(1, 2))
    assert error.max() < 0.05


@pytest.mark.slow
def test_int8row_gives_a_segment_the_same_text_alone_and_in_a_batch_of_16(
    built: BuildResult, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    """The built model's int8row graphs: each of 16 eval segments (1.4-12 s, 8 kHz mu-law) decoded alone
    and in a batch of 16 with the others gives the same tokens, where int8 (MatMulInteger, one activation
    scale per batch) changed 18 of 64 texts in the same check."""
    assert set(built.manifest.graphs["int8row"]) == {"encoder", "decoder"}
    ops = {n.op_type for n in onnx.load(str(built.folder / built.manifest.graphs["int8row"]["decoder"])).graph.node}
    assert "MatMulNBits" in ops and "MatMulInteger" not in ops
    recognizer = Recognizer.load(built.folder, asr_settings.model_copy(update={"quantization": "int8row"}))
    segments = [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in eval_sets["8k-mulaw"][:16]]
    together = recognizer.recognize(segments)
    assert sum(1 for r in together if isinstance(r, TranscriptResult) and r.text.strip()) >= 12
    for segment, batched in zip(segments, together, strict=True):
        alone = recognizer.recognize([segment])[0]
        assert isinstance(batched, TranscriptResult) and isinstance(alone, TranscriptResult)
        assert (batched.text, batched.tokens) == (alone.text, alone.tokens)


def test_weights_read_inside_if_branches_and_through_a_transpose_are_quantized_once(tmp_path: Path) -> None:
    """Moonshine's merged decoder: every layer sits in both branches of an ``If`` and reads the outer graph's
    weights, and the logits multiply by the embedding table's ``Transpose`` (tied weights)."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((64, 96)) * 0.05).astype(np.float32)
    table = (rng.standard_normal((40, 64)) * 0.05).astype(np.float32)  # [vocab, dim]: logits = y @ table.T
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], [f"{name}_h"]),
             helper.make_node("Slice", [f"{name}_h", "zero", "dim", "one"], [f"{name}_y"]),
             helper.make_node("Transpose", ["table"], [f"{name}_tT"], perm=[1, 0]),
             helper.make_node("MatMul", [f"{name}_y", f"{name}_tT"], [f"{name}_logits"])],
            name, [], [helper.make_tensor_value_info(f"{name}_logits", TensorProto.FLOAT, ["b", 40])])

    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["logits"], then_branch=branch("then"), else_branch=branch("else"))],
        "g", [x_info, helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 40])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(table, "table"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([64], np.int64), "dim"),
         numpy_helper.from_array(np.array([1], np.int64), "one")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "fp32.onnx"))
    assert quantize_model(tmp_path / "fp32.onnx", tmp_path / "q8.onnx") == 4  # two MatMuls in each branch
    q8 = onnx.load(str(tmp_path / "q8.onnx"))
    names = {t.name for t in q8.graph.initializer}
    assert {"w_q8", "table_T_q8"} <= names and not {"w", "table"} & names  # once each; the fp32 copies gone
    for node in q8.graph.node[0].attribute:
        assert [n.op_type for n in node.g.node] == ["MatMulNBits", "Slice", "MatMulNBits"]
    session = ort.InferenceSession(str(tmp_path / "q8.onnx"), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((3, 64)).astype(np.float32)
    exact = (x @ w)[:, :64] @ table.T
    for cond in (True, False):
        got = session.run(None, {"x": x, "cond": np.array(cond)})[0]
        assert np.abs(got - exact).max() < 0.05 * np.abs(exact).max()
