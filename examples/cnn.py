"""A model that is not a language model: a small CNN classifying synthetic images, in samples/s.

Everything is in this file: the model, its factory and the dataset. From the repository root::

    python -m perfsweep -m -cd examples -cn cnn amp=true,false ckpt=true,false

The config (``cnn.yaml``) sets ``model.unit=samples``: samples/s is the headline, tokens/s is
null, and ``seq_len`` is null (an image has no sequence length; perfsweep refuses a value for
it). The image size is the dataset's own key, ``data.image_size``, and sweeps like any key:
``data.image_size=32,64``. The forward returns logits; ``model.loss=cross_entropy`` takes them
against the labels of the (images, labels) batch. ``ckpt=true`` wraps each :class:`ConvBlock`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


class ConvBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection, then 2x downsampling."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.skip = nn.Conv2d(c_in, c_out, 1, bias=False) if c_in != c_out else nn.Identity()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.pool(torch.relu(y + self.skip(x)))


class SmallCNN(nn.Module):
    """``depth`` ConvBlocks doubling the channels from ``width``, global pooling, a linear head."""

    def __init__(self, n_classes: int, width: int, depth: int, in_channels: int = 3) -> None:
        super().__init__()
        chans = [in_channels] + [width * 2**i for i in range(depth)]
        self.blocks = nn.Sequential(*(ConvBlock(a, b) for a, b in zip(chans, chans[1:], strict=False)))
        self.head = nn.Linear(chans[-1], n_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(images).mean(dim=(2, 3)))


def build(n_classes: int = 10, width: int = 32, depth: int = 3) -> SmallCNN:
    return SmallCNN(n_classes, width, depth)


class SyntheticImages(Dataset):
    """Random images with a learnable label: each class adds its own fixed pattern to the noise.

    Generated once from ``seed`` and held in memory (n_samples x 3 x size x size floats), so a
    step measures the model, not the data."""

    def __init__(self, image_size: int, n_samples: int, n_classes: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        patterns = torch.randn(n_classes, 3, image_size, image_size, generator=g)
        self.labels = torch.randint(0, n_classes, (n_samples,), generator=g)
        self.images = torch.randn(n_samples, 3, image_size, image_size, generator=g) + patterns[self.labels]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


def images(image_size: int = 32, n_samples: int = 2048, n_classes: int = 10, seed: int = 0) -> SyntheticImages:
    """The data factory (``data._target_``); perfsweep passes ``seed`` and batches the dataset."""
    return SyntheticImages(image_size, n_samples, n_classes, seed)
