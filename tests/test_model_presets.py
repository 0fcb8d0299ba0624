"""Model presets against the parameter counts their sources publish.

Each preset's ``n_params`` is computed by pipesim from its shapes
(:mod:`pipesim.plan.layers`); here it is held within 2% of the count the
preset's source publishes, so that a wrong shape in ``models.json`` shows up.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from pipesim.plan.model import get_model, model_names

# name -> (published parameter count, where it is published)
PUBLISHED = {
    # Dubey et al. 2024, "The Llama 3 Herd of Models" (8B / 70B / 405B flagship sizes);
    # the released safetensors of Llama 3.1 8B hold 8,030,261,248 parameters.
    "llama3.1-8b": (8_030_261_248, "meta-llama/Llama-3.1-8B safetensors metadata"),
    "llama3.1-70b": (70e9, "Dubey et al. 2024, 70B"),
    "llama3.1-405b": (405e9, "Dubey et al. 2024, 405B"),
    # NVIDIA, Nemotron-4 340B Technical Report (arXiv 2406.11704) and model card: 340B.
    "nemotron4-340b": (340e9, "Nemotron-4 340B report / model card"),
    # bigscience/bloom model card: 176,247,271,424 parameters.
    "bloom-176b": (176_247_271_424, "bigscience/bloom model card"),
    # Korthikanti et al. 2023, Table 3: named 22B (no finer count published).
    "megatron-22b": (22e9, "Korthikanti et al. 2023, Table 3"),
    # Narayanan et al. 2021, Table 1.
    "megatron-530b": (529.6e9, "Narayanan et al. 2021, Table 1"),
    "megatron-1t": (1008.0e9, "Narayanan et al. 2021, Table 1"),
    # mixtures of experts: every expert counted (the total, not the active parameters)
    "mixtral-8x7b": (46.7e9, "mistralai/Mixtral-8x7B-v0.1 model card: 46.7B"),
    "mixtral-8x22b": (141e9, "Mistral AI, 'Cheaper, Better, Faster, Stronger': 141B"),
    "qwen3-30b-a3b": (30.5e9, "Qwen/Qwen3-30B-A3B model card: 30.5B in total"),
    "qwen3-235b-a22b": (235e9, "Qwen/Qwen3-235B-A22B model card: 235B in total"),
    # DeepSeek-V3 report, section 1: 671B, without the 14B multi-token-prediction module
    "deepseek-v3": (671e9, "DeepSeek-V3 Technical Report, arXiv 2412.19437"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_matches_its_published_parameter_count(name: str) -> None:
    published, where = PUBLISHED[name]
    spec = get_model(name)
    assert spec.name == name
    assert abs(spec.n_params / published - 1) < 0.02, (name, spec.n_params, where)


def test_exact_counts_where_the_shapes_fix_them() -> None:
    # Llama 3.1 8B: every tensor is modelled, so the count is exact.
    assert get_model("llama3.1-8b").n_params == 8_030_261_248
    # BLOOM: all but the embedding LayerNorm (weight and bias, 2 x 14336), which
    # pipesim does not model.
    assert get_model("bloom-176b").n_params == 176_247_271_424 - 2 * 14336
    # Narayanan et al. 2021's 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), rounded to 0.1B.
    assert round(get_model("megatron-530b").n_params / 1e8) == 5296
    assert round(get_model("megatron-1t").n_params / 1e8) == 10080


def test_llama31_has_llama3_shapes() -> None:
    for size in ("8b", "70b"):
        old, new = get_model(f"llama3-{size}"), get_model(f"llama3.1-{size}")
        assert {**old.to_dict(), "name": "", "description": ""} == {
            **new.to_dict(),
            "name": "",
            "description": "",
        }


def test_megatron_gpt_presets_are_fp16_gpt_shapes() -> None:
    for name in ("megatron-22b", "megatron-530b", "megatron-1t"):
        spec = get_model(name)
        assert spec.dtype == "fp16"
        assert spec.ffn == 4 * spec.hidden
        assert (spec.seq_length, spec.vocab_size) == (2048, 51200)
        assert spec.bias and spec.learned_positions and spec.dropout
        assert not spec.flash_attention and not spec.gated_mlp


def test_every_preset_has_a_source() -> None:
    data = resources.files("pipesim").joinpath("data").joinpath("models.json")
    models = json.loads(data.read_text())["models"]
    assert set(models) == set(model_names())
    assert set(PUBLISHED) <= set(models)
    for name, entry in models.items():
        source = entry.get("source")
        assert isinstance(source, str) and source.strip(), name
