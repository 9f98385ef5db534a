"""What the tests share: starting real servers, HTTP helpers, waiting with a deadline, fault injection."""
