import torch

from project.data import CIFARDataModule
from project.data.augment import (
    BatchAugmentation,
    alternating_flip,
    cutout,
    normalize,
    random_crop,
    random_flip,
)


def coordinate_images(n: int, size: int = 8) -> torch.Tensor:
    """Images whose pixel (r, c) holds the value 1 + r * size + c: a crop's offset can be read back."""
    grid = 1 + torch.arange(size * size).reshape(size, size)
    return grid.expand(n, 1, size, size).clone()


def test_random_crop_covers_every_offset_and_keeps_shape():
    torch.manual_seed(0)
    pad, size = 2, 8
    x = coordinate_images(2000, size)
    out = random_crop(x, pad)
    assert out.shape == x.shape
    offsets = set()
    for img in out[:, 0]:
        # The source pixel (0, 0) lands at (pad - dy, pad - dx) in the crop (or falls off it): recover dy, dx
        # from the top-left pixel that still holds image content.
        rows, cols = torch.nonzero(img, as_tuple=True)
        r0, c0 = rows.min().item(), cols.min().item()
        value = img[r0, c0].item() - 1
        src_r, src_c = divmod(value, size)
        offsets.add((src_r - r0 + pad, src_c - c0 + pad))
    assert offsets == {(dy, dx) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)}


def test_random_crop_is_a_shifted_window_with_zero_fill():
    torch.manual_seed(1)
    x = coordinate_images(64)
    out = random_crop(x, 3)
    padded = torch.nn.functional.pad(x, (3, 3, 3, 3))
    for i in range(len(x)):
        windows = [padded[i, :, dy : dy + 8, dx : dx + 8] for dy in range(7) for dx in range(7)]
        assert any(torch.equal(out[i], w) for w in windows)


def test_reflect_padding_crops_a_window_of_the_mirrored_border():
    torch.manual_seed(2)
    x = coordinate_images(64)
    out = random_crop(x, 2, padding_mode="reflect")
    padded = torch.nn.functional.pad(x.float(), (2, 2, 2, 2), mode="reflect").long()
    for i in range(len(x)):
        windows = [padded[i, :, dy : dy + 8, dx : dx + 8] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(out[i], w) for w in windows)
    assert (out > 0).all()  # mirrored content, never the zero fill


def test_alternating_flip_shows_every_image_both_ways_every_two_epochs():
    x = coordinate_images(1000)
    rows = torch.arange(1000) * 7  # any rows of a dataset
    flipped = []
    for epoch in range(4):
        out = alternating_flip(x, rows, epoch)
        is_flipped = torch.tensor([torch.equal(o, xi.flip(-1)) for o, xi in zip(out, x, strict=True)])
        assert all(torch.equal(o, xi) for o, xi, f in zip(out, x, is_flipped, strict=True) if not f)
        flipped.append(is_flipped)
    assert torch.equal(flipped[0], ~flipped[1]) and torch.equal(flipped[0], flipped[2])
    assert torch.equal(flipped[1], flipped[3])
    assert 400 < flipped[0].sum() < 600  # the starting side is an even split over the images
    # The side follows the image, not its place in the batch.
    perm = torch.randperm(1000)
    assert torch.equal(alternating_flip(x[perm], rows[perm], 1), alternating_flip(x, rows, 1)[perm])


def test_random_flip_both_states_independently():
    torch.manual_seed(0)
    x = coordinate_images(1000)
    out = random_flip(x)
    flipped = torch.tensor([torch.equal(o, xi.flip(-1)) for o, xi in zip(out, x, strict=True)])
    unchanged = torch.tensor([torch.equal(o, xi) for o, xi in zip(out, x, strict=True)])
    assert torch.all(flipped ^ unchanged)
    assert 400 < flipped.sum() < 600


def test_cutout_zeroes_one_square_per_image():
    torch.manual_seed(0)
    x = torch.ones(500, 3, 16, 16)
    out = cutout(x, 4)
    zeros = (out == 0).all(dim=1).sum(dim=(1, 2))
    assert torch.all(zeros >= 1) and torch.all(zeros <= 25)  # a 5x5 square at most, clipped at the border
    assert torch.equal(cutout(x, 0), x)


def test_normalize_matches_torchvision():
    from torchvision.transforms import v2

    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    expected = v2.Normalize(mean, std)(x.float() / 255)
    assert torch.allclose(normalize(x, torch.tensor(mean), torch.tensor(std)), expected, atol=1e-6)


def test_eval_batches_are_not_augmented():
    dm = CIFARDataModule(val_size=100, augment=BatchAugmentation(cutout=8))
    x = torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8)
    y = torch.arange(32)
    ev1, _ = dm.transform_batch((x, y), train=False)
    ev2, _ = dm.transform_batch((x, y), train=False)
    assert torch.equal(ev1, ev2)
    assert torch.allclose(ev1, normalize(x, torch.tensor(dm.mean), torch.tensor(dm.std)))
    tr, ty = dm.transform_batch((x, y), train=True)
    assert tr.shape == ev1.shape and torch.equal(ty, y)
    assert not torch.equal(tr, ev1)
