"""Links: the other Capella clusters this one talks to (the API's "external clusters").

"Cluster" in the code is this broker (``capella/core/cluster.py``); another broker is a link.
The HTTP paths and JSON keep the API's words (``/v1/clusters``, ``ClusterInfo``).

- ``link.py``: ``Link``, one link as defined, stored and shown.
- ``registry.py``: ``Links``, the registry: the catalog's ``CLUSTERS``, one client per link,
  the far side's name check, ping.
- ``reach.py``: ``Reach``, what a handler may reach beyond its queues (links, secrets, egress).
- ``relay.py``: what a ``/v1`` request relayed through a link may be, and how its answer is
  served (the HTTP handler is ``capella/api/relay.py``).
"""
