"""The Kafka protocol listener: unmodified Kafka clients produce to and consume from Capella queues."""
