"""One small module per command; ``main`` wires them into argparse."""
