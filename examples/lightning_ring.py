"""Recipe: ringexp's ring all-reduce under PyTorch Lightning (pip install 'ringexp[lightning]').

    torchrun --standalone --nproc-per-node 2 examples/lightning_ring.py --algorithm ring

Lightning's own way, DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...), registers the hook only when the root
device is CUDA: on CPU the hook is silently never called. So the strategy below registers it itself, right after
Lightning has wrapped the model in DDP, on any device; the hook's process group is made at the first bucket, so
the state can be built before Lightning starts the process group. Without --algorithm: Lightning's plain DDP.
"""

import argparse

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ringexp


class RingexpDDPStrategy(DDPStrategy):
    """DDPStrategy whose gradients are reduced by a ringexp hook (any device)."""

    def __init__(self, algorithm: str = "ring", compression=None, **kwargs):
        super().__init__(**kwargs)
        self.comm_state, self.comm_hook = ringexp.ddp_comm_hook(algorithm, compression=compression)

    def configure_ddp(self) -> None:
        super().configure_ddp()  # self.model is DistributedDataParallel from here on
        self.model.register_comm_hook(self.comm_state, self.comm_hook)

    def teardown(self) -> None:
        self.comm_state.close()  # the hook's thread and process group
        super().teardown()


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                                 nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 10))

    def training_step(self, batch, _index):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algorithm", default=None, help="ring, hierarchical, naive (default: Lightning's DDP)")
    ap.add_argument("--compression", default=None)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    pl.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 3, 16, 16, generator=g), torch.randint(0, 10, (512,), generator=g))
    strategy = RingexpDDPStrategy(args.algorithm, args.compression) if args.algorithm else DDPStrategy()
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_steps=args.steps,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    model = Classifier()
    trainer.fit(model, DataLoader(data, batch_size=16))
    if args.algorithm:
        print(f"rank {trainer.global_rank}: the hook reduced {strategy.comm_state.buckets} buckets", flush=True)
    if args.out and trainer.global_rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)


if __name__ == "__main__":
    main()
