"""Users, passwords, tokens and permission rules; no HTTP here.

``password`` hashes and verifies; ``rule`` decides what an identity may do; ``store`` keeps
users and tokens in the data directory; ``authenticator`` turns credentials into an
``Identity`` without paying for a slow hash on every request; ``secret`` reads the secrets the
operator declared, and ``sealed`` seals the ones a definition stores.
"""
