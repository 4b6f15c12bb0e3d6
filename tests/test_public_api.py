"""The public names of ``kernelext``: pinned, so that a change is a deliberate one.

Adding or removing a name means editing PUBLIC below and noting it in the README's
changelog (names and signatures are what users rely on: README.md, "API").
"""

from __future__ import annotations

import json
import subprocess
import sys

import kernelext

PUBLIC = [
    "Agent",
    "CheckWarning",
    "ClaimConflict",
    "CodeChangedError",
    "CredentialError",
    "Effect",
    "EffectArgumentsMismatch",
    "EffectFailed",
    "EffectRejected",
    "ForcedStop",
    "Handle",
    "KernelextError",
    "LedgerError",
    "NeedsDecision",
    "PlanChanged",
    "ResumePlan",
    "Revalidation",
    "Run",
    "RunNotFound",
    "RunStateError",
    "SerializationError",
    "StopRequested",
    "StoreLockedError",
    "__version__",
    "agent",
    "answer",
    "approvals",
    "checks",
    "configure",
    "credentials",
    "effect",
    "mcp",
    "on_expire",
    "open_store",
    "openai",
    "plan",
    "questions",
    "reconcile",
    "restart",
    "resume",
    "revalidation",
    "runs",
    "secrets",
    "sql",
    "stop",
    "sweep",
    "timeline",
    "tools",
]

# The names the README promises; they may never disappear.
DESIGN_NAMES = {"agent", "effect", "resume", "restart", "runs", "sql", "reconcile", "Run"}

SIGNALS = {"StopRequested", "ForcedStop"}  # BaseException on purpose: not swallowable


def test_all_is_pinned() -> None:
    assert sorted(PUBLIC) == PUBLIC, "keep PUBLIC sorted"
    assert kernelext.__all__ == PUBLIC


def test_every_public_name_resolves() -> None:
    missing = [name for name in kernelext.__all__ if not hasattr(kernelext, name)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec("from kernelext import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(PUBLIC)


def test_design_names_are_public() -> None:
    assert set(kernelext.__all__) >= DESIGN_NAMES


def test_public_errors_share_one_base() -> None:
    for name in kernelext.__all__:
        obj = getattr(kernelext, name)
        if not isinstance(obj, type) or not issubclass(obj, BaseException):
            continue
        if name in SIGNALS:
            assert not issubclass(obj, Exception), name
        elif issubclass(obj, Warning):
            assert issubclass(obj, UserWarning), name
        else:
            assert issubclass(obj, kernelext.KernelextError), name


def test_version_is_a_string() -> None:
    assert isinstance(kernelext.__version__, str)
    assert kernelext.__version__.count(".") >= 2


def test_importing_kernelext_loads_no_jupyter_and_warns_nothing() -> None:
    code = (
        "import json, sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "import kernelext\n"
        "heavy = ('IPython', 'ipykernel', 'ipywidgets', 'jupyter_client', 'nbclient', 'zmq')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
