"""Launch knobs (losslab.build.knobs, extension.load_extension(defines=), ops.variant(knobs=)):
cpu: the declarations each rung file makes, the checks of a value, the labels, the flag-keyed
extension names and the one-line compile error; compile: a configuration builds as its own
extension and a value the kernel refuses fails with its static_assert in one line; gpu: a
configuration runs and matches float64."""
import os
import re
from concurrent import futures

import pytest
import torch

from losslab import build, ops, problems
from losslab.build import knobs

# the launch constants the rung files had before they became knobs: a default build is unchanged
DEFAULTS = {
    ("kl_div", "naive"): {"THREADS": 256}, ("kl_div", "shared_memory"): {"THREADS": 256},
    ("kl_div", "warp_shuffle"): {"THREADS": 256}, ("kl_div", "vectorized"): {"THREADS": 256, "UNROLL": 4},
    ("kl_div", "fused"): {"THREADS": 256, "UNROLL": 4},
    ("cross_entropy", "naive"): {"THREADS": 256}, ("cross_entropy", "shared_memory"): {"THREADS": 256},
    ("cross_entropy", "warp_shuffle"): {"THREADS": 256},
    ("cross_entropy", "vectorized"): {"FORWARD_WARPS": 8, "BACKWARD_WARPS": 4, "UNROLL": 8},
    ("cross_entropy", "fused"): {"THREADS": 128, "TILE": 8}, ("cross_entropy", "cluster"): {"THREADS": 256},
    ("hinge_loss", "naive"): {"THREADS": 256}, ("hinge_loss", "shared_memory"): {"THREADS": 256},
    ("hinge_loss", "warp_shuffle"): {"THREADS": 256}, ("hinge_loss", "vectorized"): {"THREADS": 512, "UNROLL": 4},
    ("hinge_loss", "fused"): {"THREADS": 1024, "UNROLL": 2},
    ("triplet_margin_loss", "vectorized"): {"THREADS": 512, "CACHE": 4, "FORWARD_THREADS": 256,
                                              "FORWARD_CACHE": 2, "FORWARD_WAVES": 8},
    ("triplet_margin_loss", "fused"): {"THREADS": 512, "CACHE": 2},
    ("cosine_similarity_loss", "naive"): {"THREADS": 256},
    ("cosine_similarity_loss", "shared_memory"): {"THREADS": 256},
    ("cosine_similarity_loss", "warp_shuffle"): {"THREADS": 256},
    ("cosine_similarity_loss", "vectorized"): {"THREADS": 256, "TILE": 4, "BLOCKS": 2048},
    ("cosine_similarity_loss", "fused"): {"THREADS": 512, "TILE": 4},
    ("mse_loss", "vectorized"): {"THREADS": 256, "UNROLL": 4}, ("mse_loss", "fused"): {"THREADS": 256, "UNROLL": 4},
    ("smooth_l1_loss", "vectorized"): {"THREADS": 256, "UNROLL": 2},
    ("smooth_l1_loss", "fused"): {"THREADS": 256, "UNROLL": 2},
}
THREADS_128 = (("LOSSLAB_KL_DIV_VECTORIZED_THREADS", 128),)


@pytest.mark.parametrize("problem, rung", [(p, v) for p in problems.names() for v in problems.get(p).variants])
def test_every_rung_declares_its_knobs_with_the_former_constants_as_defaults(problem, rung):
    declared = knobs.knobs(problem, rung)
    assert {k.name: k.default for k in declared} == DEFAULTS[problem, rung]
    source = (build.KERNELS / problem / f"{rung}.cu").read_text()
    for knob in declared:
        assert knob.default in knob.allowed and knob.meaning
        assert f"constexpr int {knob.name} = {knob.macro};" in source
        # the kernel states what it needs, naming the macro: a value given to nvcc directly is checked too
        assert re.search(rf'static_assert\([^;]*"{knob.macro}: ', source), knob.macro


def test_a_configuration_is_labelled_and_defines_only_what_differs():
    chosen = knobs.config("kl_div", "vectorized", {"THREADS": 512})
    assert chosen.label == "vectorized [THREADS=512, UNROLL=4]" and not chosen.is_default
    assert chosen.defines == (("LOSSLAB_KL_DIV_VECTORIZED_THREADS", 512),)
    default = knobs.config("cross_entropy", "vectorized")
    assert default.label == "vectorized [FORWARD_WARPS=8, BACKWARD_WARPS=4, UNROLL=8]"
    assert default.is_default and default.defines == ()
    assert knobs.rung_of(chosen.label) == "vectorized" and knobs.rung_of("eager") == "eager"


