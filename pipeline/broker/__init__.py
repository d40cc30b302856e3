"""Kafka: the local broker, topic creation and the producer every callqa writer shares."""
