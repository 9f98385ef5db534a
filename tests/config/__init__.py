"""The configuration files and keys."""
