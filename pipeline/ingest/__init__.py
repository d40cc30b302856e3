"""Ingest: playing telephony audio into Kafka the way SIP recorders and media gateways do."""
