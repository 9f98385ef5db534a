"""The Kafka protocol listener: Kafka clients produce to and consume from Capella's queues (docs/kafka.md)."""
