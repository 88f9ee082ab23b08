"""The preset module beside ``patch_tv_train.py``, as torchvision's ``references/classification/presets.py`` writes it:
a class that assembles its transform list with ``append``/``extend`` and calls the Compose it holds."""

import torch
from torchvision.transforms import transforms


class ClassificationPresetTrain:
    def __init__(self, *, crop_size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), hflip_prob=0.5):
        trans = [transforms.RandomResizedCrop(crop_size, antialias=True)]
        if hflip_prob > 0:
            trans.append(transforms.RandomHorizontalFlip(hflip_prob))
        trans.extend(
            [
                transforms.PILToTensor(),
                transforms.ConvertImageDtype(torch.float),
                transforms.Normalize(mean=mean, std=std),
            ]
        )
        self.transforms = transforms.Compose(trans)

    def __call__(self, img):
        return self.transforms(img)


class ClassificationPresetEval:
    def __init__(self, *, crop_size, resize_size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
        self.transforms = transforms.Compose(
            [
                transforms.Resize(resize_size, antialias=True),
                transforms.CenterCrop(crop_size),
                transforms.PILToTensor(),
                transforms.ConvertImageDtype(torch.float),
                transforms.Normalize(mean=mean, std=std),
            ]
        )

    def __call__(self, img):
        return self.transforms(img)
