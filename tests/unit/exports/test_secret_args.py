"""Secrets given as script arguments (issue 34, from an attacker's review): the names that say a secret, plural and
long forms included, and a flag and value in one argument, are redacted; an Accelerate export never prints or writes
the value; a Kubernetes manifest refuses to carry one."""

import pytest

from autotune.rundir.records import redact_args


def test_the_names_that_say_a_secret_are_redacted_and_lengths_are_not():
    argv = ["--authorization", "X6", "--api_keys", "X7", "--passphrase", "X8", "--password  X9", "--db-pwd=X10",
            "--session_cookie", "X11", "--lr", "0.1", "--max_tokens", "512", "--num_passes", "3", "--tokenizer", "gpt2",
            "--bypass_cache", "1"]
    assert redact_args(argv) == [
        "--authorization", "<redacted>", "--api_keys", "<redacted>", "--passphrase", "<redacted>",
        "--password <redacted>", "--db-pwd=<redacted>", "--session_cookie", "<redacted>", "--lr", "0.1",
        "--max_tokens", "512", "--num_passes", "3", "--tokenizer", "gpt2", "--bypass_cache", "1"]


def test_an_accelerate_export_never_prints_or_writes_a_secret_argument(tmp_path, capsys):
    from autotune.__main__ import main

    out = tmp_path / "accelerate.yaml"
    assert main(["export", "--format", "accelerate", "--ddp", "--nproc_per_node", "2", "--no_probe", "-o", str(out),
                 "--", "--hf_token", "S4cret", "--batch_size", "{micro_batch_size}"]) == 0
    printed = capsys.readouterr()
    assert "S4cret" not in printed.out + printed.err + out.read_text()
    assert "--hf_token '<redacted>' --batch_size" in printed.out + printed.err


def test_a_torchrun_export_prints_its_line_redacted(capsys):
    from autotune.__main__ import main

    assert main(["export", "--format", "torchrun", "--no_probe", "--script", "train.py", "--", "--hf_token", "S4cret",
                 "--lr", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "S4cret" not in out and out.splitlines() == [
        "torchrun --nproc_per_node=1 --standalone train.py --hf_token '<redacted>' --lr 0.1",
        "# <redacted>: your secret values, never written here"]


@pytest.mark.parametrize("fmt", ["kubeflow", "pytorchjob", "slurm"])
def test_a_kubernetes_manifest_or_a_batch_script_refuses_a_secret_argument_and_names_its_flag(tmp_path, capsys, fmt):
    from autotune.__main__ import main

    out = tmp_path / "job.yaml"
    image = ["--image", "reg/img:1"] if fmt != "slurm" else []
    assert main(["export", "--format", fmt, *image, "-o", str(out), "--", "--hf_token", "S4cret",
                 "--api-key=S5cret", "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    where = "the batch script" if fmt == "slurm" else "the manifest"
    assert f"export --format {fmt}: script arguments carry a secret (--hf_token, --api-key), which {where}" in err
    assert "S4cret" not in err and "S5cret" not in err and not out.exists()
