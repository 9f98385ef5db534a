"""The Kafka protocol listener, driven by real Kafka clients and raw frames."""
