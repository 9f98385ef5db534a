"""The Kafka protocol listener: a front door onto the cluster's queues, loaded only with ``[kafka]``."""
