"""Where a value you set came from, carried through ``Resolver`` as data (issue 46): the config's value is "you set
N", an OMP_NUM_THREADS you exported is named as your environment's, and the planner's own value has its reason;
with --no_auto_optimize too. The plan's reason is built from the source, never edited afterwards."""

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import weigh
from autotune.planner.resolve import Decision, Resolver
from autotune.profiles import load_profile

THREE = apply_overrides(TrainConfig(), {"data.omp_num_threads": 3})


def test_a_value_you_set_is_named_by_its_source():
    r = Resolver(sources={"omp_num_threads": "environment"})
    auto = lambda: Decision(4, "4 cores")  # noqa: E731
    assert r.source("omp_num_threads", "auto") == "planner" and r.source("num_workers", 2) == "config"
    assert r.resolve("omp_num_threads", 3, auto) == 3
    assert r.reasons["omp_num_threads"] == ("OMP_NUM_THREADS=3 in your environment (the ranks run with it) "
                                            "(auto would choose 4: 4 cores)")
    assert r.resolve("num_workers", 2, auto) == 2 and r.reasons["num_workers"] == "you set 2 (auto would choose 4: " \
                                                                                  "4 cores)"
    assert r.resolve("prefetch_factor", "auto", auto) == 4 and r.reasons["prefetch_factor"] == "4 cores"


def test_the_plans_threads_reason_names_the_environment_or_the_config():
    hw = load_profile("cpu-only")
    exported, _ = weigh(hw, THREE, sources={"omp_num_threads": "environment"})
    assert exported.loader.omp_num_threads == 3 and exported.overrides["omp_num_threads"].chosen == 3
    assert exported.reasons["omp_num_threads"].startswith("OMP_NUM_THREADS=3 in your environment (the ranks run "
                                                          "with it) (auto would choose ")
    configured, _ = weigh(hw, THREE)
    assert configured.reasons["omp_num_threads"].startswith("you set 3 (auto would choose ")
    assert configured.reasons["num_workers"] == exported.reasons["num_workers"]  # no other reason changes
    # the report's list of your settings names where each came from
    import io

    from autotune.exports.report import render_plan

    for p, said in ((exported, "omp_num_threads: auto would choose 8, OMP_NUM_THREADS=3 in your environment\n"),
                    (configured, "omp_num_threads: auto would choose 8, you set 3\n")):
        out = io.StringIO()
        render_plan(p, out)
        assert said in out.getvalue()


def test_no_auto_optimize_says_where_the_threads_came_from():
    hw = load_profile("cpu-only")
    verbatim = apply_overrides(THREE, {"training.batch_size_per_gpu": 8, "training.gradient_accumulation_steps": 1,
                                       "distributed.backend": "single", "training.mixed_precision": "fp32"})
    exported, _ = weigh(hw, verbatim, auto_optimize=False, sources={"omp_num_threads": "environment"})
    assert exported.reasons["omp_num_threads"] == ("--no_auto_optimize: OMP_NUM_THREADS=3 in your environment (the "
                                                   "ranks run with it)")
    configured, _ = weigh(hw, verbatim, auto_optimize=False)
    assert configured.reasons["omp_num_threads"] == "--no_auto_optimize: taken from the config verbatim"
