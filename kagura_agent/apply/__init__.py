"""apply: execute a launch plan exactly as shown (see executor.py for the sequence)."""
