"""Whisper encoder and decoder-step ONNX graphs, written node by node with onnx.helper.

The encoder takes a log-mel window of any even length (cost follows audio length, unlike Whisper's fixed
30 s window) and also emits every decoder layer's cross-attention keys and values, so they are computed
once per segment. The decoder step takes new tokens plus the self-attention cache and returns logits and
the grown cache; a cross-attention mask lets segments of different lengths share one batch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.asr.ct2 import Ct2Model

OPSET = 17
_NEG = -1e9


@dataclass(frozen=True)
class Dims:
    """Shape of a Whisper model, read from its weights."""

    d_model: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    vocab: int
    max_source_positions: int
    max_target_positions: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @classmethod
    def of(cls, model: Ct2Model) -> Dims:
        embeddings = model.get("decoder/embeddings/weight")

        def count(prefix: str) -> int:
            pattern = re.compile(rf"^{prefix}/layer_(\d+)/")
            return len({m.group(1) for k in model.variables if (m := pattern.match(k))})

        return cls(
            d_model=int(embeddings.shape[1]),
            heads=model.scalar("encoder/num_heads"),
            encoder_layers=count("encoder"),
            decoder_layers=count("decoder"),
            vocab=int(embeddings.shape[0]),
            max_source_positions=int(model.get("encoder/position_encodings/encodings").shape[0]),
            max_target_positions=int(model.get("decoder/position_encodings/encodings").shape[0]),
        )


@dataclass
class GraphWriter:
    """Collects nodes and initializers; every helper returns the name of the tensor it produced."""

    model: Ct2Model
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    _count: int = 0

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, value: np.ndarray, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, **attrs: Any) -> str:
        out = self.fresh(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def ops(self, op_type: str, inputs: list[str], n: int, **attrs: Any) -> list[str]:
        outs = [self.fresh(op_type.lower()) for _ in range(n)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs

    def weight(self, name: str) -> np.ndarray:
        return self.model.get(name).astype(np.float32)

    def linear(self, x: str, prefix: str, rows: slice | None = None, bias: bool = True) -> str:
        """y = x·Wᵀ + b with CTranslate2's [out, in] weights; `rows` picks a part of a fused weight."""
        w = self.weight(f"{prefix}/weight")
        w = w[rows] if rows is not None else w
        y = self.op("MatMul", [x, self.const(np.ascontiguousarray(w.T), "w")])
        if not bias:
            return y
        b = self.weight(f"{prefix}/bias")
        b = b[rows] if rows is not None else b
        return self.op("Add", [y, self.const(b, "b")])

    def layer_norm(self, x: str, prefix: str) -> str:
        gamma = self.const(self.weight(f"{prefix}/gamma"), "gamma")
        beta = self.const(self.weight(f"{prefix}/beta"), "beta")
        return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        # Exact erf GELU: Whisper was trained with it, the tanh form drifts.
        scaled = self.op("Div", [x, self.const(np.array(math.sqrt(2.0), np.float32))])
        erf = self.op("Erf", [scaled])
        one_plus = self.op("Add", [erf, self.const(np.array(1.0, np.float32))])
        half_x = self.op("Mul", [x, self.const(np.array(0.5, np.float32))])
        return self.op("Mul", [half_x, one_plus])

    def split_heads(self, x: str, dims: Dims) -> str:
        """[B, S, D] -> [B, H, S, Dh]."""
        shaped = self.op("Reshape", [x, self.const(np.array([0, 0, dims.heads, dims.head_dim], np.int64))])
        return self.op("Transpose", [shaped], perm=[0, 2, 1, 3])

    def merge_heads(self, x: str, dims: Dims) -> str:
        """[B, H, S, Dh] -> [B, S, D]."""
        t = self.op("Transpose", [x], perm=[0, 2, 1, 3])
        return self.op("Reshape", [t, self.const(np.array([0, 0, dims.d_model], np.int64))])

    def attention(self, q: str, k: str, v: str, dims: Dims, bias: str | None, few_queries: bool = False) -> str:
        """softmax(q·kᵀ/√Dh + bias)·v over [B, H, S, Dh] tensors.

        ``few_queries`` (the decoder's steps, one new token against S keys): the scores are computed as
        (k·qᵀ)ᵀ instead. q·kᵀ made ONNX Runtime transpose all of k on every step; k·qᵀ reads k as it
        is and transposes only the small [S, N] result. Same sums, same order per score: the decoder's
        tokens did not change. The encoder (N = S) keeps q·kᵀ, which ORT fuses without a transpose."""
        scale = self.const(np.array(1.0 / math.sqrt(dims.head_dim), np.float32))
        scaled_q = self.op("Mul", [q, scale])
        if few_queries:
            qt = self.op("Transpose", [scaled_q], perm=[0, 1, 3, 2])
            scores = self.op("Transpose", [self.op("MatMul", [k, qt])], perm=[0, 1, 3, 2])
        else:
            scores = self.op("MatMul", [scaled_q, self.op("Transpose", [k], perm=[0, 1, 3, 2])])
        if bias is not None:
            scores = self.op("Add", [scores, bias])
        probs = self.op("Softmax", [scores], axis=-1)
        return self.op("MatMul", [probs, v])

    def ffn(self, x: str, prefix: str) -> str:
        h = self.linear(self.layer_norm(x, f"{prefix}/layer_norm"), f"{prefix}/linear_0")
        return self.op("Add", [x, self.linear(self.gelu(h), f"{prefix}/linear_1")])

    def shape_dim(self, x: str, axis: int) -> str:
        """A 1-element int64 tensor holding x.shape[axis]."""
        return self.op("Shape", [x], start=axis, end=axis + 1)

    def finish(
        self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="callqa"
        )
        model.ir_version = 8
        return model


