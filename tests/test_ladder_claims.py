"""Each rung's stated fix, visible in the Nsight Compute counters of the newest record (cpu tier).

The ladder says each rung fixes one named flaw of the rung below (docs/architecture.md, the kernel
headers). Here every such claim is a check on ``Section.ncu`` (a ``measure.ncu.Profile``, float32,
recorded by ``bench --ncu``), so prose and data cannot drift apart:

- shared_memory coalesces: its global loads touch fewer 32-byte sectors per request than naive's
  (naive's lanes read 32 different rows; shared_memory's read 32 consecutive floats);
- naive has too little parallelism: one thread per row gives ceil(rows / 256) blocks, fewer than the
  SMs at the seed size, so fewer SMs do any work than with shared_memory's block per row;
- warp_shuffle replaces the barrier-separated tree: fewer barriers and shared-memory instructions
  than shared_memory in the forward (its backward has nothing to reduce), and more shuffles;
- vectorized issues 16-byte loads: fewer global load requests than warp_shuffle, both directions;
- fused reads the inputs once for forward+backward: fewer DRAM bytes than vectorized's forward and
  backward.

A record made before these counters existed skips with a reason saying to re-record
(``scripts/gpu_suite.sh``); a counter this ncu did not give skips with ncu's reason. Every claim
also runs on a doctored profile where the fix is absent, and must fail there.
"""
import dataclasses
import importlib

import pytest

from losslab import problems, records
from losslab.measure.ncu import Counters, Profile

RERECORD = "re-record on a GPU machine: scripts/gpu_suite.sh (python -m losslab bench --all --ncu)"


# --- reading the profile -------------------------------------------------------------------------------

def _counters(profile: Profile, implementation: str, direction: str) -> Counters:
    found = profile.find(implementation, direction)
    if found is None:
        pytest.skip(f"the record's ncu profile has no {implementation} {direction}: {RERECORD}")
    return found


def _value(profile: Profile, counters: Counters, name: str) -> float:
    """A counter of ``counters``, or a skip naming why ncu gave none."""
    value = getattr(counters, name)
    if value is None:
        why = "; ".join(f"{m}: {r}" for m, r in profile.missing.items()) or "not in this record"
        pytest.skip(f"{counters.implementation} {counters.direction} has no {name} ({why}); {RERECORD}")
    return value


# --- the claims: each raises AssertionError naming the numbers when the data contradicts it ------------

def claim_shared_memory_coalesces(profile: Profile) -> None:
    for direction in ("forward", "backward"):
        naive, shared = (_counters(profile, r, direction) for r in ("naive", "shared_memory"))
        before, after = (_value(profile, c, "sectors_per_request") for c in (naive, shared))
        assert after * 2 <= before, (f"{direction}: shared_memory's global loads touch {after:.1f} sectors per "
                                     f"request, naive's {before:.1f}: coalescing should cut it to about 4 of 32")


def claim_naive_leaves_sms_idle(profile: Profile) -> None:
    sms = profile.multiprocessors
    if not sms:
        pytest.skip(f"the record's ncu profile does not say how many SMs the device has; {RERECORD}")
    naive, shared = (_counters(profile, r, "forward") for r in ("naive", "shared_memory"))
    grid = _value(profile, naive, "grid_size")
    if grid >= sms:
        pytest.skip(f"at the profiled shape {profile.shape} naive launches {grid} blocks for {sms} SMs: "
                    "enough blocks for every SM on this device")
    active, busy = (_value(profile, c, "active_sms") for c in (naive, shared))
    assert active < sms - 0.5 and active <= grid + 0.5, (
        f"naive's {grid} blocks kept {active:.1f} of {sms} SMs busy: one thread per row should leave SMs idle")
    assert busy > active, (f"shared_memory kept {busy:.1f} SMs busy, naive {active:.1f}: a block per row "
                           "should fill more")


def claim_warp_shuffle_drops_the_tree(profile: Profile) -> None:
    shared, shuffle = (_counters(profile, r, "forward") for r in ("shared_memory", "warp_shuffle"))
    before, after = (_value(profile, c, "barriers") for c in (shared, shuffle))
    assert after * 2 <= before, (f"forward: warp_shuffle executes {after:.3g} barriers, shared_memory "
                                 f"{before:.3g}: shuffles should replace most of the tree's barrier-separated steps")
    # fewer shared-memory instructions, not necessarily half: the teaching cross_entropy rung has every thread
    # read the warps' slots (two rounds, the max and the sum), so each thread gets the block's result
    before, after = (_value(profile, c, "shared_instructions") for c in (shared, shuffle))
    assert after < before, (f"forward: warp_shuffle executes {after:.3g} shared instructions, shared_memory "
                            f"{before:.3g}: one slot per warp should need fewer than the tree")
    before, after = (_value(profile, c, "shuffles") for c in (shared, shuffle))
    assert after > before, f"forward: warp_shuffle executes {after:.3g} shuffles, shared_memory {before:.3g}"


