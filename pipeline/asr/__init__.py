"""Whisper speech recognition on ONNX Runtime: model build, batched greedy decoding, engine API."""
