"""Issue 52: torchrun's own tracebacks (a signal, a peer that never came, ChildFailedError at teardown) were printed
above autotune's named line. The terminal now gets one line naming the exception and the run log (which keeps every
byte); a rank's or a user's script's traceback is still shown whole."""

from autotune.launch.torch_noise import AgentTracebacks

SITE = "/venv/lib/python3.11/site-packages/torch/distributed"
AGENT_STACK = f"""Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "{SITE}/run.py", line 1032, in <module>
    main()
  File "{SITE}/launcher/api.py", line 374, in launch_agent
    result = agent.run()
             ^^^^^^^^^^^
"""
SIGNAL = AGENT_STACK + ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 22514 got signal: "
                        "15\n")
STORE = AGENT_STACK + ("torch.distributed.DistStoreError: Timed out after 21 seconds waiting for clients. 1/2 "
                       "clients joined.\n")
CHILD_FAILED = AGENT_STACK + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + """\
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 123)
============================================================
"""
RANK = """Traceback (most recent call last):
  File "/home/u/train.py", line 3, in <module>
    import torch.distributed as dist; dist.init_process_group("gloo")
torch.distributed.DistStoreError: Timed out after 30 seconds waiting for clients.
"""


def _through(text, chunk=7):
    f = AgentTracebacks("/runs/r/logs/stderr.log")
    data = text.encode()
    shown = b"".join(f.feed(data[i:i + chunk]) for i in range(0, len(data), chunk)) + f.flush()
    return shown.decode(), f


def test_torchruns_own_tracebacks_become_one_line_naming_the_log():
    for text, said in ((SIGNAL, "SignalException: Process 22514 got signal: 15"),
                       (STORE, "DistStoreError: Timed out after 21 seconds waiting for clients. 1/2 clients joined."),
                       (CHILD_FAILED, "ChildFailedError")):
        shown, f = _through("W1206 Received 15 death signal, shutting down workers\n" + text + "\nInterrupted\n")
        assert shown == ("W1206 Received 15 death signal, shutting down workers\n"
                         f"autotune: torchrun's own traceback ({said}) is kept in /runs/r/logs/stderr.log\n"
                         "Interrupted\n"), shown
        assert "Traceback" not in shown and f.hidden == [said]


def test_a_ranks_traceback_and_other_lines_are_shown_as_they_come():
    shown, f = _through(RANK + "step 1/3 | loss 2.3\n")
    assert shown == RANK + "step 1/3 | loss 2.3\n" and f.hidden == []
    # another process's line written into the middle of torchrun's traceback is shown at once
    interleaved = AGENT_STACK + "[rank1] saving\n" + SIGNAL.splitlines(keepends=True)[-1]
    shown, _ = _through(interleaved)
    assert shown.startswith("[rank1] saving\nautotune: torchrun's own traceback (SignalException") and \
        "Traceback" not in shown
    # a progress bar's line without its end is shown at once, not held for its newline
    f = AgentTracebacks("log")
    assert f.feed(b"\r 40%|####") == b"\r 40%|####"