def claim_vectorized_issues_fewer_loads(profile: Profile) -> None:
    for direction in ("forward", "backward"):
        shuffle, vector = (_counters(profile, r, direction) for r in ("warp_shuffle", "vectorized"))
        before, after = (_value(profile, c, "load_requests") for c in (shuffle, vector))
        assert after * 2 <= before, (f"{direction}: vectorized issues {after:.3g} global load requests, "
                                     f"warp_shuffle {before:.3g}: 16-byte loads should need about a quarter")


def claim_fused_reads_once(profile: Profile) -> None:
    fused = _counters(profile, "fused", "forward_backward")
    vector = profile.find("vectorized", "forward_backward")
    separate = (vector.dram_bytes if vector is not None else
                sum(_counters(profile, "vectorized", d).dram_bytes for d in ("forward", "backward")))
    assert fused.dram_bytes < 0.9 * separate, (
        f"fused forward+backward moved {fused.dram_bytes / 1e6:.0f} MB of DRAM traffic, vectorized's forward "
        f"and backward {separate / 1e6:.0f} MB: writing the gradient in the forward should save a read")


CLAIMS = [claim_shared_memory_coalesces, claim_naive_leaves_sms_idle, claim_warp_shuffle_drops_the_tree,
          claim_vectorized_issues_fewer_loads, claim_fused_reads_once]


# --- the newest record ---------------------------------------------------------------------------------

def recorded_profile(problem: str, results_dir=records.RESULTS_DIR) -> Profile:
    """The newest record's profile of ``problem`` (under ``results_dir``) holding the per-rung
    counters, as notebooks 01 and 02 show it (the teaching ladder's view, ``Section.taught``), or a skip."""
    try:
        section = records.latest_section(problem, results_dir=results_dir).taught()
    except LookupError as err:
        pytest.skip(str(err))
    profile = section.ncu
    if profile is None or profile.status != "ok":
        pytest.skip(f"the newest {problem} record has no ncu profile "
                    f"({profile.message if profile else 'none'}); {RERECORD}")
    if not profile.has_evidence:
        pytest.skip(f"the newest {problem} record ({section.device}, {section.date[:10]}) predates the "
                    f"per-rung counters (it holds DRAM bytes only); {RERECORD}")
    if not profile.multiprocessors:
        profile.multiprocessors = section.multiprocessors
    return profile


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.__name__.removeprefix("claim_"))
@pytest.mark.parametrize("problem", problems.names())
def test_the_record_supports_the_claim(problem, claim, request):
    """Each claim on each loss's newest record; a claim the loss's claims.py lists in REFUTED (with what
    was measured) must fail there, and passes the day the rung is fixed only if it leaves that list."""
    refuted = getattr(importlib.import_module(f"losslab.problems.{problem}.claims"), "REFUTED", {})
    name = claim.__name__.removeprefix("claim_")
    if name in refuted:
        request.applymarker(pytest.mark.xfail(raises=AssertionError, strict=True, reason=refuted[name]))
    claim(recorded_profile(problem))


# --- every claim can fail ------------------------------------------------------------------------------

