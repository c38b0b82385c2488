"""Issue 44 item 1, the attack list through the real CLI (in-process, `python -m autotune` as typed): secrets in
script arguments, by flag name in every syntax and by value under innocent names, never reach a written file or a
printed line: the TrainJob, PyTorchJob and sbatch exports refuse them by name, the Accelerate and torchrun exports
and `launch --dry-run` (text and --json) show them <redacted>, and a real launch keeps them out of command.json,
plan.json (the config's script_args), the run log, the lock and every other file of the run, and out of what it
prints, while the script receives every argument as given. Ordinary values pass through unchanged."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from autotune.__main__ import main

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhdHRhY2sifQ.c2lnbmF0dXJlLW9mLXRoZS1qd3Q"
RANDOM = "q8ZrT2vLx9WmB4nKc7YpD3sHf6JgN1aQe5RtU0iO"
# (arguments, the secret value they carry): every flag syntax, the names, token shapes, URL credentials
ATTACK = [
    (["-p", "S3CR3T-p"], "S3CR3T-p"),
    (["--hf", "S3CR3T-hf"], "S3CR3T-hf"),
    (["--bearer", "S3CR3T-bearer"], "S3CR3T-bearer"),
    (["--jwt", JWT], JWT),
    (["--sas_url", "https://acct.blob.core.windows.net/c?sv=2022&sig=S3CR3T-sas"], "S3CR3T-sas"),
    (["--passwordfile", "S3CR3T-pwfile"], "S3CR3T-pwfile"),
    (["--token:", "S3CR3T-colon"], "S3CR3T-colon"),
    (["--token: S3CR3T-colon-one"], "S3CR3T-colon-one"),
    (["--api_key=S3CR3T-eq"], "S3CR3T-eq"),
    (["--hub_token S3CR3T-space"], "S3CR3T-space"),
    (["db.password=S3CR3T-hydra"], "S3CR3T-hydra"),
    (["+db.password=S3CR3T-plus"], "S3CR3T-plus"),
    (["++db.password=S3CR3T-plusplus"], "S3CR3T-plusplus"),
    (["--verbose", "-p", "S3CR3T-after-switch"], "S3CR3T-after-switch"),
    (["--data", "https://alice:S3CR3T-url@example.com/d"], "S3CR3T-url"),
    (["+remote.url=s3://bob:S3CR3T-url2@minio:9000/b"], "S3CR3T-url2"),
    (["--model_src", "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"], "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"),
    (["--repo=ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"], "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    (["--gl", "glpat-xYz12AbC34dEf56GhI78"], "glpat-xYz12AbC34dEf56GhI78"),
    (["--llm", "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv"], "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv"),
    (["--aws", "AKIAIOSFODNN7EXAMPLE"], "AKIAIOSFODNN7EXAMPLE"),
    (["--slack", "xoxb-123456789012-S3CR3Tslack"], "S3CR3Tslack"),
    (["--blob", RANDOM], RANDOM),
    (["--header", "Authorization: Bearer S3CR3T-bearer-header-0123"], "S3CR3T-bearer-header-0123"),
    (['--cfg={{"api_key": "S3CR3T-json"}}'], "S3CR3T-json"),  # braces doubled: {name} is a placeholder
    # the attacker review of issue 44's fix: mysql's attached -pPASSWORD, a URL password holding / # ?, --pw,
    # --creds, a login's user:password, every value of a plural flag, and a value in the argument after "--token="
    (["--password", "S3CR3T-before-attached", "-pS3CR3T-attached"], "S3CR3T-attached"),
    (["--db", "mongodb://admin:S3CR3T/mongo@db:27017"], "S3CR3T/mongo"),
    (["postgresql://u:S3CR3T#pg?x@h/db"], "S3CR3T#pg"),
    (["--pw", "S3CR3T-pw"], "S3CR3T-pw"),
    (["--creds", "S3CR3T-creds"], "S3CR3T-creds"),
    (["--login", "alice:S3CR3T-login"], "S3CR3T-login"),
    (["--api_keys", "S3CR3T-k1", "S3CR3T-k2"], "S3CR3T-k2"),
    (["--token=", "S3CR3T-next"], "S3CR3T-next"),
    # issue 52 item 2: secrets by what they mean, decoded before they are judged
    (["+db={{user:alice,password:S3CR3T-hydra-dict}}"], "S3CR3T-hydra-dict"),  # the script gets +db={user:...}
    (["'+db.password=S3CR3T-quoted'"], "S3CR3T-quoted"),
    (["--src", "https%3A%2F%2Falice%3AS3CR3T-pct%40example.com%2Fd"], "S3CR3T-pct"),
    (["--src2", "https%253A%252F%252Falice%253AS3CR3T-pct-twice%2540example.com"], "S3CR3T-pct-twice"),
    (["--next", "https://sso.example.com/?to=https%3A%2F%2Fbob%3AS3CR3T-inner%40db%2Fx"], "S3CR3T-inner"),
    (["--redis", "alice:S3CR3T-redis@redis:6379"], "S3CR3T-redis"),
    (["--remote", "alice:S3CR3T-remote@host"], "S3CR3T-remote"),
    (["--token2", "S3CR3T-token2"], "S3CR3T-token2"),
    (["--api_key2", "S3CR3T-api-key2"], "S3CR3T-api-key2"),
    (["--api-key-b", "S3CR3T-api-key-b"], "S3CR3T-api-key-b"),
    (["-ualice:S3CR3T-curl"], "S3CR3T-curl"),
    (["Bearer", "S3CR3T-bearer-two-args"], "S3CR3T-bearer-two-args"),
    (["--private_key_pem", "S3CR3T-not-pem"], "S3CR3T-not-pem"),
]
HIDDEN = len(ATTACK) + 2  # arguments shown <redacted>: one an entry, and --password's and --api_keys' second
ORDINARY = ["--lr", "0.1", "--seed=1234", "gpt2", "--model", "meta-llama/Llama-3-8B", "--output_dir",
            "runs/exp1/out", "--run_id", "20261125-103000-9f8e7d6c", "--commit",
            "5ae54a1b3c9e0f2d4a6b8c0e1f3a5b7c9d1e3f5a", "--max_tokens", "512", "--pad_token", "<pad>",
            "trainer.max_epochs=3",
            # names the rule once took for secrets' (exports refused them): a column, a sort key, counts, a switch
            "--key_column", "text", "--sort_key", "loss", "--num_keys", "4", "--max_auth", "3", "--use_auth_token",
            "True", "--sig", "0.5"]
ARGS = [a for args, _ in ATTACK for a in args]
SECRETS = [s for _, s in ATTACK]
NAMES = ["-p", "--hf", "--bearer", "--jwt", "--sas_url", "--passwordfile", "--token:", "--token", "--api_key",
         "--hub_token", "db.password", "+db.password", "++db.password", "-p", "--data (URL credentials)",
         "+remote.url (URL credentials)", "--model_src (a token by its prefix)", "--repo (a token by its prefix)",
         "--gl (a token by its prefix)", "--llm (a token by its prefix)", "--aws (a token by its prefix)",
         "--slack (a token by its prefix)", "--blob (a long random string)", "--header (a bearer token)",
         "--cfg (api_key=... inside it)", "--password", "-p", "--db (URL credentials)",
         f"argument {ARGS.index('postgresql://u:S3CR3T#pg?x@h/db') + 1} (URL credentials)", "--pw", "--creds",
         "--login (a user:password)", "--api_keys", "--token",
         "+db (password=... inside it)", "+db.password", "--src (URL credentials)", "--src2 (URL credentials)",
         "--next (URL credentials)", "--redis (URL credentials)", "--remote (URL credentials)", "--token2",
         "--api_key2", "--api-key-b", "-u (a user:password)",
         f"argument {ARGS.index('S3CR3T-bearer-two-args') + 1} (a bearer token)", "--private_key_pem"]


def _run(capfd, *argv) -> tuple[int, str]:
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    out = capfd.readouterr()
    return rc, out.out + out.err


def _no_secret_in(text: str, where: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked and "S3CR3T" not in text, (where, leaked)


def _files_under(folder) -> dict:
    return {str(f): f.read_bytes().decode(errors="replace") for f in folder.rglob("*") if f.is_file()}


@pytest.mark.parametrize("fmt", ["kubeflow", "pytorchjob", "slurm"])
def test_a_manifest_or_batch_script_refuses_every_secret_by_name_and_says_where_secrets_belong(tmp_path, capfd, fmt):
    out = tmp_path / "job.out"
    image = ["--image", "reg.example.com/t:1"] if fmt != "slurm" else []
    rc, text = _run(capfd, "export", "--format", fmt, "--hardware", "2x4xL4", *image, "-o", str(out), "--", *ARGS,
                    *ORDINARY)
    assert rc == 2 and not out.exists()
    _no_secret_in(text, fmt)
    assert f"script arguments carry a secret ({', '.join(NAMES)})" in text  # each one named, nothing else
    assert "Kubernetes Secret or an environment variable" in text and "--job_secret_file" in text
    rc, text = _run(capfd, "export", "--format", fmt, "--hardware", "2x4xL4", *image, "-o", str(out), "--", *ORDINARY)
    assert rc == 0 and all(a in out.read_text() for a in ORDINARY[:6])  # ordinary arguments are kept as given


def test_printed_lines_and_written_exports_show_every_secret_redacted(tmp_path, capfd):
    """The torchrun and Accelerate exports, `launch --dry-run` and its --json: no secret, every ordinary value."""
    acc = tmp_path / "accelerate.yaml"
    shown = {}
    for name, argv in {
        "torchrun": ["export", "--format", "torchrun", "--hardware", "4xL4", "--script", "train.py"],
        "accelerate": ["export", "--format", "accelerate", "--hardware", "4xL4", "-o", str(acc)],
        "dry-run": ["launch", "--dry-run", "--hardware", "4xL4", "--run_dir", str(tmp_path / "r")],
        "dry-run --json": ["launch", "--dry-run", "--json", "--hardware", "4xL4", "--run_dir", str(tmp_path / "r")],
    }.items():
        rc, text = _run(capfd, *argv, "--", *ARGS, *ORDINARY)
        assert rc == 0, text
        shown[name] = text + (acc.read_text() if name == "accelerate" else "")
        _no_secret_in(shown[name], name)
        assert text.count("<redacted>") >= HIDDEN, name
    assert all(a in shown["torchrun"] for a in ORDINARY)
    rc, text = _run(capfd, "launch", "--dry-run", "--hardware", "4xL4", "--", '--cfg={"api_key": "S3CR3T-json"}')
    assert rc == 2 and "braces that hold no placeholder name in '--cfg=<redacted>'" in text
    _no_secret_in(text, "a placeholder's error")
    for dict_override in ("+db={user:alice,password:S3CR3T-dict}", "+db={user:alice,pw:S3CR3T-dict}",
                          "+db={host:h,port:1,sid:S3CR3T-dict}"):  # a Hydra dict without {{ }}: never echoed
        rc, text = _run(capfd, "launch", "--dry-run", "--hardware", "4xL4", "--", dict_override)
        assert rc == 2 and "write {{ and }}" in text and "'+db=" in text, text
        _no_secret_in(text, "a Hydra dict's placeholder error")
    argv = json.loads(shown["dry-run --json"])["launch"]["argv"]
    assert argv[-len(ORDINARY):] == ORDINARY and argv.count("<redacted>") + sum(
        "<redacted>" in a and a != "<redacted>" for a in argv) == HIDDEN


def test_a_real_launch_keeps_every_secret_out_of_its_files_and_lines_and_the_script_gets_them(tmp_path, capfd,
                                                                                              monkeypatch):
    """command.json, plan.json (the config's script_args, secrets among them), the run log, the lock, every file of
    the run, the `check` of the config and what the launch prints: no secret; the script's argv: all of them."""
    script = tmp_path / "train.py"
    script.write_text("import json, pathlib, sys\n"
                      "pathlib.Path(__file__).with_name('received.json').write_text(json.dumps(sys.argv[1:]))\n")
    cfg = tmp_path / "cfg.yaml"
    in_config = ["--hub_token", "S3CR3T-in-config", "--url=https://u:S3CR3T-cfg-url@h/x",
                 "'+db.password=S3CR3T-cfg-quoted'", "--next=https://a/?u=https%3A%2F%2Fb%3AS3CR3T-cfg-pct%40c"]
    SECRETS.extend(["S3CR3T-in-config", "S3CR3T-cfg-url", "S3CR3T-cfg-quoted", "S3CR3T-cfg-pct"])
    cfg.write_text(json.dumps({"training": {"entrypoint": str(script), "script_args": in_config}}))
    monkeypatch.chdir(tmp_path)
    rc, text = _run(capfd, "check", "--config", str(cfg))
    assert rc == 0 and "--hub_token" in text
    _no_secret_in(text, "check")
    run = tmp_path / "run"
    rc, text = _run(capfd, "launch", "--config", str(cfg), "--run_dir", str(run), "--no_probe", "--single", "--",
                    *ARGS, *ORDINARY)
    assert rc == 0, text
    given = [a.replace("{{", "{").replace("}}", "}") for a in [*in_config, *ARGS, *ORDINARY]]
    assert json.loads((tmp_path / "received.json").read_text()) == given
    _no_secret_in(text, "the launch's printed lines")
    files = _files_under(run)
    assert {"command.json", "plan.json", "stdout.log"} <= {f.rsplit("/", 1)[-1] for f in files}, sorted(files)
    for path, content in files.items():
        _no_secret_in(content, path)
    argv = json.loads((run / "command.json").read_text())["argv"]
    assert argv[-len(ORDINARY):] == ORDINARY
    assert json.loads((run / "plan.json").read_text())["run"]["script_args"] == [
        "--hub_token", "<redacted>", "--url=<redacted>", "'+db.password=<redacted>'", "--next=<redacted>"]


CORPUS = (Path(__file__).resolve().parents[2] / "data" / "ordinary_args.txt").read_text().splitlines()


@pytest.mark.parametrize("fmt", ["pytorchjob", "slurm"])
def test_the_ordinary_corpus_exports_with_exit_0_and_every_value_unchanged(tmp_path, capfd, fmt):
    """Issue 52 item 3: bench/secret_corpus.py's 500+ ordinary arguments (checksums in hex, base64 and SRI, UUIDs,
    git shas, CIDs, run names, model ids, paths, URLs) go into a manifest and a batch script as they are."""
    out = tmp_path / "job.out"
    image = ["--image", "reg.example.com/t:1"] if fmt != "slurm" else []
    literal = [a.replace("{", "{{").replace("}", "}}") for a in CORPUS]  # {..} is a placeholder: braces doubled
    rc, text = _run(capfd, "export", "--format", fmt, "--hardware", "2x4xL4", *image, "-o", str(out), "--", *literal)
    assert rc == 0, text[-2000:]
    written = out.read_text()
    if fmt == "slurm":
        assert all(shlex.quote(a) in written for a in literal), [a for a in literal if shlex.quote(a) not in written]
    else:
        lists = []

        def walk(node):  # every list of strings in the manifest: the pods' command lines among them
            if isinstance(node, dict):
                [walk(v) for v in node.values()]
            elif isinstance(node, list):
                lists.append(node) if all(isinstance(v, str) for v in node) else [walk(v) for v in node]

        [walk(d) for d in yaml.safe_load_all(written)]
        commands = [c[c.index("--") + 1:] for c in lists if "--" in c]
        assert commands and all(c == literal for c in commands)  # each pod launches with them as given


def test_not_secret_lets_a_value_the_rule_takes_for_a_secret_through_and_the_refusal_says_how(tmp_path, capfd):
    """The refusal names --not_secret; with it, the value is exported as it is; a flag whose own name says secret
    cannot be declared."""
    out = tmp_path / "job.sbatch"
    rc, text = _run(capfd, "export", "--format", "slurm", "--hardware", "2x4xL4", "-o", str(out), "--", "--blob",
                    RANDOM)
    assert rc == 2 and "--blob (a long random string)" in text and "--not_secret NAME" in text and RANDOM not in text
    rc, text = _run(capfd, "export", "--format", "slurm", "--hardware", "2x4xL4", "-o", str(out), "--not_secret",
                    "blob", f"--not_secret={RANDOM[::-1]}", "--", "--blob", RANDOM, RANDOM[::-1])
    assert rc == 0 and RANDOM in out.read_text() and RANDOM[::-1] in out.read_text(), text
    rc, text = _run(capfd, "export", "--format", "slurm", "--hardware", "2x4xL4", "-o", str(out), "--not_secret",
                    "hub_token", "--", "--hub_token", "S3CR3T-declared")
    assert rc == 2 and "S3CR3T" not in text
