"""The fault-injection suite: ``pytest -m chaos`` runs it alone."""
