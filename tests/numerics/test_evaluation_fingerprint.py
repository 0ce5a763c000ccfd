"""The evaluation fingerprint: the evaluations' numbers, on fixed inputs and end to end.

(a) :data:`PINNED`: one SHA-256 per group of :mod:`tests.numerics.evaluation_groups` (the statistics
of ``evals/stats.py`` and ``paired_stats.py``, float noise and perplexity's float spread, the top-k KL
estimate with top-1 and NLL on fixed logits, the perplexity and decode rows from fixed per-token
numbers, decode's divergence statistics, retrieval scoring, lm-eval's item flips), over results
rounded to 12 significant digits: the inputs are exact, but a reduction may sum in another order on
another processor.

(b) :data:`END_TO_END`: perplexity and decode run whole (prepare, baseline, every scheme of
:data:`tests.numerics.tiny_run.SCHEMES` through the storage cache) on a tiny float64 llama with exact
weights; every summary metric and its interval is pinned and compared within 1e-6 of its scale
(:func:`tests.numerics.tiny_run.differences`), since reductions may round differently on another
processor (measured across torch's SIMD levels: :mod:`tests.numerics.tiny_run`).

If a test here fails, an evaluation's numbers changed: when that is meant, bump
``evalkit.sweep.code_identity.NUMERICS_VERSION`` and re-pin with ``python -m tests.numerics --write`` (from
the repository root; ``python -m tests.numerics.test_evaluation_fingerprint`` prints this file's entries); when it is
not meant, the change is a bug.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from evalkit.sweep.code_identity import NUMERICS_VERSION

from tests.numerics import tiny_run
from tests.numerics.evaluation_groups import GROUPS, SHARED
from tests.numerics.exact import (
    REPIN,
    check_pins,
    one_thread,
    pin_entry,
    pin_name,
    reference,
    rounded_digest,
    versioned,
)

PINNED = {  # NUMERICS_VERSION -> group -> SHA-256 of fingerprints()[group]
    2: {
        "stats": "8d500a6c05dc0e7aeba8d6f482caf239fca8ad1c9006c318f6835cbb3c753996",
        "paired_stats": "08c07291cd11b7df7075623b48505f393ae5703de32bfec41c1ed89bd7f271c2",
        "float_noise": "18f4f77083a4dd4218671ccd23c092c906051499a87d20e2959660c63d2f9ea2",
        "float_spread": "53703c4651292e64891a174a211549dc724a8c1f977702d9f5a0e454e5ca45ff",
        "kl_topk": "8ec0e0480db92225de4da3f54dcb246cf069fd8bd529886bc553944c649493fe",
        "perplexity": "7e4a0a49483d596fe8efae3ce934e96c596fe156e0142b158856ce6d0f9a87a6",
        "decode": "624565fd6e95ff9dcaa5f9848fc72db71289c4ae9a79e1ef42ef931c1a16a7e5",
        "retrieval": "5b961210494b868384f3aef12ad0e25ea0d0453e7525690e50e183c219cb0cdb",
        "lmeval": "35a0071d3b0e157c8130a1cd2d46f7bacb7428a670e839332f53b3b639aa9718",
    },
    3: {
        "stats": "8d500a6c05dc0e7aeba8d6f482caf239fca8ad1c9006c318f6835cbb3c753996",
        "skewed": "4433429aa507bdc2a2377d3191c96e000389729f447ba9e358582c2a068016db",
        "paired_binary": "0532fc6cf9daaf46877cbf88d5062aac6770db744485a65bc5945527f84d5f04",
        "paired_stats": "08c07291cd11b7df7075623b48505f393ae5703de32bfec41c1ed89bd7f271c2",
        "float_noise": "18f4f77083a4dd4218671ccd23c092c906051499a87d20e2959660c63d2f9ea2",
        "float_spread": "209496ddbc180cc8314631ae184d04ee352677b07a7ee21096d2008317c6f4e1",
        "kl_topk": "8ec0e0480db92225de4da3f54dcb246cf069fd8bd529886bc553944c649493fe",
        "perplexity": "7e4a0a49483d596fe8efae3ce934e96c596fe156e0142b158856ce6d0f9a87a6",
        "decode": "624565fd6e95ff9dcaa5f9848fc72db71289c4ae9a79e1ef42ef931c1a16a7e5",
        "retrieval@v1": "3357886693e3e008dd059423146ff48b512209ff19ccbf1a91dc6d72bd48da20",
        "lmeval": "35a0071d3b0e157c8130a1cd2d46f7bacb7428a670e839332f53b3b639aa9718",
        "generation@v2": "9e7d10a148a505d362063ceac5f353aed819f127a097e0039f5bef5b5456c282",
        "longcontext@v1": "ac457ddd3415c05573515c6191a79ac9c916491521978962b81f148c5b5fbd4d",
        "serving": "b2a066fdd75619d5b9b6fa3b311513d360a733409afea7ba268c34eef95a3c05",
    },
}

END_TO_END = {  # NUMERICS_VERSION -> "eval|scheme|metric" -> [value, ci_low, ci_high] (tiny_run.metrics)
    2: {
        "perplexity|bf16|ppl": [1073.3243504996924, 570.8670909339929, 1575.7816100653918],
        "perplexity|bf16|ppl_delta": [0.0, 0.0, 0.0],
        "perplexity|bf16|ppl_delta_rel": [0.0, 0.0, 0.0],
        "perplexity|bf16|kl_mean": [0.0, 0.0, 0.0],
        "perplexity|bf16|top1_agreement": [1.0, 1.0, 1.0],
        "perplexity|bf16|p_value": [1.0, None, None],
        "perplexity|bf16|n_tokens": [252.0, None, None],
        "perplexity|fp8_e4m3/tensor/dynamic|ppl": [1069.228915289331, 552.3058250292528, 1586.1520055494093],
        "perplexity|fp8_e4m3/tensor/dynamic|ppl_delta": [-4.095435210361302, -22.18214938173817, 13.991278961015567],
        "perplexity|fp8_e4m3/tensor/dynamic|ppl_delta_rel": [
            -0.003815654800391699,
            -0.021802468427048666,
            0.014171158826265268,
        ],
        "perplexity|fp8_e4m3/tensor/dynamic|kl_mean": [
            0.0032699067469668178,
            0.0024557631189996596,
            0.004084050374933976,
        ],
        "perplexity|fp8_e4m3/tensor/dynamic|top1_agreement": [
            0.8968253968253969,
            0.8642180911625313,
            0.9294327024882624,
        ],
        "perplexity|fp8_e4m3/tensor/dynamic|p_value": [0.5483203468686942, None, None],
        "perplexity|fp8_e4m3/tensor/dynamic|n_tokens": [252.0, None, None],
        "perplexity|int4_asym/group16/dynamic|ppl": [1076.9708285908462, 553.3366108314464, 1600.605046350246],
        "perplexity|int4_asym/group16/dynamic|ppl_delta": [3.6464780911537673, -25.117626314000233, 32.41058249630777],
        "perplexity|int4_asym/group16/dynamic|ppl_delta_rel": [
            0.003397368269392409,
            -0.021100355384845924,
            0.02789509192363074,
        ],
        "perplexity|int4_asym/group16/dynamic|kl_mean": [
            0.01990309469842381,
            0.012804664038932231,
            0.02700152535791539,
        ],
        "perplexity|int4_asym/group16/dynamic|top1_agreement": [
            0.7579365079365079,
            0.7337542828439871,
            0.7821187330290287,
        ],
        "perplexity|int4_asym/group16/dynamic|p_value": [0.6877007090716456, None, None],
        "perplexity|int4_asym/group16/dynamic|n_tokens": [252.0, None, None],
        "perplexity|nvfp4|ppl": [1063.1160749847552, 570.230900297987, 1556.0012496715235],
        "perplexity|nvfp4|ppl_delta": [-10.208275514937213, -80.22397456213113, 59.807423532256706],
        "perplexity|nvfp4|ppl_delta_rel": [-0.00951089529477711, -0.07198861052122764, 0.05296681993167342],
        "perplexity|nvfp4|kl_mean": [0.038367130024392786, 0.02759702117965369, 0.04913723886913188],
        "perplexity|nvfp4|top1_agreement": [0.6904761904761905, 0.6042053687683805, 0.7767470121840004],
        "perplexity|nvfp4|p_value": [0.6609667003563845, None, None],
        "perplexity|nvfp4|n_tokens": [252.0, None, None],
        "decode|bf16|kl_mean": [0.0, 0.0, 0.0],
        "decode|bf16|top1_agreement": [1.0, 1.0, 1.0],
        "decode|bf16|nll_delta": [0.0, 0.0, 0.0],
        "decode|bf16|free_kl_mean": [0.0, 0.0, 0.0],
        "decode|bf16|first_divergence": [16.0, 16.0, 16.0],
        "decode|bf16|identical_share": [1.0, 0.6096657120978346, 1.0],
        "decode|fp8_e4m3/tensor/dynamic|kl_mean": [0.00373435120425937, 0.002678977466724679, 0.0047897249417940616],
        "decode|fp8_e4m3/tensor/dynamic|top1_agreement": [0.90625, 0.8374589134557491, 0.9750410865442509],
        "decode|fp8_e4m3/tensor/dynamic|nll_delta": [0.004055452843507131, -0.02783080811434842, 0.035941713801362685],
        "decode|fp8_e4m3/tensor/dynamic|free_kl_mean": [
            0.0031376601729399475,
            0.001698162527748762,
            0.004577157818131133,
        ],
        "decode|fp8_e4m3/tensor/dynamic|first_divergence": [11.0, 0.0, 16.0],
        "decode|fp8_e4m3/tensor/dynamic|identical_share": [
            0.16666666666666666,
            0.03005336974830669,
            0.5635028221864702,
        ],
        "decode|int4_asym/group16/dynamic|kl_mean": [0.02009406638755964, 0.014936511850210634, 0.02525162092490865],
        "decode|int4_asym/group16/dynamic|top1_agreement": [0.78125, 0.6908407998593297, 0.8716592001406703],
        "decode|int4_asym/group16/dynamic|nll_delta": [
            0.03234861542781194,
            -0.0014908993216862718,
            0.06618813017731015,
        ],
        "decode|int4_asym/group16/dynamic|free_kl_mean": [
            0.021471684017752218,
            0.012668708399791716,
            0.03027465963571272,
        ],
        "decode|int4_asym/group16/dynamic|first_divergence": [2.0, 0.0, 16.0],
        "decode|int4_asym/group16/dynamic|identical_share": [
            0.16666666666666666,
            0.03005336974830669,
            0.5635028221864702,
        ],
        "decode|nvfp4|kl_mean": [0.035003108769466586, 0.028886021918254037, 0.04112019562067913],
        "decode|nvfp4|top1_agreement": [0.6354166666666666, 0.4673396571862624, 0.8034936761470708],
        "decode|nvfp4|nll_delta": [-0.0026535838842391968, -0.08538864192891366, 0.08008147416043526],
        "decode|nvfp4|free_kl_mean": [0.03895989417958278, 0.024650606641865566, 0.053269181717299996],
        "decode|nvfp4|first_divergence": [0.0, 0.0, 1.0],
        "decode|nvfp4|identical_share": [0.0, 0.0, 0.3903342879021653],
    },
    3: {
        "perplexity|auto|ppl": [1073.3243504996924, 570.8670909339929, 1575.7816100653918],
        "perplexity|auto|ppl_delta": [0.0, 0.0, 0.0],
        "perplexity|auto|ppl_delta_rel": [0.0, 0.0, 0.0],
        "perplexity|auto|kl_mean": [0.0, 0.0, 0.0],
        "perplexity|auto|top1_agreement": [1.0, 1.0, 1.0],
        "perplexity|auto|p_value": [1.0, None, None],
        "perplexity|auto|n_tokens": [252.0, None, None],
        "perplexity|bf16|ppl": [1072.7736295235761, 570.3588419226769, 1575.1884171244753],
        "perplexity|bf16|ppl_delta": [-0.5507209761162812, -0.9482699313946967, -0.1531720208378658],
        "perplexity|bf16|ppl_delta_rel": [-0.0005130983712986481, -0.000930139982193301, -9.605676040399521e-05],
        "perplexity|bf16|kl_mean": [1.146029621514579e-05, 8.329032231163123e-06, 1.4591560199128455e-05],
        "perplexity|bf16|top1_agreement": [0.9920634920634921, 0.9774810616584361, 1.006645922468548],
        "perplexity|bf16|p_value": [0.029632495382210407, None, None],
        "perplexity|bf16|n_tokens": [252.0, None, None],
        "perplexity|fp8_e4m3/tensor/dynamic|ppl": [1069.228915289331, 552.3058250292528, 1586.1520055494093],
        "perplexity|fp8_e4m3/tensor/dynamic|ppl_delta": [-4.095435210361302, -22.18214938173817, 13.991278961015567],
        "perplexity|fp8_e4m3/tensor/dynamic|ppl_delta_rel": [
            -0.003815654800391699,
            -0.021802468427048666,
            0.014171158826265268,
        ],
        "perplexity|fp8_e4m3/tensor/dynamic|kl_mean": [
            0.0032699067469668178,
            0.0024557631189996596,
            0.004084050374933976,
        ],
        "perplexity|fp8_e4m3/tensor/dynamic|top1_agreement": [
            0.8968253968253969,
            0.8642180911625313,
            0.9294327024882624,
        ],
        "perplexity|fp8_e4m3/tensor/dynamic|p_value": [0.5483203468686942, None, None],
        "perplexity|fp8_e4m3/tensor/dynamic|n_tokens": [252.0, None, None],
        "perplexity|int4_asym/group16/dynamic|ppl": [1076.9708285908462, 553.3366108314464, 1600.605046350246],
        "perplexity|int4_asym/group16/dynamic|ppl_delta": [3.6464780911537673, -25.117626314000233, 32.41058249630777],
        "perplexity|int4_asym/group16/dynamic|ppl_delta_rel": [
            0.003397368269392409,
            -0.021100355384845924,
            0.02789509192363074,
        ],
        "perplexity|int4_asym/group16/dynamic|kl_mean": [
            0.01990309469842381,
            0.012804664038932231,
            0.02700152535791539,
        ],
        "perplexity|int4_asym/group16/dynamic|top1_agreement": [
            0.7579365079365079,
            0.7337542828439871,
            0.7821187330290287,
        ],
        "perplexity|int4_asym/group16/dynamic|p_value": [0.6877007090716456, None, None],
        "perplexity|int4_asym/group16/dynamic|n_tokens": [252.0, None, None],
        "perplexity|nvfp4|ppl": [1063.1160749847552, 570.230900297987, 1556.0012496715235],
        "perplexity|nvfp4|ppl_delta": [-10.208275514937213, -80.22397456213113, 59.807423532256706],
        "perplexity|nvfp4|ppl_delta_rel": [-0.00951089529477711, -0.07198861052122764, 0.05296681993167342],
        "perplexity|nvfp4|kl_mean": [0.038367130024392786, 0.02759702117965369, 0.04913723886913188],
        "perplexity|nvfp4|top1_agreement": [0.6904761904761905, 0.6042053687683805, 0.7767470121840004],
        "perplexity|nvfp4|p_value": [0.6609667003563845, None, None],
        "perplexity|nvfp4|n_tokens": [252.0, None, None],
        "decode|auto|kl_mean": [0.0, 0.0, 0.0],
        "decode|auto|top1_agreement": [1.0, 1.0, 1.0],
        "decode|auto|nll_delta": [0.0, 0.0, 0.0],
        "decode|auto|free_kl_mean": [0.0, 0.0, 0.0],
        "decode|auto|first_divergence": [16.0, 16.0, 16.0],
        "decode|auto|identical_share": [1.0, 0.6096657120978346, 1.0],
        "decode|bf16|kl_mean": [1.2709758789840336e-05, 8.989194041633381e-06, 1.643032353804729e-05],
        "decode|bf16|top1_agreement": [1.0, 1.0, 1.0],
        "decode|bf16|nll_delta": [0.00019082923730214438, -0.0014420898890008282, 0.0018237483636051168],
        "decode|bf16|free_kl_mean": [1.2150076517878482e-05, 8.147490867906352e-06, 1.6152662167850612e-05],
        "decode|bf16|first_divergence": [16.0, 16.0, 16.0],
        "decode|bf16|identical_share": [1.0, 0.6096657120978346, 1.0],
        "decode|fp8_e4m3/tensor/dynamic|kl_mean": [0.00373435120425937, 0.002678977466724679, 0.0047897249417940616],
        "decode|fp8_e4m3/tensor/dynamic|top1_agreement": [0.90625, 0.8374589134557491, 0.9750410865442509],
        "decode|fp8_e4m3/tensor/dynamic|nll_delta": [0.004055452843507131, -0.02783080811434842, 0.035941713801362685],
        "decode|fp8_e4m3/tensor/dynamic|free_kl_mean": [
            0.0031376601729399475,
            0.001698162527748762,
            0.004577157818131133,
        ],
        "decode|fp8_e4m3/tensor/dynamic|first_divergence": [11.0, 0.0, 16.0],
        "decode|fp8_e4m3/tensor/dynamic|identical_share": [
            0.16666666666666666,
            0.03005336974830669,
            0.5635028221864702,
        ],
        "decode|int4_asym/group16/dynamic|kl_mean": [0.02009406638755964, 0.014936511850210634, 0.02525162092490865],
        "decode|int4_asym/group16/dynamic|top1_agreement": [0.78125, 0.6908407998593297, 0.8716592001406703],
        "decode|int4_asym/group16/dynamic|nll_delta": [
            0.03234861542781194,
            -0.0014908993216862718,
            0.06618813017731015,
        ],
        "decode|int4_asym/group16/dynamic|free_kl_mean": [
            0.021471684017752218,
            0.012668708399791716,
            0.03027465963571272,
        ],
        "decode|int4_asym/group16/dynamic|first_divergence": [2.0, 0.0, 16.0],
        "decode|int4_asym/group16/dynamic|identical_share": [
            0.16666666666666666,
            0.03005336974830669,
            0.5635028221864702,
        ],
        "decode|nvfp4|kl_mean": [0.035003108769466586, 0.028886021918254037, 0.04112019562067913],
        "decode|nvfp4|top1_agreement": [0.6354166666666666, 0.4673396571862624, 0.8034936761470708],
        "decode|nvfp4|nll_delta": [-0.0026535838842391968, -0.08538864192891366, 0.08008147416043526],
        "decode|nvfp4|free_kl_mean": [0.03895989417958278, 0.024650606641865566, 0.053269181717299996],
        "decode|nvfp4|first_divergence": [0.0, 0.0, 1.0],
        "decode|nvfp4|identical_share": [0.0, 0.0, 0.3903342879021653],
    },
}


def group_version(group: str) -> int:
    """The numerics version a group is pinned under: its evaluation's (``Evaluation.numerics_version``); the
    statistics every evaluation shares (:data:`SHARED`) go with NUMERICS_VERSION alone."""
    from evalkit.evals.base import get_eval

    return 0 if group in SHARED else int(get_eval(group).numerics_version)


def fingerprints(only: Iterable[str] | None = None) -> dict[str, str]:
    """Pin name (the group at its evaluation's version) -> SHA-256 of its numbers rounded to 12 significant
    digits (computed afresh every call)."""
    got = {name: rounded_digest(fn()) for name, fn in GROUPS.items() if only is None or name in only}
    return versioned(got, group_version)


def unpinned_evaluations() -> list[str]:
    """The registered evaluations (:func:`evalkit.evals.base.registry`: built-in, entry points, plugins) that
    have no fingerprint group in :mod:`tests.numerics.evaluation_groups`."""
    from evalkit.evals.base import registry

    return sorted(set(registry()) - set(GROUPS))


def end_to_end(folder: Path) -> dict[str, list[float | None]]:
    """``eval|scheme|metric`` -> the whole run's numbers (the eval at its pin name: ``perplexity@v1|...`` once
    bumped)."""
    with one_thread():  # the products are thread-count invariant (MKL strict mode); one thread is fastest here
        got = tiny_run.metrics(folder)
    out = {}
    for key, value in got.items():
        name, _, rest = key.partition("|")
        out[f"{pin_name(name, group_version(name))}|{rest}"] = value
    return out


# -- tests --------------------------------------------------------------------------------------------
def test_the_evaluation_fingerprints_are_pinned_with_the_numerics_version():
    check_pins(PINNED, fingerprints(), "test_evaluation_fingerprint", "the evaluations' statistics")


def test_perplexity_and_decode_end_to_end_are_pinned_with_the_numerics_version(tmp_path):
    got = end_to_end(tmp_path)
    assert NUMERICS_VERSION in END_TO_END, (
        f"NUMERICS_VERSION {NUMERICS_VERSION} has no pinned end-to-end metrics: {REPIN}"
    )
    bad = tiny_run.differences(END_TO_END[NUMERICS_VERSION], got)
    assert not bad, (
        f"perplexity/decode numbers on the tiny model changed beyond {tiny_run.TOLERANCE} of their scale "
        f"({len(bad)} values; first: {'; '.join(bad[:3])}). If the change is meant, bump NUMERICS_VERSION in "
        f"evalkit/sweep/code_identity.py and re-pin: {REPIN}. If it is not meant, it is a bug"
    )


def test_every_registered_evaluation_has_a_pinned_group():
    """Enumerated from the evaluation registry, not listed: an evaluation registered without a group fails."""
    missing = unpinned_evaluations()
    assert not missing, (
        f"evaluations registered without a fingerprint group: {', '.join(missing)} (add one to "
        f"tests/numerics/evaluation_groups.py and pin it: {REPIN})"
    )
    assert set(SHARED) <= set(GROUPS)


def test_a_test_only_evaluation_without_a_group_is_named(toy_eval):
    """The test-only ``toy`` evaluation, registered for this test, has no group: the enumeration names it."""
    assert unpinned_evaluations() == ["toy"]


def test_a_bumped_evaluation_is_pinned_under_its_version(monkeypatch):
    from evalkit.evals.base import get_eval

    bumped = get_eval("retrieval").numerics_version + 1
    monkeypatch.setattr(get_eval("retrieval"), "numerics_version", bumped)
    got = fingerprints(only=["retrieval", "stats"])
    assert set(got) == {f"retrieval@v{bumped}", "stats"}
    with pytest.raises(AssertionError, match=f"registered but not pinned: retrieval@v{bumped}"):
        check_pins(PINNED, got, "test_evaluation_fingerprint", "the evaluations' statistics")


def assert_changed(group: str, unpatched: str, patched: str) -> None:
    """A mutation's fingerprint differs from the unpatched one and from the pin (the pin test holds the two equal)."""
    assert patched != unpatched
    assert patched != reference(PINNED, group, lambda: unpatched)


