"""aws-sts: STS AssumeRole for a bounded duration, narrowed by a session policy.

scope_spec keys: role_arn (required), session_policy (IAM policy object; required unless full_access: true),
external_id, region (default us-east-1), endpoint (STS endpoint URL, for tests and
partitions), max_retries (default 2), bundle_endpoint (endpoint_url written into the container's AWS config).

The root secret is JSON {"aws_access_key_id": …, "aws_secret_access_key": …} or the
short form "ACCESS_KEY_ID:SECRET_ACCESS_KEY". STS credentials cannot be revoked one by
one: release records the expiry and lets them lapse, so leases stay short.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kagura_agent.clock import Clock
from kagura_agent.errors import UsageError
from kagura_agent.membrane.providers import (
    CREDS_DIR,
    Bundle,
    Minted,
    ProviderError,
    http_failure,
    require_extra,
    require_narrowing,
)
from kagura_agent.membrane.providers.traits import TRAITS

_TRANSIENT_CODES = {
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "IDPCommunicationError",
}


def _root_keys(secret: str) -> tuple[str, str]:
    text = secret.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
            return str(data["aws_access_key_id"]), str(data["aws_secret_access_key"])
        except (ValueError, KeyError, TypeError):
            raise UsageError(
                "aws-sts root secret JSON needs aws_access_key_id and aws_secret_access_key"
            ) from None
    key_id, sep, secret_key = text.partition(":")
    if not sep or not key_id or not secret_key:
        raise UsageError(
            "aws-sts root secret must be JSON with aws_access_key_id/aws_secret_access_key"
            " or ACCESS_KEY_ID:SECRET_ACCESS_KEY"
        )
    return key_id, secret_key


class AwsStsProvider:
    kind = "aws-sts"
    # revocable, min_ttl, max_ttl: membrane/providers/traits.py (one table for all)
    revocable = TRAITS["aws-sts"].revocable
    min_ttl = TRAITS["aws-sts"].min_ttl
    max_ttl = TRAITS["aws-sts"].max_ttl

    def __init__(self, settings: Mapping[str, Any], root_secret: str) -> None:
        boto3 = require_extra("boto3", "aws")
        botocore_config = require_extra("botocore.config", "aws")
        key_id, secret_key = _root_keys(root_secret)
        self.region = str(settings.get("region") or "us-east-1")
        self._client = boto3.client(
            "sts",
            aws_access_key_id=key_id,
            aws_secret_access_key=secret_key,
            region_name=self.region,
            endpoint_url=settings.get("endpoint") or None,
            config=botocore_config.Config(
                connect_timeout=10,
                read_timeout=30,
                retries={
                    "mode": "standard",
                    "total_max_attempts": 1 + int(settings.get("max_retries", 2)),
                },
            ),
        )

    def mint(self, scope_spec: Mapping[str, Any], ttl_seconds: int, lease_id: str) -> Minted:
        role_arn = scope_spec.get("role_arn")
        if not isinstance(role_arn, str) or not role_arn:
            raise UsageError("aws-sts scope_spec needs role_arn")
        require_narrowing("aws-sts", scope_spec)
        kwargs: dict[str, Any] = {
            "RoleArn": role_arn,
            "RoleSessionName": f"kagura-{lease_id}"[:64],
            "DurationSeconds": max(self.min_ttl, min(self.max_ttl, ttl_seconds)),
        }
        if scope_spec.get("session_policy"):
            kwargs["Policy"] = json.dumps(scope_spec["session_policy"], sort_keys=True)
        if scope_spec.get("external_id"):
            kwargs["ExternalId"] = str(scope_spec["external_id"])
        response = self._call("AssumeRole", lambda: self._client.assume_role(**kwargs))
        creds = response["Credentials"]
        expires = creds["Expiration"]
        if isinstance(expires, str):
            expires = datetime.fromisoformat(expires.replace("Z", "+00:00"))
        expires_at = expires.astimezone(UTC)
        ini = (
            "[default]\n"
            f"aws_access_key_id = {creds['AccessKeyId']}\n"
            f"aws_secret_access_key = {creds['SecretAccessKey']}\n"
            f"aws_session_token = {creds['SessionToken']}\n"
        )
        config = f"[default]\nregion = {self.region}\n"
        if scope_spec.get("bundle_endpoint"):
            config += f"endpoint_url = {scope_spec['bundle_endpoint']}\n"
        bundle = Bundle(
            files={"aws/credentials": ini, "aws/config": config},
            env={
                "AWS_SHARED_CREDENTIALS_FILE": f"{CREDS_DIR}/aws/credentials",
                "AWS_CONFIG_FILE": f"{CREDS_DIR}/aws/config",
                "AWS_DEFAULT_REGION": self.region,
            },
            plain=frozenset(
                {"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_DEFAULT_REGION"}
            ),
        )
        return Minted(
            id=str(response["AssumedRoleUser"]["Arn"]),
            expires_at=expires_at,
            bundle=bundle,
            secrets=(creds["SecretAccessKey"], creds["SessionToken"]),
            for_proxy=(
                f"{creds['AccessKeyId']}:{creds['SecretAccessKey']}:{creds['SessionToken']}"
            ),
        )

    def revoke(self, minted_id: str) -> bool:
        """Nothing to revoke: STS session credentials lapse at their expiry."""
        return False

    def find(self, lease_id: str) -> list[str]:
        return []

    def _call(self, operation: str, call: Any) -> Any:
        botocore_exceptions = require_extra("botocore.exceptions", "aws")
        try:
            return call()
        except botocore_exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", "?"))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if code in _TRANSIENT_CODES:
                raise ProviderError(f"sts {operation}: {code}", transient=True) from None
            failure = http_failure(status, f"sts {operation} {code}")
            raise ProviderError(str(failure), transient=failure.transient) from None
        except (
            botocore_exceptions.EndpointConnectionError,
            botocore_exceptions.ConnectionError,
            botocore_exceptions.ReadTimeoutError,
        ) as exc:
            # No connection made (the endpoint could not be reached): nothing was minted.
            unsent = isinstance(
                exc,
                botocore_exceptions.EndpointConnectionError
                | botocore_exceptions.ConnectTimeoutError,
            )
            raise ProviderError(
                f"sts {operation}: {type(exc).__name__}", transient=True, unsent=unsent
            ) from None
        except botocore_exceptions.BotoCoreError as exc:
            raise ProviderError(f"sts {operation}: {type(exc).__name__}", transient=False) from None


def create(settings: Mapping[str, Any], root_secret: str, clock: Clock) -> AwsStsProvider:
    """``clock`` is unused: the provider's API dates its credentials."""
    return AwsStsProvider(settings, root_secret)
