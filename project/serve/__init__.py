"""`python -m project serve`: the trained classifier behind an HTTP endpoint (LitServe, dynamic batching)."""
