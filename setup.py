"""Build hook: ship the top-level schemas/, manifests/, images/ and requirements/ (the
dependency lock the agent image installs from) inside the wheel.

The repository keeps them at the top level (they are the project's source of truth and
operators read them there); the installed package finds them under kagura_agent/data/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "kagura_agent" / "data"
        for folder in ("schemas", "manifests", "images", "requirements"):
            dest = target / folder
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(
                ROOT / folder, dest, ignore=shutil.ignore_patterns("wheelhouse", "__pycache__")
            )


setup(cmdclass={"build_py": BuildWithData})
