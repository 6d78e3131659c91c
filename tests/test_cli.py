"""cpu tier: the command line."""
import subprocess
import sys

import pytest
import torch

from losslab import build
from losslab.__main__ import main


def test_list_names_every_problem_and_variant(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "kl_div" in out and "vectorized" in out and "16384x16384" in out


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="variant: kl_div has no variant 'turbo'"):
        main(["check", "kl_div", "--variants", "turbo"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_gpu_commands_say_what_is_missing():
    run = subprocess.run([sys.executable, "-m", "losslab", "bench", "kl_div"], capture_output=True, text=True)
    assert run.returncode != 0 and "needs a CUDA GPU" in run.stderr


def test_readme_shows_the_newest_recorded_summary(capsys):
    readme = (build.ROOT / "README.md").read_text()
    shown = readme.split("<!-- summary:begin -->")[1].split("<!-- summary:end -->")[0].strip().strip("`").strip()
    assert main(["summary"]) == 0
    assert shown == capsys.readouterr().out.strip(), "update README.md from `python -m losslab summary`"
