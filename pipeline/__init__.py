"""callqa: streaming speech-to-text for contact-center quality assurance.

The data path reads from the package tree:
ingest -> audio -> segmentation -> asr (batched inference, decoding) -> qa -> store / broker sinks,
with ``worker`` (the Faust app) a thin shell around that pure core.
"""

__version__ = "0.1.0"
