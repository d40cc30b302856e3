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
    """Write ``src`` with every weight MatMul as MatMulNBits to ``dst``; returns how many were replaced."""
    model = onnx.load(str(src))
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    used_elsewhere = _uses(graph)
    nodes, replaced, dropped = [], 0, set()
    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is None or len(weight.dims) != 2 or weight.dims[0] % block_size:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weight)
        b, scales = quantize_weight(w, block_size)
        k, n = w.shape
        b_name, s_name = f"{weight.name}_q8", f"{weight.name}_q8_scales"
        graph.initializer.extend([numpy_helper.from_array(b, b_name), numpy_helper.from_array(scales, s_name)])
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], b_name, s_name], list(node.output),
                                      name=f"{node.name or node.output[0]}_q8", domain=MS_DOMAIN, K=k, N=n,
                                      bits=BITS, block_size=block_size, accuracy_level=accuracy_level))
        replaced += 1
        if used_elsewhere[weight.name] == 1:
            dropped.add(weight.name)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [init for init in graph.initializer if init.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(op.domain == MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    onnx.save(model, str(dst))
    return replaced


def _uses(graph: onnx.GraphProto) -> dict[str, int]:
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    return uses
