"""Evaluation: real recorded speech with reference transcripts, telephony conditions, and WER."""

from pipeline.eval.conditions import CONDITIONS, apply_condition, conditioned
from pipeline.eval.dataset import EvalUtterance, load_eval_set
from pipeline.eval.wer import WordErrors, normalize_text, word_error_rate, word_errors

__all__ = [
    "CONDITIONS",
    "EvalUtterance",
    "WordErrors",
    "apply_condition",
    "conditioned",
    "load_eval_set",
    "normalize_text",
    "word_error_rate",
    "word_errors",
]
