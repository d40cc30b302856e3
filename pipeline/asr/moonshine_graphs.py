"""Moonshine's shipped ONNX Runtime graphs (`.ort`) turned into the ONNX graphs a built folder holds.

The packages ship Moonshine as ORT-format files (flatbuffers the ``onnx`` package cannot read). ONNX
Runtime itself reads them, and a session with ``optimized_model_filepath`` set and every optimisation off
writes the graph it loaded back out as plain ONNX, node for node. On that copy the build:

- **folds weight casts** (base-en): its weights are stored int8 and every run computes
  ``Cast(int8 -> float) * scale + zero_point`` for all 132 of them (51 encoder, 81 decoder). Each chain
  whose inputs are all constants is computed once here, with numpy's float32 arithmetic (elementwise
  IEEE operations: the very values ONNX Runtime computed on every run), and stored as a float32 weight;
- **dequantizes MatMuls** (tiny-en, for the ``fp32`` variant): tiny-en's MatMuls are ONNX Runtime's dynamic
  int8 kernels (``DynamicQuantizeMatMul``, ``MatMulIntegerToFloat`` after ``DynamicQuantizeLinear``),
  which quantize activations with one scale over the whole batch, so a segment's text would depend on
  its batch partners. The ``fp32`` graph multiplies the activations by the dequantized weights instead:
  batch-independent (the ``int8`` variant keeps the shipped kernels);
- **adds a cross-attention mask**: base-en's merged decoder has no encoder mask, and tiny-en's has an
  ``encoder_attention_mask`` input that does not mask (see ``add_cross_attention_mask``), so segments
  of different lengths could not share a decoder batch. The build adds (or reuses) that input [B, S]
  (1 = audio frame) and a -1e9 bias before each cross-attention softmax (nodes named
  ``.../encoder_attn/Softmax``): a padded row's logits are then bit-identical to its own.

From the fp32 pair it also writes ``int8row`` (pipeline/asr/matmul_nbits.py): 8-bit weights in blocks,
activations quantized per row, so a segment's text still does not depend on its batch, and each decoder
step reads a quarter of the weights' bytes (a step at batch 1 is bound by memory, not arithmetic); and
names ``int8row-decoder``: the fp32 encoder with the int8row decoder (no file of its own).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pipeline.asr.matmul_nbits import quantize_model
from pipeline.asr.moonshine_model import CROSS_MASK
from pipeline.asr.onnx_walk import subgraphs, used_names

ENCODER_FILE = "encoder_model.ort"
DECODER_FILE = "decoder_model_merged.ort"
TOKENIZER_FILE = "tokenizer.bin"
CROSS_BIAS = "callqa_cross_attention_bias"
MASKED = -1e9  # added to a padded frame's attention score: exp() of it is exactly 0 in float32


class MoonshineSourceError(RuntimeError):
    """The package that ships a Moonshine model is missing or does not hold the expected files."""


@dataclass(frozen=True)
class MoonshineSource:
    name: str  # moonshine-tiny | moonshine-base
    package: str  # PyPI distribution
    folder: Path

    @property
    def version(self) -> str:
        return importlib.metadata.version(self.package)

    def file(self, name: str) -> Path:
        path = self.folder / name
        if not path.is_file():
            raise MoonshineSourceError(f"{path}: missing from {self.package} {self.version}")
        return path


# name -> (PyPI distribution, import name, folder inside it). moonshine-voice 0.1.1 and later ship no
# weights, hence the exact pins in pyproject.toml.
SOURCES: dict[str, tuple[str, str, str]] = {
    "moonshine-tiny": ("moonshine-voice", "moonshine_voice", "assets/tiny-en"),
    "moonshine-base": ("moonshine-cpp", "moonshine_cpp", "models/base-en"),
}


def is_moonshine(name: str) -> bool:
    return name in SOURCES


def find_source(name: str) -> MoonshineSource:
    """The installed package folder holding `name`'s `.ort` graphs and tokenizer (not imported: both
    packages load native libraries on import, which we never use)."""
    try:
        package, module, sub = SOURCES[name]
    except KeyError as exc:
        raise MoonshineSourceError(f"unknown Moonshine model {name!r}: choose {' or '.join(SOURCES)}") from exc
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MoonshineSourceError(f"{name}: package {package} is not installed (pip install -e .)")
    return MoonshineSource(name, package, Path(next(iter(spec.submodule_search_locations))) / sub)


def ort_to_onnx(path: Path) -> onnx.ModelProto:
    """The graph of an ORT-format file as an ONNX model, written back by ONNX Runtime unoptimised."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="callqa-ort-") as tmp:
        out = Path(tmp) / "model.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.optimized_model_filepath = str(out)
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return onnx.load(str(out))


_FOLDABLE = {
    "Cast": lambda x, to: x.astype(onnx.helper.tensor_dtype_to_np_dtype(to)),
    "Mul": lambda a, b: np.multiply(a, b),
    "Add": lambda a, b: np.add(a, b),
    "Sub": lambda a, b: np.subtract(a, b),
}


