"""The launch plan: model, pure compiler, policy, rendering, diff, plan files."""
