"""Losses over several GPUs on torch.distributed (NCCL; gloo on CPU), launched with torchrun.

``vocab_parallel_cross_entropy``: cross-entropy of logits split by vocabulary over the ranks,
one all-gather in the forward and none in the backward; ``vocab_parallel_linear_cross_entropy``: the
same for an output layer split by vocabulary, its logits never whole. ``peers``: the Megatron-style and
``loss_parallel()`` versions it is timed against (``python -m losslab.distributed.bench``).
"""
from losslab.distributed.partition import VocabPartition, partition_of
from losslab.distributed.peers import loss_parallel_forward_backward, megatron_style_cross_entropy
from losslab.distributed.vocab_parallel import vocab_parallel_cross_entropy
from losslab.distributed.vocab_parallel_linear import vocab_parallel_linear_cross_entropy

__all__ = ["VocabPartition", "loss_parallel_forward_backward", "megatron_style_cross_entropy", "partition_of",
           "vocab_parallel_cross_entropy", "vocab_parallel_linear_cross_entropy"]
