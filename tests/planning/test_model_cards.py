"""Decision sizing takes each model's own baseline: the grid's pilot, else its model card, else the default."""

from __future__ import annotations

from evalkit.planning.decision_sizing import decisions
from evalkit.planning.model_cards import card_baseline, pilot_baselines
from evalkit.sweep.grid import parse_grid


def grid(tmp_path, model: str):
    path = tmp_path / "g.yaml"
    path.write_text(
        f"name: g\nmodels:\n  - {{name: {model}, dtype: bfloat16, device: cuda}}\nschemes: [auto]\n"
        "evals:\n  generation: {tasks: [gsm8k_cot_llama, aime24], max_gen_toks: 1024, chat_template: true}\n"
    )
    return parse_grid(path)


def by_task(ds):
    return {d.plan.task: d.plan.facts for d in ds}


def test_the_card_table_answers_per_model_and_task():
    assert card_baseline("meta-llama/Llama-3.1-70B-Instruct", "gsm8k_cot_llama")[0] == 0.951
    value, source = card_baseline("moonshotai/Kimi-K2-Instruct", "aime24")
    assert value == 0.696 and "AIME 2024 Avg@64 69.6" in source and "github.com/MoonshotAI/Kimi-K2" in source
    assert card_baseline("meta-llama/Llama-3.1-70B-Instruct", "aime24") is None  # not on that card
    assert card_baseline("someone/unknown", "gsm8k_cot_llama") is None


def test_each_model_gets_its_own_baseline_and_says_which(tmp_path):
    kimi = by_task(decisions(grid(tmp_path, "moonshotai/Kimi-K2-Instruct"), {}))
    assert kimi["aime24"].baseline == 0.696 and "Kimi-K2-Instruct model card" in kimi["aime24"].source
    # no GSM8K on Kimi K2's card: the default, and the source says whose it is
    assert kimi["gsm8k_cot_llama"].baseline == 0.845
    assert "Llama-3.1-8B-Instruct's: no figure for moonshotai/Kimi-K2-Instruct" in kimi["gsm8k_cot_llama"].source
    llama70 = by_task(decisions(grid(tmp_path, "meta-llama/Llama-3.1-70B-Instruct"), {}))
    assert llama70["gsm8k_cot_llama"].baseline == 0.951


def test_a_pilot_in_the_store_comes_first(tmp_path):
    rows = [
        {"scheme": "auto", "eval": "generation", "metric": "aime24/accuracy", "value": 0.4},
        {"scheme": "fp8_e4m3/tensor/unit", "eval": "generation", "metric": "aime24/accuracy", "value": 0.1},
        {"scheme": "auto", "eval": "longcontext", "metric": "ruler/score", "value": 0.8, "labels": {"length": "4096"}},
    ]
    assert pilot_baselines(rows) == {"aime24": 0.4, "ruler@4096": 0.8}
    kimi = by_task(decisions(grid(tmp_path, "moonshotai/Kimi-K2-Instruct"), {}, rows))
    assert kimi["aime24"].baseline == 0.4 and "pilot" in kimi["aime24"].source
