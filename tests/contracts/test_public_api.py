"""The public names of kernelext: pinned, so that a change is a deliberate one.

Adding or removing a name means editing PUBLIC below and noting it in the README's
changelog (names and signatures are what users rely on: docs/public-api.md). The exports
are pinned both ways, for ``kernelext``, ``kernelext.errors``, ``kernelext.status``,
``kernelext.langgraph`` and ``kernelext.widgets``: every public attribute is in
``__all__`` and every ``__all__`` name resolves, and what static tools read in the source
(the names bound at module level, ``if TYPE_CHECKING:`` declarations included) is that
same list.
"""

from __future__ import annotations

import ast
import datetime as dt
import importlib
import importlib.resources
import json
import pickle
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.fresh_python import printed_by_fresh_python

import kernelext
import kernelext.errors
import kernelext.status

REPO_ROOT = Path(__file__).resolve().parents[2]

PUBLIC = [
    "Agent",
    "AgentCellStopped",
    "AgentError",
    "CheckWarning",
    "ClaimConflict",
    "CodeChangedError",
    "CredentialError",
    "Effect",
    "EffectArgumentsMismatch",
    "EffectFailed",
    "EffectRejected",
    "ForcedStop",
    "ForeignStoreError",
    "Handle",
    "IntegrityError",
    "InvalidName",
    "ItemFailed",
    "KernelextError",
    "LedgerError",
    "NameNotText",
    "NeedsDecision",
    "OwnershipLost",
    "PlanChanged",
    "QueryError",
    "QueryTimeout",
    "ReadOnlyError",
    "RemoteItemError",
    "ResultNotStorable",
    "ResumePlan",
    "Revalidation",
    "Run",
    "RunNotFound",
    "RunStateError",
    "SchemaTooNewError",
    "SecretRefused",
    "SerializationError",
    "StateNotWritable",
    "StopRequested",
    "StoreError",
    "StoreLockedError",
    "StoreWriteError",
    "SurfaceBreach",
    "UnencodableArgument",
    "__version__",
    "agent",
    "answer",
    "anthropic",
    "approvals",
    "approve",
    "checks",
    "configure",
    "credentials",
    "duckdb_config",
    "effect",
    "errors",
    "langgraph",
    "limit",
    "mcp",
    "on_expire",
    "open_store",
    "openai",
    "openai_agents",
    "panel",
    "plan",
    "pydantic_ai",
    "questions",
    "reconcile",
    "reject",
    "restart",
    "resume",
    "revalidation",
    "runs",
    "secrets",
    "sql",
    "status",
    "stop",
    "sweep",
    "timeline",
    "tools",
]

# The names users were promised from the start (the API sketch); they may never disappear.
DESIGN_NAMES = {"agent", "effect", "resume", "restart", "runs", "sql", "reconcile", "Run"}

SIGNALS = {"StopRequested", "ForcedStop"}  # BaseException on purpose: not swallowable

# IPython calls these by name for ``%load_ext kernelext``; they are not API to import.
HOOKS = {"load_ipython_extension", "unload_ipython_extension"}

# module -> its source file (kernelext.widgets is the top-level widgets/ folder)
SOURCES = {
    "kernelext": REPO_ROOT / "kernelext" / "__init__.py",
    "kernelext.errors": REPO_ROOT / "kernelext" / "errors.py",
    "kernelext.langgraph": REPO_ROOT / "kernelext" / "langgraph.py",
    "kernelext.openai_agents": REPO_ROOT / "kernelext" / "openai_agents.py",
    "kernelext.pydantic_ai": REPO_ROOT / "kernelext" / "pydantic_ai.py",
    "kernelext.status": REPO_ROOT / "kernelext" / "status.py",
    "kernelext.widgets": REPO_ROOT / "widgets" / "__init__.py",
}

# Exceptions that never reach users: each is caught inside kernelext and turned into a
# public error or a message (the test below fails on any other exception defined
# outside kernelext/errors.py). Underscore-named ones are private by name.
INTERNAL_SIGNALS = {
    "ToolArgumentError": "kernelext/_adapters/tools.py",  # sent back to the model as text
    "Unencodable": "kernelext/_core/encoding/canonical.py",  # becomes UnencodableArgument & co.
    "CommandUsageError": "kernelext/_cli/common.py",  # the CLI's exit code 2 and message
    "Carried": "kernelext/_adapters/turns.py",  # a kernelext error through a framework's run
    "AsksApproval": "kernelext/_adapters/turns.py",  # a tool's ApprovalRequired: asked by kernelext
    # the stop that suspends a run for a person (a StopRequested, told apart by the ledger)
    "WaitingForPerson": "kernelext/_core/people/waiting.py",
}


