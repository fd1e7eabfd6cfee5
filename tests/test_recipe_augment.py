"""The regularisers of long image recipes on the device batches: MixUp/CutMix with soft targets, random erasing,
TrivialAugmentWide for image files, the batched random-resized crop and the larger cached source it crops."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from project.cli import main
from project.data import ImageFolderDataModule
from project.data.augment import (
    BatchAugmentation,
    mix_batch,
    random_erasing,
    random_resized_crop,
    sample_boxes,
)
from project.data.targets import Classes
from project.errors import UserError
from project.models import SimpleCNN
from project.tasks import ImageClassifier
from tests.conftest import CONFIGS
from tests.test_exact_resume import assert_same_weights, folder_args, last_weights, stop_and_resume


def folder_dm(
    root: Path, tmp_path: Path, augment: BatchAugmentation | None = None, **kwargs
) -> ImageFolderDataModule:
    settings = dict(image_size=8, cache_dir=str(tmp_path / "cache"), num_workers=0, batch_size=8)
    augment = augment or BatchAugmentation()
    return ImageFolderDataModule(root=str(root), skip_corrupt=True, augment=augment, **(settings | kwargs))  # pyright: ignore[reportArgumentType]


# -- MixUp / CutMix ----------------------------------------------------------------------------------------------
def classes(n: int) -> Classes:
    return Classes(tuple(map(str, range(n))))


@pytest.mark.parametrize("alphas", [(0.4, 0.0), (0.0, 1.0), (0.4, 1.0)])
def test_mixed_targets_are_probabilities_of_the_two_images_and_repeat_under_the_seed(alphas):
    x, y = torch.rand(16, 3, 8, 8), torch.randint(0, 5, (16,))
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(mix_batch(x, y, classes(5), *alphas))
    (mx, soft), (mx2, soft2) = outs
    assert torch.equal(mx, mx2) and torch.equal(soft, soft2)
    assert soft.shape == (16, 5) and torch.allclose(soft.sum(1), torch.ones(16))
    one_hot = F.one_hot(y, 5).float()
    lam = float(soft[0, y[0]]) if y[0] != y[-1] else None  # image 0 is mixed with image 15
    assert not torch.equal(mx, x)
    if lam is not None:
        assert torch.allclose(soft, lam * one_hot + (1 - lam) * one_hot.flip(0))


def test_cutmix_pastes_a_box_of_the_partner_whose_area_is_its_share():
    x = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 1, 16, 16)
    y = torch.arange(4)
    torch.manual_seed(0)
    mixed, soft = mix_batch(x, y, classes(4), 0.0, 1.0)
    from_partner = (mixed[0] == 3).float().mean()  # image 0's partner is image 3
    assert torch.isclose(soft[0, 3], from_partner) and torch.isclose(soft[0, 0], 1 - from_partner)


def test_no_mixing_when_the_batch_is_not_drawn():
    y = torch.tensor([0, 1])
    x, soft = mix_batch(torch.rand(2, 3, 4, 4), y, classes(2), 0.4, 1.0, p=0.0)
    assert torch.equal(soft, F.one_hot(y, 2).float())


def test_the_loss_takes_soft_targets_and_training_accuracy_the_images_own_labels():
    torch.manual_seed(0)
    model = ImageClassifier(
        SimpleCNN(num_classes=4, width=4), num_classes=4, label_smoothing=0.1, input_shape=None
    )
    x, y = torch.rand(8, 3, 8, 8), torch.randint(0, 4, (8,))
    soft = torch.rand(8, 4).softmax(1)
    loss, outputs = model._shared_step((x, soft, y), model.train_metrics, model.train_loss)
    assert torch.isclose(loss, F.cross_entropy(outputs, soft, label_smoothing=0.1))
    mixed_acc = model.train_metrics.compute()["train/acc"]
    model.train_metrics.reset()
    model._shared_step((x, y), model.train_metrics, model.train_loss)
    assert torch.equal(mixed_acc, model.train_metrics.compute()["train/acc"])


def test_only_training_batches_are_mixed_and_erased(image_folder, tmp_path):
    augment = BatchAugmentation(mixup_alpha=0.4, cutmix_alpha=1.0, random_erasing=1.0)
    dm = folder_dm(image_folder, tmp_path, augment)
    dm.setup("fit")
    x, y = torch.randint(0, 256, (8, 3, 8, 8), dtype=torch.uint8), torch.arange(8) % 3
    plain = folder_dm(image_folder, tmp_path)
    plain.setup("fit")
    ev, ey = dm.transform_batch((x, y), train=False)
    assert torch.equal(ev, plain.transform_batch((x, y), train=False)[0]) and torch.equal(ey, y)
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(dm.transform_batch((x, y), train=True))
    (tx, soft, hard), (tx2, soft2, _) = runs
    assert torch.equal(tx, tx2) and torch.equal(soft, soft2) and torch.equal(hard, y)
    assert soft.shape == (8, 3)


def test_bad_settings_name_the_key(image_folder, tmp_path):
    with pytest.raises(UserError, match="data.augment.mix_prob"):
        BatchAugmentation(mix_prob=1.5)
    with pytest.raises(UserError, match="data.augment.crop_scale"):
        BatchAugmentation(crop_scale=(0.5, 0.2))
    with pytest.raises(UserError, match="data.cache_size"):
        folder_dm(image_folder, tmp_path, cache_size=4)


# -- random erasing ----------------------------------------------------------------------------------------------
def test_random_erasing_zeroes_one_box_per_image_under_the_seed():
    x = torch.ones(64, 3, 16, 16)
    torch.manual_seed(0)
    out = random_erasing(x, 0.5)
    torch.manual_seed(0)
    assert torch.equal(out, random_erasing(x, 0.5))
    zeroed = (out[:, 0] == 0).float().mean((1, 2))
    erased = zeroed > 0
    assert 16 < erased.sum() < 48  # about half the images
    assert ((zeroed[erased] >= 0.01) & (zeroed[erased] <= 0.4)).all()  # 2-33 % of the image, after rounding
    assert torch.equal(out[:, 0] == 0, out[:, 2] == 0)  # every channel of the box


# -- the batched random-resized crop -----------------------------------------------------------------------------
def test_crop_boxes_lie_inside_the_image_with_scale_and_ratio_in_range():
    torch.manual_seed(0)
    h, w, scale, ratio = 24, 40, (0.25, 0.8), (0.5, 2.0)
    boxes, found = sample_boxes(4000, h, w, scale, ratio)
    assert found.float().mean() > 0.99
    boxes = boxes[found]
    x0, y0, x1, y1 = boxes.unbind(1)
    assert (x0 >= 0).all() and (y0 >= 0).all() and (x1 <= w + 1e-4).all() and (y1 <= h + 1e-4).all()
    bw, bh = x1 - x0, y1 - y0
    area = bw * bh / (h * w)
    assert (area >= scale[0] - 1e-5).all() and (area <= scale[1] + 1e-5).all()
    assert ((bw / bh) >= ratio[0] - 1e-4).all() and ((bw / bh) <= ratio[1] + 1e-4).all()
    assert area.min() < 0.3 and area.max() > 0.75  # the whole range is used
    log_r = (bw / bh).log()
    assert log_r.min() < math.log(0.6) and log_r.max() > math.log(1.7)
    torch.manual_seed(0)
    assert torch.equal(sample_boxes(4000, h, w, scale, ratio)[0][found], boxes)


def test_random_resized_crop_gives_the_input_size_and_repeats_under_the_seed():
    x = torch.randint(0, 256, (6, 3, 20, 20), dtype=torch.uint8)
    torch.manual_seed(1)
    out = random_resized_crop(x, (8, 8), (0.1, 1.0), (3 / 4, 4 / 3))
    torch.manual_seed(1)
    assert out.shape == (6, 3, 8, 8) and torch.equal(
        out, random_resized_crop(x, (8, 8), (0.1, 1.0), (3 / 4, 4 / 3))
    )
    assert out.min() >= 0 and out.max() <= 255


def test_a_whole_image_box_is_the_area_average_of_its_pixels():
    x = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    out = random_resized_crop(x, (8, 8), (1.0, 1.0), (1.0, 1.0))
    assert torch.allclose(out, F.avg_pool2d(x.float(), 2), atol=1e-3)


# -- a larger cached source, TrivialAugment per image ------------------------------------------------------------
@pytest.mark.parametrize("cache", [True, False])
def test_a_larger_source_is_cropped_for_training_and_resized_for_evaluation(image_folder, tmp_path, cache):
    dm = folder_dm(
        image_folder,
        tmp_path,
        BatchAugmentation(crop_scale=(0.3, 1.0), trivial_augment=True),
        cache=cache,
        cache_size=12,
    )
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))[:2]
    assert x.shape[-2:] == (12, 12) and dm.input_shape == (3, 8, 8)
    assert dm.transform_batch((x, y), train=True)[0].shape[-2:] == (8, 8)
    vx, vy = next(iter(dm.val_dataloader()))
    ev, _ = dm.transform_batch((vx, vy), train=False)
    assert ev.shape[-2:] == (8, 8)
    train, val = dm.train_set, dm.val_set
    augment = [getattr(ds, "sample_transform" if cache else "transform") for ds in (train, val)]
    assert augment[0] is not None and augment[1] is None  # TrivialAugment on training images only
    if cache:
        stored = {np.load(f, mmap_mode="r").shape[1:] for f in (tmp_path / "cache").rglob("*.npy")}
        assert stored == {(3, 12, 12)}  # N x 3 x cache_size^2 bytes


def test_trivial_augment_of_cached_images_repeats_under_the_seed(image_folder, tmp_path):
    dm = folder_dm(image_folder, tmp_path, BatchAugmentation(trivial_augment=True))
    dm.setup("fit")
    batches = [next(iter(dm.train_dataloader()))[0] for _ in range(2)]
    assert torch.equal(*batches)
    dm.augment = BatchAugmentation()
    dm.train_set = None
    dm.setup("fit")
    assert not torch.equal(batches[0], next(iter(dm.train_dataloader()))[0])  # the same images, augmented


@pytest.mark.slow
def test_a_larger_cached_source_with_every_part_trains_through_the_cli(image_folder, tmp_path):
    recipe = ["--data.cache_size", "24", "--data.augment.crop_scale", "[0.25, 1.0]", "--data.augment.mixup_alpha", "0.2",
              "--data.augment.cutmix_alpha", "1.0", "--data.augment.random_erasing", "0.25", "--data.augment.trivial_augment", "true",
              "--model.label_smoothing", "0.1", "--trainer.fast_dev_run", "true"]  # fmt: skip
    main([*folder_args(image_folder, tmp_path, stop=-1), *recipe])


@pytest.mark.slow
def test_a_mixed_run_stopped_mid_epoch_resumes_bit_identical(image_folder, tmp_path):
    recipe = ["--data.augment.mixup_alpha", "0.2", "--data.augment.cutmix_alpha", "1.0", "--data.augment.random_erasing", "0.5",
              "--data.cache_size", "20", "--data.augment.crop_scale", "[0.25, 1.0]", "--trainer.max_epochs", "2"]  # fmt: skip
    stop_and_resume([*folder_args(image_folder, tmp_path / "stopped"), *recipe])
    main([*folder_args(image_folder, tmp_path / "whole", stop=-1), *recipe])
    assert_same_weights(last_weights(tmp_path / "stopped"), last_weights(tmp_path / "whole"))


def test_the_photos_preset_trains(image_folder, tmp_path):
    photos = [
        "--config",
        str(CONFIGS / "folder.yaml"),
        "--config",
        str(CONFIGS / "experiment" / "photos.yaml"),
    ]
    small = ["--data.image_size", "16", "--model.net", "project.models.SimpleCNN",
             "--model.net.init_args.width", "4", "--data.num_workers", "0"]  # fmt: skip
    args = folder_args(image_folder, tmp_path, stop=-1)  # fit --config cifar10.yaml, then the settings
    main([args[0], *photos, *args[3:], *small, "--trainer.fast_dev_run", "true"])


def test_evaluation_keeps_the_central_share_of_each_side_before_resizing():
    from project.data.augment import resize

    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    whole = BatchAugmentation().images(x, None, train=False, epoch=0, size=(4, 4), seed=0)
    center = BatchAugmentation(eval_crop=0.5).images(x, None, train=False, epoch=0, size=(4, 4), seed=0)
    assert torch.equal(whole, resize(x, (4, 4)))
    assert torch.equal(center, x[..., 2:6, 2:6])  # the central half of each side, already at the input size
    with pytest.raises(UserError, match=r"data.augment.eval_crop=0.0 is out of range"):
        BatchAugmentation(eval_crop=0.0)