@pytest.mark.parametrize("values, message", [
    ({"THREADS": 100}, "THREADS (threads per block of kl_div vectorized): 100 is not offered; "
                       "expected one of 32, 64, 128, 256, 512, 1024"),
    ({"UNROLL": True}, "UNROLL (16-byte loads in flight per tensor of kl_div vectorized): True is not offered; "
                       "expected one of 1, 2, 4, 8, 16"),
    ({"WARPS": 4}, "knobs: kl_div vectorized has no knob 'WARPS'; its knobs: THREADS, UNROLL"),
])
def test_a_bad_knob_is_one_line_naming_it_and_the_allowed_values(values, message):
    with pytest.raises(ValueError) as err:
        knobs.config("kl_div", "vectorized", values)
    assert str(err.value) == message


def test_a_configuration_builds_under_a_name_keyed_by_its_flags():
    assert build.extension_name("kl_div") == "losslab_kl_div"  # the default build: as before
    both = (("LOSSLAB_KL_DIV_VECTORIZED_THREADS", 512), ("LOSSLAB_KL_DIV_VECTORIZED_UNROLL", 8))
    name = build.extension_name("kl_div", both)
    assert re.fullmatch(r"losslab_kl_div_[0-9a-f]{10}", name)
    assert build.extension_name("kl_div", both[::-1]) == name  # the order of the flags does not matter
    assert build.extension_name("kl_div", THREADS_128) not in (name, "losslab_kl_div")
    assert build.define_flags("kl_div", both) == ["-DLOSSLAB_KL_DIV_VECTORIZED_THREADS=512",
                                                  "-DLOSSLAB_KL_DIV_VECTORIZED_UNROLL=8"]


@pytest.mark.parametrize("defines, message", [
    ((("LOSSLAB_KL_DIV_VECTORIZED_THREAD", 128),), "defines: 'LOSSLAB_KL_DIV_VECTORIZED_THREAD' is no knob of the "
                                                   "kl_div kernels"),
    ((("LOSSLAB_CROSS_ENTROPY_FUSED_TILE", 4),), "is no knob of the kl_div kernels"),  # another problem's knob
    ((("LOSSLAB_KL_DIV_VECTORIZED_THREADS", "128"),), "defines: LOSSLAB_KL_DIV_VECTORIZED_THREADS must be an int"),
])
def test_load_extension_refuses_a_define_that_is_no_knob_before_building(defines, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build.load_extension("kl_div", defines=defines)


def test_a_failed_static_assert_is_shown_in_one_line():
    output = (f"[1/9] nvcc ...\nFAILED: vectorized.cuda.o\n{build.KERNELS}/kl_div/vectorized.cu(26): error: static "
              'assertion failed with "LOSSLAB_KL_DIV_VECTORIZED_THREADS: a multiple of 32 from 32 to 1024 (whole '
              'warps)"\n  static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,\n  ^\n')
    assert build.compile_error_line(output) == (
        'kernels/kl_div/vectorized.cu:26: static assertion failed with "LOSSLAB_KL_DIV_VECTORIZED_THREADS: a '
        'multiple of 32 from 32 to 1024 (whole warps)"')
    assert build.compile_error_line("error: expected a ';'") is None


def test_a_knob_variant_is_a_variant_object_over_its_own_build():
    fn = ops.variant("kl_div", "fused", knobs={"UNROLL": 8})  # nothing is built until the first call
    assert fn.name == "fused [THREADS=256, UNROLL=8]" and fn.rung.writes_grad_in_forward
    assert fn.dtypes == problems.get("kl_div").dtypes("fused")
    built = ops._KNOB_OPS[knobs.config("kl_div", "fused", {"UNROLL": 8})]
    assert built is not ops.OPS["kl_div", "fused"] and built.forward is None  # no operators of its own
    ops.variant("kl_div", "fused", knobs={"UNROLL": 8})
    assert len([c for c in ops._KNOB_OPS if c.rung == "fused"]) == 1  # the same configuration once
    default = ops.variant("kl_div", "fused", knobs={"UNROLL": 4})
    assert default.name == "fused [THREADS=256, UNROLL=4]"
    with pytest.raises(ValueError, match="UNROLL .* 3 is not offered"):
        ops.variant("kl_div", "fused", knobs={"UNROLL": 3})


# --- compile tier -----------------------------------------------------------------------------------

@pytest.mark.compile
def test_a_configuration_compiles_as_its_own_extension():
    ext = build.load_extension("kl_div", defines=THREADS_128)
    assert ext.__name__ == build.extension_name("kl_div", THREADS_128)
    assert all(callable(getattr(ext, r.forward)) for r in problems.get("kl_div").rungs)


@pytest.mark.compile
def test_a_value_the_kernel_refuses_fails_with_its_static_assert_in_one_line():
    with pytest.raises(build.BuildError) as err:
        build.load_extension("kl_div", defines=(("LOSSLAB_KL_DIV_VECTORIZED_THREADS", 100),))
    lines = (build.KERNELS / "kl_div" / "vectorized.cu").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "static_assert(THREADS" in text)
    assert "\n" not in str(err.value)
    assert str(err.value).endswith(
        f'kernels/kl_div/vectorized.cu:{line}: static assertion failed with '
        '"LOSSLAB_KL_DIV_VECTORIZED_THREADS: a multiple of 32 from 32 to 1024 (whole warps)"')


