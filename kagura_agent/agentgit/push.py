"""Pushing an agent's branch: a separate, approved step, through a leased credential, never
forced (``kagura-agent push``).

A run with ``spec.commits: branch`` brings the agent's commits back as the local branch
``kagura/<task>/<run>`` and pushes nothing. After review, the operator pushes it:

- only a branch of that shape, to the same name on the remote, with a refspec that has no
  ``+`` and no ``--force`` of any kind: a remote branch of that name that is not an
  ancestor makes git refuse (non-fast-forward), and nothing else on the remote changes;
- through a credential leased for the push from a CredentialProvider manifest (a GitHub
  App installation token, or any provider whose lease carries one token), released as
  soon as git is done; the token travels in an HTTP header git reads from its
  environment (never in argv, a URL or a config file), and git's output is scrubbed of it;
- no hooks (``core.hooksPath=/dev/null``), no credential helper, no terminal prompt, no
  tags, no submodules; https only (plain http to a loopback address, for a local mirror);
- the operator says yes to exactly what is shown: the branch, its commits over HEAD, the
  remote and the credential.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kagura_agent import hostproc
from kagura_agent.errors import RefusedError, SetupError, UsageError
from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.gitinputs import git_environment, host_git
from kagura_agent.manifest.task import CredentialRequest
from kagura_agent.membrane.leases.broker import Broker, LeaseRequest
from kagura_agent.membrane.lifetimes import LEASE_MIN_SECONDS
from kagura_agent.membrane.providers.traits import traits_of
from kagura_agent.plan.grants import credential_entry
from kagura_agent.units import format_duration

BRANCH = re.compile(r"^kagura/[a-z0-9][a-z0-9-]{0,62}/run-[0-9a-f]{6,32}$")
PUSH_SECONDS = 300.0
# Lease token variables, in the order a push takes them (GitHub App: GH_TOKEN).
TOKEN_VARIABLES = ("GH_TOKEN", "GITHUB_TOKEN", "GIT_TOKEN")


@dataclass(frozen=True)
class PushRequest:
    """What the operator is asked to approve, and then what is done."""

    repo: str  # the operator's work tree (its top)
    branch: str  # kagura/<task>/<run>
    tip: str  # the commit pushed
    ahead: int  # commits on the branch that HEAD does not have
    url: str  # the remote, without credentials
    provider: str
    scope: str
    credential: dict[str, Any]  # the plan-shaped credentials entry leased for the push

    def describe(self) -> str:
        noun = "commit" if self.ahead == 1 else "commits"
        return (
            f"push {self.branch} ({self.ahead} {noun} over HEAD, tip {self.tip[:12]})\n"
            f"  to   {self.url} as refs/heads/{self.branch}\n"
            "       never forced: a branch of that name there that this one does not extend"
            " is left as it is\n"
            f"  with {self.provider}/{self.scope}, leased for the push"
            f" ({format_duration(int(self.credential['budget_seconds']))} at most), released"
            " after"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "branch": self.branch,
            "tip": self.tip,
            "ahead": self.ahead,
            "remote": self.url,
            "credential": f"{self.provider}/{self.scope}",
        }


def checked_url(url: str) -> str:
    """The remote's URL, if a push may go there: https, or http to a loopback address; no
    user name or password in it (the credential is the lease's)."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise UsageError(
            f"--to {url!r}: a remote URL must not carry credentials",
            hint="the push uses the leased credential (--credential PROVIDER/SCOPE)",
        )
    host = parts.hostname or ""
    if parts.scheme == "https" and host:
        return url
    if parts.scheme == "http" and _loopback(host):
        return url
    raise UsageError(
        f"--to {url!r}: only https:// remotes (or http:// on a loopback address) are pushed to"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def prepare(repo: str, branch: str, url: str, credential: str, catalog: Catalog) -> PushRequest:
    """Check everything the push needs before anything is leased; a located UsageError or
    RefusedError for what is wrong."""
    if not BRANCH.match(branch):
        raise UsageError(
            f"{branch!r} is not an agent's branch",
            hint="push takes the branch a run brought back: kagura/<task>/run-<id>",
        )
    url = checked_url(url)
    top = host_git(repo, ["rev-parse", "--show-toplevel"])
    if top is None:
        raise UsageError(f"{repo} is not in a git work tree")
    top_dir = os.fsdecode(top).strip()
    tip = host_git(top_dir, ["rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"])
    if tip is None:
        raise UsageError(f"no branch {branch} in {top_dir}")
    ahead = host_git(top_dir, ["rev-list", "--count", f"HEAD..refs/heads/{branch}"])
    provider_name, _, scope = credential.partition("/")
    provider = catalog.get("CredentialProvider", provider_name)
    if provider is None or not scope:
        known = ", ".join(catalog.names("CredentialProvider")) or "(none)"
        raise UsageError(
            f"--credential {credential!r}: no CredentialProvider of that name",
            hint=f"PROVIDER/SCOPE; known providers: {known}",
        )
    if scope not in provider.spec["scopes"]:
        raise UsageError(
            f"--credential {credential!r}: provider {provider_name!r} has no scope {scope!r}",
            hint="known: " + ", ".join(sorted(provider.spec["scopes"])),
        )
    return PushRequest(
        repo=top_dir,
        branch=branch,
        tip=os.fsdecode(tip).strip(),
        ahead=int(os.fsdecode(ahead or b"0").strip() or 0),
        url=url,
        provider=provider_name,
        scope=scope,
        credential=_credential_entry(provider, scope),
    )


def _credential_entry(provider: Any, scope: str) -> dict[str, Any]:
    """The credential as a plan names one (plan/grants.credential_entry), approved by the
    operator for this push: one lease, as short as the provider can mint."""
    traits = traits_of(str(provider.spec["type"]))
    seconds = max(LEASE_MIN_SECONDS, traits.min_ttl if traits is not None else 0)
    entry = credential_entry(CredentialRequest(provider, scope, seconds, 0, seconds))
    return {**entry, "class": "approved"}


@dataclass(frozen=True)
class Pushed:
    ok: bool
    message: str  # git's report, scrubbed of the token


def push(request: PushRequest, store: Any) -> Pushed:
    """Lease the credential, push the branch (never forced), release the lease."""
    git = shutil.which("git")
    if git is None:
        raise SetupError("git is not installed")
    broker = Broker(store, run_id=f"push-{request.tip[:12]}")
    try:
        lease = broker.acquire(LeaseRequest.from_plan(request.credential))
        token = _token(lease.bundle.env, request)
        broker.redactor.add(token)
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        broker.redactor.add(basic)
        # Read from the environment (git 2.31+): nothing in argv (ps) or a config file.
        settings = {
            "http.extraHeader": f"Authorization: Basic {basic}",
            "credential.helper": "",
            "core.hooksPath": "/dev/null",
            "core.fsmonitor": "false",
            "push.followTags": "false",
            "submodule.recurse": "false",
            "safe.directory": request.repo,
        }
        env = {**git_environment(), "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/false"}
        env["GIT_CONFIG_COUNT"] = str(len(settings))
        for index, (key, value) in enumerate(settings.items()):
            env[f"GIT_CONFIG_KEY_{index}"] = key
            env[f"GIT_CONFIG_VALUE_{index}"] = value
        refspec = f"refs/heads/{request.branch}:refs/heads/{request.branch}"
        try:
            done = hostproc.run(
                [
                    git,
                    "-C",
                    request.repo,
                    "push",
                    "--porcelain",
                    "--no-verify",
                    "--atomic",
                    "--recurse-submodules=no",
                    request.url,
                    refspec,
                ],
                env=env,
                capture_output=True,
                timeout=PUSH_SECONDS,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return Pushed(False, f"git push took longer than {PUSH_SECONDS:g} s")
        said = broker.redactor.scrub((done.stdout + done.stderr).decode(errors="replace"))
        return Pushed(done.returncode == 0, _summary(said, request.branch))
    finally:
        broker.release_all()


def _token(env: Mapping[str, str], request: PushRequest) -> str:
    for name in TOKEN_VARIABLES:
        if env.get(name):
            return env[name]
    if len(env) == 1:
        return next(iter(env.values()))
    raise RefusedError(
        f"credential {request.provider}/{request.scope} gives no token a push could use",
        hint=f"a provider whose lease sets one of {', '.join(TOKEN_VARIABLES)}",
    )


def _summary(said: str, branch: str) -> str:
    """git's porcelain line for the branch (``!`` rejected, with the reason), else all."""
    for line in said.splitlines():
        if f"refs/heads/{branch}" in line and "\t" in line:
            flag, _, rest = line.partition("\t")
            summary = rest.split("\t", 1)[-1]
            if flag.strip() == "!":
                return f"rejected: {summary} (a push is never forced)"
            return f"pushed: {summary}"
    return said.strip()[-2000:] or "git push said nothing"