def fold_constant_chains(graph: onnx.GraphProto, outer: dict[str, np.ndarray] | None = None) -> int:
    """Compute once every Cast/Mul/Add/Sub node whose inputs are all constants (initializers, or outputs
    of nodes folded before it), in `graph` and its subgraphs; returns how many nodes were folded."""
    constants = dict(outer or {})
    constants |= {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    kept: list[onnx.NodeProto] = []
    new: list[onnx.TensorProto] = []
    folded = 0
    for node in graph.node:
        if node.op_type in _FOLDABLE and node.input and all(i in constants for i in node.input):
            args = [constants[i] for i in node.input]
            if node.op_type == "Cast":
                to = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "to")
                value = _FOLDABLE["Cast"](args[0], to)
            else:
                a, b = args
                if a.dtype != b.dtype:
                    kept.append(node)
                    continue
                value = _FOLDABLE[node.op_type](a, b).astype(a.dtype, copy=False)
            constants[node.output[0]] = value
            new.append(numpy_helper.from_array(np.ascontiguousarray(value), node.output[0]))
            folded += 1
            continue
        for sub in subgraphs(node):
            folded += fold_constant_chains(sub, constants)
        kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(new)
    return folded


def drop_unused(graph: onnx.GraphProto) -> None:
    """Remove initializers and nodes nothing reads any more (after folding or dequantizing), repeatedly."""
    while True:
        used = used_names(graph)
        nodes = [n for n in graph.node if any(o in used for o in n.output) or not n.output]
        inits = [t for t in graph.initializer if t.name in used]
        if len(nodes) == len(graph.node) and len(inits) == len(graph.initializer):
            break
        del graph.node[:]
        graph.node.extend(nodes)
        del graph.initializer[:]
        graph.initializer.extend(inits)
    for node in graph.node:
        for sub in subgraphs(node):
            drop_unused(sub)


