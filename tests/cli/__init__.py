"""The ``capella`` command against a real ``capella serve`` process."""
