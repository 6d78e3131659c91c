"""The notebooks' parameters, checked before any cell uses them.

Each notebook's first code cell passes every value of its ``parameters`` cell to :func:`validate`
(``parameters.validate(problem=problem, size=size, ..., results_dir=results_dir)``); a value it
cannot take stops the notebook there with one line naming the parameter, the value and what is
allowed (in Jupyter without a traceback, under papermill as the cell's error), instead of a bare
KeyError, a silently empty table or a driver error cells later.
"""
from __future__ import annotations

import ast
import atexit
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from losslab import problems, records
from losslab.build import knobs
from losslab.measure.peers import PEERS
from losslab.present.results import gpu_name, recorded_devices, same_device, shown_path

DTYPES = ("float32", "bfloat16", "float16")
FLAGS = ("interactive", "profile_with_ncu", "grade_solutions", "sweep")  # parameters that are True or False


class ParameterError(ValueError):
    """A notebook parameter holds a value it cannot take. The message names the parameter, the
    value and the allowed values; IPython shows it as that one line (no traceback)."""

    def _render_traceback_(self) -> list[str]:
        return [f"ParameterError: {self}"]


def _one_of(name: str, value, allowed, what: str = "") -> None:
    if not isinstance(value, str) or value not in allowed:
        kind = " (a string)" if isinstance(value, str) else f" (a {type(value).__name__})"
        raise ParameterError(f"{name}: {value!r}{kind if not isinstance(value, str) else ''} is not "
                             f"{what or 'allowed'}; expected one of: {', '.join(allowed)}")


def _list_of(name: str, value, allowed, what: str, none_means: str = "", empty_ok: bool = False) -> None:
    """``value`` must be a list (or tuple) of ``allowed`` strings; None only when ``none_means``
    says what None stands for; [] only when ``empty_ok``."""
    if value is None and none_means:
        return
    expected = f"expected {f'None ({none_means}) or ' if none_means else ''}a list of {what} such as " \
               f"{[allowed[-1]]!r} (allowed: {', '.join(allowed)})"
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ParameterError(f"{name}: {value!r} is a {type(value).__name__}, not a list; {expected}")
    if not value and not empty_ok:
        raise ParameterError(f"{name}: {value!r} is empty; {expected}")
    for item in value:
        _one_of(name, item, allowed, what=f"one of the {what}")


def _problems_named(params: dict) -> list[str]:
    names = params.get("problem_names") or ([params["problem"]] if "problem" in params else [])
    return [n for n in names if n in problems.names()]


def _check_size(value, params: dict) -> None:
    names = _problems_named(params) or list(problems.names())
    allowed = [s for s in problems.get(names[0]).sizes if all(s in problems.get(n).sizes for n in names)]
    _one_of("size", value, allowed, what=f"a size of {', '.join(names)}")


def _check_variant(value, params: dict) -> None:
    problem = params.get("problem", problems.names()[0])
    _one_of("variant", value, problems.get(problem).variants, what=f"a rung of {problem}")


def _check_variants(value, params: dict) -> None:
    problem = params.get("problem", problems.names()[0])
    _list_of("variants", value, problems.get(problem).variants, f"rungs of {problem}", "every rung")


def _check_knobs(value, params: dict) -> None:
    problem = params.get("problem", problems.names()[0])
    example = '[("vectorized", {"THREADS": 512})]'
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(c, (list, tuple)) and len(c) == 2 and isinstance(c[1], dict) for c in value):
        raise ParameterError(f"knobs: {value!r} is not a list of (rung, {{knob: value}}) pairs; expected e.g. "
                             f"{example} or []")
    for rung, values in value:
        _one_of("knobs", rung, problems.get(problem).variants, what=f"a rung of {problem}")
        try:
            knobs.config(problem, rung, values)
        except ValueError as err:
            raise ParameterError(f"knobs: {err}") from None


def _check_results_dir(value, params: dict) -> None:
    if value is not None and not (isinstance(value, (str, Path)) and Path(value).is_dir()):
        raise ParameterError(f"results_dir: {value!r} is not a folder; expected None (the default, "
                             f"{shown_path(params['_default_results_dir'])}) or an existing folder of records")


def _check_device(value, params: dict) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise ParameterError(f"device: {value!r} is not a device name; expected None or a name such as "
                             "'NVIDIA H200' (or its slug 'nvidia-h200')")
    here = gpu_name()
    if here is not None and same_device(value, here) and params.get("live") is not False:
        return
    folder = Path(params.get("results_dir") or params["_default_results_dir"])
    devices = recorded_devices(folder)
    if any(same_device(value, d) for d in devices):
        return
    raise ParameterError(f"device: {value!r} has no record under {shown_path(folder)} and is not the GPU here "
                         f"({here or 'none'}); expected None or one of: "
                         + (", ".join(devices) if devices else "(no device has a record there)"))


