"""Several nodes plan as one: the smallest of the nodes' detected profiles (hand-derived from the
presets' vendor figures), and the exchange of profiles through real sockets on localhost (what belongs to one
job, the secret and strangers, is in test_exchange.py)."""

import socket
import threading
import time

import pytest
from helpers.support import free_port

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import Unavailable, UserError
from autotune.launch.exchange import exchange, meet
from autotune.planner import plan
from autotune.planner.nodes import smallest
from autotune.profiles import load_profile

A100_80 = load_profile("4xA100-80GB")
A100_40 = load_profile("8xA100-40GB")
L4 = load_profile("4xL4")
CPU = load_profile("cpu-only")


def _one_node(hw):
    return hw.model_copy(update={"num_nodes": 1})


def test_alike_nodes_plan_as_they_are_and_say_nothing():
    combined, lines = smallest({0: L4, 1: L4, 2: L4}, me=1)
    assert combined is L4 and lines == []
    with pytest.raises(ValueError, match="node 3 is not among"):
        smallest({0: L4, 1: L4}, me=3)


def test_fewer_gpus_and_less_memory_each_come_from_the_node_that_has_them():
    """Node 0: 4x A100-80GB; node 1: 8x A100-40GB. Every node runs 4 ranks (node 0 has only 4 GPUs),
    each planned for 40 GB (node 1's GPUs); cores and RAM are the smaller of the two."""
    a, b = _one_node(A100_80), _one_node(A100_40)
    combined, lines = smallest({0: a, 1: b}, me=0)
    assert combined.gpus.count == 4
    assert {d.memory_total_mib for d in combined.gpus.devices} == {b.gpus.devices[0].memory_total_mib}
    assert combined.gpus.devices[0].memory_total_mib < a.gpus.devices[0].memory_total_mib
    assert combined.cpu.effective_cores == min(a.cpu.effective_cores, b.cpu.effective_cores)
    assert combined.memory.effective_mib == min(a.memory.effective_mib, b.memory.effective_mib)
    assert lines[0].startswith("the nodes differ; every node plans for the smallest (4 GPU(s)")
    assert lines[1].startswith("  node 0: 4 GPU(s) NVIDIA A100") and lines[2].startswith("  node 1: 8 GPU(s)")
    # The plan made from it: 4 processes per node on 2 nodes, the 40 GB band's micro-batch (32; 64 at 80 GB).
    cfg = apply_overrides(TrainConfig(), {"training.global_batch_size": 2048, "distributed.num_nodes": 2,
                                          "distributed.node_rank": 0,
                                          "distributed.master_addr": "10.0.0.1"})
    p = plan(combined, cfg, deepspeed_installed=True)
    four40 = b.model_copy(update={"gpus": b.gpus.model_copy(update={"devices": b.gpus.devices[:4]})})
    as40, as80 = plan(four40, cfg, deepspeed_installed=True), plan(a, cfg, deepspeed_installed=True)
    assert p.engine.nproc_per_node == 4 and p.engine.world_size == 8
    assert p.batch == as40.batch and as40.batch.micro_batch_size < as80.batch.micro_batch_size
    assert p.batch.global_batch_size == as80.batch.global_batch_size  # the effective batch is held


def _gpus(hw, **fields):
    return hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": tuple(
        d.model_copy(update=fields) for d in hw.gpus.devices)})})


def test_nodes_that_differ_only_in_free_gpu_memory_all_plan_for_the_busiest():
    """Two 4x L4 nodes, identical but that node 1's GPUs are busy (5 GiB free of 23): every node plans for the
    smallest free memory. A comparison that ignored free memory would leave node 0 planning the 20 GB band's
    micro-batch (16) where node 1 plans 2 with checkpointing (the < 6 GB band), and the plans-agree check would stop
    the job."""
    a = _one_node(L4)
    b = _gpus(a, memory_free_mib=5 * 1024)
    assert a.model_copy(update={"gpus": b.gpus}) == b  # nothing else differs
    cfg = apply_overrides(TrainConfig(), {"distributed.num_nodes": 2, "distributed.node_rank": 0,
                                          "distributed.master_addr": "10.0.0.1"})
    for me in (0, 1):
        combined, lines = smallest({0: a, 1: b}, me=me)
        assert {d.memory_free_mib for d in combined.gpus.devices} == {5 * 1024}, me
        assert lines and "5.0 GiB free" in lines[0] and "node 0: 4 GPU(s) NVIDIA L4, 22.0 GiB free" in lines[1]
        mine = plan(combined, apply_overrides(cfg, {"distributed.node_rank": me}), deepspeed_installed=True)
        assert mine.batch == plan(b, cfg, deepspeed_installed=True).batch  # the busy node's plan, on both
    alone = plan(a, cfg, deepspeed_installed=True)
    assert alone.batch.micro_batch_size > mine.batch.micro_batch_size  # what ignoring free memory would plan


