"""The model and its rules, in process: queues, blocks, dedup, the log, delayed delivery, work queues."""
