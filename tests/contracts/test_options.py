"""Options are declared once (``kernelext/_core/process/options.py``): ``kx.configure``,
``%config Kernelext.<option>``, the command line and the documentation's options table
(``docs/notebooks.md``) all follow the declaration. Each test runs over every declared
option, so a new one is covered by itself; an option of a new kind fails until ``SAMPLES``
says what a good and a bad value of that kind are."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy
import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets import TraitError
from traitlets.config import Config

import kernelext as kx
from kernelext._cli.main import main as cli
from kernelext._core.process.options import OPTIONS, Option, OptionValues, options_table
from kernelext._core.process.runtime import Runtime, runtime, use_runtime
from kernelext._ipython.magics import Kernelext

OPTIONS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "notebooks.md"


def samples(option: Option[Any], tmp_path: Path) -> tuple[Any, Any]:
    """A value ``option`` takes (not its default) and one its check refuses."""
    folder = tmp_path / "a-folder"
    folder.mkdir(exist_ok=True)
    by_kind: dict[str, tuple[Any, Any]] = {
        "location": (str(tmp_path / "other.duckdb"), str(folder)),
        "durations": ({"approval": 60}, {"approval": -5}),
        "seconds": (7.0, -1.0),
        "flag": (not option.default, "yes"),
    }
    assert option.kind in by_kind, f"say in SAMPLES what a {option.kind!r} option takes"
    return by_kind[option.kind]


@pytest.fixture
def ip(store_path: Path) -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.config.pop("Kernelext", None)
    runtime().settings.use_store(str(store_path))
    shell.run_line_magic("load_ext", "kernelext")
    yield shell
    shell.run_line_magic("unload_ext", "kernelext")
    shell.config.pop("Kernelext", None)
    runtime().settings.close()
    runtime().settings.use_store(None)


def ids(option: Option[Any]) -> str:
    return option.name


# -- one declaration -----------------------------------------------------------------------
def test_the_documented_options_table_is_the_declaration() -> None:
    text = OPTIONS_PAGE.read_text(encoding="utf-8")
    start = text.index("| option | default | meaning |")
    table = re.match(r"(?:\|[^\n]*\n)+", text[start:])
    assert table is not None
    assert table.group(0).rstrip("\n") == options_table(), (
        "docs/notebooks.md's options table differs from kernelext/_core/process/options.py; "
        "paste the "
        "output of: python -c 'from kernelext._core.process.options import options_table; "
        "print(options_table())'"
    )


def test_configure_and_config_name_exactly_the_declared_options() -> None:
    names = [option.name for option in OPTIONS]
    assert len(set(names)) == len(names)
    assert list(kx.configure.__signature__.parameters) == names  # type: ignore[attr-defined]
    assert set(Kernelext.class_trait_names(config=True)) == set(names)
    for option in OPTIONS:
        trait = Kernelext.class_traits()[option.name]
        assert trait.help == option.help
        assert f"``{option.name}``: {option.help}" in (kx.configure.__doc__ or "")


def test_a_runtime_starts_at_the_declared_defaults() -> None:
    settings = Runtime().settings
    kept = [o for o in vars(OptionValues).values() if isinstance(o, Option)]
    assert kept and all(option.current(settings) == option.default for option in kept)
    assert settings.store_location is None  # the default location


# -- the same setting, the same check --------------------------------------------------------
@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_every_option_is_set_alike_by_configure_and_by_config(
    ip: InteractiveShell, tmp_path: Path, option: Option[Any]
) -> None:
    good, _ = samples(option, tmp_path)
    default = option.current(Runtime().settings)
    with use_runtime(Runtime()) as rt:
        kx.configure(**{option.name: good})
        through_api = option.current(rt.settings)
    with use_runtime(Runtime()) as rt:
        done = ip.run_cell(f"%config Kernelext.{option.name} = {good!r}")
        assert done.success, done.error_in_exec
        through_config = option.current(rt.settings)
    assert through_api == through_config != default
    with use_runtime(Runtime()) as rt:  # None leaves it as it is, both ways
        kx.configure(**{option.name: good})
        kx.configure(**{option.name: None})
        assert option.current(rt.settings) == through_api
        assert ip.run_cell(f"%config Kernelext.{option.name} = None").success
        assert option.current(rt.settings) == through_api


@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_every_option_refuses_a_bad_value_alike_and_keeps_its_value(
    ip: InteractiveShell, tmp_path: Path, option: Option[Any], caplog: pytest.LogCaptureFixture
) -> None:
    _, bad = samples(option, tmp_path)
    other = next(o for o in OPTIONS if o is not option)
    with use_runtime(Runtime()) as rt:
        before, other_before = option.current(rt.settings), other.current(rt.settings)
        with pytest.raises((TypeError, ValueError)) as refused:  # and the other is not set
            kx.configure(**{option.name: bad, other.name: samples(other, tmp_path)[0]})
        assert option.name in str(refused.value)
        assert (option.current(rt.settings), other.current(rt.settings)) == (before, other_before)
        caplog.clear()
        ip.run_cell(f"%config Kernelext.{option.name} = {bad!r}")  # IPython logs the refusal
        assert option.current(rt.settings) == before
        assert str(refused.value) in caplog.text  # the option's own check, word for word


def odd_values(option: Option[Any], tmp_path: Path) -> list[tuple[Any, bool]]:
    """Values of other types (value, whether the option's check takes it): what a typed
    trait would convert or refuse before the option's check sees it."""
    by_kind: dict[str, list[tuple[Any, bool]]] = {
        "location": [
            (tmp_path / "as-path.duckdb", True),
            (str(tmp_path / "as-bytes.duckdb").encode(), False),
            (7, False),
        ],
        "durations": [({"approval": timedelta(hours=1)}, True), ({"approval": True}, False)],
        "seconds": [
            (True, False),  # a bool is not a number of seconds
            (timedelta(seconds=7), True),
            (numpy.int64(7), True),
            (numpy.float64(7.5), True),
            ("7", False),
            (b"7", False),
        ],
        "flag": [(numpy.bool_(True), False), (1.0, False)],  # only True or False
    }
    assert option.kind in by_kind, f"say in odd_values what a {option.kind!r} option takes"
    return by_kind[option.kind]


def outcome(set_it: Any, option: Option[Any], rt: Runtime) -> tuple[str, Any]:
    before = option.current(rt.settings)
    try:
        set_it()
    except (TypeError, ValueError, TraitError) as exc:
        assert option.current(rt.settings) == before
        return ("refused", str(exc))
    return ("taken", option.current(rt.settings))


@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_config_takes_and_refuses_exactly_what_the_options_check_does(
    ip: InteractiveShell, tmp_path: Path, option: Option[Any], caplog: pytest.LogCaptureFixture
) -> None:
    magics = ip.magics_manager.registry["Kernelext"]
    for value, takes in odd_values(option, tmp_path):
        with use_runtime(Runtime()) as rt:
            through_api = outcome(partial(kx.configure, **{option.name: value}), option, rt)
        with use_runtime(Runtime()) as rt:  # %config Kernelext.<name> = value
            ip.user_ns["value"] = value
            caplog.clear()
            assert ip.run_cell(f"%config Kernelext.{option.name} = value").success
            refusal = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
            current = option.current(rt.settings)
            through_config = ("refused", refusal[0]) if refusal else ("taken", current)
        with use_runtime(Runtime()) as rt:  # c.Kernelext.<name> = value (a profile)
            through_trait = outcome(partial(setattr, magics, option.name, value), option, rt)
        assert through_api == through_config == through_trait, value
        assert through_api[0] == ("taken" if takes else "refused"), value


@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_reading_an_option_through_config_shows_the_current_setting(
    ip: InteractiveShell, tmp_path: Path, option: Option[Any]
) -> None:
    good, _ = samples(option, tmp_path)
    with use_runtime(Runtime()) as rt:
        kx.configure(**{option.name: good})
        shown = ip.run_cell(f"%config Kernelext.{option.name}").result
        assert shown == option.current(rt.settings) != option.current(Runtime().settings)
        assert getattr(ip.magics_manager.registry["Kernelext"], option.name) == shown


def test_values_set_together_are_all_checked_before_any_is_applied(
    ip: InteractiveShell, tmp_path: Path
) -> None:
    with use_runtime(Runtime()) as rt:
        before = {option.name: option.current(rt.settings) for option in OPTIONS}
        profile = Config()
        profile.Kernelext.check_timeout = 5.0
        profile.Kernelext.allow_files = "yes"
        with pytest.raises(TraitError, match="allow_files"):
            ip.magics_manager.registry["Kernelext"].update_config(profile)
        assert {option.name: option.current(rt.settings) for option in OPTIONS} == before
        profile.Kernelext.allow_files = True
        ip.magics_manager.registry["Kernelext"].update_config(profile)
        assert (rt.settings.check_timeout, rt.settings.allow_files) == (5.0, True)
        profile = Config()
        profile.Kernelext.check_timeut = 5.0
        with pytest.raises(TraitError, match="Did you mean 'check_timeout'"):
            ip.magics_manager.registry["Kernelext"].update_config(profile)


def test_an_unknown_option_is_refused_with_the_nearest_declared_name() -> None:
    for option in OPTIONS:
        typo = option.name[:-1]
        nearest = rf"no option {typo!r}\. Did you mean .*{option.name!r}"
        with pytest.raises(TypeError, match=nearest):
            kx.configure(**{typo: 1})


# -- the command line ------------------------------------------------------------------------
@pytest.mark.parametrize("option", [o for o in OPTIONS if o.cli], ids=ids)
def test_an_options_flag_uses_the_options_check(
    tmp_path: Path, option: Option[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = samples(option, tmp_path)
    assert cli(["runs", str(option.cli), str(good)]) == 0
    with pytest.raises((TypeError, ValueError)) as refused:
        option.check(str(option.cli), bad)
    with pytest.raises(SystemExit) as done:
        cli(["runs", str(option.cli), str(bad)])
    assert done.value.code == 2  # a usage error, before the store is opened
    assert str(refused.value) in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["runs", "--help"])
    assert option.meaning.replace("`", "") in " ".join(capsys.readouterr().out.split())


def test_loading_the_extension_again_keeps_what_kx_configure_set_after_config(
    ip: InteractiveShell, tmp_path: Path
) -> None:
    """IPython keeps every ``%config Kernelext.<name>`` in ``shell.config``; loading the
    extension again must not apply them again over a later ``kx.configure`` (an old store
    would replace the one in use, silently, and be refused while a run executes), while
    the notebook options it put back on unloading come back from their ``%config``."""
    older, newer = str(tmp_path / "older.duckdb"), str(tmp_path / "newer.duckdb")
    ip.run_line_magic("config", f"Kernelext.store = {older!r}")
    ip.run_line_magic("config", "Kernelext.check_timeout = 5")
    ip.run_line_magic("config", "Kernelext.allow_files = True")
    kx.configure(store=newer, check_timeout=42)
    ip.run_line_magic("unload_ext", "kernelext")
    assert runtime().settings.allow_files is False  # a notebook option, put back
    ip.run_line_magic("load_ext", "kernelext")
    settings = runtime().settings
    assert (settings.store_location, settings.check_timeout) == (newer, 42.0)
    assert settings.allow_files is True
    ip.run_line_magic("config", "Kernelext.check_timeout = 7")  # a new %config still applies
    assert settings.check_timeout == 7.0