def _statically_bound(source: str) -> tuple[set[str], set[str]]:
    """(public names bound at module level, names bound by imports from outside kernelext).

    Assignments, annotated declarations, ``def``/``class`` and imports count, also inside
    ``if``/``try`` blocks (``if TYPE_CHECKING:`` declarations are what type checkers see).
    An import from outside the package (``typing``, ``difflib``) is not a re-export: type
    checkers do not offer it as the module's name, so it is set apart."""
    bound: set[str] = set()
    foreign: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    bound.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                bound.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                inside = isinstance(node, ast.ImportFrom) and (
                    node.level > 0 or (node.module or "").split(".")[0] == "kernelext"
                )
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    (bound if inside else foreign).add(name)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(ast.parse(source).body)
    public = {n for n in bound if not n.startswith("_") or n == "__version__"}
    return public - foreign, foreign


def _module(name: str) -> ModuleType:
    if name == "kernelext.widgets":
        pytest.importorskip("ipywidgets")
    return importlib.import_module(name)


def test_all_is_pinned() -> None:
    assert sorted(PUBLIC) == PUBLIC, "keep PUBLIC sorted"
    assert kernelext.__all__ == PUBLIC


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_all_name_resolves_and_star_import_gives_all(name: str) -> None:
    module = _module(name)
    assert len(set(module.__all__)) == len(module.__all__), "a name listed twice"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(module.__all__)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_static_tools_see_exactly_all(name: str) -> None:
    public, _ = _statically_bound(SOURCES[name].read_text())
    assert public - HOOKS == set(_module(name).__all__)


def test_the_static_check_sees_type_checking_declarations_and_lists_strays() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from .a import Kept\n"
        "if TYPE_CHECKING:\n"
        "    from .b import Declared\n"
        "    lazy: int\n"
        "stray = 1\n"
        "_private = 2\n"
        "__all__ = ['Kept']\n"
    )
    public, foreign = _statically_bound(source)
    assert public == {"Kept", "Declared", "lazy", "stray"}  # "stray" is what the test catches
    assert foreign == {"TYPE_CHECKING"}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_public_attribute_is_in_all(name: str) -> None:
    """Checked in a fresh interpreter: what ``import <name>`` alone leaves on the module. A
    name loaded on first use (the module's ``__getattr__``) is there once asked for."""
    if name == "kernelext.widgets":
        pytest.importorskip("ipywidgets")
    _, foreign = _statically_bound(SOURCES[name].read_text())
    code = (
        "import importlib, json\n"
        f"module = importlib.import_module({name!r})\n"
        "names = sorted(vars(module))\n"
        "def resolves(n):\n"
        "    try:\n"
        "        getattr(module, n)\n"
        "        return True\n"
        "    except ImportError:  # loaded on first use, from an extra that is not installed\n"
        "        return True\n"
        "    except AttributeError:\n"
        "        return False\n"
        "lazy = sorted(n for n in module.__all__ if n not in names and resolves(n))\n"
        "print(json.dumps([names, lazy]))\n"
    )
    names, lazy = json.loads(printed_by_fresh_python(code).strip().splitlines()[-1])
    public = {n for n in names if not n.startswith("_")} | ({"__version__"} & set(names))
    assert (public - set(foreign) - HOOKS) | set(lazy) == set(_module(name).__all__)


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


def test_every_error_lives_in_kernelext_errors_and_is_kx_name() -> None:
    errors = kernelext.errors
    classes = {
        n: getattr(errors, n)
        for n in errors.__all__
        if isinstance(getattr(errors, n), type) and issubclass(getattr(errors, n), BaseException)
    }
    assert set(classes) == set(errors.__all__) - {"did_you_mean"}
    for name, cls in classes.items():
        assert cls.__module__ == "kernelext.errors", name
        assert getattr(kernelext, name) is cls and name in kernelext.__all__, name
        assert name in (errors.__doc__ or ""), f"{name} is not drawn in the errors docstring"
    raised = [
        n
        for n in kernelext.__all__
        if isinstance(getattr(kernelext, n), type)
        and issubclass(getattr(kernelext, n), BaseException)
    ]
    assert set(raised) == set(classes)


def test_the_errors_docstring_draws_the_real_hierarchy() -> None:
    """Each class of the tree in ``kernelext.errors``' docstring sits under a direct base."""
    import builtins

    tree = (kernelext.errors.__doc__ or "").split("::", 1)[1].split("\n\n")[1]
    stack: list[tuple[int, str]] = []
    drawn: set[str] = set()
    for line in tree.splitlines():
        found = re.match(r"^([\s│├└─]*)([A-Z]\w+)", line)
        if found is None:
            continue  # a description continued on the next line
        column, name = len(found.group(1)), found.group(2)
        while stack and stack[-1][0] >= column:
            stack.pop()
        cls = getattr(kernelext.errors, name, None) or getattr(builtins, name)
        if stack:
            parent = stack[-1][1]
            assert parent in {b.__name__ for b in cls.__bases__}, f"{name} is not a {parent}"
        stack.append((column, name))
        drawn.add(name)
    assert drawn >= set(kernelext.errors.__all__) - {"did_you_mean"}


