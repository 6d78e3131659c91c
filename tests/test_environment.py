"""What this machine can do (losslab.teach.environment, notebook 00): the tools found, and a
notebook map that names the notebooks as they are in notebooks/ and describes them truly."""
import errno
import subprocess

import pytest

from losslab import build, problems
from losslab.build import sass
from losslab.teach import environment, exercises

NUMBER_WORDS = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}


def test_detect_reports_each_tool_found_or_missing(monkeypatch, tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(environment.build, "nvcc_path", lambda: fake)
    monkeypatch.setattr(environment.build, "find_cuobjdump", lambda: tmp_path / "cuobjdump")
    monkeypatch.setattr(environment.torch.cuda, "is_available", lambda: False)
    env = environment.detect()
    assert (env.nvcc, env.nvcc_version, env.gpu) == (str(fake), "12.4, V12.4.131", None)
    assert env.cuobjdump == str(tmp_path / "cuobjdump")
    table = environment.table(env).plain
    assert "CUDA GPU: none visible" in table and f"nvcc: {fake} (CUDA 12.4, V12.4.131)" in table

    def missing():
        raise build.BuildError("not found")

    monkeypatch.setattr(environment.build, "nvcc_path", missing)
    monkeypatch.setattr(environment.build, "find_cuobjdump", missing)
    env = environment.detect()
    assert env.nvcc is None and env.cuobjdump is None and not env.can_compile
    assert "nvcc: not found" in environment.table(env).plain


def test_a_cpu_only_torch_cannot_compile():
    env = environment.Environment(None, "2.0+cpu", None, "/usr/bin/nvcc", "12.4", None, None)
    assert not env.can_compile
    assert "a CPU-only build" in environment.table(env).plain


def test_ncu_is_found_by_the_measure_package(monkeypatch):
    monkeypatch.setattr(environment, "find_ncu", lambda: "/opt/nsight/ncu")
    assert environment.detect().ncu == "/opt/nsight/ncu"
    assert "/opt/nsight/ncu" in environment.table(environment.detect()).plain


def test_every_listed_notebook_exists_under_its_name():
    folder = build.ROOT / "notebooks"
    for name, *_ in environment.NOTEBOOKS:
        assert (folder / f"{name}.ipynb").is_file(), f"{name}.ipynb is listed but not in notebooks/"
    assert "(not written yet)" not in environment.notebook_map(environment.detect()).plain


def test_every_notebook_is_listed():
    """Every notebook but the start page, which shows this map."""
    listed = {name for name, *_ in environment.NOTEBOOKS}
    assert {p.stem for p in (build.ROOT / "notebooks").glob("*.ipynb")} - {"00_start_here"} <= listed


def test_a_missing_notebook_is_marked(tmp_path):
    page = environment.notebook_map(environment.detect(), folder=tmp_path).plain
    assert page.count("(not written yet)") == len(environment.NOTEBOOKS)


def test_descriptions_count_what_exists():
    about = {name: text for name, text, *_ in environment.NOTEBOOKS}
    rungs = len(problems.get("kl_div").variants)
    assert f"{NUMBER_WORDS[rungs]} rungs" in about["01_kl_div"]
    assert f"{len(exercises.EXERCISES)} graded exercises" in about["05_your_turn"]


def test_a_toolkit_program_that_fails_to_start_once_is_started_again(monkeypatch, tmp_path):
    """cuobjdump (or nvcc) whose start fails with a transient error (ETXTBSY, as on a busy CI machine)
    is started again; a lasting error is one BuildError naming the program and the reason."""
    starts = []

    def run(cmd, **kwargs):
        starts.append(cmd)
        if len(starts) == 1:
            raise OSError(errno.ETXTBSY, "Text file busy", cmd[0])
        return subprocess.CompletedProcess(cmd, 0, "\n        Function : kernel_a\n  SASS A\n", "")

    monkeypatch.setattr(sass.subprocess, "run", run)
    monkeypatch.setattr(sass.time, "sleep", lambda s: None)
    monkeypatch.setattr(sass, "find_cuobjdump", lambda: tmp_path / "cuobjdump")
    assert list(sass.disassemble(tmp_path / "a.cubin")) == ["kernel_a"] and len(starts) == 2

    def missing(cmd, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", cmd[0])

    monkeypatch.setattr(sass.subprocess, "run", missing)
    with pytest.raises(build.BuildError, match=r"could not start .*cuobjdump: .*No such file"):
        sass.disassemble(tmp_path / "a.cubin")
