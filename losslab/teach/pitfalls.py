"""Classic mistakes in loss kernels, reproduced on purpose and run through the checker.

    python -m losslab pitfalls            # run them here (GPU) and print what the checker saw
    python -m losslab pitfalls --record   # ... and write reports/results/pitfalls/<device>.json

Five are CUDA files under ``pitfalls/<problem>/`` built with ``losslab.teach.custom`` (the wrong
line marked ``// PITFALL``); two are host-side mistakes in the Python wrapper around a
correct kernel. Each outcome is measured, never assumed: the checks' errors, and for the
atomicAdd and the ``.item()`` pitfalls a determinism probe and a host-timeline probe.
Without a GPU, notebooks show the newest record and say where and when it was made.
"""
from __future__ import annotations

import datetime as dt
import html
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import build, problems, records
from losslab.present.html import Html
from losslab.present.html import table as html_table
from losslab.teach import custom, isolated

SOURCES = build.ROOT / "pitfalls"
RECORDS = records.RESULTS_DIR / "pitfalls"  # a subfolder: records.load_records reads only *.json at the top
CHECK_SIZES = ("small", "odd")
DETERMINISM_SHAPE, DETERMINISM_RUNS = (4096, 4096), 20
TIMELINE_SIZE, TIMELINE_CALLS = "small", 200
RUN_TIMEOUT_S = 300.0  # one pitfall's build import, checks and probe, in its child process


@dataclass(frozen=True)
class Pitfall:
    """One deliberate mistake: ``key`` names its source ``pitfalls/<problem>/<key>.cu`` (CUDA
    pitfalls) or its wrapper class here (``host`` pitfalls); ``mistake`` says what the wrong
    code does, ``symptom`` where the checker should catch it."""

    key: str
    problem: str
    title: str
    mistake: str
    symptom: str
    host: bool = False

    @property
    def source(self) -> Path | None:
        return None if self.host else SOURCES / self.problem / f"{self.key}.cu"


PITFALLS = (
    Pitfall("wrong_direction", "kl_div", "KL computed in the wrong direction",
            "sum p * log(p / t), i.e. KL(p || t), where F.kl_div(log p, t) is KL(t || p)",
            "forward error far above 1e-5 on every random input"),
    Pitfall("batchmean_bd", "kl_div", "batchmean divided by B * D instead of B",
            "the total divided by the number of elements (reduction='mean')",
            "forward error 1 - 1/D: the loss is D times too small"),
    Pitfall("epsilon", "kl_div", "An epsilon added to both inputs",
            "kl_div_term(p + 1e-8, t + 1e-8)",
            "a finite loss where PyTorch gives +inf (a zero prediction), and a shifted loss elsewhere"),
    Pitfall("int32_targets", "cross_entropy", "int64 targets read as int32",
            "targets taken as const int*: row r reads half of target r / 2",
            "forward error on every random input, no error raised"),
    Pitfall("atomic_add", "kl_div", "A float atomicAdd reduction",
            "each block atomicAdds its row's sum into the loss (order changes from run to run)",
            "the same inputs give different losses: the rerun differs, several distinct values over 20 runs"),
    Pitfall("item_sync", "kl_div", "A host .item() sync inside forward",
            "the wrapper checks the loss with loss.isfinite().item() after launching",
            "correct values, but the host waits for the GPU on every call (sync debug mode flags it)",
            host=True),
    Pitfall("one_element", "kl_div", "A 1-element tensor returned instead of a 0-d tensor",
            "the wrapper returns the loss with shape (1,), as from torch.empty(1)",
            "the output shape (1,) where the reference's is ()", host=True),
)


def get(key: str) -> Pitfall:
    """The pitfall called ``key``. Raises ValueError for an unknown key."""
    for p in PITFALLS:
        if p.key == key:
            return p
    raise ValueError(f"pitfall: no pitfall {key!r}; expected one of {', '.join(p.key for p in PITFALLS)}")


