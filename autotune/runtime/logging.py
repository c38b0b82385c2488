"""Rank-0 metric sinks: TensorBoard, W&B, console/progress. Other ranks get a null logger."""

from __future__ import annotations

import os
import sys
from pathlib import Path


class NullLogger:
    def log(self, metrics: dict, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardLogger(NullLogger):
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger(NullLogger):
    def __init__(self, project: str, entity: str | None, run_dir: Path, config: dict):
        import wandb

        self.offline = os.environ.get("WANDB_MODE") == "offline" or not os.environ.get("WANDB_API_KEY")
        self.wandb = wandb
        self.run = wandb.init(project=project, entity=entity, dir=str(run_dir), config=config,
                              mode="offline" if self.offline else "online", name=run_dir.name)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()
        if self.offline:
            print(f"W&B ran offline; upload later with: wandb sync {self.run.dir.rsplit('/files', 1)[0]}")


class MultiLogger(NullLogger):
    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, metrics: dict, step: int) -> None:
        for s in self.sinks:
            s.log(metrics, step)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def _safe_config(plan) -> dict:
    """The plan as W&B's run config, with any secret-looking key redacted."""
    import json

    from autotune.launch import SECRET_NAME

    def clean(d):
        if isinstance(d, dict):
            return {k: ("<redacted>" if SECRET_NAME.search(str(k)) else clean(v)) for k, v in d.items()}
        return d

    return clean(json.loads(plan.model_dump_json(exclude={"reasons"})))


def make_logger(plan, ctx, run_dir: str | Path):
    if not ctx.is_main:
        return NullLogger()
    run_dir = Path(run_dir)
    run = plan.run
    sinks = []
    if run.tensorboard:
        sinks.append(TensorBoardLogger(run_dir / "tensorboard"))
    if run.wandb:
        sinks.append(WandbLogger(run.wandb_project or "autotune", run.wandb_entity, run_dir, _safe_config(plan)))
    return MultiLogger(sinks)


class Progress:
    """tqdm on a terminal; plain periodic lines otherwise (logs, CI). Rank 0 only."""

    def __init__(self, total: int, initial: int, enabled: bool, mode: str | bool = "auto"):
        self.enabled = enabled
        use_bar = sys.stdout.isatty() if mode in ("auto", None) else bool(mode)
        self.bar = None
        if enabled and use_bar:
            from tqdm import tqdm

            # A terminal that reports a 0x0 size (some pseudo-terminals) would make tqdm draw nothing.
            try:
                cols = os.get_terminal_size(sys.stderr.fileno()).columns
            except (OSError, ValueError):
                cols = 0
            width = {"dynamic_ncols": True} if cols > 0 else {"ncols": 100, "nrows": 40}
            self.bar = tqdm(total=total, initial=initial, unit="step", **width)

    def update(self, n: int, postfix: dict) -> None:
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(postfix, refresh=False)

    def write(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