def _fused_rows(dims: Dims, index: int) -> slice:
    return slice(index * dims.d_model, (index + 1) * dims.d_model)


def _encoder_layer(g: GraphWriter, x: str, prefix: str, dims: Dims) -> str:
    normed = g.layer_norm(x, f"{prefix}/self_attention/layer_norm")
    fused = f"{prefix}/self_attention/linear_0"
    q = g.split_heads(g.linear(normed, fused, _fused_rows(dims, 0)), dims)
    k = g.split_heads(g.linear(normed, fused, _fused_rows(dims, 1), bias=False), dims)
    v = g.split_heads(g.linear(normed, fused, _fused_rows(dims, 2)), dims)
    context = g.merge_heads(g.attention(q, k, v, dims, None), dims)
    x = g.op("Add", [x, g.linear(context, f"{prefix}/self_attention/linear_1")])
    return g.ffn(x, f"{prefix}/ffn")


def _heads_info(name: str, dims: Dims, length: str) -> onnx.ValueInfoProto:
    """A [batch, heads, length, head_dim] float tensor: one layer's keys or values."""
    return helper.make_tensor_value_info(
        name, TensorProto.FLOAT, ["batch", dims.heads, length, dims.head_dim]
    )


def build_encoder(model: Ct2Model) -> onnx.ModelProto:
    """mel [B, n_mels, T] (T even) -> cross_k_<l>, cross_v_<l> [B, H, T/2, Dh] for every decoder layer l."""
    dims = Dims.of(model)
    g = GraphWriter(model)
    n_mels = int(model.get("encoder/conv1/weight").shape[1])
    conv1 = g.op(
        "Conv",
        ["mel", g.const(g.weight("encoder/conv1/weight")), g.const(g.weight("encoder/conv1/bias"))],
        pads=[1, 1],
        strides=[1],
        kernel_shape=[3],
    )
    conv2 = g.op(
        "Conv",
        [g.gelu(conv1), g.const(g.weight("encoder/conv2/weight")), g.const(g.weight("encoder/conv2/bias"))],
        pads=[1, 1],
        strides=[2],
        kernel_shape=[3],
    )
    x = g.op("Transpose", [g.gelu(conv2)], perm=[0, 2, 1])
    positions = g.const(g.weight("encoder/position_encodings/encodings"), "enc_pos")
    frames = g.shape_dim(x, 1)
    x = g.op(
        "Add",
        [
            x,
            g.op(
                "Slice",
                [positions, g.const(np.array([0], np.int64)), frames, g.const(np.array([0], np.int64))],
            ),
        ],
    )
    for layer in range(dims.encoder_layers):
        x = _encoder_layer(g, x, f"encoder/layer_{layer}", dims)
    encoded = g.layer_norm(x, "encoder/layer_norm")
    outputs = []
    for layer in range(dims.decoder_layers):
        fused = f"decoder/layer_{layer}/attention/linear_1"
        key = g.split_heads(g.linear(encoded, fused, _fused_rows(dims, 0), bias=False), dims)
        value = g.split_heads(g.linear(encoded, fused, _fused_rows(dims, 1)), dims)
        g.nodes.append(helper.make_node("Identity", [key], [f"cross_k_{layer}"]))
        g.nodes.append(helper.make_node("Identity", [value], [f"cross_v_{layer}"]))
        outputs += [
            _heads_info(f"cross_k_{layer}", dims, "frames"),
            _heads_info(f"cross_v_{layer}", dims, "frames"),
        ]
    mel = helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["batch", n_mels, "mel_frames"])
    return g.finish("whisper_encoder", [mel], outputs)


