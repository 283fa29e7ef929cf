"""Compare settings of the cost-sized trees' policy without timing noise: the cost curve is frozen.

    python scripts/frozen_cost_policy.py DECAYS TEMPLATES PER_TASK [SKIP] [MS_PER_TOKENS.json]
    python scripts/frozen_cost_policy.py 0.9,0.97,0.99 adaptive,hybrid 2 2

A real run's size choices follow the measured step times, so two runs of one engine drift apart and a policy change
worth 2-3% drowns in the noise. Here every engine shares one frozen ForwardCost (the curve below, or a JSON
{tokens: ms} file), so its choices depend on the model's outputs alone and repeat exactly. Each setting of the
trust's decay (tr_core/trust.py: per tree judged, the weight left to the trees before it) gets its own engine;
every engine answers the first turn of PER_TASK development questions of each task after its first SKIP, 128 new
tokens.
Printed per task: the modelled speedup, plain decoding's cost of the emitted tokens, tokens x t(1), over the cost of
the steps taken, sum of t(N). It leaves the engine's own overhead out, and is only as true as the curve: measure
the curve on the machine in question (the default is this AMD EPYC with 1 thread, whole steps, 2026-11-30).
README, "Hybrid drafting", reports the scan this was written for.

The last column, `pld`, is prompt lookup decoding (the benchmark's PLD: 10 tokens after a 2- or 1-token match)
replayed exactly on the same greedy answers (`pld_draft`, tested against transformers' own candidate generator),
its steps priced on the same curve: the two policies compared at equal step costs, with no timing noise.
"""
import collections
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from step_diagnostics import questions  # noqa: E402
from tr_core import DecodeConfig, Engine, StepEvent  # noqa: E402
from tr_core.cost import ForwardCost  # noqa: E402
from tr_core.models import load_model  # noqa: E402

# whole-step ms by tokens verified, observed by the adaptive drafter on MBPP answers (AMD EPYC, 1 thread)
EPYC_1T = {1: 57.8, 2: 93.7, 3: 90.0, 4: 88.0, 6: 94.0, 8: 99.2, 12: 111.7, 16: 122.8, 24: 150.0, 32: 190.0,
           48: 270.0, 64: 320.0, 81: 385.0, 96: 450.0, 128: 530.0}


def frozen_curve(points: dict[int, float]) -> ForwardCost:
    """A ForwardCost that ignores observations."""
    curve = ForwardCost()
    curve.ms, curve.probed, curve.measured = dict(points), dict(points), True
    curve.observe = lambda n, ms, alpha=0.1: None
    return curve


PLD_TOKENS, PLD_NGRAM = 10, 2  # the benchmark's PLD settings (bench --pld-tokens, --pld-ngram)


def pld_draft(seq: list[int], ngram: int = PLD_NGRAM, num: int = PLD_TOKENS) -> list[int]:
    """The draft prompt lookup decoding makes after `seq` (transformers' PromptLookupCandidateGenerator, without
    logits processors): for match lengths `ngram` down to 1, the leftmost earlier occurrence of the last n tokens that
    has a continuation; its next `num` tokens (or fewer, at the end of `seq`). No match: no draft."""
    n = len(seq)
    for size in range(min(ngram, n - 1), 0, -1):
        tail = seq[n - size :]
        for i in range(n - size):
            if seq[i : i + size] == tail:
                return seq[i + size : i + size + num]
    return []


def pld_forwards(prompt: list[int], answer: list[int]) -> list[int]:
    """Tokens of each forward prompt lookup decoding makes to emit `answer` greedily after `prompt` (1 + its draft):
    a draft is accepted as far as it agrees with the answer, then one token more."""
    pos, sizes = 0, []
    while pos < len(answer):
        draft = pld_draft(prompt + answer[:pos])
        agree = 0
        while agree < len(draft) and pos + agree < len(answer) and draft[agree] == answer[pos + agree]:
            agree += 1
        sizes.append(1 + len(draft))
        pos += agree + 1
    return sizes


def run(decays: list[float], templates: list[str], per_task: int, skip: int, points: dict[int, float]) -> None:
    torch.set_num_threads(1)
    model, tok = load_model(None)
    curve = frozen_curve(points)
    engines = {}
    for template in templates:
        for decay in decays:
            engine = Engine(model, tok)
            for name in ("adaptive", "hybrid"):
                engine.use_forward_cost(name, curve)
            engine.use_trust_decay(decay)
            engines[f"{template}@{decay}"] = (engine, template)
    totals = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))  # task -> run -> [tokens, ms]
    for task, items in questions(per_task, skip).items():
        for q in items:
            for name, (engine, template) in engines.items():
                ids = engine.encode_chat([{"role": "user", "content": q.turns[0]}])
                answer: list[int] = []
                for ev in engine.generate(ids, DecodeConfig(max_new_tokens=128, template=template)):
                    if isinstance(ev, StepEvent):
                        totals[task][name][0] += len(ev.emitted)
                        totals[task][name][1] += curve(len(ev.tokens))
                        answer += ev.emitted
            totals[task]["pld"][0] += len(answer)  # greedy: every engine's answer is the same
            totals[task]["pld"][1] += sum(curve(n) for n in pld_forwards(ids, answer))
    overall = collections.defaultdict(lambda: [0, 0.0])
    for task, runs in totals.items():
        print(f"{task[:14]:<15}", " ".join(f"{n}={v[0] * curve(1) / v[1]:.3f}" for n, v in runs.items()))
        for n, v in runs.items():
            overall[n][0] += v[0]
            overall[n][1] += v[1]
    print(f"{'overall':<15}", " ".join(f"{n}={v[0] * curve(1) / v[1]:.3f}" for n, v in overall.items()))


def parse(argv: list[str]) -> tuple[list[float], list[str], int, int, dict[int, float]]:
    """The command line, or SystemExit with the usage line."""
    usage = "usage: python scripts/frozen_cost_policy.py DECAYS TEMPLATES PER_TASK [SKIP] [MS_PER_TOKENS.json]"
    try:
        decays = [float(x) for x in argv[0].split(",")]
        templates = argv[1].split(",")
        per_task = int(argv[2])
        skip = int(argv[3]) if len(argv) > 3 else 0
        points = EPYC_1T
        if len(argv) > 4:
            points = {int(n): float(ms) for n, ms in json.loads(Path(argv[4]).read_text()).items()}
    except (IndexError, ValueError, OSError, AttributeError) as exc:
        raise SystemExit(f"{usage}\nerror: {exc}") from None
    if not all(0 < d <= 1 for d in decays) or per_task < 1 or skip < 0 or 1 not in points:
        raise SystemExit(f"{usage}\nerror: DECAYS in (0, 1], PER_TASK >= 1, SKIP >= 0, and the curve needs a point "
                         "at 1 token")
    if not set(templates) <= {"adaptive", "hybrid", "adaptive-fixed", "hybrid-fixed"}:
        raise SystemExit(f"{usage}\nerror: TEMPLATES are adaptive, hybrid, adaptive-fixed or hybrid-fixed")
    return decays, templates, per_task, skip, points


if __name__ == "__main__":
    run(*parse(sys.argv[1:]))
