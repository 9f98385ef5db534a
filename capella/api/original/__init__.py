"""The original Capella's RPC endpoint (``POST /cluster``): a second front door onto the same model.

``envelope.py`` reads and writes the original's envelope (gzip, clock checks, the ``responce``
answer), ``codes.py`` holds its numeric error codes, ``shapes.py`` translates its bodies
(queues, messages, handlers, external clusters) to and from Capella's, ``actions.py`` maps each
action onto the cluster, supervisor, clusters and users, and ``endpoint.py`` serves it.
docs/compat.md lists every action and every deviation.
"""
