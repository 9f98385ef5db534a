"""Messages as bytes, below both the HTTP contract (``wire``) and the model (``core``).

``record_batch``: the record batch, a run of messages as one framed unit, the same bytes from
a producer's body to the journal, the sealed block and a reader's page (docs/format.md).
"""
