"""``kill -9``, power loss and disk faults against real server processes."""
