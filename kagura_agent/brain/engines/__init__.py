"""Engine selection: the plan's ``brain`` section names one engine.

Engines import their heavy library lazily; ``select_engine`` checks the library is
installed up front so a missing extra is a SetupError (exit 3) naming the fix, not an
ImportError in the middle of a run.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from kagura_agent.brain.capability import CapabilityClient
from kagura_agent.brain.dispatch_tool import DispatchClient
from kagura_agent.brain.engines.kagura_brain import BACKENDS, KaguraBrain
from kagura_agent.brain.engines.script import ScriptBrain
from kagura_agent.brain.engines.sdk import SdkBrain
from kagura_agent.brain.protocol import ENGINES, PERMISSION_MODES, Brain, MemoryClient
from kagura_agent.errors import SetupError, UsageError

# engine → (importable module, pip extra that provides it)
_EXTRAS = {"sdk": ("claude_agent_sdk", "claude"), "kagura-brain": ("kagura_brain", "brain")}


def require_extra(engine: str) -> None:
    """Raise SetupError when the library behind ``engine`` is not installed."""
    if engine not in _EXTRAS:
        return
    module, extra = _EXTRAS[engine]
    if importlib.util.find_spec(module) is None:
        raise SetupError(
            f"the {engine!r} brain engine needs the {module} package, which is not installed",
            hint=f"pip install 'kagura-agent[{extra}]'",
        )


def select_engine(
    brain: Mapping[str, Any],
    *,
    memory: MemoryClient | None = None,
    dispatch: DispatchClient | None = None,
    capabilities: CapabilityClient | None = None,
) -> Brain:
    """Build the engine named by a plan's ``brain`` section.

    ``brain`` is the plan's ``brain`` object (``engine``, ``permission_mode``, ``backend``,
    ``cli_path`` …). ``memory`` is offered to engines that can give the model memory tools,
    ``dispatch`` (the host's sub-agent dispatch) to those that can give it a tool; the
    others reach dispatch through ``memtool dispatch`` in a shell step or not at all.
    ``capabilities`` (mid-run requests for one more capability) to the sdk engine only:
    kagura-brain and script cannot ask mid-run.
    """
    engine = brain.get("engine", "script")
    if engine not in ENGINES:
        raise UsageError(f"unknown brain engine {engine!r}; expected one of {ENGINES}")
    mode = brain.get("permission_mode")
    if mode is not None and mode not in PERMISSION_MODES:
        raise UsageError(
            f"invalid permission mode {mode!r}", hint=f"expected one of {PERMISSION_MODES}"
        )
    require_extra(engine)
    if engine == "sdk":
        return SdkBrain(
            cli_path=brain.get("cli_path"),
            memory=memory,
            dispatch=dispatch,
            capabilities=capabilities,
        )
    if engine == "kagura-brain":
        backend = brain.get("backend") or "claude"
        if backend not in BACKENDS:
            raise UsageError(f"unknown kagura-brain backend {backend!r}; expected {BACKENDS}")
        return KaguraBrain()
    return ScriptBrain()