def dequantize_matmuls(graph: onnx.GraphProto, outer: dict[str, np.ndarray] | None = None,
                       producers: dict[str, onnx.NodeProto] | None = None,
                       owners: dict[str, onnx.GraphProto] | None = None, made: set[str] | None = None) -> int:
    """Replace ONNX Runtime's dynamic-int8 MatMuls by float MatMuls on dequantized weights (+ bias);
    returns how many were replaced. A weight is dequantized once, into the graph that holds it (both If
    branches of the merged decoder read the same outer weights). The DynamicQuantizeLinear nodes and int8
    weights left unread go in ``drop_unused``."""
    constants = dict(outer or {})
    constants |= {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producers = dict(producers or {})
    producers |= {o: n for n in graph.node for o in n.output}
    owners = dict(owners or {})
    owners |= {t.name: graph for t in graph.initializer}
    made = made if made is not None else set()
    replaced = 0
    kept: list[onnx.NodeProto] = []

    def weight(name: str, scale: str, zero: str | None) -> str:
        target = f"{name}_callqa_fp32"
        if target not in made:
            w = constants[name].astype(np.float32)
            if zero:
                w = w - constants[zero].astype(np.float32)
            owners[name].initializer.append(numpy_helper.from_array(np.ascontiguousarray(w * constants[scale]), target))
            made.add(target)
        return target

    for node in graph.node:
        ins = list(node.input) + [""] * 8
        if node.op_type == "DynamicQuantizeMatMul" and node.domain == "com.microsoft":
            a, b, b_scale, b_zero, bias = ins[:5]
            w = weight(b, b_scale, b_zero or None)
        elif node.op_type == "MatMulIntegerToFloat" and node.domain == "com.microsoft":
            a_q, b, _a_scale, b_scale, _a_zero, b_zero, bias = ins[:7]
            source = producers.get(a_q)
            if source is None or source.op_type != "DynamicQuantizeLinear":
                kept.append(node)
                continue
            a = source.input[0]
            w = weight(b, b_scale, b_zero or None)
        else:
            for sub in subgraphs(node):
                replaced += dequantize_matmuls(sub, constants, producers, owners, made)
            kept.append(node)
            continue
        out = node.output[0]
        if bias:
            product = f"{out}_callqa_matmul"
            kept.append(helper.make_node("MatMul", [a, w], [product], name=f"{node.name}_fp32"))
            kept.append(helper.make_node("Add", [product, bias], [out], name=f"{node.name}_fp32_bias"))
        else:
            kept.append(helper.make_node("MatMul", [a, w], [out], name=f"{node.name}_fp32"))
        replaced += 1
    del graph.node[:]
    graph.node.extend(kept)
    return replaced


def add_cross_attention_mask(model: onnx.ModelProto) -> int:
    """Mask padded encoder frames out of a merged decoder's cross-attention: its ``encoder_attention_mask``
    [B, S] input (int64, 1 = audio; added when it has none) becomes a -1e9 bias before every
    cross-attention softmax; returns how many softmaxes it reaches. tiny-en's decoder takes such a mask
    but it does not reach the scores as it should: a row's first logits move by up to 2.2 when 40
    masked zero frames are appended (6.3 with random ones); with this bias they move by 0.0."""
    graph = model.graph
    if not any(i.name == CROSS_MASK for i in graph.input):
        graph.input.append(helper.make_tensor_value_info(
            CROSS_MASK, onnx.TensorProto.INT64, ["batch_size", "encoder_sequence_length"]))
    one = numpy_helper.from_array(np.array(1.0, np.float32), "callqa_one")
    masked = numpy_helper.from_array(np.array(-MASKED, np.float32), "callqa_masked")
    axes = numpy_helper.from_array(np.array([1, 2], np.int64), "callqa_mask_axes")
    graph.initializer.extend([one, masked, axes])
    head = [
        helper.make_node("Cast", [CROSS_MASK], ["callqa_mask_f"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Sub", ["callqa_mask_f", "callqa_one"], ["callqa_mask_off"]),  # 0 audio, -1 pad
        helper.make_node("Mul", ["callqa_mask_off", "callqa_masked"], ["callqa_mask_bias"]),
        helper.make_node("Unsqueeze", ["callqa_mask_bias", "callqa_mask_axes"], [CROSS_BIAS]),  # [B,1,1,S]
    ]
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(head + nodes)
    return _bias_cross_softmax(graph)


def _bias_cross_softmax(graph: onnx.GraphProto) -> int:
    count = 0
    kept: list[onnx.NodeProto] = []
    producers = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        if node.op_type == "Softmax" and "/encoder_attn/" in node.name:
            scores = node.input[0]
            own = producers.get(scores)
            if own is not None and own.op_type == "Add" and own.name.endswith("/encoder_attn/Add"):
                # tiny-en's own mask term: replaced, not kept beside ours. Besides not masking, it fails
                # for more than 415 encoder frames (10 s of audio: "Attempting to broadcast an axis by a
                # dimension other than 1. 2 by 422"), in the shipped graph as here.
                scores = own.input[0]
            biased = f"{scores}_callqa_masked"
            kept.append(helper.make_node("Add", [scores, CROSS_BIAS], [biased], name=f"{node.name}_mask"))
            node.input[0] = biased
            count += 1
        for sub in subgraphs(node):
            count += _bias_cross_softmax(sub)
        kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    return count


@dataclass(frozen=True)
class ConvertedGraphs:
    """The graphs of one Moonshine model as ONNX, per variant: ``{"fp32": {"encoder": model, ...}, ...}``."""

    variants: dict[str, dict[str, onnx.ModelProto]]
    notes: dict[str, int]  # what the rewrite did (folded nodes, dequantized MatMuls, masked softmaxes)


def convert(source: MoonshineSource) -> ConvertedGraphs:
    """fp32 graphs for every model; for tiny-en also its shipped dynamic-int8 graphs (``int8``)."""
    notes = {"folded": 0, "dequantized": 0, "masked_softmax": 0}
    variants: dict[str, dict[str, onnx.ModelProto]] = {"fp32": {}}
    for part, file in (("encoder", ENCODER_FILE), ("decoder", DECODER_FILE)):
        shipped = ort_to_onnx(source.file(file))
        if part == "decoder":
            notes["masked_softmax"] += add_cross_attention_mask(shipped)
        quantized = any(n.op_type in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat") for n in all_nodes(shipped.graph))
        if quantized:
            int8 = onnx.ModelProto.FromString(shipped.SerializeToString())
            drop_unused(int8.graph)
            variants.setdefault("int8", {})[part] = int8
            notes["dequantized"] += dequantize_matmuls(shipped.graph)
        notes["folded"] += fold_constant_chains(shipped.graph)
        drop_unused(shipped.graph)
        variants["fp32"][part] = shipped
    if "int8" in variants and len(variants["int8"]) != 2:
        del variants["int8"]  # only a whole pair is a variant
    return ConvertedGraphs(variants, notes)


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)


def write_graphs(source: MoonshineSource, folder: Path) -> tuple[dict[str, dict[str, str]], dict[str, int]]:
    """Write the converted graphs and the tokenizer into `folder`; the manifest's ``graphs`` and notes."""
    import shutil

    converted = convert(source)
    graphs: dict[str, dict[str, str]] = {}
    for variant, parts in converted.variants.items():
        for part, model in parts.items():
            file = f"{part}.{variant}.onnx"
            onnx.save(model, str(folder / file))
            graphs.setdefault(variant, {})[part] = file
    for part, file in graphs["fp32"].items():  # 8-bit weights, per-row activations (matmul_nbits)
        quantize_model(folder / file, folder / f"{part}.int8row.onnx")
        graphs.setdefault("int8row", {})[part] = f"{part}.int8row.onnx"
    graphs["int8row-decoder"] = {"encoder": graphs["fp32"]["encoder"], "decoder": graphs["int8row"]["decoder"]}
    shutil.copyfile(source.file(TOKENIZER_FILE), folder / TOKENIZER_FILE)
    return graphs, converted.notes


def source_sha256(source: MoonshineSource) -> str:
    """One digest over the shipped files the build reads (encoder, decoder, tokenizer, in that order)."""
    import hashlib

    digest = hashlib.sha256()
    for name in (ENCODER_FILE, DECODER_FILE, TOKENIZER_FILE):
        digest.update(source.file(name).read_bytes())
    return digest.hexdigest()
