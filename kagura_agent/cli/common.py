"""Helpers shared by command modules: output formats and manifest options."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_manifest_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--manifests",
        metavar="DIR",
        help="manifest directory (default: $KAGURA_AGENT_MANIFESTS, ./manifests, or the packaged set)",
    )


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
