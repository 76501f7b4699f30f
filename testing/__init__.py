"""Local fakes that speak real protocols on 127.0.0.1 (never imported by the package)."""
