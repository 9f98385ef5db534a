"""TEMPORARY STUB (not committed)."""


class Coordinator:
    def __init__(self, **kw):
        pass

    def expire(self):
        pass

    def close(self):
        pass