def _exception_classes(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
        if any(
            b in {"Exception", "BaseException"}
            or b.endswith(("Error", "Warning", "Exception"))
            or b in kernelext.errors.__all__
            for b in bases
        ):
            found.append((node.name, node.lineno))
    return found


def test_no_error_is_defined_outside_kernelext_errors() -> None:
    strays = []
    for folder in (REPO_ROOT / "kernelext", REPO_ROOT / "widgets"):
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if rel == "kernelext/errors.py" or "__pycache__" in path.parts:
                continue
            for name, line in _exception_classes(path):
                if name.startswith("_") or INTERNAL_SIGNALS.get(name) == rel:
                    continue
                strays.append(f"{rel}:{line}: {name}")
    assert strays == [], "define errors in kernelext/errors.py (and import them from there)"


# Errors raised deep in the engine are imported from kernelext.errors, never defined twice.
# (The engine's own paths, kernelext._core.<module>, changed with its packages: import an
# error from kernelext.errors.)
@pytest.mark.parametrize(
    ("home", "name"),
    [
        ("kernelext._core.ledger.effect", "EffectFailed"),
        ("kernelext._core.facts.credentials", "CredentialError"),
        ("kernelext._core.plan.resume_plan", "PlanChanged"),
        ("kernelext._core.process.checks", "CheckWarning"),
        ("kernelext._ipython.cells", "AgentCellStopped"),
        ("kernelext._store.columns", "SecretRefused"),
        ("kernelext._store.sql_guard", "SurfaceBreach"),
    ],
)
def test_an_error_an_engine_module_raises_is_the_one_in_errors(home: str, name: str) -> None:
    assert getattr(importlib.import_module(home), name) is getattr(kernelext.errors, name)


# Constructor arguments of the errors that take more than a message (the others get one).
ERROR_ARGUMENTS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "AgentCellStopped": (("run 'r' is suspended",), {"run_id": "r", "status": "suspended"}),
    "OwnershipLost": (
        ("r",),
        {"owner": "u@h:1.2", "since": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "epoch": 3}
        | {"held": 2, "what": "effect intent"},
    ),
    "StoreLockedError": (("/tmp/s.duckdb", 123), {"detail": "lock held"}),
    "EffectRejected": (("no",), {"key": "k", "tool": "pay", "note": "nope"}),
    "PlanChanged": (("the run changed", ["status: suspended -> failed"], None), {}),
}
ERROR_CLASSES = [
    name
    for name in kernelext.errors.__all__
    if isinstance(getattr(kernelext.errors, name), type)
    and issubclass(getattr(kernelext.errors, name), BaseException)
]


@pytest.mark.parametrize("name", ERROR_CLASSES)
def test_every_error_keeps_its_message_and_attributes_through_pickle(name: str) -> None:
    cls = getattr(kernelext.errors, name)
    args, keywords = ERROR_ARGUMENTS.get(name, ((f"{name}: what happened, what to do",), {}))
    error = cls(*args, **keywords)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is cls and str(again) == str(error) and again.args == error.args
    assert again.__dict__ == error.__dict__
    assert getattr(kernelext, name) is cls


def test_the_pickled_errors_include_every_error_of_the_hierarchy() -> None:
    assert len(ERROR_CLASSES) == len(kernelext.errors.__all__) - 1  # all but did_you_mean
    assert set(ERROR_ARGUMENTS) <= set(ERROR_CLASSES)


def test_agent_cell_stopped_is_a_kernelext_error_shown_as_one_line() -> None:
    error = kernelext.AgentCellStopped("run 'r' is suspended", run_id="r", status="suspended")
    assert isinstance(error, kernelext.KernelextError)
    assert not isinstance(error, kernelext.RunStateError)  # %%agent does not turn it into usage
    assert (error.run_id, error.status) == ("r", "suspended")
    assert error._render_traceback_() == ["\x1b[1;31m■ kernelext:\x1b[0m run 'r' is suspended"]


def test_plan_changed_keeps_its_parts() -> None:
    now: Any = object()  # the run's plan now (a ResumePlan)
    error = kernelext.PlanChanged("Run 'r' changed", ["step 2 completed"], now)
    assert isinstance(error, kernelext.RunStateError) and str(error) == "Run 'r' changed"
    assert (error.differences, error.plan) == (["step 2 completed"], now)


