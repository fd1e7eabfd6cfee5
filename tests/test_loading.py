import os
import pickle

import pytest
import torch

from project.errors import UserError
from project.models import MLP, SimpleCNN
from project.run.checkpoints import load_checkpoint, load_weights
from project.tasks import ImageClassifier


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_crafted_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": RunsCode()}, bad)
    with pytest.raises(UserError, match="refusing to load .*evil.ckpt.*arbitrary code"):
        load_checkpoint(bad)
    assert not (tmp_path / "pwned").exists()


def test_missing_and_non_checkpoints_are_named(tmp_path):
    with pytest.raises(UserError, match="nope.ckpt does not exist"):
        load_checkpoint(tmp_path / "nope.ckpt")
    (tmp_path / "notes.ckpt").write_text("hello")
    with pytest.raises(UserError, match="notes.ckpt is not"):
        load_checkpoint(tmp_path / "notes.ckpt")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "plain.pt")
    with pytest.raises(UserError, match="no 'state_dict'"):
        load_checkpoint(tmp_path / "plain.pt")
    (tmp_path / "pickle.ckpt").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(UserError, match="pickle.ckpt"):
        load_checkpoint(tmp_path / "pickle.ckpt")


def test_mismatched_network_lists_keys_and_shapes(tmp_path):
    trained = ImageClassifier(SimpleCNN(num_classes=10), num_classes=10)
    torch.save({"state_dict": trained.state_dict()}, tmp_path / "m.ckpt")
    state = load_checkpoint(tmp_path / "m.ckpt")["state_dict"]
    other_classes = ImageClassifier(SimpleCNN(num_classes=5), num_classes=5)
    with pytest.raises(
        UserError, match=r"net.classifier.4.weight: \(10, 256\) in the checkpoint, \(5, 256\) in the network"
    ):
        load_weights(other_classes, state)
    other_net = ImageClassifier(MLP(num_classes=10), num_classes=10)
    with pytest.raises(UserError, match="missing from the checkpoint: net.layers.1.weight.*unexpected key"):
        load_weights(other_net, state)
    same = ImageClassifier(SimpleCNN(num_classes=10), num_classes=10)
    load_weights(same, state)
    assert torch.equal(same.net.classifier[4].weight, trained.net.classifier[4].weight)
