"""A Hugging Face Trainer script, unmodified by fastpipe: a tiny ViT built from its config (nothing downloaded)
trained on images whose transforms hold a planted slow stage (``SlowFilter`` sleeps ``--slow-ms`` per sample)."""

import argparse
import tempfile

import torchvision.datasets as datasets
import torchvision.transforms as T
from planted import SlowFilter
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

parser = argparse.ArgumentParser()
parser.add_argument("--samples", default=4000, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("-j", "--workers", default=2, type=int)
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--slow-ms", default=30.0, type=float)
parser.add_argument("--output-dir", default=None)


class Images(datasets.FakeData):
    """FakeData as the Trainer wants its samples: a dict of pixel_values and labels."""

    def __getitem__(self, index: int) -> dict:
        image, label = super().__getitem__(index)
        return {"pixel_values": image, "labels": int(label)}


def main() -> None:
    args = parser.parse_args()
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=10,
    )
    model = ViTForImageClassification(config)
    dataset = Images(args.samples, (3, 40, 40), 10, T.Compose([T.RandomResizedCrop(32), SlowFilter(args.slow_ms), T.ToTensor()]))
    training = TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="hf-train-"),
        per_device_train_batch_size=args.batch_size,
        dataloader_num_workers=args.workers,
        num_train_epochs=args.epochs,
        learning_rate=1e-3,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=100,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training, train_dataset=dataset)
    trainer.train()
    print(f"train done: {trainer.state.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