def _self_bias(g: GraphWriter, offset: str, new_len: str) -> str:
    """[B, 1, N, P+N] additive bias: new token i (cache column P+i) may see columns j <= P+i that
    ``self_mask`` marks visible. Rows of a batch prefill prompts of different lengths left-padded to
    one length; their padding columns stay masked for every later step."""
    zero = g.const(np.array(0, np.int64))
    one = g.const(np.array(1, np.int64))
    offset_s = g.op("Squeeze", [offset])
    total = g.op("Add", [offset_s, g.op("Squeeze", [new_len])])
    query_pos = g.op("Unsqueeze", [g.op("Range", [offset_s, total, one]), g.const(np.array([1], np.int64))])
    key_pos = g.op("Unsqueeze", [g.op("Range", [zero, total, one]), g.const(np.array([0], np.int64))])
    hidden = g.op("Greater", [key_pos, query_pos])
    causal = g.op("Where", [hidden, g.const(np.array(_NEG, np.float32)), g.const(np.array(0.0, np.float32))])
    padding = g.op("Unsqueeze", [_mask_bias(g, "self_mask"), g.const(np.array([1, 2], np.int64))])
    return g.op("Add", [causal, padding])


def _mask_bias(g: GraphWriter, mask: str) -> str:
    """A 0/1 mask [B, S] -> a 0/-1e9 additive bias [B, S]."""
    return g.op(
        "Mul",
        [g.op("Sub", [mask, g.const(np.array(1.0, np.float32))]), g.const(np.array(-_NEG, np.float32))],
    )


def _decoder_layer(g: GraphWriter, x: str, layer: int, dims: Dims, masks: tuple[str, str]) -> str:
    prefix = f"decoder/layer_{layer}"
    causal, cross_bias = masks
    normed = g.layer_norm(x, f"{prefix}/self_attention/layer_norm")
    fused = f"{prefix}/self_attention/linear_0"
    q = g.split_heads(g.linear(normed, fused, _fused_rows(dims, 0)), dims)
    k_new = g.split_heads(g.linear(normed, fused, _fused_rows(dims, 1), bias=False), dims)
    v_new = g.split_heads(g.linear(normed, fused, _fused_rows(dims, 2)), dims)
    g.nodes.append(helper.make_node("Concat", [f"past_k_{layer}", k_new], [f"present_k_{layer}"], axis=2))
    g.nodes.append(helper.make_node("Concat", [f"past_v_{layer}", v_new], [f"present_v_{layer}"], axis=2))
    context = g.merge_heads(g.attention(q, f"present_k_{layer}", f"present_v_{layer}", dims, causal, few_queries=True), dims)
    x = g.op("Add", [x, g.linear(context, f"{prefix}/self_attention/linear_1")])
    normed = g.layer_norm(x, f"{prefix}/attention/layer_norm")
    q = g.split_heads(g.linear(normed, f"{prefix}/attention/linear_0"), dims)
    context = g.merge_heads(g.attention(q, f"cross_k_{layer}", f"cross_v_{layer}", dims, cross_bias, few_queries=True), dims)
    x = g.op("Add", [x, g.linear(context, f"{prefix}/attention/linear_2")])
    return g.ffn(x, f"{prefix}/ffn")


def _select_token(g: GraphWriter, logits: str) -> None:
    """Greedy choice in the graph, so only a few numbers per row leave it: the argmax of the biased
    logits (`logit_bias` holds 0 or -inf per token: suppression), its log-probability under the
    biased distribution, the unbiased probability of the no-speech token, and, for beam search, the
    `top_k` best tokens with their log-probabilities.

    LogSoftmax, not ReduceLogSumExp: ONNX Runtime's ReduceLogSumExp took a quarter of a batch-16
    step (two passes over [B, vocab]); LogSoftmax runs on its vectorised softmax kernel."""
    axis = g.const(np.array([1], np.int64))
    biased = g.op("Add", [logits, "logit_bias"])
    chosen = g.op("ArgMax", [biased], axis=1, keepdims=1)
    logprobs = g.op("LogSoftmax", [biased], axis=1)
    chosen_logprob = g.op("GatherElements", [logprobs, chosen], axis=1)
    # Beam search reads each row's `top_k` best tokens and their log-probabilities (greedy asks for 1).
    g.nodes.append(helper.make_node("TopK", [logprobs, "top_k"], ["top_logprobs", "top_tokens"], axis=1))
    no_speech_logprob = g.op("Gather", [g.op("LogSoftmax", [logits], axis=1), "no_speech_id"], axis=1)
    g.nodes.append(helper.make_node("Squeeze", [chosen, axis], ["next_token"]))
    g.nodes.append(helper.make_node("Squeeze", [chosen_logprob, axis], ["next_logprob"]))
    g.nodes.append(helper.make_node("Squeeze", [g.op("Exp", [no_speech_logprob]), axis], ["no_speech_prob"]))