def _needs_gpu(name: str) -> Callable:
    def check(value, params: dict) -> None:
        if value not in (None, True, False):
            raise ParameterError(f"{name}: {value!r} is not allowed; expected one of: None, True, False")
        if value is True and not torch.cuda.is_available():
            raise ParameterError(f"{name}: True needs a CUDA GPU and none is visible here; expected None "
                                 "(use one when visible) or False")
    return check


def _positive(name: str, whole: bool, example: str) -> Callable:
    kinds, what = ((int,), "whole number") if whole else ((int, float), "number")

    def check(value, params: dict) -> None:  # NaN and inf are not numbers above 0 here
        if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < math.inf:
            raise ParameterError(f"{name}: {value!r} is not a {what} above 0; expected e.g. {example}")
    return check


def _flag(name: str) -> Callable:
    def check(value, params: dict) -> None:
        if not isinstance(value, bool):
            raise ParameterError(f"{name}: {value!r} is not allowed; expected one of: True, False")
    return check


CHECKS: dict[str, Callable] = {  # in the order they run: later checks read earlier parameters
    "problem": lambda v, p: _one_of("problem", v, problems.names(), what="a problem"),
    "problem_names": lambda v, p: _list_of("problem_names", v, problems.names(), "problems",
                                           none_means="the notebook's own choice of problems"),
    "variant": _check_variant,
    "variants": _check_variants,
    "knobs": _check_knobs,
    "size": _check_size,
    "dtype": lambda v, p: _one_of("dtype", v, DTYPES, what="a dtype with kernels"),
    "peers": lambda v, p: _list_of("peers", v, PEERS, "PyTorch peers", empty_ok=True),
    "live": _needs_gpu("live"),
    "gpu": _needs_gpu("gpu"),
    "results_dir": _check_results_dir,
    "device": _check_device,
    "repeats": _positive("repeats", whole=True, example="20"),
    "timeout_s": _positive("timeout_s", whole=False, example="600"),
    **{name: _flag(name) for name in FLAGS},
}


def _shell():
    """The IPython shell this runs in (a notebook's kernel), or None."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None


def injected_names(shell) -> list[str]:
    """The names papermill's injected-parameters cell assigned in ``shell``'s session: that cell's
    source opens with "# Parameters" (papermill's PythonTranslator), and IPython keeps every
    executed cell's source in ``In``."""
    names = []
    for source in shell.user_ns.get("In", []) if shell is not None else []:
        if isinstance(source, str) and source.lstrip().startswith("# Parameters"):
            try:
                body = ast.parse(source).body
            except SyntaxError:
                continue
            names += [t.id for node in body if isinstance(node, ast.Assign) for t in node.targets
                      if isinstance(t, ast.Name)]
    return names


_scratch: list[Path] = []


def _kernel_scratch() -> None:
    """Once per kernel: tempfile's default folder becomes one of the kernel's own
    (``losslab-kernel-<pid>-...``), removed at exit; those of kernels that were killed before
    their exit handlers ran (their pid is gone) are removed here."""
    if _scratch:
        return
    base = Path(tempfile.gettempdir())
    if Path("/proc/self").exists():  # only where a live process can be told from a dead one
        for old in base.glob("losslab-kernel-*-*"):
            pid = old.name.split("-")[2]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(old, ignore_errors=True)
    _scratch.append(Path(tempfile.mkdtemp(prefix=f"losslab-kernel-{os.getpid()}-", dir=base)))
    tempfile.tempdir = str(_scratch[0])
    atexit.register(shutil.rmtree, _scratch[0], ignore_errors=True)


def validate(*, default_results_dir: Path | str = records.RESULTS_DIR, **parameters) -> None:
    """Check a notebook's parameters (pass every one, by name); return None if all are usable.

    ``default_results_dir`` is where the notebook looks for records when ``results_dir`` is
    None (``reports/results/``; the pitfalls notebook passes its own folder). A ``device`` must
    be the visible GPU or have a record there.

    Run in a notebook kernel, it also refuses a name given with ``papermill -p`` that the
    notebook does not take (papermill only warns and injects it), and gives the kernel a
    temporary folder of its own as tempfile's default, removed when the kernel exits: what the
    cells make with tempfile (notebook 07's solution files) no longer piles up in /tmp.

    Raises:
        ParameterError: the first parameter that holds a value it cannot take, or a name given
            with papermill -p that the notebook does not take; the message names the parameter,
            the value and the allowed values (or names).
        TypeError: a parameter this module has no check for (a new notebook parameter needs one).
    """
    unknown = [name for name in parameters if name not in CHECKS]
    if unknown:
        raise TypeError(f"validate: no check for parameter(s) {', '.join(unknown)}; add one to parameters.CHECKS")
    shell = _shell()
    extra = [name for name in injected_names(shell) if name not in parameters]
    if extra:
        raise ParameterError(f"{extra[0]}: this notebook has no parameter of that name (given with papermill -p); "
                             f"expected some of: {', '.join(parameters)}")
    if shell is not None:
        _kernel_scratch()
    context = {**parameters, "_default_results_dir": Path(default_results_dir)}
    for name, check in CHECKS.items():
        if name in parameters:
            check(parameters[name], context)
