"""Which credential of a plan the proxy injects, so the agent never holds it.

An sdk brain in the container (``auth.mode`` api-key, subscription or cloud) calls its
model endpoint (plan/endpoint.py): the Anthropic API, a gateway, Bedrock or Vertex. Its
credential is not delivered into the container: apply gives it to the run's proxy, and
the agent the proxy's key-injecting port as its endpoint plus a placeholder where the CLI
expects a credential; the proxy drops the placeholder and adds the real credential
upstream. Pure and light: the plan renderer imports it.
"""

from __future__ import annotations

from kagura_agent.manifest.endpoint import INJECTED_MODES
from kagura_agent.plan.model import BrainSection, Plan

PLACEHOLDER = "injected-at-the-proxy"
# The Claude Code CLI's documented switches for its optional traffic (its settings and
# environment-variable reference): telemetry, error reports, update checks, feature flags
# and the other nonessential requests it would send beside the model calls (measured: a
# session without them opened 5 CONNECT tunnels to api.anthropic.com; with them none),
# its feedback survey and its terminal-title calls. What is left is the model calls, which
# go to ANTHROPIC_BASE_URL: the key-injecting port.
CLI_ENVIRONMENT = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
}


def injected_provider(plan: Plan) -> str | None:
    """The credential provider whose key the proxy injects for this plan's brain, if any."""
    return brain_injection(plan["brain"])


def brain_injection(brain: BrainSection) -> str | None:
    """``injected_provider`` from the brain section alone (the planner, before the plan)."""
    auth = brain["auth"]
    if (
        brain["engine"] == "sdk"
        and brain["runtime"] == "container"
        and auth["mode"] in INJECTED_MODES
    ):
        return auth["credential"]
    return None
