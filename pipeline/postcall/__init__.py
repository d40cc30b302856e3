"""The post-call pass: a finished call transcribed again by the accurate model, stored as its next revision."""