def fixture_profile(sms: int = 132) -> Profile:
    """A profile shaped like kl_div's at the seed size on a 132-SM device, the numbers made up but of
    the kernels' proportions (per rung: loads, sectors, barriers, shuffles, DRAM bytes)."""
    n = 16384 * 16384
    giga = 4.0 * n  # one float32 input's bytes

    def c(rung, direction, **values):
        return Counters(rung, "variant", direction, launches=2, **values)

    records_ = [
        c("naive", "forward", load_requests=2 * n / 32, load_sectors=2 * n, grid_size=64, block_size=256,
          active_sms=63.8, dram_bytes_read=2 * giga, barriers=64.0, shuffles=320.0, shared_load_instructions=40.0),
        c("naive", "backward", load_requests=2 * n / 32, load_sectors=2 * n, grid_size=64, active_sms=63.9,
          dram_bytes_read=2 * giga, dram_bytes_written=giga),
        c("shared_memory", "forward", load_requests=2 * n / 32, load_sectors=2 * n / 8, grid_size=16384,
          active_sms=132.0, barriers=16384 * 72.0, shuffles=320.0, shared_load_instructions=16384 * 36.0,
          shared_store_instructions=16384 * 9.0, dram_bytes_read=2 * giga),
        c("shared_memory", "backward", load_requests=2 * n / 32, load_sectors=2 * n / 8, dram_bytes_read=2 * giga,
          dram_bytes_written=giga),
        c("warp_shuffle", "forward", load_requests=2 * n / 32, load_sectors=2 * n / 8, grid_size=16384,
          active_sms=132.0, barriers=16384 * 16.0, shuffles=16384 * 80.0, shared_load_instructions=16384 * 8.0,
          shared_store_instructions=16384 * 8.0, dram_bytes_read=2 * giga),
        c("warp_shuffle", "backward", load_requests=2 * n / 32, load_sectors=2 * n / 8, dram_bytes_read=2 * giga,
          dram_bytes_written=giga),
        c("vectorized", "forward", load_requests=2 * n / 128, load_sectors=2 * n / 8, dram_bytes_read=2 * giga),
        c("vectorized", "backward", load_requests=2 * n / 128, load_sectors=2 * n / 8, dram_bytes_read=2 * giga,
          dram_bytes_written=giga),
        c("vectorized", "forward_backward", dram_bytes_read=4 * giga, dram_bytes_written=giga),
        c("fused", "forward_backward", dram_bytes_read=2 * giga, dram_bytes_written=giga),
    ]
    return Profile("ok", "fixture", [16384, 16384], [], {}, "fixture", sms, records_)


def doctor(profile: Profile, implementation: str, direction: str, **values) -> Profile:
    """A copy of ``profile`` with some counters of one (implementation, direction) replaced."""
    records_ = [dataclasses.replace(r, **values) if (r.implementation, r.direction) == (implementation, direction)
                else r for r in profile.records]
    return dataclasses.replace(profile, records=records_)


DOCTORED = {  # claim -> a profile where the rung's fix is absent
    claim_shared_memory_coalesces: ("shared_memory", "forward", {"load_sectors": 2 * 16384 * 16384}),
    claim_naive_leaves_sms_idle: ("naive", "forward", {"active_sms": 132.0}),
    claim_warp_shuffle_drops_the_tree: ("warp_shuffle", "forward", {"barriers": 16384 * 72.0}),
    claim_vectorized_issues_fewer_loads: ("vectorized", "backward", {"load_requests": 2 * 16384 * 16384 / 32}),
    claim_fused_reads_once: ("fused", "forward_backward", {"dram_bytes_read": 4 * 4.0 * 16384 * 16384}),
}


def _save(profile: Profile, results_dir) -> None:
    section = records.Section("kl_div", "Fixture GPU", 132, rows=[], ncu=profile)
    records.save_section("kl_div", section, results_dir, replace=True)


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.__name__.removeprefix("claim_"))
def test_each_claim_holds_on_a_fixture_record_and_fails_on_a_doctored_one(claim, results_dir):
    _save(fixture_profile(), results_dir)  # through the record file: what the real test reads
    claim(recorded_profile("kl_div", results_dir))
    implementation, direction, values = DOCTORED[claim]
    _save(doctor(fixture_profile(), implementation, direction, **values), results_dir)
    with pytest.raises(AssertionError, match=implementation.split("_")[0]):
        claim(recorded_profile("kl_div", results_dir))


def test_a_missing_counter_skips_with_ncus_reason():
    profile = doctor(fixture_profile(), "warp_shuffle", "forward", barriers=None)
    profile.missing = {"sass__inst_executed_per_opcode": "ncu rejected it: ==ERROR== unknown metric"}
    with pytest.raises(pytest.skip.Exception, match="unknown metric"):
        claim_warp_shuffle_drops_the_tree(profile)


def test_a_record_without_the_counters_skips_saying_to_re_record(results_dir):
    _save(Profile("ok", "old", [16384, 16384], records=[Counters("naive", "variant", "forward", 2)]), results_dir)
    with pytest.raises(pytest.skip.Exception, match="predates the per-rung counters.*gpu_suite.sh"):
        recorded_profile("kl_div", results_dir)


def test_naive_grid_filling_the_device_is_a_skip_not_a_pass():
    with pytest.raises(pytest.skip.Exception, match="enough blocks for every SM"):
        claim_naive_leaves_sms_idle(fixture_profile(sms=32))
