"""compile tier: every kernel compiles for sm_80 and sm_90 without spills, the SASS shows
each rung's idea, the bindings build through bind.h, and each problem's extension builds
and imports with every rung's launchers."""
import os
import re
from concurrent import futures

import pytest

from losslab import build, problems

ARCHS = ("sm_80", "sm_90")
# What each rung's machine code must (and must not) contain: its idea, visible in SASS.
# Regexes over the disassembly: a 32-bit global load is "LDG.E" followed by a space or by
# ".CONSTANT " (no width suffix), so it is not found inside "LDG.E.128".
SCALAR_LOAD = r"\bLDG\.E(\.CONSTANT)? "
SASS_SIGNS = {
    "naive": ({SCALAR_LOAD}, {r"LDG\.E\.128", r"\bSHFL\b", r"BAR\.SYNC"}),
    "shared_memory": ({r"BAR\.SYNC", r"\bSTS\b", r"\bLDS\b"}, {r"\bSHFL\b", r"LDG\.E\.128"}),
    "warp_shuffle": ({r"SHFL\.BFLY"}, {r"LDG\.E\.128"}),
    "vectorized": ({r"LDG\.E\.128", r"SHFL\.BFLY"}, set()),
    "fused": ({r"LDG\.E\.128", r"STG\.E\.128"}, set()),
    # cross_entropy's cluster: the slice comes by bulk copy (UBLKCP) with an mbarrier wait
    # (SYNCS), not by vector loads; the cluster barrier (UCGABAR); the write into another
    # CTA's shared memory is a generic 16-byte store into the cluster's shared window (nvcc 13
    # lowers mapa to a PRMT of the rank into the address, no MAPA); the gradient from LDS.128.
    # No 16-byte load of the row from global memory (the mean's last block reads the rows'
    # losses from L2 with 16-byte loads: LDG.E.128.STRONG.GPU, allowed).
    "cluster": ({r"UBLKCP\.S\.G", r"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT", r"UCGABAR_ARV", r"UCGABAR_WAIT",
                 r"SR_SWINHI", r"\bST\.E\.128\b", r"LDS\.128", r"STG\.E\.128"}, {r"LDG\.E\.128(\.CONSTANT)? "}),
}
SOURCES = [(p, s) for p in problems.names() for s in sorted((build.KERNELS / p).glob("*.cu"))]
# kernels/common's host-only files (stream_workspace.cu: no __global__) hold no kernel to check
SOURCES += [("common", s) for s in sorted((build.KERNELS / "common").glob("*.cu")) if "__global__" in s.read_text()]
# the pitfalls and the exercises' solutions compile against the same headers and launcher types
OTHERS = [s for folder in ("pitfalls", "exercises/solutions") for s in sorted((build.ROOT / folder).rglob("*.cu"))]

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def cubins(tmp_path_factory):
    """``{(source, arch): (cubin, ptxas report)}``, one nvcc per CPU (each file alone, as one at a time)."""
    out = tmp_path_factory.mktemp("cubin")
    jobs = [(source, arch) for _, source in SOURCES for arch in ARCHS]
    with futures.ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        return dict(zip(jobs, pool.map(lambda job: build.compile_cubin(*job, out), jobs), strict=True))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("problem, source", SOURCES, ids=[f"{p}/{s.name}" for p, s in SOURCES])
def test_kernels_compile_without_spills(cubins, problem, source, arch):
    _, report = cubins[(source, arch)]
    kernels = build.resource_usage(report, arch)
    assert kernels, f"no kernel found in ptxas output for {source}"
    for k in kernels:
        assert k.spill_store_bytes == k.spill_load_bytes == 0, f"{k.kernel} spills on {arch}: {k}"
        assert k.stack_bytes == 0, f"{k.kernel} uses a {k.stack_bytes}-byte stack frame on {arch}"


@pytest.mark.parametrize("problem, source", [(p, s) for p, s in SOURCES if s.stem in SASS_SIGNS],
                         ids=[f"{p}/{s.name}" for p, s in SOURCES if s.stem in SASS_SIGNS])
def test_sass_shows_the_rungs_idea(cubins, problem, source):
    cubin, _ = cubins[(source, "sm_90")]
    sass = "\n".join(build.disassemble(cubin).values())
    required, forbidden = SASS_SIGNS[source.stem]
    for opcode in required:
        assert re.search(opcode, sass), f"{source.stem}: expected {opcode} in its SASS"
    for opcode in forbidden:
        assert not re.search(opcode, sass), f"{source.stem}: did not expect {opcode} in its SASS"


