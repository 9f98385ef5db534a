"""The Kafka listener in process: record batches, and (as they land) the protocol, groups and producers."""
