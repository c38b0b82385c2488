"""torchrun's own rendezvous giving up (autotune.launch.rendezvous): the agent's error file, as torch's elastic
``record`` writes it around torchrun's ``main`` (ErrorHandler.record_exception's shape; the message is a real
torchrun's here: a 2-node static rendezvous whose node 1 met node 0 in autotune's exchange and never reached
torchrun's store), is a named line and
exit 69 (Unavailable) instead of torchrun's traceback and 1; a rank's error copied there, a rank that reported, an
interrupted run or a one-node run are not."""

import json

from autotune.config import TrainConfig, apply_overrides
from autotune.launch.rendezvous import agent_error, rendezvous_failure
from autotune.planner import plan
from autotune.profiles import load_profile

AGENT_STACK = ('Traceback (most recent call last):\n  File ".../torch/distributed/elastic/multiprocessing/errors/'
               '__init__.py", line 367, in wrapper\n    return f(*args, **kwargs)\n  File ".../torch/distributed/'
               'launcher/api.py", line 374, in launch_agent\n    result = agent.run()\n  File ".../torch/distributed/'
               'elastic/rendezvous/static_tcp_rendezvous.py", line 67, in next_rendezvous\n    self._store = TCPStore('
               '\ntorch.distributed.DistStoreError: Timed out after 21 seconds waiting for clients. 1/2 clients '
               'joined.\n')
RANK_STACK = ('Traceback (most recent call last):\n  File "train.py", line 9, in main\n    dist.init_process_group('
              '"gloo")\ntorch.distributed.DistStoreError: Timed out waiting for clients\n')


def _file(tmp_path, message, stack):
    f = tmp_path / "torchrun-error.json"
    f.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": stack,
                                                                          "timestamp": "1764342000"}}}))
    return f


def _engine(**over):
    cfg = apply_overrides(TrainConfig(), {"distributed.nproc_per_node": 1, **over})
    return plan(load_profile("cpu-only"), cfg).engine


def test_torchruns_rendezvous_giving_up_is_named_and_retryable(tmp_path):
    two = _engine(**{"distributed.num_nodes": 2, "distributed.master_port": 29611})
    err = agent_error(_file(tmp_path, "DistStoreError: Timed out after 21 seconds waiting for clients. 1/2 clients "
                                      "joined.", AGENT_STACK))
    assert err == ("DistStoreError", "Timed out after 21 seconds waiting for clients. 1/2 clients joined.")
    line = rendezvous_failure(two, err, rc=1, ranks_code=None, interrupted=False)
    assert line.startswith("torchrun's rendezvous at 127.0.0.1:29611 gave up before any rank started (DistStoreError: "
                           "Timed out after 21 seconds waiting for clients. 1/2 clients joined.). The 2 node(s) had "
                           "met in autotune's exchange")
    assert "ss -tn 'sport = :29611'" in line and "exit 69" in line
    # not torchrun's rendezvous: a rank's own error copied into the file, another error, a rank that reported, a
    # signal, a run that ended well, one node
    assert agent_error(_file(tmp_path, "DistStoreError: Timed out waiting for clients", RANK_STACK)) is None
    assert rendezvous_failure(two, ("ChildFailedError", "x"), 1, None, False) is None
    assert rendezvous_failure(two, err, 1, 2, False) is None
    assert rendezvous_failure(two, err, 1, None, True) is None
    assert rendezvous_failure(two, err, 0, None, False) is None
    assert rendezvous_failure(_engine(), err, 1, None, False) is None
    for damaged in ("", "{", json.dumps({"message": "a new format"}), json.dumps([1])):
        (tmp_path / "torchrun-error.json").write_text(damaged)
        assert agent_error(tmp_path / "torchrun-error.json") is None
    assert agent_error(tmp_path / "missing.json") is None
