"""The original Capella's RPC endpoint (``POST /cluster``): a second front door onto the same model.

``envelope.py`` reads and writes the original's envelope (gzip, clock checks, the ``responce``
answer), ``codes.py`` holds its numeric error codes, ``shapes.py`` its queue and message
structs. ``actions.py`` maps each action onto the cluster, with ``handlers.py``, ``clusters.py``
and ``security.py`` for handlers, external clusters and users: each decodes the original's body
into its struct and translates it into the wire struct ``/v1`` takes, and shows Capella's back
in the original's struct. ``endpoint.py`` serves it and passes calls on to external clusters.
Only ``api/app.py`` imports this package (pyproject.toml's contracts). docs/compat.md lists
every action and every deviation.
"""
