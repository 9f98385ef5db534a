"""The optional C kernels (capella/kernels.py); everything else is in pyproject.toml.

``optional=True``: a machine without a C compiler or Python's headers installs without
them and runs the pure-Python equivalents, as aiohttp, yarl and multidict do.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("capella._kernels", ["capella/_kernels.c"], optional=True)])