def test_the_oldest_gpu_sets_the_precision_and_unknown_memory_is_never_taken_as_large():
    """An L4 (8.9, bf16) node with a node whose GPUs report compute capability 7.0 (no bf16): the plan
    is fp16. A node whose free memory is unknown counts with its total (as the planner would plan it
    alone); a node whose memory is entirely unknown makes the combined memory unknown."""
    free = L4.gpus.devices[0].memory_free_mib
    old = _gpus(L4, compute_capability="7.0", memory_free_mib=None, memory_total_mib=free - 1000)
    combined, lines = smallest({0: L4, 1: old}, me=0)
    assert {d.compute_capability for d in combined.gpus.devices} == {"7.0"}
    assert {(d.memory_free_mib, d.memory_total_mib) for d in combined.gpus.devices} == {(free - 1000, free - 1000)}
    assert lines
    p = plan(combined, TrainConfig(), deepspeed_installed=True)
    assert p.numerics.precision == "fp16"
    assert plan(L4, TrainConfig(), deepspeed_installed=True).numerics.precision == "bf16"
    blind = _gpus(L4, memory_free_mib=None, memory_total_mib=None)
    combined, _ = smallest({0: L4, 1: blind}, me=0)
    assert {(d.memory_free_mib, d.memory_total_mib) for d in combined.gpus.devices} == {(None, None)}


def test_a_mig_node_keeps_its_slices():
    """Node 1's GPUs are in MIG mode with 10 GB slices (a process gets one): the combined GPUs are
    those, not node 0's whole 80 GB, and the plan is the slice's plan."""
    mig = _gpus(A100_80, mig_mode=True, mig_slices_mib=(9856, 9856))
    combined, _ = smallest({0: A100_80, 1: mig}, me=0)
    assert {d.mig_slices_mib for d in combined.gpus.devices} == {(9856, 9856)}
    as_slice, whole = (plan(hw, TrainConfig(), deepspeed_installed=True).batch for hw in (mig, A100_80))
    assert plan(combined, TrainConfig(), deepspeed_installed=True).batch == as_slice
    assert as_slice.micro_batch_size < whole.micro_batch_size


def test_infiniband_and_the_interconnect_count_only_when_every_node_has_them():
    ib = L4.model_copy(update={"infiniband": ("mlx5_0",),
                               "gpus": L4.gpus.model_copy(update={"interconnect": "nvlink"})})
    none = L4.model_copy(update={"infiniband": (), "gpus": L4.gpus.model_copy(update={"interconnect": "pcie"})})
    combined, _ = smallest({0: ib, 1: none}, me=0)
    assert combined.infiniband == () and combined.gpus.interconnect == "pcie"
    combined, _ = smallest({0: ib, 1: L4.model_copy(update={"infiniband": None})}, me=0)
    assert combined.infiniband is None


def test_the_busiest_gpu_is_the_template_yet_total_memory_is_the_smallest_total():
    """Node 0: 80 GB GPUs with 10 GiB free (busy); node 1: 40 GB GPUs, all free. Node 0's GPU has the least usable
    memory, so it is the template, but the total memory is node 1's smaller one, not the template's."""
    busy = _gpus(_one_node(A100_80), memory_free_mib=10 * 1024)
    idle = _gpus(_one_node(A100_80), memory_total_mib=40960, memory_free_mib=40960)
    combined, _ = smallest({0: busy, 1: idle}, me=1)
    assert {(d.memory_total_mib, d.memory_free_mib) for d in combined.gpus.devices} == {(40960, 10 * 1024)}


def test_infiniband_on_every_node_is_kept_and_the_node_count_is_the_nodes_own():
    """Every node has InfiniBand: the combined profile keeps it. The node count is the one this node was given
    (node 0 of a 2-node job may be the larger node, and the smallest node's profile says what it detected)."""
    ib = L4.model_copy(update={"infiniband": ("mlx5_0",), "num_nodes": 2})
    small_ib = _gpus(ib, memory_free_mib=1024).model_copy(update={"infiniband": ("mlx5_1",), "num_nodes": 1})
    combined, _ = smallest({0: ib, 1: small_ib}, me=0)
    assert combined.infiniband == ("mlx5_1",)  # the base's (the smallest node's) device names
    assert combined.num_nodes == 2 and combined.hostname == ib.hostname


