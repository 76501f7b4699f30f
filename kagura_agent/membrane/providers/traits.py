"""What each credential provider type can do, as data the planner may read.

No SDK is imported here: ``plan``, ``leases list`` and the docs read these without
building a provider. Each provider module takes its ``revocable``, ``min_ttl`` and
``max_ttl`` from this table, so the two can never disagree.

How a lease of each type ends (``release``):

- ``revoked``: release revokes it at the provider, and after a crash the sweeper revokes
  it by the id the ledger kept (cloudflare: a scoped API token, deleted).
- ``revoked-live``: release revokes it, but only the process that minted it holds what
  revoking needs (the token itself); after a crash it lapses at its expiry (gcp: an OAuth
  access token; github-app: an installation token).
- ``lapses``: nothing can revoke it; it works until its expiry, at most one lease
  (aws-sts: session credentials. Cutting them off early takes a deny policy on the role
  for sessions issued before a time, which the broker does not hold).
- ``standing``: a standing secret handed through as is (static): nothing is minted, so
  nothing is revoked and nothing lapses; it works until the operator rotates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast, get_args

Release = Literal["revoked", "revoked-live", "lapses", "standing"]


@dataclass(frozen=True)
class Traits:
    release: Release
    min_ttl: int  # the shortest credential the provider can mint (seconds)
    max_ttl: int  # the longest one the broker asks for (seconds)

    @property
    def revocable(self) -> bool:
        """Revocable by the minted id alone, i.e. by the sweeper after a crash too."""
        return self.release == "revoked"

    def says(self, expires: str = "its expiry") -> str:
        """How a lease of this type ends, in a few words (``leases list``, the plan)."""
        return {
            "revoked": "revoked at release (and by the sweeper after a crash)",
            "revoked-live": (
                f"revoked at release; after a crash it lapses at {expires} (only the"
                " process that minted it can revoke it)"
            ),
            "lapses": f"cannot be revoked: lapses at {expires}",
            "standing": "a standing secret: never revoked, never lapses (rotate it yourself)",
        }[self.release]

    @property
    def brief(self) -> str:
        """How a lease of this type ends, for the plan's credential line."""
        return {
            "revoked": "revoked at release",
            "revoked-live": "revoked at release (lapses if the run crashes)",
            "lapses": "NOT revocable: lapses at its expiry",
            "standing": "never revoked, never lapses",
        }[self.release]


TRAITS: dict[str, Traits] = {
    # STS refuses DurationSeconds below 15 minutes; role chaining and most roles cap
    # sessions at one hour.
    "aws-sts": Traits("lapses", min_ttl=900, max_ttl=3600),
    "cloudflare": Traits("revoked", min_ttl=60, max_ttl=3600),
    # generateAccessToken's default ceiling is one hour.
    "gcp": Traits("revoked-live", min_ttl=60, max_ttl=3600),
    # An installation token lives one hour, whatever is asked.
    "github-app": Traits("revoked-live", min_ttl=3600, max_ttl=3600),
    "static": Traits("standing", min_ttl=1, max_ttl=3600),
}


RELEASES: tuple[str, ...] = get_args(Release)


def release_says(release: str, expires: str = "its expiry") -> str:
    """How a credential of a recorded release kind ends, in a few words (the ledger's
    rows keep the kind: a row written by another version may name one unknown here)."""
    if release not in RELEASES:
        return "how it ends is not known (a provider type this version does not know)"
    return Traits(cast(Release, release), min_ttl=1, max_ttl=1).says(expires)


def traits_of(provider_type: str) -> Traits | None:
    """The traits of a provider type, or None for a type this version does not know."""
    return TRAITS.get(provider_type)
