"""Grading a whole folder of KernelBench answers (losslab.kernelbench.folder, `losslab evaluate DIR`).

cpu tier: KernelBench's fast_p from given verdicts and speedups; how an answer names its problem;
bad input (no folder, an empty one, no .py answer, an unknown or unnamed problem) is one line and
exit 2; a folder of mixed answers in the CPU dry run (honest, wrong, hostile, a hang, a crash):
every answer gets its row and its own verdict, JSON and HTML are written; the CLI without a GPU;
gpu tier: a small real folder (exported answers of both losses, a cheat, a crash) timed one
answer at a time, with speedups, % of the speed of light and fast_p.
"""
import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch

from losslab import problems
from losslab.__main__ import main
from losslab.kernelbench import folder
from losslab.kernelbench.export import export_solution
from losslab.kernelbench.verdict import Verdict

KL_DIV, CROSS_ENTROPY = problems.get("kl_div"), problems.get("cross_entropy")

SOLUTIONS_DIR = Path(__file__).parent / "solutions"


def write_answer(where, name: str, body: str, problem: str | None = "kl_div") -> None:
    comment = f"# problem: {problem}\n" if problem else ""
    (where / f"{name}.py").write_text(comment + textwrap.dedent(f"""\
        import os, signal, torch, torch.nn as nn

        class ModelNew(nn.Module):
            def forward(self, p, t):
                {body}
        """))


