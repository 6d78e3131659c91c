"""What the notebooks claim of cross_entropy's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""
import math

SATURATES = ("warp_shuffle", "backward", 0.90)

STEP_CLAIMS = (
    ("vector_flat", "warp_shuffle", "vectorized", "backward", 0.95, 1.05, "within 5%: flat"),
    ("vector_pays", "warp_shuffle", "vectorized", "forward", 1.05, math.inf,
     "at least x1.05: 16-byte loads, twice the bytes in flight a thread"),
)

# the special-function (MUFU) roof is near vectorized's forward: an exponential per logit
MUFU_ROOF = "near"

PEER_NOTES = {
    ("liger", "backward"): (
        "Liger's cross-entropy writes the gradient in its forward, into the logits' own buffer (Liger-Kernel "
        "issue #272); its backward only checks that the upstream gradient is 1 (`torch.equal`: one small "
        "kernel, then the host waits for the GPU) and returns that buffer. The timed interval holds that "
        "round trip, not a backward's bytes, so the row is no backward to compare with: compare "
        "forward_backward."),
}
