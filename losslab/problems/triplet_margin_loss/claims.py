"""What the notebooks claim of triplet_margin_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""

SATURATES = ("warp_shuffle", "forward", 0.95)  # the base class's: not yet measured for this loss

STEP_CLAIMS = ()

PEER_NOTES = {}