def test_a_smaller_cpu_node_lowers_cores_and_ram():
    small = CPU.model_copy(update={"cpu": CPU.cpu.model_copy(update={"effective_cores": 1}),
                                   "memory": CPU.memory.model_copy(update={"effective_mib": 2048})})
    combined, lines = smallest({0: CPU, 1: small}, me=0)
    assert (combined.cpu.effective_cores, combined.memory.effective_mib) == (1, 2048)
    assert "1 effective core(s), 2.0 GiB RAM" in lines[0]



def _nodes(profiles, port, timeout_s=20.0):
    """Run ``exchange`` for each node rank in its own thread (one process, real sockets)."""
    out, errors = {}, {}

    def node(r):
        try:
            out[r] = meet(len(profiles), r, "127.0.0.1", port, profiles[r], timeout_s, poll_s=0.02)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors[r] = e

    threads = [threading.Thread(target=node, args=(r,)) for r in sorted(profiles, reverse=True)]  # node 0 last
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out, errors


def test_every_node_receives_every_profile_and_node_0_frees_the_port():
    port = free_port()
    out, errors = _nodes({0: L4, 1: CPU, 2: A100_40}, port)
    assert errors == {}
    assert all(got == {0: L4, 1: CPU, 2: A100_40} for got in out.values()) and sorted(out) == [0, 1, 2]
    with socket.socket() as s:  # torchrun binds the same port next
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", port))


def test_a_lone_node_0_names_the_missing_nodes_and_a_lone_node_1_names_node_0():
    """Each message whole. A node 1 pointed at this machine is told node 0 must run here too; pointed at an address
    that is not a loopback one (0.0.0.0 reaches this machine on Linux, where nothing listens), it is not."""
    port = free_port()
    with pytest.raises(Unavailable) as e:  # exit 69: the same command may succeed later
        meet(3, 0, "127.0.0.1", port, CPU, 1.0, poll_s=0.02)
    assert str(e.value) == (
        f"node(s) 1, 2 of 3 did not join at 127.0.0.1:{port} within 1 s (distributed.rendezvous_timeout_s): start "
        f"the same command on every node (node ranks 0..2), check that 127.0.0.1:{port} is reachable from them, or "
        "raise the budget")
    reach = ("within 1 s (distributed.rendezvous_timeout_s; last: nothing listens there yet): start the same command "
             "on node 0, check that the port is reachable from here, or raise the budget")
    for addr, hint in (("127.0.0.1", "; 127.0.0.1 is this machine, so node 0 must run here too: give node 0's "
                                     "address with --master_addr"), ("0.0.0.0", "")):
        port = free_port()
        with pytest.raises(Unavailable) as e:
            meet(2, 1, addr, port, CPU, 1.0)
        assert str(e.value) == f"node 1 of 2 could not reach node 0 at {addr}:{port} {reach}{hint}"


def test_the_deadline_the_launcher_printed_wins_over_a_fresh_budget():
    """The launcher prints its budget before the meeting starts and passes that deadline on: a lone node 1 given
    0.5 s left of a 30 s budget gives up within about that, not 30 s after it was called."""
    t0 = time.monotonic()
    with pytest.raises(UserError, match="could not reach node 0"):
        meet(2, 1, "127.0.0.1", free_port(), CPU, 30.0, deadline=t0 + 0.5)
    assert time.monotonic() - t0 < 5


def test_waiting_for_node_0s_port_keeps_its_deadline():
    """Nothing listening: a TimeoutError naming the address once the deadline passes (not before, and not
    torch's retry backoff later). Something listening: it returns at once, even with under a second left."""

    from autotune.launch.exchange import _wait_for_port

    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=f"^nothing answered at 127.0.0.1:{port}$"):
        _wait_for_port("127.0.0.1", port, t0 + 0.6)
    assert 0.6 <= time.monotonic() - t0 < 1.5
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        t0 = time.monotonic()
        _wait_for_port("127.0.0.1", listening.getsockname()[1], t0 + 0.8).close()
        assert time.monotonic() - t0 < 0.5


