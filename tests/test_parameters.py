"""The notebooks' parameters (cpu tier): every value a notebook cannot take stops it with one line
naming the parameter, the value and what is allowed (``present.parameters.validate``).

Each probe is a mistake a user made in a notebook's parameters cell; on the main before this
module each one gave a bare KeyError, a silently wrong page or a driver error cells later.
"""
import os
import sys
import tempfile
import types

import pytest
import torch

from losslab import problems
from losslab.present import parameters
from losslab.present.parameters import ParameterError, validate


@pytest.mark.parametrize("given, words", [
    ({"problem": "kl_div", "size": "huge"}, ["size: 'huge'", "seed, small, odd, narrow, scalar"]),
    ({"problem": "kl_div", "variants": ["turbo"]}, ["variants: 'turbo'", "naive, shared_memory"]),
    ({"problem": "kl_div", "variants": "vectorized"}, ["variants: 'vectorized' is a str, not a list", "['fused']"]),
    ({"problem": "kl_div", "variants": []}, ["variants: [] is empty"]),
    ({"problem": "kl"}, ["problem: 'kl'", "kl_div, cross_entropy"]),
    ({"problem_names": "kl_div"}, ["problem_names: 'kl_div' is a str, not a list"]),
    ({"problem_names": ["kl_div", "softmax"]}, ["problem_names: 'softmax'", "kl_div, cross_entropy"]),
    ({"problem": "kl_div", "variant": "fastest"}, ["variant: 'fastest'", "vectorized"]),
    ({"dtype": "float64"}, ["dtype: 'float64'", "float32, bfloat16, float16"]),
    ({"peers": ["turbo"]}, ["peers: 'turbo'", "eager, compile, liger"]),
    ({"repeats": 0}, ["repeats: 0 is not a whole number above 0"]),
    ({"repeats": 2.5}, ["repeats: 2.5"]),
    ({"timeout_s": -1}, ["timeout_s: -1"]),
    ({"timeout_s": float("nan")}, ["timeout_s: nan is not a number above 0"]),  # NaN > 0 is False, NaN <= 0 too
    ({"timeout_s": float("inf")}, ["timeout_s: inf is not a number above 0"]),
    ({"interactive": "yes"}, ["interactive: 'yes'", "True, False"]),
    ({"results_dir": "/no/such/folder"}, ["results_dir: '/no/such/folder' is not a folder", "reports/results/"]),
    ({"problem": "kl_div", "knobs": {"THREADS": 512}}, ["knobs: {'THREADS': 512} is not a list", "[]"]),
    ({"problem": "kl_div", "knobs": [("turbo", {})]}, ["knobs: 'turbo'", "naive, shared_memory"]),
    ({"problem": "kl_div", "knobs": [("vectorized", {"THREADS": 100})]},
     ["knobs: THREADS (threads per block of kl_div vectorized): 100 is not offered", "32, 64, 128, 256, 512, 1024"]),
])
def test_a_bad_value_names_the_parameter_the_value_and_the_allowed_values(given, words):
    with pytest.raises(ParameterError) as err:
        validate(**given)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_good_values_pass():
    validate(problem="kl_div", size="odd", variants=["naive", "fused"], dtype="bfloat16", repeats=3, live=False,
             device=None, results_dir=None, peers=[], interactive=False, gpu=False)
    validate(problem_names=list(problems.names()), size="seed", profile_with_ncu=True)
    validate(problem="cross_entropy", variant="vectorized", timeout_s=0.5)
    validate(problem="cross_entropy", knobs=[("vectorized", {"FORWARD_WARPS": 16}), ["fused", {"TILE": 4}]])
    validate(problem="kl_div", knobs=[])


def test_an_unknown_device_names_the_devices_that_have_records(recorded_dir):
    with pytest.raises(ParameterError, match=r"device: 'NVIDIA B200' has no record under .*Fixture GPU"):
        validate(device="NVIDIA B200", results_dir=str(recorded_dir))
    validate(device="Fixture GPU", results_dir=str(recorded_dir))
    validate(device="fixture-gpu", results_dir=str(recorded_dir))  # its file-name slug


