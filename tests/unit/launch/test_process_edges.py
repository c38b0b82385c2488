"""Edges of ``execute``: exit codes, the working directory, its own session, forwarded signals."""

from autotune.exports.launch_spec import LaunchSpec


# -- execute: exit codes, working directory, its own session, forwarded signals ------------------------------
def test_execute_exit_codes_cwd_and_session(tmp_path):
    import os
    import sys

    from autotune.launch.process import execute

    def spec(code, cwd=None):
        return LaunchSpec(cmd=[sys.executable, "-c", code], env={"X_MARK": "1"}, cwd=cwd)

    assert execute(spec("import sys; sys.exit(0)")) == 0
    assert execute(spec("import sys; sys.exit(1)")) == 1
    out = tmp_path / "out"
    code = (f"import os; open({str(out)!r}, 'w').write(f'{{os.getcwd()}} {{os.getsid(0)}} {{os.environ[\"X_MARK\"]}} "
            f"{{os.environ.get(\"X_OUTER\")}}')")
    assert execute(spec(code, cwd=str(tmp_path)), environ={"X_OUTER": "o", "PATH": os.environ["PATH"]}) == 0
    cwd, sid, mark, outer = out.read_text().split()
    assert cwd == str(tmp_path) and int(sid) != os.getsid(0) and mark == "1" and outer == "o"
    # the fds it is told to keep (the run directory's lock) reach the child; others are closed there
    r, w = os.pipe()
    try:
        assert execute(spec(f"import os; os.write({w}, b'held')"), keep_fds=(w,)) == 0
        assert os.read(r, 4) == b"held"
        assert execute(spec(f"import os; os.write({w}, b'held')")) == 1  # not kept: closed in the child
    finally:
        os.close(r)
        os.close(w)