def test_two_nodes_claiming_one_rank_are_refused():
    """Node 0 of 3 joined by two nodes that both say they are node 1 (a copy-pasted --node_rank). Node 2 never
    comes, so node 0 keeps its exchange open for its whole budget and the second twin always reaches it (with 2 nodes
    node 0 finished with the first twin at once, and the second, polling every 0.25 s, sometimes found no exchange)."""
    port = free_port()
    results = []

    def node(rank):
        try:
            meet(3, rank, "127.0.0.1", port, CPU, 6.0, poll_s=0.02)
            results.append("ok")
        except UserError as e:
            results.append(str(e))

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results.count("distributed.node_rank: two nodes of this job both say they are node 1; give each node its "
                         "own rank 0..2") == 1, results


def _node_0_launch_beside(mine, peer, tmp_path, **config):
    """The launcher's step for node 0 detecting ``mine`` (autotune.launch.sequence._with_the_other_nodes) while node 1,
    detecting ``peer``, meets it through the real exchange.
    Returns (node 0's planner, its setup before, after)."""
    import functools

    from autotune.launch.sequence import _with_the_other_nodes
    from autotune.prepare import prepare

    port = free_port()
    over = {"distributed.num_nodes": 2, "distributed.node_rank": 0, "distributed.master_addr": "127.0.0.1",
            "distributed.master_port": port, "distributed.rendezvous_timeout_s": 30, **config}
    planned = functools.partial(prepare, TrainConfig(), over, environ={}, runs_root=tmp_path)
    setup = planned(mine)
    other = threading.Thread(target=lambda: meet(2, 1, "127.0.0.1", port, peer, 30.0, poll_s=0.02))
    other.start()
    after = _with_the_other_nodes(setup, planned)
    other.join(30)
    return planned, setup, after


def test_a_launch_on_a_bigger_node_replans_for_the_smaller_one_and_keeps_its_own_records(tmp_path):
    """The launcher's step (autotune.launch.sequence._with_the_other_nodes) against a real peer: node 0 (8 cores) meets
    node 1 (2 cores) through the exchange; with one thread per rank, the cores left give 3 DataLoader workers on
    node 0 and 1 on node 1 (a training value), so node 0's plan becomes the 2-core plan, says why in its warnings,
    keeps its run dir, and its records keep its own detected hardware."""
    def cores(n):
        return CPU.model_copy(update={"cpu": CPU.cpu.model_copy(update={"effective_cores": n}),
                                      "num_nodes": 1})

    big, small = cores(8), cores(2)
    planned, setup, after = _node_0_launch_beside(big, small, tmp_path, **{"data.omp_num_threads": 1})
    alone_small = planned(small)
    assert setup.plan.loader.num_workers == 3 and alone_small.plan.loader.num_workers == 1
    assert after.plan.loader == alone_small.plan.loader and after.plan.batch == alone_small.plan.batch
    assert after.plan.warnings[-3:] == (
        "the nodes differ; every node plans for the smallest (no GPU, 2 effective core(s), "
        f"{CPU.memory.effective_mib / 1024:.1f} GiB RAM):",
        f"  node 0: no GPU, 8 effective core(s), {CPU.memory.effective_mib / 1024:.1f} GiB RAM",
        f"  node 1: no GPU, 2 effective core(s), {CPU.memory.effective_mib / 1024:.1f} GiB RAM")
    assert after.run_dir == setup.run_dir and after.hardware == big
    assert after.launch_spec.env["OMP_NUM_THREADS"] == "1" == setup.launch_spec.env["OMP_NUM_THREADS"]
    # nodes that differ only in the threads their ranks compute with train alike: node 0 keeps its own 8
    _, own, kept = _node_0_launch_beside(big, small, tmp_path / "threads")
    assert kept.plan == own.plan and kept.launch_spec.env["OMP_NUM_THREADS"] == "8"


