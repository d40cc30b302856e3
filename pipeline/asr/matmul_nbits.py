"""Weight-only 8-bit quantization of a graph's MatMuls as ONNX Runtime's ``MatMulNBits`` (a contrib op).

Each MatMul whose second input is a 2-D weight [K, N] becomes MatMulNBits: the weight stored as 8-bit
integers in blocks of ``block_size`` along K, one fp32 scale per block (symmetric: the default zero point
128). With ``accuracy_level=4`` ONNX Runtime quantizes the activations to int8 too, but per row and block
(the MLAS "SQNBit" kernels: int8 dot products, VNNI where the CPU has it), never with one scale for the
whole batch as ``quantize_dynamic``'s MatMulInteger does: a segment's numbers do not depend on which
other segments share its batch. Built with numpy and onnx alone (ONNX Runtime's own quantizer for this
needs ``onnx_ir``, which this project does not install).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pipeline.asr.onnx_walk import subgraphs, used_names

BITS = 8
MS_DOMAIN = "com.microsoft"


def quantize_weight(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """[K, N] fp32 -> MatMulNBits' B (uint8 [N, K / block_size, block_size]) and scales (fp32
    [N * K / block_size]): per column, blocks along K, symmetric about the default zero point 128."""
    k, n = w.shape
    if k % block_size:
        raise ValueError(f"K = {k} is not a multiple of the block size {block_size}")
    blocks = np.ascontiguousarray(w.T, dtype=np.float32).reshape(n, k // block_size, block_size)
    scales = np.abs(blocks).max(axis=2) / 127.0
    scales[scales == 0] = 1.0  # an all-zero block: any scale gives zeros
    q = np.clip(np.rint(blocks / scales[..., None]), -127, 127).astype(np.int16) + 128
    return q.astype(np.uint8), scales.astype(np.float32).reshape(-1)


def dequantize_weight(b: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The fp32 [K, N] weight the quantized form stands for (what the tests compare with)."""
    n, blocks, size = b.shape
    w = (b.astype(np.float32) - 128.0) * scales.reshape(n, blocks, 1)
    return np.ascontiguousarray(w.reshape(n, blocks * size).T)


def quantize_model(src: Path, dst: Path, block_size: int = 32, accuracy_level: int = 4) -> int:
    """Write ``src`` with every weight MatMul as MatMulNBits to ``dst``; returns how many were replaced.

    A weight MatMul multiplies by a 2-D initializer, or by the ``Transpose`` of one (a tied output
    projection: Moonshine's logits are the embedding table transposed), in the graph or in a subgraph
    (Moonshine's merged decoder holds every layer inside the two branches of an ``If``, reading the
    weights from the outer graph). A weight shared by several MatMuls is quantized once."""
    model = onnx.load(str(src))
    graph = model.graph
    quantizer = _WeightQuantizer(graph, block_size, accuracy_level)
    replaced = quantizer.rewrite(graph)
    if not any(op.domain == MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    onnx.save(model, str(dst))
    return replaced


class _WeightQuantizer:
    """Replaces weight MatMuls by MatMulNBits; the quantized weights go into the top graph's initializers."""

    def __init__(self, top: onnx.GraphProto, block_size: int, accuracy_level: int) -> None:
        self.top = top
        self.block_size = block_size
        self.accuracy_level = accuracy_level
        self.quantized: dict[tuple[str, bool], tuple[str, str, int, int]] = {}

    def rewrite(self, graph: onnx.GraphProto, outer: dict[str, onnx.TensorProto] | None = None) -> int:
        weights = dict(outer or {}) | {init.name: init for init in graph.initializer}
        # Transposes of a 2-D initializer: their MatMul reads the transposed weight.
        transposed = {node.output[0]: weights[node.input[0]] for node in graph.node
                      if node.op_type == "Transpose" and node.input[0] in weights
                      and len(weights[node.input[0]].dims) == 2 and _is_plain_transpose(node)}
        nodes, replaced = [], 0
        for node in graph.node:
            for sub in subgraphs(node):
                replaced += self.rewrite(sub, weights)
            if node.op_type != "MatMul" or len(node.input) != 2:
                nodes.append(node)
                continue
            source, transpose = weights.get(node.input[1]), False
            if source is None and node.input[1] in transposed:
                source, transpose = transposed[node.input[1]], True
            if source is None or len(source.dims) != 2 or _k_of(source, transpose) % self.block_size:
                nodes.append(node)
                continue
            b_name, s_name, k, n = self._quantized(source, transpose)
            nodes.append(helper.make_node(
                "MatMulNBits", [node.input[0], b_name, s_name], list(node.output),
                name=f"{node.name or node.output[0]}_q8", domain=MS_DOMAIN, K=k, N=n, bits=BITS,
                block_size=self.block_size, accuracy_level=self.accuracy_level,
            ))
            replaced += 1
        del graph.node[:]
        graph.node.extend(nodes)
        # The weights' fp32 copies and transposes nothing reads any more (a subgraph reads its outer ones).
        used = used_names(graph)
        live = [node for node in graph.node if node.output[0] not in transposed or node.output[0] in used]
        del graph.node[:]
        graph.node.extend(live)
        used = used_names(graph)
        kept = [init for init in graph.initializer if init.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        return replaced

    def _quantized(self, source: onnx.TensorProto, transpose: bool) -> tuple[str, str, int, int]:
        key = (source.name, transpose)
        if key not in self.quantized:
            w = numpy_helper.to_array(source)
            w = np.ascontiguousarray(w.T) if transpose else w
            b, scales = quantize_weight(w, self.block_size)
            stem = f"{source.name}{'_T' if transpose else ''}_q8"
            self.top.initializer.extend([numpy_helper.from_array(b, stem), numpy_helper.from_array(scales, f"{stem}_scales")])
            self.quantized[key] = (stem, f"{stem}_scales", *w.shape)
        return self.quantized[key]


def _k_of(weight: onnx.TensorProto, transpose: bool) -> int:
    return int(weight.dims[1] if transpose else weight.dims[0])


def _is_plain_transpose(node: onnx.NodeProto) -> bool:
    perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
    return not perm or perm[0] == [1, 0]
