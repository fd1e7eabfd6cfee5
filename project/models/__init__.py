"""Networks: plain `nn.Module`s that know nothing about Lightning.

Each takes `num_classes` (linked from the DataModule by the CLI) and can be named in YAML by its short
class name (`class_path: SimpleCNN`) or its full path (`project.models.SimpleCNN`).

A network built on pretrained weights may also say what its weights expect and which parameters are new:
`input_stats()` (the per-channel mean and std its weights were trained with, which the data then uses unless
the config sets its own) and `head_parameter_names()` (the fresh head, which `model.backbone_lr_scale` leaves at
the full learning rate); `layer_ids()` (each parameter's depth) enables `model.layer_decay`.
"""

from project.models.airbench import AirbenchNet
from project.models.cifar_resnet import CIFARResNet
from project.models.init import init_weights
from project.models.mlp import MLP
from project.models.simple_cnn import SimpleCNN
from project.models.torchvision_net import TorchvisionNet

__all__ = ["AirbenchNet", "CIFARResNet", "MLP", "SimpleCNN", "TorchvisionNet", "init_weights"]