def test_a_tail_mass_summed_in_float32_changes_the_kl_fingerprint(monkeypatch):
    """Mutation: the KL estimate's tail log-mass in float32 (the bias kl_topk's docstring warns of)."""
    from evalkit.evals import kl_topk

    unpatched = fingerprints(["kl_topk"])["kl_topk"]
    monkeypatch.setattr(
        kl_topk, "tail_logmass", lambda lp, head: lp.float().scatter(1, head, float("-inf")).logsumexp(-1).double()
    )
    assert_changed("kl_topk", unpatched, fingerprints(["kl_topk"])["kl_topk"])


def test_a_normal_quantile_for_the_float_spread_changes_the_fingerprint(monkeypatch):
    """Mutation: the float spread's t(0.975, R-1) replaced by the normal 1.96."""
    from evalkit.evals.perplexity import float_spread

    unpatched = fingerprints(["float_spread", "perplexity"])
    monkeypatch.setattr(float_spread, "t_quantile", lambda n: 1.959963984540054)
    patched = fingerprints(["float_spread", "perplexity"])
    for group in ("float_spread", "perplexity"):
        assert_changed(group, unpatched[group], patched[group])


def test_a_normal_quantile_for_the_t_interval_changes_the_fingerprint(monkeypatch):
    """Mutation: the studentized jackknife's t quantile replaced by the normal one."""
    from scipy import stats as scipy_stats

    from evalkit.evals import stats

    unpatched = fingerprints(["stats"])["stats"]
    monkeypatch.setattr(stats.stats.t, "ppf", lambda q, df: scipy_stats.norm.ppf(q))
    assert_changed("stats", unpatched, fingerprints(["stats"])["stats"])


def test_a_changed_storage_read_moves_the_end_to_end_numbers(monkeypatch, tmp_path):
    """Mutation: the cache's stored K/V read back one part in 2**12 too large: decode's numbers leave the pins."""
    import evalkit.integration.stored_read as stored_read

    want = END_TO_END.get(NUMERICS_VERSION) or end_to_end(tmp_path / "unpatched")
    real = stored_read.dequantize_stored
    monkeypatch.setattr(stored_read, "dequantize_stored", lambda *a, **k: real(*a, **k) * (1 + 2.0**-12))
    bad = tiny_run.differences(want, end_to_end(tmp_path / "patched"))
    assert any(line.startswith("decode|") for line in bad)
    assert not any(
        "|auto|" in line or "|bf16|" in line for line in bad
    )  # the unscaled schemes stores no codes: untouched


def print_pins() -> None:
    print(f"PINNED entry:\n{pin_entry(fingerprints())}")
    with tempfile.TemporaryDirectory() as folder:
        print(f"END_TO_END entry:\n{pin_entry(end_to_end(Path(folder)))}")


if __name__ == "__main__":
    from tests.numerics.exact import prepare_process

    prepare_process()
    print_pins()
