"""The auth package on its own: hashes, rules, users and tokens."""
