"""A Lightning training script, unmodified by fastpipe: ``Trainer.fit`` on a tiny convnet, with a planted slow stage
(``SlowFilter`` sleeps ``--slow-ms`` per sample in the dataset's transforms)."""

import argparse
import time

import lightning.pytorch as L
import torch
import torchvision.datasets as datasets
import torchvision.transforms as T
from planted import SlowFilter

parser = argparse.ArgumentParser()
parser.add_argument("--samples", default=4000, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("-j", "--workers", default=2, type=int)
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--slow-ms", default=30.0, type=float)
parser.add_argument("--step-ms", default=5.0, type=float, help="wait this long in each step, as a loop waits for its GPU")


class Classifier(L.LightningModule):
    def __init__(self, step_ms: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, 10),
        )
        self.step_ms = step_ms

    def training_step(self, batch, batch_idx):
        images, target = batch
        loss = torch.nn.functional.cross_entropy(self.net(images), target)
        if self.step_ms:
            time.sleep(self.step_ms / 1000)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)}


def main() -> None:
    args = parser.parse_args()
    dataset = datasets.FakeData(args.samples, (3, 40, 40), 10, T.Compose([T.RandomResizedCrop(32), SlowFilter(args.slow_ms), T.ToTensor()]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(args.step_ms), train_dataloaders=loader)
    print(f"fit done: {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
