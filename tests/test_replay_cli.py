"""``replay`` takes ``--run-dir`` like the other commands (``--out`` stays an alias), and
offpolicy.png has a title, axis labels and a legend that says what the bars are."""

from __future__ import annotations

import pytest
from run_helpers import sim_args

from controller.rail.replay import load_logged, replay
from railgate.cli import main
from railgate.config import load_config
from railgate.offpolicy import offpolicy_figure


@pytest.fixture(scope="module")
def shadow_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("shadow") / "run"
    assert main(sim_args("shadow", run, 4, "--set", "gate.kind=sara")) == 0
    return run


@pytest.mark.parametrize("flag", ["--run-dir", "--out"])
def test_replay_writes_where_run_dir_says(shadow_run, tmp_path, flag):
    out = tmp_path / "replay"
    assert main(["replay", str(shadow_run / "trace"), flag, str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"offpolicy.md", "offpolicy.json", "offpolicy.png"}


def test_the_plot_says_what_it_shows(shadow_run):
    report = replay(load_logged(shadow_run / "trace"), load_config(None).controller.rail, seed=0)
    ax = offpolicy_figure(report, "Offline replay of runs/x/trace").axes[0]
    assert ax.get_title().startswith("Offline replay of runs/x/trace") and f"{report.n} decisions" in ax.get_title()
    assert ax.get_xlabel() == "candidate policy and off-policy estimator" and "value per decision" in ax.get_ylabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("bars: 95% confidence interval" in t for t in legend) and any("logged" in t for t in legend)
