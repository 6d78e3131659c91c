"""The linear cross-entropy (a language model's head and its loss, without the (N, V) logits in memory):
``linear_cross_entropy``, ``LinearCrossEntropyLoss`` and ``Options`` (see :mod:`.functional`)."""
from losslab.linear_cross_entropy.functional import LinearCrossEntropyLoss, linear_cross_entropy
from losslab.linear_cross_entropy.options import Options

__all__ = ["LinearCrossEntropyLoss", "Options", "linear_cross_entropy"]
