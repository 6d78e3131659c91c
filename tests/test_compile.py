"""compile tier: every kernel compiles for sm_80 and sm_90 without spills, the SASS
shows each rung's idea, and each problem's extension builds and imports."""
import pytest

from losslab import build
from losslab import problems

ARCHS = ("sm_80", "sm_90")
# What each rung's machine code must (and must not) contain: its idea, visible in SASS.
SASS_SIGNS = {
    "naive": ({"LDG.E"}, {"LDG.E.128", "SHFL", "BAR.SYNC"}),
    "shared_memory": ({"BAR.SYNC", "STS", "LDS"}, {"SHFL", "LDG.E.128"}),
    "warp_shuffle": ({"SHFL.BFLY"}, {"LDG.E.128"}),
    "vectorized": ({"LDG.E.128", "SHFL.BFLY"}, set()),
    "fused": ({"LDG.E.128", "STG.E.128"}, set()),
}
SOURCES = [(p, s) for p in problems.names() for s in sorted((build.KERNELS / p).glob("*.cu"))]
SOURCES += [("common", s) for s in sorted((build.KERNELS / "common").glob("*.cu"))]

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def cubins(tmp_path_factory):
    out = tmp_path_factory.mktemp("cubin")
    return {(source, arch): build.compile_cubin(source, arch, out) for _, source in SOURCES for arch in ARCHS}


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
        assert opcode in sass, f"{source.stem}: expected {opcode} in its SASS"
    for opcode in forbidden:
        assert opcode not in sass, f"{source.stem}: did not expect {opcode} in its SASS"


@pytest.mark.parametrize("problem", problems.names())
def test_extension_builds_and_imports(problem):
    ext = build.load_extension(problem)
    for variant in problems.get(problem).variants:
        assert callable(getattr(ext, f"{variant}_forward"))
        assert callable(getattr(ext, f"{variant}_backward"))