# The kernels losslab.nn's operators launch, one per dtype (float32, bfloat16, float16), found by a
# piece of their name: the options kernels of kl_div and cross_entropy (some dtypes have several),
# the forward kernel of mse_loss and smooth_l1_loss (exactly one each).
OPERATOR_KERNELS = [(p, r, "options", None) for p in ("kl_div", "cross_entropy") for r in ("vectorized", "fused")]
OPERATOR_KERNELS += [(p, r, "forward_kernel", 3) for p in ("mse_loss", "smooth_l1_loss")
                     for r in ("vectorized", "fused")]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("problem, rung, name, exactly", OPERATOR_KERNELS,
                         ids=[f"{p}/{r}.cu" for p, r, _, _ in OPERATOR_KERNELS])
def test_each_dtype_has_its_operator_kernel(cubins, problem, rung, name, exactly, arch):
    _, report = cubins[(build.KERNELS / problem / f"{rung}.cu", arch)]
    found = [k.kernel for k in build.resource_usage(report, arch) if name in k.kernel]
    assert len(found) == exactly if exactly else len(found) >= 3, \
        f"{problem}/{rung}.cu on {arch}: expected {exactly or 'at least 3'} {name} kernels (one per dtype), got {found}"


def test_the_scalar_load_sign_is_not_a_substring_of_a_vector_load():
    assert not re.search(SCALAR_LOAD, "LDG.E.128 R4, desc[UR4][R2.64] ;\nLDG.E.128.CONSTANT R8, desc[UR4][R6.64] ;")
    assert re.search(SCALAR_LOAD, "LDG.E R5, desc[UR4][R2.64] ;")
    assert re.search(SCALAR_LOAD, "LDG.E.CONSTANT R5, desc[UR4][R2.64] ;")


@pytest.mark.parametrize("source", OTHERS, ids=[str(s.relative_to(build.ROOT)) for s in OTHERS])
def test_pitfalls_and_solutions_compile_against_the_launcher_types(tmp_path, source):
    build.compile_cubin(source, "sm_90", tmp_path)


@pytest.mark.parametrize("problem", problems.names())
def test_extension_builds_and_imports(problem):
    ext = build.load_extension(problem)
    for rung in problems.get(problem).rungs:
        assert callable(getattr(ext, rung.forward))
        assert callable(getattr(ext, rung.backward))
    with pytest.raises(TypeError):  # bind.h maps each parameter: a wrong count is refused by pybind11
        getattr(ext, problems.get(problem).rungs[0].forward)(0)


def packed_exp_margin(cubin) -> dict[str, int]:
    """Per 16-bit forward kernel of a cubin: MUFU.EX2 count minus FFMA.RM count (expf's range reduction)."""
    return {name: len(re.findall(r"MUFU\.EX2", sass)) - len(re.findall(r"FFMA\.RM", sass))
            for name, sass in build.disassemble(cubin).items()
            if "forward_kernel" in name and "bfloat16" in name and "options" not in name}


@pytest.mark.parametrize("stem", ["vectorized", "fused"])
def test_cross_entropy_packed_exp_has_no_range_reduction(cubins, stem):
    # issue 13: at two bytes an element, expf's range reduction (about 8 instructions, one FFMA.RM)
    # kept the bf16 forward from memory speed; the packed loops take exp as FFMA + MUFU.EX2 alone.
    # A full round of packs (8 bf16 values each) is at least 64 exps with no FFMA.RM beside them.
    cubin, _ = cubins[(build.KERNELS / "cross_entropy" / f"{stem}.cu", "sm_90")]
    margins = packed_exp_margin(cubin)
    assert margins, f"no bf16 forward kernel in cross_entropy/{stem}.cu"
    for name, margin in margins.items():
        assert margin >= 64, f"{name}: only {margin} MUFU.EX2 without an expf range reduction"


@pytest.mark.compile
def test_an_unwritable_extension_folder_is_one_build_error_naming_it(tmp_path, monkeypatch):
    """A build folder that cannot be written (here: under a file, which stops root too) is a
    BuildError naming the folder and TORCH_EXTENSIONS_DIR, not an OSError traceback."""
    from losslab.build import ladder

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(blocker / "extensions"))
    ladder.load_ladder.cache_clear()
    try:
        with pytest.raises(build.BuildError) as caught:
            ladder.load_ladder("kl_div")
    finally:
        ladder.load_ladder.cache_clear()
    message = str(caught.value)
    assert "\n" not in message and "TORCH_EXTENSIONS_DIR" in message and str(blocker) in message
