"""The Python side of the Avro contracts in schemas/: typed messages and their Confluent-framed serde."""

from pipeline.contracts.messages import (
    AudioFrame,
    CallEvent,
    CallQA,
    DeadLetter,
    LatencyMetric,
    LiveCall,
    Message,
    QaAlert,
    QaEvent,
    QaItem,
    TranscriptSegment,
)
from pipeline.contracts.serde import ContractError, Serde

__all__ = [
    "AudioFrame", "CallEvent", "CallQA", "ContractError", "DeadLetter", "LatencyMetric", "LiveCall", "Message",
    "QaAlert", "QaEvent", "QaItem", "Serde", "TranscriptSegment",
]
