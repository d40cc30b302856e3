"""Walking an ONNX graph with its subgraphs (the branches of an ``If``), for the build-time rewrites
(moonshine_graphs.py, matmul_nbits.py)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs a node holds (an ``If``'s branches), each named: ONNX Runtime writes If branches unnamed,
    and refuses them on reading."""
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            if not attribute.g.name:
                attribute.g.name = f"{node.name or node.op_type}_{attribute.name}"
            yield attribute.g
        yield from attribute.graphs


def used_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name a node of ``graph`` or of its subgraphs reads, plus the graph's outputs."""
    used = {o.name for o in graph.output}
    for node in graph.node:
        used.update(node.input)
        for sub in subgraphs(node):
            used |= used_names(sub)
    return used
