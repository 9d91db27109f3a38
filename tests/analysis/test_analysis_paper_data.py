"""The transcribed paper numbers: internal consistency checks that catch transcription slips
(derived rows recomputed from the rows they derive from), and spot checks against the paper text."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.paper_data import data_files, model_configs, paper_source, paper_table


def test_every_data_file_names_its_source():
    for name in data_files():
        if name.endswith(".csv"):
            source = paper_source(name[:-4])
            assert source, f"{name} has no '#' header naming its source"


def test_troll_table5_deltas_are_chunked_minus_clip():
    t5 = paper_table("troll_table5")
    for (model, metric), g in t5.groupby(["model", "metric"]):
        v = g.set_index("variant")
        delta = v.at["TROLL Chunked", "value"] - v.at["Clip", "value"]
        assert v.at["Delta (Chunked)", "value"] == pytest.approx(delta, abs=1.5e-3), (model, metric)
        assert v.at["Delta (Chunked)", "delta_pct"] == pytest.approx(100 * delta / v.at["Clip", "value"], abs=0.06)


def test_troll_tables_shapes_and_spot_values():
    t1 = paper_table("troll_table1")
    assert len(t1) == 2 * 3 * 2 * 5
    assert (t1[(t1.model == "Qwen3-8B") & (t1.method == "GSPO") & (t1.objective == "Clip")]["value"] == 0).all()
    t4 = paper_table("troll_table4")
    assert len(t4) == 2 * 5 * 2 * 7
    row = t4[(t4.model == "Qwen3-8B") & (t4.method == "PPO") & (t4.objective == "TROLL")].set_index("benchmark")[
        "value"
    ]
    assert row.to_dict() == {
        "AIME24": 0.524,
        "AIME25": 0.408,
        "AMC": 0.780,
        "MATH": 0.910,
        "Omni-Math": 0.521,
        "Olympiad": 0.567,
        "Minerva": 0.425,
    }


def test_entropy_tables_relative_change_has_the_sign_of_the_absolute_change():
    e = paper_table("entropy_tables")
    wide = e[e.stat.isin(["delta_h", "delta_h_rel_pct"])].pivot_table(
        index=["table", "algorithm"], columns="stat", values="value"
    )
    nonzero = wide[wide["delta_h"] != 0]
    assert (np.sign(nonzero["delta_h"]) == np.sign(nonzero["delta_h_rel_pct"])).all()
    means = e[e.stat == "mean"].set_index(["table", "algorithm", "test_set"])["value"]
    bests = e[e.stat == "best"].set_index(["table", "algorithm", "test_set"])["value"]
    assert (bests >= means - 1e-9).all()  # the best over seeds is at least the mean over seeds
    assert sorted(e.table.unique()) == [1, 2, 3, 4]
    assert len(wide) == 8 + 8 + 6 + 5


def test_model_configs_have_the_roofline_inputs():
    for name, cfg in model_configs().items():
        assert {"params", "layers", "q_heads", "kv_heads", "head_dim"} <= set(cfg), name
        assert cfg["q_heads"] % cfg["kv_heads"] == 0, name
