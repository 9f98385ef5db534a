"""Benchmarks of a real Capella server: ``python -m benchmarks`` (``make bench``).

Every scenario starts ``capella serve`` as a subprocess on 127.0.0.1 with a fresh data
directory, drives it with aiohttp clients from this process, and reports what it measured
next to the targets. ``docs/benchmarks.md`` explains the scenarios and the latest figures.
"""
