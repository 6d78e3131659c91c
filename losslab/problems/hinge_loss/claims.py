"""What the notebooks claim of hinge_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""

SATURATES = ("vectorized", "forward", 0.9)

STEP_CLAIMS = ()

PEER_NOTES = {}