class HostPitfall(custom.PythonVariant):
    """A wrapper mistake around a correct kernel: the shipped ``rung``'s launchers, with the
    host-side code of pitfall ``key`` around them."""

    def __init__(self, key: str, problem: str = "kl_div", rung: str = "warp_shuffle"):
        self.key, self.problem, self.rung = key, problem, rung
        self.name = f"pitfall_{key}"

    def launch_forward(self, inputs, out=None, needs_grad=False, grad_out=None):
        spec = problems.get(self.problem)
        loss, saved = spec.launch_forward(self.rung, inputs, out=out, needs_grad=needs_grad, grad_out=grad_out)
        if self.key == "item_sync" and not loss.isfinite().item():  # PITFALL: waits for the GPU
            warnings.warn(f"{self.problem}: non-finite loss", stacklevel=2)
        if self.key == "one_element":
            loss = loss.reshape(1)  # PITFALL: PyTorch returns a 0-d tensor
        return loss, saved

    def launch_backward(self, saved, grad_loss, out=None):
        return problems.get(self.problem).launch_backward(self.rung, saved, grad_loss.reshape(()), out=out)


def variant(key: str) -> custom.PythonVariant:
    """The wrong variant of pitfall ``key``: built from its CUDA source, or its host wrapper."""
    p = get(key)
    if p.host:
        return HostPitfall(key, p.problem)
    return custom.compile_variant(p.problem, p.key, p.source.read_text())


# --- measuring the outcomes (GPU) -----------------------------------------------------------------

def _determinism(v: custom.PythonVariant) -> dict:
    """The loss of ``DETERMINISM_RUNS`` forwards on the same inputs: how many distinct values."""
    spec = problems.get(v.problem)
    inputs = spec.make_inputs(DETERMINISM_SHAPE, seed=0, device="cuda")
    with torch.no_grad():
        losses = [v(*inputs).item() for _ in range(DETERMINISM_RUNS)]
    return {"shape": list(DETERMINISM_SHAPE), "runs": DETERMINISM_RUNS, "distinct_losses": len(set(losses)),
            "min": min(losses), "max": max(losses)}


def _timeline(v: custom.PythonVariant, reference: str = "warp_shuffle") -> dict:
    """Host cost of a sync inside forward: synchronizing calls flagged by torch's sync debug
    mode per forward, and microseconds per call to enqueue ``TIMELINE_CALLS`` forwards
    (host returns) and to finish them, for the pitfall and for the shipped ``reference``."""
    from losslab.ops import variant as shipped

    spec = problems.get(v.problem)
    inputs = spec.make_inputs(spec.sizes[TIMELINE_SIZE], seed=0, device="cuda")
    out = {"shape": list(spec.sizes[TIMELINE_SIZE]), "calls": TIMELINE_CALLS}
    for label, fn in (("pitfall", v), ("reference", shipped(v.problem, reference))):
        with torch.no_grad():
            for _ in range(5):
                fn(*inputs)  # warm-up (and builds)
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    fn(*inputs)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            out[f"{label}_sync_warnings"] = sum("synchroniz" in str(w.message) for w in caught)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(TIMELINE_CALLS):
                fn(*inputs)
            enqueued = time.perf_counter()
            torch.cuda.synchronize()
            done = time.perf_counter()
        out[f"{label}_host_us_per_call"] = (enqueued - start) / TIMELINE_CALLS * 1e6
        out[f"{label}_wall_us_per_call"] = (done - start) / TIMELINE_CALLS * 1e6
    return out


def run(key: str, sizes: tuple[str, ...] = CHECK_SIZES, edge_cases: bool = True) -> dict:
    """Build pitfall ``key``, run the checker on it (random inputs at ``sizes``, then the edge
    cases) and its probe; return the outcome as a JSON-ready dict: key, problem, checks (the
    CheckResults as dicts), failed (count), worst_forward_error, first_failure, probe.

    Raises:
        RuntimeError: no CUDA GPU.
    """
    from losslab.measure.check import check_edge_cases, check_variant

    if not torch.cuda.is_available():
        raise RuntimeError("running the pitfalls needs a CUDA GPU and none is visible here")
    p = get(key)
    v = variant(key)
    spec = problems.get(p.problem)
    checks = [c for s in sizes for c in check_variant(p.problem, v, spec.sizes[s], seed=0)]
    if edge_cases:
        checks += check_edge_cases(p.problem, v)
    failed = [c for c in checks if not c.passed]
    forward = [c.error for c in checks if c.direction == "forward"]
    probe = _determinism(v) if key == "atomic_add" else _timeline(v) if key == "item_sync" else None
    return {"key": key, "problem": p.problem, "checks": [c.as_dict() for c in checks], "failed": len(failed),
            "worst_forward_error": max(forward, default=float("nan")),
            "first_failure": (f"{failed[0].direction} {failed[0].case}: error {failed[0].error:.3g}"
                              f"{' (' + failed[0].detail + ')' if failed[0].detail else ''}") if failed else "",
            "probe": probe}


