"""What one option needs at one micro-batch, per GPU and on the host (``Sizer``).

Model states, activations, buffers, the set-up's peak and what the caching allocator takes above the estimate.
"""

from __future__ import annotations

from autotune.planner import memory
from autotune.planner.deciders import Inputs
from autotune.planner.headroom import allocator_bytes
from autotune.planner.memory import Strategy
from autotune.planner.model_facts import ModelFacts
from autotune.planner.weighing import Need

GIB = memory.GIB


class Sizer:
    """Needs of one option at one micro-batch, from the model facts and the plan so far."""

    def __init__(self, inputs: Inputs, facts: ModelFacts, *, world: int, nproc: int, num_nodes: int, half: bool,
                 bucket_elements: int, on_gpu: bool):
        self.inputs = inputs
        self.facts = facts
        self.world = world
        self.nproc = nproc
        self.num_nodes = num_nodes
        self.half = half
        self.bucket_elements = bucket_elements
        self.on_gpu = on_gpu
        # the built-in workload builds its model on the meta device under FSDP2 (runtime.fsdp), and so does a script
        # read doing it (ModelFacts.builds_on_meta): no whole-model peak
        self.builds_on_meta = (facts.builtin_gpt and inputs.cfg.training.entrypoint is None) or \
            facts.builds_on_meta is not None

    def need(self, s: Strategy, micro: int, ckpt: bool) -> Need:
        f, policy = self.facts, self.inputs.policy
        if f.num_parameters is None:
            return Need(None, None, 0.0, 0.0)
        st = memory.model_state_bytes(s, f.num_parameters, self.world, largest_layer=f.largest_layer_parameters,
                                      half=self.half, optimizer=self.inputs.cfg.training.optimizer,
                                      ranks_per_node=self.nproc, num_nodes=self.num_nodes)
        acts = f.activations.bytes(micro, self.half, ckpt, s.backend == "deepspeed", s.backend == "fsdp") \
            if f.activations else None
        # ZeRO-1/2's fp32 gradient partition is made at the optimizer step, when the activations are gone
        states = st.gpu_bytes + max(0.0, st.step_bytes - (acts or 0.0))
        overhead = memory.bucket_bytes(s, self.bucket_elements, self.half) if self.on_gpu else 0.0
        # FSDP2's gathered units and reduce-scatter buffers (on the CPU too: they are the same tensors in RAM)
        overhead += memory.fsdp_buffer_bytes(s, f.num_parameters, f.fsdp_unit_parameters, f.fsdp_root_parameters,
                                             self.half)
        init, init_host = memory.fsdp_init_bytes(s, f.num_parameters, self.world, on_meta=self.builds_on_meta,
                                                 ranks_per_node=self.nproc)
        host = max(st.host_bytes_per_node, init_host) * policy.offload_host_ram_margin
        allocated = states + (acts or 0.0) + overhead
        extra = allocator_bytes(f, policy, allocated, half=self.half, checkpointing=ckpt, micro=micro,
                                activations=acts or 0.0) \
            if self.on_gpu else 0.0
        return Need(states / GIB, None if acts is None else acts / GIB, overhead / GIB, host / GIB,
                    init_gib=init / GIB, allocator_gib=extra / GIB)
