"""What the notebooks claim of smooth_l1_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""
import math

# measured on the H200 record (reports/results/nvidia-h200.json, the teaching ladder at the seed size)
STEP_CLAIMS = (
    ("vector_flat", "warp_shuffle", "vectorized", "forward", 0.95, 1.05,
     "within 5%: flat, scalar loads already reach the read ceiling"),
    ("vector_pays", "warp_shuffle", "vectorized", "backward", 1.15, math.inf,
     "at least x1.15: scalar loads and stores leave the backward well below the copy ceiling, 16-byte ones reach it"),
)

SATURATES = ("warp_shuffle", "forward", 0.95)  # measured there: above the read ceiling

# no transcendental in the loss: no MUFU roof to claim
MUFU_ROOF = None

PEER_NOTES = {}
