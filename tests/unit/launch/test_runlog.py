"""The launch's own log (logs/stdout.log, logs/stderr.log) in this process: what the launcher prints and what
its child prints reach both the real streams and the files, each launch under one header line. The real
launches in tests/multiprocess read these files after whole runs; here each part is pinned."""

import re
import subprocess
import sys

from autotune.launch.runlog import RunLog

CHILD = "import sys; print('child out'); print('child err', file=sys.stderr)"


def launch(records, argv, capfd):
    saved = sys.stdout, sys.stderr
    with RunLog(records, argv) as log:
        assert (sys.stdout, sys.stderr) != saved
        print("from the launcher")
        print("a launcher warning", file=sys.stderr)
        out, err = log.child_fds()
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=out, stderr=err)
        log.started()
        assert child.wait(timeout=60) == 0
        log.ended()
    assert (sys.stdout, sys.stderr) == saved  # the streams are the caller's again
    return capfd.readouterr()


def test_the_launcher_and_its_child_reach_the_terminal_and_the_files_under_one_header(tmp_path, capfd):
    real = launch(tmp_path, ["/x/autotune/__main__.py", "launch", "--config", "my config.yaml"], capfd)
    assert real.out == "from the launcher\nchild out\n" and real.err == "a launcher warning\nchild err\n"
    header = r"==== \d{4}-\d\d-\d\d \d\d:\d\d:\d\d autotune launch --config 'my config.yaml'\n"
    assert re.fullmatch(header + "from the launcher\nchild out\n", (tmp_path / "logs" / "stdout.log").read_text())
    assert re.fullmatch(header + "a launcher warning\nchild err\n", (tmp_path / "logs" / "stderr.log").read_text())


def test_a_second_launch_appends_under_its_own_header(tmp_path, capfd):
    launch(tmp_path, ["autotune", "launch"], capfd)
    launch(tmp_path, ["autotune", "launch", "--resume_from", "auto"], capfd)
    text = (tmp_path / "logs" / "stdout.log").read_text()
    headers = [ln for ln in text.splitlines() if ln.startswith("==== ")]
    assert [h.split(" ", 3)[3] for h in headers] == ["autotune launch", "autotune launch --resume_from auto"]
    assert text.count("child out\n") == 2


def test_bytes_that_are_not_text_are_kept_as_replacements_not_an_error(tmp_path, capfd):
    with RunLog(tmp_path, ["autotune", "launch", "caf\udce9"]) as log:
        out, err = log.child_fds()
        child = subprocess.Popen([sys.executable, "-c", "import os; os.write(1, b'\\xff' * 70000 + b'\\n')"],
                                 stdout=out, stderr=err)
        log.started()
        child.wait(timeout=60)
        log.ended()
    data = (tmp_path / "logs" / "stdout.log").read_bytes()
    assert data.split(b"\n")[0].endswith(b"autotune launch 'caf?'")
    assert data.split(b"\n", 1)[1] == b"\xff" * 70000 + b"\n"  # more than one read of the pipe, byte for byte
