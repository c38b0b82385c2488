"""A training operator's node facts as the planner's decisions: the Kubeflow Trainer's PET_NNODES /
PET_NODE_RANK / PET_MASTER_ADDR / PET_MASTER_PORT, or the v1 operator's WORLD_SIZE / RANK / MASTER_ADDR where
one pod is one node (read into the profile by ``autotune.hardware.pod``). They are the rendezvous
deciders' third source: the user's flags win, then SLURM's allocation, then these, then one node. Each
reason names the variable; an unreadable one refuses the plan unless every node flag is given."""

from __future__ import annotations

from autotune.config import AUTO, DistributedConfig
from autotune.errors import UserError
from autotune.planner.resolve import Decision, Resolver
from autotune.profiles import HardwareProfile, KubernetesInfo


def facts(hw: HardwareProfile, d: DistributedConfig) -> KubernetesInfo | None:
    """The operator's node facts, when there is no SLURM job to read and the profile has them."""
    pod, slurm = hw.kubernetes, hw.slurm
    if pod is None or (slurm is not None and slurm.job_id is not None):
        return None
    if pod.error and AUTO in (d.num_nodes, d.node_rank, d.master_addr):
        raise UserError(f"{pod.error}; or give the node flags (--num_nodes, --node_rank, --master_addr) yourself")
    return pod if pod.num_nodes is not None else None


def _reason(pod: KubernetesInfo, field: str, also: str = "") -> str:
    who = "the training operator's, in a Kubernetes pod" if pod.pod else "torchrun's variable, set for this launch"
    return f"{pod.sources[field]}={getattr(pod, field)}{also} ({who})"


def nodes(hw: HardwareProfile, d: DistributedConfig) -> Decision | None:
    pod = facts(hw, d)
    return Decision(pod.num_nodes, _reason(pod, "num_nodes")) if pod and pod.num_nodes == hw.num_nodes else None


def rendezvous(hw: HardwareProfile, d: DistributedConfig, num_nodes: int) -> tuple[Decision | None, Decision | None]:
    """(node rank, master address) as the operator gives them; the master only for several nodes (static
    rendezvous: torchrun gets --node_rank, --master_addr, --master_port)."""
    pod = facts(hw, d)
    if pod is None:
        return None, None
    port = f", port {pod.sources['master_port']}={pod.master_port}" if pod.master_port else ""
    master = Decision(pod.master_addr, _reason(pod, "master_addr", port)) if pod.master_addr and num_nodes > 1 \
        else None
    return Decision(pod.node_rank, _reason(pod, "node_rank")), master


def port(hw: HardwareProfile, d: DistributedConfig, resolver: Resolver) -> int:
    """distributed.master_port when set (flag or config), else the operator's (said in the master_addr reason),
    else its default 29500."""
    pod = facts(hw, d) if resolver.auto_optimize and "master_port" not in d.model_fields_set else None
    return pod.master_port if pod and pod.master_port else d.master_port


def note(hw: HardwareProfile) -> str:
    """For the plan's hardware line."""
    return ", in a Kubernetes pod" if hw.kubernetes is not None and hw.kubernetes.pod else ""