def sources_sha256(root: Path | None = None) -> str:
    """sha256 of what a pitfalls record was measured with: ``records.pitfall_sources_sha256`` over
    the problems' measured sources and ``pitfalls/``, plus this module and the custom-variant
    code that builds and runs the CUDA pitfalls (``root``: a copy of the repository to hash)."""
    here = Path(__file__).resolve().parent
    return records.pitfall_sources_sha256([Path(__file__).resolve(), *sorted((here / "custom").glob("*.py"))], root)


def run_isolated(key: str, timeout_s: float = RUN_TIMEOUT_S) -> dict:
    """:func:`run` in a child process killed after ``timeout_s`` seconds: a pitfall that hangs or
    faults gives an outcome with ``fault`` (the child's verdict) and no checks, instead of a
    hung or broken process."""
    outcome = isolated.run("losslab.teach.pitfalls:run", {"key": key}, timeout_s)
    if outcome.ok:
        return outcome.value
    return {"key": key, "problem": get(key).problem, "checks": [], "failed": 0, "worst_forward_error": float("nan"),
            "first_failure": f"{outcome.status}: {outcome.message}", "probe": None, "fault": outcome.format()}


def measure(keys: list[str] | None = None, progress: bool = True, isolate: bool = True) -> dict:
    """Run the pitfalls (default all) on this GPU, each in a child process if ``isolate``; return
    a record (not saved): device, torch, CUDA, date, the sources' sha256, ``live`` True and the
    outcome of each (see :func:`run`)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    rec = {"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "sources_sha256": sources_sha256(), "live": True, "outcomes": {}}
    for key in keys or [p.key for p in PITFALLS]:
        get(key)
        if progress:
            print(f"  pitfall {key} ...", flush=True)
        rec["outcomes"][key] = run_isolated(key) if isolate else run(key)
    return rec


def record(keys: list[str] | None = None, results_dir: Path = RECORDS, progress: bool = True) -> tuple[Path, dict]:
    """:func:`measure`, written to ``<results_dir>/<device>.json``. Returns its path and the record."""
    rec = {**measure(keys, progress), "live": False}
    path = Path(results_dir) / f"{records.device_slug(rec['device'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return path, rec


def load_record(device: str | None = None, results_dir: Path | str = RECORDS) -> dict | None:
    """The newest pitfalls record (of ``device``, a name or its slug, if given), or None."""
    found = [json.loads(p.read_text()) for p in sorted(Path(results_dir).glob("*.json"))]
    if device:
        found = [r for r in found if records.device_slug(r["device"]) == records.device_slug(device)]
    return max(found, key=lambda r: r["date"], default=None)


# --- showing them ------------------------------------------------------------------------------------

def banner(rec: dict | None) -> str:
    """One line: where the outcomes come from, or that none exists yet."""
    if rec is None:
        return ("No recorded outcome exists yet, and no GPU is visible here: nothing below is measured. "
                "Run `python -m losslab pitfalls --record` on a GPU machine and commit "
                "reports/results/pitfalls/<device>.json.")
    source = "LIVE (measured now)" if rec.get("live") else "RECORDED (not measured now)"
    fresh = ("matches pitfalls/" if rec["sources_sha256"] == sources_sha256()
             else "does NOT match pitfalls/ (they changed since; record again)")
    return (f"{source} outcomes on {rec['device']}, {rec['date']} (torch {rec['torch']}, CUDA {rec['cuda']}); "
            f"sources sha256 {rec['sources_sha256'][:12]} {fresh}.")


def _probe_text(key: str, probe: dict | None) -> str:
    if not probe:
        return ""
    if key == "atomic_add":
        shape = "x".join(map(str, probe["shape"]))
        return (f"{probe['runs']} forwards at {shape}: {probe['distinct_losses']} distinct loss value(s), "
                f"from {probe['min']!r} to {probe['max']!r}")
    if key == "item_sync":
        return (f"sync debug mode flagged {probe['pitfall_sync_warnings']} synchronizing call(s) per forward "
                f"(shipped: {probe['reference_sync_warnings']}); host returns after "
                f"{probe['pitfall_host_us_per_call']:.1f} us per call (shipped: "
                f"{probe['reference_host_us_per_call']:.1f} us); done after {probe['pitfall_wall_us_per_call']:.1f} "
                f"us per call (shipped: {probe['reference_wall_us_per_call']:.1f} us), {probe['calls']} calls at "
                + "x".join(map(str, probe["shape"])))
    return json.dumps(probe)


def outcome_table(rec: dict | None) -> str:
    """Each pitfall: the checks failed, the worst forward error, the first failure and the
    probe, from a record (or a message that there is none), as an ``Html`` table."""
    if rec is None:
        text = banner(None)
        return Html(f'<p style="color:#a40"><b>{html.escape(text)}</b></p>', plain=text)
    body, plain = [], []
    for p in PITFALLS:
        o = rec["outcomes"].get(p.key)
        if o is None:
            body.append([html.escape(p.title), "not recorded", "", "", ""])
            continue
        checks = f"{o['failed']} of {len(o['checks'])} failed"
        probe = _probe_text(p.key, o.get("probe"))
        body.append([html.escape(p.title), checks, f"{o['worst_forward_error']:.3g}",
                     html.escape(o["first_failure"] or "none"), html.escape(probe)])
        plain.append(f"{p.key}: {checks}; worst forward error {o['worst_forward_error']:.3g}; "
                     f"{o['first_failure'] or 'no failure'}{'; ' + probe if probe else ''}")
    caption = html.escape(banner(rec))
    return Html(html_table(["pitfall", "checks", "worst forward rel. error", "first failure", "probe"], body, caption,
                       text_columns=5), plain="\n".join([banner(rec), *plain]))


def outcome(rec: dict | None, key: str) -> str:
    """What the checker saw for pitfall ``key`` in ``rec``: checks failed of run, the worst forward
    error, the first failure, the probe; or that nothing is recorded (an ``Html``)."""
    o = (rec or {}).get("outcomes", {}).get(key)
    if o is None:
        text = "No recorded outcome for this pitfall yet (see the note at the top): nothing measured."
        return Html(f'<p style="color:#a40">{html.escape(text)}</p>', plain=text)
    lines = [f"{o['failed']} of {len(o['checks'])} checks failed; worst forward relative error "
             f"{o['worst_forward_error']:.3g}", f"first failure: {o['first_failure'] or 'none'}"]
    for c in [c for c in o["checks"] if not c["passed"]][:6]:
        lines.append(f"  FAIL {c['direction']:<8} {c['case'][:50]:<50} error {c['error']:.3g}  {c['detail']}".rstrip())
    if o.get("probe"):
        lines.append("probe: " + _probe_text(key, o["probe"]))
    text = "\n".join(lines)
    return Html(f"<pre>{html.escape(text)}</pre>", plain=text)


def source_lines(key: str) -> str:
    """The pitfall's wrong code: the ``// PITFALL`` lines of its CUDA source (with line numbers),
    or of the host wrapper in this module."""
    p = get(key)
    path = p.source or Path(__file__)
    marker = "PITFALL"
    lines = path.read_text().splitlines()
    hits = [f"{path.relative_to(build.ROOT)}:{i}: {line.strip()}" for i, line in enumerate(lines, 1)
            if marker in line and (not p.host or f'"{key}"' in line or (key == "one_element" and "reshape(1)" in line))]
    return "\n".join(hits)


def describe(key: str) -> str:
    """A pitfall's title, the mistake, where the checker should catch it, and its wrong line(s)."""
    p = get(key)
    code = source_lines(key)
    body = (f"<p><b>{html.escape(p.title)}</b>: {html.escape(p.mistake)}. Expected symptom: "
            f"{html.escape(p.symptom)}.</p><pre style='font-size:11px'>{html.escape(code)}</pre>")
    return Html(body, plain=f"{p.title}: {p.mistake}. Expected symptom: {p.symptom}.\n{code}")
