"""What the notebooks claim of hinge_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""
import math

# measured on the H200 and H100 records (reports/results/, the teaching ladder at the seed size): the forward's
# step is smaller on the H100, whose scalar loads come closer to its read ceiling
STEP_CLAIMS = (
    ("vector_pays", "warp_shuffle", "vectorized", "forward", 1.04, math.inf,
     "at least x1.04: scalar loads stop short of the read ceiling, 16-byte ones reach it"),
    ("vector_pays_backward", "warp_shuffle", "vectorized", "backward", 1.05, math.inf,
     "at least x1.05: the same in the backward, against the copy ceiling"),
)

SATURATES = ("warp_shuffle", "forward", 0.90)  # measured there: scalar loads within 10% of the read ceiling

# no transcendental in the loss: no MUFU roof to claim
MUFU_ROOF = None

PEER_NOTES = {}
