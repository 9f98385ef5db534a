"""The Kafka protocol listener: a front door beside ``capella.api``, imported only when ``[kafka]`` is set."""
