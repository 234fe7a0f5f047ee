"""How much a choice's answer depends on the order its labels are listed in.

Asks a few labelled routing questions under every order of their labels,
through the same prompts as ``POST /v1/systemone`` (``gateway.prompts``) and
the engine's SCORE, and prints per case the winner under each order, then:

- how often the first-listed label wins, beside chance (1/n): 1.0 means the
  order decides, chance means it does not;
- how often the labelled answer wins, and its mean probability over orders.

    .venv/bin/python bench/position_bias.py [--model PATH] [--threads N] [--answer-prefix TEXT]

``--answer-prefix`` appends text to the assistant's turn before the label
(e.g. ``"Answer: "``) to compare prompt variants in one run.
"""
from __future__ import annotations

import argparse
import itertools

import anyio

from gateway.chat_template import ChatTemplate
from gateway.engine import Engine
from gateway.paths import default_model_path, engine_bin
from gateway.prompts import PromptBuilder

TEAMS = {"billing": "payments, invoices", "technical": "bugs, integration errors", "sales": "pricing, plans"}

#: (state, instructions, criteria, the labelled answer)
CASES = [
    ("I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
     "I am losing sales.", "Which team should handle this?", TEAMS, "technical"),
    ("I was charged twice for my subscription this month, please refund one payment.",
     "Which team should handle this?", TEAMS, "billing"),
    ("Do you offer a discount on the annual plan for teams of 50?",
     "Which team should handle this?", TEAMS, "sales"),
    ("The app crashes every time I open the settings page since the last update.",
     "Which team should handle this?", TEAMS, "technical"),
]


async def measure(model: str, threads: int, answer_prefixes: list[str]) -> None:
    builder = PromptBuilder(ChatTemplate.from_gguf(model))
    cmd = [str(engine_bin("serveproto-llama")), "--model", model, "--threads", str(threads)]
    async with Engine.spawn(cmd, name="bias") as eng:
        for prefix_text in answer_prefixes:
            first_wins = gold_wins = asked = 0
            gold_mass = 0.0
            chance = 0.0
            print(f"\nassistant turn starts with {prefix_text!r}")
            for state, instructions, criteria, gold in CASES:
                row = []
                for order in itertools.permutations(criteria):
                    question = builder.question("choice", instructions, {k: criteria[k] for k in order})
                    result = await eng.score(builder.prefix(state), [(question.stem + prefix_text, list(question.options))])
                    probs = dict(zip(question.options, result.probabilities()))
                    winner = max(probs, key=probs.get)
                    row.append(f"{order[0][:4]}->{winner[:4]}")
                    first_wins += winner == order[0]
                    gold_wins += winner == gold
                    gold_mass += probs[gold]
                    chance += 1 / len(order)
                    asked += 1
                print(f"  {gold:<10} (first listed -> winner) " + " ".join(row))
            print(f"  first-listed label wins {first_wins}/{asked} = {first_wins / asked:.2f} "
                  f"(chance {chance / asked:.2f}, ratio {first_wins / chance:.2f}x)")
            print(f"  labelled answer wins {gold_wins}/{asked} = {gold_wins / asked:.2f}, "
                  f"mean probability {gold_mass / asked:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()), help="GGUF (default: the default model)")
    parser.add_argument("--threads", type=int, default=1, help="engine CPU threads (default 1)")
    parser.add_argument("--answer-prefix", action="append", default=None,
                        help="text before the label in the assistant turn (repeat to compare; default: none)")
    args = parser.parse_args()
    anyio.run(measure, args.model, args.threads, args.answer_prefix or [""])


if __name__ == "__main__":
    main()
