"""One rank of the FSDP2 mesh checks (tests/unit/runtime/test_fsdp_mesh.py): the built-in GPT built on the meta device
and sharded by autotune's FSDPEngine over gloo, first over every rank (a 1-D mesh), then as HSDP (2 replicas x 2
shards); what each rank saw is written to ``<out>/rank<N>.json``.

    python -m helpers.fsdp_ranks RANK WORLD STORE OUT
"""

import json
import sys
from pathlib import Path


def _batch(rank: int, k: int):
    import torch

    x = torch.randint(0, 10, (4, 15), generator=torch.Generator().manual_seed(100 * rank + k))
    return x, x


def _full(engine) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(engine.module, options=StateDictOptions(full_state_dict=True))


def checks(rank: int, world: int) -> dict:
    import torch
    from torch.distributed.tensor import DTensor

    from autotune.config import TrainConfig, apply_overrides
    from autotune.planner import plan
    from autotune.profiles import load_profile
    from autotune.runtime.dist import DistContext
    from autotune.runtime.engine import make_engine
    from autotune.runtime.workload import build_model

    cfg = apply_overrides(TrainConfig(), {"training.max_steps": 10, "distributed.backend": "fsdp",
                                          "distributed.nproc_per_node": world, "model.n_embd": 32})
    p = plan(load_profile("cpu-only"), cfg)
    # the blocks resharded after forward (FSDP2 as ZeRO-3 runs it), so that the root's own rule shows
    p = p.model_copy(update={"engine": p.engine.model_copy(update={"reshard_after_forward": True})})
    ctx = DistContext(rank, rank, world, torch.device("cpu"), True)
    out: dict = {}

    # -- one shard group of every rank, the model built on the meta device
    torch.manual_seed(0)
    meta = build_model(p.workload, on_meta=True)
    out["built_on_meta"] = all(q.is_meta for q in meta.parameters())
    one = make_engine(p, meta, ctx)
    fc = one.model.blocks[0].fc.weight
    out["one_mesh"] = [list(one.mesh.shape), list(one.mesh.mesh_dim_names)]
    out["shard_rows"] = [fc.to_local().shape[0], fc.shape[0]]
    torch.manual_seed(0)
    whole = build_model(p.workload).state_dict()  # the same seed, built whole as DDP builds it
    made = _full(one)
    out["init_as_whole"] = made.keys() == whole.keys() and all(torch.equal(made[k], whole[k]) for k in whole)

    # -- the root between forward and backward: its weights stay gathered, the blocks' are resharded
    one.set_accumulation(2)
    x, y = _batch(rank, 0)
    loss = one._loss(x, y)
    out["root_gathered_after_forward"] = not isinstance(one.model.tok.weight, DTensor)
    out["unit_resharded_after_forward"] = isinstance(one.model.blocks[0].fc.weight, DTensor)
    one.opt.backward(loss)
    one.forward_backward(_batch(rank, 1), boundary=True)
    one.step()

    # -- HSDP: 2 replicas x 2 shards, the all-reduce across replicas at the last micro-step only
    hp = p.model_copy(update={"engine": p.engine.model_copy(update={"dp_replicate": 2})})
    torch.manual_seed(0)
    hsdp = make_engine(hp, build_model(p.workload, on_meta=True), ctx)
    w = hsdp.model.blocks[0].fc.weight
    out["hsdp_mesh"] = [list(hsdp.mesh.shape), list(hsdp.mesh.mesh_dim_names)]
    out["hsdp_placements"] = [type(q).__name__ for q in w.placements]
    out["hsdp_shard_rows"] = [w.to_local().shape[0], w.shape[0]]
    group = hsdp.model.blocks[0]._get_fsdp_state()._fsdp_param_group
    hsdp.set_accumulation(2)
    hsdp.forward_backward(_batch(rank, 0), boundary=False)
    out["hsdp_all_reduce"] = [group.all_reduce_grads]
    hsdp.forward_backward(_batch(rank, 1), boundary=True)
    out["hsdp_all_reduce"].append(group.all_reduce_grads)
    hsdp.step()
    a, b = _full(one), _full(hsdp)
    out["hsdp_step_as_fsdp"] = max(float((a[k] - b[k]).abs().max()) for k in a)
    out["moved"] = max(float((a[k] - whole[k]).abs().max()) for k in a)
    return out


def main(rank: int, world: int, store: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = checks(rank, world)
    finally:
        dist.destroy_process_group()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
