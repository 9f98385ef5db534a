"""The Python client, its transport and egress connector, against real servers on loopback."""
