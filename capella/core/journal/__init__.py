"""Changes appended to a storage ``Journal``: pipelined group commit, and change logs on top of it."""
