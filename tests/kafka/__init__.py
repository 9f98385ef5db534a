"""The Kafka protocol listener's parts, in process: the group coordinator, records, offsets."""
