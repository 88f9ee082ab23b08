"""The data module beside ``patch_split_main.py``: the dataset is built by a function the script imports."""

from torchvision import datasets, transforms


def build_dataset(root, crop):
    normalize = transforms.Normalize(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
    dataset = datasets.ImageFolder(
        root, transform=transforms.Compose([transforms.RandomResizedCrop(crop), transforms.ToTensor(), normalize])
    )
    return dataset
