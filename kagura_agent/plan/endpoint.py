"""The plan's model endpoint of an sdk brain in the container: pure, the planner calls it.

The CLI is pointed at the run's key-injecting port with its documented switches
(Claude Code's settings reference and its LLM-gateway guide): ``ANTHROPIC_BASE_URL`` for
the Messages API; ``CLAUDE_CODE_USE_BEDROCK``, ``AWS_REGION``,
``ANTHROPIC_BEDROCK_BASE_URL`` and ``CLAUDE_CODE_SKIP_BEDROCK_AUTH`` for Bedrock (the
port signs, the CLI sends unsigned calls); ``CLAUDE_CODE_USE_VERTEX``,
``CLOUD_ML_REGION``, ``ANTHROPIC_VERTEX_PROJECT_ID``, ``ANTHROPIC_VERTEX_BASE_URL`` and
``CLAUDE_CODE_SKIP_VERTEX_AUTH`` for Vertex (the port adds the token). Where the CLI
expects a credential of its own it gets a placeholder the port throws away:
``ANTHROPIC_API_KEY`` for a key, ``CLAUDE_CODE_OAUTH_TOKEN`` for a subscription (so the
CLI speaks as a subscriber does: ``Authorization: Bearer`` and the oauth beta).
"""

from __future__ import annotations

from collections.abc import Sequence

from kagura_agent.manifest.catalog import Manifest
from kagura_agent.manifest.endpoint import BrainEndpoint, read_endpoint
from kagura_agent.membrane.egress.modelport import INJECT_PORT
from kagura_agent.plan.injection import PLACEHOLDER
from kagura_agent.plan.model import CredentialBase, ModelEndpointBase

PORT_URL = f"http://127.0.0.1:{INJECT_PORT}"


def cli_environment(endpoint: BrainEndpoint) -> dict[str, str]:
    """What the CLI is told: the port as its endpoint, and no credential of its own."""
    if endpoint.api == "bedrock":
        return {
            "CLAUDE_CODE_USE_BEDROCK": "1",
            "AWS_REGION": str(endpoint.region),
            "ANTHROPIC_BEDROCK_BASE_URL": PORT_URL,
            "CLAUDE_CODE_SKIP_BEDROCK_AUTH": "1",
        }
    if endpoint.api == "vertex":
        return {
            "CLAUDE_CODE_USE_VERTEX": "1",
            "CLOUD_ML_REGION": str(endpoint.region),
            "ANTHROPIC_VERTEX_PROJECT_ID": str(endpoint.project),
            "ANTHROPIC_VERTEX_BASE_URL": f"{PORT_URL}/v1",
            "CLAUDE_CODE_SKIP_VERTEX_AUTH": "1",
        }
    if endpoint.auth == "oauth":
        return {"ANTHROPIC_BASE_URL": PORT_URL, "CLAUDE_CODE_OAUTH_TOKEN": PLACEHOLDER}
    return {"ANTHROPIC_BASE_URL": PORT_URL, "ANTHROPIC_API_KEY": PLACEHOLDER}


def model_endpoint(
    brain: Manifest, runtime: str, credentials: Sequence[CredentialBase]
) -> ModelEndpointBase | None:
    """The brain's model endpoint with the leased credential it uses, or None when the
    brain's calls take no credential injected at the proxy (script, kagura-brain, host)."""
    spec = brain.spec
    if spec["engine"] != "sdk" or runtime != "container":
        return None
    endpoint, problems = read_endpoint(spec)
    if endpoint is None or problems:
        return None
    name = spec["auth"].get("credential")
    scope = spec["auth"].get("scope")
    leased = next(
        (
            c
            for c in credentials
            if c["provider"] == name and (scope is None or c["scope"] == scope)
        ),
        None,
    )
    if leased is None:
        return None
    found: ModelEndpointBase = {
        "api": endpoint.api,
        "url": endpoint.url,
        "region": endpoint.region,
        "project": endpoint.project,
        "auth": endpoint.auth,
        "credential": leased["provider"],
        "scope": leased["scope"],
        "environment": cli_environment(endpoint),
        "category": endpoint.category,
    }
    if endpoint.ca is not None:
        found["ca"] = {"pem": endpoint.ca.pem, "sha256": list(endpoint.ca.sha256)}
    if endpoint.local is not None:
        local = endpoint.local
        found["local"] = {
            "network": local.network,
            "container": local.container,
            "port": local.port,
        }
    return found


def endpoint_baseline(brain: Manifest) -> bool:
    """Whether runs may use the brain's endpoint without asking: the default Anthropic
    API, or an endpoint the Brain marks ``baseline: true``."""
    endpoint, _ = read_endpoint(brain.spec)
    return endpoint is not None and endpoint.baseline
