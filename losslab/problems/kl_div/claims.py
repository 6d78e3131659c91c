"""What the notebooks claim of kl_div's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""
import math

STEP_CLAIMS = (
    ("vector_flat", "warp_shuffle", "vectorized", "forward", 0.95, 1.05, "within 5%: flat"),
    ("vector_pays", "warp_shuffle", "vectorized", "backward", 1.15, math.inf,
     "at least x1.15: one element per thread in flight before, one pack after"),
)

SATURATES = ("warp_shuffle", "forward", 0.95)  # the base class's: not yet measured for this loss

# the special-function (MUFU) roof is near vectorized's forward: a logarithm per element (xlogy)
MUFU_ROOF = "near"

PEER_NOTES = {}
