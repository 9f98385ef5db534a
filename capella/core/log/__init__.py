"""A queue's log: the binary formats, batches, sealed blocks and their summaries, dedup, the write path."""
