"""What the notebooks claim of smooth_l1_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""
import math

# kl_div's ladder steps, which this ladder repeats (predictions for its first record to confirm)
STEP_CLAIMS = (
    ("vector_flat", "warp_shuffle", "vectorized", "forward", 0.95, 1.05, "within 5%: flat"),
    ("vector_pays", "warp_shuffle", "vectorized", "backward", 1.15, math.inf,
     "at least x1.15: one element per thread in flight before, one pack after"),
)

SATURATES = ("warp_shuffle", "forward", 0.95)  # the base class's: not yet measured for this loss

PEER_NOTES = {}