def test_a_node_whose_node_0_gives_up_says_so_in_one_line():
    """3 nodes expected, node 2 never comes: node 0 gives up after 3 s naming node 2, and tells node 1, which stops at
    once (not at the end of its own 40 s) with node 0's words in one line. Both exit 69 (Unavailable): node 2 may yet
    come. Both through the launcher's entry (``exchange``)."""
    port = free_port()
    gave_up = []
    host = threading.Thread(target=lambda: gave_up.append(pytest.raises(Unavailable, exchange, 3, 0, "127.0.0.1",
                                                                        port, CPU, 3.0)))
    host.start()
    t0 = time.monotonic()
    with pytest.raises(Unavailable) as e:
        exchange(3, 1, "127.0.0.1", port, CPU, 40.0)
    host.join(40)
    assert time.monotonic() - t0 < 15
    assert str(e.value).startswith(f"node 0 at 127.0.0.1:{port} gave up: node(s) 2 of 3 did not join at "
                                   f"127.0.0.1:{port} within 3 s")
    assert "\n" not in str(e.value)
    assert str(gave_up[0].value).startswith(f"node(s) 2 of 3 did not join at 127.0.0.1:{port} within 3 s")


def test_nodes_that_differ_only_in_what_the_plan_does_not_use_keep_their_plans(tmp_path):
    """Free RAM moves by a few MiB between two probes: node 1's profile differs from node 0's by 3 MiB
    of RAM, which changes nothing the plan uses: node 0 keeps its plan and says nothing."""
    mine = CPU.model_copy(update={"num_nodes": 1})
    less = mine.memory.model_copy(update={"effective_mib": mine.memory.effective_mib - 3})
    jitter = mine.model_copy(update={"memory": less})
    _, setup, after = _node_0_launch_beside(mine, jitter, tmp_path)
    assert after is setup and not any("the nodes differ" in w for w in after.plan.warnings)


def test_a_bigger_node_planned_for_a_smaller_one_stays_itself():
    """Node 1 (8 cores) planned for node 0 (2 cores): its SLURM facts and host name stay its own, so
    its plan is still node 1's (the SLURM node id gives the node rank), at node 0's size."""
    from autotune.profiles import SlurmInfo

    def node(i, cores):
        slurm = SlurmInfo(job_id="77", num_nodes=2, node_id=i, nodelist="n[0-1]", hosts=("n0", "n1"))
        return CPU.model_copy(update={"hostname": f"n{i}", "num_nodes": 2, "slurm": slurm,
                                      "cpu": CPU.cpu.model_copy(update={"effective_cores": cores})})

    combined, lines = smallest({0: node(0, 2), 1: node(1, 8)}, me=1)
    assert lines and combined.cpu.effective_cores == 2
    assert (combined.hostname, combined.slurm.node_id) == ("n1", 1)
    p = plan(combined, TrainConfig(), deepspeed_installed=True)
    assert (p.engine.node_rank, p.engine.num_nodes, p.engine.master_addr) == (1, 2, "n0")
    assert p.loader.omp_num_threads == 2


def _sized(hw, cores, ram_mib):
    return hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"effective_cores": cores}),
                                 "memory": hw.memory.model_copy(update={"effective_mib": ram_mib})})


def test_the_node_with_fewest_gpus_is_lowered_to_every_smaller_figure_of_the_others():
    """Node 0: 4 L4s, 64 cores, 256 GiB, NVLink, InfiniBand; node 1: 8 A100-40GB (compute 8.0), 8 cores, 32 GiB,
    PCIe, no InfiniBand. The base is node 0 (fewer GPUs); its host figures, link and InfiniBand come down to node 1's,
    each with a reason; GPU i keeps the lower compute capability; node 0's description is replaced, its own
    num_nodes kept. The lines say it by hand."""
    a = _sized(L4, 64, 256 * 1024).model_copy(update={
        "num_nodes": 2, "infiniband": ("mlx5_0",), "gpus": L4.gpus.model_copy(update={"interconnect": "nvlink"})})
    b = _sized(A100_40, 8, 32 * 1024).model_copy(update={
        "num_nodes": 2, "infiniband": (), "gpus": A100_40.gpus.model_copy(update={"interconnect": "pcie"})})
    combined, lines = smallest({0: a, 1: b}, me=0)
    assert combined.gpus.count == 4 and combined.num_nodes == 2 and combined.hostname == a.hostname
    assert (combined.cpu.effective_cores, combined.cpu.effective_cores_reason) == (8, "the smallest of 2 nodes: 8")
    assert (combined.memory.effective_mib, combined.memory.effective_reason) == (
        32 * 1024, "the smallest of 2 nodes: 32768 MiB")
    assert (combined.gpus.interconnect, combined.gpus.interconnect_reason) == ("pcie", "the smallest of 2 nodes: pcie")
    assert combined.infiniband == () and combined.description == "the smallest of 2 nodes of this job"
    l4, a100 = L4.gpus.devices[0], A100_40.gpus.devices[0]
    assert {d.compute_capability for d in combined.gpus.devices} == {"8.0"}  # 8.9 and 8.0: the lower
    free = min(l4.memory_free_mib, a100.memory_free_mib)
    assert {(d.memory_total_mib, d.memory_free_mib) for d in combined.gpus.devices} == {
        (min(l4.memory_total_mib, a100.memory_total_mib), free)}
    assert lines == [
        f"the nodes differ; every node plans for the smallest (4 GPU(s) {l4.name}, {free / 1024:.1f} GiB free, "
        "8 effective core(s), 32.0 GiB RAM):",
        f"  node 0: 4 GPU(s) {l4.name}, {l4.memory_free_mib / 1024:.1f} GiB free, 64 effective core(s), 256.0 GiB RAM, "
        "InfiniBand mlx5_0",
        f"  node 1: 8 GPU(s) {a100.name}, {a100.memory_free_mib / 1024:.1f} GiB free, 8 effective core(s), "
        "32.0 GiB RAM"]
    # the same nodes the other way round: the smallest is node 1 now, whatever the ranks' order
    swapped, _ = smallest({0: b, 1: a}, me=0)
    assert (swapped.gpus.count, swapped.cpu.effective_cores, swapped.hostname) == (4, 8, b.hostname)
    assert {d.name for d in swapped.gpus.devices} == {l4.name}
    # the same nodes with node 0's link the weaker one: its own reason stays
    weak = a.model_copy(update={"gpus": a.gpus.model_copy(update={"interconnect": "none"})})
    combined, _ = smallest({0: weak, 1: b}, me=1)
    assert (combined.gpus.interconnect, combined.gpus.interconnect_reason) == ("none", a.gpus.interconnect_reason)


