"""Users, passwords, tokens and permission rules (no HTTP)."""
