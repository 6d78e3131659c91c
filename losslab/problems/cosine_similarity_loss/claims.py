"""What the notebooks claim of cosine_similarity_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""

# no record holds this loss yet: no step claimed; SATURATES and MUFU_ROOF for its first record to confirm
SATURATES = ("vectorized", "forward", 0.90)

STEP_CLAIMS = ()

MUFU_ROOF = None  # two square roots a row, as triplet_margin_loss: far, once measured

PEER_NOTES = {}
