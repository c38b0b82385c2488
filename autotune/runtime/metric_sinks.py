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


def _reachable(url: str, timeout: float = 3.0) -> str | None:
    """None when a TCP connection to ``url``'s host opens within ``timeout`` s, else why not.
    Name resolution has no timeout of its own, so the whole probe runs in a thread."""
    import socket
    import threading
    from urllib.parse import urlparse

    u = urlparse(url if "://" in url else f"https://{url}")
    host, port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
    result: list = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as e:
            result.append(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 1)
    return result[0] if result else f"no answer from {host}:{port} within {timeout:g} s"


class WandbLogger(NullLogger):
    """W&B never takes a run down: with no key, or when its server cannot be reached within a few
    seconds, it logs offline and says how to upload; if W&B fails anyway, training goes on without it."""

    def __init__(self, project: str, entity: str | None, run_dir: Path, config: dict):
        import wandb

        self.wandb, self.run, self.failed = wandb, None, False
        if os.environ.get("WANDB_MODE", None) == "":  # set but empty: W&B's own settings reject it
            del os.environ["WANDB_MODE"]
        self.offline = os.environ.get("WANDB_MODE") in ("offline", "dryrun") or not os.environ.get("WANDB_API_KEY")
        if not self.offline:
            url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
            why = _reachable(url)
            if why is not None:
                print(f"W&B: {url} cannot be reached ({why}); logging offline instead", flush=True)
                self.offline = True
        kwargs = dict(project=project, entity=entity, dir=str(run_dir), config=config, name=run_dir.name)
        try:
            self.run = wandb.init(mode="offline" if self.offline else "online",
                                  settings=wandb.Settings(init_timeout=30), **kwargs)
        except Exception as e:  # the server answered the probe but not the run; or W&B itself failed
            if not self.offline:
                print(f"W&B: online start failed ({type(e).__name__}: {str(e)[:200]}); logging offline instead",
                      flush=True)
                self.offline = True
                try:
                    self.run = wandb.init(mode="offline", **kwargs)
                except Exception as e2:
                    self._give_up(e2)
            else:
                self._give_up(e)

    def _give_up(self, e: Exception) -> None:
        print(f"W&B: disabled for this run ({type(e).__name__}: {str(e)[:200]}); training goes on", flush=True)
        self.failed, self.run = True, None

    def log(self, metrics: dict, step: int) -> None:
        if self.run is None:
            return
        try:
            self.run.log(metrics, step=step)
        except Exception as e:
            self._give_up(e)

    def close(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
        except Exception as e:
            self._give_up(e)
            return
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

    from autotune.rundir.records import SECRET_NAME

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
        from autotune.rundir.layout import TENSORBOARD

        sinks.append(TensorBoardLogger(run_dir / TENSORBOARD))
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
