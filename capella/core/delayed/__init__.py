"""Delayed delivery: a queue's schedule, its items and chunk files, and the split of a produce request."""