def run(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


# --- fast_p --------------------------------------------------------------------------------------------

def test_fast_p_is_the_fraction_of_all_answers_correct_and_faster_than_p():
    results = [(True, 2.5), (True, 1.5), (True, 0.8), (False, 9.0), (True, 1.0)]  # a wrong answer never counts
    assert folder.fast_p(results, 0) == 4 / 5  # fast_0: the fraction correct
    assert folder.fast_p(results, 1) == 2 / 5  # strictly faster: a speedup of exactly 1 is not
    assert folder.fast_p(results, 1.5) == 1 / 5
    assert folder.fast_p(results, 2) == 1 / 5
    assert folder.fast_p(results, 3) == 0.0
    untimed = [(True, None), (False, None)]  # a dry run: correct, speed unknown
    assert folder.fast_p(untimed, 0) == 0.5 and folder.fast_p(untimed, 1) is None
    assert folder.fast_p([(False, None)], 1) == 0.0
    assert folder.fast_p([(True, 2.0), (None, None)], 0) is None  # an answer no GPU ran: unknown, not wrong
    for bad, p in (([], 0), (results, -1), (results, float("nan"))):
        with pytest.raises(ValueError):
            folder.fast_p(bad, p)


def test_a_report_reads_correctness_speedup_and_speed_of_light_from_the_verdicts():
    def verdict(status, **timing):
        return Verdict(status, "kl_div", "a.py", (4, 8), timing=timing or None)

    report = folder.FolderReport("answers", [
        folder.Graded("fast.py", verdict("passed", speedup_eager=2.5, floor_ms=0.5, solution_ms=1.0)),
        folder.Graded("slow.py", verdict("too_slow", speedup_eager=0.5, solution_ms=4.0)),  # correct, slow
        folder.Graded("fooled.py", verdict("impossible_time", floor_ms=0.5, solution_ms=0.1)),  # not correct
        folder.Graded("wrong.py", verdict("wrong_values"))])
    assert report.fast_p() == {"0": 0.5, "1": 0.25, "1.5": 0.25, "2": 0.25}
    rows = report.as_dict()["answers"]
    assert [r["speedup_eager"] for r in rows] == [2.5, 0.5, None, None]
    assert [r["speed_of_light_pct"] for r in rows] == [50.0, None, None, None]
    text = report.format()
    assert "fast.py    kl_div   passed" in text and "2.50x" in text and "50 %" in text and "fast_1 = 0.25" in text


# --- which problem -------------------------------------------------------------------------------------

def test_an_answer_names_its_problem(tmp_path):
    cases = {
        "commented.py": "# problem: cross_entropy\nimport torch\n",
        "exported.py": export_solution(KL_DIV, "naive"),  # PROBLEM = 'kl_div' and KernelBench's 98_KLDivLoss
        "level1_95_CrossEntropyLoss_answer.py": "import torch\n",  # KernelBench's name in the file name
        "copied.py": '"""An answer to KernelBench level 1, 98_KLDivLoss."""\n',
        "kl_div_mine.py": "import torch\n",  # a problem's name opens the file name
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    found = {path.name: problem for path, problem in folder.answers(tmp_path)}
    assert found == {"commented.py": "cross_entropy", "exported.py": "kl_div", "copied.py": "kl_div",
                     "level1_95_CrossEntropyLoss_answer.py": "cross_entropy", "kl_div_mine.py": "kl_div"}
    # --problem names every answer's problem; the map wins for the files it names
    mapped = folder.answers(tmp_path, "kl_div", {"copied.py": "cross_entropy"})
    assert {p.name: name for p, name in mapped}["copied.py"] == "cross_entropy"
    assert {name for p, name in mapped if p.name != "copied.py"} == {"kl_div"}


def test_an_answer_whose_problem_cannot_be_told_is_refused(tmp_path):
    (tmp_path / "plain.py").write_text("import torch\n")
    with pytest.raises(ValueError, match=r"^answer plain\.py: cannot tell its problem \(it names none\)"):
        folder.answers(tmp_path)
    (tmp_path / "plain.py").write_text("# 98_KLDivLoss or 95_CrossEntropyLoss?\n")
    with pytest.raises(ValueError, match="it could be cross_entropy or kl_div"):
        folder.answers(tmp_path)
    # l1_loss: a PyTorch loss that is not one of our problems
    (tmp_path / "plain.py").write_text("# problem: l1_loss\n")
    with pytest.raises(ValueError, match=r"names 'l1_loss'; expected one of"):
        folder.answers(tmp_path)


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    empty, text_only, unnamed = tmp_path / "empty", tmp_path / "text", tmp_path / "unnamed"
    for path in (empty, text_only, unnamed):
        path.mkdir()
    (text_only / "notes.txt").write_text("x")
    (unnamed / "a.py").write_text("import torch\n")
    # l1_loss: a PyTorch loss that is not one of our problems
    (tmp_path / "map.json").write_text(json.dumps({"a.py": "l1_loss"}))
    (tmp_path / "list.json").write_text("[1]")
    cases = [
        (["evaluate", str(tmp_path / "missing")], "losslab evaluate: solution: expected an existing file or folder"),
        (["evaluate", str(empty)], f"losslab evaluate: solution: {empty} holds no .py answers (it is empty)"),
        (["evaluate", str(text_only)], f"losslab evaluate: solution: {text_only} holds no .py answers"),
        (["evaluate", str(unnamed)], "losslab evaluate: solution: answer a.py: cannot tell its problem"),
        (["evaluate", str(unnamed), "--problem", "l1_loss"], "losslab evaluate: --problem: expected one of"),
        (["evaluate", str(unnamed), "--problems", str(tmp_path / "map.json")],
         "losslab evaluate: --problems: no problem 'l1_loss'"),
        (["evaluate", str(unnamed), "--problems", str(tmp_path / "list.json")],
         "losslab evaluate: --problems: expected a JSON object of answer file name -> problem name"),
        (["evaluate", str(unnamed), "--problems", str(tmp_path / "nothing.json")],
         "losslab evaluate: --problems: no file"),
        (["evaluate", str(unnamed), "--problem", "kl_div", "--jobs", "0"],
         "losslab evaluate: --jobs: expected a positive whole number"),
        (["evaluate", str(SOLUTIONS_DIR / "forward_only.py")], "losslab evaluate: --problem: expected a problem name"),
    ]
    for argv, prefix in cases:
        code, out, err = run(argv, capsys)
        assert code == 2 and out == "" and err.startswith(prefix) and err.count("\n") == 1, (argv, err)


# --- a folder, end to end ---------------------------------------------------------------------------------

@pytest.fixture
def mixed(tmp_path):
    """A folder of honest, wrong and hostile kl_div answers, each with its expected verdict."""
    answers = tmp_path / "answers"
    answers.mkdir()
    write_answer(answers, "good", "return (t * (t.log() - p.log())).sum() / p.shape[0]")
    write_answer(answers, "mean_not_batchmean", "return (t * (t.log() - p.log())).mean()")
    write_answer(answers, "hangs", "while True: pass")
    write_answer(answers, "segfaults", "os.kill(os.getpid(), signal.SIGSEGV)")
    for name in ("forged_verdict.py", "mutated_inputs.py"):  # tests/solutions/ name no problem: --problem does
        shutil.copyfile(SOLUTIONS_DIR / name, answers / name)
    expected = {"forged_verdict.py": "crashed", "good.py": "passed", "hangs.py": "timed_out",
                "mean_not_batchmean.py": "wrong_values", "mutated_inputs.py": "mutated_inputs",
                "segfaults.py": "crashed"}
    return answers, expected


def test_every_answer_of_a_mixed_folder_gets_its_own_verdict(mixed, tmp_path):
    answers, expected = mixed
    out_json, out_html = tmp_path / "grades.json", tmp_path / "grades.html"
    report = folder.evaluate_folder(answers, "kl_div", jobs=3, json_path=out_json, html_path=out_html, device="cpu",
                                    size="narrow", trials=1, timeout_s=25)
    assert {g.answer: g.verdict.status for g in report.graded} == expected  # a hang or a crash stops no other
    assert report.fast_p() == {"0": 1 / 6, "1": None, "1.5": None, "2": None}  # the dry run times nothing
    saved = json.loads(out_json.read_text())
    assert [r["answer"] for r in saved["answers"]] == sorted(expected) and saved["fast_p"]["0"] == 1 / 6
    assert {r["answer"]: r["status"] for r in saved["answers"]} == expected
    assert all(r["verdict"]["processes"]["how"] for r in saved["answers"])  # each answer ran supervised
    page = out_html.read_text()
    assert page.startswith("<!doctype html>") and all(name in page for name in expected)
    assert "fast_0 = 0.17" in page and page.count("<details>") == len(expected)


def test_the_cli_grades_a_folder_without_a_gpu_as_no_gpu(mixed, tmp_path, capsys, monkeypatch):
    """Without a GPU every answer's verdict is no_gpu (nothing runs), and the table and files still come out."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    answers, expected = mixed
    code, out, err = run(["evaluate", str(answers), "--problem", "kl_div", "--json", str(tmp_path / "g.json"),
                          "--html", str(tmp_path / "g.html")], capsys)
    assert code == 1 and sorted(err.splitlines()) == [f"{name}: no_gpu" for name in sorted(expected)]  # progress
    assert out.splitlines()[0].split() == ["answer", "problem", "verdict", "speedup", "%", "speed", "of", "light",
                                           "why"]
    assert all(f"{name}" in out for name in expected) and out.count("no_gpu") == len(expected)
    assert "fast_0 = -  fast_1 = -" in out  # nothing ran: unknown, not 0 (no answer was wrong)
    assert len(json.loads((tmp_path / "g.json").read_text())["answers"]) == len(expected)
    assert (tmp_path / "g.html").read_text().count(">no_gpu</td>") == len(expected)


# --- gpu tier ------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_a_small_real_folder_is_graded_with_speedups_and_fast_p(tmp_path):
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "kl_div_vectorized.py").write_text(export_solution(KL_DIV, "vectorized"))
    (answers / "cross_entropy_vectorized.py").write_text(export_solution(CROSS_ENTROPY, "vectorized"))
    (answers / "one_row_in_eight.py").write_text("# problem: kl_div\n" + (SOLUTIONS_DIR / "one_row_in_eight.py")
                                                 .read_text())
    write_answer(answers, "segfaults", "os.kill(os.getpid(), signal.SIGSEGV)")
    # a device-side assert: the answer's CUDA context is dead after it
    write_answer(answers, "device_assert", "return p.flatten()[torch.full((1,), 2**40, device=p.device)].sum()")
    report = folder.evaluate_folder(answers, jobs=4, json_path=tmp_path / "g.json", html_path=tmp_path / "g.html",
                                    trials=2, repeats=5, timeout_s=300)
    print(report.format())
    status = {g.answer: g.verdict.status for g in report.graded}
    assert status["kl_div_vectorized.py"] == status["cross_entropy_vectorized.py"] == "passed", report.format()
    assert status["one_row_in_eight.py"] == "wrong_values" and status["segfaults.py"] == "crashed"
    assert status["device_assert.py"] == "crashed"
    for g in (g for g in report.graded if g.verdict.passed):
        assert g.speedup > 0 and 0 < g.speed_of_light_pct <= 100
    fast = report.fast_p()
    assert fast["0"] == 2 / 5 and fast["1"] == sum(g.speedup > 1 for g in report.graded if g.correct) / 5
