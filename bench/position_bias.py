"""How much a choice's answer depends on the order its labels are listed in, with and without debiasing.

Asks labelled routing tickets under every order of their labels through the
server's own System One scoring path (``gateway.decision.pipeline.decide``
over the llama engine with the server's prompts, no HTTP), once per
debias setting (:mod:`gateway.decision.debias`), and prints per setting:

- how often the first-listed label wins, beside chance (1/n): 1.0 means the
  order decides, chance means it does not;
- how much the answer moves with the order: the total variation distance
  between a ticket's probabilities under two orders, the largest pair per
  ticket, averaged (0: the order changes nothing);
- how often the labelled answer wins, and its mean probability;
- the cost: the engine's mean milliseconds and positions computed per
  request (content-free reads happen once per question set and are counted
  in the first request that needs them).

    .venv/bin/python -m bench.position_bias [--model PATH] [--threads N] [--debias METHODS ...]

``--debias`` takes ``none``, ``cyclic``, ``content_free`` or
``cyclic,content_free`` (repeat to compare; default: all four).
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import anyio

from gateway.decision import debias, pipeline
from gateway.decision.chat_template import read_gguf
from gateway.decision.prompts import PromptBuilder
from gateway.decision.schema import parse_request
from gateway.engine import Engine
from gateway.paths import default_model_path, engine_bin

TEAMS = {"billing": "payments, invoices", "technical": "bugs, integration errors", "sales": "pricing, plans"}
INSTRUCTIONS = "Which team should handle this?"

#: (ticket, the labelled answer): four of each team.
CASES = [
    (
        "I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
        "I am losing sales.",
        "technical",
    ),
    ("I was charged twice for my subscription this month, please refund one payment.", "billing"),
    ("Do you offer a discount on the annual plan for teams of 50?", "sales"),
    ("The app crashes every time I open the settings page since the last update.", "technical"),
    ("My invoice lists the wrong company address, can you reissue it?", "billing"),
    ("Your API returns a 500 error whenever I upload a file larger than 10 MB.", "technical"),
    ("We are a school; is there an education price for 200 seats?", "sales"),
    ("My card was declined but the money left my account.", "billing"),
    ("Login with Google stopped working after your update yesterday.", "technical"),
    ("Can I get a quote for the enterprise plan with SSO?", "sales"),
    ("Please cancel the automatic renewal and refund last month's charge.", "billing"),
    ("Can we upgrade from the starter plan to the business plan mid-year, and what would it cost?", "sales"),
]


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    """``0.5 * sum_k |p_k - q_k|`` over the labels of ``p``."""
    return 0.5 * sum(abs(p[k] - q[k]) for k in p)


async def measure(model: str, threads: int, settings: list[tuple[str, ...]]) -> list[dict]:
    cmd = [str(engine_bin("serveproto-llama")), "--model", model, "--threads", str(threads)]
    rows = []
    async with Engine.spawn(cmd, name="bias") as eng:
        template, _ = await anyio.to_thread.run_sync(read_gguf, Path(model))
        for methods in settings:
            decision = pipeline.Settings(PromptBuilder(template), debias=methods)
            memory = pipeline.Memory()
            first = gold_wins = asked = computed = 0
            chance = gold_mass = spread = engine_ms = 0.0
            for state, gold in CASES:
                by_order = []
                for order in itertools.permutations(TEAMS):
                    request = parse_request(
                        {
                            "state": state,
                            "questions": {
                                "team": {
                                    "type": "choice",
                                    "instructions": INSTRUCTIONS,
                                    "criteria": {k: TEAMS[k] for k in order},
                                }
                            },
                        }
                    )
                    t0 = time.perf_counter()
                    decided = await pipeline.decide(request, eng, decision, memory)
                    engine_ms += (time.perf_counter() - t0) * 1e3
                    computed += decided.computed or 0
                    probs = dict(zip(order, decided.probs["team"]))
                    winner = max(probs, key=probs.get)
                    first += winner == order[0]
                    gold_wins += winner == gold
                    gold_mass += probs[gold]
                    chance += 1 / len(order)
                    asked += 1
                    by_order.append(probs)
                spread += max(total_variation(p, q) for p, q in itertools.combinations(by_order, 2))
            name = ",".join(methods) or "none"
            row = dict(
                debias=name,
                first=first,
                asked=asked,
                chance=chance / asked,
                spread=spread / len(CASES),
                gold=gold_wins,
                gold_mass=gold_mass / asked,
                ms=engine_ms / asked,
                computed=computed / asked,
            )
            print(
                f"{name:<22} first-listed wins {first}/{asked} = {first / asked:.2f} (chance {chance / asked:.2f}); "
                f"order moves the answer by {row['spread']:.3f} (TV); labelled answer wins {gold_wins}/{asked} = "
                f"{gold_wins / asked:.2f}, mean p {row['gold_mass']:.3f}; {row['ms']:.0f} ms, "
                f"{row['computed']:.0f} positions a request",
                flush=True,
            )
            rows.append(row)
    print(
        "\n| x_debias | first-listed label wins | chance | order moves the answer (TV) | labelled answer wins "
        "| its mean probability | engine ms a request | positions computed a request |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['debias']} | {r['first']}/{r['asked']} = {r['first'] / r['asked']:.2f} | {r['chance']:.2f} "
            f"| {r['spread']:.3f} | {r['gold']}/{r['asked']} = {r['gold'] / r['asked']:.2f} | {r['gold_mass']:.3f} "
            f"| {r['ms']:.0f} | {r['computed']:.0f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()), help="GGUF (default: the default model)")
    parser.add_argument("--threads", type=int, default=1, help="engine CPU threads (default 1)")
    parser.add_argument(
        "--debias",
        action="append",
        default=None,
        help="none, cyclic, content_free or cyclic,content_free (repeat; default: all four)",
    )
    args = parser.parse_args()
    texts = args.debias or ["none", "cyclic", "content_free", "cyclic,content_free"]
    settings = [debias.parse("none" if t == "none" else t.split(",")) for t in texts]
    anyio.run(measure, args.model, args.threads, settings)


if __name__ == "__main__":
    main()
