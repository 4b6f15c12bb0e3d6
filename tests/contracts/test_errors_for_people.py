"""A kernelext error in a notebook shows its message and the user's frames, not kernelext's."""

from __future__ import annotations

import os
import re
from pathlib import Path

from support.kernels import KernelSession

import kernelext

PACKAGE_DIR = os.path.dirname(os.path.abspath(kernelext.__file__))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _traceback(reply: object) -> str:
    error = getattr(reply, "error", None)
    assert error is not None, "the cell did not fail"
    return ANSI.sub("", "\n".join(error["traceback"]))


def _wait_for_stdout(kernel: KernelSession, msg_id: str, text: str) -> None:
    """Read the request's output until its stdout shows ``text`` (the cell is running)."""
    seen = ""
    while text not in seen:
        out = kernel.kc.get_iopub_msg(timeout=60)
        if out["parent_header"].get("msg_id") == msg_id and out["msg_type"] == "stream":
            seen += out["content"]["text"]


def _configured(kernel: KernelSession, tmp_path: Path) -> None:
    """Has the kernel import kernelext as ``kx`` and use the test's store (one per test,
    under ``tmp_path``, whichever kernel opens it)."""
    store = tmp_path / "s.duckdb"
    kernel.run(f"import kernelext as kx\nkx.configure(store={str(store)!r})").ok()


def _kernelext_frames(text: str) -> list[str]:
    return [line for line in text.splitlines() if PACKAGE_DIR in line]


def test_resume_typo_shows_message_and_user_frames_only(tmp_path: Path) -> None:
    with KernelSession() as kernel:
        _configured(kernel, tmp_path)
        reply = kernel.run("def my_helper():\n    kx.resume('triage-nvo')\nmy_helper()")
        text = _traceback(reply)
        assert _kernelext_frames(text) == [], text
        assert "my_helper" in text
        assert "No run 'triage-nvo'" in text
        other = _traceback(kernel.run("def my_div():\n    return 1 / 0\nmy_div()"))
        assert "ZeroDivisionError" in other and "my_div" in other


def test_with_extension_loaded_the_frames_are_left_out_too(tmp_path: Path) -> None:
    with KernelSession() as kernel:
        kernel.run("%load_ext kernelext").ok()
        _configured(kernel, tmp_path)
        text = _traceback(kernel.run("kx.resume('nope')"))
        assert _kernelext_frames(text) == [], text
        assert "No run 'nope'" in text


def test_a_handle_without_the_extension_says_how_to_get_the_panel(tmp_path: Path) -> None:
    with KernelSession() as kernel:
        _configured(kernel, tmp_path)
        kernel.run(
            "@kx.agent\ndef tiny(run):\n    return 1\nh = tiny.start(run_id='tiny-1')\nh.wait()"
        ).ok()
        text = kernel.run("h").ok().text
        assert "%load_ext kernelext" in text, text


def test_magics_before_load_ext_say_to_load_it(tmp_path: Path) -> None:
    with KernelSession() as kernel:
        kernel.run("import kernelext as kx").ok()
        for cell in ("%%ledger\nSELECT 1", "%%agent\n1"):
            reply = kernel.run(cell)
            assert "%load_ext kernelext" in _traceback(reply) + str(reply.error), reply.error
        kernel.run("%load_ext kernelext").ok()
        kernel.run(f"%config Kernelext.store = {str(tmp_path / 's.duckdb')!r}").ok()
        assert "1" in kernel.run("%%ledger\nSELECT 1 AS one").ok().text


def test_resume_of_a_completed_run_shows_message_only(tmp_path: Path) -> None:
    with KernelSession() as kernel:
        _configured(kernel, tmp_path)
        kernel.run(
            "@kx.agent\ndef tiny(run):\n    return 1\ntiny.start(run_id='done-1').wait()"
        ).ok()
        text = _traceback(kernel.run("kx.resume('done-1')"))
        assert _kernelext_frames(text) == [], text
        assert "already completed" in text, text


def test_resume_without_the_agent_definition_says_what_to_run(tmp_path: Path) -> None:
    with KernelSession() as first:
        _configured(first, tmp_path)
        first.run(
            "@kx.agent\ndef waits(run):\n    run.suspend()\n"
            "h = waits.start(run_id='later-1')\nprint(h.wait())"
        ).ok()
    with KernelSession() as second:
        _configured(second, tmp_path)
        text = _traceback(second.run("kx.resume('later-1')"))
        assert _kernelext_frames(text) == [], text
        assert "'waits'" in text and "not defined" in text, text


def test_an_error_raised_in_the_agent_keeps_the_users_frames(tmp_path: Path) -> None:
    with KernelSession() as kernel:
        _configured(kernel, tmp_path)
        status = kernel.run(
            "def my_lookup():\n    kx.resume('inner-typo')\n"
            "@kx.agent\ndef my_agent(run):\n    my_lookup()\n"
            "h = my_agent.start(run_id='outer-1')\nprint(h.wait())"
        ).ok()
        assert "failed" in status.stdout, status.stdout
        text = _traceback(kernel.run("raise h.error"))
        assert _kernelext_frames(text) == [], text
        assert "my_lookup" in text and "my_agent" in text, text
        assert "No run 'inner-typo'" in text, text


def test_an_interrupt_with_the_handler_installed_still_interrupts(tmp_path: Path) -> None:
    with KernelSession() as kernel:
        kernel.run("%load_ext kernelext").ok()
        kernel.run("import kernelext as kx").ok()
        assert "True" in kernel.run("print(kx._ipython.tracebacks.installed(get_ipython()))").text
        msg_id = kernel.send("import time\nprint('started', flush=True)\ntime.sleep(600)")
        _wait_for_stdout(kernel, msg_id, "started")
        kernel.interrupt()
        reply = kernel.collect(msg_id)
        assert reply.status == "error"
        assert reply.error is not None and reply.error["ename"] == "KeyboardInterrupt", reply.error
        assert "2" in kernel.run("print(1 + 1)").ok().text
