"""What the notebooks claim of cosine_similarity_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""

SATURATES = ("vectorized", "forward", 0.90)

STEP_CLAIMS = ()

PEER_NOTES = {}
