"""The Kafka listener's parts in process (capella/kafka/).

Not ``tests/kafka``: the test directories' parent is on ``sys.path``, so a package named
``kafka`` there would be imported in place of kafka-python, the oracle these tests read with.
"""
