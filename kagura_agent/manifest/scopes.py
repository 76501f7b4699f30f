"""What a credential scope narrows: a scope that narrows nothing is refused unless it says so.

Every provider type but ``static`` mints from a root secret that can do more than any one
run needs (a role, a service account, an App installation). A scope must say what its
lease may do; one whose narrowing is absent or empty would lease the provider's whole
power, so it is refused unless the operator writes ``full_access: true`` on it — and then
``plan`` says FULL ACCESS wherever the credential appears. Pure and import-light: used by
validation (manifest/checks.py) and again by each provider before it mints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# OAuth scope of Google Cloud that covers everything the service account can do.
GCP_CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"

# The scope keys each provider type reads (description, max_ttl, full_access: all types).
SCOPE_KEYS: dict[str, tuple[str, ...]] = {
    "aws-sts": ("role_arn", "session_policy", "external_id"),
    "gcp": ("service_account", "scopes", "delegates"),
    "cloudflare": ("policies", "permission_groups", "resources"),
    "github-app": ("repositories", "permissions"),
    "static": (),
}
COMMON_KEYS = ("description", "max_ttl", "full_access")

# The keys that narrow a scope, per type, and what to write instead of nothing.
NARROWING: dict[str, tuple[str, ...]] = {
    "aws-sts": ("session_policy",),
    "gcp": ("scopes",),
    "github-app": ("permissions", "repositories"),
    "cloudflare": ("policies", "permission_groups", "resources"),
}
WHOLE: dict[str, str] = {
    "aws-sts": "everything its role can do",
    "gcp": "everything its service account can do (cloud-platform)",
    "github-app": "every permission and repository of the App installation",
}
HINTS: dict[str, str] = {
    "aws-sts": (
        'write session_policy: {Version: "2012-10-17", Statement: [{Effect: Allow, '
        "Action: [...], Resource: ...}]} naming what a run may do, or full_access: true"
    ),
    "gcp": (
        "write scopes: [https://www.googleapis.com/auth/<api>.readonly, ...] naming the "
        "APIs a run may use, or full_access: true"
    ),
    "github-app": (
        "write permissions: {contents: read, ...} and repositories: [name, ...], "
        "or full_access: true"
    ),
}


def is_full_access(scope: Mapping[str, Any]) -> bool:
    """Whether the operator opted this scope into its provider's whole power."""
    return scope.get("full_access") is True


def missing_narrowing(kind: str, scope: Mapping[str, Any]) -> str | None:
    """What is missing for ``scope`` of provider type ``kind`` to narrow anything, or None.

    None means the scope narrows (or is a full-access scope, which needs no narrowing;
    static and cloudflare scopes have no full-power default: see ``scope_problems``).
    """
    if is_full_access(scope):
        return None
    if kind == "aws-sts":
        policy = scope.get("session_policy")
        statements = policy.get("Statement") if isinstance(policy, Mapping) else None
        if not statements:
            return "session_policy (with at least one Statement)"
    elif kind == "gcp":
        wanted = scope.get("scopes")
        if not wanted:
            return "scopes"
        if GCP_CLOUD_PLATFORM in wanted:
            return "scopes narrower than cloud-platform"
    elif kind == "github-app":
        missing = [key for key in ("permissions", "repositories") if not scope.get(key)]
        if missing:
            return " and ".join(missing)
    return None


def scope_problems(kind: str, scope: Mapping[str, Any]) -> list[tuple[str | None, str, str]]:
    """Problems of one scope as (key or None for the scope itself, message, hint)."""
    problems: list[tuple[str | None, str, str]] = []
    own = SCOPE_KEYS.get(kind, ())
    for key in scope:
        if key not in own and key not in COMMON_KEYS:
            problems.append(
                (
                    key,
                    f"{key} is not a key of {kind} scopes: the provider ignores it",
                    "known here: " + ", ".join((*own, *COMMON_KEYS)),
                )
            )
    if is_full_access(scope):
        if kind not in WHOLE:
            reason = (
                "a static secret is handed over as it is (standing: true says so)"
                if kind == "static"
                else "a cloudflare token has exactly the policies listed"
            )
            problems.append(
                (
                    "full_access",
                    f"full_access does not apply to {kind}: {reason}",
                    "remove full_access",
                )
            )
        else:
            narrowing = [key for key in NARROWING[kind] if key in scope]
            for key in narrowing:
                problems.append(
                    (
                        key,
                        f"full_access: true and {key} contradict each other",
                        f"keep {key} (a narrowed scope) or full_access, not both",
                    )
                )
        return problems
    if kind == "cloudflare" and not scope.get("policies"):
        absent = [key for key in ("permission_groups", "resources") if not scope.get(key)]
        if absent:
            problems.append(
                (
                    None,
                    f"this cloudflare scope mints no token without {' and '.join(absent)}",
                    "write policies: [...], or permission_groups: [id, ...] with resources: "
                    '{"com.cloudflare.api.account.zone.<zone id>": "*"}',
                )
            )
    missing = missing_narrowing(kind, scope)
    if missing is not None:
        problems.append(
            (
                None,
                f"this {kind} scope narrows nothing without {missing}: a lease would get "
                f"{WHOLE[kind]}",
                HINTS[kind],
            )
        )
    return problems