def build_decoder(model: Ct2Model) -> onnx.ModelProto:
    """One step for the batch. In: tokens [B, N] and their positions [B, N]; per layer l past_k_<l>/past_v_<l> [B, H, P, Dh] and
    cross_k_<l>/cross_v_<l> [B, H, S, Dh]; cross_mask [B, S] (1 = audio, 0 = padding); self_mask
    [B, P+N] (1 = a token, 0 = prompt padding); logit_bias [V]; no_speech_id [1]; top_k [1]. Out, for
    the last new token: next_token [B], next_logprob [B], no_speech_prob [B], top_tokens and
    top_logprobs [B, top_k];
    present_k_<l>/present_v_<l> [B, H, P+N, Dh]."""
    dims = Dims.of(model)
    g = GraphWriter(model)
    embeddings = g.weight("decoder/embeddings/weight")
    offset = g.shape_dim("past_k_0", 2)
    new_len = g.shape_dim("tokens", 1)
    one = g.const(np.array(1, np.int64))
    pos_table = g.const(g.weight("decoder/position_encodings/encodings"), "dec_pos")
    # Positions come in per row, not from the cache length: a row whose prompt was left-padded counts
    # its positions from its first real token, as Whisper saw them in training.
    x = g.op(
        "Add",
        [
            g.op("Gather", [g.const(embeddings, "embed"), "tokens"], axis=0),
            g.op("Gather", [pos_table, "positions"], axis=0),
        ],
    )
    # 0/1 audio mask -> 0/-1e9 bias broadcast over heads and query positions: [B, 1, 1, S].
    cross_bias = g.op("Unsqueeze", [_mask_bias(g, "cross_mask"), g.const(np.array([1, 2], np.int64))])
    masks = (_self_bias(g, offset, new_len), cross_bias)
    for layer in range(dims.decoder_layers):
        x = _decoder_layer(g, x, layer, dims, masks)
    last = g.op(
        "Gather",
        [g.layer_norm(x, "decoder/layer_norm"), g.op("Squeeze", [g.op("Sub", [new_len, one])])],
        axis=1,
    )
    # The output projection is the token embedding (tied); a separate transposed copy lets int8
    # quantization treat it as a plain MatMul.
    _select_token(g, g.op("MatMul", [last, g.const(np.ascontiguousarray(embeddings.T), "proj")]))
    inputs = [
        helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "new"]),
        helper.make_tensor_value_info("positions", TensorProto.INT64, ["batch", "new"]),
    ]
    outputs = [
        helper.make_tensor_value_info("next_token", TensorProto.INT64, ["batch"]),
        helper.make_tensor_value_info("next_logprob", TensorProto.FLOAT, ["batch"]),
        helper.make_tensor_value_info("no_speech_prob", TensorProto.FLOAT, ["batch"]),
        helper.make_tensor_value_info("top_tokens", TensorProto.INT64, ["batch", "k"]),
        helper.make_tensor_value_info("top_logprobs", TensorProto.FLOAT, ["batch", "k"]),
    ]
    for layer in range(dims.decoder_layers):
        inputs += [
            _heads_info(f"{kind}_{layer}", dims, length)
            for kind, length in (
                ("past_k", "past"),
                ("past_v", "past"),
                ("cross_k", "frames"),
                ("cross_v", "frames"),
            )
        ]
        outputs += [
            _heads_info(f"present_k_{layer}", dims, "total"),
            _heads_info(f"present_v_{layer}", dims, "total"),
        ]
    inputs += [
        helper.make_tensor_value_info("cross_mask", TensorProto.FLOAT, ["batch", "frames"]),
        helper.make_tensor_value_info("self_mask", TensorProto.FLOAT, ["batch", "total"]),
        helper.make_tensor_value_info("logit_bias", TensorProto.FLOAT, [dims.vocab]),
        helper.make_tensor_value_info("no_speech_id", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("top_k", TensorProto.INT64, [1]),
    ]
    return g.finish("whisper_decoder_step", inputs, outputs)