EXTREMES = ("problem", "rung", "knob", "value")
UNOPTIMISED = ("-Xcicc", "-O0", "-Xptxas", "-O0")  # NVVM and ptxas at -O0


@pytest.fixture(scope="module")
def extreme_cubins(request, tmp_path_factory):
    """``{(problem, rung, knob, value): future}``: the sm_90 cubin of each extreme the selected tests
    name, compiled on first use one nvcc per CPU (each configuration alone, as one at a time).
    Unoptimised (UNOPTIMISED): what can refuse an offered value (its static_asserts, the templates it
    instantiates, a block's shared memory, which ptxas checks) does not depend on the optimiser
    (these tests on 2 cores: 112 s optimised, 95 s not; hinge_loss vectorized UNROLL=16 alone 9.3 s, 2.2 s)."""
    out = tmp_path_factory.mktemp("extremes")

    def compiled(problem, rung, knob, value):
        config = knobs.config(problem, rung, {knob: value})
        return build.compile_cubin(build.KERNELS / problem / f"{rung}.cu", "sm_90", out / f"{rung}-{knob}-{value}",
                                   (*build.define_flags(problem, config.defines), *UNOPTIMISED))

    wanted = [tuple(item.callspec.params[name] for name in EXTREMES) for item in request.session.items
              if "extreme_cubins" in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")]
    pool = futures.ThreadPoolExecutor(len(os.sched_getaffinity(0)))
    request.addfinalizer(pool.shutdown)
    return {case: pool.submit(compiled, *case) for case in wanted}


@pytest.mark.compile
@pytest.mark.parametrize(", ".join(EXTREMES), [
    (p, v, k.name, value) for p in problems.names() for v in problems.get(p).variants
    for k in knobs.knobs(p, v) for value in {k.allowed[0], k.allowed[-1]} - {k.default}])
def test_every_offered_extreme_compiles(extreme_cubins, problem, rung, knob, value):
    extreme_cubins[problem, rung, knob, value].result()  # raises BuildError with nvcc's message


# --- gpu tier ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("problem, rung, values", [("kl_div", "vectorized", {"THREADS": 128}),
                                                   ("cross_entropy", "fused", {"THREADS": 256, "TILE": 4})])
def test_a_configuration_runs_and_matches_float64(problem, rung, values):
    from losslab.measure.check import TOLERANCES, relative_error

    spec = problems.get(problem)
    fn = ops.variant(problem, rung, knobs=values)
    for size in ("small", "odd"):
        inputs = spec.make_inputs(spec.sizes[size], seed=0, device="cuda")
        loss64, grad64 = spec.reference_float64(*inputs)
        predictions = inputs[0].detach().clone().requires_grad_(True)
        loss = fn(predictions, *inputs[1:])
        (grad,) = torch.autograd.grad(loss, predictions)
        loss_rtol, grad_rtol = TOLERANCES[torch.float32]
        assert relative_error(loss, loss64)[0] <= loss_rtol, (fn.name, size)
        assert relative_error(grad, grad64)[0] <= grad_rtol, (fn.name, size)
