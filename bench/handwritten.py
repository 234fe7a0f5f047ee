"""A second labelled set, written by hand: short messages with two yes/no questions each.

Unlike the generator (:mod:`gateway.lab.evalset`), no phrase bank or rule produced these: each
message was written one by one, in varied styles (work mail, chat, notes, complaints, scams), and
labelled by its writer with two questions whose answer the text states plainly:

- ``money``: "Does the writer ask the reader to pay or send money?" (mostly no);
- ``upset``: "Is the writer upset or angry?" (about half).

    .venv/bin/python -m bench.handwritten OUT.jsonl      # the labelled file (calibrate --data format)
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

#: (message, asks for money, writer upset)
MESSAGES = [
    ("Hi Sam, the meeting moved to 3pm on Thursday. Same room as last week.", False, False),
    ("Your invoice #2231 for $480 is due on Friday. Please transfer the amount to the account below.", True, False),
    ("I have waited three weeks for a reply and nobody has called me back. This is unacceptable.", False, True),
    ("Could you lend me 50 euros until payday? I'll pay you back on the 30th.", True, False),
    ("Thanks so much for the flowers, they brighten up the whole kitchen!", False, False),
    ("The parcel arrived crushed and the glass inside is broken. I am furious.", False, True),
    ("Reminder: the club fee of $25 for this month is still open. Pay at the front desk.", True, False),
    ("Can you send me the slides from yesterday's talk? I'd like to reread them.", False, False),
    ("Why does nobody in this team ever clean the coffee machine? I'm sick of it.", False, True),
    ("Congratulations, you won a prize! To claim it, send a $19.99 handling fee by gift card.", True, False),
    ("The kids loved the zoo. We saw two baby giraffes and a very lazy lion.", False, False),
    ("I was charged twice for the same order and I want the second charge reversed right now.", False, True),
    ("Please wire the deposit of 1,200 dollars today so we can hold the apartment for you.", True, False),
    ("Lunch on Saturday? There's a new ramen place near the station.", False, False),
    ("Stop calling me at dinner time. I've asked you three times already and I'm fed up.", False, True),
    ("Your subscription renews tomorrow; update your card so the $9 payment goes through.", True, False),
    ("The report looks good. Just fix the typo on page four and it's ready.", False, False),
    ("Honestly I'm so disappointed. You promised the car would be ready and it still isn't.", False, True),
    ("Hey, you owe me 12 quid for the cinema tickets, send it over when you can.", True, False),
    ("Our flight lands at 7:40. No need to pick us up, we'll take the train.", False, False),
    ("This is the third broken charger you've sold me. I'm angry and I want a refund.", False, True),
    ("To keep your account active, pay the outstanding balance of 75 USD within 24 hours.", True, False),
    ("The library book you reserved is ready for pickup at the main desk.", False, False),
    ("I can't believe you told everyone my secret. I'm really hurt and upset.", False, True),
    ("Please donate whatever you can to the school trip fund; every little bit helps.", True, False),
    ("Grandma's recipe calls for two cups of flour, not three. Try again!", False, False),
    ("The noise from upstairs kept me awake all night again. I'm at the end of my patience.", False, True),
    ("Tuition for the spring term is 640 dollars. Please pay it before the first class.", True, False),
    ("Happy birthday! Hope you have a wonderful day with the family.", False, False),
    ("My order never came and your chat bot keeps closing the conversation. I'm livid.", False, True),
    ("If you want in on the group gift for Mia, send me 20 bucks by Wednesday.", True, False),
    ("The printer on the second floor is fixed, you can use it again.", False, False),
    ("You cancelled on me at the last minute, again. I'm tired of always being the one who waits.", False, True),
    ("Pay the parking fine of 60 euros online within 14 days to avoid a surcharge.", True, False),
    ("I planted the tomatoes by the fence; they should get enough sun there.", False, False),
    ("Your technician left mud all over my carpet and didn't even say sorry. I'm outraged.", False, True),
    ("Send 0.05 bitcoin to the address below or your files stay locked.", True, False),
    ("We finished the puzzle! All 1000 pieces, only took us two weekends.", False, False),
    ("I'm annoyed that the gym closed early without any notice. I drove there for nothing.", False, True),
    ("Please settle the dinner bill with me: your share is 34 dollars.", True, False),
    ("The new intern starts Monday. Could you show her around the office?", False, False),
    ("I'm so angry with the landlord: the heating has been broken for two weeks.", False, True),
    ("Your package is held at customs; pay the 3.50 fee through this link to release it.", True, False),
    ("Just checking in, how was your first week at the new job?", False, False),
    ("Nobody told me the exam date changed and now I've missed it. I'm really upset.", False, True),
    ("The concert tickets are 45 each; transfer me the money and I'll book them tonight.", True, False),
    ("The cat finally came down from the tree on her own. Crisis over.", False, False),
    ("I'm fuming. The airline lost my suitcase and won't even tell me where it is.", False, True),
]

QUESTIONS = {
    "money": {"type": "noul", "instructions": "Does the writer ask the reader to pay or send money?"},
    "upset": {"type": "noul", "instructions": "Is the writer upset or angry?"},
}


def lines() -> list[dict]:
    """The labelled requests, one per message (``{"id", "request", "gold"}``)."""
    return [
        {"id": f"hand-{i}", "request": {"state": text, "questions": QUESTIONS}, "gold": {"money": m, "upset": u}}
        for i, (text, m, u) in enumerate(MESSAGES)
    ]


def main() -> None:
    Path(sys.argv[1]).write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines()))


if __name__ == "__main__":
    main()