def test_checks_and_credentials_follow_the_current_runtime() -> None:
    from kernelext import checks, credentials
    from kernelext._core.process.registries import CheckRegistry, CredentialRegistry
    from kernelext._core.process.runtime import Runtime, runtime, use_runtime

    assert isinstance(checks, CheckRegistry) and isinstance(credentials, CredentialRegistry)
    before = runtime()

    def price(name: str) -> int:
        return 1

    def token() -> str:
        return "t"

    with use_runtime(Runtime()) as second:
        checks.register("public-api:*", price)
        credentials.register("public-api-token", token)
        assert second.checks.lookup("public-api:x") is price
        assert second.credentials.refresh_for("public-api-token") is token
        assert "public-api:*" in repr(checks) and checks.names() == ["public-api:*"]
        assert before.checks.lookup("public-api:x") is None
        assert before.credentials.refresh_for("public-api-token") is None
    assert runtime() is before
    assert checks.lookup("public-api:x") is None and "public-api:*" not in checks.names()
    assert credentials.refresh_for("public-api-token") is None
    assert kernelext.checks is checks and kernelext.credentials is credentials


def test_tools_schemas_is_the_list_itself() -> None:
    def send_email(to: str, body: str = "") -> str:
        """Send an email."""
        return to

    tools = kernelext.tools(send_email)
    assert tools.schemas is tools and isinstance(tools, list)
    assert [s["function"]["name"] for s in tools.schemas] == ["send_email"]
    assert tools.schemas == list(tools) and len(tools.schemas) == 1


def test_langgraph_is_a_public_module_of_the_adapters_names() -> None:
    from kernelext._adapters import langgraph as adapter

    assert kernelext.langgraph.__name__ == "kernelext.langgraph"
    for name in kernelext.langgraph.__all__:
        assert name in adapter.__all__
        if name != "KernelextSaver":  # loaded on first use (it needs LangGraph)
            assert getattr(kernelext.langgraph, name) is getattr(adapter, name), name


def test_duckdb_config_is_what_the_store_connects_with(tmp_path: Path) -> None:
    import duckdb

    config = kernelext.duckdb_config()
    config["default_block_size"] = "262144"  # a copy: the store's own is untouched
    store = kernelext.open_store(str(tmp_path / "s.duckdb"))
    try:
        con = duckdb.connect(store.location, config=kernelext.duckdb_config())  # accepted
        con.close()
    finally:
        store.close()
    assert kernelext.duckdb_config() == {
        "default_block_size": "16384",
        "checkpoint_threshold": "1000000GB",  # DuckDB never checkpoints by itself
    }


def test_secrets_log_filter_scrubs_a_users_logger(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    secret = kernelext.secrets.register("s3cr3t-public-api-value")
    logger = logging.getLogger("public-api-test")
    handler_filter = kernelext.secrets.log_filter()
    assert isinstance(handler_filter, logging.Filter)
    logger.addFilter(handler_filter)
    try:
        with caplog.at_level(logging.INFO, logger="public-api-test"):
            logger.info("token %s", secret)
    finally:
        logger.removeFilter(handler_filter)
        kernelext.secrets.forget(secret)
    assert secret not in caplog.text and "token" in caplog.text


def _public_api_page() -> str:
    page = REPO_ROOT / "docs" / "public-api.md"
    assert page.is_file(), "docs/public-api.md is gone (this module's docstring cites it)"
    return page.read_text()


def test_the_public_api_page_names_every_namespace_and_name() -> None:
    section = _public_api_page()
    for module in SOURCES:
        assert f"| `{module}` |" in section, module
    listed = [n for n in kernelext.__all__ if n not in kernelext.errors.__all__]
    listed += [*kernelext.langgraph.__all__, *_module("kernelext.widgets").__all__]
    listed += kernelext.openai_agents.__all__
    listed += kernelext.pydantic_ai.__all__
    missing = [n for n in listed if f"`{n}`" not in section]
    assert missing == []


def test_version_is_a_string() -> None:
    assert isinstance(kernelext.__version__, str)
    assert kernelext.__version__.count(".") >= 2


def test_importing_kernelext_loads_no_jupyter_and_warns_nothing() -> None:
    code = (
        "import json, sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "import kernelext\n"
        "heavy = ('IPython', 'ipykernel', 'ipywidgets', 'jupyter_client', 'nbclient', 'zmq',\n"
        "         'langgraph', 'langchain_core', 'openai', 'mcp', 'agents', 'pydantic_ai',\n"
        "         'anthropic')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    assert json.loads(printed_by_fresh_python(code).strip().splitlines()[-1]) == []


def test_the_package_is_marked_typed_so_static_tools_read_its_names() -> None:
    """PEP 561: without ``py.typed`` a user's type checker ignores kernelext's annotations
    and the names pinned above (every ``kx.*`` would be ``Any``)."""
    marker = importlib.resources.files("kernelext") / "py.typed"
    assert marker.is_file(), "kernelext/py.typed is missing"
