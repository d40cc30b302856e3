"""Voice-activity detection (Silero VAD on ONNX Runtime) and per-leg speech segmentation."""

from pipeline.segmentation.segmenter import Segmenter, Silence, SpeechSegment, accept_many
from pipeline.segmentation.vad import SileroVad, VadStream, load_vad

__all__ = ["Segmenter", "SileroVad", "Silence", "SpeechSegment", "VadStream", "accept_many", "load_vad"]
