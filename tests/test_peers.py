"""The peers: names checked; the optional ones (Liger-Kernel, quack) left out with the reason they cannot
run here; quack's cross-entropy called as a user calls it (mean over the targets that are not ignored)."""
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from losslab import problems
from losslab.measure import peers

KL_DIV, CROSS_ENTROPY = problems.get("kl_div"), problems.get("cross_entropy")


@pytest.fixture
def no_gpu(monkeypatch):
    """As on a machine without a GPU, so that only the import decides (cpu tier, wherever it runs)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_quack(monkeypatch):
    """A quack module whose cross_entropy computes per-row float32 losses (as its kernel writes them) and
    reduces them as quack.cross_entropy does: mean = sum over the count of targets not ignore_index."""
    def cross_entropy(x, target, lse_partial=None, weight=None, ignore_index=-100, reduction="mean",
                      inplace_backward=False):
        loss = F.cross_entropy(x.float(), target, ignore_index=ignore_index, reduction="none")
        if reduction == "mean":
            return loss.sum() / (target != ignore_index).sum().float()
        return loss.sum() if reduction == "sum" else loss

    monkeypatch.setitem(sys.modules, "quack", types.SimpleNamespace(cross_entropy=cross_entropy))


def test_check_peer_names_accepts_every_peer_and_names_the_unknown():
    assert peers.check_peer_names(["eager", "quack"]) == ("eager", "quack")
    assert peers.check_peer_names("liger") == ("liger",) and "quack" in peers.PEERS
    with pytest.raises(ValueError, match="peers: unknown peer 'numpy'; expected some of eager, compile, liger, quack"):
        peers.check_peer_names(["numpy"])


def test_quack_not_importable_is_left_out_with_its_reason(monkeypatch, no_gpu):
    monkeypatch.setitem(sys.modules, "quack", None)  # `from quack import ...` raises ImportError
    assert peers.quack_peer(CROSS_ENTROPY) == (None, peers.QUACK_NOT_INSTALLED)
    assert peers.missing_peers(CROSS_ENTROPY, ("eager", "quack")) == {"quack": peers.QUACK_NOT_INSTALLED}
    assert list(peers.peer_implementations(CROSS_ENTROPY, ("eager", "quack"))) == ["eager"]


def test_quack_has_no_kl_div_and_needs_sm_90(monkeypatch, fake_quack):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert peers.missing_peers(KL_DIV, ["quack"]) == {"quack": "quack-kernels has no kl_div (of the losses here "
                                                                  "it has cross_entropy only)"}
    fn, why = peers.quack_peer(CROSS_ENTROPY)
    assert fn is None and "needs sm_90+" in why and "sm_80" in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert peers.missing_peers(CROSS_ENTROPY, ["quack"]) == {}


def test_the_quack_peer_is_the_mean_over_the_targets_not_ignored(no_gpu, fake_quack):
    fn = peers.peer_implementations(CROSS_ENTROPY, ("quack",))["quack"]
    x = torch.randn(6, 10, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([1, -100, 3, 9, -100, 0])
    loss = fn(x, t)
    expected = F.cross_entropy(x.detach(), t)  # mean over the 4 rows not ignored
    assert loss.shape == () and loss.item() == pytest.approx(expected.item(), rel=1e-6)
    (grad,) = torch.autograd.grad(loss, x)  # differentiable, for the forward+backward rows
    assert grad[1].abs().sum() == 0 and grad[0].abs().sum() > 0