def test_what_a_node_line_says_when_a_figure_is_unknown():
    """No GPU; a GPU without a name or memory; RAM unknown; several InfiniBand devices."""
    from autotune.planner.nodes import node_line

    cpu = _sized(CPU, 4, None)
    assert node_line(cpu) == "no GPU, 4 effective core(s), RAM unknown"
    blind = _gpus(L4, name=None, memory_free_mib=None, memory_total_mib=None)
    ib = _sized(blind, 16, 1536).model_copy(update={"infiniband": ("mlx5_0", "mlx5_1")})
    assert node_line(ib) == "4 GPU(s) ?, memory unknown, 16 effective core(s), 1.5 GiB RAM, InfiniBand mlx5_0/mlx5_1"
    two = L4.model_copy(update={"gpus": L4.gpus.model_copy(update={"devices": (
        L4.gpus.devices[0], L4.gpus.devices[1].model_copy(update={"name": "NVIDIA A10"}))})})
    assert node_line(two).startswith("2 GPU(s) NVIDIA A10/NVIDIA L4, ")


def test_unknown_figures_never_count_as_the_largest():
    """Nodes whose free GPU memory is unknown everywhere keep it unknown (the total's minimum stays); a compute
    capability unknown on one node is unknown for the job; a node whose GPU memory is unknown is the smallest
    (its GPUs are the template), and so is a node whose RAM is unknown among equals."""
    l4 = L4.gpus.devices[0]
    no_free = _gpus(L4, memory_free_mib=None)
    smaller = _gpus(no_free, memory_total_mib=l4.memory_total_mib - 100)
    combined, _ = smallest({0: no_free, 1: smaller}, me=0)
    assert {(d.memory_total_mib, d.memory_free_mib) for d in combined.gpus.devices} == \
        {(l4.memory_total_mib - 100, None)}
    cc = _gpus(L4, compute_capability=None)
    combined, _ = smallest({0: L4, 1: cc}, me=0)
    assert {d.compute_capability for d in combined.gpus.devices} == {None}
    marked = _gpus(L4, name="unknown-memory", memory_free_mib=None, memory_total_mib=None)
    combined, _ = smallest({0: L4, 1: marked}, me=0)
    assert {d.name for d in combined.gpus.devices} == {"unknown-memory"}
    no_ram = _sized(L4, L4.cpu.effective_cores, None)
    no_ram = no_ram.model_copy(update={"memory": no_ram.memory.model_copy(update={"total_mib": 12345})})
    combined, _ = smallest({0: L4, 1: no_ram}, me=0)
    assert combined.memory.effective_mib is None and combined.hostname == L4.hostname
    assert combined.memory.total_mib == 12345  # the base is the node whose RAM is unknown
