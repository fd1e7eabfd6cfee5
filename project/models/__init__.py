"""Networks: plain `nn.Module`s that know nothing about Lightning.

Each takes `num_classes` (linked from the DataModule by the CLI) and can be named in YAML by its short
class name (`class_path: SimpleCNN`) or its full path (`project.models.SimpleCNN`).
"""

from project.models.airbench import AirbenchNet
from project.models.cifar_resnet import CIFARResNet
from project.models.init import init_weights
from project.models.mlp import MLP
from project.models.simple_cnn import SimpleCNN
from project.models.torchvision_net import TorchvisionNet

__all__ = ["AirbenchNet", "CIFARResNet", "MLP", "SimpleCNN", "TorchvisionNet", "init_weights"]
