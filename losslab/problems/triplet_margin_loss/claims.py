"""What the notebooks claim of triplet_margin_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""

# measured on the H200 record (reports/results/nvidia-h200.json, the teaching ladder at the seed size)
STEP_CLAIMS = (
    ("vector_flat", "warp_shuffle", "vectorized", "forward", 0.95, 1.05,
     "within 5%: flat, scalar loads already reach the read ceiling"),
    ("vector_flat_backward", "warp_shuffle", "vectorized", "backward", 0.95, 1.05,
     "within 5%: flat, 16-byte loads do not move the backward"),
)

SATURATES = ("warp_shuffle", "forward", 0.95)  # measured there: above the read ceiling

# two square roots a row (the distances), next to 3 x D loads: the MUFU roof is far
MUFU_ROOF = "far"

PEER_NOTES = {}