def test_the_device_is_looked_up_in_the_notebooks_own_default_folder(recorded_dir, tmp_path):
    """The pitfalls notebook keeps its records elsewhere: it passes that folder as the default."""
    validate(device="Fixture GPU", default_results_dir=recorded_dir)
    with pytest.raises(ParameterError, match="no device has a record there"):
        validate(device="Fixture GPU", default_results_dir=tmp_path / "empty")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
@pytest.mark.parametrize("name", ["gpu", "live"], ids=lambda name: f"{name}=True")  # "gpu" alone would mark the tier
def test_asking_for_a_gpu_without_one_says_so_before_any_driver_call(name):
    with pytest.raises(ParameterError, match=f"{name}: True needs a CUDA GPU and none is visible here"):
        validate(**{name: True})


def test_a_parameter_without_a_check_is_a_programming_error():
    with pytest.raises(TypeError, match="no check for parameter"):
        validate(colour="red")


def test_ipython_shows_the_error_as_one_line():
    """IPython calls ``_render_traceback_`` instead of printing a traceback."""
    with pytest.raises(ParameterError) as err:
        validate(problem="kl_div", size="huge")
    assert err.value._render_traceback_() == [f"ParameterError: {err.value}"]


def in_a_kernel(monkeypatch, *cells: str) -> None:
    """Run what follows as in a notebook kernel whose session executed ``cells`` (IPython's ``In``)."""
    shell = types.SimpleNamespace(user_ns={"In": ["", *cells]})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    monkeypatch.setattr(parameters, "_scratch", [])
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.setattr(parameters.atexit, "register", lambda fn, *args, **kwargs: None)


def test_a_name_papermill_injected_that_the_notebook_lacks_is_refused(monkeypatch):
    """papermill -p timeout 5 on notebook 07 (whose parameter is timeout_s): papermill only warns."""
    injected = "# Parameters\nproblem = \"kl_div\"\ntimeout = 5\n"  # papermill's injected-parameters cell
    in_a_kernel(monkeypatch, 'problem = "kl_div"\ntimeout_s = 600\n', injected)
    with pytest.raises(ParameterError, match=r"^timeout: this notebook has no parameter of that name .*"
                                             r"expected some of: problem, timeout_s$"):
        validate(problem="kl_div", timeout_s=600)
    in_a_kernel(monkeypatch, "# Parameters\ntimeout_s = 5\n")
    validate(problem="kl_div", timeout_s=5)


def test_in_a_kernel_temporary_files_go_to_a_folder_removed_at_exit(monkeypatch):
    """Notebook 07 makes its solution files with tempfile.mkdtemp and never removes them."""
    registered = []
    in_a_kernel(monkeypatch)
    monkeypatch.setattr(parameters.atexit, "register", lambda fn, *args, **kw: registered.append((fn, args, kw)))
    validate(problem="kl_div")
    validate(problem="kl_div")  # once per kernel
    scratch = tempfile.gettempdir()
    assert "losslab-kernel-" in scratch and len(registered) == 1
    made = tempfile.mkdtemp(prefix="losslab-07-")
    assert made.startswith(scratch)
    fn, args, kwargs = registered[0]
    fn(*args, **kwargs)  # what the kernel runs at exit
    assert not os.path.exists(made) and not os.path.exists(scratch)


def test_the_folder_of_a_killed_kernel_is_removed_by_the_next(monkeypatch, tmp_path):
    """A kernel killed before its exit handlers ran leaves its folder; the next kernel removes it."""
    in_a_kernel(monkeypatch)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / "losslab-kernel-999999999-abc"  # a pid above any pid_max
    alive = tmp_path / f"losslab-kernel-{os.getpid()}-def"
    dead.mkdir()
    alive.mkdir()
    validate(problem="kl_div")
    assert not dead.exists() and alive.exists()


def test_outside_a_kernel_validate_changes_nothing():
    before = tempfile.gettempdir()
    validate(problem="kl_div", timeout_s=5)
    assert tempfile.gettempdir() == before
